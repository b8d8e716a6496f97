"""Shard: schedules batches of its pods onto the nodes it owns.

One loop step (kube's scheduling cycle + binding cycle, batched):

1. pop up to B pods from the shard's SchedulingQueue;
2. take their pod leases in Redis (one call); a pod leased by another shard waits out a backoff;
3. Filter/Score/select each pod over the shard's NodeTable and assume it there, so later pods of
   the batch see it (in-batch assume);
4. the binding cycle (`shardsched.sharding.binding_cycle`): Reserve, one Redis call that re-checks
   every placement against the ledger (the second resource check, fenced by lease token and
   shard-map epoch); Permit, one Redis call that re-checks the batch's leases and the shard map
   right before binding; Bind, one call to the cluster; then commit (bound) or the one rollback path
   (release the reservation, forget the assume, release the lease).

A pod that is not bound goes back to the queue with backoff, or to the rebalancer when another
shard may do better or only the watch can tell what became of it (a bind answered 409 or 404). With
``ShardOptions.binding_cycles`` = N > 0 the Permit and Bind of up to N batches run in the background
while the shard schedules its next batch; a stopped or retired shard waits for them before it
reports idle.

The class is plain Python (tests drive `step` directly); `shardsched.sharding.actors` makes it a Ray
actor and runs `run_forever` in a thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from shardsched.api.objects import NodeInfo, PodInfo
from shardsched.api.volumes import VolumeCatalog
from shardsched.api.workloads import WorkloadKey, WorkloadSelector
from shardsched.cache.node_table import NodeTable, PodUsage
from shardsched.config import SchedulerConfiguration
from shardsched.errors import TemporaryError
from shardsched.framework.interface import Handle
from shardsched.metrics import UNSCHEDULABLE, ShardMetrics
from shardsched.queue import (ASSIGNED_POD_DELETE, NAMESPACE_UPDATE, NODE_ADD, NODE_UPDATE, SPREAD_SELECTOR_UPDATE,
                              STORAGE_UPDATE, QueuedPodInfo, SchedulingQueue)
from shardsched.scheduler.algorithm import GenericScheduler, build_schedulers
from shardsched.sharding.binding_cycle import ShardBinding
from shardsched.sharding.shard_plugins import MarkedBinds, ShardVolumes
from shardsched.sharding.nominations import NominatedPods
from shardsched.sharding.protocols import UNSCHEDULABLE_HERE, BindTarget, Handoff, Rebalancer
from shardsched.sharding.shard_options import ShardOptions, ShardStats
from shardsched.store.ledger import Ledger

log = logging.getLogger(__name__)

#: window of the recent scheduling latency in `Shard.snapshot` (what the autoscaler reads)
RECENT_LATENCY_WINDOW_S = 10.0


#: largest adaptive batch while no binding cycle runs in the background (`Shard._batch_size`)
START_BATCH = 128


class Shard:
    """One shard (see module docstring).

    Args:
        index: the shard's logical index (its place in the rendezvous hash).
        member: this incarnation's id in the ledger's shard map (``shard-<index>@<n>``); a replaced
            shard gets a new one, so a zombie of the old one is fenced off.
        config: the scheduler configuration (profiles, backoff, attempts).
        ledger: the Redis ledger.
        cluster: where binds go.
        rebalancer: where pods this shard cannot place go.
    """

    def __init__(self, index: int, member: str, config: SchedulerConfiguration, ledger: Ledger,
                 cluster: BindTarget, rebalancer: Rebalancer, options: ShardOptions | None = None) -> None:
        self.index = index
        self.member = member
        self.config = config
        self.ledger = ledger
        self.cluster = cluster
        self.rebalancer = rebalancer
        self.options = options or ShardOptions()
        self.epoch = 0
        self.table = NodeTable()
        #: preemptors waiting here for their nominated nodes, counted in the table (`NominatedPods`)
        self.nominated = NominatedPods(self.table)
        # DefaultBinder's client: the cluster, its bind calls marked in the ledger (`MarkedBinds`)
        self.binds = MarkedBinds(self)
        volumes = ShardVolumes(self)  # VolumeBinding's PreBind writes and the ledger's arbitration of PVs
        self.schedulers: dict[str, GenericScheduler] = build_schedulers(
            config, self.table, self.options.seed, partial_view=True,
            handle=Handle(self.binds, volume_client=volumes, volume_reservations=volumes))
        self.default_scheduler = next(iter(self.schedulers.values()))
        qs = self.default_scheduler.framework.queue_sort
        self.queue = SchedulingQueue(
            sort_key=qs.sort_key,
            pod_initial_backoff_s=config.pod_initial_backoff_s,
            pod_max_backoff_s=config.pod_max_backoff_s,
            pod_max_in_unschedulable_s=config.pod_max_in_unschedulable_s,
            max_attempts=None,  # attempts are counted per cluster-wide round by the rebalancer
        )
        self.metrics = ShardMetrics()
        self.stats = ShardStats()
        self._lock = threading.RLock()  # table + schedulers; the queue has its own lock
        self._stop = threading.Event()
        # node -> (uid of its ledger shadow usage, time.monotonic() when it expires); see `ShardBinding`'s Reserve outcome
        self._shadow: dict[str, tuple[str, float]] = {}
        # uids this shard assumed in its table and the watch has not confirmed yet (kube's cache:
        # assumed pods); only these are forgotten on a rollback, see _forget
        self._assumed: set[str] = set()
        # (time.monotonic() when bound, creation -> bound latency in s) of the latest bound pods
        self.recent_latencies: deque[tuple[float, float]] = deque(maxlen=2000)
        self._idle = threading.Event()  # set while `run_forever` is not running (see `retire`)
        self._idle.set()
        self.last_error = ""
        self.binding = ShardBinding(self)  # the binding cycles, with the ledger as Reserve and Permit plugin

    # ------------------------------------------------------------------ inputs (from the coordinator)
    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _resync_epoch(self) -> None:
        """After a FENCED answer: take the ledger's current epoch. The coordinator's ``set_epoch``
        calls reach a shard actor on several threads, so two close map changes (two shards
        replaced a second apart) can arrive in the wrong order and leave the shard an epoch
        behind for good; reading the epoch back heals that. Fencing is kept: `reserve.lua` and
        `permit.lua` still check each node's owner under that epoch, so a replaced incarnation
        or a shard that lost the node stays FENCED. Redis away: left as it is."""
        try:
            epoch = self.ledger.epoch()
        except TemporaryError:
            return
        if epoch != self.epoch:
            log.info("shard %s: epoch %d -> %d (read back from the ledger after FENCED)", self.member, self.epoch, epoch)
            self.epoch = epoch

    def apply_namespaces(self, labels: Mapping[str, Mapping[str, str]], removed: Iterable[str] = (),
                         replace: bool = False) -> None:
        """Namespaces' labels (name -> labels) and namespaces deleted, or with ``replace`` the whole
        set (`NodeTable.set_namespaces`): what pod affinity's ``namespaceSelector`` selects. A
        change moves the unschedulable pods back to the queues (a term may select other pods now)."""
        with self._lock:
            changed = self.table.set_namespaces(labels, removed, replace)
        if changed:
            self.queue.move_all_to_active_or_backoff_queue(NAMESPACE_UPDATE)

    def apply_spread_selectors(self, upserts: Iterable[WorkloadSelector] = (), removed: Iterable[WorkloadKey] = (),
                               replace: bool = False) -> None:
        """Services, ReplicationControllers, ReplicaSets and StatefulSets created, changed or deleted,
        or with ``replace`` the whole set (`NodeTable.set_spread_selectors`): the selectors of
        PodTopologySpread's default constraints. A change moves the unschedulable pods back to the
        queues (their default constraints may count other pods now)."""
        with self._lock:
            changed = self.table.set_spread_selectors(upserts, removed, replace)
        if changed:
            self.queue.move_all_to_active_or_backoff_queue(SPREAD_SELECTOR_UPDATE)

    def apply_storage(self, upserts: Iterable[Any] = (), removed: Iterable[tuple[str, str]] = (),
                      invalid_pvs: Mapping[str, str] | None = None, replace: bool = False) -> None:
        """The cluster's storage objects, as `shardsched.cluster.StorageChanges` parts: views
        created or changed, (kind, key) deleted, PVs that could not be parsed (name -> error); or
        with ``replace`` the whole set (`VolumeCatalog.apply`). The first call gives the table its
        `VolumeCatalog` (before it, the volume plugins hold the pods that need one). A change moves
        the unschedulable pods back to the queues (a claim may be bound now, a volume fit)."""
        with self._lock:
            if self.table.volumes is None:
                self.table.volumes = VolumeCatalog()
                replace = True
            changed = self.table.volumes.apply(upserts, removed, invalid_pvs, replace)
        if changed:
            self.queue.move_all_to_active_or_backoff_queue(STORAGE_UPDATE)

    def apply_nodes(self, upserts: Iterable[dict] = (), removals: Iterable[str] = ()) -> None:
        """Add/update nodes this shard owns (Node objects as dicts) and drop nodes it lost."""
        moved = False
        with self._lock:
            for obj in upserts:
                self.table.add_node(NodeInfo.from_object(obj))
                moved = True
            for name in removals:
                self.table.remove_node(name)
                self._shadow.pop(name, None)
            self.metrics.nodes.set(self.table.num_nodes)
        if moved:
            self.queue.move_all_to_active_or_backoff_queue(NODE_ADD)

    def apply_bound(self, adds: Iterable[tuple[PodUsage, str]] = (), removes: Iterable[str] = ()) -> None:
        """Pods bound on this shard's nodes (by anyone) and pods that stopped counting (deleted or
        terminal). Idempotent by pod uid."""
        freed = False
        with self._lock:
            for usage, node in adds:
                self._assumed.discard(usage.uid)  # confirmed: the table now counts the truth
                self.nominated.forget(usage.uid)
                self._drop_shadow(node)
                self.table.add_pod(usage, node)
            for uid in removes:
                self._assumed.discard(uid)
                if self.table.remove_pod(uid) is not None:
                    freed = True
        if freed:
            self.queue.move_all_to_active_or_backoff_queue(ASSIGNED_POD_DELETE)

    def add_pods(self, pods: Sequence[PodInfo]) -> None:
        """New pending pods routed to this shard."""
        for pod in pods:
            self.queue.add(pod)

    def accept(self, qpis: Sequence[QueuedPodInfo], unschedulable: bool = False) -> None:
        """Pods sent by the rebalancer: into backoffQ (retry), or into unschedulable pods when no shard
        could place them (retried on cluster events or after podMaxInUnschedulablePodsDuration). A
        pod with ``nominated_node_name`` on one of this shard's nodes (a preemptor waiting for its
        victims) is counted there for the pods of equal or lower priority (`NominatedPods`)."""
        with self._lock:
            for qpi in qpis:
                self.nominated.add(qpi.pod_info)
        for qpi in qpis:
            if unschedulable:
                self.queue.add_unschedulable_if_not_present(qpi, backoff=False)
            else:
                self.queue.requeue_backoff(qpi)

    def remove_pods(self, keys: Iterable[str]) -> None:
        """Pods deleted, bound by someone else, or moved to another shard."""
        keys = list(keys)
        with self._lock:
            for key in keys:
                self.nominated.remove_key(key)
        for key in keys:
            self.queue.delete(key)

    def move_all_to_active_or_backoff_queue(self, event: str = NODE_UPDATE) -> None:
        """A cluster event that may make unschedulable pods schedulable (upstream
        ``MoveAllToActiveOrBackoffQueue``)."""
        self.queue.move_all_to_active_or_backoff_queue(event)

    def adopt(self, rebalancer: Rebalancer) -> None:
        """A new coordinator takes this shard over (the previous one died) and lists the cluster
        again: hand pods to ``rebalancer`` from now on, and drop what the previous one sent, which
        the new one sends again from its list: the queued pods (it routes every pending pod again;
        the batch in flight ends as usual) and the nodes with their pods (a node deleted meanwhile
        would otherwise stay). Binds of the batch in flight that the table no longer counts are
        still counted by their reservations in the ledger. Idempotent."""
        with self._lock:
            self.rebalancer = rebalancer
            for name in list(self.table.index):
                self.table.remove_node(name)
            self._assumed.clear()
            self._shadow.clear()
            self.nominated.clear()
            self.metrics.nodes.set(0)
        self.queue.drain()

    # ------------------------------------------------------------------ the loop
    def run_forever(self) -> None:
        """Run `step` until `stop`; each step catches and logs its own errors and never ends the loop."""
        self._idle.clear()
        try:
            self._loop()
        finally:
            try:
                self.binding.reap(block=True)  # the batches binding in the background end here
            finally:
                self._idle.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                done = self.step()
            except Exception as e:  # noqa: BLE001 - the loop must never die
                self.last_error = f"{type(e).__name__}: {e}"
                log.exception("shard %s: step failed", self.member)
                self._stop.wait(0.5)  # a failing step must not spin
                done = 0
            if not done and not self._stop.is_set():
                # woken by a pod entering activeQ, a backoff or unschedulable timeout, a binding
                # cycle ending or `stop`; at most idle_sleep_s (what is due by time alone: the
                # ledger's binds mark, the shadows' expiry)
                self.queue.wait_for_pods(self.options.idle_sleep_s)

    def stop(self) -> None:
        self._stop.set()
        self.queue.wake()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until `run_forever` has returned (its binding cycles applied); False on timeout."""
        return self._idle.wait(timeout_s)

    def drain(self, fraction: float = 1.0) -> list[QueuedPodInfo]:
        """Remove and return ``fraction`` (in [0, 1]) of the queued pods, for the coordinator to route
        them again when the shard count changes: all of them (a removed shard), or the share that
        added shards take over, the last in queue order (`SchedulingQueue.drain`), so that this
        shard goes on with the pods it would pop next. Pods in flight stay here: they end bound,
        handed off, or back in this queue."""
        out = self.queue.drain() if fraction >= 1.0 else self.queue.drain(max_n=round(len(self.queue) * max(fraction, 0.0)))
        with self._lock:
            for q in out:
                self.nominated.remove(q.pod_info.uid)
        return out

    def retire(self, timeout_s: float = 30.0) -> list[QueuedPodInfo]:
        """This shard is being removed: stop the loop, wait up to ``timeout_s`` for the batch in
        flight to end (its pods are then bound, handed to the rebalancer, or back in the queue), and
        return every queued pod (`drain`; the coordinator drained the queue before, so these are
        what the last batch put back). The coordinator has fenced this shard off first, so the
        batch's reservations fail FENCED and come back through the rebalancer. Safe to call on a
        shard whose loop never ran; idempotent."""
        self.stop()
        if not self._idle.wait(timeout_s):
            log.warning("shard %s: the batch in flight did not end within %.0f s; draining anyway", self.member, timeout_s)
        return self.drain()

    def _batch_size(self) -> int:
        """Pods to pop: ``batch_size``, or the active queue up to ``max_batch_size``. With binding
        cycles in the background the adaptive batch also starts small: at most `START_BATCH`, or
        twice the pods of the binding cycles still running, so that the first binds of a burst go
        out after a small batch's scheduling cycle rather than a full one (against an API server a
        full batch took ~0.2 s of the shard's core while nothing was being bound), and the batches
        grow while the API server works."""
        if self.options.batch_size > 0:
            return self.options.batch_size
        size = min(self.options.max_batch_size, self.queue.pending_counts()["active"])
        if self.options.binding_cycles > 0:
            size = min(size, max(START_BATCH, 2 * self.binding.in_flight()))
        return max(1, size)

    def step(self) -> int:
        """One batch (see module docstring). Returns the number of pods popped (0 = idle).

        Raises only on a bug; even then the batch's pods still in flight are forgotten in the table
        and put back with backoff first, so nothing is lost.
        """
        reaped = self.binding.reap(block=False)
        self.binds.renew()
        self._expire_shadows()
        batch = self.queue.pop_batch(self._batch_size())
        if not batch:
            self._publish_pending()
            return reaped
        try:
            return self._process(batch)
        except Exception:
            in_flight = self.queue.in_flight
            for q in batch:
                if q.key in in_flight:
                    with self._lock:
                        self._forget(q.pod_info)
                    q.last_failure_reason = "internal error in the shard's scheduling step"
                    self.queue.requeue_backoff(q)
            raise

    def _process(self, batch: list[QueuedPodInfo]) -> int:
        self.stats.batches += 1
        self.metrics.batch_size.observe(len(batch))
        started = time.perf_counter()
        popped = len(batch)

        # Pods the watch showed bound while they waited (a bind answered 504 that was applied, or
        # another scheduler): done, as kube-scheduler skips assigned pods. Scheduling one again
        # would move its usage in the table and a failed bind would then forget it.
        with self._lock:
            assigned = {q.key for q in batch
                        if q.pod_info.uid not in self.nominated and self.table.node_of(q.pod_info.uid) is not None}
        if assigned:
            for key in assigned:
                self.queue.done(key)
            batch = [q for q in batch if q.key not in assigned]
            if not batch:
                return popped

        try:
            tokens = self.ledger.acquire_leases([q.pod_info.uid for q in batch], self.member, self.options.lease_ttl_ms)
        except TemporaryError as e:
            self._pause(batch, f"Redis unavailable while taking leases: {e}")
            return popped
        leased = []
        for q in batch:
            if q.pod_info.uid in tokens:
                leased.append(q)
            else:  # another shard holds it (e.g. a crashed shard's lease not yet expired)
                self.stats.lease_busy += 1
                self.metrics.leases.labels("held_elsewhere").inc()
                q.last_failure_reason = "pod lease held by another shard"
                # Not a scheduling attempt: retried after the initial backoff until the lease is
                # free, not backed off exponentially past its expiry (a crashed shard's pods must
                # move on within the lease TTL and a few seconds).
                q.attempts = max(1, q.attempts - 1)
                self.queue.requeue_backoff(q)
        self.metrics.leases.labels("acquired").inc(len(leased))

        # Scheduling cycle: Filter/Score/select + assume, per pod in queue order.
        placed: list[tuple[QueuedPodInfo, str]] = []  # (pod, the node it is assumed on)
        handoffs: list[Handoff] = []
        with self._lock:
            spent_before = {name: dict(s.duration_s) for name, s in self.schedulers.items()}
            try:
                for q in leased:
                    pod = q.pod_info
                    # its own nomination leaves the table (handed back, the coordinator sends it again);
                    # the others count when of equal or higher priority (RunFilterPluginsWithNominatedPods)
                    self.nominated.remove(pod.uid)
                    self.nominated.for_pod(pod)
                    result = self.schedulers.get(pod.scheduler_name, self.default_scheduler).schedule(pod)
                    if result.node is not None:
                        self._assumed.add(pod.uid)
                        placed.append((q, result.node))
                    else:
                        d = result.status.diagnosis
                        handoffs.append(Handoff(q, UNSCHEDULABLE_HERE, result.status.message,
                                                dict(d.reasons) if d else {}, d.num_all_nodes if d else self.table.num_nodes))
            finally:
                self.nominated.restore()
            for name, sched in self.schedulers.items():
                for point, total_s in sched.duration_s.items():
                    if total_s > spent_before[name][point]:
                        self.metrics.extension_point_duration.labels(
                            point, "Success", sched.framework.profile_name).observe(total_s - spent_before[name][point])
        for h in handoffs:
            self.metrics.schedule_attempts.labels(UNSCHEDULABLE, h.qpi.pod_info.scheduler_name).inc()
        if handoffs:
            self._release_leases([(h.qpi.pod_info.uid, tokens[h.qpi.pod_info.uid]) for h in handoffs])
        if not placed:
            self._handoff(handoffs)
            return popped

        # The binding cycle: Reserve, Permit, Bind (`ShardBinding`).
        self.binding.run(placed, tokens, handoffs, started)
        return popped

    # ------------------------------------------------------------------ helpers
    def _forget(self, pod: PodInfo) -> None:
        """Undo this shard's assume of the pod (kube's ForgetPod). A pod the watch has confirmed
        bound meanwhile (a bind that answered 504 but was applied, or a 409 because someone else
        bound it) is the truth and stays counted. Call with the lock held."""
        if pod.uid in self._assumed:
            self._assumed.discard(pod.uid)
            self.table.remove_pod(pod.uid)

    def _release_leases(self, pairs: list[tuple[str, int]]) -> None:
        try:
            self.ledger.release_leases(dict(pairs), self.member)
        except TemporaryError:
            pass  # they expire

    def _drop_shadow(self, node: str) -> None:
        shadow = self._shadow.pop(node, None)
        if shadow is not None:
            self.table.remove_pod(shadow[0])

    def _expire_shadows(self) -> None:
        """Drop shadows older than a reservation TTL; pods waiting for room are moved back."""
        if not self._shadow:
            return
        now = time.monotonic()
        with self._lock:
            expired = [node for node, (_, until) in self._shadow.items() if until <= now]
            for node in expired:
                self._drop_shadow(node)
        if expired:
            self.queue.move_all_to_active_or_backoff_queue(ASSIGNED_POD_DELETE)

    def _pause(self, qpis: Sequence[QueuedPodInfo], why: str) -> None:
        """Redis away: no binding without a reservation. Pods wait out a backoff; nothing is lost."""
        self.last_error = why
        log.warning("shard %s: %s; binding paused, %d pods back to backoff", self.member, why, len(qpis))
        for q in qpis:
            q.last_failure_reason = why
            self.queue.requeue_backoff(q)
        self.stats.paused_s += 0.1
        self._stop.wait(0.1)

    def _handoff(self, items: list[Handoff]) -> None:
        if not items:
            return
        for h in items:
            self.queue.done(h.qpi.key)
        self.stats.handed_off += len(items)
        self.rebalancer.handoff(self.index, items)

    def _publish_pending(self) -> None:
        for queue, n in self.queue.pending_counts().items():
            self.metrics.pending_pods.labels(queue).set(n)

    # ------------------------------------------------------------------ inspection
    def snapshot(self) -> dict[str, Any]:
        """Status for the coordinator and the progress display (plain dict)."""
        self._publish_pending()
        with self._lock:
            n = self.table.n
            free_cpu = int((self.table.free("cpu")[self.table.valid[:n]]).sum()) if n else 0
            nodes = self.table.num_nodes
        since = time.monotonic() - RECENT_LATENCY_WINDOW_S
        recent = [lat for t, lat in list(self.recent_latencies) if t >= since]
        return {"index": self.index, "member": self.member, "nodes": nodes, "free_cpu_milli": free_cpu,
                "pending": self.queue.pending_counts(), "in_flight": len(self.queue.in_flight),
                "latency_p90_s": float(np.percentile(recent, 90)) if recent else None,
                "bound": self.stats.bound, "conflicts": self.stats.conflicts,
                "reserve_failures": self.stats.reserve_failures, "bind_errors": self.stats.bind_errors,
                "handed_off": self.stats.handed_off, "batches": self.stats.batches, "last_error": self.last_error}

    def pending_keys(self) -> list[str]:
        """Keys of every pod this shard holds (queued or in flight)."""
        return [q.key for q in self.queue.pods()] + list(self.queue.in_flight)

    def take_stats(self) -> ShardStats:
        return self.stats

    def metric_samples(self) -> list:
        self._publish_pending()
        return self.metrics.samples()

    def ping(self) -> str:
        return self.member
