"""SchedulingQueue: kube-scheduler's PriorityQueue for one shard, popped in batches.

Three sub-queues, as upstream (``pkg/scheduler/internal/queue/scheduling_queue.go``):

- **activeQ**: pods to try now, a heap in the profile's QueueSort order (kube's PrioritySort: higher
  priority first, then earlier ``timestamp``; equal pairs keep insertion order through a sequence
  number).
- **backoffQ**: pods waiting out their backoff, a heap by backoff expiry. Backoff is
  ``pod_initial_backoff_s`` doubled per attempt up to ``pod_max_backoff_s`` (upstream
  ``calculateBackoffDuration``), counted from ``timestamp``; expired pods move to activeQ.
- **unschedulable pods**: pods whose last attempt was rejected as unschedulable. A cluster event that
  may help (``move_all_to_active_or_backoff_queue``) or ``pod_max_in_unschedulable_s`` in here moves
  them to activeQ, or to backoffQ while their backoff is not over (upstream
  ``movePodsToActiveOrBackoffQueue``).

Popped pods are *in flight* until the caller reports the outcome: ``done`` (scheduled, or handed on),
or ``add_unschedulable_if_not_present`` / ``requeue_backoff`` (failed). Each popped pod gets its own
scheduling cycle number, as upstream's ``Pop``; a move request while it was in flight sends a failed
pod to backoffQ instead of unschedulable pods (upstream ``moveRequestCycle``), so the event is not
missed.

A loop that pops waits with ``wait_for_pods`` instead of polling: it returns as soon as a pod enters
activeQ, the earliest backoff ends or an unschedulable pod's time is up, or another thread calls
``wake``; always within the caller's bound.

Both heaps use lazy deletion: a key maps to its live heap entry, and a popped entry that is not the
live one is skipped; the heap is rebuilt when stale entries outnumber live ones. ``pop_batch(k)`` is
O(k log n). All times are seconds from the injected clock (monotonic, not wall time).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from shardsched.api.objects import POD_GROUP_LABEL, PodInfo
from shardsched.queue.clock import Clock, RealClock

_monotonic = time.monotonic

log = logging.getLogger(__name__)

# Sub-queue names: the ``queue`` label of kube's scheduler_pending_pods and
# scheduler_queue_incoming_pods_total.
ACTIVE_Q = "active"
BACKOFF_Q = "backoff"
UNSCHEDULABLE_Q = "unschedulable"
GATED = "gated"

# ``event`` label of scheduler_queue_incoming_pods_total (upstream names).
POD_ADD = "PodAdd"
POD_UPDATE = "PodUpdate"
SCHEDULE_ATTEMPT_FAILURE = "ScheduleAttemptFailure"
BACKOFF_COMPLETE = "BackoffComplete"
UNSCHEDULABLE_TIMEOUT = "UnschedulableTimeout"

# Cluster events that may make unschedulable pods schedulable (for move_all_to_active_or_backoff_queue).
NODE_ADD = "NodeAdd"
NODE_UPDATE = "NodeUpdate"
ASSIGNED_POD_DELETE = "AssignedPodDelete"
#: a Namespace's labels changed (a namespaceSelector may select other pods now)
NAMESPACE_UPDATE = "NamespaceUpdate"
#: a Service, ReplicationController, ReplicaSet or StatefulSet changed (a pod's default spread
#: constraints may count other pods now)
SPREAD_SELECTOR_UPDATE = "SpreadSelectorUpdate"
#: a PersistentVolume, claim, StorageClass, CSINode or CSIStorageCapacity changed (upstream's
#: PvAdd, PvcUpdate, StorageClassAdd, CSINodeUpdate, ... in one; a volume may fit now)
STORAGE_UPDATE = "StorageUpdate"

DEFAULT_POD_INITIAL_BACKOFF_S = 1.0
DEFAULT_POD_MAX_BACKOFF_S = 10.0
DEFAULT_POD_MAX_IN_UNSCHEDULABLE_S = 300.0
DEFAULT_MAX_ATTEMPTS = 5

# Rebuild a heap when it holds more than twice its live entries plus this slack.
_COMPACT_SLACK = 256


@dataclass(slots=True, eq=False)
class QueuedPodInfo:
    """A pod in the scheduling queue, with its queueing state (upstream ``framework.QueuedPodInfo``).

    Attributes:
        pod_info: the pod; replaced in place when the pod is updated.
        timestamp: clock seconds when the pod was last added to the queue: on ``add``, and again after
            each failed attempt. activeQ orders by it; backoff counts from it.
        initial_attempt_timestamp: clock seconds when the pod was first added; never changes. Used for
            the pod scheduling SLI (``clock.now() - initial_attempt_timestamp`` at bind).
        attempts: scheduling attempts so far (incremented by ``pop_batch``).
        unschedulable_plugins: plugins that rejected the last attempt (set by the caller).
        last_failure_reason: message of the last failure (set by the caller), for the pod condition.
        scheduling_cycle: the queue's cycle number at the pod's last pop (upstream passes it to
            ``AddUnschedulableIfNotPresent``).
        gave_up: the pod used up ``max_attempts`` and was reported through ``on_give_up``.
    """

    pod_info: PodInfo
    timestamp: float
    initial_attempt_timestamp: float
    attempts: int = 0
    unschedulable_plugins: set[str] = field(default_factory=set)
    last_failure_reason: str = ""
    scheduling_cycle: int = 0
    gave_up: bool = False

    @property
    def key(self) -> str:
        """``namespace/name`` of the pod."""
        return self.pod_info.key


def _may_help(old: PodInfo, new: PodInfo) -> bool:
    """True if an update may change where the pod fits (upstream ``isPodUpdated``, narrowed to the
    scheduling signature and the priority: status and annotation changes do not count; labels do,
    since InterPodAffinity and PodTopologySpread read the pod's own labels, the PodGroup label too,
    which the signature leaves out)."""
    return (old.signature != new.signature or old.priority != new.priority
            or old.labels.get(POD_GROUP_LABEL) != new.labels.get(POD_GROUP_LABEL))


def _compact(heap: list, live: dict) -> None:
    """Drop stale entries once they outnumber the live ones (keeps memory and pops bounded)."""
    if len(heap) > 2 * len(live) + _COMPACT_SLACK:
        heap[:] = live.values()
        heapq.heapify(heap)


class SchedulingQueue:
    """kube-scheduler's PriorityQueue for one shard (see the module docstring). Thread-safe: one lock.

    Args:
        clock: time source, seconds; ``RealClock()`` if omitted, ``FakeClock`` in tests.
        sort_key: the profile's QueueSort ``sort_key(pod, timestamp, seq)`` (smaller pops first;
            upstream passes the plugin's ``Less`` to ``NewSchedulingQueue``): the framework's
            ``queue_sort.sort_key``.
        pod_initial_backoff_s: backoff after the first failed attempt, seconds (kube default 1 s).
        pod_max_backoff_s: backoff ceiling, seconds (kube default 10 s).
        pod_max_in_unschedulable_s: a pod longer than this in unschedulable pods is moved back
            (kube's podMaxInUnschedulablePodsDuration, default 300 s).
        max_attempts: after the pod fails this many attempts it is reported once through
            ``on_give_up`` and parked in unschedulable pods; ``None`` disables this. Not in upstream:
            it drives the ``PodScheduled=False`` condition, Event and alert of the runtime.
        on_give_up: called with the ``QueuedPodInfo``, outside the lock; errors are logged, not raised.

    Raises:
        ValueError: a non-positive duration, max backoff below the initial one, or max_attempts < 1.
    """

    def __init__(
        self,
        clock: Clock | None = None,
        *,
        sort_key: Callable[[PodInfo, float, int], tuple],
        pod_initial_backoff_s: float = DEFAULT_POD_INITIAL_BACKOFF_S,
        pod_max_backoff_s: float = DEFAULT_POD_MAX_BACKOFF_S,
        pod_max_in_unschedulable_s: float = DEFAULT_POD_MAX_IN_UNSCHEDULABLE_S,
        max_attempts: int | None = DEFAULT_MAX_ATTEMPTS,
        on_give_up: Callable[[QueuedPodInfo], None] | None = None,
    ) -> None:
        if pod_initial_backoff_s <= 0:
            raise ValueError(f"pod_initial_backoff_s must be > 0, got {pod_initial_backoff_s}")
        if pod_max_backoff_s < pod_initial_backoff_s:
            raise ValueError(f"pod_max_backoff_s ({pod_max_backoff_s}) must be >= pod_initial_backoff_s "
                             f"({pod_initial_backoff_s})")
        if pod_max_in_unschedulable_s <= 0:
            raise ValueError(f"pod_max_in_unschedulable_s must be > 0, got {pod_max_in_unschedulable_s}")
        if max_attempts is not None and max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1 or None, got {max_attempts}")
        self.clock: Clock = clock if clock is not None else RealClock()
        self.sort_key = sort_key
        self.pod_initial_backoff_s = float(pod_initial_backoff_s)
        self.pod_max_backoff_s = float(pod_max_backoff_s)
        self.pod_max_in_unschedulable_s = float(pod_max_in_unschedulable_s)
        self.max_attempts = max_attempts
        self.on_give_up = on_give_up

        self._lock = threading.Lock()
        # notified when a pod enters activeQ or backoffQ, and by `wake`: what `wait_for_pods` waits on
        self._changed = threading.Condition(self._lock)
        self._woken = False
        self._seq = itertools.count()
        # activeQ entries: (*sort_key(pod, timestamp, seq), seq, key, qpi), flat for fast comparisons;
        # backoffQ: (expiry_s, seq, key, qpi). seq is unique, so comparisons never reach key or qpi.
        self._active_heap: list[tuple] = []
        self._active: dict[str, tuple] = {}
        self._backoff_heap: list[tuple] = []
        self._backoff: dict[str, tuple] = {}
        # Insertion order is timestamp order: pods enter with timestamp = now and the clock is monotonic.
        self._unschedulable: dict[str, QueuedPodInfo] = {}
        self._in_flight: dict[str, QueuedPodInfo] = {}
        self._updated_in_flight: set[str] = set()  # keys updated in a way that may help, while in flight
        self._deleted_in_flight: dict[str, str] = {}  # key -> uid of a pod deleted while in flight
        self._scheduling_cycle = 0
        self._move_request_cycle = -1
        self._incoming: dict[tuple[str, str], int] = {}

    # ----------------------------------------------------------------------------- backoff rule

    def backoff_duration_s(self, attempts: int) -> float:
        """Backoff after ``attempts`` attempts, seconds: 0 for 0 attempts, else the initial backoff
        doubled per further attempt, capped at the max (upstream ``calculateBackoffDuration``).
        With the defaults: 1, 2, 4, 8, 10, 10, ... s."""
        if attempts <= 0:
            return 0.0
        duration = self.pod_initial_backoff_s
        for _ in range(1, attempts):
            duration += duration
            if duration >= self.pod_max_backoff_s:
                return self.pod_max_backoff_s
        return duration

    def backoff_expiry(self, qpi: QueuedPodInfo) -> float:
        """Clock seconds when the pod's backoff ends: ``timestamp + backoff_duration_s(attempts)``
        (upstream ``getBackoffTime``); the pod is backing off while this is after now."""
        return qpi.timestamp + self.backoff_duration_s(qpi.attempts)

    # ----------------------------------------------------------------------------- adding pods

    def add(self, pod_info: PodInfo) -> None:
        """Add a new pending pod to activeQ (upstream ``Add``). A known key is updated as in
        ``update``; a known key with another UID (the pod was recreated) replaces the old pod."""
        self._upsert(pod_info, POD_ADD)

    def update(self, pod_info: PodInfo) -> None:
        """Update a pod wherever it is (upstream ``Update``).

        - activeQ / backoffQ: replaced in place (re-ordered in activeQ if its QueueSort key changed).
        - unschedulable pods: if the update may help (scheduling signature or priority changed), the
          pod moves to activeQ, or backoffQ while backing off; otherwise it stays.
        - in flight: the ``QueuedPodInfo`` is updated in place; if the update may help and the attempt
          fails, the pod goes to backoffQ rather than unschedulable pods.
        - unknown: added to activeQ, as upstream.
        """
        self._upsert(pod_info, POD_UPDATE)

    def _upsert(self, pod_info: PodInfo, event: str) -> None:
        key = pod_info.key
        with self._lock:
            flying = self._in_flight.get(key)
            if flying is not None:
                if flying.pod_info.uid == pod_info.uid:
                    if _may_help(flying.pod_info, pod_info):
                        self._updated_in_flight.add(key)
                    flying.pod_info = pod_info
                    return
                self._forget_in_flight(key, deleted=True)
            now = self.clock.now()
            qpi = self._unschedulable.get(key)
            if qpi is not None:
                if qpi.pod_info.uid == pod_info.uid:
                    old, qpi.pod_info = qpi.pod_info, pod_info
                    if _may_help(old, pod_info):
                        del self._unschedulable[key]
                        self._move_to_active_or_backoff(qpi, now, event)
                    return
                del self._unschedulable[key]
            entry = self._active.get(key)
            if entry is not None:
                qpi = entry[-1]
                if qpi.pod_info.uid == pod_info.uid:
                    qpi.pod_info = pod_info
                    if self.sort_key(pod_info, qpi.timestamp, entry[-3]) != entry[:-3]:
                        self._push_active(qpi, key)  # re-ordered; the old entry goes stale
                        _compact(self._active_heap, self._active)
                    return
                del self._active[key]
            entry = self._backoff.get(key)
            if entry is not None:
                qpi = entry[3]
                if qpi.pod_info.uid == pod_info.uid:
                    qpi.pod_info = pod_info
                    return
                del self._backoff[key]
            self._push_active(QueuedPodInfo(pod_info, now, now), key)
            self._count(ACTIVE_Q, event)

    # ----------------------------------------------------------------------------- popping

    def pop_batch(self, max_n: int) -> list[QueuedPodInfo]:
        """Pop up to ``max_n`` pods from activeQ in QueueSort order; never blocks.

        First moves pods whose backoff is over to activeQ and flushes unschedulable leftovers (upstream
        runs these every 1 s and 30 s; here every pop, each O(pods moved)). Each popped pod gets
        ``attempts += 1`` and the next scheduling cycle number, and is in flight until ``done`` or a
        failure report. O(max_n log n).

        Returns:
            at most ``max_n`` pods, highest priority first; empty if activeQ is empty.
        """
        out: list[QueuedPodInfo] = []
        if max_n <= 0:
            return out
        with self._lock:
            now = self.clock.now()
            self._flush_backoff_locked(now)
            self._flush_unschedulable_locked(now)
            heap, active, in_flight = self._active_heap, self._active, self._in_flight
            cycle = self._scheduling_cycle
            pop = heapq.heappop
            while heap and len(out) < max_n:
                entry = pop(heap)
                key = entry[-2]
                if active.get(key) is not entry:
                    continue  # stale: deleted or re-pushed
                del active[key]
                qpi = entry[-1]
                cycle += 1
                qpi.attempts += 1
                qpi.scheduling_cycle = cycle
                in_flight[key] = qpi
                out.append(qpi)
            self._scheduling_cycle = cycle
        return out

    # ----------------------------------------------------------------------------- outcomes

    def add_unschedulable_if_not_present(self, qpi: QueuedPodInfo, backoff: bool = False) -> bool:
        """Requeue a pod after a failed attempt (upstream ``AddUnschedulableIfNotPresent``); ends its
        flight as ``done`` does. Set ``qpi.unschedulable_plugins`` / ``last_failure_reason`` first.

        ``timestamp`` is refreshed to now. The pod goes to:

        - backoffQ if ``backoff`` (the failure was an error or a conflict, not "unschedulable"), unless
          it has used up ``max_attempts``;
        - backoffQ if a move request came while it was in flight here (moveRequestCycle >= its cycle);
        - unschedulable pods otherwise.

        When the pod has just failed its ``max_attempts``-th attempt, ``on_give_up`` is called once
        (outside the lock); the pod is kept.

        Returns:
            True if queued; False (no-op) if the key is already queued, or the pod was deleted while in
            flight.
        """
        return self._requeue_failed(qpi, backoff)

    def requeue_backoff(self, qpi: QueuedPodInfo) -> bool:
        """Put a pod in backoffQ after a failed attempt that was not "unschedulable" (the rebalancer,
        after a failed reservation); same as ``add_unschedulable_if_not_present(qpi, backoff=True)``.
        Accepts pods popped by another shard's queue (their attempts carry over)."""
        return self._requeue_failed(qpi, True)

    def _requeue_failed(self, qpi: QueuedPodInfo, backoff: bool) -> bool:
        key = qpi.pod_info.key
        give_up = False
        with self._lock:
            was_in_flight = self._in_flight.get(key) is qpi
            updated = key in self._updated_in_flight
            if was_in_flight:
                self._forget_in_flight(key, deleted=False)
            if self._deleted_in_flight.get(key) == qpi.pod_info.uid:
                del self._deleted_in_flight[key]
                return False
            if key in self._active or key in self._backoff or key in self._unschedulable:
                return False
            now = self.clock.now()
            qpi.timestamp = now
            exhausted = self.max_attempts is not None and qpi.attempts >= self.max_attempts
            if exhausted and not qpi.gave_up:
                qpi.gave_up = give_up = True
            moved_while_in_flight = was_in_flight and (updated or self._move_request_cycle >= qpi.scheduling_cycle)
            if (backoff and not exhausted) or moved_while_in_flight:
                self._push_backoff(qpi, key, self.backoff_expiry(qpi))
                self._count(BACKOFF_Q, SCHEDULE_ATTEMPT_FAILURE)
            else:
                self._unschedulable[key] = qpi
                self._count(UNSCHEDULABLE_Q, SCHEDULE_ATTEMPT_FAILURE)
        if give_up and self.on_give_up is not None:
            try:
                self.on_give_up(qpi)
            except Exception:
                log.exception("on_give_up hook failed for pod %s", key)
        return True

    def done(self, key: str) -> None:
        """The pod ``key`` is no longer in flight (scheduled, or handed elsewhere). Idempotent; not
        needed after a failure report, which ends the flight itself (upstream ``Done``)."""
        with self._lock:
            self._forget_in_flight(key, deleted=False)
            self._deleted_in_flight.pop(key, None)

    def delete(self, key: str) -> bool:
        """Remove the pod ``key`` from every sub-queue (upstream ``Delete``). A pod in flight is
        forgotten and its later failure report is ignored.

        Returns:
            True if the pod was queued or in flight.
        """
        with self._lock:
            found = self._forget_in_flight(key, deleted=True)
            if self._unschedulable.pop(key, None) is not None:
                return True
            if self._active.pop(key, None) is not None:
                _compact(self._active_heap, self._active)
                return True
            if self._backoff.pop(key, None) is not None:
                _compact(self._backoff_heap, self._backoff)
                return True
            return found

    # ----------------------------------------------------------------------------- moving

    def move_all_to_active_or_backoff_queue(self, event: str) -> int:
        """Move every unschedulable pod to activeQ, or to backoffQ while backing off, on a cluster event
        that may make them schedulable (``NODE_ADD``, ``NODE_UPDATE`` e.g. uncordon,
        ``ASSIGNED_POD_DELETE``); upstream ``MoveAllToActiveOrBackoffQueue`` without per-plugin event
        filtering. Records the move request cycle, so pods in flight now go to backoffQ if they fail.

        Args:
            event: event name, used as the metric label.

        Returns:
            number of pods moved.
        """
        with self._lock:
            now = self.clock.now()
            pods = list(self._unschedulable.values())
            self._unschedulable.clear()
            for qpi in pods:
                self._move_to_active_or_backoff(qpi, now, event)
            self._move_request_cycle = self._scheduling_cycle
            return len(pods)

    def flush_backoff_completed(self) -> int:
        """Move pods whose backoff is over (expiry <= now) to activeQ (upstream
        ``flushBackoffQCompleted``). ``pop_batch`` calls it first.

        Returns:
            number of pods moved.
        """
        with self._lock:
            return self._flush_backoff_locked(self.clock.now())

    def flush_unschedulable_left_over(self) -> int:
        """Move pods that have been in unschedulable pods longer than ``pod_max_in_unschedulable_s``
        (``now - timestamp > max``) to activeQ or backoffQ (upstream ``flushUnschedulablePodsLeftover``).
        ``pop_batch`` calls it first.

        Returns:
            number of pods moved.
        """
        with self._lock:
            return self._flush_unschedulable_locked(self.clock.now())

    # ----------------------------------------------------------------------------- inspection

    def pending_counts(self) -> dict[str, int]:
        """Pods per sub-queue, kube's ``scheduler_pending_pods`` labels; in-flight pods are not counted
        and nothing is gated here (the coordinator runs the PreEnqueue plugins before it routes a
        pod to a shard, and holds the gated pods itself)."""
        with self._lock:
            return {ACTIVE_Q: len(self._active), BACKOFF_Q: len(self._backoff),
                    UNSCHEDULABLE_Q: len(self._unschedulable), GATED: 0}

    def incoming_counts(self) -> dict[tuple[str, str], int]:
        """Pods that entered each sub-queue since creation, by ``(queue, event)``: the counter behind
        kube's ``scheduler_queue_incoming_pods_total``."""
        with self._lock:
            return dict(self._incoming)

    def __len__(self) -> int:
        """Queued pods (activeQ + backoffQ + unschedulable), not counting pods in flight."""
        with self._lock:
            return len(self._active) + len(self._backoff) + len(self._unschedulable)

    def contains(self, key: str) -> bool:
        """True if the pod ``key`` is queued (not in flight)."""
        with self._lock:
            return key in self._active or key in self._backoff or key in self._unschedulable

    __contains__ = contains

    @property
    def in_flight(self) -> frozenset[str]:
        """Keys of popped pods whose outcome is not reported yet (a snapshot)."""
        with self._lock:
            return frozenset(self._in_flight)

    @property
    def scheduling_cycle(self) -> int:
        """Number of pods popped so far (upstream ``SchedulingCycle``)."""
        return self._scheduling_cycle

    def wait_for_pods(self, timeout_s: float) -> bool:
        """Block until `pop_batch` may return something, or `wake` is called, or ``timeout_s``
        (real seconds) pass; returns whether activeQ holds a pod or a deadline came (a backoff
        ending, an unschedulable pod's ``pod_max_in_unschedulable_s``: upstream's
        ``flushBackoffQCompleted`` and ``flushUnschedulablePodsLeftover``, which `pop_batch` then
        runs). Waits without the lock: `add`, a failure report, a move or `wake` from another
        thread ends it, and so does a deadline (`next_ready_in_s`), recomputed whenever the queue
        changes. For a loop that would otherwise poll."""
        with self._changed:
            deadline = None
            while True:
                if self._woken:
                    self._woken = False
                    return bool(self._active)
                ready = self._next_ready_locked()
                if ready is not None and ready <= 0.0:
                    return True
                if deadline is None:
                    deadline = _monotonic() + timeout_s
                left = deadline - _monotonic()
                if left <= 0.0:
                    return False
                self._changed.wait(left if ready is None else min(left, ready))

    def wake(self) -> None:
        """End a `wait_for_pods` now (or the next one, if none waits): the caller has something
        else to do (a stop, a finished binding cycle)."""
        with self._changed:
            self._woken = True
            self._changed.notify_all()

    def next_ready_in_s(self) -> float | None:
        """Seconds until ``pop_batch`` can return something without a new event: 0.0 if activeQ is not
        empty, else until the earliest backoff expiry or unschedulable timeout (never negative);
        None if nothing is queued."""
        with self._lock:
            return self._next_ready_locked()

    def _next_ready_locked(self) -> float | None:
        if self._active:
            return 0.0
        deadlines = []
        heap, live = self._backoff_heap, self._backoff
        while heap and live.get(heap[0][2]) is not heap[0]:
            heapq.heappop(heap)
        if heap:
            deadlines.append(heap[0][0])
        for qpi in self._unschedulable.values():
            deadlines.append(qpi.timestamp + self.pod_max_in_unschedulable_s)
            break
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - self.clock.now())

    def pods(self, queue: str | None = None) -> Iterator[QueuedPodInfo]:
        """Iterate over a snapshot of the queued pods: activeQ in QueueSort order, then backoffQ by
        expiry, then unschedulable pods by timestamp. ``queue`` (``ACTIVE_Q``, ``BACKOFF_Q``,
        ``UNSCHEDULABLE_Q``) keeps one sub-queue. In-flight pods are not included.

        Raises:
            ValueError: ``queue`` names no sub-queue.
        """
        with self._lock:
            snapshot = self._snapshot_locked(queue)
        return iter(snapshot)

    def drain(self, max_n: int | None = None) -> list[QueuedPodInfo]:
        """Remove and return every queued pod, in ``pods()`` order (to hand them to another shard);
        with ``max_n``, only the last ``max_n`` in that order: unschedulable pods, then backoffQ, then
        activeQ's tail, so the pods that would be popped next stay. In-flight pods stay tracked:
        their outcome is still reported to this queue."""
        with self._lock:
            out = self._snapshot_locked(None)
            if max_n is None or max_n >= len(out):
                self._active_heap.clear()
                self._active.clear()
                self._backoff_heap.clear()
                self._backoff.clear()
                self._unschedulable.clear()
                return out
            out = out[len(out) - max_n:] if max_n > 0 else []
            for qpi in out:
                key = qpi.key
                if self._unschedulable.pop(key, None) is None and self._backoff.pop(key, None) is None:
                    del self._active[key]
            _compact(self._active_heap, self._active)
            _compact(self._backoff_heap, self._backoff)
            return out

    # ----------------------------------------------------------------------------- internals (lock held)

    def _snapshot_locked(self, queue: str | None) -> list[QueuedPodInfo]:
        if queue not in (None, ACTIVE_Q, BACKOFF_Q, UNSCHEDULABLE_Q):
            raise ValueError(f"unknown queue {queue!r}")
        out: list[QueuedPodInfo] = []
        if queue in (None, ACTIVE_Q):
            out.extend(e[-1] for e in sorted(self._active.values()))
        if queue in (None, BACKOFF_Q):
            out.extend(e[3] for e in sorted(self._backoff.values()))
        if queue in (None, UNSCHEDULABLE_Q):
            out.extend(self._unschedulable.values())
        return out

    def _push_active(self, qpi: QueuedPodInfo, key: str) -> None:
        seq = next(self._seq)
        entry = (*self.sort_key(qpi.pod_info, qpi.timestamp, seq), seq, key, qpi)
        heapq.heappush(self._active_heap, entry)
        self._active[key] = entry
        self._changed.notify_all()

    def _push_backoff(self, qpi: QueuedPodInfo, key: str, expiry_s: float) -> None:
        entry = (expiry_s, next(self._seq), key, qpi)
        heapq.heappush(self._backoff_heap, entry)
        self._backoff[key] = entry
        self._changed.notify_all()

    def _move_to_active_or_backoff(self, qpi: QueuedPodInfo, now: float, event: str) -> None:
        key = qpi.pod_info.key
        expiry = self.backoff_expiry(qpi)
        if expiry > now:
            self._push_backoff(qpi, key, expiry)
            self._count(BACKOFF_Q, event)
        else:
            self._push_active(qpi, key)
            self._count(ACTIVE_Q, event)

    def _flush_backoff_locked(self, now: float) -> int:
        heap, live = self._backoff_heap, self._backoff
        moved = 0
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            key = entry[2]
            if live.get(key) is not entry:
                continue
            del live[key]
            self._push_active(entry[3], key)
            moved += 1
        if moved:
            self._count(ACTIVE_Q, BACKOFF_COMPLETE, moved)
        return moved

    def _flush_unschedulable_locked(self, now: float) -> int:
        limit = self.pod_max_in_unschedulable_s
        expired = []
        for key, qpi in self._unschedulable.items():
            if now - qpi.timestamp <= limit:
                break  # timestamp order: the rest are younger
            expired.append(qpi)
        for qpi in expired:
            del self._unschedulable[qpi.pod_info.key]
            self._move_to_active_or_backoff(qpi, now, UNSCHEDULABLE_TIMEOUT)
        return len(expired)

    def _forget_in_flight(self, key: str, deleted: bool) -> bool:
        qpi = self._in_flight.pop(key, None)
        self._updated_in_flight.discard(key)
        if qpi is None:
            return False
        if deleted:
            self._deleted_in_flight[key] = qpi.pod_info.uid
        return True

    def _count(self, queue: str, event: str, n: int = 1) -> None:
        k = (queue, event)
        self._incoming[k] = self._incoming.get(k, 0) + n
