"""VolumeZone: a pod goes to the zone and region of its bound volumes (kube v1.28's VolumeZone,
``pkg/scheduler/framework/plugins/volumezone``).

PreFilter: for each claim of the pod, its PV's zone and region labels (`ZONE_LABELS`, the beta ones
included) are the constraints; a value may list several zones separated by ``__`` (upstream
``LabelZonesToSet``). A claim not bound yet whose class is ``WaitForFirstConsumer`` adds none (its
volume is chosen with the node). A claim that does not exist, an unbound claim of another class or
a PV that does not exist rejects the pod, UnschedulableAndUnresolvable (``persistentvolumeclaim
"<name>" not found``, ``PersistentVolumeClaim had no pv name and storageClass name``,
``PersistentVolume not found``; VolumeBinding, before it in kube's order, usually reports first).

Filter: a node without any zone or region label fits (upstream: it has no zone constraints);
otherwise the node's value of each constrained label must be among the PV's:
``node(s) had no available volume zone``, UnschedulableAndUnresolvable. Vectorized over the nodes.
"""

from __future__ import annotations

import numpy as np

from shardsched.api.objects import PodInfo
from shardsched.api.volumes import WAIT_FOR_FIRST_CONSUMER, ZONE_LABELS
from shardsched.cache.node_table import NodeTable
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import FilterPlugin, Index, index_len
from shardsched.framework.status import Status
from shardsched.plugins.helper.node_selector import requirement_mask
from shardsched.plugins.helper.volumes import pod_claims

NAME = "VolumeZone"
ERR_CONFLICT = "node(s) had no available volume zone"
_STATE = f"{NAME}/constraints"


class VolumeZone(FilterPlugin):
    name = NAME
    static = True  # node labels and the catalog (NodeTable.volume_generation drops cached results)
    unresolvable = True

    def pre_filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        if not pod.volumes.claims or table.volumes is None:  # no catalog: VolumeBinding holds the pod
            return Status.skip()
        catalog = table.volumes
        claims = pod_claims(pod, catalog, NAME)
        if isinstance(claims, Status):
            return claims
        constraints: list[tuple[str, tuple[str, ...]]] = []
        for claim in claims:
            if not claim.volume_name:
                if catalog.binding_mode(claim) == WAIT_FOR_FIRST_CONSUMER:
                    continue
                return Status.unschedulable("PersistentVolumeClaim had no pv name and storageClass name",
                                            plugin=NAME, resolvable=False)
            if claim.volume_name in catalog.invalid_pvs:
                continue  # VolumeBinding rejects every node for it
            pv = catalog.pvs.get(claim.volume_name)
            if pv is None:
                return Status.unschedulable("PersistentVolume not found", plugin=NAME, resolvable=False)
            for key in ZONE_LABELS:
                if key in pv.labels:
                    zones = tuple(sorted(z for z in pv.labels[key].split("__") if z))
                    constraints.append((key, zones))
        if not constraints:
            return Status.skip()
        state.write(_STATE, constraints)
        return Status.success()

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        size = index_len(idx, table.n)
        unconstrained = np.ones(size, bool)
        for key in ZONE_LABELS:
            unconstrained &= requirement_mask(table, (key, "DoesNotExist", ()), idx)
        ok = np.ones(size, bool)
        for key, zones in state.read(_STATE):
            ok &= requirement_mask(table, (key, "In", zones), idx)
        return ok | unconstrained

    def failure_reasons(self, state, pod, table, slots):
        return {ERR_CONFLICT: len(slots)}


def new(args=None) -> VolumeZone:
    return VolumeZone()
