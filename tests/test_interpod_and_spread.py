"""InterPodAffinity and PodTopologySpread, table-driven against kube-scheduler v1.28's rules
(pkg/scheduler/framework/plugins/interpodaffinity and .../podtopologyspread), at three levels: the
plugins alone (Filter reasons, normalized scores worked out by hand from the upstream formulas), the
GenericScheduler with kube's default profile (messages, placements, the per-signature cache, the
sharded runtime's partial view), and ``shardsched simulate -o json`` end to end through the CLI."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from builders import default_framework, expr, node, pod, run_filter, run_score, table_of, term
from forked_cli import run_cli
from shardsched.api.objects import PodInfo
from shardsched.api.podaffinity import LabelSelector
from shardsched.cache.node_table import NodeTable, PodUsage
from shardsched.config import load_config, parse_plugin_args
from shardsched.errors import InvalidObjectError
from shardsched.framework.status import Code
from shardsched.plugins.registry import REGISTRY
from shardsched.scheduler.algorithm import GenericScheduler
from shardsched.scheduler.algorithm import build_schedulers

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
NS_NAME = "kubernetes.io/metadata.name"

AFF = "node(s) didn't match pod affinity rules"
ANTI = "node(s) didn't match pod anti-affinity rules"
EXISTING = "node(s) didn't satisfy existing pods anti-affinity rules"
SPREAD = "node(s) didn't match pod topology spread constraints"
SPREAD_LABEL = "node(s) didn't match pod topology spread constraints (missing required label)"


# ---------------------------------------------------------------------------------- builders
def make(name: str, args: dict | None = None, partial_view: bool = False):
    """A plugin built as a profile builds it: args validated, then the registry's factory."""
    return REGISTRY[name](None if args is None else parse_plugin_args(name, args), partial_view)


def aterm(key: str = HOST, *, namespaces: list[str] | None = None, ns_selector: dict | None = None,
          exprs: list[dict] | None = None, **labels: str) -> dict:
    """A PodAffinityTerm: pods with ``labels`` (matchLabels) and ``exprs`` (matchExpressions), per ``key``."""
    sel: dict = {}
    if labels:
        sel["matchLabels"] = dict(labels)
    if exprs:
        sel["matchExpressions"] = exprs
    t: dict = {"labelSelector": sel, "topologyKey": key}
    if namespaces is not None:
        t["namespaces"] = namespaces
    if ns_selector is not None:
        t["namespaceSelector"] = ns_selector
    return t


def with_terms(p, kind: str = "podAntiAffinity", required=(), preferred=()):
    """Add required terms and (weight, term) preferred terms to ``spec.affinity.<kind>``."""
    a = p.spec.setdefault("affinity", {}).setdefault(kind, {})
    if required:
        a.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).extend(required)
    if preferred:
        a.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).extend(
            {"weight": w, "podAffinityTerm": t} for w, t in preferred)
    return p


def lp(name: str = "p", namespace: str = "default", cpu: str | None = None, **labels: str):
    """A pod with labels."""
    p = pod(name, cpu=cpu, namespace=namespace)
    if labels:
        p["metadata"]["labels"] = dict(labels)
    return p


def spread(p, key: str = ZONE, when: str = "DoNotSchedule", max_skew: int = 1, selector: dict | None = None,
           **extra):
    """Add a topologySpreadConstraint (selector default: matchLabels app=web)."""
    c = {"maxSkew": max_skew, "topologyKey": key, "whenUnsatisfiable": when,
         "labelSelector": {"matchLabels": {"app": "web"}} if selector is None else selector, **extra}
    p.spec.setdefault("topologySpreadConstraints", []).append(c)
    return p


def deleting(p):
    p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return p


def zoned(name: str, zone: str | None, **labels: str):
    n = node(name)
    if zone is not None:
        n.with_labels({ZONE: zone})
    if labels:
        n.with_labels(labels)
    return n


def on(p, node_name: str):
    return p.on(node_name)


def zone_table(*pods) -> NodeTable:
    """a1, a2 in zone a; b1 in zone b; nz without a zone label (every node has its hostname)."""
    return table_of(zoned("a1", "a"), zoned("a2", "a"), zoned("b1", "b"), zoned("nz", None), pods=pods)


ALL4 = {"a1", "a2", "b1", "nz"}


def scheduler(table: NodeTable, seed: int = 0, config: str | None = None) -> GenericScheduler:
    if config is None:
        return GenericScheduler(default_framework(), table, seed=seed)
    return build_schedulers(load_config(config), table, seed)["default-scheduler"]


def shard_scheduler(table: NodeTable, seed: int = 0) -> GenericScheduler:
    """A GenericScheduler as a shard of the sharded runtime builds it (partial view)."""
    return build_schedulers(load_config(None), table, seed, partial_view=True)["default-scheduler"]


# ============================================================================ InterPodAffinity
def test_required_anti_affinity_spreads_replicas_one_per_node():
    """Required anti-affinity to its own labels over kubernetes.io/hostname (upstream
    satisfyPodAntiAffinity): each replica avoids every node holding a replica; with 3 nodes the 4th
    replica fits nowhere, each node counted once under the first failing check (the pod's own
    anti-affinity is checked before existing pods' anti-affinity)."""
    table = table_of(node("n1"), node("n2"), node("n3"))
    sched = scheduler(table)
    replicas = [with_terms(lp(f"web-{i}", cpu="100m", app="web"), required=[aterm(app="web")]).info()
                for i in range(4)]
    assert len({r.signature for r in replicas}) == 1
    results = [sched.schedule(r) for r in replicas]
    assert sorted(r.node for r in results[:3]) == ["n1", "n2", "n3"]
    assert results[3].node is None
    assert results[3].status.message == f"0/3 nodes are available: 3 {ANTI}."


@pytest.mark.parametrize(
    "existing, incoming, passed, reasons",
    [
        # the pod's own required anti-affinity: no pod matching the term in the node's domain
        ([on(lp("w", app="web"), "a1")], with_terms(lp(), required=[aterm(app="web")]),
         ALL4 - {"a1"}, {ANTI: 1}),
        # over a zone: the whole domain is refused; a node without the key is in no domain and passes
        ([on(lp("w", app="web"), "a1")], with_terms(lp(), required=[aterm(ZONE, app="web")]),
         {"b1", "nz"}, {ANTI: 2}),
        # term namespaces default to the declaring (incoming) pod's namespace
        ([on(lp("w", "other", app="web"), "a1")], with_terms(lp(), required=[aterm(app="web")]), ALL4, {}),
        ([on(lp("w", "other", app="web"), "a1")],
         with_terms(lp(), required=[aterm(app="web", namespaces=["other"])]), ALL4 - {"a1"}, {ANTI: 1}),
        # several anti-affinity terms: each is checked on its own
        ([on(lp("w", app="web"), "a1"), on(lp("c", tier="cache"), "b1")],
         with_terms(lp(), required=[aterm(app="web"), aterm(ZONE, tier="cache")]), {"a2", "nz"}, {ANTI: 2}),
        # anti-affine to itself with no matching pod anywhere: every node passes
        ([], with_terms(lp(app="web"), required=[aterm(ZONE, app="web")]), ALL4, {}),
        # matchExpressions: NotIn matches pods without the key
        ([on(lp("x"), "a1"), on(lp("w", app="web"), "b1")],
         with_terms(lp(), required=[aterm(exprs=[expr("app", "NotIn", "web")])]), ALL4 - {"a1"}, {ANTI: 1}),
        # symmetric rule: an existing pod's required anti-affinity term that matches the incoming
        # pod (which has no terms) keeps it off that pod's domain
        ([with_terms(on(lp("x", app="x"), "a1"), required=[aterm(app="web")])], lp(app="web"),
         ALL4 - {"a1"}, {EXISTING: 1}),
        ([with_terms(on(lp("x", app="x"), "a1"), required=[aterm(ZONE, app="web")])], lp(app="web"),
         {"b1", "nz"}, {EXISTING: 2}),
        # ... but not a pod of another namespace (the term's namespaces are the existing pod's)
        ([with_terms(on(lp("x", app="x"), "a1"), required=[aterm(app="web")])], lp(namespace="other", app="web"),
         ALL4, {}),
        # ... unless the existing pod's term names that namespace
        ([with_terms(on(lp("x", app="x"), "a1"), required=[aterm(app="web", namespaces=["other"])])],
         lp(namespace="other", app="web"), ALL4 - {"a1"}, {EXISTING: 1}),
        ([with_terms(on(lp("x", app="x"), "a1"), required=[aterm(app="web", namespaces=["other"])])],
         lp(app="web"), ALL4, {}),
        # an existing pod's *preferred* anti-affinity never filters
        ([with_terms(on(lp("x", app="x"), "a1"), preferred=[(50, aterm(app="web"))])], lp(app="web"), ALL4, {}),
        # an existing pod's anti-affinity not matching the incoming pod's labels
        ([with_terms(on(lp("x", app="x"), "a1"), required=[aterm(app="db")])], lp(app="web"), ALL4, {}),
        # both: the pod's own anti-affinity is the node's first failing check
        ([with_terms(on(lp("x", app="x"), "a1"), required=[aterm(app="web")]),
          with_terms(on(lp("y", app="y"), "b1"), required=[aterm(app="web")])],
         with_terms(lp(app="web"), required=[aterm(app="x")]), {"a2", "nz"}, {ANTI: 1, EXISTING: 1}),
        # pods being deleted still count for InterPodAffinity (nodeInfo.Pods, no terminating bypass)
        ([deleting(on(lp("w", app="web"), "a1"))], with_terms(lp(), required=[aterm(app="web")]),
         ALL4 - {"a1"}, {ANTI: 1}),
        # an empty labelSelector matches every pod of the term's namespaces; no labelSelector, none
        ([on(lp("x", app="q"), "a1"), on(lp("y", "other"), "b1")], with_terms(lp(), required=[aterm()]),
         ALL4 - {"a1"}, {ANTI: 1}),
        ([on(lp("x", app="q"), "a1")], with_terms(lp(), required=[{"topologyKey": HOST}]), ALL4, {}),
        ([with_terms(on(lp("x", app="q"), "a1"), required=[aterm()])], lp(), ALL4 - {"a1"}, {EXISTING: 1}),
        # an existing pod on a node without the term's key is in no domain: restricts nothing
        ([with_terms(on(lp("x", app="x"), "nz"), required=[aterm(ZONE, app="web")])], lp(app="web"), ALL4, {}),
    ],
    ids=["own-hostname", "own-zone", "own-other-namespace", "own-namespaces-list", "own-two-terms",
         "own-self-no-match", "own-notin", "symmetric-hostname", "symmetric-zone", "symmetric-other-namespace",
         "symmetric-term-namespaces", "symmetric-term-namespaces-excludes-own", "symmetric-preferred-no-filter",
         "symmetric-not-matching", "own-before-symmetric", "deleting-pods-count", "empty-selector-all-pods",
         "no-selector-no-pods", "symmetric-empty-selector", "symmetric-node-without-key"],
)
def test_anti_affinity_filter(existing, incoming, passed, reasons):
    assert run_filter(make("InterPodAffinity"), incoming, zone_table(*existing)) == (passed, reasons)


def test_existing_anti_affinity_keeps_a_pod_without_terms_out_with_kubes_message():
    """The symmetric rule through the scheduler: every node holds a pod whose required anti-affinity
    matches the incoming pod, so it fits nowhere (upstream satisfyExistingPodsAntiAffinity)."""
    table = table_of(node("n1"), node("n2"), pods=[
        with_terms(on(lp(f"x{i}", app="x"), f"n{i}"), required=[aterm(app="web")]) for i in (1, 2)])
    sched = scheduler(table)
    result = sched.schedule(lp("web", cpu="100m", app="web").info())
    assert result.node is None
    assert result.status.message == f"0/2 nodes are available: 2 {EXISTING}."
    # same spec and labels in another namespace (the same scheduler: the namespace is part of the
    # cached signature): not concerned by the terms
    assert sched.schedule(lp("web", "other", cpu="100m", app="web").info()).node in ("n1", "n2")
    assert sched.schedule(lp("web2", cpu="100m", app="web").info()).node is None


@pytest.mark.parametrize(
    "existing, incoming, passed, reasons",
    [
        # only nodes in the zone of the matching pod; nodes without the zone label fail too
        ([on(lp("db", app="db"), "b1")], with_terms(lp(), "podAffinity", [aterm(ZONE, app="db")]),
         {"b1"}, {AFF: 3}),
        ([on(lp("db", app="db"), "a1")], with_terms(lp(), "podAffinity", [aterm(ZONE, app="db")]),
         {"a1", "a2"}, {AFF: 2}),
        ([on(lp("db", app="db"), "a2")], with_terms(lp(), "podAffinity", [aterm(app="db")]), {"a2"}, {AFF: 3}),
        # the first pod of a group affine to itself: no matching pod anywhere, the pod matches its
        # own terms -> any node with the topology key
        ([], with_terms(lp(app="cache"), "podAffinity", [aterm(ZONE, app="cache")]), {"a1", "a2", "b1"},
         {AFF: 1}),
        # a matching pod only on a node without the key counts in no domain: still the first pod
        ([on(lp("c", app="cache"), "nz")], with_terms(lp(app="cache"), "podAffinity", [aterm(ZONE, app="cache")]),
         {"a1", "a2", "b1"}, {AFF: 1}),
        # affinity to other labels that match nothing: unschedulable everywhere
        ([], with_terms(lp(app="web"), "podAffinity", [aterm(ZONE, app="db")]), set(), {AFF: 4}),
        # the pod matches only one of its own terms: not the first-pod exception
        ([], with_terms(lp(app="cache"), "podAffinity", [aterm(ZONE, app="cache"), aterm(ZONE, tier="x")]),
         set(), {AFF: 4}),
        # a pod must match *all* the terms to count: one pod per term is not enough
        ([on(lp("db", app="db"), "a1"), on(lp("back", tier="back"), "a1")],
         with_terms(lp(), "podAffinity", [aterm(ZONE, app="db"), aterm(tier="back")]), set(), {AFF: 4}),
        ([on(lp("db", app="db", tier="back"), "a1")],
         with_terms(lp(), "podAffinity", [aterm(ZONE, app="db"), aterm(tier="back")]), {"a1"}, {AFF: 3}),
        # the matching pod is in another namespace: no match (and the pod is not the first of its own group)
        ([on(lp("db", "other", app="db"), "b1")], with_terms(lp(), "podAffinity", [aterm(ZONE, app="db")]),
         set(), {AFF: 4}),
        # affinity and anti-affinity together: affinity is checked first
        ([on(lp("db", app="db"), "a1"), on(lp("w", app="web"), "a2")],
         with_terms(with_terms(lp(), "podAffinity", [aterm(ZONE, app="db")]), required=[aterm(app="web")]),
         {"a1"}, {AFF: 2, ANTI: 1}),
        # preferred terms never filter
        ([], with_terms(lp(), "podAffinity", preferred=[(100, aterm(ZONE, app="db"))]), ALL4, {}),
    ],
    ids=["zone-b", "zone-a", "hostname", "first-pod", "first-pod-match-without-key", "other-labels-no-match",
         "self-matches-one-term-only", "all-terms-one-pod", "all-terms-same-pod", "other-namespace",
         "affinity-before-anti", "preferred-no-filter"],
)
def test_affinity_filter(existing, incoming, passed, reasons):
    assert run_filter(make("InterPodAffinity"), incoming, zone_table(*existing)) == (passed, reasons)


def test_required_affinity_through_the_scheduler():
    """Affinity to an existing pod's zone places the pod there; affinity to labels no pod has (and
    the pod does not have) is Unschedulable, with kube's FitError message."""
    table = zone_table(on(lp("db", app="db"), "b1"))
    sched = scheduler(table)
    assert sched.schedule(with_terms(lp("a", cpu="100m"), "podAffinity", [aterm(ZONE, app="db")]).info()).node == "b1"
    result = sched.schedule(with_terms(lp("b", cpu="100m"), "podAffinity", [aterm(ZONE, app="nope")]).info())
    assert result.node is None and result.status.message == f"0/4 nodes are available: 4 {AFF}."


TEAM_A = {"team": "a", NS_NAME: "team-a"}


@pytest.mark.parametrize(
    "term_args, ns_labels, passed",
    [
        ({}, None, set()),  # no namespaces, no selector: the incoming pod's own namespace only
        ({"ns_selector": {}}, None, {"a1"}),  # an empty namespaceSelector selects every namespace
        ({"namespaces": ["team-a"]}, None, {"a1"}),
        ({"namespaces": ["team-b"]}, None, set()),
        ({"namespaces": ["team-b", "team-a"]}, None, {"a1"}),
        # every namespace carries kubernetes.io/metadata.name (kube-apiserver sets it)
        ({"ns_selector": {"matchLabels": {NS_NAME: "team-a"}}}, None, {"a1"}),
        ({"ns_selector": {"matchLabels": {"team": "a"}}}, TEAM_A, {"a1"}),
        ({"ns_selector": {"matchLabels": {"team": "a"}}}, None, set()),  # namespace labels unknown
        ({"ns_selector": {"matchExpressions": [expr("team", "In", "b", "c")]}}, TEAM_A, set()),
        ({"ns_selector": {"matchExpressions": [expr("team", "Exists")]}}, TEAM_A, {"a1"}),
        # namespaces and namespaceSelector are ORed
        ({"namespaces": ["team-b"], "ns_selector": {"matchLabels": {"team": "a"}}}, TEAM_A, {"a1"}),
    ],
    ids=["own-namespace", "empty-selector-all", "list", "list-other", "list-two", "name-label",
         "selector-labels", "selector-labels-unknown", "selector-in-other", "selector-exists", "list-or-selector"],
)
def test_affinity_namespaces_and_namespace_selector(term_args, ns_labels, passed):
    """A term's namespaces: ``namespaces`` plus those its ``namespaceSelector`` selects by their labels;
    with neither, the declaring pod's (upstream getNamespacesFromPodAffinityTerm,
    mergeAffinityTermNamespacesIfNotEmpty). The incoming pod (labels app=web, not matching its term)
    is in ``default``; the only db pod is in ``team-a`` on a1."""
    table = zone_table(on(lp("db", "team-a", app="db"), "a1"))
    if ns_labels is not None:
        table.namespace_labels["team-a"] = dict(ns_labels)
    incoming = with_terms(lp(app="web"), "podAffinity", [aterm(app="db", **term_args)])
    got, reasons = run_filter(make("InterPodAffinity"), incoming, table)
    assert got == passed
    assert reasons == {AFF: 4 - len(passed)}


@pytest.mark.parametrize("incoming_ns, refused", [("team-a", True), ("team-b", False)],
                         ids=["selected", "not-selected"])
def test_existing_anti_affinity_namespace_selector(incoming_ns, refused):
    """An existing pod's term with a namespaceSelector is matched against the incoming pod's
    namespace labels (upstream getExistingAntiAffinityCounts uses the incoming pod's nsLabels)."""
    table = zone_table(with_terms(on(lp("x", app="x"), "a1"),
                                  required=[aterm(app="web", ns_selector={"matchLabels": {"team": "a"}})]))
    table.namespace_labels["team-a"] = dict(TEAM_A)
    table.namespace_labels["team-b"] = {"team": "b", NS_NAME: "team-b"}
    got = run_filter(make("InterPodAffinity"), lp(namespace=incoming_ns, app="web"), table)
    assert got == ((ALL4 - {"a1"}, {EXISTING: 1}) if refused else (ALL4, {}))


# ------------------------------------------------------------------------ InterPodAffinity Score
@pytest.mark.parametrize(
    "existing, incoming, expected",
    [
        # raw = sum of weights of matching pods in the node's domain; normalized min..max -> 0..100
        ([on(lp("db", app="db"), "a2")], with_terms(lp(), "podAffinity", preferred=[(10, aterm(app="db"))]),
         {"a1": 0, "a2": 100, "b1": 0, "nz": 0}),
        ([on(lp("db", app="db"), "a2")], with_terms(lp(), preferred=[(10, aterm(app="db"))]),
         {"a1": 100, "a2": 0, "b1": 100, "nz": 100}),
        ([on(lp("db", app="db"), "a1")], with_terms(lp(), "podAffinity", preferred=[(10, aterm(ZONE, app="db"))]),
         {"a1": 100, "a2": 100, "b1": 0, "nz": 0}),
        # zone a: +10, zone b: -5, nz: 0 -> (x + 5) * 100 / 15, truncated
        ([on(lp("db", app="db"), "a1"), on(lp("c", app="cache"), "b1")],
         with_terms(with_terms(lp(), "podAffinity", preferred=[(10, aterm(ZONE, app="db"))]),
                    preferred=[(5, aterm(ZONE, app="cache"))]),
         {"a1": 100, "a2": 100, "b1": 0, "nz": 33}),
        # each matching pod counts: zone a 2 x 10, b1 1 x 10
        ([on(lp("d1", app="db"), "a1"), on(lp("d2", app="db"), "a2"), on(lp("d3", app="db"), "b1")],
         with_terms(lp(), "podAffinity", preferred=[(10, aterm(ZONE, app="db"))]),
         {"a1": 100, "a2": 100, "b1": 50, "nz": 0}),
        # an existing pod's preferred affinity term matching the incoming pod attracts it
        ([with_terms(on(lp("x", app="x"), "b1"), "podAffinity", preferred=[(7, aterm(ZONE, app="web"))])],
         lp(app="web"), {"a1": 0, "a2": 0, "b1": 100, "nz": 0}),
        # ... its preferred anti-affinity term repels it
        ([with_terms(on(lp("x", app="x"), "b1"), preferred=[(7, aterm(app="web"))])],
         lp(app="web"), {"a1": 100, "a2": 100, "b1": 0, "nz": 100}),
        # an existing pod's required anti-affinity only filters, never scores
        ([with_terms(on(lp("x", app="x"), "b1"), required=[aterm(app="db")])], lp(app="web"), None),
        # existing terms not matching the incoming pod (another namespace): nothing to score
        ([with_terms(on(lp("x", "other", app="x"), "b1"), "podAffinity", preferred=[(7, aterm(app="web"))])],
         lp(app="web"), None),
        # the incoming pod's preferred term names the namespace of the matching pod
        ([on(lp("db", "other", app="db"), "b1")],
         with_terms(lp(), "podAffinity", preferred=[(10, aterm(app="db", namespaces=["other"]))]),
         {"a1": 0, "a2": 0, "b1": 100, "nz": 0}),
        # preferred terms with no matching pod: every node equal
        ([], with_terms(lp(), "podAffinity", preferred=[(10, aterm(app="db"))]), None),
        ([on(lp("db", app="db"), "b1")], lp(), None),
    ],
    ids=["preferred-affinity", "preferred-anti", "preferred-zone", "affinity-and-anti", "count-per-pod",
         "existing-preferred-affinity", "existing-preferred-anti", "existing-required-anti-no-score",
         "existing-other-namespace", "preferred-namespaces", "no-match", "no-terms"],
)
def test_inter_pod_affinity_score(existing, incoming, expected):
    got = run_score(make("InterPodAffinity"), incoming, zone_table(*existing))
    if expected is None:  # upstream PreScore: Skip when no topology score (or all nodes 0 after normalize)
        assert got is None or set(got.values()) == {0}, got
    else:
        assert got == expected


@pytest.mark.parametrize(
    "args, existing, incoming, expected",
    [
        # an existing pod's required affinity term matching the incoming pod: hardPodAffinityWeight (1)
        (None, [with_terms(on(lp("x", app="x"), "b1"), "podAffinity", [aterm(app="web")])], lp(app="web"),
         {"a1": 0, "a2": 0, "b1": 100, "nz": 0}),
        ({"hardPodAffinityWeight": 0}, [with_terms(on(lp("x", app="x"), "b1"), "podAffinity", [aterm(app="web")])],
         lp(app="web"), None),
        # with the incoming pod's own preferred term (3) on a1: b1 scores the hard weight
        ({"hardPodAffinityWeight": 1},
         [with_terms(on(lp("x", app="x"), "b1"), "podAffinity", [aterm(app="web")]), on(lp("db", app="db"), "a1")],
         with_terms(lp(app="web"), "podAffinity", preferred=[(3, aterm(app="db"))]),
         {"a1": 100, "a2": 0, "b1": 33, "nz": 0}),
        ({"hardPodAffinityWeight": 5},
         [with_terms(on(lp("x", app="x"), "b1"), "podAffinity", [aterm(app="web")]), on(lp("db", app="db"), "a1")],
         with_terms(lp(app="web"), "podAffinity", preferred=[(3, aterm(app="db"))]),
         {"a1": 60, "a2": 0, "b1": 100, "nz": 0}),
        # hard weight per pod and per term, over the term's topology (zone a: 2 pods x 2)
        ({"hardPodAffinityWeight": 2},
         [with_terms(on(lp(f"x{i}", app="x"), n), "podAffinity", [aterm(ZONE, app="web")]) for i, n in
          enumerate(["a1", "a2"])] + [with_terms(on(lp("y", app="x"), "b1"), "podAffinity", [aterm(ZONE, app="web")])],
         lp(app="web"), {"a1": 100, "a2": 100, "b1": 50, "nz": 0}),
        # ignorePreferredTermsOfExistingPods: a pod without preferred terms skips existing pods' terms
        ({"ignorePreferredTermsOfExistingPods": True},
         [with_terms(on(lp("x", app="x"), "b1"), "podAffinity", preferred=[(7, aterm(app="web"))])],
         lp(app="web"), None),
        ({"ignorePreferredTermsOfExistingPods": True},
         [with_terms(on(lp("x", app="x"), "b1"), "podAffinity", [aterm(app="web")])], lp(app="web"), None),
        # ... but a pod with preferred terms still counts them: a1 3, b1 7 -> 3 * 100 / 7 = 42
        ({"ignorePreferredTermsOfExistingPods": True},
         [with_terms(on(lp("x", app="x"), "b1"), "podAffinity", preferred=[(7, aterm(app="web"))]),
          on(lp("db", app="db"), "a1")],
         with_terms(lp(app="web"), "podAffinity", preferred=[(3, aterm(app="db"))]),
         {"a1": 42, "a2": 0, "b1": 100, "nz": 0}),
    ],
    ids=["hard-default", "hard-zero", "hard-1-with-preferred", "hard-5-with-preferred", "hard-per-pod-zone",
         "ignore-existing-preferred", "ignore-existing-hard", "ignore-but-pod-has-preferred"],
)
def test_hard_pod_affinity_weight_and_existing_terms(args, existing, incoming, expected):
    """Upstream processExistingPod: for each existing pod, its required affinity terms matching the
    incoming pod add hardPodAffinityWeight (skipped when 0), its preferred terms add (affinity) or
    subtract (anti) their weight; ignorePreferredTermsOfExistingPods skips all of that (PreScore
    Skip) when the incoming pod has no preferred terms."""
    assert run_score(make("InterPodAffinity", args), incoming, zone_table(*existing)) == expected


def test_inter_pod_affinity_normalize_truncates_like_go():
    """Upstream NormalizeScore: ``int64(float64(MaxNodeScore) * (float64(s-min) / float64(max-min)))``.
    Raw scores 0, 29, 100 give 0, 28, 100 (Go's float64 0.29 * 100 is just below 29)."""
    table = table_of(node("n0"), node("n1"), node("n2"), pods=[on(lp("x", app="x"), "n1"), on(lp("y", app="y"), "n2")])
    incoming = with_terms(lp(), "podAffinity", preferred=[(29, aterm(app="x")), (100, aterm(app="y"))])
    assert run_score(make("InterPodAffinity"), incoming, table) == {"n0": 0, "n1": 28, "n2": 100}


def _filled(labels_by_node: dict[str, dict]) -> NodeTable:
    """Nodes that each hold one pod of the same requests (so resource scores tie), labelled as given."""
    return table_of(*(node(n) for n in labels_by_node),
                    pods=[on(lp(f"fill-{n}", cpu="200m", **labels), n) for n, labels in labels_by_node.items()])


@pytest.mark.parametrize(
    "kind, chosen",
    [("podAffinity", {"n2"}), ("podAntiAffinity", {"n1", "n3"})],
    ids=["affinity-attracts", "anti-affinity-repels"],
)
def test_preferred_terms_decide_placement(kind, chosen):
    """Three nodes otherwise equal (one pod of the same requests each): InterPodAffinity's normalized
    score (weight 2 in kube's default profile) alone decides, over many tie-breaking seeds."""
    table = _filled({"n1": {"app": "filler"}, "n2": {"app": "db"}, "n3": {"app": "filler"}})
    p = with_terms(lp("web", cpu="100m", app="web"), kind, preferred=[(10, aterm(app="db"))]).info()
    got = {scheduler(table, seed=s).schedule(p, assume=False).node for s in range(30)}
    assert got == chosen


def test_preferred_zone_affinity_decides_placement():
    """Preferred affinity over a zone: both nodes of the matching pod's zone score 100, the other 0."""
    table = table_of(zoned("a1", "a"), zoned("a2", "a"), zoned("b1", "b"),
                     pods=[on(lp("db", cpu="200m", app="db"), "a1"), on(lp("f1", cpu="200m"), "a2"),
                           on(lp("f2", cpu="200m"), "b1")])
    p = with_terms(lp("web", cpu="100m", app="web"), "podAffinity", preferred=[(1, aterm(ZONE, app="db"))]).info()
    assert {scheduler(table, seed=s).schedule(p, assume=False).node for s in range(30)} == {"a1", "a2"}


HARD_ZERO = """\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
  pluginConfig:
  - name: InterPodAffinity
    args: {hardPodAffinityWeight: 0}
"""


@pytest.mark.parametrize("config, chosen", [(None, {"n2"}), (HARD_ZERO, {"n1", "n2", "n3"})],
                         ids=["default-weight-attracts", "weight-zero-no-pull"])
def test_hard_pod_affinity_weight_through_the_scheduler(config, chosen):
    """An existing pod (n2) with required affinity to app=web attracts a web pod without terms
    (hardPodAffinityWeight 1 by default); with hardPodAffinityWeight 0 every node ties."""
    table = table_of(node("n1"), node("n2"), node("n3"), pods=[
        on(lp("f1", cpu="200m", app="f"), "n1"), on(lp("f3", cpu="200m", app="f"), "n3"),
        with_terms(on(lp("x", cpu="200m", app="x"), "n2"), "podAffinity", [aterm(app="web")])])
    p = lp("web", cpu="100m", app="web").info()
    assert {scheduler(table, seed=s, config=config).schedule(p, assume=False).node for s in range(40)} == chosen


# =========================================================================== PodTopologySpread
def spread_table(counts: dict[str, int], *extra_pods, nodes=None) -> NodeTable:
    """Nodes a1, a2 (zone a), b1 (zone b), c1 (zone c), nz (no zone) unless ``nodes``; ``counts``
    app=web pods per node."""
    nodes = nodes or [zoned("a1", "a"), zoned("a2", "a"), zoned("b1", "b"), zoned("c1", "c"), zoned("nz", None)]
    pods = [on(lp(f"w-{n}-{i}", app="web"), n) for n, c in counts.items() for i in range(c)]
    return table_of(*nodes, pods=[*pods, *extra_pods])


ALL5 = {"a1", "a2", "b1", "c1", "nz"}
ZONES3 = {"a1", "a2", "b1", "c1"}


@pytest.mark.parametrize(
    "counts, incoming, passed, reasons",
    [
        # zone counts a 2, b 1, c 1: min 1; zone a: 2 + 1 - 1 = 2 > maxSkew 1 -> refused (both nodes)
        ({"a1": 2, "b1": 1, "c1": 1}, spread(lp(app="web")), {"b1", "c1"}, {SPREAD: 2, SPREAD_LABEL: 1}),
        ({"a1": 2, "b1": 1, "c1": 1}, spread(lp(app="web"), max_skew=2), ZONES3, {SPREAD_LABEL: 1}),
        # zone a holds 2 more matching pods than b and c: 2 + 1 - 0 = 3 > maxSkew 1 and 2; <= 3
        ({"a1": 1, "a2": 1}, spread(lp(app="web")), {"b1", "c1"}, {SPREAD: 2, SPREAD_LABEL: 1}),
        ({"a1": 1, "a2": 1}, spread(lp(app="web"), max_skew=2), {"b1", "c1"}, {SPREAD: 2, SPREAD_LABEL: 1}),
        ({"a1": 1, "a2": 1}, spread(lp(app="web"), max_skew=3), ZONES3, {SPREAD_LABEL: 1}),
        # a pod not matching its own selector does not add itself: 2 + 0 - 1 = 1 <= 1
        ({"a1": 2, "b1": 1, "c1": 1}, spread(lp(app="other")), ZONES3, {SPREAD_LABEL: 1}),
        # empty domains: min 0
        ({"a1": 1}, spread(lp(app="web")), {"b1", "c1"}, {SPREAD: 2, SPREAD_LABEL: 1}),
        ({}, spread(lp(app="web")), ZONES3, {SPREAD_LABEL: 1}),
        # hostname: each node its own domain; nz has a hostname
        ({"a1": 1, "a2": 1, "b1": 1, "c1": 1}, spread(lp(app="web"), HOST), {"nz"}, {SPREAD: 4}),
        # two constraints: a node must have both keys; each is checked in order
        ({"a1": 1, "b1": 1, "c1": 1},
         spread(spread(lp(app="web")), HOST), {"a2"}, {SPREAD: 3, SPREAD_LABEL: 1}),
        # minDomains > number of domains (3): the global minimum is 0
        ({"a1": 2, "b1": 1, "c1": 1}, spread(lp(app="web"), max_skew=2, minDomains=4), {"b1", "c1"},
         {SPREAD: 2, SPREAD_LABEL: 1}),
        ({"a1": 2, "b1": 1, "c1": 1}, spread(lp(app="web"), max_skew=2, minDomains=3), ZONES3, {SPREAD_LABEL: 1}),
        # maxSkew 1 and min 0: only domains with 0 matching pods would be allowed; there are none
        ({"a1": 1, "b1": 1, "c1": 1}, spread(lp(app="web"), minDomains=4), set(), {SPREAD: 4, SPREAD_LABEL: 1}),
        ({"a1": 1, "b1": 1, "c1": 1}, spread(lp(app="web")), ZONES3, {SPREAD_LABEL: 1}),
        # no labelSelector: selects nothing (labels.Nothing), the pod does not match itself either
        ({"a1": 3}, spread(lp(app="web"), labelSelector=None), ZONES3, {SPREAD_LABEL: 1}),
    ],
    ids=["skew-refused", "max-skew-2", "two-more-skew-1", "two-more-skew-2", "two-more-skew-3", "no-self-match",
         "empty-domains", "no-pods", "hostname", "two-constraints",
         "min-domains-4", "min-domains-3", "min-domains-none-empty", "even", "no-selector"],
)
def test_spread_filter(counts, incoming, passed, reasons):
    """Upstream Filter: a node without the key: '(missing required label)'; else
    ``count(domain) + selfMatch - globalMin <= maxSkew`` per constraint; the global min is over the
    eligible domains, 0 when they are fewer than minDomains."""
    assert run_filter(make("PodTopologySpread"), incoming, spread_table(counts)) == (passed, reasons)


def _policy_table(taint_c: bool = False) -> NodeTable:
    c1 = zoned("c1", "c")
    if taint_c:
        c1.with_taint("k", "v")
    return table_of(zoned("a1", "a", pool="x"), zoned("b1", "b", pool="x"), c1,
                    pods=[on(lp("wa", app="web"), "a1"), on(lp("wb", app="web"), "b1")])


@pytest.mark.parametrize(
    "taint_c, incoming, passed",
    [
        # nodeAffinityPolicy Honor (default): c1 (no pool label) does not count: domains a, b, min 1
        (False, spread(lp(app="web").with_node_selector(pool="x")), {"a1", "b1", "c1"}),
        (False, spread(lp(app="web").with_node_selector(pool="x"), nodeAffinityPolicy="Honor"), {"a1", "b1", "c1"}),
        (False, spread(lp(app="web").with_required(term(expr("pool", "In", "x")))), {"a1", "b1", "c1"}),
        # Ignore: zone c counts with 0 pods -> min 0, a and b refused
        (False, spread(lp(app="web").with_node_selector(pool="x"), nodeAffinityPolicy="Ignore"), {"c1"}),
        # nodeTaintsPolicy Ignore (default): the tainted c1 counts -> min 0
        (True, spread(lp(app="web")), {"c1"}),
        # Honor: a node whose NoSchedule taint the pod does not tolerate does not count
        (True, spread(lp(app="web"), nodeTaintsPolicy="Honor"), {"a1", "b1", "c1"}),
        (True, spread(lp(app="web").with_toleration("k", "v"), nodeTaintsPolicy="Honor"), {"c1"}),
    ],
    ids=["affinity-honor-default", "affinity-honor", "affinity-honor-required-terms", "affinity-ignore",
         "taints-ignore-default", "taints-honor", "taints-honor-tolerated"],
)
def test_spread_node_inclusion_policies(taint_c, incoming, passed):
    """Upstream matchNodeInclusionPolicies: which nodes' domains (and pods) count for the global
    minimum. (The plugin alone: c1 is filtered by NodeAffinity/TaintToleration, not here.)"""
    got, reasons = run_filter(make("PodTopologySpread"), incoming, _policy_table(taint_c))
    assert got == passed
    assert reasons == ({SPREAD: 3 - len(passed)} if len(passed) < 3 else {})


@pytest.mark.parametrize("policy, passed, reasons", [
    ("Honor", {"a1", "a2", "b1"}, {}),
    ("Ignore", {"b1"}, {SPREAD: 2}),
], ids=["honor-pods-not-counted", "ignore-pods-counted"])
def test_spread_honor_leaves_out_the_pods_of_excluded_nodes(policy, passed, reasons):
    """Under nodeAffinityPolicy Honor a node the pod's nodeSelector excludes counts neither as a
    domain nor with its pods: a2 (zone a, no pool label) holds 2 matching pods, which count for
    zone a only under Ignore."""
    table = table_of(zoned("a1", "a", pool="x"), zoned("a2", "a"), zoned("b1", "b", pool="x"),
                     pods=[on(lp(f"w{i}", app="web"), "a2") for i in range(2)])
    incoming = spread(lp(app="web").with_node_selector(pool="x"), nodeAffinityPolicy=policy)
    assert run_filter(make("PodTopologySpread"), incoming, table) == (passed, reasons)


def test_spread_node_affinity_policy_through_the_scheduler():
    """With Honor the pod fits a1 or b1; with Ignore the empty zone c (excluded by the pod's
    nodeSelector) holds the minimum at 0 and the pod fits nowhere."""
    honor = spread(lp("p", cpu="100m", app="web").with_node_selector(pool="x")).info()
    assert scheduler(_policy_table()).schedule(honor).node in ("a1", "b1")
    ignore = spread(lp("p", cpu="100m", app="web").with_node_selector(pool="x"), nodeAffinityPolicy="Ignore").info()
    result = scheduler(_policy_table()).schedule(ignore)
    assert result.node is None
    assert result.status.message == ("0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
                                     f"2 {SPREAD}.")


@pytest.mark.parametrize(
    "incoming, passed",
    [
        (spread(lp(app="web", rev="v2")), {"b1"}),  # without matchLabelKeys every revision counts
        (spread(lp(app="web", rev="v2"), matchLabelKeys=["rev"]), {"a1", "b1"}),  # only rev In (v2)
        (spread(lp(app="web", rev="v1"), matchLabelKeys=["rev"]), {"b1"}),
        (spread(lp(app="web"), matchLabelKeys=["rev"]), {"b1"}),  # the pod lacks the key: selector unchanged
    ],
    ids=["no-keys", "other-revision-not-counted", "same-revision", "pod-without-key"],
)
def test_spread_match_label_keys(incoming, passed):
    """matchLabelKeys: the selector gets ``key In (pod's value)`` for keys the pod has (upstream
    filterTopologySpreadConstraints). a1 holds 2 pods app=web rev=v1; b1 none."""
    table = table_of(zoned("a1", "a"), zoned("b1", "b"),
                     pods=[on(lp(f"old{i}", app="web", rev="v1"), "a1") for i in range(2)])
    got, _ = run_filter(make("PodTopologySpread"), incoming, table)
    assert got == passed


@pytest.mark.parametrize(
    "pods_on_a1, passed",
    [
        ([lp("w1", app="web"), lp("w2", app="web")], {"b1"}),
        ([deleting(lp("w1", app="web")), deleting(lp("w2", app="web"))], {"a1", "b1"}),
        ([lp("w1", "other", app="web"), lp("w2", "other", app="web")], {"a1", "b1"}),
        ([deleting(lp("w1", app="web")), lp("w2", app="web")], {"a1", "b1"}),  # 1 counted: 1 + 1 - 0 <= 2
    ],
    ids=["counted", "deleting-not-counted", "other-namespace-not-counted", "one-deleting"],
)
def test_spread_counts_skip_deleting_and_other_namespaces(pods_on_a1, passed):
    """Upstream countPodsMatchSelector: pods with a deletionTimestamp and pods of other namespaces are
    not counted. maxSkew 2 over zones a (a1) and b (b1, empty): a1 with c counted pods passes iff
    c + 1 - 0 <= 2, i.e. c <= 1."""
    table = table_of(zoned("a1", "a"), zoned("b1", "b"), pods=[on(p, "a1") for p in pods_on_a1])
    got, _ = run_filter(make("PodTopologySpread"), spread(lp(app="web"), max_skew=2), table)
    assert got == passed


def test_spread_burst_spreads_evenly_over_zones():
    """DoNotSchedule, maxSkew 1 over 3 zones (2 nodes each): a burst of identical pods (one
    signature: the cache must see every placement) keeps zone counts within 1 of each other and
    ends 3/3/3; the scheduler never places a pod where the skew would exceed 1."""
    table = table_of(*(zoned(f"{z}{i}", z) for z in "abc" for i in (1, 2)))
    sched = scheduler(table, seed=5)
    per_zone: Counter = Counter()
    for i in range(9):
        result = sched.schedule(spread(lp(f"web-{i}", cpu="100m", app="web")).info())
        assert result.node is not None, result.status.message
        per_zone[result.node[0]] += 1
        assert max(per_zone[z] for z in "abc") - min(per_zone[z] for z in "abc") <= 1, per_zone
    assert per_zone == {"a": 3, "b": 3, "c": 3}


def test_spread_fit_error_message():
    """kube's FitError, first failing plugin per node: b1's untolerated taint (TaintToleration runs
    first; under nodeTaintsPolicy Ignore its zone still counts, so min is 0), a1's zone has 2 more
    matching pods than b's, nz lacks the zone label."""
    table = table_of(zoned("a1", "a"), zoned("b1", "b").with_taint("k", "v"), zoned("nz", None),
                     pods=[on(lp(f"w{i}", app="web"), "a1") for i in range(2)])
    result = scheduler(table).schedule(spread(lp("p", cpu="100m", app="web")).info())
    assert result.node is None
    assert result.status.message == (f"0/3 nodes are available: 1 {SPREAD}, 1 {SPREAD_LABEL}, "
                                     "1 node(s) had untolerated taint {k: v}.")


# ------------------------------------------------------------------------ PodTopologySpread Score
@pytest.mark.parametrize(
    "counts, nodes, incoming, expected",
    [
        # zones a (2 pods), b (1); 2 domains among scored nodes -> weight ln(4); raw round(c * 1.386):
        # a 3, b 1; normalized 100 * (max + min - s) / max; nz lacks the key: ignored, 0
        ({"a1": 2, "b1": 1}, None, spread(lp(app="web"), when="ScheduleAnyway"),
         {"a1": 33, "a2": 33, "b1": 100, "nz": 0}),
        # hostname: n1 2, n2 1, n3 0; weight ln(3 + 2); raw 3, 2, 0
        ({"n1": 2, "n2": 1}, [node("n1"), node("n2"), node("n3")], spread(lp(app="web"), HOST, "ScheduleAnyway"),
         {"n1": 0, "n2": 33, "n3": 100}),
        # maxSkew 2 adds maxSkew - 1 to each raw score: 4, 3, 1
        ({"n1": 2, "n2": 1}, [node("n1"), node("n2"), node("n3")],
         spread(lp(app="web"), HOST, "ScheduleAnyway", max_skew=2), {"n1": 25, "n2": 50, "n3": 100}),
        # no matching pods: max 0 -> every scored node 100, the ignored one 0
        ({}, None, spread(lp(app="web"), when="ScheduleAnyway"), {"a1": 100, "a2": 100, "b1": 100, "nz": 0}),
    ],
    ids=["zone", "hostname", "hostname-max-skew-2", "no-pods"],
)
def test_spread_score(counts, nodes, incoming, expected):
    """Upstream PodTopologySpread Score/NormalizeScore (scoreForCount, topologyNormalizingWeight)."""
    nodes = nodes or [zoned("a1", "a"), zoned("a2", "a"), zoned("b1", "b"), zoned("nz", None)]
    table = table_of(*nodes, pods=[on(lp(f"w-{n}-{i}", app="web"), n) for n, c in counts.items() for i in range(c)])
    assert run_score(make("PodTopologySpread"), incoming, table) == expected


def test_spread_score_without_constraints_is_skipped():
    assert run_score(make("PodTopologySpread"), lp(app="web"), zone_table()) is None
    assert run_score(make("PodTopologySpread"), spread(lp(app="web")), zone_table()) is None  # DoNotSchedule only


def test_schedule_anyway_counts_pods_on_nodes_the_pod_does_not_fit():
    """Upstream PreScore counts the matching pods of every node (allNodes) into the domains of the
    filtered nodes: a1 is full (the pod does not fit), but its 3 pods make zone a score worse, so
    b1 beats the equally empty a2."""
    table = table_of(zoned("a1", "a"), zoned("a2", "a"), zoned("b1", "b"),
                     pods=[on(lp(f"w{i}", cpu="1", app="web"), "a1") for i in range(3)])
    p = spread(lp("p", cpu="2", app="web"), when="ScheduleAnyway").info()
    assert {scheduler(table, seed=s).schedule(p, assume=False).node for s in range(20)} == {"b1"}


def test_schedule_anyway_prefers_the_emptier_zone():
    """Two nodes holding the same requests; a1's pods match the constraint, b1's do not: b1 wins."""
    table = table_of(zoned("a1", "a"), zoned("b1", "b"),
                     pods=[on(lp("wa", cpu="200m", app="web"), "a1"), on(lp("ob", cpu="200m", app="other"), "b1")])
    p = spread(lp("p", cpu="100m", app="web"), when="ScheduleAnyway").info()
    assert {scheduler(table, seed=s).schedule(p, assume=False).node for s in range(20)} == {"b1"}


# ------------------------------------------------------------------------------------ validation
def _raw(spec: dict, labels: dict | None = None):
    p = lp(**(labels or {"app": "web"}))
    p.spec.update(spec)
    return p


TSC = "spec.topologySpreadConstraints"
REQ_ANTI = "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution"
PREF_AFF = "spec.affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution"
SEL = {"matchLabels": {"app": "web"}}


def _c(**kw) -> dict:
    return {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule", "labelSelector": SEL, **kw}


@pytest.mark.parametrize(
    "spec, path",
    [
        ({"topologySpreadConstraints": [_c(maxSkew=0)]}, f"{TSC}[0].maxSkew"),
        ({"topologySpreadConstraints": [_c(topologyKey="")]}, f"{TSC}[0].topologyKey"),
        ({"topologySpreadConstraints": [_c(whenUnsatisfiable="ScheduleAnyway", minDomains=2)]},
         f"{TSC}[0].minDomains"),
        ({"topologySpreadConstraints": [_c(minDomains=0)]}, f"{TSC}[0].minDomains"),
        ({"topologySpreadConstraints": [{**_c(matchLabelKeys=["rev"]), "labelSelector": None}]},
         f"{TSC}[0].matchLabelKeys"),
        ({"topologySpreadConstraints": [_c(matchLabelKeys=["app"])]}, f"{TSC}[0].matchLabelKeys[0]"),
        ({"topologySpreadConstraints": [_c(nodeAffinityPolicy="Sometimes")]}, f"{TSC}[0].nodeAffinityPolicy"),
        ({"topologySpreadConstraints": [_c(nodeTaintsPolicy="honor")]}, f"{TSC}[0].nodeTaintsPolicy"),
        ({"topologySpreadConstraints": [_c(labelSelector={"matchExpressions": [expr("app", "Equals", "web")]})]},
         f"{TSC}[0].labelSelector.matchExpressions[0].operator"),
        ({"topologySpreadConstraints": [_c(), _c(maxSkew=2)]}, f"{TSC}["),  # same key and whenUnsatisfiable
        ({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [aterm("", app="w")]}}},
         f"{REQ_ANTI}[0].topologyKey"),
        ({"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 5, "podAffinityTerm": aterm("", app="w")}]}}}, f"{PREF_AFF}[0].podAffinityTerm.topologyKey"),
        ({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            aterm(exprs=[expr("app", "Equals", "w")])]}}}, f"{REQ_ANTI}[0].labelSelector.matchExpressions[0].operator"),
        ({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            aterm(exprs=[expr("app", "In")])]}}}, f"{REQ_ANTI}[0].labelSelector.matchExpressions[0].values"),
        ({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            aterm(exprs=[expr("app", "Exists", "x")])]}}}, f"{REQ_ANTI}[0].labelSelector.matchExpressions[0].values"),
        ({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            aterm(ns_selector={"matchExpressions": [expr("team", "Among", "a")]}, app="w")]}}},
         f"{REQ_ANTI}[0].namespaceSelector.matchExpressions[0].operator"),
        ({"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 0, "podAffinityTerm": aterm(app="w")}]}}}, f"{PREF_AFF}[0].weight"),
        ({"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 101, "podAffinityTerm": aterm(app="w")}]}}}, f"{PREF_AFF}[0].weight"),
        ({"topologySpreadConstraints": [_c(maxSkew=2**40)]}, f"{TSC}[0].maxSkew"),
        ({"topologySpreadConstraints": [_c(minDomains=2**31)]}, f"{TSC}[0].minDomains"),
        ({"topologySpreadConstraints": [_c(maxSkew=1.0)]}, f"{TSC}[0].maxSkew"),
        ({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            aterm(app="not valid!")]}}}, f"{REQ_ANTI}[0].labelSelector.matchLabels.app"),
        ({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            aterm(exprs=[expr("app", "In", "x" * 64)])]}}}, f"{REQ_ANTI}[0].labelSelector.matchExpressions[0].values[0]"),
        ({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            aterm(namespaces=["Bad_NS"], app="w")]}}}, f"{REQ_ANTI}[0].namespaces[0]"),
    ],
    ids=["max-skew-0", "empty-topology-key", "min-domains-schedule-anyway", "min-domains-0",
         "match-label-keys-without-selector", "match-label-keys-in-selector", "bad-affinity-policy",
         "bad-taints-policy", "spread-bad-operator", "duplicate-constraint", "term-empty-topology-key",
         "preferred-term-empty-topology-key", "term-bad-operator", "in-without-values", "exists-with-values",
         "namespace-selector-bad-operator", "weight-0", "weight-101", "max-skew-above-int32",
         "min-domains-above-int32", "max-skew-float", "bad-label-value", "value-too-long", "bad-namespace-name"],
)
def test_invalid_terms_and_constraints_are_refused_naming_the_field(spec, path):
    """The API server's validation (ValidatePodSpec: validateTopologySpreadConstraints,
    validatePodAffinityTerm, ValidateLabelSelector): PodInfo.from_object raises, naming the field."""
    with pytest.raises(InvalidObjectError) as e:
        _raw(spec).info()
    assert e.value.path.startswith(path) if path.endswith("[") else e.value.path == path, (e.value.path, str(e.value))
    assert path in str(e.value)


def test_valid_constraints_parse_with_defaults_and_match_label_keys_merged():
    info = _raw({"topologySpreadConstraints": [_c(matchLabelKeys=["rev", "missing"])]},
                {"app": "web", "rev": "v3"}).info()
    [c] = info.spread_constraints
    assert (c.node_affinity_policy, c.node_taints_policy, c.min_domains) == ("Honor", "Ignore", None)
    assert c.selector.matches({"app": "web", "rev": "v3"})
    assert not c.selector.matches({"app": "web", "rev": "v1"})
    assert not c.selector.matches({"app": "web"})


def test_a_constraint_the_api_server_merged_parses_as_the_unmerged_one():
    """Since v1.34 the API server merges matchLabelKeys into the labelSelector on create (``rev In
    (v3)`` appended): such a pod is valid, and its selector is the one merging here gives."""
    labels = {"app": "web", "rev": "v3"}
    merged = {"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "rev", "operator": "In", "values": ["v3"]}]}
    [as_created] = _raw({"topologySpreadConstraints": [_c(matchLabelKeys=["rev"])]}, labels).info().spread_constraints
    [as_read] = _raw({"topologySpreadConstraints": [_c(matchLabelKeys=["rev"], labelSelector=merged)]},
                     labels).info().spread_constraints
    assert as_read.selector == as_created.selector


@pytest.mark.parametrize(
    "selector, labels, error",
    [
        # the key in the pod's labels: the merge adds it a second time to the selector
        ({"matchExpressions": [{"key": "rev", "operator": "NotIn", "values": ["v1"]}]}, {"rev": "v3"}, True),
        ({"matchLabels": {"rev": "v3"}}, {"rev": "v3"}, True),
        # the pod lacks the key: nothing is merged, the selector keeps it once
        ({"matchLabels": {"rev": "v3"}}, {}, False),
        ({"matchExpressions": [{"key": "rev", "operator": "Exists"}]}, {}, False),
    ],
    ids=["expression-and-merged", "match-labels-and-merged", "match-labels-only", "expression-only"],
)
def test_match_label_keys_validated_after_the_merge(selector, labels, error):
    """ValidateMatchLabelKeysAndMismatchLabelKeys on the merged constraint: a matchLabelKeys key may
    be in the selector once, as a matchExpression."""
    p = _raw({"topologySpreadConstraints": [_c(matchLabelKeys=["rev"], labelSelector=selector)]}, {"app": "web", **labels})
    if not error:
        assert p.info().spread_constraints
        return
    with pytest.raises(InvalidObjectError) as e:
        p.info()
    assert e.value.path == f"{TSC}[0].matchLabelKeys[0]" and "exists in both matchLabelKeys and labelSelector" in str(e.value)


# ================================================================== sharded runtime: partial view
@pytest.mark.parametrize(
    "p, plugin, what",
    [
        (with_terms(lp("x", cpu="100m", app="x"), "podAffinity", [aterm(app="db")]), "InterPodAffinity",
         "required pod affinity"),
        (with_terms(lp("x", cpu="100m", app="x"), required=[aterm(ZONE, app="x")]), "InterPodAffinity",
         f"required pod anti-affinity over {ZONE}"),
        (with_terms(with_terms(lp("x", cpu="100m", app="x"), required=[aterm(app="x")]),
                    required=[aterm(ZONE, app="y")]),
         "InterPodAffinity", f"required pod anti-affinity over {ZONE}"),
        (spread(lp("x", cpu="100m", app="web")), "PodTopologySpread", "DoNotSchedule"),
        (spread(lp("x", cpu="100m", app="web"), HOST), "PodTopologySpread", "DoNotSchedule"),
    ],
    ids=["required-affinity", "anti-affinity-zone", "anti-affinity-hostname-and-zone", "spread-zone",
         "spread-hostname"],
)
def test_partial_view_refuses_what_a_shard_cannot_check(p, plugin, what):
    """A shard sees only its own nodes: constraints whose domains reach other shards' nodes are
    refused at PreFilter (UnschedulableAndUnresolvable), saying what and which plugin."""
    table = zone_table(on(lp("db", app="db"), "a1"))
    result = shard_scheduler(table).schedule(p.info())
    assert result.node is None
    assert result.status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert f"(plugin {plugin}" in result.status.message and what in result.status.message
    assert result.status.message.startswith("0/4 nodes are available: ")
    assert table.node_of(p.info().uid) is None


def test_partial_view_hostname_anti_affinity_is_scheduled_and_respected():
    """Required anti-affinity over kubernetes.io/hostname is decided by the node's own pods: shards
    schedule it, one replica per node."""
    table = table_of(node("n1"), node("n2"))
    sched = shard_scheduler(table)
    results = [sched.schedule(with_terms(lp(f"w{i}", cpu="100m", app="web"), required=[aterm(app="web")]).info())
               for i in range(3)]
    assert sorted(r.node for r in results[:2]) == ["n1", "n2"]
    assert results[2].node is None and results[2].status.message == f"0/2 nodes are available: 2 {ANTI}."


def test_partial_view_enforces_existing_pods_anti_affinity():
    table = table_of(node("n1"), node("n2"), pods=[with_terms(on(lp("x", app="x"), "n1"), required=[aterm(app="web")])])
    sched = shard_scheduler(table)
    assert {sched.schedule(lp(f"w{i}", cpu="100m", app="web").info(), assume=False).node for i in range(20)} == {"n2"}
    table.add_pod(PodUsage.of(with_terms(on(lp("y", app="y"), "n2"), required=[aterm(app="web")]).info()), "n2")
    result = sched.schedule(lp("w", cpu="100m", app="web").info())
    assert result.node is None and result.status.message == f"0/2 nodes are available: 2 {EXISTING}."


def test_partial_view_schedules_soft_constraints():
    """ScheduleAnyway spread and preferred terms are scored over the shard's nodes, never refused."""
    table = _filled({"n1": {"app": "web"}, "n2": {"app": "f"}})
    sched = shard_scheduler(table)
    soft = spread(lp("a", cpu="100m", app="web"), HOST, "ScheduleAnyway").info()
    assert sched.schedule(soft, assume=False).node == "n2"
    p = with_terms(lp("b", cpu="100m"), "podAffinity", preferred=[(10, aterm(app="web"))])
    assert sched.schedule(p.info(), assume=False).node == "n1"


@pytest.mark.parametrize("make, ok_nodes", [
    (lambda: spread(lp("s", cpu="100m", app="web"), ZONE), {"a1", "a2", "b1"}),
    (lambda: with_terms(lp("f", cpu="100m"), "podAffinity", required=[aterm(ZONE, app="db")]), ALL4 - {"nz"}),
    (lambda: with_terms(lp("z", cpu="100m", app="db"), required=[aterm(ZONE, app="db")]), {"b1", "nz"}),
], ids=["zone-spread", "zone-affinity", "zone-anti-affinity"])
def test_partial_view_places_a_nominated_pod_on_its_node_or_nowhere(make, ok_nodes):
    """A pod the coordinator nominated a node for (its constraint needs the whole cluster) goes to
    that node if it passes the shard's filters, and nowhere else. The shard trusts the coordinator
    for what it cannot see (the skew, the affine pods), checks what the node decides (it has the
    keys) and anti-affinity again over its own pods."""
    table = zone_table(on(lp("db", app="db"), "a1"))
    sched = shard_scheduler(table)
    for name in sorted(ALL4):
        result = sched.schedule(make().info().nominated(name), assume=False)
        if name in ok_nodes:
            assert result.node == name, name
        else:
            assert result.node is None and "nominated node" in result.status.message, name
    # the nominated node is no part of what the plugins read: one cached entry for every nomination
    assert len(sched.cache) == 1
    table.set_unschedulable("b1", True)
    assert sched.schedule(make().info().nominated("b1"), assume=False).node is None
    missing = sched.schedule(make().info().nominated("elsewhere"), assume=False)
    assert missing.node is None and "nominated node elsewhere is not among these nodes" in missing.status.message


# =================================================================== cache: no stale decisions
def test_cache_sees_each_anti_affine_placement():
    """Identical anti-affine replicas (one signature) scheduled one after the other: every decision
    sees the previous placements, also after a replica is removed again."""
    table = table_of(node("n1"), node("n2"), node("n3"))
    sched = scheduler(table, seed=11)

    def make_replica(i: int) -> PodInfo:
        return with_terms(lp(f"w{i}", cpu="100m", app="web"), required=[aterm(app="web")]).info()

    placed = [sched.schedule(make_replica(i)) for i in range(3)]
    assert sorted(r.node for r in placed) == ["n1", "n2", "n3"]
    assert sched.schedule(make_replica(3)).node is None
    sched.forget(placed[1].pod)  # its node frees up
    again = sched.schedule(make_replica(4))
    assert again.node == placed[1].node
    assert sched.schedule(make_replica(5)).node is None


def test_cache_invalidated_for_a_pod_without_terms_when_an_anti_affine_pod_lands_and_leaves():
    """A pod without terms is decided (and cached) first; then a pod whose required anti-affinity
    matches it lands on n1: the same signature must now avoid n1; when that pod leaves, n1 is back."""
    table = table_of(node("n1"), node("n2"), node("n3"))
    sched = scheduler(table, seed=3)
    plain = lambda i: lp(f"p{i}", cpu="100m", app="web").info()  # noqa: E731
    _, feasible = sched.feasible_mask(plain(0))
    assert feasible[: table.n].sum() == 3
    assert sched.schedule(plain(1), assume=False).node is not None
    guard = with_terms(lp("guard", cpu="100m", app="guard"), required=[aterm(app="web")]).info()
    table.add_pod(PodUsage.of(guard), "n1")
    _, feasible = sched.feasible_mask(plain(2))
    assert not feasible[table.index["n1"]] and feasible[table.index["n2"]] and feasible[table.index["n3"]]
    assert {sched.schedule(plain(3 + i), assume=False).node for i in range(30)} == {"n2", "n3"}
    table.remove_pod(guard.uid)
    _, feasible = sched.feasible_mask(plain(40))
    assert feasible[table.index["n1"]]
    assert "n1" in {sched.schedule(plain(41 + i), assume=False).node for i in range(30)}


def test_cache_sees_the_pods_a_pod_without_terms_avoids_through_the_scheduler():
    """The guard is placed by the scheduler itself (assumed), between two decisions of the plain
    pod's signature: the second one must avoid the guard's node."""
    table = table_of(node("n1"), node("n2"))
    sched = scheduler(table, seed=1)
    first = sched.schedule(lp("p0", cpu="100m", app="web").info())
    other = "n2" if first.node == "n1" else "n1"
    # the guard is anti-affine to web pods: it must go to the node without one
    guard = sched.schedule(with_terms(lp("guard", cpu="100m", app="guard"), required=[aterm(app="web")]).info())
    assert guard.node == other
    # now web pods fit only where the first went (the guard's node is excluded by its anti-affinity)
    assert {sched.schedule(lp(f"p{i}", cpu="100m", app="web").info(), assume=False).node
            for i in range(1, 20)} == {first.node}


GROUP = "scheduling.x-k8s.io/pod-group"


def test_the_pod_group_label_is_not_part_of_the_signature_unless_the_pods_own_terms_read_it():
    """Members of two gangs that differ only by the PodGroup label share a signature (one cached
    decision for many gangs); a pod whose own terms read that label keeps it in the signature."""
    a, b = lp("a", cpu="100m", app="web", **{GROUP: "g1"}).info(), lp("b", cpu="100m", app="web", **{GROUP: "g2"}).info()
    assert a.signature == b.signature
    assert lp("c", cpu="100m", app="db", **{GROUP: "g1"}).info().signature != a.signature
    own = [with_terms(lp(n, cpu="100m", app="web", **{GROUP: g}), "podAffinity",
                      [aterm(ZONE, exprs=[{"key": GROUP, "operator": "Exists"}])]).info() for n, g in (("x", "g1"), ("y", "g2"))]
    assert own[0].signature != own[1].signature


@pytest.mark.parametrize("first", ["g1", "g2"], ids=["guarded-gang-first", "other-gang-first"])
def test_a_pod_group_label_that_existing_pods_terms_read_decides_with_its_own_cache_entry(first):
    """An existing pod anti-affine to gang g1's members (its term reads the PodGroup label): a g1
    member avoids its node, a g2 member of the same signature does not, whichever is decided
    first (the cache keys the label in once a counted pod reads it)."""
    table = table_of(node("n1"), node("n2"))
    sched = scheduler(table, seed=3)
    guard = with_terms(lp("guard", cpu="100m", app="guard"), required=[aterm(**{GROUP: "g1"})]).on("n1").info()
    table.add_pod(PodUsage.of(guard), "n1")
    filler = lp("filler", cpu="100m", app="guard").on("n2").info()  # so that n1 and n2 score alike
    table.add_pod(PodUsage.of(filler), "n2")
    assert table.reads_pod_label(GROUP) and not table.reads_pod_label("app")
    member = {g: lp(f"m-{g}", cpu="100m", app="web", **{GROUP: g}).info() for g in ("g1", "g2")}
    second = "g2" if first == "g1" else "g1"
    nodes = {g: {sched.schedule(member[g], assume=False).node for _ in range(20)} for g in (first, second)}
    assert nodes == {"g1": {"n2"}, "g2": {"n1", "n2"}}
    table.remove_pod(guard.uid)
    table.remove_pod(filler.uid)
    assert not table.reads_pod_label(GROUP)
    assert {sched.schedule(member["g1"], assume=False).node for _ in range(20)} == {"n1", "n2"}


def test_cache_self_affine_group_follows_its_first_pod():
    """Pods affine to their own labels over zones: the first goes anywhere (the first-pod rule); all
    the next ones (same signature) must follow it into its zone."""
    table = table_of(*(zoned(f"{z}{i}", z) for z in "ab" for i in (1, 2)))
    sched = scheduler(table, seed=2)
    results = [sched.schedule(with_terms(lp(f"c{i}", cpu="100m", app="cache"), "podAffinity",
                                         [aterm(ZONE, app="cache")]).info()) for i in range(6)]
    assert all(r.node is not None for r in results)
    assert len({r.node[0] for r in results}) == 1, [r.node for r in results]


def test_cache_spread_signature_sees_pods_bound_elsewhere():
    """A spread pod's cached decision must see matching pods bound by someone else (added to the
    table directly) between two decisions."""
    table = table_of(zoned("a1", "a"), zoned("b1", "b"))
    sched = scheduler(table, seed=0)
    p = lambda i: spread(lp(f"s{i}", cpu="100m", app="web")).info()  # noqa: E731
    assert sched.schedule(p(0), assume=False).node in ("a1", "b1")
    table.add_pod(PodUsage.of(on(lp("ext", app="web"), "a1").info()), "a1")
    assert {sched.schedule(p(1 + i), assume=False).node for i in range(15)} == {"b1"}
    table.add_pod(PodUsage.of(on(lp("ext2", app="web"), "b1").info()), "b1")
    assert {sched.schedule(p(20 + i), assume=False).node for i in range(15)} == {"a1", "b1"}


# ======================================================================= end to end through the CLI


def _node_doc(name: str, zone: str | None = None) -> dict:
    labels = {HOST: name, **({ZONE: zone} if zone else {})}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}


def _pod_doc(name: str, labels: dict, spec: dict | None = None, namespace: str = "default") -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": {"cpu": "100m"}}}], **(spec or {})}}


def simulate_json(tmp_path: Path, docs: list[dict]) -> dict:
    path = tmp_path / "in.yaml"
    path.write_text("\n---\n".join(json.dumps(d) for d in docs))  # JSON documents are YAML
    run = run_cli(["simulate", "-f", str(path), "-o", "json"], timeout=120)
    assert run.returncode == 0, run.stderr
    return {p["name"]: p for p in json.loads(run.stdout)["pods"]}


def _anti(key: str, **labels) -> dict:
    return {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [aterm(key, **labels)]}}}


def _aff(key: str, **labels) -> dict:
    return {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [aterm(key, **labels)]}}}


def test_cli_anti_affinity_replicas(tmp_path):
    """4 anti-affine replicas on 3 nodes: one per node, the 4th Unschedulable with kube's message."""
    docs = [_node_doc(f"n{i}") for i in (1, 2, 3)] + [
        _pod_doc(f"web-{i}", {"app": "web"}, _anti(HOST, app="web")) for i in range(4)]
    out = simulate_json(tmp_path, docs)
    assert sorted(out[f"web-{i}"]["node"] for i in range(3)) == ["n1", "n2", "n3"]
    assert (out["web-3"]["status"], out["web-3"]["node"]) == ("Unschedulable", None)
    assert out["web-3"]["reason"] == (f"0/3 nodes are available: 3 {ANTI}. preemption: 0/3 nodes are available: "
                                      "3 No preemption victims found for incoming pod..")


def test_cli_zone_spread(tmp_path):
    """DoNotSchedule maxSkew 1 over 3 zones: 6 pods, 2 per zone, whatever the node order; a node
    without the zone label is never used."""
    nodes = [_node_doc("a1", "a"), _node_doc("a2", "a"), _node_doc("b1", "b"), _node_doc("c1", "c"),
             _node_doc("nz")]
    constraint = {"topologySpreadConstraints": [_c()]}
    out = simulate_json(tmp_path, nodes + [_pod_doc(f"w{i}", {"app": "web"}, constraint) for i in range(6)])
    assert all(p["status"] == "Scheduled" for p in out.values()), out
    assert Counter(p["node"][0] for p in out.values()) == {"a": 2, "b": 2, "c": 2}


def test_cli_required_affinity_to_a_bound_pod_and_namespace_selector(tmp_path):
    """Pods affine to a bound db pod's zone land in that zone; one affine to pods of a namespace
    selected by its labels (a Namespace object of the input) follows them; one affine to labels no
    pod has is Unschedulable; the symmetric anti-affinity of a bound pod keeps a web pod away."""
    nodes = [_node_doc("a1", "a"), _node_doc("a2", "a"), _node_doc("b1", "b"), _node_doc("b2", "b")]
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "data", "labels": {"tier": "data"}}}
    db = _pod_doc("db", {"app": "db"}, {"nodeName": "b2"}, namespace="data")
    guard = _pod_doc("guard", {"app": "guard"}, {"nodeName": "a1", **_anti(ZONE, app="web")})
    aff_ns = {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        aterm(ZONE, ns_selector={"matchLabels": {"tier": "data"}}, app="db")]}}}
    pods = [_pod_doc(f"near-{i}", {"app": "x"}, aff_ns) for i in range(3)] + [
        _pod_doc("same-ns-only", {"app": "x"}, _aff(ZONE, app="db")),  # db is in another namespace
        _pod_doc("web", {"app": "web"})]
    out = simulate_json(tmp_path, nodes + [namespace, db, guard] + pods)
    for i in range(3):
        assert out[f"near-{i}"]["node"] in ("b1", "b2"), out[f"near-{i}"]
    assert out["same-ns-only"]["status"] == "Unschedulable"
    # affinity not matched is UnschedulableAndUnresolvable: preemption cannot help
    assert out["same-ns-only"]["reason"] == (f"0/4 nodes are available: 4 {AFF}. preemption: 0/4 nodes are "
                                             "available: 4 Preemption is not helpful for scheduling..")
    assert out["web"]["node"] in ("b1", "b2")  # zone a is guarded


# =================================================================== the table's per-label counts
def test_count_matching_agrees_with_matching_pods_through_adds_removes_and_node_changes():
    """`NodeTable.count_matching` keeps one-label selectors' counts up to date incrementally; after
    any sequence of pod adds, removes (deleting pods included), node removals and re-adds it must
    equal counting `matching_pods` afresh, for one-label and other selectors."""
    rng = np.random.default_rng(7)
    table = table_of(*(node(f"n{i}") for i in range(6)))
    selectors = [LabelSelector((("app", "a"),)), LabelSelector((("app", "b"),)),
                 LabelSelector((("app", "a"), ("tier", "x"))), LabelSelector((), (("app", "In", ("a", "b")),))]
    live: dict[str, str] = {}
    for step in range(400):
        op = rng.integers(10)
        if op < 6 or not live:
            uid = f"u{step}"
            labels = {"app": str(rng.choice(["a", "b", "c"]))}
            if rng.integers(2):
                labels["tier"] = "x"
            ns = str(rng.choice(["default", "other"]))
            p = lp(uid, namespace=ns, **labels)
            if rng.integers(5) == 0:
                p["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
            p["metadata"]["uid"] = uid
            node_name = f"n{rng.integers(6)}"
            table.add_pod(PodUsage.of(p.info()), node_name)
            live[uid] = node_name
        elif op < 9:
            uid = str(rng.choice(sorted(live)))
            table.remove_pod(uid)
            del live[uid]
        else:
            name = f"n{rng.integers(6)}"
            table.remove_node(name, keep_pods=True)
            table.add_node(node(name).info())
        for sel in selectors:
            for nss in (("default",), ("default", "other")):
                for skip in (False, True):
                    got = table.count_matching(nss, None, sel, skip_deleting=skip)
                    want = table.pods_per_slot(table.matching_pods(nss, None, sel, skip_deleting=skip))
                    assert got.tolist() == want.tolist(), (step, sel, nss, skip)


# ------------------------------------------------------------------------ namespaces' labels
def test_set_namespaces_replaces_merges_removes_and_moves_the_generation_only_on_change():
    table = NodeTable()
    g0 = table.affinity_generation
    assert table.set_namespaces({"team-a": TEAM_A}) and table.affinity_generation == g0 + 1
    assert not table.set_namespaces({"team-a": dict(TEAM_A)})  # the same labels: nothing changed
    assert table.affinity_generation == g0 + 1
    assert table.set_namespaces({"team-b": {"team": "b", NS_NAME: "team-b"}})
    assert set(table.namespace_labels) == {"team-a", "team-b"}
    assert table.set_namespaces({}, removed=["team-a", "never-seen"])
    assert set(table.namespace_labels) == {"team-b"}
    assert table.labels_of_namespace("team-a") == {NS_NAME: "team-a"}  # no object: its name label only
    assert not table.set_namespaces({}, removed=["never-seen"])
    assert table.set_namespaces({"team-c": {NS_NAME: "team-c"}}, replace=True)
    assert table.namespace_labels == {"team-c": {NS_NAME: "team-c"}}
    assert not table.set_namespaces({"team-c": {NS_NAME: "team-c"}}, replace=True)


def test_a_relabelled_namespace_changes_the_next_decision_of_a_cached_signature():
    """The scheduler caches each signature's filter results; a namespace whose labels change must
    drop them: the same pod (anti-affine to db pods of namespaces labelled team=a) is first kept off
    a1, then, with team-a relabelled, may go there."""
    table = zone_table(on(lp("db", "team-a", app="db"), "a1"))
    table.set_namespaces({"team-a": TEAM_A})
    sched = scheduler(table)
    incoming = with_terms(lp("web", cpu="100m"), required=[aterm(app="db", ns_selector={"matchLabels": {"team": "a"}})])
    first = sched.feasible_mask(incoming.info())[1]
    assert {table.names[i] for i in np.flatnonzero(first)} == ALL4 - {"a1"}
    table.set_namespaces({"team-a": {"team": "z", NS_NAME: "team-a"}})
    again = sched.feasible_mask(incoming.info())[1]
    assert {table.names[i] for i in np.flatnonzero(again)} == ALL4


def test_namespace_labels_of_sets_the_name_label():
    from shardsched.api.podaffinity import namespace_labels_of

    assert namespace_labels_of({"metadata": {"name": "a", "labels": {"team": "x", NS_NAME: "wrong"}}}) == (
        "a", {"team": "x", NS_NAME: "a"})
    assert namespace_labels_of({"metadata": {"name": "b", "labels": None}}) == ("b", {NS_NAME: "b"})
    with pytest.raises(InvalidObjectError, match="metadata.name"):
        namespace_labels_of({"metadata": {"labels": {}}})
