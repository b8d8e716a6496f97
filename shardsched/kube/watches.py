"""The watches of a scheduler (`watch_specs`) and the `Store` they feed: the objects of every watch,
merged, and the log of their changes that the cluster contract's ``events_since`` serves
(`Store.since`, raising `Gone` once the log no longer reaches back, exactly as the simulated
cluster does). The `shardsched.kube.informer.Reflector` threads fill it.

Pods come from two kinds of watch, both filtered on the server, that never send the same pod:

- ``OURS``, one per schedulerName of our profiles:
  ``spec.schedulerName=<name>,status.phase!=Succeeded,status.phase!=Failed`` (our pods, pending
  and bound: no other scheduler's pending pod is ever sent to us);
- ``BOUND``: ``spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed`` plus
  ``spec.schedulerName!=<name>`` for each of ours (every other pod that uses a node, whoever bound
  it: default scheduler, DaemonSets, static pods).

A pod's schedulerName cannot change, so each pod is on exactly one watch and its changes arrive in
order: a bind of one of our pods (by us or by a rival binding it directly) is one MODIFIED event
carrying ``spec.nodeName``, as kube-scheduler's own single pod watch sees it. The coordinator
queues the pods without ``spec.nodeName`` and counts the others on their nodes.

This split costs the API server one watch event per bind. A watch of our pending pods alone
(``spec.nodeName=,spec.schedulerName=<name>``) beside a watch of all bound pods gets two for the
same bind (the pending watch's DELETED when the pod leaves its selector, the bound watch's ADDED),
and on an API server that is the limit of a burst that second event per pod cost more of its CPU
than the bind itself gained (docs/kubernetes.md, Benchmark). Terminal pods leave either watch as
DELETED (a field selector's exit), so they free their node's resources.

A relist (after 410 Gone) replaces a watch's objects (`Store.replace`, client-go's Replace):
ADDED/MODIFIED for new or changed objects, DELETED for the ones that disappeared, so consumers of
`Store.since` never need to relist themselves.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterable

from shardsched.cluster import (ADDED, CSI_NODE, CSI_STORAGE_CAPACITY, DELETED, MODIFIED, NAMESPACE, NODE, PDB, POD,
                                PODGROUP, PV, PVC, SPREAD_SELECTOR_KINDS, STORAGE_CLASS, WatchEvent, read_event_log,
                                wait_for_events)

NODES, BOUND, OURS, NAMESPACES, PDBS, SPREAD = "nodes", "bound", "ours", "namespaces", "pdbs", "spread"
PODGROUPS, STORAGE = "podgroups", "storage"
#: the watches of the objects whose selectors default spreading reads: (name, kind, path, apiVersion)
SPREAD_WATCHES = (("services", "Service", "/api/v1/services", "v1"),
                  ("replicationcontrollers", "ReplicationController", "/api/v1/replicationcontrollers", "v1"),
                  ("replicasets", "ReplicaSet", "/apis/apps/v1/replicasets", "apps/v1"),
                  ("statefulsets", "StatefulSet", "/apis/apps/v1/statefulsets", "apps/v1"))
#: the storage kinds' watches (the volume plugins' objects): kind -> (watch name, collection path,
#: apiVersion), each listed then watched over all namespaces
STORAGE_WATCHES: dict[str, tuple[str, str, str]] = {
    PV: ("persistentvolumes", "/api/v1/persistentvolumes", "v1"),
    PVC: ("persistentvolumeclaims", "/api/v1/persistentvolumeclaims", "v1"),
    STORAGE_CLASS: ("storageclasses", "/apis/storage.k8s.io/v1/storageclasses", "storage.k8s.io/v1"),
    CSI_NODE: ("csinodes", "/apis/storage.k8s.io/v1/csinodes", "storage.k8s.io/v1"),
    CSI_STORAGE_CAPACITY: ("csistoragecapacities", "/apis/storage.k8s.io/v1/csistoragecapacities",
                           "storage.k8s.io/v1"),
}
BOUND_WATCH = "pods-bound"
#: watch event types the store applies (BOOKMARK and ERROR are handled by the reflector)
CHANGES = (ADDED, MODIFIED, DELETED)


@dataclass(frozen=True)
class WatchSpec:
    """One list+watch: its ``name``, object ``kind``, collection ``path``, server-side
    ``field_selector``, ``role`` (NODES, BOUND, OURS, NAMESPACES, PDBS, SPREAD, PODGROUPS or STORAGE), an optional server-side
    ``label_selector``, and the ``api_version`` of its objects (a list's items carry none)."""

    name: str
    kind: str
    path: str
    field_selector: str
    role: str
    label_selector: str = ""
    api_version: str = "v1"

    @property
    def resource(self) -> str:
        """For messages: ``pods (spec.nodeName=,...)``."""
        base = self.path.rsplit("/", 1)[-1]
        return f"{base} ({self.field_selector})" if self.field_selector else base


def watch_specs(scheduler_names: Iterable[str], pod_groups: bool = False, storage: bool = False) -> list[WatchSpec]:
    """The watches of a scheduler serving ``scheduler_names``: nodes, namespaces (their labels,
    for pod affinity's ``namespaceSelector``), PodDisruptionBudgets (``policy/v1``, which
    preemption reads), Services, ReplicationControllers, ReplicaSets and StatefulSets (whose
    selectors PodTopologySpread's default constraints read), each name's pods, and the other pods
    bound to nodes (see module docstring); with ``pod_groups``, the PodGroups
    (``scheduling.x-k8s.io/v1alpha1``, gangs: their CRD must be installed); with ``storage``, the
    storage kinds of `STORAGE_WATCHES`."""
    names = sorted(set(scheduler_names))
    live = "status.phase!=Succeeded,status.phase!=Failed"
    others = "".join(f",spec.schedulerName!={name}" for name in names)
    specs = [WatchSpec("nodes", NODE, "/api/v1/nodes", "", NODES),
             WatchSpec(NAMESPACES, NAMESPACE, "/api/v1/namespaces", "", NAMESPACES),
             WatchSpec(PDBS, PDB, "/apis/policy/v1/poddisruptionbudgets", "", PDBS, api_version="policy/v1"),
             *(WatchSpec(name, kind, path, "", SPREAD, api_version=version) for name, kind, path, version in SPREAD_WATCHES),
             WatchSpec(BOUND_WATCH, POD, "/api/v1/pods", f"spec.nodeName!=,{live}{others}", BOUND)]
    for name in names:
        specs.append(WatchSpec(f"pods-ours:{name}", POD, "/api/v1/pods", f"spec.schedulerName={name},{live}", OURS))
    if pod_groups:
        specs.append(WatchSpec(PODGROUPS, PODGROUP, "/apis/scheduling.x-k8s.io/v1alpha1/podgroups", "", PODGROUPS,
                               api_version="scheduling.x-k8s.io/v1alpha1"))
    if storage:
        specs += [WatchSpec(watch, kind, path, "", STORAGE, api_version=version)
                  for kind, (watch, path, version) in STORAGE_WATCHES.items()]
    return specs


def _key(obj: dict, kind: str) -> str | None:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return None
    if kind != POD:  # a namespaced kind by namespace/name
        name = meta.get("name")
        return (f"{meta['namespace']}/{name}" if meta.get("namespace") else name) if name else None
    return meta.get("uid") or (f"{meta.get('namespace')}/{meta.get('name')}" if meta.get("name") else None)


def _rv(obj: dict) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class Store:
    """Objects of every watch, merged (module docstring), and the log of changes.

    Args:
        specs: the watches feeding it.
        log_limit: changes kept for `since` (at least this many, at most 1/8 more); an older
            sequence number answers `Gone`.

    Thread-safe (one lock). Objects are the dicts from the API server; never modify them.
    """

    def __init__(self, specs: Iterable[WatchSpec], log_limit: int = 100_000) -> None:
        self.specs = {s.name: s for s in specs}
        self._members: dict[str, dict[str, dict]] = {name: {} for name in self.specs}
        self._pod_watches = [s.name for s in self.specs.values() if s.kind == POD]
        self._by_name: dict[str, dict] = {}  # "namespace/name" -> latest pod (any pod watch)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # notified at every change: `since`'s long poll
        self._log: list[WatchEvent] = []
        self._limit = log_limit
        self._slack = max(1, log_limit // 8)
        self._compacted = 0
        self._seq = 0
        self._pinned: tuple[list[dict], int] | None = None

    # ------------------------------------------------------------------ writes (reflectors)
    def apply(self, watch: str, type_: str, obj: dict) -> None:
        """Apply one watch event of watch ``watch`` (rules in the module docstring)."""
        with self._lock:
            self._apply(self.specs[watch], type_, obj)

    def replace(self, watch: str, items: list[dict]) -> int:
        """A fresh list of watch ``watch``: emit the differences (client-go's Replace). Returns how
        many changes were emitted."""
        spec = self.specs[watch]
        with self._lock:
            before = self._seq
            old = self._members[watch]
            new = {}
            for obj in items:
                k = _key(obj, spec.kind)
                if k is not None:
                    new[k] = obj
            for k, obj in new.items():
                prev = old.get(k)
                if prev is None:
                    self._apply(spec, ADDED, obj)
                elif _rv(prev) != _rv(obj):
                    self._apply(spec, MODIFIED, obj)
            for k in [k for k in old if k not in new]:
                self._apply(spec, DELETED, old[k])
            return self._seq - before

    def _apply(self, spec: WatchSpec, type_: str, obj: dict) -> None:
        k = _key(obj, spec.kind)
        if k is None:
            return
        mine = self._members[spec.name]
        if type_ == DELETED:
            if mine.pop(k, None) is None:
                return  # never seen (or already gone): nothing to tell
        else:
            mine[k] = obj
        if spec.kind == POD:
            meta = obj.get("metadata") or {}
            name_key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
            if type_ == DELETED:
                if (self._by_name.get(name_key) or {}).get("metadata", {}).get("uid") == meta.get("uid"):
                    self._by_name.pop(name_key, None)
            else:
                self._by_name[name_key] = obj
        self._seq += 1
        self._log.append(WatchEvent(type_, spec.kind, obj, self._seq))
        self._changed.notify_all()
        if len(self._log) > self._limit + self._slack:
            drop = len(self._log) - self._limit
            self._compacted = self._log[drop - 1].rv
            del self._log[:drop]

    # ------------------------------------------------------------------ reads (the protocol)
    def _pods(self) -> list[dict]:
        return [obj for name in self._pod_watches for obj in self._members[name].values()]

    def list_nodes(self) -> tuple[list[dict], int]:
        """All nodes and the sequence number to call `since` with. Pins the pods of the same moment
        for the next `list_pods`, so a relist that reads nodes then pods sees one point in time."""
        with self._lock:
            self._pinned = (self._pods(), self._seq)
            return list(self._members["nodes"].values()), self._seq

    def list_pods(self) -> tuple[list[dict], int]:
        """Every pod we know (our pending pods, and the non-terminal bound pods of anyone) and the
        sequence number; the snapshot pinned by `list_nodes` when there is one."""
        with self._lock:
            pinned, self._pinned = self._pinned, None
            return pinned if pinned is not None else (self._pods(), self._seq)

    def list_namespaces(self) -> tuple[list[dict], int]:
        """All Namespace objects and the sequence number ([] without a namespace watch)."""
        with self._lock:
            return list(self._members.get(NAMESPACES, {}).values()), self._seq

    def list_pdbs(self) -> tuple[list[dict], int]:
        """All PodDisruptionBudget objects and the sequence number ([] without a PDB watch)."""
        with self._lock:
            return list(self._members.get(PDBS, {}).values()), self._seq

    def list_pod_groups(self) -> tuple[list[dict], int]:
        """All PodGroup objects and the sequence number ([] without a PodGroup watch)."""
        with self._lock:
            return list(self._members.get(PODGROUPS, {}).values()), self._seq

    def list_spread_selectors(self) -> tuple[list[dict], int]:
        """All Services, ReplicationControllers, ReplicaSets and StatefulSets, and the sequence number."""
        with self._lock:
            return [o for spec in self.specs.values() if spec.role == SPREAD
                    for o in self._members[spec.name].values()], self._seq
    def list_storage(self, kind: str) -> tuple[list[dict], int]:
        """All objects of a storage kind (`STORAGE_WATCHES`) and the sequence number ([] without
        its watch)."""
        with self._lock:
            return list(self._members.get(STORAGE_WATCHES[kind][0], {}).values()), self._seq

    def storage_object(self, kind: str, key: str) -> dict | None:
        """The latest state of one storage object (``namespace/name`` or ``name``), or None."""
        with self._lock:
            return self._members.get(STORAGE_WATCHES[kind][0], {}).get(key)

    def pod(self, namespace: str, name: str) -> dict | None:
        """The latest state of a pod we watch, or None."""
        with self._lock:
            return self._by_name.get(f"{namespace}/{name}")

    def since(self, rv: int | str, kinds: Iterable[str] | None = None, limit: int | None = None,
              wait_s: float | None = None) -> tuple[list[WatchEvent], int]:
        """Changes after sequence number ``rv``, oldest first (the simulated cluster's
        ``events_since`` contract); with ``wait_s``, a call that finds nothing waits up to that
        long for the reflectors' next change (`wait_for_events`; they apply it meanwhile).

        Returns: (events, new_rv). Raises: `Gone` (``rv`` compacted away, or from another
        instance: list again), `Invalid` (``rv`` not an integer, ``limit`` < 1, a bad wait).
        """
        with self._lock:
            return wait_for_events(
                self._changed, lambda: read_event_log(self._log, self._compacted, self._seq, rv, kinds, limit, "informer"),
                wait_s)

    def counts(self) -> dict[str, int]:
        """Objects per watch (for health and metrics)."""
        with self._lock:
            return {name: len(m) for name, m in self._members.items()}
