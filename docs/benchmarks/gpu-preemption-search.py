"""One GPU-share preemptor's PostFilter (DefaultPreemption under GPUDevice) on the openb trace's
node count: 1,213 nodes of 8 GPUs, every device holding two 500-thousandth shares of priority 0,
a 600 share of priority 1000 (two victims on one device). Prints JSON: the PostFilter's wall time
in ms over ``--reps`` calls after one warm-up call, and the victims found.

    python docs/benchmarks/gpu-preemption-search.py --reps 5
"""

from __future__ import annotations

import argparse
import json
import time

from shardsched.api.objects import NodeInfo, PodInfo
from shardsched.cache.devices import DEVICES_ANNOTATION
from shardsched.cache.node_table import NodeTable, PodUsage
from shardsched.config import load_config
from shardsched.framework.runtime import Framework
from shardsched.plugins.registry import IN_TREE
from shardsched.scheduler.algorithm import GenericScheduler

CONFIG = """\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: shardsched
  plugins:
    multiPoint:
      enabled: [{name: GPUDevice, weight: 10}]
"""


def gpu_node(name: str) -> dict:
    alloc = {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8", "alibabacloud.com/gpu-milli": "8000"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": name, "labels": {}},
            "spec": {}, "status": {"allocatable": alloc, "capacity": alloc}}


def share(name: str, milli: int, priority: int, node: str = "", device: int | None = None) -> dict:
    res = {"cpu": "100m", "memory": "64Mi", "alibabacloud.com/gpu-milli": str(milli)}
    meta = {"name": name, "namespace": "default", "uid": name, "creationTimestamp": "2026-01-01T00:00:00Z"}
    if device is not None:
        meta["annotations"] = {DEVICES_ANNOTATION: str(device)}
    spec = {"schedulerName": "shardsched", "priority": priority,
            "containers": [{"name": "c", "resources": {"requests": res, "limits": dict(res)}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1213)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    table = NodeTable()
    for i in range(args.nodes):
        table.add_node(NodeInfo.from_object(gpu_node(f"n{i:04d}")))
    for i in range(args.nodes):
        for d in range(8):
            for k in range(2):
                info = PodInfo.from_object(share(f"p{i}-{d}-{k}", 500, 0, f"n{i:04d}", d))
                table.add_pod(PodUsage.of(info), info.node_name)
    sched = GenericScheduler(Framework(load_config(CONFIG).profiles[0], IN_TREE, None, False), table, seed=0)
    pod = PodInfo.from_object(share("high", 600, 1000))
    result = sched.schedule(pod, assume=False)
    assert result.node is None
    sched.post_filter(pod, result.status)  # warm-up: the pod columns are built
    times, victims = [], 0
    for _ in range(args.reps):
        t0 = time.perf_counter()
        pf = sched.post_filter(pod, result.status)
        times.append(round((time.perf_counter() - t0) * 1000, 1))
        victims = len(pf.victims)
    print(json.dumps({"nodes": args.nodes, "post_filter_ms": times, "victims": victims}))


if __name__ == "__main__":
    main()
