"""NodeName: a pod that names a node in ``spec.nodeName`` fits only that node (kube's NodeName)."""

from __future__ import annotations

import numpy as np

from shardsched.api.objects import PodInfo
from shardsched.cache.node_table import NodeTable
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import FilterPlugin, Index
from shardsched.framework.status import Status

NAME = "NodeName"
ERR_REASON = "node(s) didn't match the requested node name"


class NodeName(FilterPlugin):
    unresolvable = True  # as upstream: UnschedulableAndUnresolvable
    name = NAME

    def pre_filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        return Status.success() if pod.node_name else Status.skip()

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        hit = np.zeros(table.n, bool)
        slot = table.index.get(pod.node_name)
        if slot is not None:
            hit[slot] = True
        return hit[idx]

    def failure_reasons(self, state, pod, table, slots):
        return {ERR_REASON: len(slots)}


def new(args=None) -> NodeName:
    return NodeName()
