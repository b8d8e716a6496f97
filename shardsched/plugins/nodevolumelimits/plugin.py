"""NodeVolumeLimits: a node attaches at most its CSI drivers' limits of volumes (kube v1.28's
NodeVolumeLimits, the ``CSILimits`` filter of ``pkg/scheduler/framework/plugins/nodevolumelimits``).

For each node whose CSINode gives a driver an ``allocatable.count``, the unique volumes of the
node's pods (counted in the table) plus the pod's volumes that are not among them, per driver, must
not exceed that count: ``node(s) exceed max volume count``, Unschedulable. A volume is identified
by (driver, handle):

- a claim bound to a CSI PV: the PV's driver and ``volumeHandle``; to an in-tree PV whose plugin the
  node's CSINode lists as migrated (``storage.alpha.kubernetes.io/migrated-plugins``): the driver it
  migrates to and the disk's id; other PVs are not counted;
- a claim not bound yet (or bound to a PV that does not exist): its class's provisioner (an in-tree
  provisioner counts under its CSI driver where the node migrated it), the claim itself as handle;
- an inline ``csi`` volume: its driver, a handle of its own; an inline in-tree disk: as a migrated PV.

A node without a CSINode, or a driver without a count, has no limit (upstream passes such nodes).
A claim that does not exist is VolumeBinding's to report (it runs the same check at PreFilter).
Without a `VolumeCatalog` in the table (no CSINodes), a pod with inline in-tree disks is held
(UnschedulableAndUnresolvable) rather than counted wrong; one with claims is held by VolumeBinding.

The check costs one pass over the nodes with a CSINode, and over the pods with volumes on them.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from shardsched.api.objects import PodInfo
from shardsched.api.podvolumes import PodVolumes
from shardsched.api.volumes import IN_TREE_PROVISIONERS, CSINode, VolumeCatalog
from shardsched.cache.node_table import NodeTable
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import FilterPlugin, Index
from shardsched.framework.status import Status
from shardsched.plugins.helper.volumes import no_catalog

NAME = "NodeVolumeLimits"
ERR_MAX_VOLUME_COUNT = "node(s) exceed max volume count"


def unique_volumes(namespace: str, volumes: PodVolumes, catalog: VolumeCatalog,
                   csi_node: CSINode) -> set[tuple[str, str]]:
    """The (driver, handle) of a pod's volumes that count against attach limits on the node of
    ``csi_node`` (module docstring); claims that do not exist are left out."""
    migrated = csi_node.migrated_plugins
    out = set(volumes.attachable)
    out.update((driver, handle) for plugin, driver, handle in volumes.in_tree if plugin in migrated)
    for name in volumes.claims:
        claim = catalog.claim(namespace, name)
        if claim is None:
            continue
        pv = catalog.pvs.get(claim.volume_name) if claim.volume_name else None
        if pv is not None:
            if pv.csi is not None and (not pv.in_tree_plugin or pv.in_tree_plugin in migrated):
                out.add(pv.csi)
            continue
        klass = catalog.classes.get(claim.class_name)
        if klass is None:
            continue
        driver = klass.provisioner
        if driver in IN_TREE_PROVISIONERS:
            if driver not in migrated:
                continue
            driver = IN_TREE_PROVISIONERS[driver]
        out.add((driver, claim.key))
    return out


class NodeVolumeLimits(FilterPlugin):
    name = NAME
    static = False

    def pre_filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        v = pod.volumes
        if not (v.claims or v.attachable or v.in_tree):
            return Status.skip()
        if table.volumes is None and v.in_tree:  # claims: VolumeBinding holds the pod
            names = [f"{name}: {source}" for name, source in pod.disk_volumes]
            return no_catalog(NAME, f"volumes that need attach limits ({', '.join(names)})")
        return Status.success()

    def _fits(self, pod: PodInfo, table: NodeTable, slot: int, catalog: VolumeCatalog) -> bool:
        name = table.names[slot]
        csi_node = catalog.csi_nodes.get(name) if name else None
        if csi_node is None:
            return True
        limits = {d: c for d, c in csi_node.limits.items() if c is not None}
        if not limits:
            return True
        new = unique_volumes(pod.namespace, pod.volumes, catalog, csi_node)
        if not any(driver in limits for driver, _ in new):
            return True
        pods = table.pods[slot]
        attached: set[tuple[str, str]] = set()
        for uid in table.volume_pods.get(slot, ()):
            if uid != pod.uid:
                other = pods[uid]
                attached |= unique_volumes(other.namespace, other.volumes, catalog, csi_node)
        for driver, limit in limits.items():
            adding = sum(1 for d, h in new if d == driver and (d, h) not in attached)
            if adding and sum(1 for d, _ in attached if d == driver) + adding > limit:
                return False
        return True

    def filter_slot(self, state: CycleState, pod: PodInfo, table: NodeTable, slot: int) -> bool:
        return table.volumes is None or self._fits(pod, table, slot, table.volumes)

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        ok = np.ones(table.n, bool)
        catalog = table.volumes
        if catalog is not None:
            for name in catalog.csi_nodes:
                slot = table.index.get(name)
                if slot is not None:
                    ok[slot] = self._fits(pod, table, slot, catalog)
        return ok[idx]

    def failure_reasons(self, state, pod, table, slots: Iterable[int]):
        return {ERR_MAX_VOLUME_COUNT: len(slots)}


def new(args=None) -> NodeVolumeLimits:
    return NodeVolumeLimits()
