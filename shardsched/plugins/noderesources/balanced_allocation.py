"""NodeResourcesBalancedAllocation, as kube-scheduler's plugin of that name.

Score = (1 - std) * 100 truncated, where std is the population standard deviation of the fractions
requested/allocatable (each capped at 1) over the configured resources (default cpu and memory),
with the pod placed; actual requests are used (no non-zero defaults); resources the node lacks and
extended resources the pod does not request are left out. With two fractions std = |a - b| / 2.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardsched.api.objects import PodInfo
from shardsched.cache.node_table import NodeTable
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import MAX_NODE_SCORE, Index, ScorePlugin
from shardsched.plugins.noderesources.fit import DEFAULT_RESOURCES, ResourceAllocationScorer

NAME = "NodeResourcesBalancedAllocation"


class BalancedAllocation(ScorePlugin):
    name = NAME
    static = False

    def __init__(self, resources=DEFAULT_RESOURCES) -> None:
        # weights do not matter for balance; kube ignores them here too
        self.scorer = ResourceAllocationScorer(tuple(resources), use_requested=True)

    def score(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        fractions, present = [], []
        for _, alloc, req in self.scorer.columns(pod, table, idx):
            has = alloc > 0
            f = np.minimum(req / np.where(has, alloc, 1), 1.0)
            fractions.append(np.where(has, f, 0.0))
            present.append(has)
        if not fractions:
            return np.full(len(table.alloc[0, : table.n][idx]), MAX_NODE_SCORE, np.int64)
        frac = np.vstack(fractions)
        pres = np.vstack(present)
        count = pres.sum(axis=0)
        safe = np.maximum(count, 1)
        mean = frac.sum(axis=0) / safe
        std = np.sqrt((((frac - mean) ** 2) * pres).sum(axis=0) / safe)
        if len(fractions) == 2:
            both = pres.all(axis=0)
            std = np.where(both, np.abs((frac[0] - frac[1]) / 2), std)
        std = np.where(count > 1, std, 0.0)
        return ((1 - std) * MAX_NODE_SCORE).astype(np.int64)


def new(args: Any = None) -> BalancedAllocation:
    resources = tuple((r.name, r.weight) for r in (getattr(args, "resources", None) or ())) if args else ()
    return BalancedAllocation(resources or DEFAULT_RESOURCES)
