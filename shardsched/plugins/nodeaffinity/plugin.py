"""NodeAffinity, as kube-scheduler's plugin of that name.

Filter: the node must carry every ``nodeSelector`` label AND match the required node affinity
(terms ORed, expressions ANDed, an empty term matches nothing) AND the profile's ``addedAffinity``.
Score: sum of the weights of the preferred terms the node matches (pod's and addedAffinity's);
NormalizeScore scales by the maximum (kube's DefaultNormalizeScore, not reversed).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from shardsched.api.objects import PodInfo, SelectorTerm, parse_node_affinity
from shardsched.cache.node_table import NodeTable
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import FilterPlugin, Index, ScorePlugin, default_normalize_score
from shardsched.framework.status import Status
from shardsched.plugins.helper.node_selector import selector_mask, term_mask, terms_mask

NAME = "NodeAffinity"
ERR_REASON = "node(s) didn't match Pod's node affinity/selector"
#: upstream errReasonEnforced: the node fails the profile's addedAffinity (checked first)
ERR_REASON_ENFORCED = "node(s) didn't match scheduler-enforced node affinity"


class NodeAffinity(FilterPlugin, ScorePlugin):
    unresolvable = True  # as upstream: UnschedulableAndUnresolvable
    name = NAME
    static = True
    normalizes = True

    def __init__(self, added_required: tuple[SelectorTerm, ...] | None = None,
                 added_preferred: tuple[tuple[int, SelectorTerm], ...] = ()) -> None:
        self.added_required = added_required
        self.added_preferred = added_preferred

    def pre_filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        if not pod.node_selector and pod.required_terms is None and self.added_required is None:
            return Status.skip()
        return Status.success()

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        mask = selector_mask(table, pod.node_selector, idx)
        if pod.required_terms is not None:
            mask &= terms_mask(table, pod.required_terms, idx)
        if self.added_required is not None:
            mask &= terms_mask(table, self.added_required, idx)
        return mask

    def failure_reasons(self, state, pod, table, slots):
        enforced = 0 if self.added_required is None else int((~terms_mask(table, self.added_required, slots)).sum())
        return {r: c for r, c in ((ERR_REASON_ENFORCED, enforced), (ERR_REASON, len(slots) - enforced)) if c}

    def pre_score(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        terms = pod.preferred_terms + self.added_preferred
        if not any(not t.empty for _, t in terms):
            return Status.skip()
        state.write(NAME + "/preferred", terms)
        return Status.success()

    def score(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        total = None
        for weight, term in state.read(NAME + "/preferred"):
            if term.empty:  # an empty preferred term matches nothing (it is a no-op), as upstream
                continue
            part = term_mask(table, term, idx).astype(np.int64) * weight
            total = part if total is None else total + part
        return total

    def normalize_score(self, state: CycleState, pod: PodInfo, raw: np.ndarray) -> np.ndarray:
        return default_normalize_score(raw, reverse=False)


def new(args: Any = None) -> NodeAffinity:
    """Factory; ``args.added_affinity`` (a NodeAffinity object as a dict) is applied to every pod.

    Raises:
        InvalidObjectError: addedAffinity is malformed.
    """
    added: Mapping | None = getattr(args, "added_affinity", None) if args is not None else None
    if not added:
        return NodeAffinity()
    required, preferred = parse_node_affinity(added, "addedAffinity")
    return NodeAffinity(required, preferred)
