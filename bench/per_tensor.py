"""The per-tensor DCP layout, as the baseline of benchmarks that compare layouts."""

from __future__ import annotations

from cairn.torch import CairnWriter


class PerTensorWriter(CairnWriter):
    """``CairnWriter`` writing the per-tensor layout it keeps for compressed saves (an
    object per tensor of 1 MiB or more, 8 MiB bundles): the same-run baseline of its
    one-object-per-rank layout."""

    _write_rank_objects = CairnWriter._write_bundles
