"""``cairn demo``: a streaming job that checkpoints, killed at a random moment, and proved
exactly-once after its restart.

* :mod:`cairn.demo.job` is the job itself, run as a child process
  (``python -m cairn.demo.job``): a generated event stream through keyed counts and
  windowed sums, checkpointed every few events, restored with ``load_latest``;
* :mod:`cairn.demo.harness` is ``cairn demo``: it starts the job, SIGKILLs it, restarts it,
  and compares the final state with an uninterrupted run.
"""
