"""``shardsched simulate``: place the unbound pods of a set of manifests, one at a time.

The contract (and what the acceptance cases check): pods with ``spec.nodeName`` are existing pods
and count on their node unless Succeeded/Failed; unbound pods are placed in queue order (PrioritySort:
higher priority first, equal priority in input order), each seeing the placements before it, with
the profile named by its ``schedulerName`` when the configuration has one, else the first profile;
an unbound pod with a ``deletionTimestamp`` (or already terminal) is Skipped; one that its profile's
PreEnqueue plugins keep out of the queue (SchedulingGates: ``spec.schedulingGates`` is not empty)
is Gated, with the plugin's message, and not placed. Each pod gets one attempt: an unschedulable
pod is a result, not retried.

What a cluster would do differently is said in ``warnings``, never hidden: pods whose
``schedulerName`` no profile has (kube-scheduler ignores them; here the first profile places them,
one warning per schedulerName), a pod bound to a node that is not in the input (it counts on no
node), and a bound pod that does not fit its node (the kubelet would reject it; here it counts on
the node, as the API server stores it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from shardsched.api.manifests import ManifestError, parse_nodes, parse_pods, read_manifests
from shardsched.api.objects import PodInfo
from shardsched.api.quantity import PODS, format_quantity
from shardsched.cache.node_table import NodeTable, PodUsage
from shardsched.config import SchedulerConfiguration, load_config
from shardsched.framework.interface import Handle
from shardsched.framework.runtime import Framework, Registry
from shardsched.plugins.registry import IN_TREE
from shardsched.scheduler.algorithm import GenericScheduler

SCHEDULED, UNSCHEDULABLE, SKIPPED, GATED = "Scheduled", "Unschedulable", "Skipped", "Gated"


@dataclass
class PodOutcome:
    namespace: str
    name: str
    node: str | None
    status: str
    reason: str
    requests: dict[str, int]

    def to_json(self) -> dict:
        return {"namespace": self.namespace, "name": self.name, "node": self.node, "status": self.status,
                "reason": self.reason, "requests": self.requests}


@dataclass
class SimulationReport:
    """Result of a simulation. ``errors`` non-empty means some input was invalid (and left out)."""

    pods: list[PodOutcome] = field(default_factory=list)
    nodes: list[dict] = field(default_factory=list)
    errors: list[ManifestError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"pods": [p.to_json() for p in self.pods], "nodes": self.nodes}


def build_schedulers(config: SchedulerConfiguration, table: NodeTable, seed: int | None,
                     partial_view: bool = False, handle: Handle | None = None,
                     registry: Registry = IN_TREE) -> dict[str, GenericScheduler]:
    """One GenericScheduler per profile over a shared table, keyed by schedulerName (first = default).

    ``partial_view``: the table holds only part of the cluster (a shard's nodes; `Framework`).
    ``handle``: the frameworks' `Handle` (where binds go), shared by the profiles.
    ``registry``: the plugins the profiles may name (default: the in-tree plugins).

    Raises:
        ConfigError: a profile names a plugin shardsched does not have.
    """
    out = {}
    for i, profile in enumerate(config.profiles):
        fw = Framework(profile, registry, config.percentage_of_nodes_to_score, partial_view, handle)
        out[profile.scheduler_name] = GenericScheduler(fw, table, seed=None if seed is None else seed + i)
    return out


def _skip_reason(pod: PodInfo) -> str | None:
    if pod.deleting:
        return "pod is being deleted (metadata.deletionTimestamp is set)"
    if pod.terminal:
        return f"pod phase is {pod.phase}"
    return None


def _misfit(table: NodeTable, pod: PodInfo) -> str | None:
    """Why the kubelet would refuse a pod bound to a node of ``table`` (the pod not counted yet), or
    None: the first resource, by name, whose requests on the node, this pod's included, would exceed
    the node's allocatable (kubelet's admission resource check)."""
    alloc, used = table.allocatable_of(pod.node_name), table.requested_of(pod.node_name)
    for r, want in sorted(pod.requests.items()):
        if used.get(r, 0) + want > alloc.get(r, 0):
            return (f"{r} requested {format_quantity(r, want)}, in use {format_quantity(r, used.get(r, 0))}, "
                    f"allocatable {format_quantity(r, alloc.get(r, 0))}; the kubelet would reject it (OutOf{r})")
    return None


def simulate(paths: list[str | Path], config_path: str | Path | None = None, seed: int | None = 0,
             progress: Callable[[int, int], None] | None = None) -> SimulationReport:
    """Run the simulation over manifest files (see module docstring).

    ``seed`` breaks score ties and seeds the names generated for ``metadata.generateName``; the same
    input and seed give the same report. ``progress(done, total)`` is called before each unbound
    pod's attempt: ``done`` attempts of ``total`` (the unbound pods) are made.

    Raises:
        ConfigError: the configuration file is invalid (nothing is simulated then).
    """
    config = load_config(config_path)
    manifests = read_manifests(paths, seed)
    table = NodeTable()
    table.namespace_labels.update(manifests.namespace_labels)
    nodes = parse_nodes(manifests)
    table.add_nodes(nodes)
    pods = parse_pods(manifests)
    schedulers = build_schedulers(config, table, seed)
    default_name = next(iter(schedulers))
    default = schedulers[default_name]
    report = SimulationReport(errors=manifests.in_input_order(), warnings=manifests.warnings)
    for where, pod in pods:
        if not pod.bound:
            continue
        if pod.node_name not in table.index:
            report.warnings.append(
                f"{where}: pod {pod.key} is bound to node {pod.node_name!r}, which is not in the input: it counts "
                "on no node (in a cluster it would never run; the pod garbage collector deletes such pods)")
        elif not pod.terminal:
            misfit = _misfit(table, pod)
            if misfit:
                report.warnings.append(f"{where}: pod {pod.key} is bound to node {pod.node_name!r} but does not fit "
                                       f"there: {misfit}; it is kept on the node, as the API server stores it")
            table.add_pod(PodUsage.of(pod), pod.node_name)

    queue_sort = default.framework.queue_sort
    pending = [(i, p) for i, (_, p) in enumerate(pods) if not p.bound]
    pending.sort(key=lambda ip: queue_sort.sort_key(ip[1], float(ip[0]), ip[0]))

    unknown_scheduler: Counter[str] = Counter()
    for done, (_, pod) in enumerate(pending):
        if progress is not None:
            progress(done, len(pending))
        requests = {k: v for k, v in pod.requests.items() if k != PODS}
        skip = _skip_reason(pod)
        if skip:
            report.pods.append(PodOutcome(pod.namespace, pod.name, None, SKIPPED, skip, requests))
            continue
        sched = schedulers.get(pod.scheduler_name)
        if sched is None:
            unknown_scheduler[pod.scheduler_name] += 1
            sched = default
        gate = sched.framework.run_pre_enqueue_plugins(pod)
        if not gate.is_success():
            report.pods.append(PodOutcome(pod.namespace, pod.name, None, GATED, gate.message, requests))
            continue
        result = sched.schedule(pod)
        if result.node is not None:
            report.pods.append(PodOutcome(pod.namespace, pod.name, result.node, SCHEDULED,
                                          f"Successfully assigned {pod.key} to {result.node}", requests))
        else:
            report.pods.append(PodOutcome(pod.namespace, pod.name, None, UNSCHEDULABLE, result.status.message, requests))
    for name, count in unknown_scheduler.items():
        report.warnings.append(
            f"{count} pod(s) with schedulerName {name!r}, which no profile has: kube-scheduler would not schedule "
            f"them (they would stay Pending); they were placed with the first profile, {default_name!r}")
    for node in nodes:
        report.nodes.append({"name": node.name, "allocatable": table.allocatable_of(node.name),
                             "requested": table.requested_of(node.name)})
    return report
