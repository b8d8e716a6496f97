"""Benchmarks: ``shardsched bench`` (decision path, the field report's table, scheduler_perf workloads,
scaling curves).

Every figure is measured in the run that prints it; comparisons are ratios to a baseline measured in
the same run, since the machines are shared and noisy. Nothing here is a test: tests only check that
each benchmark runs and that its JSON is well formed.

Modules: `decision` (the decision path alone), `field`, `perf` and `scaling` (end to end on the
embedded run), `kubelike` (the baseline), `harness` (what they share), `profile` (py-spy per
process), `plots` (PNG); ``serve --bench`` against an API server: `serve` (the run), `serve_cluster`
(its pods, nodes and observer), `serve_report` (its report and the API server's own figures).
"""
