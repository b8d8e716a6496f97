"""TaintToleration, as kube-scheduler's plugin of that name.

Filter: a node fails if it has a NoSchedule or NoExecute taint that no toleration of the pod
tolerates. Score: the number of PreferNoSchedule taints not tolerated by the pod's tolerations whose
effect is PreferNoSchedule or empty; NormalizeScore reverses it (fewest untolerated = 100).
"""

from __future__ import annotations

import weakref

import numpy as np

from shardsched.api.objects import PodInfo, Taint, Toleration
from shardsched.cache.node_table import NodeTable
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import FilterPlugin, Index, ScorePlugin, default_normalize_score
from shardsched.framework.status import Status

NAME = "TaintToleration"
_FILTER_EFFECTS = ("NoSchedule", "NoExecute")


def _untolerated(taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...], effects) -> list[Taint]:
    return [t for t in taints if t.effect in effects and not any(tol.tolerates(t) for tol in tolerations)]


def reason_for(taint: Taint) -> str:
    """kube-scheduler's message for an untolerated taint: ``node(s) had untolerated taint {key: value}``."""
    return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"


class TaintToleration(FilterPlugin, ScorePlugin):
    unresolvable = True  # as upstream: UnschedulableAndUnresolvable
    name = NAME
    static = True
    normalizes = True

    def __init__(self) -> None:
        # per table (weakly: a table's id can be reused after it is freed): tolerations -> per taint
        # set, passes the filter; ('prefer', tolerations) -> per taint set, untolerated
        # PreferNoSchedule count. A table's taint sets are only ever appended.
        self._ok_cache: weakref.WeakKeyDictionary[NodeTable, dict[tuple, np.ndarray]] = weakref.WeakKeyDictionary()

    def _table_cache(self, table: NodeTable) -> dict[tuple, np.ndarray]:
        cache = self._ok_cache.get(table)
        if cache is None or len(cache) > 1024:
            cache = self._ok_cache[table] = {}
        return cache

    def _ok_per_set(self, tolerations: tuple[Toleration, ...], table: NodeTable) -> np.ndarray:
        cache = self._table_cache(table)
        ok = cache.get(tolerations)
        if ok is None or len(ok) != len(table.taint_sets):
            ok = np.array([not _untolerated(ts, tolerations, _FILTER_EFFECTS) for ts in table.taint_sets], bool)
            cache[tolerations] = ok
        return ok

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        if len(table.taint_sets) == 1:  # no node has a taint
            return np.ones(len(table.taint_set_id[: table.n][idx]), bool)
        return self._ok_per_set(pod.tolerations, table)[table.taint_set_id[: table.n][idx]]

    def failure_reasons(self, state, pod, table, slots):
        out: dict[str, int] = {}
        per_set = np.bincount(table.taint_set_id[slots], minlength=len(table.taint_sets))
        for set_id in np.flatnonzero(per_set):
            bad = _untolerated(table.taint_sets[set_id], pod.tolerations, _FILTER_EFFECTS)
            reason = reason_for(bad[0])
            out[reason] = out.get(reason, 0) + int(per_set[set_id])
        return out

    def pre_score(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        if len(table.taint_sets) == 1:  # no node has a taint
            return Status.skip()
        prefer = tuple(t for t in pod.tolerations if t.effect in ("", "PreferNoSchedule"))
        cache = self._table_cache(table)
        counts = cache.get(("prefer", prefer))
        if counts is None or len(counts) != len(table.taint_sets):
            counts = np.array([len(_untolerated(ts, prefer, ("PreferNoSchedule",))) for ts in table.taint_sets], np.int64)
            cache[("prefer", prefer)] = counts
        if not counts.any():
            return Status.skip()
        state.write(NAME + "/counts", counts)
        return Status.success()

    def score(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        return state.read(NAME + "/counts")[table.taint_set_id[: table.n][idx]]

    def normalize_score(self, state: CycleState, pod: PodInfo, raw: np.ndarray) -> np.ndarray:
        return default_normalize_score(raw, reverse=True)


def new(args=None) -> TaintToleration:
    return TaintToleration()
