"""``shardsched simulate``: place the unbound pods of a set of manifests, one at a time.

The contract (and what the acceptance cases check): pods with ``spec.nodeName`` are existing pods
and count on their node unless Succeeded/Failed; unbound pods are placed in queue order (PrioritySort:
higher priority first, equal priority in input order), each seeing the placements before it, with
the profile named by its ``schedulerName`` when the configuration has one, else the first profile;
an unbound pod with a ``deletionTimestamp`` (or already terminal) is Skipped. Each pod gets one
attempt: an unschedulable pod is a result, not retried.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from shardsched.api.manifests import ManifestError, parse_nodes, parse_pods, read_manifests
from shardsched.api.objects import PodInfo
from shardsched.api.quantity import PODS
from shardsched.cache.node_table import NodeTable, PodUsage
from shardsched.config import SchedulerConfiguration, load_config
from shardsched.framework.runtime import Framework
from shardsched.scheduler.algorithm import GenericScheduler

SCHEDULED, UNSCHEDULABLE, SKIPPED = "Scheduled", "Unschedulable", "Skipped"


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


def build_schedulers(config: SchedulerConfiguration, table: NodeTable, seed: int | None) -> dict[str, GenericScheduler]:
    """One GenericScheduler per profile over a shared table, keyed by schedulerName (first = default).

    Raises:
        ConfigError: a profile names a plugin shardsched does not have.
    """
    out = {}
    for i, profile in enumerate(config.profiles):
        fw = Framework(profile, config.percentage_of_nodes_to_score)
        out[profile.scheduler_name] = GenericScheduler(fw, table, seed=None if seed is None else seed + i)
    return out


def _skip_reason(pod: PodInfo) -> str | None:
    if pod.deleting:
        return "pod is being deleted (metadata.deletionTimestamp is set)"
    if pod.terminal:
        return f"pod phase is {pod.phase}"
    return None


def simulate(paths: list[str | Path], config_path: str | Path | None = None, seed: int | None = 0) -> SimulationReport:
    """Run the simulation over manifest files (see module docstring).

    Raises:
        ConfigError: the configuration file is invalid (nothing is simulated then).
    """
    config = load_config(config_path)
    manifests = read_manifests(paths)
    table = NodeTable()
    nodes = parse_nodes(manifests)
    table.add_nodes(nodes)
    pods = parse_pods(manifests)
    schedulers = build_schedulers(config, table, seed)
    default = next(iter(schedulers.values()))
    for _, pod in pods:
        if pod.bound and not pod.terminal:
            table.add_pod(PodUsage.of(pod), pod.node_name)

    queue_sort = default.framework.queue_sort
    pending = [(i, p) for i, (_, p) in enumerate(pods) if not p.bound]
    if queue_sort is not None:
        pending.sort(key=lambda ip: queue_sort.sort_key(ip[1], float(ip[0]), ip[0]))

    report = SimulationReport(errors=manifests.errors, warnings=manifests.warnings)
    for _, pod in pending:
        requests = {k: v for k, v in pod.requests.items() if k != PODS}
        skip = _skip_reason(pod)
        if skip:
            report.pods.append(PodOutcome(pod.namespace, pod.name, None, SKIPPED, skip, requests))
            continue
        sched = schedulers.get(pod.scheduler_name, default)
        result = sched.schedule(pod)
        if result.node is not None:
            report.pods.append(PodOutcome(pod.namespace, pod.name, result.node, SCHEDULED,
                                          f"Successfully assigned {pod.key} to {result.node}", requests))
        else:
            report.pods.append(PodOutcome(pod.namespace, pod.name, None, UNSCHEDULABLE, result.status.message, requests))
    for node in nodes:
        report.nodes.append({"name": node.name, "allocatable": table.allocatable_of(node.name),
                             "requested": table.requested_of(node.name)})
    return report
