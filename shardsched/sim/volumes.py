"""The simulated cluster's storage objects and its PV controller (`SimVolumes`).

PersistentVolumes, PersistentVolumeClaims, StorageClasses, CSINodes and CSIStorageCapacities are
stored as the API server stores them (validated by their `shardsched.api.volumes` views: a bad
field answers 422 Invalid naming it; a claim without ``storageClassName`` gets the default class, as
the DefaultStorageClass admission gives it), and every write is one watch event. After each write
the PV controller's work is done at once, in the same call (upstream's ``syncClaim`` and
``syncVolume``, each a MODIFIED event):

- a PV whose ``claimRef`` names an existing claim that is not bound to another PV binds it: the
  PV's ``claimRef.uid`` and phase Bound, the claim's ``volumeName``, the
  ``pv.kubernetes.io/bind-completed`` annotation and phase Bound (this is how VolumeBinding's
  PreBind write of a ``claimRef`` completes);
- an unbound claim whose class is not ``WaitForFirstConsumer`` (Immediate, no class) takes the
  smallest matching Available PV (`VolumeCatalog.candidates`); if there is none and its class
  provisions, a PV is provisioned for it (``pvc-<claim uid>``, the requested size, access modes and
  class, no node affinity);
- an unbound claim annotated ``volume.kubernetes.io/selected-node`` (VolumeBinding's PreBind for a
  claim to provision) whose class provisions gets a PV reachable from that node: node affinity on
  the node's values of the provisioner's CSINode ``topologyKeys`` (none without topology keys);
- a bound PV whose claim is gone is deleted (reclaim policy Delete) or Released (Retain).

What differs from a real cluster: there is no external provisioner, so provisioning succeeds at
once and never fails; capacity objects are not decreased by provisioning.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Iterable, Mapping

from shardsched.api.objects import as_dict
from shardsched.api.volumes import (BIND_COMPLETED_ANNOTATION, BOUND_PHASE, CSI_NODE, KINDS, NAMESPACED, PV, PVC,
                                    RELEASED, SELECTED_NODE_ANNOTATION, STORAGE_CLASS, WAIT_FOR_FIRST_CONSUMER,
                                    PersistentVolumeClaim, VolumeCatalog, object_key, parse_volume_object)
from shardsched.cluster import ADDED, DELETED, MODIFIED, AlreadyExists, Invalid, NotFound
from shardsched.errors import InvalidObjectError

#: kind -> the resource's name in API messages (``persistentvolumes "x" not found``)
RESOURCES = {PV: "persistentvolumes", PVC: "persistentvolumeclaims", STORAGE_CLASS: "storageclasses.storage.k8s.io",
             CSI_NODE: "csinodes.storage.k8s.io", "CSIStorageCapacity": "csistoragecapacities.storage.k8s.io"}

Commit = Callable[[str, str, dict], dict]


class SimVolumes:
    """The storage objects of a `shardsched.sim.SimCluster` (module docstring). Not thread-safe:
    the cluster calls it under its lock, with ``commit(type, kind, obj) -> stored obj`` (its one
    write path) and ``new_uid()``.

    Attributes:
        objects: kind -> key (`object_key`) -> the stored object.
        catalog: the same objects as `VolumeCatalog` views (what the PV controller matches with).
    """

    def __init__(self, commit: Commit, new_uid: Callable[[], str], now: Callable[[], str],
                 node_labels: Callable[[str], Mapping[str, str] | None]) -> None:
        self._commit, self._new_uid, self._now, self._node_labels = commit, new_uid, now, node_labels
        self.objects: dict[str, dict[str, dict]] = {kind: {} for kind in KINDS}
        self.catalog = VolumeCatalog()

    # ------------------------------------------------------------------ API writes
    def create(self, obj: Any) -> dict:
        """Create one storage object (its ``kind`` one of `KINDS`), then run the PV controller.

        Raises: Invalid (an unknown kind, a bad field, named), AlreadyExists.
        """
        kind, key = self._add(obj)
        self.sync()
        return self.objects[kind][key]

    def create_many(self, objs: Iterable[Any]) -> list[dict]:
        """Create storage objects in order (each as `create`), then run the PV controller once:
        what a client creating them one after the other ends with, without a controller pass per
        object (a benchmark's thousands of PVs and claims). Stops at the first error, the objects
        before it created. Raises: Invalid, AlreadyExists."""
        keys = []
        try:
            for obj in objs:
                keys.append(self._add(obj))
        finally:
            self.sync()
        return [self.objects[kind][key] for kind, key in keys]

    def _add(self, obj: Any) -> tuple[str, str]:
        kind, key, obj = self._prepare(obj)
        if key in self.objects[kind]:
            raise AlreadyExists(f'{RESOURCES[kind]} "{obj["metadata"]["name"]}" already exists')
        if kind == PVC and obj["spec"].get("storageClassName") is None:
            default = self.catalog.default_class()
            if default:
                obj["spec"]["storageClassName"] = default
        obj["metadata"].update(uid=self._new_uid(), creationTimestamp=self._now())
        self._store(ADDED, kind, key, obj)
        return kind, key

    def update(self, obj: Any) -> dict:
        """Replace one storage object (uid and creationTimestamp kept), then run the PV controller.
        Raises: NotFound, Invalid."""
        kind, key, obj = self._prepare(obj)
        old = self.objects[kind].get(key)
        if old is None:
            raise NotFound(f'{RESOURCES[kind]} "{obj["metadata"]["name"]}" not found')
        obj["metadata"].update(uid=old["metadata"]["uid"], creationTimestamp=old["metadata"]["creationTimestamp"])
        self._store(MODIFIED, kind, key, obj)
        self.sync()
        return self.objects[kind][key]

    def delete(self, kind: str, name: str, namespace: str | None = None) -> dict:
        """Delete one storage object, then run the PV controller (a bound PV of a deleted claim is
        reclaimed). Returns its last state. Raises: NotFound, Invalid (an unknown kind)."""
        if kind not in self.objects:
            raise Invalid(f"kind {kind!r} is not a storage kind ({', '.join(KINDS)})")
        key = f"{namespace or 'default'}/{name}" if kind in NAMESPACED else name
        old = self.objects[kind].pop(key, None)
        if old is None:
            raise NotFound(f'{RESOURCES[kind]} "{name}" not found')
        self.catalog.remove(kind, key)
        gone = self._commit(DELETED, kind, {**old, "metadata": {**old["metadata"]}})
        self.sync()
        return gone

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict:
        key = f"{namespace or 'default'}/{name}" if kind in NAMESPACED else name
        obj = self.objects.get(kind, {}).get(key)
        if obj is None:
            raise NotFound(f'{RESOURCES.get(kind, kind)} "{name}" not found')
        return obj

    # ------------------------------------------------------------------ VolumeBinding's writes
    def bind_volume(self, pv_name: str, namespace: str, claim: str, claim_uid: str) -> None:
        """Set a PV's ``claimRef`` (VolumeBinding's PreBind for a static binding); the controller
        then binds the claim. Raises: NotFound, Conflict-free: a PV already bound to another claim
        is left as it is (the claim then stays unbound and PreBind times out, as upstream's)."""
        pv = copy.deepcopy(self.get(PV, pv_name))
        ref = pv["spec"].get("claimRef")
        if ref and (ref.get("namespace"), ref.get("name")) != (namespace, claim):
            return
        pv["spec"]["claimRef"] = {"kind": PVC, "namespace": namespace, "name": claim, "uid": claim_uid}
        self._store(MODIFIED, PV, pv_name, pv)
        self.sync()

    def set_selected_node(self, namespace: str, claim: str, node: str) -> None:
        """Annotate a claim with the node to provision for; the controller then provisions.
        Raises: NotFound."""
        obj = copy.deepcopy(self.get(PVC, claim, namespace))
        obj["metadata"].setdefault("annotations", {})[SELECTED_NODE_ANNOTATION] = node
        self._store(MODIFIED, PVC, f"{namespace}/{claim}", obj)
        self.sync()

    def claim_bound(self, namespace: str, claim: str) -> bool:
        """The claim has ``volumeName`` and the bind-completed annotation. Raises: NotFound."""
        obj = self.get(PVC, claim, namespace)
        return bool(obj["spec"].get("volumeName")) and BIND_COMPLETED_ANNOTATION in (
            obj["metadata"].get("annotations") or {})

    # ------------------------------------------------------------------ the PV controller
    def sync(self) -> None:
        """Do the PV controller's work for every object that needs it (module docstring)."""
        for _ in range(len(self.objects[PVC]) + len(self.objects[PV]) + 1):  # each pass binds or reclaims
            if not self._sync_once():
                return

    def _sync_once(self) -> bool:
        cat = self.catalog
        for pv in list(cat.pvs.values()):
            ref = pv.claim_ref
            if ref is None:
                continue
            claim = cat.pvcs.get(ref.key)
            if claim is None or (ref.uid and ref.uid != claim.uid):
                if pv.phase == BOUND_PHASE:
                    self._reclaim(pv.name)
                    return True
                continue
            if not claim.volume_name or (claim.volume_name == pv.name and not claim.bind_completed):
                self._bind(pv.name, claim)
                return True
        for claim in list(cat.pvcs.values()):
            if claim.volume_name or claim.deleting:
                continue
            klass = cat.classes.get(claim.class_name) if claim.class_name else None
            if klass is not None and klass.binding_mode == WAIT_FOR_FIRST_CONSUMER:
                if claim.selected_node and klass.provisions:
                    self._provision(claim, claim.selected_node)
                    return True
                continue
            candidates = cat.candidates(claim)
            if candidates:
                self._bind(candidates[0].name, claim)
                return True
            if klass is not None and klass.provisions:
                self._provision(claim, None)
                return True
        return False

    def _bind(self, pv_name: str, claim: PersistentVolumeClaim) -> None:
        pv = copy.deepcopy(self.objects[PV][pv_name])
        pv["spec"]["claimRef"] = {"kind": PVC, "namespace": claim.namespace, "name": claim.name, "uid": claim.uid}
        pv["status"] = {"phase": BOUND_PHASE}
        self._store(MODIFIED, PV, pv_name, pv)
        obj = copy.deepcopy(self.objects[PVC][claim.key])
        obj["spec"]["volumeName"] = pv_name
        obj["metadata"].setdefault("annotations", {})[BIND_COMPLETED_ANNOTATION] = "yes"
        obj["status"] = {"phase": BOUND_PHASE, "accessModes": obj["spec"].get("accessModes") or [],
                         "capacity": dict(pv["spec"].get("capacity") or {})}
        self._store(MODIFIED, PVC, claim.key, obj)

    def _provision(self, claim: PersistentVolumeClaim, node: str | None) -> None:
        klass = self.catalog.classes[claim.class_name]
        spec: dict[str, Any] = {
            "capacity": {"storage": str(claim.request_bytes)}, "accessModes": sorted(claim.access_modes),
            "storageClassName": klass.name, "volumeMode": claim.volume_mode,
            "persistentVolumeReclaimPolicy": klass.reclaim_policy,
            "claimRef": {"kind": PVC, "namespace": claim.namespace, "name": claim.name, "uid": claim.uid},
            "csi": {"driver": klass.provisioner, "volumeHandle": f"pvc-{claim.uid}"},
        }
        if node is not None:
            csi_node = self.catalog.csi_nodes.get(node)
            keys = csi_node.topology_keys.get(klass.provisioner, ()) if csi_node is not None else ()
            labels = self._node_labels(node) or {}
            exprs = [{"key": k, "operator": "In", "values": [labels[k]]} for k in keys if k in labels]
            if exprs:
                spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": exprs}]}}
        name = f"pvc-{claim.uid}"
        pv = {"apiVersion": "v1", "kind": PV, "metadata": {"name": name, "uid": self._new_uid(),
                                                           "creationTimestamp": self._now()},
              "spec": spec, "status": {"phase": BOUND_PHASE}}
        self._store(ADDED, PV, name, pv)

    def _reclaim(self, pv_name: str) -> None:
        pv = self.objects[PV][pv_name]
        if (pv["spec"].get("persistentVolumeReclaimPolicy") or "Retain") == "Delete":
            del self.objects[PV][pv_name]
            self.catalog.remove(PV, pv_name)
            self._commit(DELETED, PV, {**pv, "metadata": {**pv["metadata"]}})
            return
        pv = copy.deepcopy(pv)
        pv["status"] = {"phase": RELEASED}
        self._store(MODIFIED, PV, pv_name, pv)

    # ------------------------------------------------------------------ helpers
    def _prepare(self, obj: Any) -> tuple[str, str, dict]:
        obj = copy.deepcopy(as_dict(obj))
        kind = obj.get("kind")
        if kind not in self.objects:
            raise Invalid(f"kind {kind!r} is not a storage kind ({', '.join(KINDS)})")
        if kind in NAMESPACED:
            obj.setdefault("metadata", {}).setdefault("namespace", "default")
        key = object_key(kind, obj)
        if key is None:
            raise Invalid(f"{kind}: metadata.name: Required value")
        try:
            parse_volume_object(kind, obj)
        except InvalidObjectError as e:
            raise Invalid(f'{kind} "{obj["metadata"]["name"]}" is invalid: {e}') from None
        meta = obj["metadata"]
        obj["metadata"] = {k: v for k, v in meta.items() if k not in ("uid", "resourceVersion", "creationTimestamp")}
        return kind, key, obj

    def _store(self, type_: str, kind: str, key: str, obj: dict) -> None:
        obj["metadata"] = {**obj["metadata"]}
        stored = self._commit(type_, kind, obj)
        self.objects[kind][key] = stored
        self.catalog.put(parse_volume_object(kind, stored))
