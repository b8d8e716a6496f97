"""NodePorts: a node fits only if none of the pod's host ports is in use there (kube's NodePorts).

A port conflicts with a used one when protocol and port are equal and the host IPs overlap
(``0.0.0.0`` overlaps every IP); an empty hostIP means 0.0.0.0 and an empty protocol TCP.
"""

from __future__ import annotations

import numpy as np

from shardsched.api.objects import PodInfo
from shardsched.cache.node_table import NodeTable
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import FilterPlugin, Index
from shardsched.framework.status import Status

NAME = "NodePorts"
ERR_REASON = "node(s) didn't have free ports for the requested pod ports"


class NodePorts(FilterPlugin):
    name = NAME
    static = False

    def pre_filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        return Status.success() if pod.host_ports else Status.skip()

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        ok = np.ones(table.n, bool)
        for slot, used in table.used_ports.items():
            if any(p.conflicts(u) for p in pod.host_ports for u in used):
                ok[slot] = False
        return ok[idx]

    def filter_slot(self, state: CycleState, pod: PodInfo, table: NodeTable, slot: int) -> bool:
        used = table.used_ports.get(slot, ())
        return not any(p.conflicts(u) for p in pod.host_ports for u in used)

    def failure_reasons(self, state, pod, table, slots):
        return {ERR_REASON: len(slots)}

    def passes_without_pods(self, pod: PodInfo) -> bool:
        """Removing pods only frees ports."""
        return True


def new(args=None) -> NodePorts:
    return NodePorts()
