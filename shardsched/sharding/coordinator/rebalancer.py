"""The rebalancer: pods a shard could not place (`Handoff`) are tried on the shards not yet tried in
this round; when none is left the round counts as one failed attempt: the pod gets
``PodScheduled=False`` (reason Unschedulable) and a FailedScheduling Event with kube's message over
all nodes, and waits in the unschedulable pods of the shard with the most matching nodes. After
``maxSchedulingAttempts`` rounds a Warning event and the alert metric say so; the pod is still never
dropped. A pod whose node is nominated over the whole cluster gets a new nomination instead.

Before a round counts as failed, the pod's PostFilter plugins (DefaultPreemption) run over the whole
cluster (`Preemption`): a pod that preempted waits, nominated, among the unschedulable pods of its
node's owner; a preemptor handed back is decided afresh over the whole cluster at once (its victims
may be gone, or it may need another node)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import numpy as np

from shardsched.api.objects import PodInfo
from shardsched.queue import QueuedPodInfo
from shardsched.scheduler.algorithm import ScheduleResult
from shardsched.sharding.coordinator.events import record_unschedulable
from shardsched.cache.node_table import PodUsage
from shardsched.sharding.coordinator.nominator import cluster_decision, needs_cluster_view, nominate, unnominate
from shardsched.sharding.coordinator.preemption import FITS, NOMINATED, WAITING, Preemption
from shardsched.sharding.coordinator.router import choose, shard_counts, slim
from shardsched.sharding.coordinator.state import CoordinatorState, Tracked
from shardsched.sharding.protocols import BIND_CONFLICT, FENCED, Handoff

#: seconds of hand-offs one `Rebalancer.rebalance` call decides before it leaves the rest to the next
#: turn of the loop: it holds the state lock, which the watch, the status and the health checks need
#: too (a burst of preemptions, each with its API writes, would hold it for minutes)
REBALANCE_BUDGET_S = 0.5


class Rebalancer:
    """Takes the shards' hand-offs (from any thread) and decides where each pod goes next, in the
    coordinator's loop (`rebalance`)."""

    def __init__(self, state: CoordinatorState, preemption: Preemption | None = None) -> None:
        self.state = state
        self.preemption = preemption or Preemption(state)
        #: the gangs (`Gangs`): a member handed back goes there; None: no gangs
        self.gangs = None
        self._inbox: list[tuple[int, list[Handoff]]] = []
        #: rounds that ended without a node, whose decision over the whole cluster (PostFilter
        #: included) did not fit in the last call's budget: decided first at the next one
        self._deferred: list[tuple[Tracked, QueuedPodInfo, np.ndarray | None, int]] = []
        self._inbox_lock = threading.Lock()

    def handoff(self, shard: int, items: list[Handoff]) -> None:
        """Called by shards (fire and forget): pods they cannot place now."""
        with self._inbox_lock:
            self._inbox.append((shard, items))

    def rebalance(self) -> bool:
        """Decide for the pods handed off since the last call, for up to `REBALANCE_BUDGET_S` (the
        rest first at the next call); call with the state lock held. Returns whether there was any."""
        with self._inbox_lock:
            inbox, self._inbox = self._inbox, []
        if not inbox and not self._deferred:
            return False
        state = self.state
        forward: dict[int, list[PodInfo]] = defaultdict(list)
        park: dict[int, list] = defaultdict(list)
        retry: dict[int, list] = defaultdict(list)
        deadline = time.monotonic() + REBALANCE_BUDGET_S
        later: list[tuple[int, list[Handoff]]] = []
        decide, self._deferred = self._deferred, []
        for shard, items in inbox:
            for k, h in enumerate(items):
                if time.monotonic() > deadline:
                    later.append((shard, items[k:]))
                    break
                pod = h.qpi.pod_info
                t = state.pending.get(pod.uid)
                if t is None:  # bound or deleted meanwhile
                    continue
                if self.gangs is not None and self.gangs.handed_back(t, h.qpi):
                    continue  # a gang member: decided again with its group (`Gangs`)
                t.unschedulable = False
                state.metrics.requeues.labels(h.reason).inc()
                state.counters["requeues"] += 1
                if h.reason == FENCED:
                    t.tried.clear()
                elif h.reason != BIND_CONFLICT:  # a rejected bind says nothing about the shard's room
                    t.tried.add(shard)
                if pod.uid in state.preempting:
                    # a preemptor is pinned to its node: decided afresh over the whole cluster
                    state.unroute(t.shard)
                    t.tried.clear()
                    h.qpi.pod_info, t.pod = pod.nominated(""), t.pod.nominated("")
                    decide.append((t, h.qpi, None, shard))
                    continue
                if needs_cluster_view(state, pod):
                    # its node is chosen here over the whole cluster, afresh after any failure
                    state.unroute(t.shard)
                    target, nominated = nominate(state, pod.nominated(""))
                    if nominated is not None:
                        t.pod, h.qpi.pod_info, t.shard = slim(nominated), nominated, target
                        state.routed[target] += 1
                        retry[target].append(h.qpi)
                        continue
                    h.qpi.pod_info, t.pod = pod.nominated(""), t.pod.nominated("")
                    if self.preemption.has_post_filter(pod):
                        decide.append((t, h.qpi, None, shard))
                    else:
                        self._fail_round(t, h.qpi, cluster_decision(state, h.qpi.pod_info), None, shard, park, retry)
                    continue
                room, static = shard_counts(state, pod)
                target = choose(state, room, static, exclude=t.tried)
                state.unroute(t.shard)
                if target is not None:
                    t.shard = target
                    state.routed[target] += 1
                    forward[target].append(pod)
                    continue
                # No shard left to try in this round. If the coordinator's own view still sees
                # room, the shards' views are behind the watch: retry after a backoff, no attempt
                # is counted. Otherwise the round is one failed attempt (kube's FailureHandler).
                t.tried.clear()
                if self.preemption.has_post_filter(pod):  # its decision over the whole cluster comes first
                    decide.append((t, h.qpi, static, shard))
                    continue
                result = state.scheduler_for(pod).schedule(pod, assume=False)
                if result.node is not None and state.owners.get(result.node) is not None:
                    target = state.owners[result.node]
                    t.shard = target
                    state.routed[target] += 1
                    retry[target].append(h.qpi)
                    continue
                self._fail_round(t, h.qpi, result, static, shard, park, retry)
        # the pass's decisions over the whole cluster, PostFilter included, in queue order (kube's
        # PrioritySort; equal priorities in the order they were handed back), each seeing the
        # victims and nominations of the ones before; what the budget leaves, first at the next call
        decide.sort(key=lambda d: -d[1].pod_info.priority)
        if decide:
            self.preemption.begin_pass()
        for k, (t, qpi, static, shard) in enumerate(decide):
            if k and time.monotonic() > deadline:
                self._deferred = decide[k:]
                break
            if state.pending.get(t.pod.uid) is not t:  # bound or deleted meanwhile
                continue
            self._fail_round(t, qpi, None, static, shard, park, retry)
        if later:
            with self._inbox_lock:
                self._inbox[:0] = later
        for index, qpis in retry.items():
            state.shards[index].client.accept(qpis, False)
        for index, pods in forward.items():
            state.shards[index].client.add_pods(pods)
        for index, qpis in park.items():
            state.shards[index].client.accept(qpis, True)
        self.preemption.flush()  # the victims' deletions, once their preemptors wait where they retry
        return True

    def _fail_round(self, t: Tracked, qpi: QueuedPodInfo, failed: ScheduleResult | None, static: np.ndarray | None,
                    shard: int, park: dict[int, list], retry: dict[int, list]) -> None:
        """A round over the shards found no node: the profile over the whole cluster and its
        PostFilter plugins (`Preemption.run`, which decides first whether the pod fits now), then
        one failed attempt, or a retry where it fits. ``failed``: for a profile without PostFilter
        plugins, the failed decision whose message the attempt gets (None otherwise); ``static``:
        `shard_counts`' (computed here when None and needed)."""
        state = self.state
        pod = qpi.pod_info
        if failed is not None:
            if static is None:
                _, static = shard_counts(state, pod)
            self._give_up_round(t, qpi, failed.status.message, static, shard, park)
            return
        unnominate(state, pod.uid)  # a preemptor's assume: it is decided afresh
        out = self.preemption.run(pod, failed)
        owner = state.owners.get(out.node) if out.node is not None else None
        if out.node is not None and (owner is None or not state.shards[owner].alive):
            # the node's owner is being replaced: retried after a backoff, no attempt counted
            target = next((s.index for s in state.shards if s.alive), min(shard, len(state.shards) - 1))
            t.shard = target
            state.routed[target] += 1
            retry[target].append(qpi)
            return
        if out.kind == FITS and pod.uid not in state.preempting and not needs_cluster_view(state, pod):
            t.shard = owner
            state.routed[owner] += 1
            retry[owner].append(qpi)
            return
        if out.kind in (FITS, NOMINATED, WAITING):
            # pinned to the node (a preemptor, or a pod whose node only the whole cluster's view can
            # choose), assumed there in the whole-cluster table until it binds
            # (a preemptor on the GPU devices its nomination holds, pinned there while its victims go)
            qpi.pod_info = pod.nominated(out.node, out.devices)
            t.pod = t.pod.nominated(out.node, out.devices)
            state.table.add_pod(PodUsage.of(qpi.pod_info), out.node)
            state.nominated[pod.uid] = out.node
            if out.kind == FITS:
                t.shard = owner
                state.routed[owner] += 1
                retry[owner].append(qpi)
                return
            static = np.zeros(len(state.shards), np.int64)
            static[owner] = 1
        elif static is None:
            _, static = shard_counts(state, pod)
        # a preemptor's FailedScheduling and PodScheduled go out with its nomination (`Preemption.flush`)
        self._give_up_round(t, qpi, out.message, static, shard, park, write=out.kind != NOMINATED)

    def _give_up_round(self, t: Tracked, qpi: QueuedPodInfo, message: str, static: np.ndarray,
                       shard: int, park: dict[int, list], write: bool = True) -> None:
        """A round over the cluster found no node (``message``: kube's, over the whole cluster):
        one failed attempt (kube's FailureHandler); the pod waits among the unschedulable pods of
        the shard with most matching nodes (``park``). ``write``: False when the attempt's Event
        and condition are written by someone else (`record_unschedulable`)."""
        state = self.state
        t.rounds += 1
        t.unschedulable = True
        target = int(np.argmax(static)) if static.any() else min(shard, len(state.shards) - 1)
        if not state.shards[target].alive:
            target = next((s.index for s in state.shards if s.alive), shard)
        t.shard = target
        state.routed[target] += 1
        record_unschedulable(state, t, message, write)
        park[target].append(qpi)
