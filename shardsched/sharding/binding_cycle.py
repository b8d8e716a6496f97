"""A shard's binding cycle: the framework's `BindingCycle` with the Redis ledger as the shard's own
Reserve, Permit and PostBind plugin, batches bound in the background, and what each outcome does
to the pod.

The shard's plugins come first at each point, then the profile's:

- Reserve (`LedgerPlugin.reserve`, one Lua call for the batch): the second resource check (the
  node's sums and each GPU device the cycle chose, `shardsched.cache.devices.ledger_requests`), fenced
  by the pod's lease token and the shard map's epoch (`Ledger.reserve`); Unreserve releases it.
- Permit (`LedgerPlugin.permit`, one Lua call): right before binding, the leases are still this
  shard's and its nodes still its own at the current epoch (`Ledger.permit`); the API server cannot
  check fencing tokens, so a shard that stalled past its lease TTL, was replaced or repartitioned,
  or whose Redis restarted without its data must not bind. The permitted leases are extended by a
  lease TTL, to cover the bind call.
- PreBind: the profile's (VolumeBinding writes the volumes it chose through `ShardVolumes`, which
  also has the ledger arbitrate those choices between shards at its Reserve).
- Bind: the profile's DefaultBinder, one ``bind_many`` call (`MarkedBinds` marks it in the ledger).
- PostBind (`LedgerPlugin.post_bind`): the reservations become usage (`Ledger.commit`), the leases
  are released.

The rollback (`BindingCycle.rollback`) releases the reservation, forgets the assume in the table
and releases the lease (`ShardBinding._forget`). A bind whose answer was lost (504, or no answer)
may have been applied: its reservation is kept, so its capacity stays counted until the watch's
``observe`` turns it into usage or it expires. Redis away pauses binding: nothing is bound without a
reservation, and no pod is dropped.

With ``ShardOptions.binding_cycles`` = N > 0 the Permit and Bind requests of up to N batches run in
the background, as kube-scheduler runs each pod's binding cycle in a goroutine while its scheduling
cycle goes on (their pods stay assumed in the table, so the next batch sees them); their outcomes
are applied by the loop thread (`ShardBinding.reap`), so every change to the queue, the table and
the counters stays on one thread.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor, wait as wait_futures
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from shardsched.api.objects import PodInfo
from shardsched.cache.devices import is_device_resource
from shardsched.cache.node_table import PodUsage
from shardsched.cluster import CONFLICT, NOT_FOUND
from shardsched.errors import TemporaryError, ThrottledLog
from shardsched.framework.binding_cycle import BIND, PERMIT, BindingCycle, Failure
from shardsched.framework.cycle_state import CycleState
from shardsched.metrics import ERROR, SCHEDULED
from shardsched.plugins.defaultbinder.plugin import RESULTS_KEY as BIND_RESULTS_KEY
from shardsched.queue import QueuedPodInfo
from shardsched.sharding.protocols import BIND_CONFLICT, BIND_FAILED, FENCED, INSUFFICIENT, Handoff
from shardsched.sharding.shard_plugins import CODES_KEY, LEASES_KEY, LEDGER, LedgerPlugin
from shardsched.store.ledger import ReserveCode

if TYPE_CHECKING:
    from shardsched.sharding.shard import Shard

log = logging.getLogger(__name__)

#: annotation with the pod's creation time as Unix seconds (float), set by the simulated
#: cluster's workload builders, for creation -> bound latency finer than creationTimestamp's seconds
CREATED_AT_ANNOTATION = "shardsched.io/created-at"

@dataclass(slots=True)
class Batch:
    """The pods of one binding cycle: ``qpis[i]`` placed on ``nodes[i]``, under ``cycle``."""

    cycle: BindingCycle
    state: CycleState
    qpis: list[QueuedPodInfo]
    pods: list[PodInfo]
    nodes: list[str]
    started: float


class ShardBinding:
    """The binding cycles of one shard (module docstring): one `BindingCycle` per profile, sharing
    the `LedgerPlugin`; the batches binding in the background, oldest first."""

    def __init__(self, shard: "Shard") -> None:
        self.shard = shard
        ledger = LedgerPlugin(shard)
        self.cycles = {name: BindingCycle([ledger, *fw.reserve_plugins], [ledger, *fw.permit_plugins],
                                          fw.pre_bind_plugins, fw.bind_plugins, [ledger, *fw.post_bind_plugins],
                                          fw.handle, self._forget)
                       for name, fw in ((name, sched.framework) for name, sched in shard.schedulers.items())}
        self.default = next(iter(self.cycles.values()))
        # background binding cycles, oldest first: (future of `_requests`, batch)
        self.running: deque[tuple[Future, Batch]] = deque()
        self._pool: ThreadPoolExecutor | None = None
        self._bind_errors_log = ThrottledLog(10.0)  # failed binds: a WARNING per 10 s at most, with the count

    def in_flight(self) -> int:
        """Pods of the binding cycles still running in the background."""
        return sum(len(b.pods) for _, b in self.running)

    def run(self, placed: list[tuple[QueuedPodInfo, str]], tokens: dict[str, int], handoffs: list[Handoff],
            started: float) -> None:
        """Reserve the placed pods (assumed, leased with ``tokens``), then Permit and bind them,
        here or in the background; hands ``handoffs`` and the batch's own to the rebalancer."""
        batches = []
        for cycle, part in self._by_profile(placed):
            state = CycleState()
            state.write(LEASES_KEY, tokens)
            batch = Batch(cycle, state, [q for q, _ in part], [q.pod_info for q, _ in part], [n for _, n in part], started)
            try:
                failures = cycle.reserve(state, batch.pods, batch.nodes)
            except TemporaryError as e:
                cycle.rollback(state, batch.pods, batch.nodes)
                self.shard._pause(batch.qpis, f"Redis unavailable while reserving: {e}")
                continue
            self._reserve_failed(batch, failures, handoffs)
            if failures:
                batch = self._without(batch, failures)
            if batch.pods:
                batches.append(batch)
        if batches and self.shard.options.binding_cycles > 0:
            self.shard._handoff(handoffs)
            for batch in batches:
                self._start(batch)
            return
        for batch in batches:
            failures, error = self._requests(batch)
            self._apply(batch, failures, error, handoffs)
        self.shard._handoff(handoffs)

    def reap(self, block: bool, at_most: int | None = None) -> int:
        """Apply the outcomes of finished background binding cycles, oldest first, on the loop
        thread (all of them with ``block``, waiting; else only those already done). Returns the
        pods applied."""
        s = self.shard
        n = done = 0
        while self.running and (block or self.running[0][0].done()) and (at_most is None or done < at_most):
            future, batch = self.running.popleft()
            done += 1
            n += len(batch.pods)
            try:
                handoffs: list[Handoff] = []
                self._apply(batch, *future.result(), handoffs)
                s._handoff(handoffs)
            except Exception as e:  # noqa: BLE001 - a bug: the pods not yet settled go back, none is lost
                s.last_error = f"{type(e).__name__}: {e}"
                log.exception("shard %s: a binding cycle failed", s.member)
                in_flight = s.queue.in_flight
                for q in batch.qpis:
                    if q.key in in_flight:
                        with s._lock:
                            s._forget(q.pod_info)
                        q.last_failure_reason = f"internal error in the binding cycle: {type(e).__name__}"
                        s.queue.requeue_backoff(q)  # its reservation and lease expire (TTL)
        return n

    # ------------------------------------------------------------------ steps
    def _by_profile(self, placed):
        if len(self.cycles) == 1:
            return [(self.default, placed)]
        parts: dict[int, tuple[BindingCycle, list]] = {}
        for item in placed:
            cycle = self.cycles.get(item[0].pod_info.scheduler_name, self.default)
            parts.setdefault(id(cycle), (cycle, []))[1].append(item)
        return list(parts.values())

    @staticmethod
    def _without(batch: Batch, failures: dict[int, Failure]) -> Batch:
        keep = [i for i in range(len(batch.pods)) if i not in failures]
        return Batch(batch.cycle, batch.state, [batch.qpis[i] for i in keep], [batch.pods[i] for i in keep],
                     [batch.nodes[i] for i in keep], batch.started)

    def _start(self, batch: Batch) -> None:
        """Run the batch's Permit and Bind requests in the background, after waiting for the oldest
        binding cycle when ``binding_cycles`` are already running. If the shard stops meanwhile,
        the batch is not bound: it is rolled back and its pods go back to the queue (a stop then
        waits only for the binds already sent, not for a whole batch more)."""
        s = self.shard
        while len(self.running) >= s.options.binding_cycles:
            if s._stop.is_set():
                batch.cycle.rollback(batch.state, batch.pods, batch.nodes)
                for q in batch.qpis:
                    q.last_failure_reason = "the shard stopped before binding"
                    s.queue.requeue_backoff(q)
                return
            wait_futures([self.running[0][0]], timeout=0.1)
            s.binds.renew()
            self.reap(block=False, at_most=1)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(s.options.binding_cycles, thread_name_prefix=f"binding-{s.index}")
        future = self._pool.submit(self._requests, batch)
        future.add_done_callback(lambda _: s.queue.wake())  # the loop applies it at once (`reap`)
        self.running.append((future, batch))

    @staticmethod
    def _requests(batch: Batch) -> tuple[dict[int, Failure] | None, TemporaryError | None]:
        """Permit, PreBind and Bind (`BindingCycle.permit_and_bind`; touches no shard state):
        (failures, None), or (None, the error) when Redis was away at Permit."""
        try:
            return batch.cycle.permit_and_bind(batch.state, batch.pods, batch.nodes), None
        except TemporaryError as e:
            return None, e

    def _forget(self, state: CycleState, pods: Sequence[PodInfo]) -> None:
        """The rollback's end: forget the assume (`Shard._forget`), release the leases."""
        s = self.shard
        with s._lock:
            for p in pods:
                s._forget(p)
        tokens = state.read(LEASES_KEY)
        try:
            s.ledger.release_leases({p.uid: tokens[p.uid] for p in pods}, s.member)
        except TemporaryError as e:  # they expire on their own (TTL)
            log.warning("shard %s: rollback could not reach Redis (%s); TTLs will expire them", s.member, e)

    # ------------------------------------------------------------------ outcomes
    def _refresh_node(self, node: str) -> None:
        """After a failed second check: make the table see at least what the ledger counts on the
        node (used + reserved), as a shadow pod, until the watch brings the pods that explain it (a
        pod bound on the node drops the shadow) or for one reservation TTL: the reservations it
        stands for are committed or expire by then (a bind that timed out and was never applied
        leaves one behind), and a shadow kept longer would hide room the node has."""
        s = self.shard
        try:
            usage = s.ledger.node_usage(node)
        except TemporaryError:
            return
        with s._lock:
            slot = s.table.index.get(node)
            if slot is None:
                return
            s._drop_shadow(node)
            missing = {}
            for res in set(usage.used) | set(usage.reserved):
                if is_device_resource(res):  # the shadow stands for sums; devices come with the watch's pods
                    continue
                counted = usage.used.get(res, 0) + usage.reserved.get(res, 0)
                have = int(s.table.requested[s.table.resource_row(res), slot])
                if counted > have:
                    missing[res] = counted - have
            if missing:
                uid = f"ledger-shadow/{node}"
                s.table.add_pod(PodUsage(uid, uid, missing, 0, 0), node)
                s._shadow[node] = (uid, time.monotonic() + s.options.reservation_ttl_ms / 1000)

    def _reserve_failed(self, batch: Batch, failures: dict[int, Failure], handoffs: list[Handoff]) -> None:
        """Pods the Reserve refused (rolled back already): back with backoff, the node's ledger
        usage into the table after INSUFFICIENT, or to the rebalancer when FENCED."""
        codes = batch.state.get(CODES_KEY, {})
        fenced = False
        for i, f in failures.items():
            fenced |= self._refused(batch.qpis[i], f, codes, handoffs, batch.nodes[i])
        if fenced:
            self.shard._resync_epoch()

    def _refused(self, q: QueuedPodInfo, f: Failure, codes: dict[str, ReserveCode], handoffs: list[Handoff],
                 node: str) -> bool:
        """One pod refused at Reserve or Permit (rolled back already), by the ledger (its code in
        ``codes``) or by a profile's plugin: to the rebalancer when FENCED (returns True: the
        caller re-reads the epoch once), else back with backoff, after refreshing ``node``'s
        ledger usage into the table when Reserve found it INSUFFICIENT, or counting the lease lost
        at Permit."""
        s = self.shard
        s.stats.reserve_failures += 1
        code = codes.get(q.pod_info.uid) if f.status.plugin == LEDGER else None
        if code == ReserveCode.FENCED:
            handoffs.append(Handoff(q, FENCED, f.status.message))
            return True
        if code == ReserveCode.INSUFFICIENT:
            self._refresh_node(node)
            s.metrics.requeues.labels(INSUFFICIENT).inc()
        elif code == ReserveCode.LEASE_LOST and f.point == PERMIT:
            s.metrics.leases.labels("lost").inc()
        q.last_failure_reason = f.status.message
        s.queue.requeue_backoff(q)
        return False

    def _apply(self, batch: Batch, failures: dict[int, Failure] | None, redis_error: TemporaryError | None,
               handoffs: list[Handoff]) -> None:
        """The outcome of Permit and Bind, per pod: bound (PostBind: commit), handed off (fenced at
        Permit, 404 and 409 at Bind) or rolled back and retried."""
        s = self.shard
        if redis_error is not None:
            batch.cycle.rollback(batch.state, batch.pods, batch.nodes)
            s._pause(batch.qpis, f"Redis unavailable before binding: {redis_error}")
            return
        if len(failures) < len(batch.pods):
            with s._lock:  # bound: counted for good, whatever the watch says first
                s._assumed.difference_update(p.uid for i, p in enumerate(batch.pods) if i not in failures)
        batch.cycle.finish(batch.state, batch.pods, batch.nodes, failures)
        now, now_mono = time.time(), time.monotonic()
        codes = batch.state.get(CODES_KEY, {})
        bind_codes = batch.state.get(BIND_RESULTS_KEY, {})
        fenced = False
        bound_by_profile: Counter[str] = Counter()
        for i, q in enumerate(batch.qpis):
            f = failures.get(i)
            if f is None:
                self._bound(q, now, now_mono)
                bound_by_profile[q.pod_info.scheduler_name] += 1
            elif f.point == PERMIT:
                fenced |= self._refused(q, f, codes, handoffs, batch.nodes[i])
            else:
                self._bind_failed(q, f, bind_codes.get(q.pod_info.uid, (0, ""))[0] if f.point == BIND else 0, handoffs)
        if fenced:
            s._resync_epoch()
        bound = len(batch.pods) - len(failures)
        s.stats.scheduled += bound
        s.stats.bound += bound
        if bound:  # the per-pod counters, once per batch (every pod of it took the same attempt)
            s.metrics.binds.labels("ok").inc(bound)
            attempt_s = time.perf_counter() - batch.started
            for profile, n in bound_by_profile.items():
                s.metrics.schedule_attempts.labels(SCHEDULED, profile).inc(n)
                duration = s.metrics.attempt_duration.labels(SCHEDULED, profile)
                for _ in range(n):
                    duration.observe(attempt_s)

    def _bound(self, q: QueuedPodInfo, now: float, now_mono: float) -> None:
        s = self.shard
        pod = q.pod_info
        s.queue.done(q.key)
        created = (pod.obj.get("metadata", {}).get("annotations") or {}).get(CREATED_AT_ANNOTATION)
        if created:
            lat = now - float(created)
            s.recent_latencies.append((now_mono, lat))
            s.metrics.sli_duration.labels(str(min(q.attempts, 15))).observe(lat)

    def _bind_failed(self, q: QueuedPodInfo, f: Failure, code: int, handoffs: list[Handoff]) -> None:
        """A pod not bound (rolled back already): 404 or 409 to the rebalancer, else retried here."""
        s = self.shard
        if code in (NOT_FOUND, CONFLICT):
            # Bound by someone else, or deleted, or (404) the node is gone, or a conflict that
            # did not bind it: only the watch knows, so the rebalancer (which follows it) drops
            # the pod if it is bound or deleted and routes it again otherwise.
            s.stats.conflicts += code == CONFLICT
            s.metrics.binds.labels("conflict" if code == CONFLICT else "not_found").inc()
            handoffs.append(Handoff(q, BIND_CONFLICT, f"binding rejected: {f.status.message}"))
            return
        # 5xx: not bound, retry here. 504 or no answer: maybe bound; the reservation was kept.
        s.stats.bind_errors += 1
        s.metrics.binds.labels("error").inc()
        s.metrics.schedule_attempts.labels(ERROR, q.pod_info.scheduler_name).inc()
        q.last_failure_reason = f"binding failed: {f.status.message}" if f.point == BIND else f.status.message
        self._bind_errors_log.record(log, logging.WARNING, f"shard {s.member}: {{count}} bind(s) failed since the "
                                     "last report (retried with backoff); last: {last}", f.status.message)
        s.metrics.requeues.labels(BIND_FAILED).inc()
        s.queue.requeue_backoff(q)
