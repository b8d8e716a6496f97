"""What a pod's ``spec.volumes`` asks of the volume plugins (`PodVolumes`), parsed once with the
pod (`shardsched.api.objects.PodInfo.volumes`): the claims VolumeBinding, VolumeZone and
VolumeRestrictions read, the in-tree disks VolumeRestrictions compares, the inline volumes
NodeVolumeLimits counts. The storage objects themselves are `shardsched.api.volumes`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardsched.errors import InvalidObjectError

#: in-tree volume source -> (in-tree plugin name, the CSI driver it migrates to, the field naming
#: the disk); NodeVolumeLimits counts such a volume against the driver's limit when the node's
#: CSINode lists the plugin as migrated
IN_TREE_SOURCES: dict[str, tuple[str, str, str]] = {
    "awsElasticBlockStore": ("kubernetes.io/aws-ebs", "ebs.csi.aws.com", "volumeID"),
    "gcePersistentDisk": ("kubernetes.io/gce-pd", "pd.csi.storage.gke.io", "pdName"),
    "azureDisk": ("kubernetes.io/azure-disk", "disk.csi.azure.com", "diskURI"),
    "cinder": ("kubernetes.io/cinder", "cinder.csi.openstack.org", "volumeID"),
    "vsphereVolume": ("kubernetes.io/vsphere-volume", "csi.vsphere.vmware.com", "volumePath"),
    "portworxVolume": ("kubernetes.io/portworx-volume", "pxd.portworx.com", "volumeID"),
}


def _obj(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True, slots=True)
class InlineDisk:
    """An in-tree disk volume of a pod that VolumeRestrictions compares with the node's pods:
    ``source`` (gcePersistentDisk, awsElasticBlockStore, rbd, iscsi), ``disk`` (pdName, volumeID,
    pool/image, or the IQN), ``monitors`` (rbd), ``read_only``."""

    source: str
    disk: str
    read_only: bool
    monitors: frozenset[str] = frozenset()

    def conflicts(self, other: "InlineDisk") -> bool:
        """Upstream ``isVolumeConflict``: the same GCE PD, RBD image (with a shared monitor) or iSCSI
        IQN unless both are read-only; the same AWS EBS volume always."""
        if self.source != other.source or self.disk != other.disk:
            return False
        if self.source == "awsElasticBlockStore":
            return True
        if self.source == "rbd" and not (self.monitors & other.monitors):
            return False
        return not (self.read_only and other.read_only)


@dataclass(frozen=True, slots=True)
class PodVolumes:
    """What a pod's ``spec.volumes`` asks of the volume plugins.

    Attributes:
        claims: the claim names, in order: ``persistentVolumeClaim.claimName``, and
            ``<pod name>-<volume name>`` for a generic ``ephemeral`` volume (upstream
            ``ephemeral.VolumeClaimName``); ``ephemeral`` the subset of those that are ephemeral.
        disks: the in-tree disks VolumeRestrictions checks.
        attachable: (driver, handle) of the inline volumes NodeVolumeLimits counts whatever the
            node: inline ``csi`` volumes (a handle unique to the pod); ``in_tree`` the (in-tree
            plugin, driver, handle) of in-tree disks, counted where the node migrated the plugin.
    """

    claims: tuple[str, ...] = ()
    ephemeral: frozenset[str] = frozenset()
    disks: tuple[InlineDisk, ...] = ()
    attachable: tuple[tuple[str, str], ...] = ()
    in_tree: tuple[tuple[str, str, str], ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.claims or self.disks or self.attachable or self.in_tree)


NO_VOLUMES = PodVolumes()


def parse_pod_volumes(items: Any, pod_name: str, pod_uid: str) -> PodVolumes:
    """The `PodVolumes` of a pod's ``spec.volumes`` (a list of objects, checked by the caller).

    Raises:
        InvalidObjectError: a ``persistentVolumeClaim`` without ``claimName``.
    """
    if not items:
        return NO_VOLUMES
    claims, ephemeral, disks, attachable, in_tree = [], set(), [], [], []
    for i, v in enumerate(items):
        name = str(v.get("name") or f"volumes[{i}]")
        if v.get("persistentVolumeClaim") is not None:
            claim = _obj(v["persistentVolumeClaim"]).get("claimName")
            if not claim:
                raise InvalidObjectError("Required value", f"spec.volumes[{i}].persistentVolumeClaim.claimName")
            claims.append(str(claim))
        elif v.get("ephemeral") is not None:
            claims.append(f"{pod_name}-{name}")
            ephemeral.add(claims[-1])
        elif v.get("csi") is not None:
            driver = _obj(v["csi"]).get("driver")
            if driver:
                attachable.append((str(driver), f"{pod_uid}-{name}"))
        for source in ("gcePersistentDisk", "awsElasticBlockStore", "rbd", "iscsi"):
            s = v.get(source)
            if isinstance(s, Mapping):
                disk = {"gcePersistentDisk": lambda: s.get("pdName"), "awsElasticBlockStore": lambda: s.get("volumeID"),
                        "rbd": lambda: f"{s.get('pool') or 'rbd'}/{s.get('image')}",
                        "iscsi": lambda: s.get("iqn")}[source]()
                disks.append(InlineDisk(source, str(disk or ""), bool(s.get("readOnly")),
                                        frozenset(map(str, s.get("monitors") or ())) if source == "rbd" else frozenset()))
        for source, (plugin, driver, id_field) in IN_TREE_SOURCES.items():
            s = v.get(source)
            if isinstance(s, Mapping):
                in_tree.append((plugin, driver, str(s.get(id_field) or "")))
    return PodVolumes(tuple(claims), frozenset(ephemeral), tuple(disks), tuple(attachable), tuple(in_tree))
