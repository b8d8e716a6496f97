"""The decision path alone: Filter -> Score -> select -> assume, one process, no Redis, no binding.

Two workloads over the same cluster (default: 5,000 nodes of 8 CPU / 16Gi / 110 pods, kube's
default profile):

- ``one-signature``: pods of 1 CPU / 1Gi, all with the same scheduling signature (the field
  report's burst); the per-signature cache updates only the node each placement changed;
- ``distinct``: every pod different: random CPU and memory requests, a nodeSelector on a zone label
  for half of them, a toleration of one of three taints for a third; 20% of the nodes are tainted.

Reported: pod decisions per second (best of ``repeat`` runs, each on a fresh table), the pods not
scheduled counted by the plugins that rejected every node for them, and the process's peak RSS.
Some distinct pods are unschedulable by construction: a node's zone is its index mod 10 and every
fifth node is tainted, so zones z0 and z5 hold only tainted nodes, and a pod selecting one of them
without the matching toleration has no node (TaintToleration and NodeAffinity reject them all).
"""

from __future__ import annotations

import resource
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from shardsched.api.objects import NodeInfo, PodInfo
from shardsched.cache.node_table import NodeTable
from shardsched.config import SchedulerConfiguration, load_config
from shardsched.framework.runtime import Framework
from shardsched.plugins.registry import IN_TREE
from shardsched.scheduler.algorithm import GenericScheduler

ZONES = 10
TAINT_VALUES = 3
#: why the plugins named (as in `DecisionResult.unscheduled_by`) reject pods of these workloads
BY_CONSTRUCTION = {
    "TaintToleration, NodeAffinity": "zones z0 and z5 hold only tainted nodes, and these pods select one of them "
                                     "without its toleration",
}


@dataclass
class DecisionResult:
    workload: str
    nodes: int
    pods: int
    decisions_per_s: float
    scheduled: int
    best_s: float
    #: pods not scheduled, by the plugins that rejected every node ("TaintToleration, NodeAffinity"),
    #: most first
    unscheduled_by: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"workload": self.workload, "nodes": self.nodes, "pods": self.pods,
                "decisions_per_s": round(self.decisions_per_s, 1), "scheduled": self.scheduled,
                "unscheduled_by": self.unscheduled_by, "best_s": round(self.best_s, 4)}


def make_nodes(n: int, tainted_fraction: float = 0.0) -> list[NodeInfo]:
    """``n`` nodes of 8 CPU / 16Gi / 110 pods, label ``zone=z<i % 10>``; every 1/fraction-th node
    tainted ``dedicated=v<k>:NoSchedule``."""
    every = int(round(1 / tainted_fraction)) if tainted_fraction else 0
    out = []
    for i in range(n):
        spec = {}
        if every and i % every == 0:
            spec["taints"] = [{"key": "dedicated", "value": f"v{i % TAINT_VALUES}", "effect": "NoSchedule"}]
        out.append(NodeInfo.from_object({
            "metadata": {"name": f"node-{i:05d}", "labels": {"zone": f"z{i % ZONES}", "kubernetes.io/hostname": f"node-{i:05d}"}},
            "spec": spec,
            "status": {"allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"}},
        }))
    return out


def one_signature_pods(n: int) -> list[PodInfo]:
    return [PodInfo.from_object({
        "metadata": {"name": f"p{i}", "uid": f"p{i}"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]},
    }) for i in range(n)]


def distinct_pods(n: int, seed: int = 0) -> list[PodInfo]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        spec: dict = {"containers": [{"name": "c", "resources": {"requests": {
            "cpu": f"{int(rng.integers(1, 2000))}m", "memory": f"{int(rng.integers(1, 2048))}Mi"}}}]}
        if i % 2:
            spec["nodeSelector"] = {"zone": f"z{int(rng.integers(0, ZONES))}"}
        if i % 3 == 0:
            spec["tolerations"] = [{"key": "dedicated", "operator": "Equal",
                                    "value": f"v{int(rng.integers(0, TAINT_VALUES))}", "effect": "NoSchedule"}]
        out.append(PodInfo.from_object({"metadata": {"name": f"q{i}", "uid": f"q{i}"}, "spec": spec}))
    return out


def _time(config: SchedulerConfiguration, nodes: list[NodeInfo], pods: list[PodInfo], repeat: int,
          seed: int) -> tuple[float, int, dict[str, int]]:
    """Best time (s) of ``repeat`` runs, pods scheduled, and the pods not scheduled by the plugins
    that rejected them (each run decides the same: same table, same seed)."""
    best = float("inf")
    for _ in range(repeat):
        table = NodeTable(len(nodes))
        table.add_nodes(nodes)
        sched = GenericScheduler(Framework(config.profiles[0], IN_TREE, config.percentage_of_nodes_to_score), table, seed=seed)
        t0 = time.perf_counter()
        results = [sched.schedule(p) for p in pods]
        best = min(best, time.perf_counter() - t0)
    rejected = Counter(", ".join(r.status.plugin.split(",")) or r.status.message for r in results if r.node is None)
    return best, len(pods) - sum(rejected.values()), dict(rejected.most_common())


def run(nodes: int = 5000, pods: int = 20000, distinct: int = 5000, repeat: int = 3, seed: int = 0,
        config_path: str | None = None) -> tuple[list[DecisionResult], int]:
    """Run both workloads; returns the results and the peak RSS in bytes."""
    config = load_config(config_path)
    plain = make_nodes(nodes)
    tainted = make_nodes(nodes, tainted_fraction=0.2)
    results = []
    for name, node_set, pod_set in (("one-signature", plain, one_signature_pods(pods)),
                                    ("distinct", tainted, distinct_pods(distinct, seed))):
        best, scheduled, unscheduled_by = _time(config, node_set, pod_set, repeat, seed)
        results.append(DecisionResult(name, nodes, len(pod_set), len(pod_set) / best, scheduled, best, unscheduled_by))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return results, peak
