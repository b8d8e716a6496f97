"""NodeUnschedulable: filters out cordoned nodes (``spec.unschedulable``), as kube-scheduler's
plugin of that name; a pod tolerating ``node.kubernetes.io/unschedulable:NoSchedule`` passes."""

from __future__ import annotations

import numpy as np

from shardsched.api.objects import UNSCHEDULABLE_TAINT_KEY, PodInfo, Taint
from shardsched.cache.node_table import NodeTable
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import FilterPlugin, Index, index_len

NAME = "NodeUnschedulable"
ERR_REASON = "node(s) were unschedulable"
_TAINT = Taint(UNSCHEDULABLE_TAINT_KEY, "", "NoSchedule")


class NodeUnschedulable(FilterPlugin):
    unresolvable = True  # as upstream: UnschedulableAndUnresolvable
    name = NAME

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        if any(t.tolerates(_TAINT) for t in pod.tolerations):
            return np.ones(index_len(idx, table.n), bool)
        return ~table.unschedulable[: table.n][idx]

    def failure_reasons(self, state, pod, table, slots):
        return {ERR_REASON: len(slots)}


def new(args=None) -> NodeUnschedulable:
    return NodeUnschedulable()
