"""PodTopologySpread, as kube-scheduler v1.28's plugin of that name, vectorized over nodes.

A constraint's domains are the values of its topology key on the *eligible* nodes: nodes that have
the keys of all the pod's constraints of that kind (DoNotSchedule for Filter, ScheduleAnyway for
Score) and, per constraint, pass its node inclusion policies (``nodeAffinityPolicy: Honor``, the
default: the pod's nodeSelector and required node affinity; ``nodeTaintsPolicy: Honor``: the pod
tolerates the node's NoSchedule and NoExecute taints). A domain counts the pods on its eligible
nodes in the pod's namespace that match the constraint's selector and are not being deleted.

Filter (DoNotSchedule): a node without a constraint's key fails with ``node(s) didn't match pod
topology spread constraints (missing required label)`` (UnschedulableAndUnresolvable); otherwise
``count(node's domain) + (1 if the pod matches the selector) - global minimum <= maxSkew`` for every
constraint, else ``node(s) didn't match pod topology spread constraints``. The global minimum is
the smallest count over the eligible domains, 0 when there are fewer than ``minDomains``.

Score (ScheduleAnyway): feasible nodes without all the keys are ignored (score 0). Otherwise a node
scores ``round(sum over constraints of count(domain) * log(domains + 2) + maxSkew - 1)``, where
``domains`` is the number of the constraint's domains among the feasible nodes (for
``kubernetes.io/hostname``, the number of feasible nodes scored, and the count is the node's own);
NormalizeScore gives ``100 * (max + min - score) / max`` (100 for all when max is 0): fewer matching
pods score higher.

Default constraints (upstream's ``buildDefaultConstraints``): a pod without constraints of its own
gets the profile's (``PodTopologySpreadArgs``: ``defaultingType: System``, the default, gives kube's
system defaults, ``kubernetes.io/hostname`` maxSkew 3 and ``topology.kubernetes.io/zone`` maxSkew 5,
both ScheduleAnyway; ``List`` gives ``defaultConstraints``), each with the selector built from the
Services, ReplicationControllers, ReplicaSets and StatefulSets that select the pod
(`shardsched.api.workloads`, kept in `NodeTable.spread_selectors`); none when that selector is
empty. A default constraint's own ``matchLabelKeys`` change nothing (upstream replaces the
selector they were merged into). With the system defaults a node without a constraint's key is
not ignored when scoring (upstream's ``requireAllTopologies``): it scores by the constraints whose
key it has, and the nodes without the key form one more domain in the zone weight.

With ``partial_view`` (a shard of the sharded runtime sees only its own nodes), the global minimum
cannot be known: a pod with a DoNotSchedule constraint (`needs_cluster_view`) is placed on the node
the coordinator nominated for it over the whole cluster (``PodInfo.nominated_node_name``) if the
node has the constraints' keys (the skew is the coordinator's decision), and refused at PreFilter
without one (UnschedulableAndUnresolvable, saying so); ScheduleAnyway
constraints are scored over the shard's nodes. A profile whose ``List`` defaults have a
DoNotSchedule constraint needs the whole cluster for every pod without constraints of its own.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardsched.api.objects import PodInfo
from shardsched.api.podaffinity import SpreadConstraint
from shardsched.cache.node_table import NodeTable
from shardsched.framework.cycle_state import FEASIBLE_NODES_KEY, CycleState
from shardsched.framework.interface import MAX_NODE_SCORE, FilterPlugin, Index, ScorePlugin, index_len
from shardsched.framework.status import Status
from shardsched.plugins.helper.node_selector import selector_mask, terms_mask

NAME = "PodTopologySpread"
HOSTNAME_LABEL = "kubernetes.io/hostname"
ZONE_LABEL = "topology.kubernetes.io/zone"
ERR_REASON_CONSTRAINTS_NOT_MATCH = "node(s) didn't match pod topology spread constraints"
ERR_REASON_NODE_LABEL_NOT_MATCH = ERR_REASON_CONSTRAINTS_NOT_MATCH + " (missing required label)"
_FILTER_KEY = NAME + "/preFilter"
_SCORE_KEY = NAME + "/preScore"
_DO_NOT_SCHEDULE, _SCHEDULE_ANYWAY = "DoNotSchedule", "ScheduleAnyway"
#: the global minimum when no domain is eligible (upstream's math.MaxInt32): every skew is within
_NO_MINIMUM = 2**31 - 1
_TAINT_EFFECTS = ("NoSchedule", "NoExecute")
#: upstream's systemDefaultConstraints (their selector is the pod's default selector)
SYSTEM_DEFAULT_CONSTRAINTS = (SpreadConstraint(3, HOSTNAME_LABEL, _SCHEDULE_ANYWAY, None),
                              SpreadConstraint(5, ZONE_LABEL, _SCHEDULE_ANYWAY, None))


def partial_view_message() -> str:
    """The PreFilter rejection of a pod with a DoNotSchedule constraint in a shard, without a
    nominated node (module docstring)."""
    return ("pod has topology spread constraints with whenUnsatisfiable DoNotSchedule, which a shard of "
            "shardsched cannot check from its own nodes and no node was nominated for it over the whole "
            f"cluster (plugin {NAME})")


@dataclass(slots=True)
class _Rule:
    """One constraint, evaluated: matching pods per domain (indexed by value code) and the minimum."""

    constraint: SpreadConstraint
    per_domain: np.ndarray
    minimum: int
    self_match: int


def _all_keys(table: NodeTable, constraints: tuple[SpreadConstraint, ...]) -> np.ndarray:
    """bool array of shape (n,): valid nodes with every constraint's topology key."""
    mask = table.valid[: table.n].copy()
    for c in constraints:
        mask &= table.topology_codes(c.topology_key) >= 0
    return mask


def _tolerates(table: NodeTable, pod: PodInfo) -> np.ndarray:
    """bool array of shape (n,): nodes whose NoSchedule and NoExecute taints the pod tolerates."""
    ok_per_set = np.array([all(t.effect not in _TAINT_EFFECTS or any(tol.tolerates(t) for tol in pod.tolerations)
                               for t in taints) for taints in table.taint_sets], bool)
    return ok_per_set[table.taint_set_id[: table.n]]


def _included(table: NodeTable, pod: PodInfo, constraints: tuple[SpreadConstraint, ...],
              require_all: bool = True) -> list[np.ndarray]:
    """Per constraint, bool array of shape (n,): the nodes that count for it (module docstring);
    ``require_all`` False (system defaults): nodes need not have every constraint's key."""
    base = _all_keys(table, constraints) if require_all else table.valid[: table.n]
    everything = slice(0, table.n)
    affinity = taints = None
    out = []
    for c in constraints:
        mask = base
        if c.node_affinity_policy == "Honor":
            if affinity is None:
                affinity = selector_mask(table, pod.node_selector, everything)
                if pod.required_terms is not None:
                    affinity &= terms_mask(table, pod.required_terms, everything)
            mask = mask & affinity
        if c.node_taints_policy == "Honor":
            if taints is None:
                taints = _tolerates(table, pod)
            mask = mask & taints
        out.append(mask)
    return out


def _matching_per_slot(table: NodeTable, pod: PodInfo, c: SpreadConstraint) -> np.ndarray:
    """int64 array of shape (n,): pods on each node that the constraint counts."""
    return table.count_matching((pod.namespace,), None, c.selector, skip_deleting=True)


def _per_domain(table: NodeTable, key: str, per_slot: np.ndarray, where: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pods per domain, domain present): arrays indexed by value code of ``key``, over nodes ``where``."""
    codes = table.topology_codes(key)
    size = len(table.label_vocab.get(key, ()))
    at = where & (codes >= 0)
    counts = np.bincount(codes[at], weights=per_slot[at], minlength=size).astype(np.int64)
    present = np.bincount(codes[at], minlength=size) > 0
    return counts, present


class PodTopologySpread(FilterPlugin, ScorePlugin):
    name = NAME
    static = False
    normalizes = True
    topology = True

    def __init__(self, partial_view: bool = False, default_constraints: tuple[SpreadConstraint, ...] = (),
                 system_defaulted: bool = False) -> None:
        self.partial_view = partial_view
        self.default_constraints = default_constraints
        self.system_defaulted = system_defaulted
        self._hard_defaults = any(c.when_unsatisfiable == _DO_NOT_SCHEDULE for c in default_constraints)

    def needs_cluster_view(self, pod: PodInfo) -> str | None:
        """What of the pod a shard cannot check from its own nodes (module docstring), or None."""
        if pod.hard_topology_spread or (self._hard_defaults and not pod.spread_constraints):
            return "topology spread constraints with whenUnsatisfiable DoNotSchedule"
        return None

    def constraints(self, pod: PodInfo, table: NodeTable, action: str) -> tuple[SpreadConstraint, ...]:
        """The pod's constraints of ``action`` (DoNotSchedule or ScheduleAnyway): its own, or when it
        has none the default ones with its default selector (module docstring)."""
        if pod.spread_constraints:
            return tuple(c for c in pod.spread_constraints if c.when_unsatisfiable == action)
        defaults = tuple(c for c in self.default_constraints if c.when_unsatisfiable == action)
        if not defaults:
            return ()
        selector = table.spread_selectors.default_selector(pod.namespace, pod.labels, pod.controller)
        if selector is None:
            return ()
        return tuple(dataclasses.replace(c, selector=selector) for c in defaults)

    # ------------------------------------------------------------------ filter
    def pre_filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        hard = self.constraints(pod, table, _DO_NOT_SCHEDULE)
        if not hard:
            return Status.skip()
        if self.partial_view:
            if not pod.nominated_node_name:
                return Status.unschedulable(partial_view_message(), plugin=NAME, resolvable=False)
            # the skew was decided by the coordinator for the nominated node; what the node itself
            # decides (it has the keys) is checked here
            state.write(_FILTER_KEY, [_Rule(c, np.zeros(0, np.int64), _NO_MINIMUM, 0) for c in hard])
            return Status.success()
        rules = []
        for c, included in zip(hard, _included(table, pod, hard)):
            counts, present = _per_domain(table, c.topology_key, _matching_per_slot(table, pod, c), included)
            domains = int(present.sum())
            minimum = int(counts[present].min()) if domains else _NO_MINIMUM
            if c.min_domains is not None and domains < c.min_domains:
                minimum = 0
            self_match = int(c.selector is not None and c.selector.matches(pod.labels))
            rules.append(_Rule(c, counts, minimum, self_match))
        state.write(_FILTER_KEY, rules)
        return Status.success()

    def _checks(self, rules: list[_Rule], table: NodeTable, idx: Index) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per rule, (has the key, skew within maxSkew): bool arrays over idx."""
        out = []
        for r in rules:
            codes = table.topology_codes(r.constraint.topology_key)[idx]
            has = codes >= 0
            count = np.where(has, r.per_domain[np.where(has, codes, 0)] if r.per_domain.size else 0, 0)
            out.append((has, count + r.self_match - r.minimum <= r.constraint.max_skew))
        return out

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        ok = np.ones(index_len(idx, table.n), bool)
        for has, within in self._checks(state.read(_FILTER_KEY), table, idx):
            ok &= has & within
        return ok

    def failure_reasons(self, state, pod, table, slots):
        undecided = np.ones(len(slots), bool)
        missing = skewed = 0
        for has, within in self._checks(state.read(_FILTER_KEY), table, slots):
            missing += int((undecided & ~has).sum())
            undecided &= has
            skewed += int((undecided & ~within).sum())
            undecided &= within
        return {r: c for r, c in ((ERR_REASON_NODE_LABEL_NOT_MATCH, missing),
                                  (ERR_REASON_CONSTRAINTS_NOT_MATCH, skewed)) if c}

    def passes_without_pods(self, pod: PodInfo) -> bool:
        """Removing matching pods from a node lowers its domain's count by d and the global minimum
        by at most d: the node's skew never grows."""
        return True

    def unresolvable_mask(self, state, pod, table, slots):
        """Upstream's codes: a node without a constraint's topology label is
        UnschedulableAndUnresolvable; a skew breach is Unschedulable (removing pods may help)."""
        missing = np.zeros(len(slots), bool)
        for has, _ in self._checks(state.read(_FILTER_KEY), table, slots):
            missing |= ~has
        return missing

    # ------------------------------------------------------------------ score
    def pre_score(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        soft = self.constraints(pod, table, _SCHEDULE_ANYWAY)
        if not soft:
            return Status.skip()
        feasible = state.get(FEASIBLE_NODES_KEY)
        if feasible is None:
            feasible = table.valid[: table.n]
        # upstream's requireAllTopologies: only the system defaults score nodes without every key
        require_all = bool(pod.spread_constraints) or not self.system_defaulted
        scored = feasible & _all_keys(table, soft) if require_all else feasible
        n_scored = int(scored.sum())
        parts = []
        for c, included in zip(soft, _included(table, pod, soft, require_all)):
            per_slot = _matching_per_slot(table, pod, c)
            if c.topology_key == HOSTNAME_LABEL:
                parts.append((c, per_slot, math.log(n_scored + 2)))
                continue
            counts, _ = _per_domain(table, c.topology_key, per_slot, included)
            _, candidate = _per_domain(table, c.topology_key, per_slot, scored)
            codes = table.topology_codes(c.topology_key)
            # a scored node without the key is in upstream's domain "" (it only widens the weight)
            domains = int(candidate.sum()) + int(bool((scored & (codes < 0)).any()))
            parts.append((c, np.where(scored, counts[np.where(codes >= 0, codes, 0)] if counts.size else 0, 0),
                          math.log(domains + 2)))
        state.write(_SCORE_KEY, (scored, parts))
        return Status.success()

    def score(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        """Raw score over idx; -1 marks an ignored node (one without every constraint's key)."""
        scored, parts = state.read(_SCORE_KEY)
        total = np.zeros(index_len(idx, table.n), float)
        for c, per_slot, weight in parts:
            has = table.topology_codes(c.topology_key)[idx] >= 0
            total += np.where(has, per_slot[idx] * weight + (c.max_skew - 1), 0.0)
        return np.where(scored[idx], np.floor(total + 0.5), -1).astype(np.int64)  # Go's math.Round

    def normalize_score(self, state: CycleState, pod: PodInfo, raw: np.ndarray) -> np.ndarray:
        """Upstream NormalizeScore over the feasible nodes (ignored nodes, raw -1, get 0)."""
        counted = raw >= 0
        if not counted.any():
            return np.zeros_like(raw)
        low, high = int(raw[counted].min()), int(raw[counted].max())
        if high == 0:
            return np.where(counted, MAX_NODE_SCORE, 0).astype(np.int64)
        return np.where(counted, MAX_NODE_SCORE * (high + low - raw) // high, 0).astype(np.int64)


def _default_constraint(c: Any) -> SpreadConstraint:
    """A ``defaultConstraints`` entry (validated args) as a `SpreadConstraint` without a selector."""
    return SpreadConstraint(c.max_skew, c.topology_key, c.when_unsatisfiable, None, c.min_domains,
                            c.node_affinity_policy or "Honor", c.node_taints_policy or "Ignore")


def new(args: Any = None, partial_view: bool = False) -> PodTopologySpread:
    """Factory; ``args`` (`PodTopologySpreadArgs`, None for upstream's defaults) selects the default
    constraints: ``defaultingType: System`` kube's `SYSTEM_DEFAULT_CONSTRAINTS`, ``List`` its
    ``defaultConstraints`` (module docstring)."""
    if args is None or args.defaulting_type == "System":
        return PodTopologySpread(partial_view, SYSTEM_DEFAULT_CONSTRAINTS, system_defaulted=True)
    return PodTopologySpread(partial_view, tuple(map(_default_constraint, args.default_constraints)))
