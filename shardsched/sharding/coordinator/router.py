"""Routing: which shard a pending pod goes to, from the coordinator's NodeTable of the whole cluster.

A pod is routed to a shard owning nodes where it fits (label- and capacity-aware): to the shard
whose emptiest nodes stay emptiest once the pods already routed to it are placed (`Room`), so that
pods spread over all nodes as LeastAllocated spreads them; for a profile that packs
(NodeResourcesFit's MostAllocated, or a RequestedToCapacityRatio shape that rises with
utilization), to the shard whose fullest node with room is fullest, so that pods fill nodes in the
order kube-scheduler would fill them over the whole cluster. A pod whose constraints need the whole
cluster goes to the owner of its nominated node (`nominator`).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from shardsched.api.objects import PodInfo
from shardsched.api.quantity import CPU, MEMORY
from shardsched.queue import QueuedPodInfo
from shardsched.sharding.coordinator.nominator import needs_cluster_view, nominate
from shardsched.sharding.coordinator.state import CoordinatorState, Tracked


def slim(pod: PodInfo) -> PodInfo:
    """The pod as sent to shards: the raw object reduced to its annotations (creation time)."""
    ann = (pod.obj.get("metadata") or {}).get("annotations")
    out = PodInfo(**{f: getattr(pod, f) for f in PodInfo.__dataclass_fields__ if f != "obj"})
    out.obj = {"metadata": {"annotations": ann}} if ann else {}
    return out


class Room:
    """Where a pod (one signature) fits in each shard, for routing: the free shares (LeastAllocated's
    0..1) of the shard's nodes where it fits, and what one such pod takes of a node (``cost``).

    ``level(shard, routed)`` ranks the shards for the next pod, once ``routed`` pods like this
    one are placed on the shard's nodes the way the profile's scoring places them; the coordinator
    routes to the highest. Spreading (LeastAllocated, the default): the free share of the shard's
    emptiest nodes, each pod going onto the emptiest node (water filling: the top nodes are
    brought down to a common level, and the pods' total cost, ``routed * cost``, is the volume
    taken off them); with nothing routed, the shard's emptiest node. Packing (``holds`` given,
    per shard how many such pods each of its nodes where the pod fits has room for, from the
    pod's requests: MostAllocated): minus the free share of the fullest node that still has room,
    each pod going onto the fullest node where it fits; below -1 once the shard's nodes are
    full. Routing pod by pod
    to the highest level then follows the cluster-wide order in which kube-scheduler's scoring
    would place them. O(log nodes) per call after O(nodes log nodes) set-up.
    """

    def __init__(self, shares: list[np.ndarray], cost: float, holds: list[np.ndarray] | None = None) -> None:
        self.cost = cost
        self.packing = holds is not None
        self.fits = np.array([len(f) for f in shares], np.int64)
        self._desc: list[np.ndarray] = []
        self._sums: list[np.ndarray] = []
        self._needs: list[np.ndarray] = []
        for i, f in enumerate(shares):
            if holds is not None:  # fullest first, with the running sum of the pods they hold
                order = np.argsort(f, kind="stable")
                self._desc.append(f[order])
                self._sums.append(np.cumsum(holds[i][order]))
                continue
            d = np.sort(f)[::-1]
            sums = np.cumsum(d)
            self._desc.append(d)
            self._sums.append(sums)
            # volume that brings the top k nodes down to the k-th's share (non-decreasing in k)
            self._needs.append(sums - np.arange(1, len(d) + 1) * d)

    def levels(self, shard: int, routed: int, m: int) -> np.ndarray:
        """`level` after ``routed``, ``routed + 1``, ..., ``routed + m - 1`` pods, at once: float
        array, shape (m,), non-increasing for a spreading profile (each pod takes free room off
        the shard's emptiest nodes). Packing profiles are ranked pod by pod (`level`)."""
        d = self._desc[shard]
        if not len(d):
            return np.full(m, -np.inf)
        if self.packing:
            return np.array([self.level(shard, routed + i) for i in range(m)])
        volume = (routed + np.arange(m)) * self.cost
        k = np.maximum(1, np.searchsorted(self._needs[shard], volume, side="right"))
        out = (self._sums[shard][k - 1] - volume) / k
        out[volume <= 0] = d[0]
        return out

    def level(self, shard: int, routed: int) -> float:
        """The shard's rank for the next pod after ``routed`` pods (class docstring); -inf when it
        fits nowhere."""
        d = self._desc[shard]
        if not len(d):
            return -np.inf
        if self.packing:
            holds = self._sums[shard]
            j = int(np.searchsorted(holds, routed, side="right"))
            if j >= len(d):  # every node estimated full: the least overfull shard ranks first
                return -1.0 - (routed - float(holds[-1]) + 1) * self.cost
            placed = routed - (float(holds[j - 1]) if j else 0.0)  # already on node j
            return -float(d[j] - placed * self.cost)
        volume = routed * self.cost
        if volume <= 0:
            return float(d[0])
        k = max(1, int(np.searchsorted(self._needs[shard], volume, side="right")))
        return float((self._sums[shard][k - 1] - volume) / k)


def shard_counts(state: CoordinatorState, pod: PodInfo) -> tuple[Room, np.ndarray]:
    """(room, static): `Room`, where the pod fits now in each shard and how free those nodes
    are; ``static``, int array of shape (shards,), per shard its nodes passing the pod's static
    filters."""
    sched = state.scheduler_for(pod)
    packing = sched.framework.packs  # a look at the profile's few Score plugins, once per signature
    static_ok, feasible = sched.feasible_mask(pod)
    n = len(feasible)
    owner = state.owner_slots[:n]
    k = len(state.shards)
    fit = feasible & (owner >= 0)
    t = state.table
    alloc = t.alloc[[t.res_index[CPU], t.res_index[MEMORY]], :n].astype(np.float64)
    used = t.nonzero_requested[:, :n].astype(np.float64)
    # kube's LeastAllocated: the mean over cpu and memory of the share still free (scoring usage,
    # NonZeroRequested), here clipped to [0.001, 1] so that a node where the pod fits counts
    share = np.divide(alloc - used, alloc, out=np.zeros_like(alloc), where=alloc > 0)
    share = np.clip(share.mean(axis=0), 0.001, 1.0)
    # what one such pod takes of a node, in the same units (on the feasible nodes' mean size)
    request = np.array([pod.nonzero_cpu_milli, pod.nonzero_memory_bytes], np.float64)
    size = alloc[:, fit].mean(axis=1) if fit.any() else np.zeros(2)
    cost = float(np.divide(request, size, out=np.zeros(2), where=size > 0).mean())
    holds = None
    if packing:  # how many such pods each node has room for (at least the one that fits now)
        room_for = np.full(n, np.iinfo(np.int64).max, np.int64)
        for name, value in pod.requests.items():
            row = t.res_index.get(name)
            if value > 0 and row is not None:
                room_for = np.minimum(room_for, (t.alloc[row, :n] - t.requested[row, :n]) // value)
        room_for = np.maximum(room_for, 1)
        holds = [room_for[fit & (owner == s)] for s in range(k)]
    room = Room([share[fit & (owner == s)] for s in range(k)], cost, holds)
    static = np.bincount(owner[static_ok & (owner >= 0)], minlength=k)[:k]
    return room, static


def choose(state: CoordinatorState, room: Room, static: np.ndarray, exclude: set[int] = frozenset()) -> int | None:
    """The live shard to route the next such pod to (not in ``exclude``), or None when it fits in
    none of them now."""
    alive = np.array([s.alive for s in state.shards], bool)
    ok = alive & (room.fits > 0)
    for i in exclude:
        if i < len(ok):  # a shard removed since
            ok[i] = False
    if not ok.any():
        return None
    # the shard whose emptiest nodes stay emptiest once the pods already routed to it are placed
    # (`Room.level`): a burst spreads in proportion to the shards' free room, and pods arriving
    # one at a time go to the shard holding the emptiest node, so that they spread over all
    # nodes as kube-scheduler's LeastAllocated spreads them over its nodes; for a packing
    # profile, the shard holding the fullest node with room, as MostAllocated fills nodes
    levels = np.array([room.level(s, int(state.routed[s])) if ok[s] else -np.inf for s in range(len(ok))])
    return int(np.argmax(levels))


def choose_many(state: CoordinatorState, room: Room, static: np.ndarray, m: int) -> np.ndarray:
    """The shards to route ``m`` pods of one signature to, in order: what `choose` gives pod by
    pod, each pod counted in ``state.routed`` before the next is chosen (which this does too), for
    the m pods at once. For a spreading profile each shard's `Room.levels` fall as pods are routed
    to it, so pod-by-pod choice takes the m highest levels over all shards (ties to the lowest
    index, as ``np.argmax``): one sort over shards x m instead of m Python turns over the shards.
    A pod that fits nowhere goes to the shard with most matching nodes (which reports why).

    Returns: int array, shape (m,), of shard indexes."""
    k = len(state.shards)
    alive = np.array([s.alive for s in state.shards], bool)
    ok = np.flatnonzero(alive & (room.fits[:k] > 0))
    if not len(ok):
        out = np.full(m, int(np.argmax(static)) if static.any() else 0, np.int64)
        state.routed[out[0]] += m
        return out
    if room.packing:  # levels rise as a node fills: pod by pod
        out = np.empty(m, np.int64)
        for i in range(m):
            out[i] = choose(state, room, static)
            state.routed[out[i]] += 1
        return out
    levels = np.concatenate([room.levels(int(s), int(state.routed[s]), m) for s in ok])
    shard_of = np.repeat(ok, m)
    top = np.lexsort((np.tile(np.arange(m), len(ok)), shard_of, -levels))[:m]
    out = shard_of[top]
    np.add.at(state.routed, out, 1)
    return out


def route(state: CoordinatorState, pods: list[PodInfo]) -> None:
    """Track pending pods and send them to shards (one call per shard, the pods in watch order).
    Pods whose constraints need the whole cluster go to their nominated node's owner
    (`nominate`); the others are routed a signature at a time (`choose_many`)."""
    targets: list[int] = [0] * len(pods)
    sent: list[PodInfo] = [pods[0]] * len(pods) if pods else []
    groups: dict[str, list[int]] = defaultdict(list)  # signature -> indexes of the pods to route
    cluster_view: dict[str, bool] = {}
    for i, pod in enumerate(pods):
        wide = cluster_view.get(pod.signature)
        if wide is None:
            wide = cluster_view[pod.signature] = needs_cluster_view(state, pod)
        if wide:
            target, nominated = nominate(state, pod)
            if nominated is not None:
                targets[i], sent[i] = target, nominated
                state.routed[target] += 1
                continue
        groups[pod.signature].append(i)
    for members in groups.values():
        room, static = shard_counts(state, pods[members[0]])
        for i, target in zip(members, choose_many(state, room, static, len(members)).tolist()):
            targets[i], sent[i] = target, pods[i]
    by_shard: dict[int, list[PodInfo]] = defaultdict(list)
    for pod, target in zip(sent, targets):
        slimmed = slim(pod)  # kept and sent without the raw object: memory is per pending pod
        state.pending[pod.uid] = Tracked(slimmed, target)
        by_shard[target].append(slimmed)
    for index, items in by_shard.items():
        state.shards[index].client.add_pods(items)
    state.counters["routed"] += len(pods)


def reroute(state: CoordinatorState, items: list[tuple[Tracked, QueuedPodInfo | None]]) -> None:
    """Route tracked pods again (drained from a shard: with their queued pod; from limbo: None).
    Like `route` (`Room`); a pod known unschedulable waits among the unschedulable pods of the
    shard with most matching nodes."""
    forward: dict[int, list[PodInfo]] = defaultdict(list)
    park: dict[int, list[QueuedPodInfo]] = defaultdict(list)
    counts_cache: dict[str, tuple[Room, np.ndarray]] = {}
    for t, q in items:
        state.unroute(t.shard)
        target, nominated = (None, None) if t.unschedulable else nominate(state, t.pod)
        if nominated is not None:  # a node over the whole cluster, afresh: the shards changed
            t.pod, t.shard = slim(nominated), target
            if q is not None:
                q.pod_info = t.pod
            forward[target].append(t.pod)
            state.routed[target] += 1
            continue
        if t.pod.nominated_node_name:  # no node now: its shard refuses it, the rebalancer decides
            t.pod = t.pod.nominated("")
            if q is not None:
                q.pod_info = t.pod
        counts = counts_cache.get(t.pod.signature)
        if counts is None:
            counts = counts_cache[t.pod.signature] = shard_counts(state, t.pod)
        room, static = counts
        parked = t.unschedulable and q is not None
        target = None if parked else choose(state, room, static)
        if target is None:
            target = int(np.argmax(static)) if static.any() else 0
        if parked:
            park[target].append(q)
        else:
            forward[target].append(q.pod_info if q is not None else slim(t.pod))
        t.shard = target
        state.routed[target] += 1
    for index, pods in forward.items():
        state.shards[index].client.add_pods(pods)
    for index, qpis in park.items():
        state.shards[index].client.accept(qpis, True)
