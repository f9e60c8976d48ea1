"""The commands of ``cairn``, grouped by what they do; :mod:`cairn.cli.app` registers them.

Each command is a function whose parameters typer reads as its options and arguments
(the shared ones from :mod:`cairn.cli.options`) and whose docstring is its ``--help``;
it hands what it does, a coroutine, to :func:`cairn.cli.options.launch`.

* :mod:`~cairn.cli.commands.browse`: ``list``, ``history``, ``show``: what a store holds;
* :mod:`~cairn.cli.commands.transfer`: ``verify``, ``restore``, ``copy``: every byte of
  checkpoints read and verified, and written elsewhere;
* :mod:`~cairn.cli.commands.collect`: ``delete``, ``gc``: checkpoints removed;
* :mod:`~cairn.cli.commands.dcp_dirs`: ``export-dcp``, ``import-dcp``: DCP's own
  directories, out of cairn and into it;
* :mod:`~cairn.cli.commands.hf_files`: ``export-hf``, ``import-hf``: Hugging Face
  safetensors, out of cairn into any store and into cairn from one.
"""
