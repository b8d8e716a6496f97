"""``shardsched simulate``: place the unbound pods of a set of manifests, one at a time.

The contract (and what the acceptance cases check): pods with ``spec.nodeName`` are existing pods
and count on their node unless Succeeded/Failed; unbound pods are placed in queue order (PrioritySort:
higher priority first, equal priority in input order), each seeing the placements before it, with
the profile named by its ``schedulerName`` when the configuration has one, else the first profile;
an unbound pod with a ``deletionTimestamp`` (or already terminal) is Skipped; one that its profile's
PreEnqueue plugins keep out of the queue (SchedulingGates: ``spec.schedulingGates`` is not empty)
is Gated, with the plugin's message, and not placed. Each pod gets one attempt: an unschedulable
pod is a result, not retried.

Gangs (PodGroups in the input, a profile with Coscheduling): the members of a group are attempted
in queue order (Coscheduling's QueueSort keeps them together), each assumed on its node; after the
group's last member the gang is decided: when its bound and placed members reach ``minMember``
the placed ones are Scheduled, otherwise none is: the placed members leave their nodes (the pods
after them see the room) and every member is Unschedulable with the gang's words and the first
failure's, ``pod group default/train: 2/3 members schedulable; default/train-2: 0/2 nodes are
available: 2 Insufficient cpu.`` (a member Coscheduling's PreFilter rejected keeps its message).

Preemption (the profile's PostFilter, DefaultPreemption): a pod that fits no node may nominate one
where deleting pods of lower priority makes room (PodDisruptionBudgets from the input are read as
given). Its victims are reported ``Preempted``; a victim whose ``terminationGracePeriodSeconds`` is
0 is gone at once, one with a grace period stays on its node terminating (no kubelet ends it here,
as on an API server without nodes), so the preemptor then waits, Unschedulable, nominated to the
node, and counts there for the pods after it. The preemptor gets the attempt after its victims are
gone: its nominated node first, then every node. Every attempted pod's entry lists its ``victims``
and ``nominatedNode`` (kept after it binds, as kube keeps ``status.nominatedNodeName``).

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

import dataclasses

from shardsched.api.manifests import (ManifestError, parse_nodes, parse_pdbs, parse_pod_groups, parse_pods,
                                      parse_spread_selectors, parse_volumes, read_manifests)
from shardsched.api.objects import PodInfo
from shardsched.api.quantity import PODS, format_quantity
from shardsched.cache.node_table import NodeTable, PodUsage
from shardsched.cache.pod_groups import PodGroupCache
from shardsched.config import load_config
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import Handle, PostFilterResult
from shardsched.plugins.coscheduling.plugin import NAME as COSCHEDULING
from shardsched.scheduler.algorithm import GenericScheduler, ScheduleResult, build_schedulers

SCHEDULED, UNSCHEDULABLE, SKIPPED, GATED, PREEMPTED = "Scheduled", "Unschedulable", "Skipped", "Gated", "Preempted"


@dataclass
class PodOutcome:
    namespace: str
    name: str
    node: str | None
    status: str
    reason: str
    requests: dict[str, int]
    #: the pods this pod preempted ("namespace/name"), None for a pod that was never attempted
    victims: list[str] | None = None
    #: the node the pod was nominated to by its preemption (kept after it binds, as kube keeps
    #: status.nominatedNodeName), None if never nominated or the nomination was cleared
    nominated_node: str | None = None
    #: the plugin that rejected an Unschedulable pod's attempt (not in the report)
    plugin: str = ""
    #: the GPU devices the pod takes on its node (indices in the node's order), () for none
    devices: tuple[int, ...] = ()

    def to_json(self) -> dict:
        out = {"namespace": self.namespace, "name": self.name, "node": self.node, "status": self.status,
               "reason": self.reason, "requests": self.requests}
        if self.devices:
            out["devices"] = list(self.devices)
        if self.victims is not None:
            out["victims"] = self.victims
            out["nominatedNode"] = self.nominated_node
        return out


@dataclass
class SimulationReport:
    """Result of a simulation. ``errors`` non-empty means some input was invalid (and left out)."""

    pods: list[PodOutcome] = field(default_factory=list)
    nodes: list[dict] = field(default_factory=list)
    errors: list[ManifestError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"pods": [p.to_json() for p in self.pods], "nodes": self.nodes}


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


class _Preemptions:
    """The preemptions of one simulation: victims deleted at once (grace period 0) or left
    terminating on their node (a longer grace period: without a kubelet they stay, as on an API
    server without nodes), and the preemptors still waiting for them, nominated to their node.

    A waiting preemptor counts on its node for the pods after it, which in queue order are of equal or
    lower priority (upstream ``RunFilterPluginsWithNominatedPods``), and not in the final node usage
    (it is not bound)."""

    def __init__(self, table: NodeTable, report: SimulationReport, grace: dict[str, int]) -> None:
        self.table = table
        self.report = report
        self.grace = grace  # uid of a bound pod -> its terminationGracePeriodSeconds
        self.waiting: dict[str, tuple[PodInfo, PodOutcome]] = {}  # uid -> (nominated pod, its outcome)

    def prepare(self, pod: PodInfo, result: PostFilterResult) -> None:
        """kube's ``prepareCandidate``: delete the victims (each gets a Preempted outcome) and clear
        the nomination of lower-priority pods waiting on the same node."""
        node = result.nominated_node
        for u in result.victims:
            usage = self.table.remove_pod(u.uid)
            grace = self.grace.get(u.uid, 0)
            ns, name = u.key.split("/", 1)
            if grace > 0 and usage is not None:
                self.table.add_pod(dataclasses.replace(usage, deleting=True, preempted=True), node)
                why = f"terminating (grace period {grace} s) after being preempted by pod {pod.key} on node {node}"
            else:
                why = f"Preempted by pod {pod.key} on node {node}"
            self.report.pods.append(PodOutcome(ns, name, node, PREEMPTED, why,
                                               {k: v for k, v in u.requests.items() if k != PODS}))
        for uid, (other, outcome) in list(self.waiting.items()):
            if other.nominated_node_name == node and other.priority < pod.priority:
                self.table.remove_pod(uid)
                outcome.nominated_node = None
                del self.waiting[uid]

    def wait(self, pod: PodInfo, outcome: PodOutcome) -> None:
        """``pod`` stays nominated to its node until its victims are gone."""
        self.table.add_pod(PodUsage.of(pod), pod.nominated_node_name)
        self.waiting[pod.uid] = (pod, outcome)

    def end(self) -> None:
        """Waiting preemptors are not bound: they leave the node usage."""
        for uid in self.waiting:
            self.table.remove_pod(uid)


class _Gangs:
    """The gangs of one simulation (module docstring): each group decided after its last pending
    member's attempt."""

    def __init__(self, table: NodeTable, groups: PodGroupCache, pending: list[PodInfo],
                 unreserve: Callable[[PodInfo], None]) -> None:
        self.table = table
        self.unreserve = unreserve  # undoes a placed member's Reserve (its assumed volumes)
        self.groups = groups
        self.last: dict[str, str] = {}  # group key -> uid of its last pending member in queue order
        for pod in pending:
            key = groups.group_of(pod)[0]
            if key is not None:
                self.last[key] = pod.uid
        self.outcomes: dict[str, list[tuple[PodInfo, PodOutcome]]] = {}

    def attempted(self, pod: PodInfo, outcome: PodOutcome) -> None:
        key, group = self.groups.group_of(pod)
        if key is None:
            return
        self.outcomes.setdefault(key, []).append((pod, outcome))
        if self.last.get(key) == pod.uid and group is not None:
            self._decide(key, group.min_member, self.outcomes.pop(key))

    def _decide(self, key: str, min_member: int, outcomes: list[tuple[PodInfo, PodOutcome]]) -> None:
        placed = [(p, o) for p, o in outcomes if o.status == SCHEDULED]
        bound = self.groups.bound_count(key)
        if bound + len(placed) >= min_member:
            return
        failed = next(((p, o) for p, o in outcomes if o.status != SCHEDULED), None)
        why = f"pod group {key}: {bound + len(placed)}/{min_member} members schedulable"
        if failed is not None:
            why += f"; {failed[0].key}: {failed[1].reason}"
        for p, o in outcomes:
            if o.status == SCHEDULED:
                self.unreserve(p)
                self.table.remove_pod(p.uid)
                o.node, o.status, o.reason = None, UNSCHEDULABLE, why
            elif o.status == UNSCHEDULABLE and o.plugin != COSCHEDULING:
                o.reason = why


def _place(sched: GenericScheduler, pod: PodInfo, requests: dict[str, int], preemptions: _Preemptions) -> PodOutcome:
    """The pod's attempt, and when its PostFilter nominated a node, the attempt after its victims
    are gone: Scheduled there, or Unschedulable and waiting, nominated, for terminating victims."""
    result, pf = _attempt(sched, pod)
    if result.node is not None:
        return PodOutcome(pod.namespace, pod.name, result.node, SCHEDULED,
                          f"Successfully assigned {pod.key} to {result.node}", requests, [], None,
                          devices=result.devices)
    if pf is None or not pf.status.is_success():
        return PodOutcome(pod.namespace, pod.name, None, UNSCHEDULABLE, _message(result), requests, [], None,
                          result.status.plugin)
    preemptions.prepare(pod, pf)
    victims = sorted(u.key for u in pf.victims)
    nominated = pod.nominated(pf.nominated_node)
    # upstream's next attempt tries the nominated node first, then every node; its PostFilter sees
    # the nomination (not eligible while a victim is still terminating there)
    second = _reserve(sched, sched.schedule(nominated))
    if second.node is None:
        second = _reserve(sched, sched.schedule(pod))
        if second.node is None:
            sched.post_filter(nominated, second.status)
    if second.node is not None:
        return PodOutcome(pod.namespace, pod.name, second.node, SCHEDULED,
                          f"Successfully assigned {pod.key} to {second.node}", requests, victims, pf.nominated_node,
                          devices=second.devices)
    outcome = PodOutcome(pod.namespace, pod.name, None, UNSCHEDULABLE, _message(second), requests, victims,
                         pf.nominated_node)
    preemptions.wait(nominated, outcome)
    return outcome


def _message(result: ScheduleResult) -> str:
    """The FitError message with PostFilter's part, as the pod's FailedScheduling Event says it."""
    d = result.status.diagnosis
    return d.message() if d is not None else result.status.message


def _attempt(sched: GenericScheduler, pod: PodInfo) -> tuple[ScheduleResult, PostFilterResult | None]:
    """One scheduling cycle: schedule (assumed on success); on failure the PostFilter plugins."""
    result = _reserve(sched, sched.schedule(pod))
    if result.node is not None:
        return result, None
    return result, sched.post_filter(pod, result.status)


def _reserve(sched: GenericScheduler, result: ScheduleResult) -> ScheduleResult:
    """The profile's Reserve plugins for a placed pod (VolumeBinding assumes its volumes there, so
    the next pod does not take the same PV; nothing binds in a simulation, so the assumption stands
    for the binding); a rejection forgets the placement and is the pod's result."""
    if result.node is None:
        return result
    state, pods, nodes = CycleState(), [result.pod], [result.node]
    for i, plugin in enumerate(sched.framework.reserve_plugins):
        status = plugin.reserve(state, pods, nodes)[0]
        if not status.is_success():
            for done in reversed(sched.framework.reserve_plugins[:i + 1]):
                done.unreserve(state, pods, nodes)
            sched.forget(result.pod)
            return ScheduleResult(result.pod, None, status)
    return result


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
    table.set_spread_selectors(parse_spread_selectors(manifests))
    nodes = parse_nodes(manifests)
    table.add_nodes(nodes)
    table.volumes = parse_volumes(manifests)
    pods = parse_pods(manifests)
    pdbs = parse_pdbs(manifests)
    handle = Handle()
    handle.pod_groups.set_groups({g.key: g for g in parse_pod_groups(manifests)}, {})
    for _, pod in pods:
        handle.pod_groups.add_pod(pod)
    schedulers = build_schedulers(config, table, seed, handle=handle)
    for sched in schedulers.values():
        sched.pdbs = pdbs
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
    preemptions = _Preemptions(table, report, {p.uid: p.grace_period_s for _, p in pods if p.bound})
    def unreserve(pod: PodInfo) -> None:
        sched = schedulers.get(pod.scheduler_name, default)
        for plugin in reversed(sched.framework.reserve_plugins):
            if plugin.name != COSCHEDULING:  # the gang's own bookkeeping is this class's
                plugin.unreserve(CycleState(), [pod], [""])

    gangs = _Gangs(table, handle.pod_groups, [p for _, p in pending], unreserve)
    for done, (_, pod) in enumerate(pending):
        if progress is not None:
            progress(done, len(pending))
        requests = {k: v for k, v in pod.requests.items() if k != PODS}
        skip = _skip_reason(pod)
        if skip:
            report.pods.append(PodOutcome(pod.namespace, pod.name, None, SKIPPED, skip, requests))
            gangs.attempted(pod, report.pods[-1])
            continue
        sched = schedulers.get(pod.scheduler_name)
        if sched is None:
            unknown_scheduler[pod.scheduler_name] += 1
            sched = default
        gate = sched.framework.run_pre_enqueue_plugins(pod)
        if not gate.is_success():
            report.pods.append(PodOutcome(pod.namespace, pod.name, None, GATED, gate.message, requests))
            gangs.attempted(pod, report.pods[-1])
            continue
        report.pods.append(_place(sched, pod, requests, preemptions))
        gangs.attempted(pod, report.pods[-1])
    preemptions.end()
    for name, count in unknown_scheduler.items():
        report.warnings.append(
            f"{count} pod(s) with schedulerName {name!r}, which no profile has: kube-scheduler would not schedule "
            f"them (they would stay Pending); they were placed with the first profile, {default_name!r}")
    for node in nodes:
        report.nodes.append({"name": node.name, "allocatable": table.allocatable_of(node.name),
                             "requested": table.requested_of(node.name)})
    return report
