"""One victim search shared by the preemptors of one spec (DefaultPreemption).

When many pods of one spec fail together (a burst of high-priority pods on a full cluster, as in
scheduler_perf's PreemptionBasic), each PostFilter would evaluate the same nodes again: classify
every node (`search.classify`) and reprieve hundreds of candidates (`search.reprieve`), although
the one before changed one node. `SharedSearch` keeps, per pod signature (the spec, the priority),
the evaluation of every node of the table: its kind, and on a candidate its victims and the
columns upstream's node order reads. At the next PostFilter of that signature only the nodes whose
pods changed since (the table's change log) are evaluated again; the rest is read.

What each PostFilter still does itself is upstream's: it draws its own random offset (as upstream
does per pod, from the handle's source, so the draws are those of the search without sharing), looks
at the nodes from there until it has ``max(n * minCandidateNodesPercentage / 100,
minCandidateNodesAbsolute)`` candidates with at least one without PDB violations, and picks among
those by ``pickOneNodeForPreemption``. So every decision is the one the unshared search makes over
the same table, preemptor after preemptor (the tests compare them on random clusters).

The evaluation of a node is reused only while it is known to depend on that node alone:

- the pod's Filters are node-local: no topology plugin took part in its decision
  (`PostFilterHandle.node_local`: pod affinity or anti-affinity, its own or existing pods', and
  topology spread depend on other nodes' pods), and the table's static, affinity and volume
  generations, its size, and the PodDisruptionBudgets are the same as when it was computed;
- the search is vectorized for the signature (one resource Filter, the others pass without
  pods, no GPU device check: a GPU preemptor under GPUDevice takes the unshared search); a node the search would evaluate with the per-node search (EXACT) before it stops sends
  the whole PostFilter to the unshared search.

Anything else (a trimmed change log, the pod columns rebuilt, more than a quarter of the nodes
changed, when that is more than 64) evaluates every node again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardsched.api.objects import POD_GROUP_LABEL, PodInfo
from shardsched.cache.node_table import PodUsage
from shardsched.framework.interface import PostFilterHandle
from shardsched.plugins.defaultpreemption import search

#: signatures kept (the oldest dropped first)
MAX_SIGNATURES = 64


@dataclass(slots=True)
class _Evaluation:
    """Every node of one table for one signature, by slot [0, n) (module docstring).

    ``plan``: `search.classify` over every slot (``order`` = ``arange(n)``); a FEASIBLE node whose
    reprieve found no victim is EXACT here. ``victims`` ... ``earliest``: `search.Reprieved`'s
    columns per slot (read on FEASIBLE slots); ``part``/``at``: where the slot's victim rows are
    (``parts[part[slot]]``, entry ``at[slot]``)."""

    token: tuple
    position: int
    columns_generation: int
    plan: search.Plan
    victims: np.ndarray
    violations: np.ndarray
    first_priority: np.ndarray
    priority_sum: np.ndarray
    earliest: np.ndarray
    part: np.ndarray
    at: np.ndarray
    parts: list[search.Reprieved]


@dataclass(slots=True)
class Window:
    """What one PostFilter found over the shared evaluation: the candidates, in the order looked
    at (``positions`` in the PostFilter's ``order``, ``slots`` their table slots, ``columns`` what
    `plugin.pick_best` reads: violations, first priority, priority sum, victims, earliest start of
    the highest-priority victims), and the nodes looked at without a candidate: ``no_victims`` of
    them hold no pod of lower priority, ``no_fit`` are those where the pod does not fit even with
    them all gone (``short``: how many of them fall short per reason of the resource Filter)."""

    positions: np.ndarray
    slots: np.ndarray
    columns: tuple[np.ndarray, ...]
    no_victims: int
    short: dict[str, int]
    no_fit: int


class SharedSearch:
    """The evaluations per signature (module docstring); one per plugin instance."""

    def __init__(self) -> None:
        self._evaluations: dict[tuple, _Evaluation] = {}
        #: signatures found not shareable, with the token and log position then: not tried again
        #: until the table changes
        self._not_shareable: dict[tuple, tuple] = {}
        #: PostFilters answered from an evaluation; evaluations of every node made for them
        self.reads = self.evaluations = 0

    @staticmethod
    def _key(pod: PodInfo) -> tuple:
        # the scheduler's own cache key (the spec; the PodGroup label, which other pods' terms may
        # read) and the priority, which decides the victims
        return pod.spec_signature, pod.labels.get(POD_GROUP_LABEL), pod.priority

    @staticmethod
    def _token(pod: PodInfo, handle: PostFilterHandle) -> tuple:
        t = handle.table
        return (id(t), t.static_generation, t.n, t.affinity_generation,
                None if pod.volumes.empty else t.volume_generation, tuple(handle.pdbs))

    def window(self, pod: PodInfo, handle: PostFilterHandle, order: np.ndarray, want: int,
               members: search.PdbMembers) -> Window | None:
        """Upstream ``DryRunPreemption`` over the nodes of ``order`` (table slots, from the pod's
        offset) read from the shared evaluation: the candidates found before the walk stops and the
        reasons of the nodes looked at without one. None when it cannot answer (module docstring):
        the caller searches without it."""
        if not handle.node_local(pod):
            return None
        e = self._current(pod, handle, members)
        if e is None:
            return None
        kind = e.plan.kind[order]
        producers = np.flatnonzero(kind >= search.EXACT)
        slots = order[producers]
        clean = np.cumsum(e.violations[slots] == 0)
        hit = np.flatnonzero((clean > 0) & (np.arange(1, len(producers) + 1) >= want))
        if len(hit):
            producers, slots = producers[: hit[0] + 1], slots[: hit[0] + 1]
            stop = int(producers[-1]) + 1
        else:
            stop = len(order)
        if (kind[producers] == search.EXACT).any():
            return None
        looked = kind[:stop]
        no_fit = looked == search.NO_FIT
        short: dict[str, int] = {}
        if no_fit.any():
            counts = e.plan.short[:, order[:stop][no_fit]].sum(axis=1).tolist()
            for reason, c in zip(e.plan.check.reasons, counts):
                if c:
                    short[reason] = short.get(reason, 0) + c
        columns = (e.violations[slots], e.first_priority[slots], e.priority_sum[slots], e.victims[slots],
                   e.earliest[slots])
        self.reads += 1
        return Window(producers, slots, columns, int((looked == search.NO_VICTIMS).sum()), short,
                      int(no_fit.sum()))

    def victims(self, pod: PodInfo, handle: PostFilterHandle, slot: int) -> list[PodUsage]:
        """The victims on ``slot`` of the evaluation `window` just read, in the order chosen."""
        e = self._evaluations[self._key(pod)]
        r = e.parts[int(e.part[slot])]
        k = int(e.at[slot])
        b = int(r.begin[k])
        usage = handle.table.pod_columns().usage
        return [usage[row] for row in r.rows[b: b + int(r.victims[k])].tolist()]

    # ------------------------------------------------------------------ upkeep
    def _current(self, pod: PodInfo, handle: PostFilterHandle, members: search.PdbMembers) -> _Evaluation | None:
        """The signature's evaluation brought up to date with the table, or None (not shareable)."""
        table = handle.table
        cols = table.pod_columns()
        key, token = self._key(pod), self._token(pod, handle)
        e = self._evaluations.get(key)
        dirty = None
        if e is not None and e.token == token and e.columns_generation == cols.generation:
            dirty = table.changed_since(e.position)
            if dirty is not None and len(dirty) > max(table.n // 4, 64):
                dirty = None
        if dirty is None:
            self._evaluations.pop(key, None)
            if self._not_shareable.get(key) == (token, table.log_position()):
                return None
            e = self._evaluate(pod, handle, token, members)
            if e is None:
                if len(self._not_shareable) >= MAX_SIGNATURES:
                    self._not_shareable.pop(next(iter(self._not_shareable)))
                self._not_shareable[key] = (token, table.log_position())
                return None
            self.evaluations += 1
            if len(self._evaluations) >= MAX_SIGNATURES:
                self._evaluations.pop(next(iter(self._evaluations)))
            self._evaluations[key] = e
        elif len(dirty):
            sub = search.classify(pod, handle, dirty)
            if sub.check is None:
                del self._evaluations[key]
                return None
            e.plan.kind[dirty] = sub.kind
            e.plan.short[:, dirty] = sub.short
            e.plan.free_all[:, dirty] = sub.free_all
            self._reprieve(pod, handle, e, dirty[sub.kind == search.FEASIBLE], members)
        e.position = table.log_position()
        return e

    def _evaluate(self, pod: PodInfo, handle: PostFilterHandle, token: tuple,
                  members: search.PdbMembers) -> _Evaluation | None:
        table = handle.table
        p = search.classify(pod, handle)
        if p.check is None or p.device is not None:  # a GPU device check: the unshared search
            return None
        n = table.n
        e = _Evaluation(token, table.log_position(), table.pod_columns().generation, p,
                        np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64),
                        np.zeros(n, np.float64), np.full(n, -1, np.int32), np.zeros(n, np.int64), [])
        self._reprieve(pod, handle, e, np.flatnonzero(p.kind == search.FEASIBLE), members)
        return e

    def _reprieve(self, pod: PodInfo, handle: PostFilterHandle, e: _Evaluation, slots: np.ndarray,
                  members: search.PdbMembers) -> None:
        """`search.reprieve` on the FEASIBLE ``slots`` into ``e``'s columns."""
        if not len(slots):
            return
        if len(e.parts) > 4096:  # compact: the parts of slots evaluated again are no longer read
            live = np.flatnonzero(e.plan.kind == search.FEASIBLE)
            e.parts.clear()
            e.part[:] = -1
            slots = np.union1d(slots, live)
        r = search.reprieve(pod, handle, e.plan, slots, members)
        e.victims[slots] = r.victims
        e.violations[slots] = r.violations
        e.first_priority[slots] = r.first_priority
        e.priority_sum[slots] = r.priority_sum
        e.earliest[slots] = r.earliest_top_start_s
        e.part[slots] = len(e.parts)
        e.at[slots] = np.arange(len(slots))
        e.parts.append(r)
        e.plan.kind[slots[r.victims == 0]] = search.EXACT  # the per-node search says why
