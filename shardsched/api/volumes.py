"""Storage objects as the volume plugins read them: PersistentVolume, PersistentVolumeClaim,
StorageClass, CSINode and CSIStorageCapacity, and what a pod's ``spec.volumes`` asks for
(`PodVolumes`).

Each view is parsed once from its dict (camelCase, as the API server sends it); a malformed field
raises `InvalidObjectError` naming its path, so the plugins never meet a bad object. Sizes are bytes
(``spec.capacity.storage``, ``spec.resources.requests.storage``, read with the project's quantity
parser), counts are ints.

`VolumeCatalog` holds the views of one cluster by key and the scheduler's assumed bindings over them
(upstream's PV and PVC assume caches): `VolumeCatalog.assume_binding` and
`VolumeCatalog.assume_provisioning` are what VolumeBinding's Reserve records, `VolumeCatalog.restore`
its Unreserve. ``generation`` moves on every change, so cached Filter results of pods with volumes
are dropped when a claim, a volume, a class or a node's drivers change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardsched.api.objects import SelectorTerm, _meta, _str_map, _term, as_dict
from shardsched.api.podaffinity import LabelSelector, parse_label_selector
from shardsched.api.podvolumes import IN_TREE_SOURCES
from shardsched.api.quantity import canonical_quantity
from shardsched.errors import InvalidObjectError

PV, PVC, STORAGE_CLASS, CSI_NODE, CSI_STORAGE_CAPACITY = (
    "PersistentVolume", "PersistentVolumeClaim", "StorageClass", "CSINode", "CSIStorageCapacity")
#: the kinds of this module, in the order a cluster lists them
KINDS = (STORAGE_CLASS, CSI_NODE, CSI_STORAGE_CAPACITY, PV, PVC)
NAMESPACED = frozenset({PVC, CSI_STORAGE_CAPACITY})
API_VERSIONS = {PV: "v1", PVC: "v1", STORAGE_CLASS: "storage.k8s.io/v1", CSI_NODE: "storage.k8s.io/v1",
                CSI_STORAGE_CAPACITY: "storage.k8s.io/v1"}

READ_WRITE_ONCE, READ_ONLY_MANY, READ_WRITE_MANY, READ_WRITE_ONCE_POD = (
    "ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")
ACCESS_MODES = (READ_WRITE_ONCE, READ_ONLY_MANY, READ_WRITE_MANY, READ_WRITE_ONCE_POD)
FILESYSTEM, BLOCK = "Filesystem", "Block"
IMMEDIATE, WAIT_FOR_FIRST_CONSUMER = "Immediate", "WaitForFirstConsumer"
AVAILABLE, BOUND_PHASE, RELEASED = "Available", "Bound", "Released"
#: a StorageClass with this provisioner provisions nothing (local volumes: pre-created PVs only)
NO_PROVISIONER = "kubernetes.io/no-provisioner"
#: the PVC annotation that asks the provisioner for a volume reachable from this node
SELECTED_NODE_ANNOTATION = "volume.kubernetes.io/selected-node"
#: the PVC annotation the PV controller sets once the claim is bound
BIND_COMPLETED_ANNOTATION = "pv.kubernetes.io/bind-completed"
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
BETA_CLASS_ANNOTATION = "volume.beta.kubernetes.io/storage-class"
#: CSINode: the in-tree plugins whose volumes the node's CSI drivers serve (CSI migration)
MIGRATED_PLUGINS_ANNOTATION = "storage.alpha.kubernetes.io/migrated-plugins"
#: the zone and region labels VolumeZone compares (upstream's topology labels, beta ones included)
ZONE_LABELS = ("failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region",
               "topology.kubernetes.io/zone", "topology.kubernetes.io/region")

#: in-tree provisioner name -> its CSI driver (a StorageClass naming the in-tree provisioner)
IN_TREE_PROVISIONERS = {plugin: driver for plugin, driver, _ in IN_TREE_SOURCES.values()}


def _obj(value: Any, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidObjectError("must be an object", path)
    return value


def _access_modes(value: Any, path: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list):
        raise InvalidObjectError("must be a list", path)
    for i, mode in enumerate(value):
        if mode not in ACCESS_MODES:
            raise InvalidObjectError(f"unsupported value {mode!r}: supported values: {', '.join(ACCESS_MODES)}",
                                     f"{path}[{i}]")
    return frozenset(value)


def _storage(resources: Mapping[str, Any], path: str) -> int | None:
    value = resources.get("storage")
    return None if value is None else canonical_quantity("storage", value, f"{path}.storage")


def _volume_mode(spec: Mapping[str, Any]) -> str:
    mode = spec.get("volumeMode") or FILESYSTEM
    if mode not in (FILESYSTEM, BLOCK):
        raise InvalidObjectError(f"unsupported value {mode!r}: supported values: Block, Filesystem", "spec.volumeMode")
    return mode


def _node_terms(value: Any, path: str) -> tuple[SelectorTerm, ...]:
    """A NodeSelector's terms; the API server requires at least one."""
    sel = _obj(value, path)
    terms = sel.get("nodeSelectorTerms")
    if not isinstance(terms, list) or not terms:
        raise InvalidObjectError("must have at least one node selector term", f"{path}.nodeSelectorTerms")
    return tuple(_term(t, f"{path}.nodeSelectorTerms[{i}]") for i, t in enumerate(terms))


def _topology_terms(value: Any, path: str) -> tuple[SelectorTerm, ...]:
    """``allowedTopologies``: TopologySelectorTerms (``matchLabelExpressions`` of key and values),
    read as node selector terms of ``In`` requirements."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidObjectError("must be a list", path)
    out = []
    for i, term in enumerate(value):
        exprs = _obj(term, f"{path}[{i}]").get("matchLabelExpressions") or []
        if not isinstance(exprs, list):
            raise InvalidObjectError("must be a list", f"{path}[{i}].matchLabelExpressions")
        reqs = []
        for j, e in enumerate(exprs):
            p = f"{path}[{i}].matchLabelExpressions[{j}]"
            e = _obj(e, p)
            key, values = e.get("key"), e.get("values")
            if not isinstance(key, str) or not key:
                raise InvalidObjectError("key is missing", f"{p}.key")
            if not isinstance(values, list) or not values:
                raise InvalidObjectError("must have at least one value", f"{p}.values")
            reqs.append((key, "In", tuple(sorted(map(str, values)))))
        out.append(SelectorTerm(tuple(reqs)))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A PV's ``spec.claimRef``: the claim it is (pre-)bound to; ``uid`` "" until the PV controller
    completes the binding."""

    namespace: str
    name: str
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PersistentVolume:
    """A PV as VolumeBinding, VolumeZone and NodeVolumeLimits read it.

    Attributes:
        capacity_bytes: ``spec.capacity.storage`` (0 when unset).
        storage_class: ``spec.storageClassName`` (or the beta annotation), "" for none.
        node_affinity: ``spec.nodeAffinity.required`` terms, None when the PV has none (every node).
        phase: ``status.phase``; a PV without a status is ``Available`` (the PV controller's first write).
        csi: (driver, volumeHandle) of a CSI volume, or of an in-tree volume's migration target
            (`IN_TREE_SOURCES`: the driver, the disk's id), None otherwise; ``in_tree_plugin`` names
            the in-tree plugin of the latter.
    """

    name: str
    uid: str
    labels: Mapping[str, str]
    capacity_bytes: int
    access_modes: frozenset[str]
    storage_class: str
    volume_mode: str
    claim_ref: ClaimRef | None
    phase: str
    node_affinity: tuple[SelectorTerm, ...] | None
    deleting: bool = False
    reclaim_policy: str = "Retain"
    csi: tuple[str, str] | None = None
    in_tree_plugin: str = ""
    obj: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def key(self) -> str:
        return self.name

    @classmethod
    def from_object(cls, obj: Any) -> "PersistentVolume":
        """From a PersistentVolume dict or client model.

        Raises:
            InvalidObjectError: a malformed field (an invalid node affinity, a bad quantity or
                access mode), naming its path.
        """
        obj = as_dict(obj)
        meta = _meta(obj)
        spec = _obj(obj.get("spec"), "spec")
        status = _obj(obj.get("status"), "status")
        affinity = spec.get("nodeAffinity")
        terms = None
        if affinity is not None:
            required = _obj(affinity, "spec.nodeAffinity").get("required")
            if required is not None:
                terms = _node_terms(required, "spec.nodeAffinity.required")
        ref = spec.get("claimRef")
        claim_ref = None
        if ref is not None:
            ref = _obj(ref, "spec.claimRef")
            if not ref.get("name"):
                raise InvalidObjectError("claimRef needs a name", "spec.claimRef.name")
            claim_ref = ClaimRef(str(ref.get("namespace") or "default"), str(ref["name"]), str(ref.get("uid") or ""))
        annotations = _str_map(meta.get("annotations"), "metadata.annotations")
        csi, plugin = None, ""
        if spec.get("csi") is not None:
            c = _obj(spec["csi"], "spec.csi")
            if not c.get("driver") or not c.get("volumeHandle"):
                raise InvalidObjectError("a CSI volume needs driver and volumeHandle", "spec.csi")
            csi = (str(c["driver"]), str(c["volumeHandle"]))
        else:
            for source, (in_tree, driver, id_field) in IN_TREE_SOURCES.items():
                if spec.get(source) is not None:
                    csi, plugin = (driver, str(_obj(spec[source], f"spec.{source}").get(id_field) or "")), in_tree
                    break
        return cls(
            name=meta["name"], uid=str(meta.get("uid") or meta["name"]),
            labels=_str_map(meta.get("labels"), "metadata.labels"),
            capacity_bytes=_storage(_obj(spec.get("capacity"), "spec.capacity"), "spec.capacity") or 0,
            access_modes=_access_modes(spec.get("accessModes"), "spec.accessModes"),
            storage_class=str(spec.get("storageClassName") or annotations.get(BETA_CLASS_ANNOTATION) or ""),
            volume_mode=_volume_mode(spec), claim_ref=claim_ref, phase=str(status.get("phase") or AVAILABLE),
            node_affinity=terms, deleting=bool(meta.get("deletionTimestamp")),
            reclaim_policy=str(spec.get("persistentVolumeReclaimPolicy") or "Retain"), csi=csi,
            in_tree_plugin=plugin, obj=obj)


@dataclass(frozen=True, slots=True)
class PersistentVolumeClaim:
    """A PVC as the volume plugins read it.

    Attributes:
        storage_class: ``spec.storageClassName`` (or the beta annotation); None when unset (the
            DefaultStorageClass admission gives it the default class on create, `with_default_class`),
            "" for "no class".
        request_bytes: ``spec.resources.requests.storage`` (0 when unset).
        selector: ``spec.selector`` over PV labels, None for none.
        volume_name: ``spec.volumeName``: the PV it is bound (or pre-bound) to, "" for none.
        selected_node: the `SELECTED_NODE_ANNOTATION`: the node a provisioner is asked to provision for.
    """

    namespace: str
    name: str
    uid: str
    storage_class: str | None
    access_modes: frozenset[str]
    request_bytes: int
    selector: LabelSelector | None
    volume_name: str
    volume_mode: str
    phase: str
    selected_node: str = ""
    deleting: bool = False
    bind_completed: bool = False
    owner_uids: frozenset[str] = frozenset()
    obj: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def class_name(self) -> str:
        """The class the claim asks for ("" for none): upstream ``GetPersistentVolumeClaimClass``."""
        return self.storage_class or ""

    def with_default_class(self, default: str | None) -> "PersistentVolumeClaim":
        """The claim as the DefaultStorageClass admission stores it: an unset class becomes
        ``default`` (when the cluster has one)."""
        if self.storage_class is not None or not default:
            return self
        return dataclasses.replace(self, storage_class=default)

    @classmethod
    def from_object(cls, obj: Any) -> "PersistentVolumeClaim":
        """From a PersistentVolumeClaim dict or client model.

        Raises:
            InvalidObjectError: a malformed field (a bad quantity, access mode or selector), naming its path.
        """
        obj = as_dict(obj)
        meta = _meta(obj)
        spec = _obj(obj.get("spec"), "spec")
        status = _obj(obj.get("status"), "status")
        annotations = _str_map(meta.get("annotations"), "metadata.annotations")
        resources = _obj(spec.get("resources"), "spec.resources")
        klass = spec.get("storageClassName")
        if klass is None:
            klass = annotations.get(BETA_CLASS_ANNOTATION)
        owners = meta.get("ownerReferences") or []
        if not isinstance(owners, list):
            raise InvalidObjectError("must be a list", "metadata.ownerReferences")
        return cls(
            namespace=str(meta.get("namespace") or "default"), name=meta["name"],
            uid=str(meta.get("uid") or f"{meta.get('namespace') or 'default'}/{meta['name']}"),
            storage_class=None if klass is None else str(klass),
            access_modes=_access_modes(spec.get("accessModes"), "spec.accessModes"),
            request_bytes=_storage(_obj(resources.get("requests"), "spec.resources.requests"),
                                   "spec.resources.requests") or 0,
            selector=parse_label_selector(spec.get("selector"), "spec.selector"),
            volume_name=str(spec.get("volumeName") or ""), volume_mode=_volume_mode(spec),
            phase=str(status.get("phase") or "Pending"), selected_node=annotations.get(SELECTED_NODE_ANNOTATION, ""),
            deleting=bool(meta.get("deletionTimestamp")), bind_completed=BIND_COMPLETED_ANNOTATION in annotations,
            owner_uids=frozenset(str(o.get("uid")) for o in owners if isinstance(o, Mapping) and o.get("uid")),
            obj=obj)


@dataclass(frozen=True, slots=True)
class StorageClass:
    """A StorageClass: its provisioner, ``volumeBindingMode`` (Immediate, the default, or
    WaitForFirstConsumer), ``allowedTopologies`` (node selector terms; () = every node) and whether
    it is the cluster's default class."""

    name: str
    provisioner: str
    binding_mode: str
    allowed_topologies: tuple[SelectorTerm, ...]
    reclaim_policy: str = "Delete"
    is_default: bool = False
    obj: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def key(self) -> str:
        return self.name

    @property
    def provisions(self) -> bool:
        """Whether the class provisions volumes (a provisioner other than `NO_PROVISIONER`)."""
        return bool(self.provisioner) and self.provisioner != NO_PROVISIONER

    @classmethod
    def from_object(cls, obj: Any) -> "StorageClass":
        """From a StorageClass dict or client model.

        Raises:
            InvalidObjectError: no provisioner, an unknown binding mode, malformed allowedTopologies.
        """
        obj = as_dict(obj)
        meta = _meta(obj)
        if not obj.get("provisioner"):
            raise InvalidObjectError("Required value", "provisioner")
        mode = obj.get("volumeBindingMode") or IMMEDIATE
        if mode not in (IMMEDIATE, WAIT_FOR_FIRST_CONSUMER):
            raise InvalidObjectError(f"unsupported value {mode!r}: supported values: Immediate, WaitForFirstConsumer",
                                     "volumeBindingMode")
        annotations = _str_map(meta.get("annotations"), "metadata.annotations")
        return cls(meta["name"], str(obj["provisioner"]), mode,
                   _topology_terms(obj.get("allowedTopologies"), "allowedTopologies"),
                   str(obj.get("reclaimPolicy") or "Delete"),
                   annotations.get(DEFAULT_CLASS_ANNOTATION) == "true", obj)


@dataclass(frozen=True, slots=True)
class CSINode:
    """A node's CSI drivers: driver -> ``allocatable.count`` (None: no limit) and its topology
    keys; ``migrated_plugins``: the in-tree plugins its drivers serve (`MIGRATED_PLUGINS_ANNOTATION`)."""

    name: str
    limits: Mapping[str, int | None]
    topology_keys: Mapping[str, tuple[str, ...]]
    migrated_plugins: frozenset[str] = frozenset()
    obj: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def key(self) -> str:
        return self.name

    @classmethod
    def from_object(cls, obj: Any) -> "CSINode":
        """From a CSINode dict or client model.

        Raises:
            InvalidObjectError: a driver without a name, a count that is not a non-negative integer.
        """
        obj = as_dict(obj)
        meta = _meta(obj)
        drivers = _obj(obj.get("spec"), "spec").get("drivers") or []
        if not isinstance(drivers, list):
            raise InvalidObjectError("must be a list", "spec.drivers")
        limits: dict[str, int | None] = {}
        keys: dict[str, tuple[str, ...]] = {}
        for i, d in enumerate(drivers):
            p = f"spec.drivers[{i}]"
            d = _obj(d, p)
            name = d.get("name")
            if not isinstance(name, str) or not name:
                raise InvalidObjectError("Required value", f"{p}.name")
            count = _obj(d.get("allocatable"), f"{p}.allocatable").get("count")
            if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
                raise InvalidObjectError(f"{count!r} is not a non-negative integer", f"{p}.allocatable.count")
            limits[name] = count
            keys[name] = tuple(map(str, d.get("topologyKeys") or ()))
        annotations = _str_map(meta.get("annotations"), "metadata.annotations")
        migrated = frozenset(p for p in annotations.get(MIGRATED_PLUGINS_ANNOTATION, "").split(",") if p)
        return cls(meta["name"], limits, keys, migrated, obj)


@dataclass(frozen=True, slots=True)
class CSIStorageCapacity:
    """A CSIStorageCapacity: the room a driver reports for a class on the nodes ``node_topology``
    selects (None: no node; the empty selector: every node). ``limit_bytes``: ``maximumVolumeSize``
    when set, else ``capacity`` (upstream ``capacitySufficient``), None when neither is."""

    namespace: str
    name: str
    storage_class: str
    node_topology: LabelSelector | None
    limit_bytes: int | None
    obj: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_object(cls, obj: Any) -> "CSIStorageCapacity":
        """From a CSIStorageCapacity dict or client model.

        Raises:
            InvalidObjectError: no storageClassName, a bad quantity or selector.
        """
        obj = as_dict(obj)
        meta = _meta(obj)
        if not obj.get("storageClassName"):
            raise InvalidObjectError("Required value", "storageClassName")
        limit = None
        for fld in ("maximumVolumeSize", "capacity"):
            if obj.get(fld) is not None:
                limit = canonical_quantity("storage", obj[fld], fld)
                break
        return cls(str(meta.get("namespace") or "default"), meta["name"], str(obj["storageClassName"]),
                   parse_label_selector(obj.get("nodeTopology"), "nodeTopology"), limit, obj)


PARSERS = {PV: PersistentVolume.from_object, PVC: PersistentVolumeClaim.from_object,
           STORAGE_CLASS: StorageClass.from_object, CSI_NODE: CSINode.from_object,
           CSI_STORAGE_CAPACITY: CSIStorageCapacity.from_object}


def object_key(kind: str, obj: Mapping[str, Any]) -> str | None:
    """``namespace/name`` of a namespaced kind, ``name`` otherwise; None without a name."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping) or not meta.get("name"):
        return None
    return f"{meta.get('namespace') or 'default'}/{meta['name']}" if kind in NAMESPACED else str(meta["name"])


# ---------------------------------------------------------------------------------- the catalog

@dataclass
class VolumeCatalog:
    """The storage objects of one cluster, by key, with the scheduler's assumed bindings.

    Attributes:
        pvs, pvcs, classes, csi_nodes, capacities: views by key (`object_key`); ``pvcs`` hold the
            claims as the scheduler sees them, its assumptions included.
        invalid_pvs: PVs that could not be parsed: name -> the error (a claim bound to one fits no
            node; kube would fail its node affinity check too).
        generation: moves on every change (cached Filter results of pods with volumes depend on it).
    """

    pvs: dict[str, PersistentVolume] = field(default_factory=dict)
    pvcs: dict[str, PersistentVolumeClaim] = field(default_factory=dict)
    classes: dict[str, StorageClass] = field(default_factory=dict)
    csi_nodes: dict[str, CSINode] = field(default_factory=dict)
    capacities: dict[str, CSIStorageCapacity] = field(default_factory=dict)
    invalid_pvs: dict[str, str] = field(default_factory=dict)
    generation: int = 0
    #: assumed objects' originals: kind, key -> the view before the assumption (None: absent)
    _assumed: dict[tuple[str, str], Any] = field(default_factory=dict)

    def _table(self, kind: str) -> dict:
        return {PV: self.pvs, PVC: self.pvcs, STORAGE_CLASS: self.classes, CSI_NODE: self.csi_nodes,
                CSI_STORAGE_CAPACITY: self.capacities}[kind]

    def put(self, view: Any) -> None:
        """Add or replace one view (its kind from its type); the cluster's version replaces an
        assumption of the same object."""
        kind = _KIND_OF[type(view)]
        if kind == PV:
            self.invalid_pvs.pop(view.name, None)
        self._assumed.pop((kind, view.key), None)
        self._table(kind)[view.key] = view
        self.generation += 1

    def remove(self, kind: str, key: str) -> None:
        """Drop one object; safe for an unknown key."""
        self._assumed.pop((kind, key), None)
        if kind == PV:
            self.invalid_pvs.pop(key, None)
        self._table(kind).pop(key, None)
        self.generation += 1

    def put_invalid_pv(self, name: str, error: str) -> None:
        """Record a PV that could not be parsed (it replaces a valid view of the same name)."""
        self.pvs.pop(name, None)
        self.invalid_pvs[name] = error
        self.generation += 1

    def apply(self, upserts: Iterable[Any] = (), removed: Iterable[tuple[str, str]] = (),
              invalid_pvs: Mapping[str, str] | None = None, replace: bool = False) -> bool:
        """Views created or changed, (kind, key) of objects deleted, PVs that could not be parsed
        (name -> error); with ``replace`` these are the whole set (a relist: every other object,
        and every assumption, is dropped). A view equal to the one held changes nothing.

        Returns: True if anything changed (``generation`` moved).
        """
        before = self.generation
        if replace:
            tables = {kind: {} for kind in KINDS}
            for view in upserts:
                tables[_KIND_OF[type(view)]][view.key] = view
            invalid = dict(invalid_pvs or {})
            current = {kind: self._table(kind) for kind in KINDS}
            if tables != current or invalid != self.invalid_pvs or self._assumed:
                self.pvs, self.pvcs, self.classes = tables[PV], tables[PVC], tables[STORAGE_CLASS]
                self.csi_nodes, self.capacities = tables[CSI_NODE], tables[CSI_STORAGE_CAPACITY]
                self.invalid_pvs = invalid
                self._assumed.clear()
                self.generation += 1
            return self.generation != before
        for view in upserts:
            kind = _KIND_OF[type(view)]
            if self._table(kind).get(view.key) != view or (kind, view.key) in self._assumed \
                    or (kind == PV and view.name in self.invalid_pvs):
                self.put(view)
        for kind, key in removed:
            if key in self._table(kind) or (kind, key) in self._assumed or (kind == PV and key in self.invalid_pvs):
                self.remove(kind, key)
        for name, error in (invalid_pvs or {}).items():
            if self.invalid_pvs.get(name) != error:
                self._assumed.pop((PV, name), None)
                self.put_invalid_pv(name, error)
        return self.generation != before

    def views(self) -> list[Any]:
        """Every view held, in `KINDS` order (with `invalid_pvs`, what `apply` with ``replace``
        needs to rebuild this catalog elsewhere; assumptions included as they stand)."""
        return [view for kind in KINDS for view in self._table(kind).values()]

    def default_class(self) -> str | None:
        """The default StorageClass (the newest-named one, when several are marked), or None."""
        marked = sorted(c.name for c in self.classes.values() if c.is_default)
        return marked[-1] if marked else None

    def claim(self, namespace: str, name: str) -> PersistentVolumeClaim | None:
        return self.pvcs.get(f"{namespace}/{name}")

    def binding_mode(self, claim: PersistentVolumeClaim) -> str:
        """The claim's binding mode: its class's; Immediate without a class or when the class does
        not exist (upstream ``IsDelayBindingMode``)."""
        klass = self.classes.get(claim.class_name) if claim.class_name else None
        return klass.binding_mode if klass is not None else IMMEDIATE

    def is_bound(self, claim: PersistentVolumeClaim) -> bool:
        """The claim names a PV and that PV exists or is known to be invalid (a pre-bound claim whose
        PV's claimRef points elsewhere is not bound)."""
        if not claim.volume_name:
            return False
        if claim.volume_name in self.invalid_pvs:
            return True
        pv = self.pvs.get(claim.volume_name)
        if pv is None:
            return claim.bind_completed
        return pv.claim_ref is None or pv.claim_ref.key == claim.key

    def candidates(self, claim: PersistentVolumeClaim, exclude: Iterable[str] = ()) -> list[PersistentVolume]:
        """The PVs the claim may bind to, smallest first, ignoring node affinity (upstream
        ``FindMatchingVolume``'s checks but the node's): a PV pre-bound to the claim (its claimRef
        names it) alone when there is one; else Available PVs without claimRef, of the claim's class,
        not being deleted, with room for the request, every access mode it asks for, its volume
        mode, and labels its selector matches."""
        skip = set(exclude)
        out = []
        for pv in self.pvs.values():
            if pv.name in skip or pv.deleting or pv.capacity_bytes < claim.request_bytes \
                    or pv.volume_mode != claim.volume_mode:
                continue
            if pv.claim_ref is not None:
                if pv.claim_ref.key == claim.key and (not pv.claim_ref.uid or pv.claim_ref.uid == claim.uid):
                    return [pv]
                continue
            if pv.phase != AVAILABLE or pv.storage_class != claim.class_name:
                continue
            if claim.selector is not None and not claim.selector.matches(pv.labels):
                continue
            if not claim.access_modes <= pv.access_modes:
                continue
            out.append(pv)
        out.sort(key=lambda pv: (pv.capacity_bytes, pv.name))
        return out

    # ------------------------------------------------------------------ assumptions
    def _remember(self, kind: str, key: str) -> None:
        self._assumed.setdefault((kind, key), self._table(kind).get(key))

    def assume_binding(self, pv_name: str, claim: PersistentVolumeClaim) -> None:
        """Assume ``pv_name`` bound to ``claim`` (PV claimRef, claim volumeName), as VolumeBinding's
        Reserve assumes a static binding; `restore` undoes it."""
        pv = self.pvs[pv_name]
        self._remember(PV, pv_name)
        self._remember(PVC, claim.key)
        self.pvs[pv_name] = dataclasses.replace(pv, claim_ref=ClaimRef(claim.namespace, claim.name, claim.uid),
                                                phase=BOUND_PHASE)
        self.pvcs[claim.key] = dataclasses.replace(claim, volume_name=pv_name)
        self.generation += 1

    def assume_provisioning(self, claim: PersistentVolumeClaim, node: str) -> None:
        """Assume ``claim`` annotated for provisioning on ``node`` (`SELECTED_NODE_ANNOTATION`)."""
        self._remember(PVC, claim.key)
        self.pvcs[claim.key] = dataclasses.replace(claim, selected_node=node)
        self.generation += 1

    def restore(self, keys: Iterable[tuple[str, str]]) -> None:
        """Undo the assumptions of these (kind, key) pairs; safe for keys never assumed."""
        for kind, key in keys:
            if (kind, key) not in self._assumed:
                continue
            old = self._assumed.pop((kind, key))
            if old is None:
                self._table(kind).pop(key, None)
            else:
                self._table(kind)[key] = old
            self.generation += 1


_KIND_OF = {PersistentVolume: PV, PersistentVolumeClaim: PVC, StorageClass: STORAGE_CLASS, CSINode: CSI_NODE,
            CSIStorageCapacity: CSI_STORAGE_CAPACITY}


def parse_volume_object(kind: str, obj: Any) -> Any:
    """The view of one object of ``kind`` (one of `KINDS`).

    Raises:
        InvalidObjectError: as the kind's ``from_object``.
        KeyError: ``kind`` is not one of `KINDS`.
    """
    return PARSERS[kind](obj)
