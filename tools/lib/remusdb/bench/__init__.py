"""The benchmarks of `remusdb-bench`, one module per benchmark, with the
shared measuring sequence (harness.py) and plot set-up (plot.py)."""
