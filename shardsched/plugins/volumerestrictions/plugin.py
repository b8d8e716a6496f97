"""VolumeRestrictions: volumes that one pod, or one node, may use alone (kube v1.28's
VolumeRestrictions, ``pkg/scheduler/framework/plugins/volumerestrictions``).

PreFilter: a claim with the ``ReadWriteOncePod`` access mode that another pod of the cluster
already uses (counted in the table: bound or assumed) rejects the pod, Unschedulable (preemption
may free the claim): ``node has pod using PersistentVolumeClaim with the same name and
ReadWriteOncePod access mode``. A claim that does not exist: ``persistentvolumeclaim "<name>" not
found``, UnschedulableAndUnresolvable.

Filter: an in-tree disk of the pod that conflicts with one of a pod on the node (`InlineDisk.conflicts`:
the same GCE PD, RBD image or iSCSI IQN unless both are read-only, the same AWS EBS volume) rejects
the node: ``node(s) had no available disk``, Unschedulable.

Without a `VolumeCatalog` in the table, the claims' access modes are unknown: the ReadWriteOncePod
check is left to VolumeBinding, which holds such pods there; the disk check needs none.

With ``partial_view`` (a shard of the sharded runtime sees only its own nodes' pods, and another pod
anywhere may use the claim) a pod with a ReadWriteOncePod claim (`needs_cluster_view`) is placed on
the node the coordinator nominated for it over the whole cluster, where the claim's other users are
known (``PodInfo.nominated_node_name``); the shard checks the claim again over its own pods. Without
a nomination such a pod is refused at PreFilter, UnschedulableAndUnresolvable: ``pod has
ReadWriteOncePod PersistentVolumeClaims (data), which a shard of shardsched cannot check from its
own nodes and no node was nominated for it over the whole cluster (plugin VolumeRestrictions)``.
"""

from __future__ import annotations

import numpy as np

from shardsched.api.objects import PodInfo
from shardsched.api.volumes import READ_WRITE_ONCE_POD, VolumeCatalog
from shardsched.cache.node_table import NodeTable
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import FilterPlugin, Handle, Index
from shardsched.framework.status import Status
from shardsched.plugins.helper.volumes import pod_claims

NAME = "VolumeRestrictions"
ERR_DISK_CONFLICT = "node(s) had no available disk"
ERR_READ_WRITE_ONCE_POD = "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode"


class VolumeRestrictions(FilterPlugin):
    name = NAME
    static = False

    def __init__(self, partial_view: bool = False, handle: Handle | None = None) -> None:
        self.partial_view = partial_view
        self.handle = handle or Handle()

    def _read_write_once_pod(self, pod: PodInfo, catalog: VolumeCatalog) -> list[str]:
        """The pod's claims with the ReadWriteOncePod access mode (those that exist)."""
        out = []
        for name in pod.volumes.claims:
            claim = catalog.claim(pod.namespace, name)
            if claim is not None and READ_WRITE_ONCE_POD in claim.access_modes:
                out.append(name)
        return out

    def needs_cluster_view(self, pod: PodInfo) -> str | None:
        """What of the pod a shard cannot check from its own nodes (its ReadWriteOncePod claims, in
        the handle's table's catalog; module docstring), or None."""
        table = self.handle.table
        if not pod.volumes.claims or table is None or table.volumes is None:
            return None
        once = self._read_write_once_pod(pod, table.volumes)
        return f"ReadWriteOncePod PersistentVolumeClaims ({', '.join(once)})" if once else None

    def pre_filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        volumes = pod.volumes
        if volumes.claims and table.volumes is not None:
            claims = pod_claims(pod, table.volumes, NAME)
            if isinstance(claims, Status):
                return claims
            if self.partial_view and not pod.nominated_node_name:
                once = self._read_write_once_pod(pod, table.volumes)
                if once:
                    return Status.unschedulable(
                        f"pod has ReadWriteOncePod PersistentVolumeClaims ({', '.join(once)}), which a shard of "
                        "shardsched cannot check from its own nodes and no node was nominated for it over the whole "
                        f"cluster (plugin {NAME})", plugin=NAME, resolvable=False)
            for claim in claims:
                if READ_WRITE_ONCE_POD in claim.access_modes and table.claim_users.get(claim.key, set()) - {pod.uid}:
                    return Status.unschedulable(ERR_READ_WRITE_ONCE_POD, plugin=NAME)
        return Status.success() if volumes.disks else Status.skip()

    def filter_slot(self, state: CycleState, pod: PodInfo, table: NodeTable, slot: int) -> bool:
        pods = table.pods[slot]
        for uid in table.volume_pods.get(slot, ()):
            other = pods[uid]
            if uid != pod.uid and any(mine.conflicts(theirs) for mine in pod.volumes.disks
                                      for theirs in other.volumes.disks):
                return False
        return True

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        ok = np.ones(table.n, bool)
        for slot in table.volume_pods:
            ok[slot] = self.filter_slot(state, pod, table, slot)
        return ok[idx]

    def failure_reasons(self, state, pod, table, slots):
        return {ERR_DISK_CONFLICT: len(slots)}


def new(args=None, partial_view: bool = False, handle: Handle | None = None) -> VolumeRestrictions:
    return VolumeRestrictions(partial_view, handle)
