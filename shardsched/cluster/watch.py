"""The watch half of the cluster contract: event types, object kinds, `WatchEvent`, and the
``events_since`` rule over a bounded event log that both backends serve.

A backend serves list-then-watch as the API server does: ``list_<kind>s() -> (objects, rv)``, then
``events_since(rv, kinds, limit, wait_s)`` for the changes after ``rv``, raising `Gone` once its log
no longer reaches back (the caller lists again); with ``wait_s`` a call that finds nothing new waits
up to that long for the first change (a long poll, `wait_for_events`), as a watch would deliver it. A kind the coming features need (a
PersistentVolumeClaim, as `PDB` was) is a constant here, a ``list_`` method on each
backend, and an entry in the backend's `Capabilities.kinds`; the watch needs nothing new.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from shardsched.api.workloads import REPLICA_SET, REPLICATION_CONTROLLER, SERVICE, STATEFUL_SET
from shardsched.api.volumes import CSI_NODE, CSI_STORAGE_CAPACITY, PV, PVC, STORAGE_CLASS
from shardsched.cluster.errors import Gone, Invalid

#: watch event types (``watch.EventType``); BOOKMARK and ERROR never reach a consumer
ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
#: object kinds a backend may list and watch (``kind`` of the objects)
NODE, POD, NAMESPACE = "Node", "Pod", "Namespace"
#: ``policy/v1`` PodDisruptionBudgets (preemption reads them); a backend that lists them has it in
#: `Capabilities.kinds` and a ``list_pdbs`` method
PDB = "PodDisruptionBudget"
#: ``scheduling.x-k8s.io/v1alpha1`` PodGroups (gangs, `shardsched.api.podgroup`); a backend that
#: lists them has it in `Capabilities.kinds` and a ``list_pod_groups`` method
PODGROUP = "PodGroup"
#: Services, ReplicationControllers (``v1``), ReplicaSets and StatefulSets (``apps/v1``), whose
#: selectors PodTopologySpread's default constraints read (`shardsched.api.workloads`); a backend
#: that lists them has them in `Capabilities.kinds` and a ``list_spread_selectors`` method
SPREAD_SELECTOR_KINDS = (SERVICE, REPLICATION_CONTROLLER, REPLICA_SET, STATEFUL_SET)
#: the storage kinds the volume plugins read (`shardsched.api.volumes`): PersistentVolumes,
#: PersistentVolumeClaims, StorageClasses, CSINodes, CSIStorageCapacities; a backend that lists them
#: has them in `Capabilities.kinds` and ``list_pvs``, ``list_pvcs``, ``list_storage_classes``,
#: ``list_csi_nodes`` and ``list_csi_storage_capacities`` methods
STORAGE_KINDS = (PV, PVC, STORAGE_CLASS, CSI_NODE, CSI_STORAGE_CAPACITY)


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change: ``type`` ADDED, MODIFIED or DELETED; ``kind`` the object's kind (`NODE`, `POD`,
    `NAMESPACE`, `PDB`, `PODGROUP`, `SPREAD_SELECTOR_KINDS`); ``object`` the object after the change (for DELETED, its last state), a
    camelCase dict as the API server sends it; ``rv`` the backend's sequence number of the change."""

    type: str
    kind: str
    object: dict
    rv: int


def read_event_log(log: Sequence, compacted_rv: int, current_rv: int, rv: int | str,
                   kinds: Iterable[str] | None, limit: int | None, owner: str) -> tuple[list, int]:
    """The ``events_since`` contract over a contiguous event log, shared by the simulated cluster and
    the Kubernetes backend's informer store: ``log[i].rv == compacted_rv + 1 + i``. Call with the owner's lock held.

    Returns:
        (events after ``rv``, oldest first, filtered by ``kinds`` and cut at ``limit``; the rv to
        pass next: ``current_rv``, or the last returned event's when ``limit`` cut the answer).

    Raises:
        Invalid: ``rv`` is not an integer, or ``limit`` < 1.
        Gone: ``rv`` was compacted away, or is newer than ``current_rv`` (it came from another
            instance, named by ``owner`` in the message): list again.
    """
    try:
        rv = int(rv)
    except (TypeError, ValueError):
        raise Invalid(f"resourceVersion: {rv!r} is not a valid resource version") from None
    if limit is not None and limit < 1:
        raise Invalid(f"limit: {limit} must be >= 1")
    if rv < compacted_rv:
        raise Gone(f"too old resource version: {rv} (oldest available: {compacted_rv})")
    if rv > current_rv:
        raise Gone(f"resource version {rv} is newer than this {owner}'s ({current_rv})")
    tail = log[rv - compacted_rv:]
    if kinds is not None:
        wanted = frozenset(kinds)
        tail = [ev for ev in tail if ev.kind in wanted]
    if limit is not None and len(tail) > limit:
        return tail[:limit], tail[limit - 1].rv
    return tail, current_rv


#: the longest a caller may ask ``events_since`` to wait for a change (`wait_for_events`), seconds
MAX_WATCH_WAIT_S = 5.0


def wait_for_events(changed: threading.Condition, read: Callable[[], tuple[list, int]], wait_s: float | None,
                    due_in_s: Callable[[], float | None] | None = None) -> tuple[list, int]:
    """``read()`` (a `read_event_log` over the owner's log), waiting on ``changed`` while it finds
    nothing and ``wait_s`` is not over: the long poll of ``events_since``. Call with ``changed``'s
    lock held; the wait releases it (a writer appends and notifies meanwhile). ``wait_s`` None or
    <= 0 does not wait, and is capped at `MAX_WATCH_WAIT_S`; ``due_in_s``, when given, says in how
    many seconds the owner has a change of its own due (the simulated cluster's terminating pods):
    the wait ends then so the owner can make it. Errors of ``read`` (`Gone`, `Invalid`) are raised
    at once, before any wait.

    Raises:
        Invalid: ``wait_s`` is not a number.
    """
    events, rv = read()
    if events or not wait_s:
        return events, rv
    try:
        wait_s = min(float(wait_s), MAX_WATCH_WAIT_S)
    except (TypeError, ValueError):
        raise Invalid(f"wait_s: {wait_s!r} is not a number of seconds") from None
    deadline = time.monotonic() + wait_s
    while True:
        left = deadline - time.monotonic()
        due = due_in_s() if due_in_s is not None else None
        if left <= 0 or (due is not None and due <= 0):
            return events, rv
        changed.wait(left if due is None else min(left, due))
        events, rv = read()
        if events:
            return events, rv
