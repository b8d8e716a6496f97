"""Nominated nodes: the node of a pod whose constraints no shard can check alone, chosen by the
coordinator over the whole cluster (`nominate`) and assumed in its table until the pod is bound,
deleted or handed back (`unnominate`)."""

from __future__ import annotations

from dataclasses import replace

from shardsched.api.objects import PodInfo
from shardsched.cache.node_table import PodUsage
from shardsched.errors import TemporaryError
from shardsched.framework.interface import PostFilterResult
from shardsched.scheduler.algorithm import GenericScheduler, ScheduleResult
from shardsched.sharding.coordinator.state import CoordinatorState


def needs_cluster_view(state: CoordinatorState, pod: PodInfo) -> bool:
    """`Framework.needs_cluster_view` of the pod's profile."""
    return state.scheduler_for(pod).framework.needs_cluster_view(pod)


def cluster_decision(state: CoordinatorState, pod: PodInfo, assume: bool = False) -> ScheduleResult:
    """kube's decision for ``pod`` over the whole cluster (the state's table, every plugin of its
    profile over every node, the pods nominated so far included)."""
    sched = state.cluster_schedulers.get(pod.scheduler_name) or next(iter(state.cluster_schedulers.values()))
    return sched.schedule(pod, assume=assume)


def nominate(state: CoordinatorState, pod: PodInfo) -> tuple[int | None, PodInfo | None]:
    """For a pod whose constraints a shard cannot check alone (``Framework.needs_cluster_view``:
    required pod affinity, anti-affinity over a wider key than the hostname, DoNotSchedule
    spread): choose its node over the whole cluster, assume it there (so the pods nominated
    after it see it, as kube-scheduler's assume), and return (owner shard, the pod with
    ``nominated_node_name``). (None, None) for other pods, and when no node fits or the node
    has no live owner; the shard then refuses the pod and the rebalancer decides again.

    The assume is undone when the pod is bound or deleted, or handed back (`unnominate`); it is
    never taken for a bound pod (the ledger's rebuild and the shards read
    `CoordinatorState.bound_usages`).
    """
    if not needs_cluster_view(state, pod):
        return None, None
    unnominate(state, pod.uid)
    result = cluster_decision(state, pod.nominated(""), assume=True)
    owner = state.owners.get(result.node) if result.node is not None else None
    if owner is None or not state.shards[owner].alive:
        if result.node is not None:
            state.table.remove_pod(pod.uid)
        return None, None
    state.nominated[pod.uid] = result.node
    state.counters["nominated"] += 1
    return owner, pod.nominated(result.node, result.devices)


def unnominate(state: CoordinatorState, uid: str) -> None:
    """Undo `nominate`'s assume; safe to call for any pod."""
    if state.nominated.pop(uid, None) is not None and uid not in state.bound_on:
        state.table.remove_pod(uid)


def release_ledger_holds(state: CoordinatorState, holds: dict[str, str], what: str) -> None:
    """Clear nominations (uid -> node) in the ledger: preemptors' nominations and gang members'
    holds alike. A ledger that does not answer is noted in ``state.last_error`` ("``what`` not
    released: ..."); the holds then expire by themselves (``NOMINATION_TTL_MS``)."""
    if not holds:
        return
    try:
        state.ledger.unnominate(holds)
    except TemporaryError as e:
        state.last_error = f"{what} not released: {e}"


def nomination_devices(sched: GenericScheduler, pod: PodInfo, pf: PostFilterResult) -> tuple[int, ...]:
    """The GPU devices a preemptor is nominated to on ``pf.nominated_node``: those its profile
    would take there (`GenericScheduler.device_choice`) with ``pf.victims`` gone, chosen with the
    victims out of the table (put back as they were, `PodUsage.pinned`). () for a pod without
    GPUs, or when no device set fits once they are gone (a profile without GPUDevice's Filter,
    which counts GPUs in aggregate: the nomination then holds the node's sums only)."""
    if PodUsage.of(pod, ()).gpu is None:
        return ()
    table = sched.table
    node = pf.nominated_node
    out = []
    for v in pf.victims:
        u = table.remove_pod(v.uid)
        if u is not None:
            out.append(u)
    try:
        return sched.device_choice(pod, node)
    finally:
        for u in out:
            table.add_pod(replace(u, pinned=True), node)
