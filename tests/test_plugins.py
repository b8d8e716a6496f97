"""The in-tree plugins, table-driven against kube-scheduler's rules (v1.28-v1.31 plugins/...), with
expected scores worked out by hand from the upstream formulas, and a property test that every
dynamic plugin's scalar path (`filter_slot` / `score_slot`) agrees with its vectorized one."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import expr, node, pod, run_filter, run_score, table_of, term
from shardsched.cache.node_table import NodeTable, PodUsage
from shardsched.config import parse_plugin_args
from shardsched.config.registry import GUARDED_PLUGIN_POINTS
from shardsched.errors import InvalidObjectError
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import FilterPlugin
from shardsched.framework.status import Code
from shardsched.plugins.registry import REGISTRY
from shardsched.plugins.unimplemented import plugin as unimplemented

GI = 2**30
MI = 2**20


def make(name: str, args: dict | None = None):
    """A plugin built as a profile builds it: args validated, then the registry's factory."""
    return REGISTRY[name](None if args is None else parse_plugin_args(name, args))


# ------------------------------------------------------------------------- NodeUnschedulable
UNSCHED = "node.kubernetes.io/unschedulable"


@pytest.mark.parametrize(
    "cordoned, p, fits",
    [
        (False, pod(), True),
        (True, pod(), False),
        (True, pod().with_toleration(UNSCHED, effect="NoSchedule"), True),
        (True, pod().with_toleration(UNSCHED), True),  # Exists, any effect
        (True, pod().with_toleration(UNSCHED, "", effect="NoSchedule"), True),  # Equal to the empty value
        (True, pod().with_toleration(), True),  # empty key + Exists tolerates everything
        (True, pod().with_toleration(UNSCHED, effect="NoExecute"), False),
        (True, pod().with_toleration(UNSCHED, "true", effect="NoSchedule"), False),
        (True, pod().with_toleration("other", effect="NoSchedule"), False),
    ],
    ids=["schedulable", "cordoned", "tolerates-exists-noschedule", "tolerates-exists", "tolerates-equal-empty",
         "tolerates-all", "wrong-effect", "wrong-value", "other-key"],
)
def test_node_unschedulable(cordoned, p, fits):
    table = table_of(node("n1").cordoned(cordoned))
    passed, reasons = run_filter(make("NodeUnschedulable"), p, table)
    assert passed == ({"n1"} if fits else set())
    assert reasons == ({} if fits else {"node(s) were unschedulable": 1})


def test_node_name():
    table = table_of(node("n1"), node("n2"))
    plugin = make("NodeName")
    assert run_filter(plugin, pod(), table) == ({"n1", "n2"}, {})
    passed, reasons = run_filter(plugin, pod().on("n2"), table)
    assert passed == {"n2"} and reasons == {"node(s) didn't match the requested node name": 1}


# --------------------------------------------------------------------------- TaintToleration
def _raw_toleration(**t):
    p = pod()
    p["spec"]["tolerations"] = [t]
    return p


@pytest.mark.parametrize(
    "taints, p, fits, reason",
    [
        ([("k", "v", "NoSchedule")], pod(), False, "{k: v}"),
        ([("k", "v", "NoExecute")], pod(), False, "{k: v}"),
        ([("k", "v", "PreferNoSchedule")], pod(), True, None),
        ([("k", "v", "NoSchedule")], pod().with_toleration("k", "v"), True, None),
        ([("k", "v", "NoSchedule")], _raw_toleration(key="k", value="v"), True, None),  # operator "" = Equal
        ([("k", "v", "NoSchedule")], pod().with_toleration("k", "w"), False, "{k: v}"),
        ([("k", "v", "NoSchedule")], pod().with_toleration("k"), True, None),
        ([("k", "v", "NoExecute")], pod().with_toleration(), True, None),
        ([("k", "v", "NoSchedule")], pod().with_toleration("k", "v", effect="NoExecute"), False, "{k: v}"),
        ([("k", "v", "NoSchedule")], pod().with_toleration("k", "v", effect="NoSchedule"), True, None),
        ([("k", "v", "NoSchedule")], pod().with_toleration("k", effect="PreferNoSchedule"), False, "{k: v}"),
        ([("k1", "a", "NoSchedule"), ("k2", "b", "NoExecute")], pod().with_toleration(effect="NoSchedule"),
         False, "{k2: b}"),
        # the first untolerated taint in spec order is named (FindMatchingUntoleratedTaint)
        ([("z", "1", "NoSchedule"), ("a", "2", "NoSchedule")], pod(), False, "{z: 1}"),
        ([("p", "x", "PreferNoSchedule"), ("m", "y", "NoExecute")], pod(), False, "{m: y}"),
        ([("k", None, "NoSchedule")], pod(), False, "{k: }"),
        ([("k", None, "NoSchedule")], pod().with_toleration("k", ""), True, None),
    ],
    ids=["noschedule", "noexecute", "prefer-does-not-filter", "equal", "operator-omitted-is-equal",
         "equal-other-value", "exists", "empty-key-exists-tolerates-all", "effect-must-match",
         "effect-matches", "prefer-toleration-not-enough", "first-untolerated-named", "spec-order",
         "prefer-skipped-in-message", "empty-value", "equal-empty-value"],
)
def test_taint_toleration_filter(taints, p, fits, reason):
    n = node("n1")
    for key, value, effect in taints:
        n.with_taint(key, value, effect)
    passed, reasons = run_filter(make("TaintToleration"), p, table_of(n, node("clean")))
    assert passed == ({"n1", "clean"} if fits else {"clean"})
    assert reasons == ({} if fits else {f"node(s) had untolerated taint {reason}": 1})


def _prefer_table() -> NodeTable:
    return table_of(
        node("none"),
        node("one").with_taint("a", "1", "PreferNoSchedule"),
        node("two").with_taint("a", "1", "PreferNoSchedule").with_taint("b", "2", "PreferNoSchedule"),
        node("hard").with_taint("c", "3", "NoSchedule"),  # not counted by Score
    )


@pytest.mark.parametrize(
    "p, expected",
    [
        # raw counts 0, 1, 2, 0 -> DefaultNormalizeScore reversed: 100 - 100 * c / max
        (pod(), {"none": 100, "one": 50, "two": 0, "hard": 100}),
        (pod().with_toleration("a", "1", effect="PreferNoSchedule"), {"none": 100, "one": 100, "two": 0, "hard": 100}),
        (pod().with_toleration("a", "1"), {"none": 100, "one": 100, "two": 0, "hard": 100}),  # no effect = all
        (pod().with_toleration("a", "1", effect="NoSchedule"), {"none": 100, "one": 50, "two": 0, "hard": 100}),
        (pod().with_toleration("b", effect="PreferNoSchedule").with_toleration("c"),
         {"none": 100, "one": 0, "two": 0, "hard": 100}),
        (pod().with_toleration(), None),  # everything tolerated: every node scores the same
    ],
    ids=["none", "prefer-toleration", "effect-omitted", "noschedule-toleration-ignored", "one-each", "all"],
)
def test_taint_toleration_score(p, expected):
    assert run_score(make("TaintToleration"), p, _prefer_table()) == expected


# ------------------------------------------------------------------------------ NodeAffinity
def _affinity_table() -> NodeTable:
    return table_of(
        node("n1").with_labels(zone="a", disk="ssd", gen="3"),
        node("n2").with_labels(zone="b", disk="hdd", gen="10"),
        node("n3").with_labels(zone="c", gen="abc"),
        node("n4").with_labels(gen="1_000"),  # Go's ParseInt rejects it: never Gt/Lt
        node("n5").with_labels(gen="99999999999999999999"),  # beyond int64: never Gt/Lt
    )


ALL = {"n1", "n2", "n3", "n4", "n5"}


@pytest.mark.parametrize(
    "p, expected",
    [
        (pod(), ALL),
        (pod().with_node_selector(zone="a"), {"n1"}),
        (pod().with_node_selector(zone="a", disk="hdd"), set()),
        (pod().with_required(term(expr("zone", "In", "a", "b"))), {"n1", "n2"}),
        (pod().with_node_selector(disk="ssd").with_required(term(expr("zone", "In", "a", "b"))), {"n1"}),
        (pod().with_node_selector(zone="c").with_required(term(expr("zone", "In", "a", "b"))), set()),
        (pod().with_required(term(expr("zone", "In", "a")), term(expr("disk", "In", "hdd"))), {"n1", "n2"}),
        (pod().with_required(term(expr("zone", "In", "a", "b"), expr("disk", "In", "hdd"))), {"n2"}),
        (pod().with_required(term(expr("disk", "NotIn", "ssd"))), {"n2", "n3", "n4", "n5"}),
        (pod().with_required(term(expr("disk", "Exists"))), {"n1", "n2"}),
        (pod().with_required(term(expr("disk", "DoesNotExist"))), {"n3", "n4", "n5"}),
        (pod().with_required(term(expr("gen", "Gt", 5))), {"n2"}),
        (pod().with_required(term(expr("gen", "Lt", 5))), {"n1"}),
        (pod().with_required(term(expr("gen", "Gt", -1))), {"n1", "n2"}),
        (pod().with_required(term(expr("gen", "Lt", 10**18))), {"n1", "n2"}),
        (pod().with_required(term(expr("missing", "Lt", 10))), set()),
        (pod().with_required(term(fields=[expr("metadata.name", "In", "n2", "n3", "nx")])), {"n2", "n3"}),
        (pod().with_required(term(fields=[expr("metadata.name", "NotIn", "n1")])), ALL - {"n1"}),
        (pod().with_required(term(expr("zone", "In", "a", "b"), fields=[expr("metadata.name", "NotIn", "n1")])),
         {"n2"}),
        (pod().with_required(term()), set()),  # an empty term matches nothing
        (pod().with_required(term(), term(expr("zone", "In", "c"))), {"n3"}),
        (pod().with_preferred(10, term(expr("zone", "In", "x"))), ALL),  # preferred never filters
    ],
    ids=["no-affinity", "selector", "selector-and", "required-in", "selector-and-required",
         "selector-and-required-disjoint", "terms-ored", "expressions-anded", "notin-matches-missing",
         "exists", "does-not-exist", "gt-skips-non-integers", "lt", "gt-negative", "lt-large",
         "gt-missing-label", "match-fields-in", "match-fields-notin", "expression-and-field",
         "empty-term", "empty-term-ored", "preferred-only"],
)
def test_node_affinity_filter(p, expected):
    passed, reasons = run_filter(make("NodeAffinity"), p, _affinity_table())
    assert passed == expected
    failed = len(ALL - expected)
    assert reasons == ({"node(s) didn't match Pod's node affinity/selector": failed} if failed else {})


def test_node_affinity_added_affinity_is_checked_first_with_its_own_reason():
    plugin = make("NodeAffinity", {"addedAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}})
    table = _affinity_table()
    assert run_filter(plugin, pod(), table) == (
        {"n1", "n2"}, {"node(s) didn't match scheduler-enforced node affinity": 3})
    assert run_filter(plugin, pod().with_node_selector(disk="hdd"), table) == ({"n2"}, {
        "node(s) didn't match scheduler-enforced node affinity": 3,
        "node(s) didn't match Pod's node affinity/selector": 1})


@pytest.mark.parametrize(
    "p, expected",
    [
        # raw 10+30, 30, 0, 0, 0 -> normalized 100 * raw / 40
        (pod().with_preferred(10, term(expr("zone", "In", "a")))
         .with_preferred(30, term(expr("disk", "In", "ssd", "hdd")))
         .with_preferred(50, term()),  # an empty preferred term matches nothing
         {"n1": 100, "n2": 75, "n3": 0, "n4": 0, "n5": 0}),
        (pod().with_preferred(20, term(expr("zone", "In", "b"))).with_preferred(20, term(expr("gen", "Gt", 5))),
         {"n1": 0, "n2": 100, "n3": 0, "n4": 0, "n5": 0}),
        (pod().with_preferred(7, term(fields=[expr("metadata.name", "In", "n3")])).with_preferred(
            3, term(expr("gen", "Exists"))), {"n1": 30, "n2": 30, "n3": 100, "n4": 30, "n5": 30}),
        (pod().with_preferred(3, term(expr("zone", "In", "x"))), {"n1": 0, "n2": 0, "n3": 0, "n4": 0, "n5": 0}),
        (pod(), None),
    ],
    ids=["weights-summed", "two-terms-one-node", "match-fields", "no-match", "no-preference"],
)
def test_node_affinity_score(p, expected):
    assert run_score(make("NodeAffinity"), p, _affinity_table()) == expected


def test_node_affinity_added_preferred_terms_add_up():
    plugin = make("NodeAffinity", {"addedAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 60, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["c"]}]}}]}})
    p = pod().with_preferred(20, term(expr("zone", "In", "a")))
    assert run_score(plugin, p, _affinity_table()) == {"n1": 33, "n2": 0, "n3": 100, "n4": 0, "n5": 0}


# -------------------------------------------------------------------------------- NodePorts
def _port_pod(port, protocol=None, host_ip=None):
    return pod().with_host_port(port, protocol, host_ip)


@pytest.mark.parametrize(
    "used, wanted, fits",
    [
        (_port_pod(80), _port_pod(80), False),
        (_port_pod(80, host_ip="127.0.0.1"), _port_pod(80, host_ip="127.0.0.1"), False),
        (_port_pod(80, host_ip="127.0.0.1"), _port_pod(80, host_ip="127.0.0.2"), True),
        (_port_pod(80, host_ip="127.0.0.1"), _port_pod(80), False),  # 0.0.0.0 overlaps every IP
        (_port_pod(80), _port_pod(80, host_ip="10.0.0.1"), False),
        (_port_pod(80, host_ip="0.0.0.0"), _port_pod(80, host_ip="10.0.0.1"), False),
        (_port_pod(80, "TCP"), _port_pod(80, "UDP"), True),
        (_port_pod(80), _port_pod(80, "TCP"), False),  # empty protocol is TCP
        (_port_pod(80, "UDP"), _port_pod(80, "UDP"), False),
        (_port_pod(53, "SCTP"), _port_pod(53, "UDP"), True),
        (_port_pod(80), _port_pod(8080), True),
        (_port_pod(80).with_host_port(443), _port_pod(8080).with_host_port(443, "TCP", "1.2.3.4"), False),
    ],
    ids=["same-port", "same-ip", "other-ip", "any-ip-wanted", "any-ip-used", "explicit-any-ip",
         "tcp-vs-udp", "empty-protocol-is-tcp", "udp-udp", "sctp-vs-udp", "other-port", "second-port"],
)
def test_node_ports(used, wanted, fits):
    table = table_of(node("n1"), node("free"), pods=[used.on("n1")])
    passed, reasons = run_filter(make("NodePorts"), wanted, table)
    assert passed == ({"n1", "free"} if fits else {"free"})
    assert reasons == ({} if fits else {"node(s) didn't have free ports for the requested pod ports": 1})


def test_node_ports_container_port_without_host_port_and_removal():
    plugin = make("NodePorts")
    used = _port_pod(80).on("n1")
    table = table_of(node("n1"), pods=[used])
    no_host_port = pod()
    no_host_port["spec"]["containers"][0]["ports"] = [{"containerPort": 80}]
    assert run_filter(plugin, no_host_port, table) == ({"n1"}, {})
    assert run_filter(plugin, _port_pod(80), table)[0] == set()
    table.remove_pod(used["metadata"]["uid"])
    assert run_filter(plugin, _port_pod(80), table) == ({"n1"}, {})


# -------------------------------------------------------------------- NodeResourcesFit Filter
GPU = "example.com/gpu"


@pytest.mark.parametrize(
    "n, existing, p, args, reasons",
    [
        (node("n"), [pod(cpu="3", memory="4Gi")], pod(cpu="1", memory="4Gi"), None, set()),  # exactly full
        (node("n"), [pod(cpu="3")], pod(cpu="1001m"), None, {"Insufficient cpu"}),
        (node("n"), [pod(memory="7Gi")], pod(memory="1025Mi"), None, {"Insufficient memory"}),
        (node("n"), [pod(cpu="4", memory="8Gi")], pod(cpu="1m", memory="1"), None,
         {"Insufficient cpu", "Insufficient memory"}),
        (node("n", pods=2), [pod(), pod()], pod(), None, {"Too many pods"}),
        (node("n", pods=2), [pod(cpu="4"), pod()], pod(cpu="1"), None, {"Too many pods", "Insufficient cpu"}),
        (node("n", pods=None), [], pod(), None, {"Too many pods"}),  # no pods allocatable: 0
        (node("n"), [pod(cpu="4", memory="8Gi")], pod(), None, set()),  # no requests: only the pod count
        (node("n", alloc={"ephemeral-storage": "10Gi"}), [], pod(requests={"ephemeral-storage": "11Gi"}), None,
         {"Insufficient ephemeral-storage"}),
        (node("n"), [], pod(requests={GPU: "1"}), None, {f"Insufficient {GPU}"}),  # node lacks it: 0
        (node("n", alloc={GPU: "2"}), [pod(requests={GPU: "1"})], pod(requests={GPU: "1"}), None, set()),
        (node("n", alloc={GPU: "2"}), [pod(requests={GPU: "1"})], pod(requests={GPU: "2"}), None,
         {f"Insufficient {GPU}"}),
        (node("n"), [], pod(requests={"hugepages-2Mi": "2Mi"}), None, {"Insufficient hugepages-2Mi"}),
        (node("n"), [], pod(requests={GPU: "1"}), {"ignoredResources": [GPU]}, set()),
        (node("n"), [], pod(cpu="5", requests={GPU: "1"}), {"ignoredResources": [GPU]}, {"Insufficient cpu"}),
        (node("n"), [], pod(requests={GPU: "1"}), {"ignoredResourceGroups": ["example.com"]}, set()),
        (node("n"), [], pod(requests={"other.io/fpga": "1"}), {"ignoredResourceGroups": ["example.com"]},
         {"Insufficient other.io/fpga"}),
        # only extended resources can be ignored; *kubernetes.io/ names are native (IsPrefixedNativeResource)
        (node("n"), [], pod(requests={"example.kubernetes.io/widget": "1"}),
         {"ignoredResources": ["example.kubernetes.io/widget"]}, {"Insufficient example.kubernetes.io/widget"}),
    ],
    ids=["exactly-full", "cpu", "memory", "cpu-and-memory", "too-many-pods", "pods-and-cpu", "no-pods-allocatable",
         "zero-request-on-full-node", "ephemeral-storage", "extended-missing-on-node", "extended-fits",
         "extended-insufficient", "hugepages", "ignored-resource", "ignored-resource-others-checked",
         "ignored-group", "other-group", "prefixed-native-not-ignorable"],
)
def test_fit_filter(n, existing, p, args, reasons):
    table = table_of(n, pods=[e.on("n") for e in existing])
    passed, got = run_filter(make("NodeResourcesFit", args), p, table)
    assert passed == (set() if reasons else {"n"})
    assert got == {r: 1 for r in reasons}


# ------------------------------------------------------------- NodeResourcesFit / Balanced Score
def _score_table() -> NodeTable:
    return table_of(
        node("a", cpu="4", memory="8Gi"),
        node("b", cpu="4", memory="4Gi"),
        node("c", cpu="1", memory="1000Mi"),
        node("g", cpu="4", memory="8Gi", alloc={GPU: "4"}),
        pods=[pod(cpu="1", memory="2Gi").on("a"), pod(cpu="1", memory="2Gi").on("b"), pod().on("c")],
    )


def _strategy(kind: str, *shape: tuple[int, int], resources: dict | None = None) -> dict:
    s: dict = {"type": kind}
    if shape:
        s["requestedToCapacityRatio"] = {"shape": [{"utilization": u, "score": v} for u, v in shape]}
    if resources:
        s["resources"] = [{"name": k, "weight": w} for k, w in resources.items()]
    return {"scoringStrategy": s}


WANT = pod(cpu="500m", memory="1Gi")
RTCR = "RequestedToCapacityRatio"


@pytest.mark.parametrize(
    "args, p, expected",
    [
        # LeastAllocated: (alloc - req) * 100 / alloc per resource, weighted mean, integer division.
        # a: cpu 1.5/4 -> 62, mem 3/8Gi -> 62; b: mem 3/4 -> 25 -> (62+25)/2 = 43;
        # c: cpu (100m default + 0.5)/1 -> 40, mem (200Mi + 1Gi) > 1000Mi -> 0 -> 20; g: 87, 87
        (None, WANT, {"a": 62, "b": 43, "c": 20, "g": 87}),
        (_strategy("LeastAllocated", resources={"cpu": 3, "memory": 1}), WANT, {"a": 62, "b": 52}),
        # MostAllocated: min(req, alloc) * 100 / alloc. c: cpu 60, mem capped 100 -> 80
        (_strategy("MostAllocated"), WANT, {"a": 37, "b": 56, "c": 80, "g": 12}),
        (_strategy("MostAllocated", resources={"cpu": 1, "memory": 3}), WANT, {"b": 65}),
        # RequestedToCapacityRatio, shape scores x10; mean rounded half away from zero
        (_strategy(RTCR, (0, 0), (100, 10)), WANT, {"a": 37, "b": 56}),
        # (0,0) (30,20) (100,100): util 37 -> 20 + 80*7/70 = 28; util 75 -> 20 + 80*45/70 = 71; (28+71)/2 = 49.5
        (_strategy(RTCR, (0, 0), (30, 2), (100, 10)), WANT, {"a": 28, "b": 50}),
        # (0,100) (30,80) (100,0): util 75 -> 80 + trunc(-80*45/70) = 80 - 51 = 29 (Go truncates toward 0);
        # c: cpu util 60 -> 80 - 34 = 46, memory over capacity -> util 100 -> 0, and a 0 is left out
        (_strategy(RTCR, (0, 10), (30, 8), (100, 0)), WANT, {"a": 72, "b": 51, "c": 46}),
        # non-zero defaults: the pod and c's pod count 100m / 200Mi each
        (None, pod(), {"c": 70, "a": 72}),
        (None, pod(cpu="0", memory="0"), {"c": 85}),  # explicit zeros stay zero
        # a resource scoring 0 is left out of the RequestedToCapacityRatio mean: g cpu 0 -> only memory 50
        (_strategy(RTCR, (0, 0), (100, 10)), pod(cpu="0", memory="4Gi"), {"g": 50}),
        # extended resources: scored when requested, with their weight; a node without it leaves it out.
        # g: cpu 75, mem 75, gpu (4-3)/4 -> 25 x2 -> 200/4 = 50; b: cpu 50, mem 4Gi of 4Gi -> 0 -> 25
        (_strategy("LeastAllocated", resources={"cpu": 1, "memory": 1, GPU: 2}),
         pod(cpu="1", memory="2Gi", requests={GPU: "3"}), {"g": 50, "a": 50, "b": 25}),
        (_strategy("LeastAllocated", resources={"cpu": 1, "memory": 1, GPU: 2}), pod(cpu="1", memory="2Gi"),
         {"g": 75}),
        (_strategy("MostAllocated", resources={"cpu": 1, GPU: 1}), pod(cpu="2", requests={GPU: "1"}),
         {"g": 37, "a": 75}),
    ],
    ids=["least", "least-weighted", "most", "most-weighted", "rtcr-linear", "rtcr-rounds-half-up",
         "rtcr-truncates-toward-zero", "nonzero-defaults", "explicit-zero", "rtcr-zero-left-out",
         "extended-weighted", "extended-not-requested", "extended-missing-on-node"],
)
def test_fit_score(args, p, expected):
    got = run_score(make("NodeResourcesFit", args), p, _score_table())
    assert {k: got[k] for k in expected} == expected


BALANCED3 = {"resources": [{"name": "cpu"}, {"name": "memory"}, {"name": GPU}]}


@pytest.mark.parametrize(
    "args, p, expected",
    [
        # (1 - |f_cpu - f_mem| / 2) * 100, fractions capped at 1, actual requests (no defaults)
        (None, WANT, {"a": 100, "b": 81, "c": 75, "g": 100}),
        (None, pod(), {"a": 100, "b": 87, "c": 100}),
        # three fractions: population standard deviation; g: .375, .75, .25 -> std .2125 -> 78
        (BALANCED3, pod(cpu="1500m", memory="6Gi", requests={GPU: "1"}), {"g": 78, "a": 81}),
        (BALANCED3, pod(cpu="1500m", memory="6Gi"), {"g": 81}),  # gpu not requested: left out
    ],
    ids=["two-resources", "best-effort", "three-resources", "extended-not-requested"],
)
def test_balanced_allocation_score(args, p, expected):
    got = run_score(make("NodeResourcesBalancedAllocation", args), p, _score_table())
    assert {k: got[k] for k in expected} == expected


# ------------------------------------------- scalar paths agree with the vectorized ones (property)
_RES = ("cpu", "memory", "pods", GPU, "ephemeral-storage")
_node_alloc = st.fixed_dictionaries(
    {"cpu": st.integers(0, 8000), "pods": st.integers(0, 4)},
    optional={"memory": st.integers(0, 16 * GI), GPU: st.integers(0, 4), "ephemeral-storage": st.integers(0, 4 * GI)},
)
_pod_req = st.fixed_dictionaries({}, optional={
    "cpu": st.integers(0, 3000), "memory": st.integers(0, 6 * GI), GPU: st.integers(0, 3),
    "ephemeral-storage": st.integers(0, GI)})
_ports = st.lists(st.tuples(st.sampled_from([80, 443]), st.sampled_from([None, "UDP"]),
                            st.sampled_from([None, "10.0.0.1"])), max_size=2)


def _pod_from(i: int, reqs: dict, ports) -> dict:
    p = pod(f"p{i}", requests={k: (f"{v}m" if k == "cpu" else str(v)) for k, v in reqs.items()})
    for port, proto, ip in ports:
        p.with_host_port(port, proto, ip)
    return p


_PLUGIN_ARGS = [
    ("NodePorts", None),
    ("NodeResourcesFit", None),
    ("NodeResourcesFit", {"ignoredResources": [GPU]}),
    ("NodeResourcesFit", _strategy("MostAllocated", resources={"cpu": 2, "memory": 1, GPU: 3})),
    ("NodeResourcesFit", _strategy("LeastAllocated", resources={"cpu": 1, "ephemeral-storage": 2, GPU: 1})),
    ("NodeResourcesFit", _strategy(RTCR, (0, 10), (40, 3), (100, 7), resources={"memory": 1, GPU: 5})),
    ("NodeResourcesFit", _strategy(RTCR, (0, 0), (100, 10))),
    ("NodeResourcesBalancedAllocation", None),
    ("NodeResourcesBalancedAllocation", BALANCED3),
    ("NodeResourcesBalancedAllocation", {"resources": [{"name": "cpu"}, {"name": "memory"},
                                                       {"name": "ephemeral-storage"}, {"name": GPU}]}),
]
_PLUGINS = [make(name, args) for name, args in _PLUGIN_ARGS]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.lists(_node_alloc, min_size=1, max_size=7),
       placed=st.lists(st.tuples(st.integers(0, 6), _pod_req, _ports), max_size=10),
       removed=st.sets(st.integers(0, 6), max_size=2),
       want=st.tuples(_pod_req, _ports))
def test_scalar_paths_agree_with_vectorized(nodes, placed, removed, want):
    table = NodeTable()
    for i, alloc in enumerate(nodes):
        table.add_node(node(f"n{i}", cpu=None, memory=None, pods=None,
                            alloc={k: (f"{v}m" if k == "cpu" else str(v)) for k, v in alloc.items()}).info())
    for j, (target, reqs, ports) in enumerate(placed):
        info = _pod_from(j, reqs, ports).info()
        table.add_pod(PodUsage.of(info), f"n{target % len(nodes)}")
    for r in removed:
        if len(table.index) > 1:
            table.remove_node(f"n{r % len(nodes)}")
    p = _pod_from(99, *want).info()
    slots = np.flatnonzero(table.valid_slots())
    for plugin in _PLUGINS:
        state = CycleState()
        if isinstance(plugin, FilterPlugin) and not plugin.pre_filter(state, p, table).is_skip():
            everything = plugin.filter(state, p, table, slice(0, table.n))
            picked = plugin.filter(state, p, table, slots)
            for k, slot in enumerate(slots.tolist()):
                assert plugin.filter_slot(state, p, table, slot) == bool(everything[slot]) == bool(picked[k]), \
                    (plugin.name, slot)
        if hasattr(plugin, "score_slot") and not plugin.pre_score(state, p, table).is_skip():
            everything = plugin.score(state, p, table, slice(0, table.n))
            picked = plugin.score(state, p, table, slots)
            for k, slot in enumerate(slots.tolist()):
                assert plugin.score_slot(state, p, table, slot) == int(everything[slot]) == int(picked[k]), \
                    (plugin.name, slot)
                assert 0 <= picked[k] <= 100


# --------------------------------------------------------------------------- SchedulingGates
@pytest.mark.parametrize("p, message", [
    (pod(), None),
    (pod().with_gates("example.com/quota"), "waiting for scheduling gates: [example.com/quota]"),
    (pod().with_gates("b", "a"), "waiting for scheduling gates: [b a]"),
], ids=["no-gates", "one-gate", "gates-in-order"])
def test_scheduling_gates_pre_enqueue(p, message):
    """kube's SchedulingGates: UnschedulableAndUnresolvable while any gate is left, its names in order."""
    st = make("SchedulingGates").pre_enqueue(p.info())
    if message is None:
        assert st.is_success()
    else:
        assert (st.code, st.message) == (Code.UNSCHEDULABLE_AND_UNRESOLVABLE, message)


# ------------------------------------------------------------ stand-ins of unimplemented plugins
DRA = "DynamicResources"


@pytest.mark.parametrize("plugin, p, what", [
    (DRA, pod(), None),
    (DRA, pod().with_resource_claim("gpu", "gpu-template"),
     "resource claims of Dynamic Resource Allocation (gpu)"),
    (DRA, pod().with_volume("data", persistentVolumeClaim={"claimName": "data"}), None),
], ids=["dra-none", "dra-claim", "dra-not-volumes"])
def test_stand_ins_refuse_what_they_cannot_check(plugin, p, what):
    """Required terms are refused (UnschedulableAndUnresolvable, saying what and which plugin);
    preferred ones and pods without the constraint pass (Skip)."""
    st = unimplemented.new(plugin).pre_filter(CycleState(), p.info(), table_of(node("n1")))
    if what is None:
        assert st.is_skip()
    else:
        assert (st.code, st.plugin) == (Code.UNSCHEDULABLE_AND_UNRESOLVABLE, plugin)
        assert st.message == f"pod has {what}, which shardsched does not implement (plugin {plugin})"


VB, VR, NVL, VZ = "VolumeBinding", "VolumeRestrictions", "NodeVolumeLimits", "VolumeZone"


@pytest.mark.parametrize("plugin, p, what", [
    (VB, pod(), None),
    (VB, pod().with_volume("data", persistentVolumeClaim={"claimName": "data"}),
     "volumes that need volume binding (data)"),
    (VB, pod().with_volume("tmp", emptyDir={}).with_volume("scratch", ephemeral={"volumeClaimTemplate": {}}),
     "volumes that need volume binding (scratch)"),
    (VB, pod().with_volume("tmp", emptyDir={}).with_volume("cfg", configMap={"name": "cfg"}), None),
    (NVL, pod().with_volume("disk", azureDisk={"diskName": "d", "diskURI": "u"}),
     "volumes that need attach limits (disk: azureDisk)"),
    (NVL, pod().with_volume("data", persistentVolumeClaim={"claimName": "data"}), ""),
    (VR, pod().with_volume("data", persistentVolumeClaim={"claimName": "data"}), None),
    (VZ, pod().with_volume("data", persistentVolumeClaim={"claimName": "data"}), None),
], ids=["vb-none", "vb-pvc", "vb-ephemeral", "vb-emptydir-configmap", "nvl-azure", "nvl-claims-left-to-vb",
        "vr-claims-left-to-vb", "vz-claims-left-to-vb"])
def test_volume_plugins_hold_what_they_cannot_check_without_a_catalog(plugin, p, what):
    """A table without storage objects (the sharded runtime's): VolumeBinding holds pods with claims
    and NodeVolumeLimits those with inline in-tree disks, UnschedulableAndUnresolvable with the
    plugin's name; the others leave claims to VolumeBinding ("": PreFilter passes, None: Skip)."""
    st = make(plugin).pre_filter(CycleState(), p.info(), table_of(node("n1")))
    if what is None:
        assert st.is_skip()
    elif what == "":
        assert st.is_success()
    else:
        assert (st.code, st.plugin) == (Code.UNSCHEDULABLE_AND_UNRESOLVABLE, plugin)
        assert st.message == f"pod has {what}, which shardsched does not check in this runtime yet (plugin {plugin})"


def test_stand_ins_cover_the_guarded_plugins():
    assert unimplemented.NAMES == tuple(GUARDED_PLUGIN_POINTS)


@pytest.mark.parametrize("path, spec, where", [
    ("spread", {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "k"}]},
     "spec.topologySpreadConstraints[0].whenUnsatisfiable"),
    ("gates", {"schedulingGates": [{}]}, "spec.schedulingGates[0].name"),
    ("volumes", {"volumes": {"name": "x"}}, "spec.volumes"),
    ("anti", {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}},
     "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution"),
], ids=["spread-without-when", "gate-without-name", "volumes-not-a-list", "required-not-a-list"])
def test_malformed_constraint_fields_are_named(path, spec, where):
    p = pod()
    p.spec.update(spec)
    with pytest.raises(InvalidObjectError) as e:
        p.info()
    assert where in str(e.value)
