"""DefaultPreemption: kube-scheduler's PostFilter plugin of that name (v1.28's rules).

For a pod that fits no node, it looks for a node where deleting pods of strictly lower priority
makes room, and nominates the pod there (``status.nominatedNodeName``); the caller deletes the
victims and the pod gets its node once they are gone. The rules, as upstream's
``framework/preemption`` and ``plugins/defaultpreemption``:

- eligibility (``PodEligibleToPreemptOthers``): not for ``preemptionPolicy: Never``; not while a pod
  of lower priority deleted by a preemption (``DisruptionTarget`` condition) is still terminating on
  the pod's nominated node, unless that node now rejects the pod as UnschedulableAndUnresolvable;
- candidates: the nodes whose rejection was not UnschedulableAndUnresolvable, looked at in order from
  a random offset until ``max(n * minCandidateNodesPercentage / 100, minCandidateNodesAbsolute)``
  candidates are found (at least one without PDB violations);
- victims on a node (``SelectVictimsOnNode``): remove every pod of lower priority; if the pod then
  fits every Filter, put them back one by one in ``MoreImportantPod`` order (higher priority, then
  earlier ``status.startTime``), the pods whose eviction would break a PodDisruptionBudget first,
  keeping each that still lets the pod fit; the rest are the victims;
- the node (``pickOneNodeForPreemption``): fewest PDB violations, then the lowest priority of the
  first victim, the smallest sum of priorities (each + 2^31), the fewest victims, the latest start
  time of the highest-priority victims; then the first in the order looked at;
- messages: ``preemption: not eligible due to preemptionPolicy=Never.``, and with no candidate
  ``preemption: 0/N nodes are available: <count> No preemption victims found for incoming pod,
  <count> Preemption is not helpful for scheduling, <the Filters' reasons>.`` (appended to the
  FitError message by `Diagnosis.message`).

The plugin only decides; it must leave the table as it found it. The search is vectorized over
nodes where the resource fit is the only Filter that removing pods can change (`search`); elsewhere
it evaluates one node at a time (`select_victims_on_node`: it removes and re-adds pods in the table,
one Filter run per potential victim). Both give the same answer.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from shardsched.api.objects import PREEMPT_NEVER, PodInfo
from shardsched.cache.node_table import PodUsage
from shardsched.cache.pod_columns import PodColumns
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.diagnosis import Diagnosis, fit_error_message
from shardsched.framework.interface import PostFilterHandle, PostFilterPlugin, PostFilterResult
from shardsched.framework.status import Code, Status
from shardsched.plugins.defaultpreemption import search
from shardsched.plugins.defaultpreemption.shared import SharedSearch, Window

NAME = "DefaultPreemption"
NO_VICTIMS = "No preemption victims found for incoming pod"
NOT_HELPFUL = "Preemption is not helpful for scheduling"
NOT_ELIGIBLE_NEVER = "not eligible due to preemptionPolicy=Never."
NOT_ELIGIBLE_TERMINATING = "not eligible due to a terminating pod on the nominated node."
PREFIX = "preemption: "
_PRIORITY_OFFSET = search.PRIORITY_OFFSET


@dataclass(slots=True)
class Candidate:
    """A node where the pod fits once ``victims`` are gone (upstream ``candidate``).

    ``victims`` are in the order `select_victims_on_node` chose them (PDB-violating first, each group
    in MoreImportantPod order), as upstream's ``Victims.Pods``."""

    node: str
    victims: list[PodUsage]
    num_pdb_violations: int


def more_important_key(u: PodUsage) -> tuple[int, float]:
    """Sort key of upstream ``MoreImportantPod``: higher priority first, then the earlier
    ``status.startTime`` (a pod without one counts as started now: after every pod that has one)."""
    return -u.priority, (math.inf if u.start_time_s is None else u.start_time_s)


def _name(u: PodUsage) -> str:
    return u.key.split("/", 1)[1] if "/" in u.key else u.key


def split_by_pdb(victims: list[PodUsage], handle: PostFilterHandle) -> tuple[list[PodUsage], list[PodUsage]]:
    """Upstream ``filterPodsWithPDBViolation``: walk the pods in order, taking one disruption from
    every budget that selects a pod (unless the pod is already in its ``disruptedPods``); a pod that
    takes a budget below zero violates it. Returns (violating, non-violating), order kept."""
    allowed = [pdb.disruptions_allowed for pdb in handle.pdbs]
    violating, non_violating = [], []
    for u in victims:
        violated = False
        if u.labels:
            name = _name(u)
            for i, pdb in enumerate(handle.pdbs):
                if not pdb.selects(u.namespace, u.labels) or name in pdb.disrupted_pods:
                    continue
                allowed[i] -= 1
                if allowed[i] < 0:
                    violated = True
        (violating if violated else non_violating).append(u)
    return violating, non_violating


def select_victims_on_node(pod: PodInfo, slot: int, handle: PostFilterHandle) -> tuple[list[PodUsage], int, Status]:
    """Upstream ``SelectVictimsOnNode`` on one node: (victims, PDB violations among them, status).

    The status is Success with victims; UnschedulableAndUnresolvable ``No preemption victims found``
    when the node holds no pod of lower priority; or the Filter's rejection when the pod does not
    fit even with every lower-priority pod gone. The table is restored before returning.
    """
    table = handle.table
    node = table.names[slot]
    potential = [u for u in table.pods[slot].values() if u.priority < pod.priority]
    if not potential:
        return [], 0, Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, (NO_VICTIMS,), NAME)
    for u in potential:
        table.remove_pod(u.uid)
    try:
        st = handle.filter_node(pod, slot)
        if not st.is_success():
            return [], 0, st
        potential.sort(key=more_important_key)
        violating, non_violating = split_by_pdb(potential, handle)
        victims: list[PodUsage] = []
        violations = 0
        for group, counts in ((violating, True), (non_violating, False)):
            for u in group:
                table.add_pod(u, node)
                if not handle.filter_node(pod, slot).is_success():
                    table.remove_pod(u.uid)
                    victims.append(u)
                    violations += counts
        return victims, violations, Status.success()
    finally:
        for u in potential:
            if u.uid not in table.pod_slot:
                table.add_pod(u, node)


def _earliest_start_of_highest(victims: list[PodUsage]) -> float:
    """Upstream ``GetEarliestPodStartTime``: the earliest start among the victims of the highest
    priority (unset = now: +inf here, as in `more_important_key`)."""
    top = max(u.priority for u in victims)
    return min(math.inf if u.start_time_s is None else u.start_time_s for u in victims if u.priority == top)


def pick_best(violations: np.ndarray, first_priority: np.ndarray, priority_sum: np.ndarray, victims: np.ndarray,
              earliest_top_start_s: np.ndarray) -> int:
    """Upstream ``pickOneNodeForPreemption`` over candidates given as columns (one entry each, in the
    order they were found): the index of the winner. Each rule keeps the best of the previous one:
    fewest PDB violations, lowest priority of the first victim, smallest sum of priorities (each
    + 2^31), fewest victims, latest earliest start of the highest-priority victims; then the first."""
    n = len(violations)
    return int(np.lexsort((np.arange(n), -earliest_top_start_s, victims, priority_sum, first_priority,
                           violations))[0])


def pick_one_node(candidates: list[Candidate]) -> Candidate:
    """`pick_best` over `Candidate` objects."""
    return candidates[pick_best(*(np.array(col) for col in zip(*(
        (c.num_pdb_violations, c.victims[0].priority, sum(u.priority + _PRIORITY_OFFSET for u in c.victims),
         len(c.victims), _earliest_start_of_highest(c.victims)) for c in candidates))))]


@dataclass(slots=True)
class _Found:
    """The candidates found so far, in the order found, a part at a time: a stretch reprieved at
    once (`search.Reprieved`, its entries ``at``) or one node of the per-node search (its victims).
    Each part holds its positions in the search order and the columns `pick_best` reads."""

    parts: list[tuple[np.ndarray, tuple[np.ndarray, ...], search.Reprieved | list[PodUsage], np.ndarray | None]]
    count: int = 0
    clean: int = 0

    def add_exact(self, position: int, victims: list[PodUsage], violations: int) -> None:
        columns = tuple(np.array([v]) for v in (
            violations, victims[0].priority, sum(u.priority + _PRIORITY_OFFSET for u in victims), len(victims),
            _earliest_start_of_highest(victims)))
        self.parts.append((np.array([position]), columns, victims, None))
        self.count += 1
        self.clean += violations == 0

    def add_reprieved(self, positions: np.ndarray, r: search.Reprieved, at: np.ndarray) -> None:
        """Positions ``positions`` of the plan, entries ``at`` of ``r``."""
        columns = (r.violations[at], r.first_priority[at], r.priority_sum[at], r.victims[at],
                   r.earliest_top_start_s[at])
        self.parts.append((positions, columns, r, at))
        self.count += len(positions)
        self.clean += int((columns[0] == 0).sum())

    def best(self, table_columns: PodColumns) -> tuple[list[PodUsage], int, int]:
        """(victims, violations, position) of the winner; non-violating candidates first, as
        upstream's DryRunPreemption returns them."""
        cols = [np.concatenate([part[1][k] for part in self.parts]) for k in range(5)]
        order = np.lexsort((np.arange(self.count), cols[0] > 0))
        i = int(order[pick_best(*(c[order] for c in cols))])
        sizes = np.cumsum([len(part[0]) for part in self.parts])
        which = int(np.searchsorted(sizes, i, side="right"))
        positions, _, source, at = self.parts[which]
        j = i - (int(sizes[which - 1]) if which else 0)
        if isinstance(source, list):
            victims = source
        else:
            k = int(at[j])
            b = int(source.begin[k])
            victims = [table_columns.usage[row] for row in source.rows[b: b + int(source.victims[k])].tolist()]
        return victims, int(cols[0][i]), int(positions[j])


class DefaultPreemption(PostFilterPlugin):
    """kube-scheduler's DefaultPreemption (module docstring).

    Args:
        min_candidate_nodes_percentage: in [0, 100], default 10.
        min_candidate_nodes_absolute: >= 0, default 100 (not both 0).
        vectorized: the victim search over arrays where it gives the same answer (`search`); False
            runs the per-node search on every node (the tests compare the two).
        shared: keep each signature's evaluation of every node between PostFilters and evaluate
            again only the nodes that changed (`shared.SharedSearch`), where it gives the same
            answer; False searches afresh every time (the tests compare the two).
    """

    name = NAME

    def __init__(self, min_candidate_nodes_percentage: int = 10, min_candidate_nodes_absolute: int = 100,
                 vectorized: bool = True, shared: bool = True) -> None:
        self.min_candidate_nodes_percentage = min_candidate_nodes_percentage
        self.min_candidate_nodes_absolute = min_candidate_nodes_absolute
        self.vectorized = vectorized
        self._pdb_members = search.PdbMembers()
        self._shared = SharedSearch() if shared and vectorized else None

    def num_candidates(self, num_nodes: int) -> int:
        """Upstream ``calculateNumCandidates``: n * percentage / 100, at least the absolute number,
        at most n."""
        n = num_nodes * self.min_candidate_nodes_percentage // 100
        return min(max(n, self.min_candidate_nodes_absolute), num_nodes)

    def eligible(self, pod: PodInfo, diagnosis: Diagnosis, handle: PostFilterHandle) -> str:
        """Upstream ``PodEligibleToPreemptOthers``: "" when the pod may preempt, else why not."""
        if pod.preemption_policy == PREEMPT_NEVER:
            return NOT_ELIGIBLE_NEVER
        table = handle.table
        slot = table.index.get(pod.nominated_node_name) if pod.nominated_node_name else None
        if slot is None:
            return ""
        if diagnosis.rejected is None:
            if diagnosis.pre_filter_unresolvable:
                return ""
        elif diagnosis.rejected[slot] and diagnosis.unresolvable[slot]:
            return ""
        if any(u.priority < pod.priority and u.deleting and u.preempted for u in table.pods[slot].values()):
            return NOT_ELIGIBLE_TERMINATING
        return ""

    def post_filter(self, state: CycleState, pod: PodInfo, diagnosis: Diagnosis,
                    handle: PostFilterHandle) -> PostFilterResult:
        """Upstream ``Evaluator.Preempt`` up to the choice of the node (module docstring); the caller
        deletes the victims and writes the nomination (``prepareCandidate``)."""
        why = self.eligible(pod, diagnosis, handle)
        if why:
            return PostFilterResult(Status(Code.UNSCHEDULABLE, (PREFIX + why,), NAME))
        table = handle.table
        n = table.n
        valid = table.valid[:n]
        if diagnosis.rejected is None:
            potential = valid & (not diagnosis.pre_filter_unresolvable)
        else:
            potential = valid & ~(diagnosis.rejected & diagnosis.unresolvable)
        statuses: Counter[str] = Counter()
        not_helpful = int(valid.sum()) - int(potential.sum())
        if not_helpful:
            statuses[NOT_HELPFUL] = not_helpful
        looked_at = not_helpful
        slots = np.flatnonzero(potential)
        found = _Found([])
        if len(slots):
            want = self.num_candidates(len(slots))
            offset = int(handle.rng.integers(len(slots)))
            order = np.roll(slots, -offset)
            w = self._shared.window(pod, handle, order, want, self._pdb_members) if self._shared else None
            if w is not None:
                return self._from_window(pod, handle, order, w, looked_at, statuses)
            p = (search.plan if self.vectorized else search.exact_plan)(pod, handle, order)
            looked_at += self._walk(pod, handle, p, want, found, statuses)
        if not found.count:
            return PostFilterResult(Status(Code.UNSCHEDULABLE, (PREFIX + fit_error_message(looked_at, statuses),), NAME),
                                    nominated_node="")
        victims, violations, position = found.best(table.pod_columns())
        return PostFilterResult(Status.success(), table.names[int(order[position])], tuple(victims), violations)

    def _from_window(self, pod: PodInfo, handle: PostFilterHandle, order: np.ndarray, w: Window, looked_at: int,
                     statuses: Counter[str]) -> PostFilterResult:
        """`post_filter`'s answer from the shared search's candidates (as `_Found.best` picks)."""
        if not len(w.positions):
            if w.no_victims:
                statuses[NO_VICTIMS] += w.no_victims
            statuses.update(w.short)
            message = PREFIX + fit_error_message(looked_at + w.no_victims + w.no_fit, statuses)
            return PostFilterResult(Status(Code.UNSCHEDULABLE, (message,), NAME), nominated_node="")
        violations = w.columns[0]
        first = np.lexsort((np.arange(len(violations)), violations > 0))
        i = int(first[pick_best(*(c[first] for c in w.columns))])
        slot = int(w.slots[i])
        victims = self._shared.victims(pod, handle, slot)
        return PostFilterResult(Status.success(), handle.table.names[slot], tuple(victims), int(violations[i]))

    def _walk(self, pod: PodInfo, handle: PostFilterHandle, p: search.Plan, want: int, found: _Found,
              statuses: Counter[str]) -> int:
        """Upstream ``DryRunPreemption``: look at the nodes in ``p.order`` until ``want`` candidates
        are found, at least one without PDB violations; candidates into ``found``, the other nodes'
        reasons into ``statuses``. Returns how many nodes were looked at without a candidate.

        The plan's FEASIBLE nodes are reprieved a stretch at a time (`search.reprieve`), the EXACT
        ones node by node in order, so that none is evaluated past the last node looked at."""
        kind = p.kind
        producers = np.flatnonzero(kind >= search.EXACT)
        failed = 0
        stop = len(kind)  # positions [0, stop) are looked at
        i = 0
        while i < len(producers) and stop == len(kind):
            chunk = producers[i: i + max(want - found.count, 64)]
            i += len(chunk)
            fast = chunk[kind[chunk] == search.FEASIBLE]
            r = search.reprieve(pod, handle, p, fast, self._pdb_members) if len(fast) else None
            slow = np.ones(len(chunk), bool)
            if r is not None:
                slow[np.searchsorted(chunk, fast)] = r.victims == 0  # none to put back: the per-node search says why
            prev = 0
            for j in (*np.flatnonzero(slow).tolist(), len(chunk)):
                if j > prev:  # reprieved candidates in chunk[prev:j]
                    seg = chunk[prev:j]
                    at = np.searchsorted(fast, seg)
                    clean = found.clean + np.cumsum(r.violations[at] == 0)
                    total = found.count + np.arange(1, len(seg) + 1)
                    hit = np.flatnonzero((clean > 0) & (total >= want))
                    if len(hit):
                        seg, at = seg[: hit[0] + 1], at[: hit[0] + 1]
                    found.add_reprieved(seg, r, at)
                    if len(hit):
                        stop = int(seg[-1]) + 1
                        break
                if j == len(chunk):
                    break
                position = int(chunk[j])
                victims, violations, st = select_victims_on_node(pod, int(p.order[position]), handle)
                if st.is_success() and victims:
                    found.add_exact(position, victims, violations)
                    if found.clean and found.count >= want:
                        stop = position + 1
                        break
                else:
                    failed += 1
                    for reason in st.reasons or (f"{st.plugin} rejected the pod",):
                        statuses[reason] += 1
                prev = j + 1
        looked = kind[:stop]
        no_victims = int((looked == search.NO_VICTIMS).sum())
        if no_victims:
            statuses[NO_VICTIMS] += no_victims
        no_fit = looked == search.NO_FIT
        if no_fit.any():
            slots = p.order[:stop][no_fit]
            short = p.short[:, slots]
            dev = p.device
            if dev is not None:  # a node's reasons are those of the first Filter that rejects it
                by_device = dev.short[slots] & dev.reason_first[slots]
                short = short & ~by_device
                if by_device.any():
                    for reason, c in dev.plugin.failure_reasons(dev.state, pod, handle.table, slots[by_device]).items():
                        statuses[reason] += c
            for reason, c in zip(p.check.reasons, short.sum(axis=1).tolist()):
                if c:
                    statuses[reason] += c
        return failed + no_victims + int(no_fit.sum())


def new(args=None) -> DefaultPreemption:
    """Factory for the registry: ``args`` is a validated ``DefaultPreemptionArgs`` or None."""
    if args is None:
        return DefaultPreemption()
    return DefaultPreemption(args.min_candidate_nodes_percentage, args.min_candidate_nodes_absolute)
