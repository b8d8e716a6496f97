"""NodeLabel: Filter and Score nodes by the label keys they have, as kube-scheduler's NodeLabel
plugin of v1.22 (pkg/scheduler/framework/plugins/nodelabel; upstream removed it in v1.23, since
NodeAffinity says the same per pod). It is the worked example of docs/plugins.md: one Filter and
one Score, vectorized over the NodeTable, with validated args (`shardsched.config.args.NodeLabelArgs`).
Not in the default profile; enable it in a profile (deploy/config/node-label.yaml).

- Filter: a node passes when it has every key of ``presentLabels`` and none of ``absentLabels``
  (keys only; values are not compared). The others are rejected as UnschedulableAndUnresolvable,
  ``node(s) didn't have the requested labels`` (upstream's ErrReasonPresenceViolated).
- Score: per node, 100 for each key of ``presentLabelsPreference`` it has and for each key of
  ``absentLabelsPreference`` it lacks, divided (integer division) by the number of keys of both
  lists: an int in [0, 100], as upstream. PreScore skips it when both lists are empty.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardsched.api.objects import PodInfo
from shardsched.cache.node_table import NodeTable
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import MAX_NODE_SCORE, FilterPlugin, Index, ScorePlugin
from shardsched.framework.status import Status

NAME = "NodeLabel"
ERR_REASON = "node(s) didn't have the requested labels"


def _has(table: NodeTable, key: str) -> np.ndarray:
    """bool array of shape (table.n,): True where the node has label ``key`` (any value)."""
    return table.topology_codes(key) >= 0


class NodeLabel(FilterPlugin, ScorePlugin):
    """The plugin (module docstring). Both results depend on node labels only, hence ``static``:
    the scheduler caches them per pod signature until a node's labels change."""

    name = NAME
    static = True
    unresolvable = True  # as upstream: removing pods from a node does not give it a label

    def __init__(self, present: tuple[str, ...] = (), absent: tuple[str, ...] = (),
                 present_preference: tuple[str, ...] = (), absent_preference: tuple[str, ...] = ()) -> None:
        self.present, self.absent = present, absent
        self.present_preference, self.absent_preference = present_preference, absent_preference

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        ok = np.ones(table.n, bool)
        for key in self.present:
            ok &= _has(table, key)
        for key in self.absent:
            ok &= ~_has(table, key)
        return ok[idx]

    def failure_reasons(self, state, pod, table, slots):
        return {ERR_REASON: len(slots)}

    def pre_score(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        return Status.success() if self.present_preference or self.absent_preference else Status.skip()

    def score(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        total = np.zeros(table.n, np.int64)
        for key in self.present_preference:
            total += np.where(_has(table, key), MAX_NODE_SCORE, 0)
        for key in self.absent_preference:
            total += np.where(_has(table, key), 0, MAX_NODE_SCORE)
        return (total // (len(self.present_preference) + len(self.absent_preference)))[idx]


def new(args: Any = None) -> NodeLabel:
    """Factory: ``args`` is a validated `NodeLabelArgs` (the profile's pluginConfig), or None for
    none of the four lists (the Filter passes every node, the Score is skipped)."""
    if args is None:
        return NodeLabel()
    return NodeLabel(tuple(args.present_labels), tuple(args.absent_labels),
                     tuple(args.present_labels_preference), tuple(args.absent_labels_preference))
