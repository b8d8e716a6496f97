"""The watch half of the cluster contract: event types, object kinds, `WatchEvent`, and the
``events_since`` rule over a bounded event log that both backends serve.

A backend serves list-then-watch as the API server does: ``list_<kind>s() -> (objects, rv)``, then
``events_since(rv, kinds, limit)`` for the changes after ``rv``, raising `Gone` once its log no
longer reaches back (the caller lists again). A kind the coming features need (a
PersistentVolumeClaim, as `PDB` was) is a constant here, a ``list_`` method on each
backend, and an entry in the backend's `Capabilities.kinds`; the watch needs nothing new.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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
