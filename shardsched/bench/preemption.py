"""DefaultPreemption's decision alone: the CPU time of one PostFilter, vectorized and per node.

The cluster is scheduler_perf's PreemptionBasic shape: ``nodes`` nodes of 4 CPU / 32Gi / 110 pods,
each holding 4 pods of priority 0 requesting 900m / 500Mi (3.6 of the 4 CPUs). Three pods that fit
no node, each decided ``repeat`` times over the same table (PostFilter leaves it as it found it):

- ``no-fit``: priority 10, 9 CPU (scheduler_perf's ``pod-high-priority-large-cpu``): lower-priority
  pods everywhere, but no node has 9 CPUs even empty (upstream's Unschedulable workload, where
  "the preemption plugin needs to loop over all Pods");
- ``no-victims``: priority 0, 3 CPU: nothing of lower priority anywhere;
- ``preempts``: priority 10, 3 CPU (``pod-high-priority``): every node is a candidate, three of its
  four pods must go; upstream looks at 10% of the nodes (500 of 5,000) before it picks one.

Reported per pod and path: the CPU seconds of one PostFilter (process time, mean over the
repeats), of one whole attempt (the failed Filter pass with its diagnosis, then PostFilter), and
what it decided. The issue's target is a pod that cannot preempt costing <= 1 ms at
5,000 nodes. The per-node path (``vectorized=False``) is the reference the tests compare with. The
``shared`` path reads the evaluation the plugin keeps for the pod's spec (`shared.SharedSearch`):
after the warm-up call no node changes between repeats, so it is what a preemptor of an
already-evaluated spec pays apart from the nodes changed since the one before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from shardsched.api.objects import NodeInfo, PodInfo
from shardsched.cache.node_table import NodeTable, PodUsage
from shardsched.config import load_config
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.runtime import Framework
from shardsched.plugins.defaultpreemption.plugin import DefaultPreemption
from shardsched.plugins.registry import IN_TREE
from shardsched.scheduler.algorithm import GenericScheduler

PODS_PER_NODE = 4
#: (name, priority, cpu) of the pods decided
PREEMPTORS = (("no-fit", 10, "9"), ("no-victims", 0, "3"), ("preempts", 10, "3"))


@dataclass
class PreemptionResult:
    pod: str
    path: str
    nodes: int
    decisions: int
    cpu_ms: float
    attempt_cpu_ms: float
    #: the nominated node and its victims' count, or the start of the message
    outcome: str

    def to_json(self) -> dict:
        return {"pod": self.pod, "path": self.path, "nodes": self.nodes, "decisions": self.decisions,
                "cpu_ms_per_decision": round(self.cpu_ms, 4),
                "attempt_cpu_ms": round(self.attempt_cpu_ms, 4), "outcome": self.outcome}


def _pod(name: str, priority: int, cpu: str, node: str | None = None) -> PodInfo:
    spec: dict = {"priority": priority, "containers": [{"name": "pause", "resources": {"requests": {
        "cpu": cpu, "memory": "500Mi"}}}]}
    if node:
        spec["nodeName"] = node
    return PodInfo.from_object({"metadata": {"name": name, "namespace": "default", "uid": name}, "spec": spec})


def build(nodes: int) -> tuple[NodeTable, list[NodeInfo]]:
    """The PreemptionBasic cluster (module docstring) in a NodeTable."""
    infos = [NodeInfo.from_object({"metadata": {"name": f"node-{i:05d}", "labels": {"kubernetes.io/hostname": f"node-{i:05d}"}},
                                   "status": {"allocatable": {"cpu": "4", "memory": "32Gi", "pods": "110"}}})
             for i in range(nodes)]
    table = NodeTable(nodes)
    table.add_nodes(infos)
    for i, n in enumerate(infos):
        for j in range(PODS_PER_NODE):
            table.add_pod(PodUsage.of(_pod(f"low-{i}-{j}", 0, "900m", n.name)), n.name)
    return table, infos


def run(nodes: int = 5000, repeat: int = 200, per_node_repeat: int = 5, seed: int = 0,
        config_path: str | None = None) -> list[PreemptionResult]:
    """Each preemptor, each path (module docstring); ``per_node_repeat`` repeats for the per-node
    path, which is much slower."""
    config = load_config(config_path)
    table, _ = build(nodes)
    sched = GenericScheduler(Framework(config.profiles[0], IN_TREE, config.percentage_of_nodes_to_score), table,
                             seed=seed)
    out = []
    for name, priority, cpu in PREEMPTORS:
        pod = _pod(name, priority, cpu)
        result = sched.schedule(pod, assume=False)
        if result.node is not None:
            raise RuntimeError(f"{name} fits without preemption: the workload is wrong")
        for path, vectorized, shared, reps in (("vectorized", True, False, repeat), ("shared", True, True, repeat),
                                               ("per-node", False, False, per_node_repeat)):
            plugin = DefaultPreemption(vectorized=vectorized, shared=shared)
            sched.rng = np.random.default_rng(seed)
            plugin.post_filter(CycleState(), pod, result.status.diagnosis, sched)  # warm: the columns' first sync
            t0 = time.process_time()
            for _ in range(reps):
                pf = plugin.post_filter(CycleState(), pod, result.status.diagnosis, sched)
            cpu_ms = (time.process_time() - t0) / reps * 1e3
            t0 = time.process_time()
            for _ in range(reps):
                attempt = sched.schedule(pod, assume=False)
                plugin.post_filter(CycleState(), pod, attempt.status.diagnosis, sched)
            attempt_ms = (time.process_time() - t0) / reps * 1e3
            outcome = (f"{pf.nominated_node}, {len(pf.victims)} victims" if pf.status.is_success()
                       else pf.status.message[:90])
            out.append(PreemptionResult(name, path, nodes, reps, cpu_ms, attempt_ms, outcome))
    return out
