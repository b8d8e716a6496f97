"""NodeResourcesBalancedAllocation, as kube-scheduler's plugin of that name.

Score = (1 - std) * 100 truncated, where std is the population standard deviation of the fractions
requested/allocatable (each capped at 1) over the configured resources (default cpu and memory),
with the pod placed; actual requests are used (no non-zero defaults); resources the node lacks and
extended resources the pod does not request are left out. With two fractions std = |a - b| / 2.
"""

from __future__ import annotations

import math
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
        for _, alloc, req, all_have in self.scorer.columns(pod, table, idx):
            if all_have:
                fractions.append(np.minimum(req / alloc, 1.0))
                present.append(None)
            else:
                has = alloc > 0
                fractions.append(np.where(has, np.minimum(req / np.where(has, alloc, 1), 1.0), 0.0))
                present.append(has)
        if not fractions:
            return np.full(len(table.alloc[0, : table.n][idx]), MAX_NODE_SCORE, np.int64)
        if len(fractions) == 2:
            std = np.abs(fractions[0] - fractions[1]) / 2
            if present[0] is not None or present[1] is not None:
                both = (fractions[0] >= 0) if present[0] is None else present[0]
                if present[1] is not None:
                    both = both & present[1]
                std = np.where(both, std, 0.0)
        else:
            frac = np.vstack(fractions)
            pres = np.vstack([np.ones(frac.shape[1], bool) if p is None else p for p in present])
            count = pres.sum(axis=0)
            safe = np.maximum(count, 1)
            mean = frac.sum(axis=0) / safe
            std = np.sqrt((((frac - mean) ** 2) * pres).sum(axis=0) / safe)
            std = np.where(count > 1, std, 0.0)
        return ((1 - std) * MAX_NODE_SCORE).astype(np.int64)

    def score_slot(self, state: CycleState, pod: PodInfo, table: NodeTable, slot: int) -> int:
        fractions = [min(req / alloc, 1.0) for _, alloc, req in self.scorer.slot_columns(pod, table, slot) if alloc > 0]
        if len(fractions) == 2:
            std = abs((fractions[0] - fractions[1]) / 2)
        elif len(fractions) > 2:
            mean = sum(fractions) / len(fractions)
            std = math.sqrt(sum((f - mean) ** 2 for f in fractions) / len(fractions))
        else:
            std = 0.0
        return int((1 - std) * MAX_NODE_SCORE)


def new(args: Any = None) -> BalancedAllocation:
    resources = tuple((r.name, r.weight) for r in (getattr(args, "resources", None) or ())) if args else ()
    return BalancedAllocation(resources or DEFAULT_RESOURCES)
