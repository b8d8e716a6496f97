"""What the volume plugins share: a pod's claims looked up in the table's `VolumeCatalog`, with
kube's PreFilter rejections, and the vectorized node masks of a PV's node affinity and of a label
selector over node labels."""

from __future__ import annotations

import numpy as np

from shardsched.api.objects import PodInfo
from shardsched.api.podaffinity import LabelSelector
from shardsched.api.volumes import PersistentVolume, PersistentVolumeClaim, VolumeCatalog
from shardsched.cache.node_table import NodeTable
from shardsched.framework.interface import Index, index_len
from shardsched.framework.status import Status
from shardsched.plugins.helper.node_selector import requirement_mask, selector_mask, terms_mask


def no_catalog(plugin: str, what: str) -> Status:
    """The rejection of a pod whose volumes need the cluster's storage objects where the scheduler
    keeps none (the sharded runtime, so far): UnschedulableAndUnresolvable, so the pod stays
    pending instead of being placed in breach of the rule."""
    return Status.unschedulable(f"pod has {what}, which shardsched does not check in this runtime yet "
                                f"(plugin {plugin})", plugin=plugin, resolvable=False)


def pod_claims(pod: PodInfo, catalog: VolumeCatalog, plugin: str) -> list[PersistentVolumeClaim] | Status:
    """The pod's claims (`PodVolumes.claims`) from the catalog, in order; or the PreFilter rejection
    upstream gives (UnschedulableAndUnresolvable): ``persistentvolumeclaim "<name>" not found``,
    ``persistentvolumeclaim "<name>" is being deleted``, or an ephemeral volume's claim that the pod
    does not own (``PVC <ns>/<name> was not created for pod <ns>/<pod> (pod is not owner)``)."""
    out = []
    for name in pod.volumes.claims:
        claim = catalog.claim(pod.namespace, name)
        if claim is None:
            return Status.unschedulable(f'persistentvolumeclaim "{name}" not found', plugin=plugin, resolvable=False)
        if claim.deleting:
            return Status.unschedulable(f'persistentvolumeclaim "{name}" is being deleted', plugin=plugin,
                                        resolvable=False)
        if name in pod.volumes.ephemeral and pod.uid not in claim.owner_uids:
            return Status.unschedulable(f"PVC {claim.key} was not created for pod {pod.key} (pod is not owner)",
                                        plugin=plugin, resolvable=False)
        out.append(claim)
    return out


def pv_node_mask(table: NodeTable, pv: PersistentVolume, idx: Index) -> np.ndarray:
    """bool array over idx: the nodes the PV's node affinity admits (every node without one;
    upstream ``CheckNodeAffinity``)."""
    if pv.node_affinity is None:
        return np.ones(index_len(idx, table.n), bool)
    return terms_mask(table, pv.node_affinity, idx)


def label_selector_mask(table: NodeTable, selector: LabelSelector | None, idx: Index) -> np.ndarray:
    """bool array over idx: the nodes whose labels a label selector matches (None: no node; the
    empty selector: every node)."""
    if selector is None:
        return np.zeros(index_len(idx, table.n), bool)
    mask = selector_mask(table, dict(selector.match_labels), idx)
    for req in selector.match_expressions:
        mask &= requirement_mask(table, req, idx)
    return mask
