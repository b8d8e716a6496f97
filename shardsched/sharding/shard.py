"""Shard: schedules batches of its pods onto the nodes it owns.

One loop step (kube's scheduling cycle + binding cycle, batched):

1. pop up to B pods from the shard's SchedulingQueue;
2. take their pod leases in Redis (one call); a pod leased by another shard waits out a backoff;
3. Filter/Score/select each pod over the shard's NodeTable and assume it there, so later pods of
   the batch see it (in-batch assume);
4. Reserve: one Redis call re-checks every placement against the ledger (the second resource check,
   fenced by lease token and shard-map epoch);
5. Permit: one Redis call re-checks the batch's leases and the shard map and extends the leases;
   a pod whose lease was lost, or whose node this shard no longer owns, is not bound (the API
   server cannot check fencing tokens, so the shard checks its own right before);
6. Bind the reserved pods in one call to the cluster; then commit (bound) or roll back.

Steps 5-6 are the binding cycle. With ``ShardOptions.binding_cycles`` = 0 they run inside the step;
with N > 0 they run in the background, as kube-scheduler runs each pod's binding cycle in a
goroutine while its scheduling cycle goes on: the shard schedules its next batch while up to N
batches wait for the API server (their pods stay assumed in the table, so the next batch sees
them). Only the requests run in the background (`_binding_io`: the Permit call right before the
bind call, so the fencing check is as fresh as in the synchronous order); their results are
applied by the loop thread at the start of its next step (`_reap_bindings`), so every change to
the queue, the table and the counters stays on one thread. A stopped or retired shard waits for
its binding cycles before it reports idle.

Every failure after the assume goes through one rollback path (`_rollback`: release the
reservation, forget the assume, release the lease) and the pod goes back to the queue with backoff,
or to the rebalancer when another shard may do better or only the watch can tell what became of it
(a bind answered 409 or 404). A bind whose answer was lost (504, or no answer) may have been
applied: its reservation is kept, so its capacity stays counted until the watch's ``observe`` turns
it into usage or it expires. Redis or the API being away pauses binding: nothing is bound without
a reservation, and no pod is dropped.

The class is plain Python (tests drive `step` directly); `shardsched.sharding.actors` makes it a Ray
actor and runs `run_forever` in a thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait as wait_futures
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from shardsched.api.objects import NodeInfo, PodInfo
from shardsched.cache.node_table import NodeTable, PodUsage
from shardsched.config import SchedulerConfiguration
from shardsched.errors import TemporaryError, ThrottledLog
from shardsched.metrics import ERROR, SCHEDULED, UNSCHEDULABLE, ShardMetrics
from shardsched.queue import ASSIGNED_POD_DELETE, NAMESPACE_UPDATE, NODE_ADD, NODE_UPDATE, QueuedPodInfo, SchedulingQueue
from shardsched.scheduler.algorithm import GenericScheduler, ScheduleResult
from shardsched.scheduler.algorithm import build_schedulers
from shardsched.sharding.protocols import (BIND_CONFLICT, BIND_FAILED, FENCED, INSUFFICIENT, UNSCHEDULABLE_HERE,
                                           BindTarget, Handoff, Rebalancer)
from shardsched.store.ledger import Ledger, ReservationRef, ReserveCode, ReserveItem

log = logging.getLogger(__name__)

#: life of a shard's "binds in flight" mark in the ledger (`Ledger.mark_binding`), ms; renewed
#: while its binding cycles run (`Shard.step`), removed when the last ends
BINDING_MARK_TTL_MS = 5000


def yield_writes_to_binds(cluster: Any, ledger: Ledger) -> None:
    """Let the Event and condition writers of ``cluster`` (a `shardsched.cluster.ClusterBackend`
    or a `BindTarget`: its ``gate``, a `shardsched.cluster.WriteGate`) yield to the binds of
    every shard of this scheduler, as the shards mark them in ``ledger``, not only to those of
    their own process. Does nothing for a cluster without a gate (the simulated cluster) or whose
    gate already asks someone."""
    gate = cluster.gate
    if gate is not None and gate.peers is None:
        def peers() -> int:
            binding, bursting = ledger.binding_marks()
            return gate.BURST if bursting else gate.BINDING if binding else gate.IDLE
        gate.peers = peers

#: window of the recent scheduling latency in `Shard.snapshot` (what the autoscaler reads)
RECENT_LATENCY_WINDOW_S = 10.0

#: annotation with the pod's creation time as Unix seconds (float), set by the simulated
#: cluster's workload builders, for creation -> bound latency finer than creationTimestamp's seconds
CREATED_AT_ANNOTATION = "shardsched.io/created-at"


#: largest adaptive batch while no binding cycle runs in the background (`Shard._batch_size`)
START_BATCH = 128


@dataclass
class ShardOptions:
    """Tunables of one shard; the defaults are explained per field.

    Attributes:
        batch_size: pods per batch. Large batches amortize one Redis round trip and one bind call
            over many pods (the per-batch fixed cost is ~1-2 ms here); 0 = adaptive: the whole
            active queue up to `max_batch_size`.
        max_batch_size: cap of the adaptive batch.
        lease_ttl_ms: pod lease lifetime. A crashed shard's pods move on after it; long enough to
            cover one batch's reserve + bind even when the API is slow.
        reservation_ttl_ms: how long a reservation holds capacity without a commit.
        idle_sleep_s: loop sleep when there is nothing to do (bounded by the next backoff expiry).
        binding_cycles: batches whose binding cycle (Permit + bind) may run in the background while
            the next batch is scheduled (module docstring); 0 = bind inside the step. Against a
            real API server, where a batch's binds take most of a second, 2 keeps the API busy
            while the shard schedules; `step`-driven tests use 0.
    """

    batch_size: int = 0
    max_batch_size: int = 1000
    lease_ttl_ms: int = 10_000
    reservation_ttl_ms: int = 10_000
    idle_sleep_s: float = 0.005
    binding_cycles: int = 0
    seed: int | None = None


@dataclass
class ShardStats:
    """Counters of one shard (plain, picklable)."""

    scheduled: int = 0
    bound: int = 0
    conflicts: int = 0
    reserve_failures: int = 0
    bind_errors: int = 0
    handed_off: int = 0
    lease_busy: int = 0
    batches: int = 0
    paused_s: float = 0.0
    #: creation -> bound latencies in seconds, for pods carrying CREATED_AT_ANNOTATION
    latencies_s: list[float] = field(default_factory=list)
    #: (unix time, pods bound) per batch, for throughput plots
    timeline: list[tuple[float, int]] = field(default_factory=list)


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
        self.schedulers: dict[str, GenericScheduler] = build_schedulers(config, self.table, self.options.seed, partial_view=True)
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
        # node -> (uid of its ledger shadow usage, time.monotonic() when it expires); see _refresh_node
        self._shadow: dict[str, tuple[str, float]] = {}
        # uids this shard assumed in its table and the watch has not confirmed yet (kube's cache:
        # assumed pods); only these are forgotten on a rollback, see _forget
        self._assumed: set[str] = set()
        # (time.monotonic() when bound, creation -> bound latency in s) of the latest bound pods
        self._recent_latencies: deque[tuple[float, float]] = deque(maxlen=2000)
        self._idle = threading.Event()  # set while `run_forever` is not running (see `retire`)
        self._idle.set()
        self.last_error = ""
        # binding cycles in the background, oldest first: (future of _binding_io, batch, started)
        self._binding: deque[tuple[Future, list, float]] = deque()
        self._bind_pool: ThreadPoolExecutor | None = None
        self._bind_errors_log = ThrottledLog(10.0)
        # bind calls in flight and when this shard last marked them in the ledger (writers of
        # every process yield to them: `yield_writes_to_binds`); only for a cluster with a gate
        # (a gate also says which bind calls are bursts, for which the writers hold back longer)
        self._gate = cluster.gate
        self._mark_binds = self._gate is not None
        self._binds_lock = threading.Lock()
        self._binds_in_flight = 0
        self._bursts_in_flight = 0
        self._binds_marked = float("-inf")
        yield_writes_to_binds(cluster, ledger)

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
        could place them (retried on cluster events or after podMaxInUnschedulablePodsDuration)."""
        for qpi in qpis:
            if unschedulable:
                self.queue.add_unschedulable_if_not_present(qpi, backoff=False)
            else:
                self.queue.requeue_backoff(qpi)

    def remove_pods(self, keys: Iterable[str]) -> None:
        """Pods deleted, bound by someone else, or moved to another shard."""
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
                self._reap_bindings(block=True)  # the batches binding in the background end here
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
            if not done:
                wait = self.queue.next_ready_in_s()
                self._stop.wait(self.options.idle_sleep_s if wait is None else min(max(wait, 0.0), 0.05) or self.options.idle_sleep_s)

    def stop(self) -> None:
        self._stop.set()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until `run_forever` has returned (its binding cycles applied); False on timeout."""
        return self._idle.wait(timeout_s)

    def drain(self, fraction: float = 1.0) -> list[QueuedPodInfo]:
        """Remove and return ``fraction`` (in [0, 1]) of the queued pods, for the coordinator to route
        them again when the shard count changes: all of them (a removed shard), or the share that
        added shards take over, the last in queue order (`SchedulingQueue.drain`), so that this
        shard goes on with the pods it would pop next. Pods in flight stay here: they end bound,
        handed off, or back in this queue."""
        if fraction >= 1.0:
            return self.queue.drain()
        return self.queue.drain(max_n=round(len(self.queue) * max(fraction, 0.0)))

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
            size = min(size, max(START_BATCH, 2 * sum(len(b[1]) for b in self._binding)))
        return max(1, size)

    def step(self) -> int:
        """One batch (see module docstring). Returns the number of pods popped (0 = idle).

        Raises only on a bug; even then the batch's pods still in flight are forgotten in the table
        and put back with backoff first, so nothing is lost.
        """
        reaped = self._reap_bindings(block=False)
        self._renew_binding_mark()
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
            assigned = {q.key for q in batch if self.table.node_of(q.pod_info.uid) is not None}
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
        placed: list[tuple[QueuedPodInfo, ScheduleResult, int]] = []
        handoffs: list[Handoff] = []
        with self._lock:
            spent_before = {name: dict(s.duration_s) for name, s in self.schedulers.items()}
            for q in leased:
                pod = q.pod_info
                result = self.schedulers.get(pod.scheduler_name, self.default_scheduler).schedule(pod)
                if result.node is not None:
                    self._assumed.add(pod.uid)
                    placed.append((q, result, tokens[pod.uid]))
                else:
                    d = result.status.diagnosis
                    handoffs.append(Handoff(q, UNSCHEDULABLE_HERE, result.status.message,
                                            dict(d.reasons) if d else {}, d.num_all_nodes if d else self.table.num_nodes))
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

        # Reserve: the second resource check, fenced, one Redis call for the batch.
        items = [ReserveItem(q.pod_info.uid, r.node, tok, q.pod_info.requests) for q, r, tok in placed]
        try:
            t0 = time.perf_counter()
            results = self.ledger.reserve(self.member, self.epoch, items, self.options.reservation_ttl_ms)
            self.metrics.ledger_calls.labels("reserve").observe(time.perf_counter() - t0)
        except TemporaryError as e:
            with self._lock:
                for q, r, _ in placed:
                    self._forget(q.pod_info)
            self._handoff(handoffs)
            self._pause([q for q, _, _ in placed], f"Redis unavailable while reserving: {e}")
            return popped
        to_bind: list[tuple[QueuedPodInfo, ScheduleResult, int]] = []
        fenced = False
        for (q, r, tok), res in zip(placed, results):
            self.metrics.ledger_reserve.labels(res.code.name).inc()
            if res.ok:
                to_bind.append((q, r, tok))
                continue
            self.stats.reserve_failures += 1
            self._rollback(q, r.node, tok, release=False)
            if res.code == ReserveCode.INSUFFICIENT:
                self._refresh_node(r.node)
                q.last_failure_reason = f"node {r.node} had insufficient {res.resource} in the ledger (second check)"
                self.metrics.requeues.labels(INSUFFICIENT).inc()
                self.queue.requeue_backoff(q)
            elif res.code == ReserveCode.LEASE_LOST:
                # The lease expired before the Reserve (a stall longer than the lease TTL, or Redis
                # lost it). The next attempt takes it again, or waits while another shard holds it.
                q.last_failure_reason = "pod lease expired before the reservation"
                self.queue.requeue_backoff(q)
            elif res.code == ReserveCode.FENCED:
                handoffs.append(Handoff(q, FENCED, f"shard {self.member} no longer owns node {r.node}"))
                fenced = True
            else:
                q.last_failure_reason = f"node {r.node} unknown to the ledger"
                self.queue.requeue_backoff(q)
        if fenced:
            self._resync_epoch()

        # The binding cycle: Permit, then bind, one call each for the batch; in the background
        # when binding_cycles > 0 (module docstring).
        if to_bind and self.options.binding_cycles > 0:
            self._handoff(handoffs)
            self._start_binding(to_bind, started)
            return popped
        if to_bind:
            to_bind = self._permit(to_bind, handoffs)
        if to_bind:
            self._bind(to_bind, handoffs, started)
        self._handoff(handoffs)
        return popped

    # ------------------------------------------------------------------ the binding cycle in the background
    def _start_binding(self, to_bind, started: float) -> None:
        """Run the batch's Permit + bind requests in the background, after waiting for the oldest
        binding cycle when ``binding_cycles`` are already running. If `stop` is called meanwhile,
        the batch is not bound: its reservations and leases are released and its pods go back to
        the queue (a stop then waits only for the binds already sent, not for a whole batch more)."""
        while len(self._binding) >= self.options.binding_cycles:
            if self._stop.is_set():
                for q, r, tok in to_bind:
                    self._rollback(q, r.node, tok, release=True)
                    q.last_failure_reason = "the shard stopped before binding"
                    self.queue.requeue_backoff(q)
                return
            wait_futures([self._binding[0][0]], timeout=0.1)
            self._renew_binding_mark()
            self._reap_bindings(block=False, at_most=1)
        if self._bind_pool is None:
            self._bind_pool = ThreadPoolExecutor(self.options.binding_cycles, thread_name_prefix=f"binding-{self.index}")
        self._binding.append((self._bind_pool.submit(self._binding_io, to_bind), to_bind, started))

    def _binding_io(self, to_bind):
        """The requests of one binding cycle (a background thread; touches no shard state):
        the Permit call, then the bind call for the pods it permitted. Returns (permit codes or
        None, the Redis error or None, bind results or None, the bind call's error or "")."""
        try:
            codes = self._permit_io(to_bind)
        except TemporaryError as e:
            return None, e, None, ""
        permitted = [(q.pod_info.namespace, q.pod_info.name, r.node, q.pod_info.uid)
                     for q, r, _ in to_bind if codes[q.pod_info.uid] == ReserveCode.OK]
        results, err = self._bind_io(permitted) if permitted else ([], "")
        return codes, None, results, err

    def _reap_bindings(self, block: bool, at_most: int | None = None) -> int:
        """Apply the results of finished binding cycles, oldest first, on the loop thread (all of
        them with ``block``, waiting; else only those already done). Returns the pods applied."""
        n = done = 0
        while self._binding and (block or self._binding[0][0].done()) and (at_most is None or done < at_most):
            future, to_bind, started = self._binding.popleft()
            done += 1
            n += len(to_bind)
            try:
                codes, redis_error, results, err = future.result()
                handoffs: list[Handoff] = []
                permitted = self._permit_apply(to_bind, codes, redis_error, handoffs)
                if permitted:
                    self._bind_apply(permitted, results, err, handoffs, started)
                self._handoff(handoffs)
            except Exception as e:  # noqa: BLE001 - a bug: the pods not yet settled go back, none is lost
                self.last_error = f"{type(e).__name__}: {e}"
                log.exception("shard %s: a binding cycle failed", self.member)
                in_flight = self.queue.in_flight
                for q, _, _ in to_bind:
                    if q.key in in_flight:
                        with self._lock:
                            self._forget(q.pod_info)
                        q.last_failure_reason = f"internal error in the binding cycle: {type(e).__name__}"
                        self.queue.requeue_backoff(q)  # its reservation and lease expire (TTL)
        return n

    def _permit(self, to_bind, handoffs: list[Handoff]):
        """Right before binding, check the batch in the ledger (`Ledger.permit`, one Redis call):
        keep only the pods whose lease this shard still holds with its token, on nodes it still
        owns at the current epoch. The API server cannot check fencing tokens, so a shard that
        stalled since its Reserve (longer than the lease TTL), that the coordinator replaced or
        repartitioned meanwhile, or whose Redis restarted without its data must not bind. A pod
        that fails is rolled back: retried here (lease lost) or handed to the rebalancer (fenced).
        With Redis away nothing is bound (reservations and leases expire). The permitted leases
        are extended by a lease TTL, to cover the bind call."""
        try:
            codes = self._permit_io(to_bind)
        except TemporaryError as e:
            return self._permit_apply(to_bind, None, e, handoffs)
        return self._permit_apply(to_bind, codes, None, handoffs)

    def _permit_io(self, to_bind) -> dict:
        """The Permit call (`Ledger.permit`); raises `TemporaryError` when Redis is away."""
        refs = [ReservationRef(q.pod_info.uid, r.node, tok) for q, r, tok in to_bind]
        return self.ledger.permit(self.member, self.epoch, refs, self.options.lease_ttl_ms)

    def _permit_apply(self, to_bind, codes: dict | None, redis_error: Exception | None, handoffs: list[Handoff]):
        """The Permit's outcome: the pods permitted, in batch order; the others rolled back."""
        if redis_error is not None:
            e = redis_error
            with self._lock:
                for q, _, _ in to_bind:
                    self._forget(q.pod_info)
            self._pause([q for q, _, _ in to_bind], f"Redis unavailable before binding: {e}")
            return []
        out = []
        fenced = False
        for q, r, tok in to_bind:
            code = codes[q.pod_info.uid]
            self.metrics.ledger_permit.labels(code.name).inc()
            if code == ReserveCode.OK:
                out.append((q, r, tok))
                continue
            self.stats.reserve_failures += 1
            self._rollback(q, r.node, tok, release=True)
            if code == ReserveCode.FENCED:
                handoffs.append(Handoff(q, FENCED, f"shard {self.member} no longer owns node {r.node} (at Permit)"))
                fenced = True
            else:
                self.metrics.leases.labels("lost").inc()
                q.last_failure_reason = "pod lease lost before binding"
                self.queue.requeue_backoff(q)
        if fenced:
            self._resync_epoch()
        return out

    def _bind(self, to_bind, handoffs: list[Handoff], started: float) -> None:
        bindings = [(q.pod_info.namespace, q.pod_info.name, r.node, q.pod_info.uid) for q, r, _ in to_bind]
        results, err = self._bind_io(bindings)
        self._bind_apply(to_bind, results, err, handoffs, started)

    def _bind_io(self, bindings: list[tuple]) -> tuple[list | None, str]:
        """The bind call; (results, "") or (None, why) when the call itself failed (no answer)."""
        burst = self._mark_binds and self._gate.is_burst(len(bindings))
        self._binds_started(1, burst)
        try:
            return self.cluster.bind_many(bindings), ""
        except TemporaryError as e:
            return None, str(e)
        except Exception as e:  # noqa: BLE001 - a broken connection to the cluster must not lose pods
            return None, f"{type(e).__name__}: {e}"
        finally:
            self._binds_started(-1, burst)

    def _binds_started(self, delta: int, burst: bool = False) -> None:
        """Count a bind call starting (+1) or ending (-1), a burst or not, and keep this shard's
        mark in the ledger: set when a call starts, set again without the burst when the last
        burst call ends, removed when the last call ends. A Redis error only costs the ordering
        of the writes (logged at debug level)."""
        if not self._mark_binds:
            return
        with self._binds_lock:
            self._binds_in_flight += delta
            self._bursts_in_flight += delta if burst else 0
            ttl = BINDING_MARK_TTL_MS if self._binds_in_flight > 0 else 0
            if delta > 0 or ttl == 0 or (burst and self._bursts_in_flight == 0):
                self._mark_binding(ttl)

    def _renew_binding_mark(self) -> None:
        """Renew the mark while bind calls run (from the loop: a call can outlast the TTL)."""
        if self._mark_binds and self._binds_in_flight > 0 \
                and time.monotonic() - self._binds_marked > BINDING_MARK_TTL_MS / 2000:
            with self._binds_lock:
                if self._binds_in_flight > 0:
                    self._mark_binding(BINDING_MARK_TTL_MS)

    def _mark_binding(self, ttl_ms: int) -> None:
        try:
            self.ledger.mark_binding(self.member, ttl_ms, burst=self._bursts_in_flight > 0)
            self._binds_marked = time.monotonic() if ttl_ms else float("-inf")
        except Exception as e:  # noqa: BLE001 - see _binds_started
            log.debug("shard %s: binds-in-flight mark not written: %s", self.member, e)

    def _bind_apply(self, to_bind, results: list | None, err: str, handoffs: list[Handoff], started: float) -> None:
        """The bind's outcome per pod: commit, hand off (404/409) or roll back and retry."""
        now = time.time()
        now_mono = time.monotonic()
        commits, lease_done = [], []
        for i, (q, r, tok) in enumerate(to_bind):
            code = 504 if results is None else results[i].code
            pod = q.pod_info
            if code == 201:
                commits.append(ReservationRef(pod.uid, r.node, tok))
                lease_done.append((pod.uid, tok))
                self.queue.done(q.key)
                self.stats.bound += 1
                self.metrics.binds.labels("ok").inc()
                self.metrics.schedule_attempts.labels(SCHEDULED, pod.scheduler_name).inc()
                self.metrics.attempt_duration.labels(SCHEDULED, pod.scheduler_name).observe(time.perf_counter() - started)
                created = (pod.obj.get("metadata", {}).get("annotations") or {}).get(CREATED_AT_ANNOTATION)
                if created:
                    lat = now - float(created)
                    self.stats.latencies_s.append(lat)
                    self._recent_latencies.append((now_mono, lat))
                    self.metrics.sli_duration.labels(str(min(q.attempts, 15))).observe(lat)
            elif code in (404, 409):
                # Bound by someone else, or deleted, or (404) the node is gone, or a conflict that
                # did not bind it: only the watch knows, so the rebalancer (which follows it) drops
                # the pod if it is bound or deleted and routes it again otherwise.
                self._rollback(q, r.node, tok, release=True)
                self.stats.conflicts += code == 409
                self.metrics.binds.labels("conflict" if code == 409 else "not_found").inc()
                handoffs.append(Handoff(q, BIND_CONFLICT, f"binding rejected: {code} {results[i].message}"))
            else:
                # 5xx: not bound, retry here. 504 or no answer: maybe bound; keep the reservation.
                self._rollback(q, r.node, tok, release=code != 504)
                self.stats.bind_errors += 1
                self.metrics.binds.labels("error").inc()
                self.metrics.schedule_attempts.labels(ERROR, pod.scheduler_name).inc()
                msg = err if results is None else f"{results[i].code} {results[i].message}"
                q.last_failure_reason = f"binding failed: {msg}"
                self._log_bind_error(msg)
                self.metrics.requeues.labels(BIND_FAILED).inc()
                self.queue.requeue_backoff(q)
        if commits:
            with self._lock:  # bound: counted for good, whatever the watch says first
                self._assumed.difference_update(ref.uid for ref in commits)
            try:
                self.ledger.commit(commits)
                self.ledger.release_leases(dict(lease_done), self.member)
            except TemporaryError as e:
                # Bound in the cluster: the truth. The watch's observe converts the reservation.
                log.warning("shard %s: commit after bind failed (%s); the watch will reconcile", self.member, e)
        self.stats.scheduled += len(commits)
        self.stats.timeline.append((now, len(commits)))

    # ------------------------------------------------------------------ helpers
    def _log_bind_error(self, msg: str) -> None:
        """A WARNING for failed binds (5xx, no answer), at most one line per 10 s with the count."""
        self._bind_errors_log.record(log, logging.WARNING, f"shard {self.member}: {{count}} bind(s) failed since the last "
                                     "report (retried with backoff); last: {last}", msg)

    def _forget(self, pod: PodInfo) -> None:
        """Undo this shard's assume of the pod (kube's ForgetPod). A pod the watch has confirmed
        bound meanwhile (a bind that answered 504 but was applied, or a 409 because someone else
        bound it) is the truth and stays counted. Call with the lock held."""
        if pod.uid in self._assumed:
            self._assumed.discard(pod.uid)
            self.table.remove_pod(pod.uid)

    def _rollback(self, q: QueuedPodInfo, node: str, token: int, release: bool) -> None:
        """The one rollback path: release the reservation, forget the assume, release the lease.
        Safe when any of these never happened.

        Args:
            release: release the reservation; False when none was made, or when the bind's outcome
                is unknown (504): then the reservation keeps the capacity counted until the watch's
                ``observe`` turns it into usage, or it expires (reservation TTL).
        """
        with self._lock:
            self._forget(q.pod_info)
        try:
            if release:
                self.ledger.release([ReservationRef(q.pod_info.uid, node, token)])
            self.ledger.release_leases({q.pod_info.uid: token}, self.member)
        except TemporaryError as e:  # both expire on their own (TTL)
            log.warning("shard %s: rollback could not reach Redis (%s); TTLs will expire them", self.member, e)

    def _release_leases(self, pairs: list[tuple[str, int]]) -> None:
        try:
            self.ledger.release_leases(dict(pairs), self.member)
        except TemporaryError:
            pass  # they expire

    def _refresh_node(self, node: str) -> None:
        """After a failed second check: make the table see at least what the ledger counts on the
        node (used + reserved), as a shadow pod, until the watch brings the pods that explain it (a
        pod bound on the node drops the shadow) or for one reservation TTL: the reservations it
        stands for are committed or expire by then (a bind that timed out and was never applied
        leaves one behind), and a shadow kept longer would hide room the node has."""
        try:
            usage = self.ledger.node_usage(node)
        except TemporaryError:
            return
        with self._lock:
            slot = self.table.index.get(node)
            if slot is None:
                return
            self._drop_shadow(node)
            missing = {}
            for res in set(usage.used) | set(usage.reserved):
                counted = usage.used.get(res, 0) + usage.reserved.get(res, 0)
                have = int(self.table.requested[self.table.resource_row(res), slot])
                if counted > have:
                    missing[res] = counted - have
            if missing:
                uid = f"ledger-shadow/{node}"
                self.table.add_pod(PodUsage(uid, uid, missing, 0, 0), node)
                self._shadow[node] = (uid, time.monotonic() + self.options.reservation_ttl_ms / 1000)

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
        recent = [lat for t, lat in list(self._recent_latencies) if t >= since]
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
