"""Benchmarks: ``shardsched bench`` (decision path, the field report's table, scheduler_perf workloads).

Every figure is measured in the run that prints it; comparisons are ratios to a baseline measured in
the same run, since the machines are shared and noisy. Nothing here is a test: tests only check that
each benchmark runs and that its JSON is well formed.
"""
