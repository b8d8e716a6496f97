"""``bench gpu-frag --shards N``: the fragmentation experiment through the sharded runtime.

The same cluster, pod order and measure as `shardsched.bench.gpufrag`, but the decisions are the
runtime's: an `EmbeddedRun` (simulated API server, Redis ledger, coordinator, N shards, each
owning a part of the nodes) with a profile of the GPUDevice plugin alone (`profile_yaml`: its
Filter, and its Score as the only score, as the FGD simulator disables kube's default scores),
the pod list's typical pods in its args.

The experiment's rule, one attempt per pod in submission order and nothing deleted, is kept as
closely as concurrent shards allow (`WaveFeeder`): the pods are created in waves of ``wave`` in
submission order; the next wave is created only once every pod of this one is bound or
unschedulable, so the pods of one wave are decided concurrently (by the shards their signatures
route them to) and never before an earlier wave's. A pod is unschedulable when the runtime has
tried it on every shard that might take it (one round, the coordinator's rebalancer) and marked it
``PodScheduled=False``; it is then deleted, as the FGD simulator deletes a pod it could not place,
so it is never retried. Arrived and allocated GPU are counted from what the cluster bound: each
bound pod's node and its ``shardsched.io/gpu-devices`` annotation, written by the runtime at bind,
become the run's `gpufrag.Placement` lines, from which `gpufrag.tally` gives the result (and
checks every device), so ``--placements-out`` recomputes it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import asdict
from typing import Sequence

import yaml

from shardsched.bench import gpufrag
from shardsched.cache.devices import DEVICES_ANNOTATION
from shardsched.config import parse_config
from shardsched.plugins.gpudevice import scoring
from shardsched.sharding.embedded import EmbeddedRun
from shardsched.sharding.run_control import RunOptions
from shardsched.sharding.run_feed import WorkloadFeeder
from shardsched.sharding.sim_actor import unschedulable
from shardsched.sim.trace import NodeRow, PodRow, node_object, pod_object

#: pods per wave by default: a few per shard, so that shards decide concurrently
DEFAULT_WAVE = 16
NAMESPACE = "default"
#: a pod neither bound nor unschedulable this long after its wave was created is deleted and
#: counted unallocated, as `WaveFeeder.stalled` (the queue's backoff is at most 10 s, so a pod
#: whose Reserve lost a race to another shard is retried well within it)
STALL_TIMEOUT_S = 15.0


def typical_pod_specs(pods: Sequence[PodRow]) -> list[dict]:
    """GPUDevice's ``typicalPods`` args for the pod list: the shapes `gpufrag.typical_pods` keeps
    (the most frequent, covering 95% of the pods), each weighted by its count of pods."""
    keep = gpufrag.typical_pods(pods)
    counts: Counter = Counter((p.cpu_milli, p.num_gpu, p.gpu_milli, frozenset(p.gpu_spec)) for p in pods)
    memory: Counter = Counter()
    for p in pods:
        memory[(p.cpu_milli, p.num_gpu, p.gpu_milli, frozenset(p.gpu_spec))] += p.memory_mib
    out = []
    for k in range(len(keep.weight)):
        key = (int(keep.cpu_milli[k]), int(keep.count[k]), int(keep.milli[k]), keep.models[k])
        out.append({"cpuMilli": key[0], "gpuCount": key[1], "gpuMilli": key[2], "gpuModels": sorted(key[3]),
                    "memoryMib": memory[key] // counts[key], "weight": counts[key]})
    return out


def profile_yaml(policy: str, pods: Sequence[PodRow]) -> str:
    """The runtime's configuration for ``policy``: kube's default plugins, every default score
    disabled, GPUDevice's Filter and its Score (the policy's strategy, weight 1) as the only score."""
    args: dict = {"scoringStrategy": gpufrag.POLICIES[policy]}
    if args["scoringStrategy"] in scoring.NEEDS_TYPICAL:
        args["typicalPods"] = typical_pod_specs(pods)
    doc = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [{
            "schedulerName": "default-scheduler",
            "plugins": {
                "preFilter": {"enabled": [{"name": "GPUDevice"}]},
                "filter": {"enabled": [{"name": "GPUDevice"}]},
                "preScore": {"enabled": [{"name": "GPUDevice"}]},
                "score": {"disabled": [{"name": "*"}], "enabled": [{"name": "GPUDevice", "weight": 1}]},
            },
            "pluginConfig": [{"name": "GPUDevice", "args": args}],
        }],
    }
    return yaml.safe_dump(doc, sort_keys=False)


class WaveFeeder(WorkloadFeeder):
    """Creates the workload in waves (module docstring) and notes where each pod was bound.

    Attributes:
        bound: pod name -> (node, devices) as the cluster shows the pod bound.
        deleted: names of the pods found unschedulable and deleted.
        stalled: names of the pods deleted after `STALL_TIMEOUT_S` neither bound nor unschedulable.
    """

    def __init__(self, workload: list[tuple[float, float | None, dict]], options: RunOptions, errors: list[str],
                 wave: int) -> None:
        super().__init__(workload, options, errors)
        self.wave = wave
        self.bound: dict[str, tuple[str, list[int]]] = {}
        self.deleted: set[str] = set()
        self.stalled: list[str] = []

    def feed(self, t0: float, stop: threading.Event) -> None:
        pods = [p for _, _, p in self.workload]
        try:
            for i in range(0, len(pods), self.wave):
                if stop.is_set():
                    return
                batch = pods[i:i + self.wave]
                self._create(batch)
                self._settle_wave([p["metadata"]["name"] for p in batch], stop)
        except Exception as e:  # noqa: BLE001 - report (the run then fails), do not crash the run's thread
            self.errors.append(f"gpu-frag wave feeder: {type(e).__name__}: {e}")

    def _settle_wave(self, names: list[str], stop: threading.Event) -> None:
        """Wait until each pod of the wave is bound (noted) or unschedulable (deleted), or stalled
        (deleted too)."""
        waiting = list(names)
        deadline = time.monotonic() + STALL_TIMEOUT_S
        pause = 0.002
        while waiting and not stop.is_set():
            replies = [(n, self.cluster.get_pod(NAMESPACE, n)) for n in waiting]
            left = []
            for name, reply in replies:
                pod = reply.wait(None)
                node = pod["spec"].get("nodeName")
                if node:
                    devices = (pod["metadata"].get("annotations") or {}).get(DEVICES_ANNOTATION, "")
                    self.bound[name] = (node, [int(d) for d in devices.split(",") if d.strip()])
                elif unschedulable(pod):
                    self.cluster.delete_pod(NAMESPACE, name, None, None).wait(None)
                    self.deleted.add(name)
                else:
                    left.append(name)
            waiting = left
            if waiting:
                if time.monotonic() > deadline:
                    for name in waiting:
                        self.cluster.delete_pod(NAMESPACE, name, None, None).wait(None)
                    self.stalled.extend(waiting)
                    return
                stop.wait(pause)
                pause = min(0.05, pause * 2)


class WaveRun(EmbeddedRun):
    """`EmbeddedRun` fed by a `WaveFeeder`."""

    def __init__(self, config, nodes: list[dict], workload: list[tuple[float, float | None, dict]],
                 options: RunOptions, wave: int) -> None:
        super().__init__(config, nodes, workload, options)
        self.feeder = WaveFeeder(workload, options, self._feeder_error, wave)


def run_one(nodes: Sequence[NodeRow], pods: Sequence[PodRow], pod_list: str, policy: str, seed: int, shards: int,
            ray_address: str | None, wave: int = DEFAULT_WAVE, placements_out: str | None = None,
            problems: list[str] | None = None) -> gpufrag.RunResult:
    """One seed through the runtime with ``shards`` shards (module docstring); the result is
    `gpufrag.tally` of the bound placements.

    Raises:
        RuntimeError: the run did not settle, or ended with errors (named).
    """
    order = gpufrag.inflate(pods, sum(n.gpu for n in nodes) * gpufrag.MILLI, seed)
    config = parse_config(profile_yaml(policy, pods))
    node_objs = [node_object(n, gpufrag.NODE_PODS) for n in nodes]
    workload = [(0.0, None, pod_object(p, NAMESPACE, config.profiles[0].scheduler_name)) for p in order]
    options = RunOptions(shards=shards, seed=seed, ray_address=ray_address, timeout_s=3600.0)
    t0 = time.perf_counter()
    run = WaveRun(config, node_objs, workload, options, wave)
    report = run.run()
    wall = time.perf_counter() - t0
    if report.errors or report.timed_out or report.died or report.interrupted:
        raise RuntimeError("the sharded run did not complete: " + "; ".join(
            report.errors + [x for x in (report.died, report.interrupted) if x]
            + (["timed out"] if report.timed_out else [])))
    bound = run.feeder.bound
    lines = [gpufrag.Placement(p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, "|".join(p.gpu_spec),
                               *bound.get(p.name, (None, []))) for p in order]
    placements = [asdict(x) for x in lines]
    unallocated, curve = gpufrag.tally(placements, nodes)
    if placements_out is not None:
        gpufrag.write_placements(placements_out, placements)
    if problems is not None:
        problems.extend(gpufrag.never_placeable(nodes, pods))
    return gpufrag.RunResult(pod_list, policy, seed, len(order), len(bound), sum(n.gpu for n in nodes) * gpufrag.MILLI,
                             unallocated, 0.0, wall, curve, shards=shards, wave=wave, stalled=run.feeder.stalled)
