"""shardsched: a sharded, batched Kubernetes pod scheduler with kube-scheduler's semantics."""

__version__ = "0.1.0"
