"""NodeResourcesFit, as kube-scheduler's plugin of that name.

Filter (upstream ``fitsRequest``): the pod count must stay within the node's ``pods``; for every
resource the pod requests (> 0) the request must be <= allocatable - requested. Extended resources
listed in ``ignoredResources`` (or whose domain prefix is in ``ignoredResourceGroups``) are not
checked. Reasons: ``Too many pods``, ``Insufficient <resource>``.

Score: one of the scoring strategies, over the configured resources with weights (default cpu 1,
memory 1). cpu and memory use the non-zero requests (kube's 100m / 200 MiB defaults for containers
without a request) of the node's pods and of the pod; an extended resource the pod does not request
is left out; a resource the node does not have is left out of that node's weighted average:
- LeastAllocated: (allocatable - requested) * 100 / allocatable, 0 if requested > allocatable;
- MostAllocated: min(requested, allocatable) * 100 / allocatable;
- RequestedToCapacityRatio: a broken-linear function of utilization (requested * 100 /
  allocatable) through the configured shape points (score 0..10 scaled to 0..100), rounded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from shardsched.api.objects import PodInfo
from shardsched.api.quantity import CPU, MEMORY, PODS, is_extended, is_prefixed_native
from shardsched.cache.node_table import NodeTable
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import MAX_NODE_SCORE, FilterPlugin, Index, ResourceCheck, ScorePlugin
from shardsched.framework.status import Status

NAME = "NodeResourcesFit"
LEAST_ALLOCATED = "LeastAllocated"
MOST_ALLOCATED = "MostAllocated"
REQUESTED_TO_CAPACITY_RATIO = "RequestedToCapacityRatio"
#: kube's MaxCustomPriorityScore: shape scores are 0..10 and scaled to 0..100
MAX_CUSTOM_PRIORITY_SCORE = 10
DEFAULT_RESOURCES = ((CPU, 1), (MEMORY, 1))


def is_scalar(name: str) -> bool:
    """Resources kube scores only when the pod requests them (upstream IsScalarResourceName):
    extended, hugepages, ``*kubernetes.io/``-prefixed and attachable-volumes resources."""
    return (is_extended(name) or name.startswith("hugepages-") or is_prefixed_native(name)
            or name.startswith("attachable-volumes-"))


def insufficient_reason(resource: str) -> str:
    return "Too many pods" if resource == PODS else f"Insufficient {resource}"


@dataclass(frozen=True)
class _FitRequest:
    rows: tuple[int, ...]
    values: tuple[int, ...]
    names: tuple[str, ...]


def _trunc_div(num: np.ndarray, den: np.ndarray | int) -> np.ndarray:
    """Integer division truncating toward zero (Go's ``/`` on int64)."""
    q = np.abs(num) // np.abs(den)
    return np.where((num < 0) != (np.asarray(den) < 0), -q, q)


class ResourceAllocationScorer:
    """The shared part of NodeResourcesFit scoring and NodeResourcesBalancedAllocation
    (upstream ``resourceAllocationScorer``): per resource, allocatable and requested-after-placement
    arrays over the scored nodes."""

    def __init__(self, resources: tuple[tuple[str, int], ...], use_requested: bool) -> None:
        self.resources = resources
        #: False: cpu/memory use the non-zero (defaulted) requests, as NodeResourcesFit scoring;
        #: True: actual requests, as BalancedAllocation.
        self.use_requested = use_requested

    def pod_request(self, pod: PodInfo, name: str) -> int:
        if not self.use_requested and name == CPU:
            return pod.nonzero_cpu_milli
        if not self.use_requested and name == MEMORY:
            return pod.nonzero_memory_bytes
        return pod.requests.get(name, 0)

    def columns(self, pod: PodInfo, table: NodeTable, idx: Index):
        """Yield (weight, allocatable int64 array, requested-after int64 array, all_have) per scored
        resource; ``all_have`` is True when every node has some of it (no per-node guard needed)."""
        for name, weight in self.resources:
            req = self.pod_request(pod, name)
            if req == 0 and is_scalar(name):
                continue
            row = table.resource_row(name)
            alloc = table.alloc[row, : table.n][idx]
            if not self.use_requested and name in (CPU, MEMORY):
                used = table.nonzero_requested[0 if name == CPU else 1, : table.n][idx]
            else:
                used = table.requested[row, : table.n][idx]
            yield weight, alloc, used + req, table.all_have(row)


    def slot_columns(self, pod: PodInfo, table: NodeTable, slot: int):
        """Scalar `columns` for one slot: yield (weight, allocatable int, requested-after int)."""
        for name, weight in self.resources:
            req = self.pod_request(pod, name)
            if req == 0 and is_scalar(name):
                continue
            row = table.resource_row(name)
            if not self.use_requested and name in (CPU, MEMORY):
                used = table.nonzero_requested[0 if name == CPU else 1, slot]
            else:
                used = table.requested[row, slot]
            yield weight, int(table.alloc[row, slot]), int(used) + req


def _go_div(a: int, b: int) -> int:
    """Go's int64 division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q


class NodeResourcesFit(FilterPlugin, ScorePlugin):
    name = NAME
    static = False

    def __init__(self, strategy: str = LEAST_ALLOCATED, resources=DEFAULT_RESOURCES,
                 shape: tuple[tuple[int, int], ...] = (), ignored_resources: frozenset[str] = frozenset(),
                 ignored_groups: frozenset[str] = frozenset()) -> None:
        self.strategy = strategy
        self.scorer = ResourceAllocationScorer(tuple(resources), use_requested=False)
        self.shape = tuple((u, s * (MAX_NODE_SCORE // MAX_CUSTOM_PRIORITY_SCORE)) for u, s in shape)
        self.ignored_resources = ignored_resources
        self.ignored_groups = ignored_groups

    @property
    def packs(self) -> bool:
        """MostAllocated, or RequestedToCapacityRatio with a shape whose score rises from no
        utilization to full (kube's bin-packing example)."""
        if self.strategy == MOST_ALLOCATED:
            return True
        return (self.strategy == REQUESTED_TO_CAPACITY_RATIO and bool(self.shape)
                and self.shape[-1][1] > self.shape[0][1])

    # ------------------------------------------------------------ Filter
    def _ignored(self, name: str) -> bool:
        return is_extended(name) and (name in self.ignored_resources or name.split("/")[0] in self.ignored_groups)

    def pre_filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        names = tuple(n for n, v in pod.requests.items() if v > 0 and not self._ignored(n))
        rows = tuple(table.resource_row(n) for n in names)
        state.write(NAME + "/request", _FitRequest(rows, tuple(pod.requests[n] for n in names), names))
        return Status.success()

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        fr: _FitRequest = state.read(NAME + "/request")
        n = table.n
        mask = None
        for row, value in zip(fr.rows, fr.values):
            ok = (table.alloc[row, :n][idx] - table.requested[row, :n][idx]) >= value
            mask = ok if mask is None else mask & ok
        return mask

    def filter_slot(self, state: CycleState, pod: PodInfo, table: NodeTable, slot: int) -> bool:
        fr: _FitRequest = state.read(NAME + "/request")
        alloc, used = table.alloc, table.requested
        for row, value in zip(fr.rows, fr.values):
            if alloc[row, slot] - used[row, slot] < value:
                return False
        return True

    def resource_check(self, state: CycleState) -> ResourceCheck:
        """The pod's non-zero requests that are not ignored, ``pods`` included (the Filter's
        whole check)."""
        fr: _FitRequest = state.read(NAME + "/request")
        return ResourceCheck(fr.rows, fr.values, tuple(map(insufficient_reason, fr.names)))

    def passes_without_pods(self, pod: PodInfo) -> bool:
        return True

    def failure_reasons(self, state, pod, table, slots):
        fr: _FitRequest = state.read(NAME + "/request")
        out = {}
        for row, value, name in zip(fr.rows, fr.values, fr.names):
            bad = int(((table.alloc[row, slots] - table.requested[row, slots]) < value).sum())
            if bad:
                out[insufficient_reason(name)] = bad
        return out

    # ------------------------------------------------------------ Score
    def score(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        total = weights = None
        uniform_weights = 0  # sum of weights while every node has every resource (the common case)
        rtcr = self.strategy == REQUESTED_TO_CAPACITY_RATIO
        for weight, alloc, req, all_have in self.scorer.columns(pod, table, idx):
            has = None if all_have else alloc > 0
            safe = alloc if all_have else np.where(has, alloc, 1)
            if self.strategy == LEAST_ALLOCATED:
                s = np.maximum(alloc - req, 0) * MAX_NODE_SCORE // safe
            elif self.strategy == MOST_ALLOCATED:
                s = np.minimum(req, alloc) * MAX_NODE_SCORE // safe
            else:
                s = self._broken_linear(np.where(req > alloc, 100, req * 100 // safe))
            if all_have and not rtcr and weights is None:
                s = s * weight if weight != 1 else s
                uniform_weights += weight
            else:
                has = alloc > 0 if has is None else has
                counted = has & (s > 0) if rtcr else has
                s = np.where(counted, s * weight, 0)
                w = counted * weight
                weights = w if weights is None else weights + w
            total = s if total is None else total + s
        if total is None:
            return np.zeros(len(table.alloc[0, : table.n][idx]), np.int64)
        if weights is None:
            return total // uniform_weights
        weights = weights + uniform_weights
        safe_w = np.where(weights > 0, weights, 1)
        if rtcr:
            return np.where(weights > 0, np.floor(total / safe_w + 0.5).astype(np.int64), 0)
        return np.where(weights > 0, total // safe_w, 0)

    def score_slot(self, state: CycleState, pod: PodInfo, table: NodeTable, slot: int) -> int:
        total = weights = 0
        for weight, alloc, req in self.scorer.slot_columns(pod, table, slot):
            if alloc <= 0:
                continue
            if self.strategy == LEAST_ALLOCATED:
                s = 0 if req > alloc else (alloc - req) * MAX_NODE_SCORE // alloc
            elif self.strategy == MOST_ALLOCATED:
                s = min(req, alloc) * MAX_NODE_SCORE // alloc
            else:
                s = self._broken_linear_one(100 if req > alloc else req * 100 // alloc)
                if s <= 0:
                    continue
            total += s * weight
            weights += weight
        if weights == 0:
            return 0
        if self.strategy == REQUESTED_TO_CAPACITY_RATIO:
            return int(np.floor(total / weights + 0.5))
        return total // weights

    def _broken_linear_one(self, p: int) -> int:
        """Scalar `_broken_linear`."""
        shape = self.shape
        for i, (u, s) in enumerate(shape):
            if p <= u:
                if i == 0:
                    return s
                u0, s0 = shape[i - 1]
                return s0 + _go_div((s - s0) * (p - u0), u - u0)
        return shape[-1][1]

    def _broken_linear(self, p: np.ndarray) -> np.ndarray:
        """Upstream ``BuildBrokenLinearFunction`` over int64 utilization in [0, 100]."""
        shape = self.shape
        out = np.full(p.shape, shape[-1][1], np.int64)
        done = np.zeros(p.shape, bool)
        for i, (u, s) in enumerate(shape):
            hit = ~done & (p <= u)
            if i == 0:
                val = np.full(p.shape, s, np.int64)
            else:
                u0, s0 = shape[i - 1]
                val = s0 + _trunc_div((s - s0) * (p - u0), u - u0)
            out = np.where(hit, val, out)
            done |= hit
        return out


def new(args: Any = None) -> NodeResourcesFit:
    """Factory from NodeResourcesFitArgs (None = kube's defaults: LeastAllocated on cpu and memory)."""
    if args is None:
        return NodeResourcesFit()
    ss = getattr(args, "scoring_strategy", None)
    strategy = getattr(ss, "type", None) or LEAST_ALLOCATED
    resources = tuple((r.name, r.weight) for r in (getattr(ss, "resources", None) or ())) or DEFAULT_RESOURCES
    shape: tuple[tuple[int, int], ...] = ()
    rtcr = getattr(ss, "requested_to_capacity_ratio", None)
    if rtcr is not None:
        shape = tuple((p.utilization, p.score) for p in rtcr.shape)
    return NodeResourcesFit(
        strategy, resources, shape,
        frozenset(getattr(args, "ignored_resources", None) or ()),
        frozenset(getattr(args, "ignored_resource_groups", None) or ()),
    )
