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

The plugin only decides; it must leave the table as it found it. The search removes and re-adds pods
in the table while it evaluates a node; each node costs one Filter run per potential victim.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from shardsched.api.objects import PREEMPT_NEVER, PodInfo
from shardsched.cache.node_table import PodUsage
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.diagnosis import Diagnosis, fit_error_message
from shardsched.framework.interface import PostFilterHandle, PostFilterPlugin, PostFilterResult
from shardsched.framework.status import Code, Status

NAME = "DefaultPreemption"
NO_VICTIMS = "No preemption victims found for incoming pod"
NOT_HELPFUL = "Preemption is not helpful for scheduling"
NOT_ELIGIBLE_NEVER = "not eligible due to preemptionPolicy=Never."
NOT_ELIGIBLE_TERMINATING = "not eligible due to a terminating pod on the nominated node."
PREFIX = "preemption: "
_PRIORITY_OFFSET = 2**31  # upstream adds MaxInt32 + 1 so that negative priorities sum sensibly


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


def pick_one_node(candidates: list[Candidate]) -> Candidate:
    """Upstream ``pickOneNodeForPreemption``: each rule keeps the best candidates of the previous
    one, until one is left; then the first of the order they were found in."""
    rules = (
        lambda c: -c.num_pdb_violations,
        lambda c: -c.victims[0].priority,
        lambda c: -sum(u.priority + _PRIORITY_OFFSET for u in c.victims),
        lambda c: -len(c.victims),
        lambda c: _earliest_start_of_highest(c.victims),
    )
    left = candidates
    for rule in rules:
        scores = [rule(c) for c in left]
        best = max(scores)
        left = [c for c, s in zip(left, scores) if s == best]
        if len(left) == 1:
            break
    return left[0]


class DefaultPreemption(PostFilterPlugin):
    """kube-scheduler's DefaultPreemption (module docstring).

    Args:
        min_candidate_nodes_percentage: in [0, 100], default 10.
        min_candidate_nodes_absolute: >= 0, default 100 (not both 0).
    """

    name = NAME

    def __init__(self, min_candidate_nodes_percentage: int = 10, min_candidate_nodes_absolute: int = 100) -> None:
        self.min_candidate_nodes_percentage = min_candidate_nodes_percentage
        self.min_candidate_nodes_absolute = min_candidate_nodes_absolute

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
        candidates: list[Candidate] = []
        if len(slots):
            want = self.num_candidates(len(slots))
            offset = int(handle.rng.integers(len(slots)))
            clean = 0
            for slot in np.roll(slots, -offset).tolist():
                victims, violations, st = select_victims_on_node(pod, slot, handle)
                if st.is_success() and victims:
                    candidates.append(Candidate(table.names[slot], victims, violations))
                    clean += violations == 0
                    if clean and len(candidates) >= want:
                        break
                    continue
                looked_at += 1
                for reason in st.reasons or (f"{st.plugin} rejected the pod",):
                    statuses[reason] += 1
        if not candidates:
            return PostFilterResult(Status(Code.UNSCHEDULABLE, (PREFIX + fit_error_message(looked_at, statuses),), NAME),
                                    nominated_node="")
        # non-violating candidates first, as upstream's DryRunPreemption returns them
        ordered = [c for c in candidates if not c.num_pdb_violations] + [c for c in candidates if c.num_pdb_violations]
        best = pick_one_node(ordered)
        return PostFilterResult(Status.success(), best.node, tuple(best.victims), best.num_pdb_violations)


def new(args=None) -> DefaultPreemption:
    """Factory for the registry: ``args`` is a validated ``DefaultPreemptionArgs`` or None."""
    if args is None:
        return DefaultPreemption()
    return DefaultPreemption(args.min_candidate_nodes_percentage, args.min_candidate_nodes_absolute)
