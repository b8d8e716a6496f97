"""The vectorized plugin interfaces of shardsched's scheduling framework.

These follow kube-scheduler's extension points (PreEnqueue, QueueSort, PreFilter, Filter, PreScore,
Score, NormalizeScore, Reserve, Permit, Bind) with one difference: a Filter or Score call covers
many nodes at once. ``idx`` selects NodeTable slots: a ``slice`` (usually all slots
``slice(0, table.n)``) or an int array of slots (to recompute only the nodes that changed since a
cached result).

- Filter returns a bool array, True where the node passes, shape = len(idx).
- Score returns an int64 array in [0, 100], shape = len(idx).
- NormalizeScore maps the raw scores of the feasible nodes to [0, 100].

A plugin that is ``static`` depends only on static node attributes (labels, taints, cordon, names),
so its result for a pod signature stays valid until ``NodeTable.static_generation`` changes.

A plugin that is ``topology`` (InterPodAffinity, PodTopologySpread) depends on the pods of other
nodes too: a pod placed on one node changes its result on every node of the same topology domain.
Its results are recomputed over all nodes whenever any node changes, and its scores are normalized
over the feasible nodes of each decision; what it reads of the pods already placed is tracked by
``NodeTable.affinity_generation``.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from shardsched.api.objects import PodInfo
from shardsched.cache.node_table import NodeTable
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.status import Status

Index = slice | np.ndarray

MAX_NODE_SCORE = 100
MIN_NODE_SCORE = 0


def index_len(idx: Index, n: int) -> int:
    """Number of slots selected by idx (a slice over [0, n) or an int array)."""
    if isinstance(idx, slice):
        return len(range(*idx.indices(n)))
    return len(idx)


class Plugin:
    """Base of every plugin: a kube-style ``name`` class constant."""

    name: ClassVar[str] = ""
    #: True if results depend on the pods of other nodes (module docstring)
    topology: ClassVar[bool] = False


class PreEnqueuePlugin(Plugin):
    def pre_enqueue(self, pod: PodInfo) -> Status:
        """Success if the pod may enter the scheduling queue now; otherwise it waits (gated) until
        an update of the pod lets every PreEnqueue plugin pass (upstream ``PreEnqueue``)."""
        raise NotImplementedError


class PreFilterPlugin(Plugin):
    def pre_filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        """Compute per-pod data once. Return Skip when Filter has nothing to check for this pod; a
        rejection (Unschedulable, UnschedulableAndUnresolvable) rejects the pod on every node."""
        return Status.success()


class QueueSortPlugin(Plugin):
    def sort_key(self, pod: PodInfo, timestamp: float, seq: int) -> tuple:
        """Ordering key; smaller pops first."""
        raise NotImplementedError


class FilterPlugin(PreFilterPlugin):
    #: True if the result depends only on static node attributes (see module docstring)
    static: ClassVar[bool] = True
    #: the code of this plugin's rejections: True = UnschedulableAndUnresolvable (removing pods from
    #: the node cannot help, so preemption skips it), False = Unschedulable; `unresolvable_mask`
    #: refines it per node for plugins whose reasons differ
    unresolvable: ClassVar[bool] = False

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        """bool array over idx: True where the node passes."""
        raise NotImplementedError

    def filter_slot(self, state: CycleState, pod: PodInfo, table: NodeTable, slot: int) -> bool:
        """Filter for one slot. Dynamic plugins override it with a scalar version (the cached path
        recomputes one node per placed pod, where numpy's per-call cost dominates); the tests check
        that it agrees with `filter`."""
        return bool(self.filter(state, pod, table, np.array([slot]))[0])

    def failure_reasons(self, state: CycleState, pod: PodInfo, table: NodeTable, slots: np.ndarray) -> dict[str, int]:
        """For nodes (``slots``) that this plugin rejected: reason -> number of nodes.

        Only called on the failure path, to build the ``0/N nodes are available`` message; a node
        may count under several reasons (e.g. Insufficient cpu and Insufficient memory).
        """
        raise NotImplementedError

    def unresolvable_mask(self, state: CycleState, pod: PodInfo, table: NodeTable, slots: np.ndarray) -> np.ndarray:
        """For nodes (``slots``) that this plugin rejected: bool array, shape (len(slots),), True where
        the rejection is UnschedulableAndUnresolvable (upstream's per-reason codes). Only called on
        the failure path."""
        return np.full(len(slots), self.unresolvable)


class ScorePlugin(Plugin):
    static: ClassVar[bool] = False
    #: whether `normalize` must be applied to the raw scores of the feasible nodes
    normalizes: ClassVar[bool] = False

    def pre_score(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        """Compute per-pod data once. Return Skip when this plugin scores every node the same."""
        return Status.success()

    def score(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        """int64 array over idx (raw score; in [0, 100] unless the plugin normalizes)."""
        raise NotImplementedError

    def score_slot(self, state: CycleState, pod: PodInfo, table: NodeTable, slot: int) -> int:
        """Score of one slot; dynamic plugins override it with a scalar version (see
        `FilterPlugin.filter_slot`)."""
        return int(self.score(state, pod, table, np.array([slot]))[0])

    def normalize(self, state: CycleState, pod: PodInfo, raw: np.ndarray) -> np.ndarray:
        """Map raw scores of the feasible nodes (int64 array) to [0, 100]."""
        return raw


class BindPlugin(Plugin):
    """Marker for the Bind extension point; the runtime performs the API write."""


def default_normalize(raw: np.ndarray, reverse: bool) -> np.ndarray:
    """kube's ``helper.DefaultNormalizeScore``: scale to [0, 100] by the maximum; reverse = 100 - s.

    int64 array in, int64 array out (same shape). With a maximum of 0: all 0, or all 100 if reverse.
    """
    if raw.size == 0:
        return raw
    top = int(raw.max())
    if top == 0:
        return np.full_like(raw, MAX_NODE_SCORE if reverse else 0)
    out = raw * MAX_NODE_SCORE // top
    return MAX_NODE_SCORE - out if reverse else out
