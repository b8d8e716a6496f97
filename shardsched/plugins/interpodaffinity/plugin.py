"""InterPodAffinity, as kube-scheduler v1.28's plugin of that name, vectorized over nodes.

A topology domain is a pair (topology key, value of that node label); a node without the key is in
no domain of it. The pods counted are those on the table's nodes (`NodeTable.matching_pods`).

Filter (PreFilter computes the domains once per pod, the Filter is a lookup per node):
1. required pod affinity: the node has every term's topology key, and for every term its domain
   holds a pod that matches *all* the terms; except that when no pod anywhere matches them and the
   pod matches all its own terms, any node with the keys passes (the first pod of a group that is
   affine to itself). Failure: ``node(s) didn't match pod affinity rules``
   (UnschedulableAndUnresolvable).
2. required pod anti-affinity: no term's domain on the node holds a pod matching that term.
   Failure: ``node(s) didn't match pod anti-affinity rules``.
3. existing pods' anti-affinity (the symmetric rule): no pod's required anti-affinity term that
   matches this pod has that pod's domain on the node. Failure: ``node(s) didn't satisfy existing
   pods anti-affinity rules``.

Score: for every domain, the sum of (the pod's preferred affinity weights for the pods there that
match a term) minus (its preferred anti-affinity weights likewise), plus for the pods there whose
terms match this pod: ``hardPodAffinityWeight`` per required affinity term, the weight of each
preferred affinity term, minus that of each preferred anti-affinity term (the last three are
skipped with ``ignorePreferredTermsOfExistingPods`` when the pod has no preferred terms). A node
scores the sum over the domains it is in; NormalizeScore maps min..max of the feasible nodes to
0..100 (all 0 when they are equal).

With ``partial_view`` (a shard of the sharded runtime sees only its own nodes and their pods), a
node's own pods decide only required anti-affinity over ``kubernetes.io/hostname`` and, for the
shard's part of a domain, the existing pods' anti-affinity; those are checked over the shard's
pods. A pod with required pod affinity or required anti-affinity over another key
(`needs_cluster_view`) is placed on the node the coordinator nominated for it over the whole
cluster (``PodInfo.nominated_node_name``): its anti-affinity is checked again over the shard's
pods (a subset of what the coordinator saw, and fresher for the pods the shard placed itself), its
affinity is taken as the coordinator decided it (the node must have the terms' keys). Without a nomination such a pod is refused at
PreFilter (UnschedulableAndUnresolvable, saying so). Scores use the shard's pods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardsched.api.objects import PodInfo
from shardsched.api.podaffinity import AffinityTerm
from shardsched.cache.node_table import (PREFERRED_AFFINITY, PREFERRED_ANTI_AFFINITY, REQUIRED_AFFINITY,
                                         REQUIRED_ANTI_AFFINITY, NodeTable)
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import MAX_NODE_SCORE, FilterPlugin, Index, ScorePlugin, index_len
from shardsched.framework.status import Status

NAME = "InterPodAffinity"
HOSTNAME_LABEL = "kubernetes.io/hostname"
ERR_REASON_AFFINITY = "node(s) didn't match pod affinity rules"
ERR_REASON_ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
ERR_REASON_EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"
_FILTER_KEY = NAME + "/preFilter"
_SCORE_KEY = NAME + "/preScore"


def partial_view_message(what: str) -> str:
    """The PreFilter rejection of a pod a shard cannot check and the coordinator did not nominate
    a node for (module docstring)."""
    return (f"pod has {what}, which a shard of shardsched cannot check from its own nodes "
            f"and no node was nominated for it over the whole cluster (plugin {NAME})")


def _present(table: NodeTable, key: str, per_slot: np.ndarray) -> np.ndarray:
    """The domains of label ``key`` holding at least one of the pods counted in ``per_slot`` (int
    array of shape (n,)): bool array indexed by the label's value code."""
    codes = table.topology_codes(key)
    at = (per_slot > 0) & (codes >= 0)
    return np.bincount(codes[at], minlength=len(table.label_vocab.get(key, ()))) > 0


def _in(present: np.ndarray, node_codes: np.ndarray) -> np.ndarray:
    """bool array shaped as ``node_codes``: the node's domain is one of ``present`` (no label: no)."""
    out = np.zeros(len(node_codes), bool)
    has = (node_codes >= 0) & (node_codes < len(present))
    out[has] = present[node_codes[has]]
    return out


@dataclass(slots=True)
class _FilterState:
    """What PreFilter found: domains (label key -> codes) per rule."""

    #: (topology key, domains with matching pods as `_present` gives them; None: only the key is checked)
    affinity: list[tuple[str, np.ndarray | None]] = field(default_factory=list)
    affinity_any: bool = False
    self_match: bool = False
    anti: dict[str, np.ndarray] = field(default_factory=dict)
    existing: dict[str, np.ndarray] = field(default_factory=dict)


def _merge(into: dict[str, np.ndarray], key: str, present: np.ndarray) -> None:
    if present.any():
        if key in into:
            size = max(len(into[key]), len(present))
            present = np.pad(into[key], (0, size - len(into[key]))) | np.pad(present, (0, size - len(present)))
        into[key] = present


class InterPodAffinity(FilterPlugin, ScorePlugin):
    name = NAME
    static = False
    normalizes = True
    topology = True

    def __init__(self, hard_pod_affinity_weight: int = 1, ignore_preferred_terms_of_existing_pods: bool = False,
                 partial_view: bool = False) -> None:
        self.hard_pod_affinity_weight = hard_pod_affinity_weight
        self.ignore_preferred_terms_of_existing_pods = ignore_preferred_terms_of_existing_pods
        self.partial_view = partial_view

    @staticmethod
    def needs_cluster_view(pod: PodInfo) -> str | None:
        """What of the pod a shard cannot check from its own nodes (module docstring), or None."""
        a = pod.pod_affinity
        wide = sorted({t.topology_key for t in a.required_anti_affinity if t.topology_key != HOSTNAME_LABEL})
        what = [w for w, has in (("required pod affinity", bool(a.required_affinity)),
                                 (f"required pod anti-affinity over {', '.join(wide)}", bool(wide))) if has]
        return " and ".join(what) or None

    # ------------------------------------------------------------------ filter
    def pre_filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        a = pod.pod_affinity
        required_affinity = a.required_affinity
        if self.partial_view:
            what = self.needs_cluster_view(pod)
            if what and not pod.nominated_node_name:
                return Status.unschedulable(partial_view_message(what), plugin=NAME, resolvable=False)
            required_affinity = ()  # decided by the coordinator for the nominated node
        s = _FilterState()
        if a.required_affinity and not required_affinity:  # the node must still have the terms' keys
            s.affinity = [(t.topology_key, None) for t in a.required_affinity]
        ns_labels = table.labels_of_namespace(pod.namespace)
        for (kind, _, term), per_slot in table.term_slots.items():
            if kind == REQUIRED_ANTI_AFFINITY and term.matches(pod.namespace, pod.labels, ns_labels):
                _merge(s.existing, term.topology_key, _present(table, term.topology_key, per_slot[: table.n]))
        if not s.affinity and not required_affinity and not a.required_anti_affinity and not s.existing:
            return Status.skip()
        if required_affinity:
            if len(required_affinity) == 1:  # the usual case: the table's per-label counts
                per_slot = self._count(table, required_affinity[0])
            else:  # pods that match every term
                uids = None
                for t in required_affinity:
                    found = self._matching(table, t)
                    uids = found if uids is None else uids & found
                per_slot = table.pods_per_slot(uids or ())
            for t in required_affinity:
                codes = _present(table, t.topology_key, per_slot)
                s.affinity.append((t.topology_key, codes))
                s.affinity_any = s.affinity_any or bool(codes.any())
            s.self_match = all(t.matches(pod.namespace, pod.labels, ns_labels) for t in required_affinity)
        for t in a.required_anti_affinity:
            _merge(s.anti, t.topology_key, _present(table, t.topology_key, self._count(table, t)))
        state.write(_FILTER_KEY, s)
        return Status.success()

    @staticmethod
    def _matching(table: NodeTable, term: AffinityTerm) -> set[str]:
        return table.matching_pods(term.namespaces, term.namespace_selector, term.selector)

    @staticmethod
    def _count(table: NodeTable, term: AffinityTerm) -> np.ndarray:
        return table.count_matching(term.namespaces, term.namespace_selector, term.selector)

    def _checks(self, s: _FilterState, table: NodeTable, idx: Index) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(affinity ok, anti-affinity ok, existing anti-affinity ok): bool arrays over idx."""
        n = index_len(idx, table.n)
        affinity = np.ones(n, bool)
        if s.affinity:
            has_keys, pods_exist = np.ones(n, bool), np.ones(n, bool)
            for key, codes in s.affinity:
                node_codes = table.topology_codes(key)[idx]
                has_keys &= node_codes >= 0
                if codes is not None:
                    pods_exist &= _in(codes, node_codes)
            keys_only = s.affinity[0][1] is None  # a nominated pod in a shard (module docstring)
            affinity = has_keys if keys_only or (not s.affinity_any and s.self_match) else has_keys & pods_exist
        anti, existing = np.ones(n, bool), np.ones(n, bool)
        for rule, out in ((s.anti, anti), (s.existing, existing)):
            for key, codes in rule.items():
                out &= ~_in(codes, table.topology_codes(key)[idx])
        return affinity, anti, existing

    def passes_without_pods(self, pod: PodInfo) -> bool:
        """Removing pods only helps anti-affinity (the pod's and the existing pods'); it can break
        required pod affinity (the pod it is affine to may go)."""
        return not pod.pod_affinity.required_affinity

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        affinity, anti, existing = self._checks(state.read(_FILTER_KEY), table, idx)
        return affinity & anti & existing

    def failure_reasons(self, state, pod, table, slots):
        affinity, anti, existing = self._checks(state.read(_FILTER_KEY), table, slots)
        first_anti = affinity & ~anti
        first_existing = affinity & anti & ~existing
        counts = ((ERR_REASON_AFFINITY, int((~affinity).sum())), (ERR_REASON_ANTI_AFFINITY, int(first_anti.sum())),
                  (ERR_REASON_EXISTING_ANTI_AFFINITY, int(first_existing.sum())))
        return {reason: c for reason, c in counts if c}

    def unresolvable_mask(self, state, pod, table, slots):
        """Upstream's codes: the pod's own affinity terms not matched is UnschedulableAndUnresolvable;
        anti-affinity (its own or existing pods') is Unschedulable (removing pods may help)."""
        affinity, _, _ = self._checks(state.read(_FILTER_KEY), table, slots)
        return ~affinity

    # ------------------------------------------------------------------ score
    def pre_score(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        a = pod.pod_affinity
        has_preferred = bool(a.preferred_affinity or a.preferred_anti_affinity)
        if self.ignore_preferred_terms_of_existing_pods and not has_preferred:
            return Status.skip()
        # label key -> int64 array indexed by that label's value code: the domain's score
        scores: dict[str, np.ndarray] = {}

        def add(key: str, per_slot: np.ndarray, weight: int) -> None:
            codes = table.topology_codes(key)
            where = (per_slot != 0) & (codes >= 0)
            if not where.any():
                return
            size = len(table.label_vocab[key])
            part = np.bincount(codes[where], weights=per_slot[where], minlength=size).astype(np.int64) * weight
            prev = scores.get(key)
            scores[key] = part if prev is None else np.pad(prev, (0, size - len(prev))) + part

        for sign, weighted in ((1, a.preferred_affinity), (-1, a.preferred_anti_affinity)):
            for weight, t in weighted:
                add(t.topology_key, self._count(table, t), sign * weight)
        ns_labels = table.labels_of_namespace(pod.namespace)
        for (kind, weight, term), per_slot in table.term_slots.items():
            if kind == REQUIRED_AFFINITY:
                weight *= self.hard_pod_affinity_weight
            elif kind == PREFERRED_ANTI_AFFINITY:
                weight = -weight
            elif kind != PREFERRED_AFFINITY:
                continue
            if weight == 0 or not term.matches(pod.namespace, pod.labels, ns_labels):
                continue
            add(term.topology_key, per_slot[: table.n].astype(np.int64), weight)
        if not scores:
            return Status.skip()
        state.write(_SCORE_KEY, scores)
        return Status.success()

    def score(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        total = None
        for key, by_code in state.read(_SCORE_KEY).items():
            codes = table.topology_codes(key)[idx]
            part = np.where(codes >= 0, by_code[codes], 0)  # a code is < len(by_code): sized to the vocabulary
            total = part if total is None else total + part
        return total.astype(np.int64)

    def normalize_score(self, state: CycleState, pod: PodInfo, raw: np.ndarray) -> np.ndarray:
        """Min-max over the feasible nodes to [0, 100] (upstream NormalizeScore; truncated)."""
        if raw.size == 0:
            return raw
        low, high = int(raw.min()), int(raw.max())
        if high == low:
            return np.zeros_like(raw)
        # float64 in upstream's order (the ratio first), then truncated as Go's int64()
        return (float(MAX_NODE_SCORE) * ((raw - low) / (high - low))).astype(np.int64)


def new(args: Any = None, partial_view: bool = False) -> InterPodAffinity:
    """Factory; ``args`` is an `InterPodAffinityArgs` (None: upstream's defaults, weight 1)."""
    if args is None:
        return InterPodAffinity(partial_view=partial_view)
    return InterPodAffinity(args.hard_pod_affinity_weight, args.ignore_preferred_terms_of_existing_pods,
                            partial_view)
