"""cairn's integrations with the systems that checkpoint through it.

:mod:`~cairn.integrations.distributed` (a two-phase save across processes and hosts) is
here; :mod:`cairn.torch` (PyTorch DCP) keeps its own top-level name. An integration uses
cairn's public modules and one internal interface,
:mod:`~cairn.integrations._interface`, which names the whole of its coupling to cairn's
internals.
"""
