"""cairn's integrations with the systems that checkpoint through it.

:mod:`~cairn.integrations.distributed` (a two-phase save across processes and hosts) and
:mod:`~cairn.integrations.named` (checkpoints saved, found and retired by name) are here;
:mod:`cairn.torch` (PyTorch DCP), :mod:`cairn.lightning` (Lightning's ``CheckpointIO``)
and :mod:`cairn.hf` (the Hugging Face ``Trainer``) keep their own top-level names. An
integration uses cairn's public modules and one internal interface,
:mod:`~cairn.integrations._interface`, which names the whole of its coupling to cairn's
internals.
"""
