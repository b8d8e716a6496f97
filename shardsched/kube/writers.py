"""What shardsched writes to the cluster besides bindings, written the way kube-scheduler does:

- Events (`EventRecorder`), through ``events.k8s.io/v1`` like kube-scheduler's event broadcaster
  adapter, or ``core/v1`` Events when the server does not serve the new API:
  ``Scheduled`` ("Successfully assigned ns/pod to node", action ``Binding``) and ``FailedScheduling``
  ("0/N nodes are available: ...", action ``Scheduling``). ``reportingController`` is the pod's
  schedulerName (kube-scheduler records with its profile's name), ``reportingInstance``
  ``<controller>-<hostname>``. A repeat of the same event about the same object within 6 minutes
  updates the first one's ``series`` (``count``, ``lastObservedTime``) instead of creating another,
  as upstream's events library does.
- The ``PodScheduled`` condition (`StatusWriter`) through the ``pods/status`` subresource with a
  strategic merge patch (conditions merge by ``type``), as ``util.PatchPodStatus``; nothing else on
  the pod. ``lastTransitionTime`` changes only when the status does (``podutil.UpdatePodCondition``)
  and no request is made when the pod already has that condition. The patch carries the
  ``resourceVersion`` of the pod as last seen on the watch, a precondition: a condition judged on
  an older pod is never written over a newer one. kube-scheduler writes it synchronously, before
  the pod can be retried; ours is queued, and a ``PodScheduled=False`` still queued when the pod got
  bound (by us, after a node appeared, or by a rival) would otherwise overwrite the
  ``PodScheduled=True`` the API server set on the bind. Such a write is dropped: at once when the
  watch already shows the pod bound, else after the 409 and a fresh look.

Both are asynchronous and best-effort like upstream's broadcaster: callers never wait for the API.
Both yield to the binds (`shardsched.kube.gate.BindsFirst`: of their process, and of every shard when the shards mark
theirs in the ledger): while binds are in flight, one write at a time goes out, so that in a
burst the API server spends itself on placing pods first.
Work goes through a bounded `WorkQueue`; condition updates are coalesced per pod (only the newest
is written), Events beyond the capacity are dropped and counted. Temporary failures are retried a
few times with backoff; a 404 (the pod or its namespace is gone) drops the item; a 403 is logged as
an RBAC error naming the verb and resource.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import OrderedDict
from datetime import datetime, timezone
from typing import Any, Callable, Hashable, Mapping

from shardsched.errors import PermanentError, TemporaryError, ThrottledLog
from shardsched.kube.client import MERGE_PATCH, STRATEGIC_MERGE_PATCH, Api
from shardsched.kube.gate import BindsFirst
from shardsched.cluster import Conflict, NotFound

log = logging.getLogger(__name__)

#: Events written at once by one `EventRecorder` (one queue and thread each)
EVENT_WRITERS = 8

#: upstream events library: isomorphic events within this window become one series
SERIES_WINDOW_S = 6 * 60
#: kube-scheduler's actions
ACTIONS = {"Scheduled": "Binding"}
DEFAULT_ACTION = "Scheduling"


def micro_time(t: float | None = None) -> str:
    """``metav1.MicroTime`` (RFC 3339, microseconds, UTC)."""
    return datetime.fromtimestamp(time.time() if t is None else t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339(t: float | None = None) -> str:
    """``metav1.Time`` (RFC 3339, seconds, UTC)."""
    return datetime.fromtimestamp(time.time() if t is None else t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class WorkQueue:
    """A bounded, keyed work queue served by daemon threads.

    ``put(key, item)`` replaces a queued item of the same key (coalescing); when ``capacity`` items
    wait, a new key is dropped and counted. The handler raises `TemporaryError` to be retried (up
    to ``max_tries``, backoff from ``retry_s`` doubling), any other error drops the item. Items
    given up are logged at most once per ``log_every_s`` with the count since the last line (an API
    server that is away for a minute would otherwise print one line per Event).

    Args:
        name: for thread names and logs. handler: called with each item.
        gate: each call of the handler waits its turn there (`BindsFirst.writing`); None: no gate.
    """

    def __init__(self, name: str, handler: Callable[[Any], None], capacity: int = 10_000, workers: int = 2,
                 max_tries: int = 4, retry_s: float = 0.5, log_every_s: float = 10.0,
                 gate: BindsFirst | None = None) -> None:
        self.name = name
        self._failures = ThrottledLog(log_every_s)
        self.handler = handler
        self.gate = gate
        self.capacity = capacity
        self.max_tries = max_tries
        self.retry_s = retry_s
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._cond = threading.Condition()
        self._busy = 0
        self._stop = False
        self.stats = {"done": 0, "dropped": 0, "failed": 0, "retries": 0}
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        for t in self._threads:
            t.start()

    def put(self, key: Hashable, item: Any) -> bool:
        """Queue ``item`` (replacing a queued one of the same key). Returns False when dropped."""
        with self._cond:
            if key not in self._items and len(self._items) >= self.capacity:
                self.stats["dropped"] += 1
                return False
            tries = self._items[key][1] if key in self._items else 0
            self._items[key] = (item, tries)
            self._cond.notify()
            return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                key, (item, tries) = self._items.popitem(last=False)
                self._busy += 1
            try:
                if self.gate is None:
                    self.handler(item)
                else:
                    with self.gate.writing():
                        self.handler(item)
                self.stats["done"] += 1
            except TemporaryError as e:
                if tries + 1 < self.max_tries:
                    self.stats["retries"] += 1
                    time.sleep(min(10.0, self.retry_s * 2 ** tries))
                    with self._cond:
                        if key not in self._items:  # a newer item of the key wins
                            self._items[key] = (item, tries + 1)
                            self._cond.notify()
                else:
                    self.stats["failed"] += 1
                    self._log_failure(logging.WARNING, f"gave up after {tries + 1} tries: {e}")
            except Exception as e:  # noqa: BLE001 - a writer thread never dies
                self.stats["failed"] += 1
                self._log_failure(logging.ERROR if isinstance(e, PermanentError) else logging.WARNING, str(e))
            finally:
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()

    def _log_failure(self, level: int, msg: str) -> None:
        self._failures.record(log, level, self.name + ": {count} item(s) given up since the last report; last: {last}", msg)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until nothing is queued or in progress; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._items or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()


class EventRecorder:
    """Writes Events asynchronously (module docstring).

    Args:
        api: the connection (its rate limiter applies).
        default_controller: ``reportingController`` when the caller names none (a profile's
            schedulerName).
        gate: the `BindsFirst` this recorder yields to (None: a gate of its own, never shut).
    """

    def __init__(self, api: Api, default_controller: str, capacity: int = 10_000,
                 gate: BindsFirst | None = None) -> None:
        self.api = api
        self.gate = gate or BindsFirst()
        self.default_controller = default_controller
        self.host = socket.gethostname()
        self._new_api: bool | None = None  # events.k8s.io/v1 served? (None: not asked yet)
        self._series: OrderedDict[tuple, dict] = OrderedDict()  # key -> {name, namespace, count, first}
        self._lock = threading.Lock()
        self._seq = 0
        # one worker per queue, an Event's series always in the same queue: repeats are counted in
        # order and never race into two Events; `EVENT_WRITERS` queues write that many Events at once
        # (with two, a burst's Scheduled Events trailed its binds by seconds: `serve --bench`)
        self.queues = [WorkQueue(f"events-{i}", self._write, capacity=max(1, capacity // EVENT_WRITERS), workers=1,
                                 gate=self.gate)
                       for i in range(EVENT_WRITERS)]

    @property
    def stats(self) -> dict[str, int]:
        """done / dropped / failed / retries, summed over the queues."""
        out: dict[str, int] = {}
        for q in self.queues:
            for k, v in q.stats.items():
                out[k] = out.get(k, 0) + v
        return out

    def emit(self, ref: Mapping[str, Any], type_: str, reason: str, message: str, controller: str | None = None) -> bool:
        """Queue an Event about ``ref`` (an ObjectReference: kind, namespace, name, uid). Returns
        False when the queue was full and the Event dropped. Never blocks on the API."""
        controller = controller or self.default_controller
        key = self._series_key(ref, type_, reason, message, controller)
        with self._lock:
            self._seq += 1
            seq = self._seq
        queue = self.queues[hash(key) % len(self.queues)]
        return queue.put(seq, (dict(ref), type_, reason, message, controller, time.time()))

    @staticmethod
    def _series_key(ref: Mapping[str, Any], type_: str, reason: str, message: str, controller: str) -> tuple:
        return (ref.get("namespace") or "default", ref.get("kind"), ref.get("name") or "", ref.get("uid"), type_,
                reason, message, controller)

    def _uses_new_api(self) -> bool:
        if self._new_api is None:
            try:
                self.api.request("GET", "/apis/events.k8s.io/v1", verb="get", resource="apigroups events.k8s.io/v1")
                self._new_api = True
            except NotFound:
                log.info("events.k8s.io/v1 is not served; recording core/v1 Events")
                self._new_api = False
        return self._new_api

    def _write(self, item: tuple) -> None:
        ref, type_, reason, message, controller, t = item
        namespace = ref.get("namespace") or "default"
        name = ref.get("name") or ""
        key = self._series_key(ref, type_, reason, message, controller)
        new_api = self._uses_new_api()
        with self._lock:
            prior = self._series.get(key)
            if prior is not None and t - prior["first"] > SERIES_WINDOW_S:
                prior = None
            if prior is not None:
                prior["count"] += 1
                count = prior["count"]
                self._series.move_to_end(key)
        if prior is not None:
            try:
                self._patch_series(new_api, prior["namespace"], prior["name"], count, t)
                return
            except NotFound:
                pass  # the event expired or was deleted: record a new one
        created = self._create(new_api, ref, namespace, name, type_, reason, message, controller, t)
        with self._lock:
            self._series[key] = {"name": created, "namespace": namespace, "count": 1, "first": t}
            while len(self._series) > 4096:
                self._series.popitem(last=False)

    def _create(self, new_api: bool, ref: Mapping[str, Any], namespace: str, name: str, type_: str, reason: str,
                message: str, controller: str, t: float) -> str:
        event_name = f"{name}.{int(t * 1e9):x}"
        regarding = {k: v for k, v in {"kind": ref.get("kind"), "namespace": ref.get("namespace"), "name": name,
                                       "uid": ref.get("uid"), "apiVersion": ref.get("apiVersion", "v1")}.items() if v}
        instance = f"{controller}-{self.host}"
        if new_api:
            body = {"apiVersion": "events.k8s.io/v1", "kind": "Event",
                    "metadata": {"name": event_name, "namespace": namespace},
                    "eventTime": micro_time(t), "reportingController": controller, "reportingInstance": instance,
                    "action": ACTIONS.get(reason, DEFAULT_ACTION), "reason": reason, "type": type_,
                    "note": message[:1024], "regarding": regarding}
            path = f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"
        else:
            body = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": event_name, "namespace": namespace},
                    "involvedObject": regarding, "reason": reason, "message": message[:1024], "type": type_,
                    "count": 1, "firstTimestamp": rfc3339(t), "lastTimestamp": rfc3339(t),
                    "source": {"component": controller}, "reportingComponent": controller,
                    "reportingInstance": instance}
            path = f"/api/v1/namespaces/{namespace}/events"
        try:
            self.api.request("POST", path, verb="create", resource="events", body=body)
        except (NotFound, Conflict) as e:  # namespace gone / name clash: nothing to record
            log.debug("event for %s/%s not recorded: %s", namespace, name, e)
        return event_name

    def _patch_series(self, new_api: bool, namespace: str, name: str, count: int, t: float) -> None:
        if new_api:
            body = {"series": {"count": count, "lastObservedTime": micro_time(t)}}
            path = f"/apis/events.k8s.io/v1/namespaces/{namespace}/events/{name}"
        else:
            body = {"count": count, "lastTimestamp": rfc3339(t)}
            path = f"/api/v1/namespaces/{namespace}/events/{name}"
        self.api.request("PATCH", path, verb="patch", resource="events", body=body, content_type=MERGE_PATCH)

    def flush(self, timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        return all([q.flush(max(0.0, deadline - time.monotonic())) for q in self.queues])

    def stop(self) -> None:
        for q in self.queues:
            q.stop()


def condition_patch(pod: Mapping[str, Any] | None, condition: Mapping[str, Any]) -> dict | None:
    """The ``pods/status`` strategic merge patch that sets ``condition`` (conditions merge by
    ``type``), as ``util.PatchPodStatus`` after ``podutil.UpdatePodCondition``: ``lastTransitionTime``
    kept unless the status changes. None when ``pod`` (as last seen; None: not known) already has it."""
    condition = {k: v for k, v in condition.items() if k != "lastTransitionTime"}
    old = None
    if pod is not None:
        old = next((c for c in (pod.get("status") or {}).get("conditions") or []
                    if isinstance(c, dict) and c.get("type") == condition["type"]), None)
    if old is not None and all(old.get(k) == v for k, v in condition.items()):
        return None
    keep = old is not None and old.get("status") == condition.get("status") and old.get("lastTransitionTime")
    condition["lastTransitionTime"] = old["lastTransitionTime"] if keep else rfc3339()
    return {"status": {"conditions": [condition]}}


def _scheduled_since(pod: Mapping[str, Any], condition: Mapping[str, Any]) -> bool:
    """A ``PodScheduled=False`` about a pod that now has ``spec.nodeName``: it was placed after the
    failure was judged (the API server set ``PodScheduled=True`` on the bind)."""
    return (condition.get("type") == "PodScheduled" and condition.get("status") == "False"
            and bool((pod.get("spec") or {}).get("nodeName")))


class StatusWriter:
    """Writes pod conditions through ``pods/status`` (module docstring).

    Args:
        api: the connection. current: (namespace, name) -> the pod as last seen on the watch, or
            None (then the patch is sent without the no-change check).
        gate: the `BindsFirst` this writer yields to (None: never shut).
    """

    def __init__(self, api: Api, current: Callable[[str, str], dict | None], gate: BindsFirst | None = None) -> None:
        self.api = api
        self.current = current
        self.gate = gate or BindsFirst()
        self.queue = WorkQueue("pod-status", self._write, capacity=1_000_000, gate=self.gate)
        self.skipped = 0  # the pod already had the condition
        self.stale = 0  # a PodScheduled=False dropped: the pod was bound after it was judged

    def set_condition(self, namespace: str, name: str, condition: Mapping[str, Any]) -> None:
        """Queue ``condition`` for the pod (replacing one still queued for it). Never blocks."""
        self.queue.put((namespace, name, condition.get("type")), (namespace, name, dict(condition)))

    def _write(self, item: tuple) -> None:
        namespace, name, condition = item
        pod = self.current(namespace, name)
        if pod is not None and _scheduled_since(pod, condition):
            self.stale += 1
            log.debug("pod %s/%s is bound; its queued %s=False is not written", namespace, name, condition["type"])
            return
        body = condition_patch(pod, condition)
        if body is None:
            self.skipped += 1
            return
        rv = ((pod or {}).get("metadata") or {}).get("resourceVersion")
        if rv:
            body["metadata"] = {"resourceVersion": rv}  # precondition: the pod as we judged it
        try:
            self.api.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", verb="patch",
                             resource="pods/status", body=body, content_type=STRATEGIC_MERGE_PATCH)
        except NotFound:
            log.debug("pod %s/%s is gone; condition not written", namespace, name)
        except Conflict:
            # the pod changed since the watch showed it: judged again on the next try (with
            # backoff; the watch has the newer pod by then), and dropped if it was bound meanwhile
            raise TemporaryError(f"pods/status {namespace}/{name}: the pod changed since it was judged") from None

    def flush(self, timeout_s: float = 10.0) -> bool:
        return self.queue.flush(timeout_s)

    def stop(self) -> None:
        self.queue.stop()
