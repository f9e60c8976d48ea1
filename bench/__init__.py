"""Benchmarks of cairn against raw obstore (run ``python bench/bench_save.py``)."""
