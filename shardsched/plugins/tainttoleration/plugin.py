"""TaintToleration, as kube-scheduler's plugin of that name.

Filter: a node fails if it has a NoSchedule or NoExecute taint that no toleration of the pod
tolerates. Score: the number of PreferNoSchedule taints not tolerated by the pod's tolerations whose
effect is PreferNoSchedule or empty; NormalizeScore reverses it (fewest untolerated = 100).
"""

from __future__ import annotations

import numpy as np

from shardsched.api.objects import PodInfo, Taint, Toleration
from shardsched.cache.node_table import NodeTable
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import FilterPlugin, Index, ScorePlugin, default_normalize
from shardsched.framework.status import Status

NAME = "TaintToleration"
_FILTER_EFFECTS = ("NoSchedule", "NoExecute")


def _untolerated(taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...], effects) -> list[Taint]:
    return [t for t in taints if t.effect in effects and not any(tol.tolerates(t) for tol in tolerations)]


def reason_for(taint: Taint) -> str:
    """kube-scheduler's message for an untolerated taint: ``node(s) had untolerated taint {key: value}``."""
    return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"


class TaintToleration(FilterPlugin, ScorePlugin):
    name = NAME
    static = True
    normalizes = True

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        ok = np.array([not _untolerated(ts, pod.tolerations, _FILTER_EFFECTS) for ts in table.taint_sets], bool)
        return ok[table.taint_set_id[: table.n][idx]]

    def failure_reasons(self, state, pod, table, slots):
        out: dict[str, int] = {}
        for slot in slots:
            bad = _untolerated(table.taint_sets[table.taint_set_id[slot]], pod.tolerations, _FILTER_EFFECTS)
            reason = reason_for(bad[0])
            out[reason] = out.get(reason, 0) + 1
        return out

    def pre_score(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        prefer = tuple(t for t in pod.tolerations if t.effect in ("", "PreferNoSchedule"))
        counts = np.array([len(_untolerated(ts, prefer, ("PreferNoSchedule",))) for ts in table.taint_sets], np.int64)
        if not counts.any():
            return Status.skip()
        state.write(NAME + "/counts", counts)
        return Status.success()

    def score(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        return state.read(NAME + "/counts")[table.taint_set_id[: table.n][idx]]

    def normalize(self, state: CycleState, pod: PodInfo, raw: np.ndarray) -> np.ndarray:
        return default_normalize(raw, reverse=True)


def new(args=None) -> TaintToleration:
    return TaintToleration()
