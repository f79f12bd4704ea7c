"""`python -m bench.load`: the end-to-end load benchmark (bench/load/cli.py tells what it measures).

cluster.py: the cluster under test; phase.py: one phase; metrics.py: what /metrics say; checks.py:
correctness; report.py: summary, tables, results; cli.py: the command line.
"""
