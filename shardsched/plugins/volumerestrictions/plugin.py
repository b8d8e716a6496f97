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
"""

from __future__ import annotations

import numpy as np

from shardsched.api.objects import PodInfo
from shardsched.api.volumes import READ_WRITE_ONCE_POD
from shardsched.cache.node_table import NodeTable
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import FilterPlugin, Index
from shardsched.framework.status import Status
from shardsched.plugins.helper.volumes import pod_claims

NAME = "VolumeRestrictions"
ERR_DISK_CONFLICT = "node(s) had no available disk"
ERR_READ_WRITE_ONCE_POD = "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode"


class VolumeRestrictions(FilterPlugin):
    name = NAME
    static = False

    def pre_filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        volumes = pod.volumes
        if volumes.claims and table.volumes is not None:
            claims = pod_claims(pod, table.volumes, NAME)
            if isinstance(claims, Status):
                return claims
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


def new(args=None) -> VolumeRestrictions:
    return VolumeRestrictions()
