"""GenericScheduler: kube's FitError message, seeded random tie-breaking, the per-signature cache
(exact against a scheduler without history), no overcommit, and percentageOfNodesToScore."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import default_framework, expr, node, pod, table_of, term
from shardsched.api.objects import PodInfo
from shardsched.cache.node_table import NodeTable, PodUsage
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.runtime import Framework
from shardsched.framework.status import Code
from shardsched.scheduler.algorithm import GenericScheduler, num_feasible_nodes_to_find

GPU = "example.com/gpu"


def kube_totals(fw: Framework, table: NodeTable, p: PodInfo) -> dict[str, int]:
    """{feasible node: total weighted score}, computed plainly as kube's findNodesThatFitPod and
    prioritizeNodes do: every Filter on every node, then every Score (normalized over the feasible
    nodes) times its weight. No caching, no shortcut; plugins whose PreScore says Skip add nothing."""
    state, n = CycleState(), table.n
    ok = table.valid_slots().copy()
    for f in fw.filter_plugins:
        if not f.pre_filter(state, p, table).is_skip():
            ok &= f.filter(state, p, table, slice(0, n))
    slots = np.flatnonzero(ok)
    total = np.zeros(len(slots), np.int64)
    for ws in fw.score_plugins if len(slots) else ():
        if ws.plugin.pre_score(state, p, table).is_skip():
            continue
        raw = ws.plugin.score(state, p, table, slots)
        total += ws.weight * (ws.plugin.normalize_score(state, p, raw) if ws.plugin.normalizes else raw)
    return {table.names[s]: int(v) for s, v in zip(slots, total)}


def scheduler_totals(sched: GenericScheduler, p: PodInfo) -> dict[str, int]:
    """{feasible node: total} as `sched` sees it now, through its per-signature cache entry (static
    scores equal on every node are left out of its totals, as `_select` does)."""
    entry = sched._entry(p)
    if entry.rejected is not None:
        return {}
    final = entry.final.copy()
    feasible = final >= 0
    for plugin, weight, raw in entry.scores_static:
        final[feasible] += weight * plugin.normalize_score(entry.state, p, raw[feasible])
    return {sched.table.names[s]: int(final[s]) for s in np.flatnonzero(feasible)}


def best(totals: dict[str, int]) -> set[str]:
    top = max(totals.values(), default=None)
    return {k for k, v in totals.items() if v == top}


# ------------------------------------------------------------------------------- FitError message
def _message(nodes, p) -> str:
    result = GenericScheduler(default_framework(), table_of(*nodes)).schedule(p.info())
    assert result.node is None and result.status.code == Code.UNSCHEDULABLE
    return result.status.message


@pytest.mark.parametrize(
    "nodes, p, message",
    [
        ([node("small", cpu="1"), node("t1").with_taint("k", "v"), node("t2", cpu="1").with_taint("k", "v")],
         pod(cpu="2"), "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) had untolerated taint {k: v}."),
        # a node failing two resources counts under both; a node counts only under its first failing
        # plugin ("off" is also too small, but NodeUnschedulable runs before NodeResourcesFit)
        ([node("tiny", cpu="1", memory="1Gi"), node("nomem", memory="1Gi"), node("off", cpu="1").cordoned()],
         pod(cpu="2", memory="2Gi"),
         "0/3 nodes are available: 1 Insufficient cpu, 1 node(s) were unschedulable, 2 Insufficient memory."),
        # sorted as strings, like kube's sort.Strings over "<count> <reason>"
        ([node(f"c{i}").cordoned() for i in range(10)] + [node("s1", cpu="1"), node("s2", cpu="1")],
         pod(cpu="2"), "0/12 nodes are available: 10 node(s) were unschedulable, 2 Insufficient cpu."),
        ([node("a").with_labels(zone="a"), node("b", pods=1)], pod().with_node_selector(zone="b"),
         "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."),
        ([node("a", pods=0), node("b").with_taint("z", "1").with_taint("a", "2")], pod(),
         "0/2 nodes are available: 1 Too many pods, 1 node(s) had untolerated taint {z: 1}."),
        ([node("a"), node("b")], pod().on("c"), "0/2 nodes are available: 2 node(s) didn't match the requested node name."),
    ],
    ids=["cpu-and-taint", "first-failing-plugin", "string-sort", "selector", "pods-and-taint-order", "node-name"],
)
def test_fit_error_message(nodes, p, message):
    assert _message(nodes, p) == message


def test_ports_reason_and_no_nodes():
    table = table_of(node("a"), pods=[pod().with_host_port(80).on("a")])
    result = GenericScheduler(default_framework(), table).schedule(pod().with_host_port(80).info())
    assert result.status.message == (
        "0/1 nodes are available: 1 node(s) didn't have free ports for the requested pod ports.")
    result = GenericScheduler(default_framework(), NodeTable()).schedule(pod().info())
    assert not result.scheduled and result.status.message == "no nodes available to schedule pods"


# ------------------------------------------------------------------------------ tie-breaking
def _tied_table() -> NodeTable:
    return table_of(*(node(f"n{i}") for i in range(5)), node("worse", cpu="1"))


def test_ties_broken_at_random_and_every_tied_node_is_chosen():
    fw, table, p = default_framework(), _tied_table(), pod(cpu="500m").info()
    assert best(kube_totals(fw, table, p)) == {f"n{i}" for i in range(5)}
    chosen = {GenericScheduler(fw, table, seed=s).schedule(p, assume=False).node for s in range(200)}
    assert chosen == {f"n{i}" for i in range(5)}


def test_tie_breaking_is_seedable():
    fw, table = default_framework(), _tied_table()

    def picks(seed):
        sched = GenericScheduler(fw, table, seed=seed)
        return [sched.schedule(pod(f"p{i}", cpu="1m").info(), assume=False).node for i in range(30)]

    assert picks(7) == picks(7)
    assert picks(7) != picks(8)


def test_unique_best_always_wins():
    fw = default_framework()
    table = table_of(node("busy"), node("idle"), pods=[pod(cpu="2", memory="4Gi").on("busy")])
    assert {GenericScheduler(fw, table, seed=s).schedule(pod(cpu="1").info(), assume=False).node
            for s in range(30)} == {"idle"}


# ------------------------------------------------------------------- the cache is exact (property)
TEMPLATES = [
    lambda: pod(cpu="500m", memory="512Mi"),
    lambda: pod(),
    lambda: pod(cpu="1", memory="1Gi").with_node_selector(zone="a"),
    lambda: pod(cpu="250m").with_toleration("dedicated", "db", effect="NoSchedule")
    .with_preferred(10, term(expr("zone", "In", "b"))),
    lambda: pod(cpu="100m").with_host_port(8080),
    lambda: pod(cpu="2", memory="3Gi").with_required(term(expr("disk", "Exists")))
    .with_preferred(5, term(expr("zone", "In", "c"))),
    lambda: pod(memory="256Mi", requests={GPU: "1"}).with_toleration("spot", effect="PreferNoSchedule"),
    lambda: pod(cpu="100m").on("n0"),  # same spec but for spec.nodeName: different decisions
    lambda: pod(cpu="100m").on("n1"),
]

_node_spec = st.fixed_dictionaries({
    "cpu": st.sampled_from(["1", "2", "4"]),
    "memory": st.sampled_from(["2Gi", "4Gi", "8Gi"]),
    "pods": st.sampled_from([3, 5, 110]),
    "zone": st.sampled_from(["a", "b", "c"]),
    "ssd": st.booleans(),
    "taint": st.sampled_from([None, ("dedicated", "db", "NoSchedule"), ("spot", "true", "PreferNoSchedule")]),
    "gpu": st.sampled_from([None, "1", "2"]),
})


def _node_from(name: str, spec: dict):
    n = node(name, spec["cpu"], spec["memory"], spec["pods"], alloc={GPU: spec["gpu"]} if spec["gpu"] else None)
    n.with_labels(zone=spec["zone"], **({"disk": "ssd"} if spec["ssd"] else {}))
    if spec["taint"]:
        n.with_taint(*spec["taint"])
    return n


_template = st.integers(0, len(TEMPLATES) - 1)
_ARGS = {
    "schedule": (_template,),
    "check": (_template,),
    "remove_pod": (st.integers(0, 99),),
    # pods bound by someone else on many nodes at once (more than the scalar update handles)
    "observe": (st.integers(0, 99),),
    "add_node": (_node_spec,),
    "remove_node": (st.integers(0, 99),),
    "cordon": (st.integers(0, 99), st.booleans()),
    "relabel": (st.integers(0, 99), _node_spec),
}
# node (static) changes are rarer, so cached entries live long enough to be updated incrementally
_KINDS = ["schedule"] * 5 + ["check"] * 3 + ["remove_pod"] * 3 + ["observe"] * 2 + [
    "add_node", "remove_node", "cordon", "relabel"]
_op = st.sampled_from(_KINDS).flatmap(lambda kind: st.tuples(st.just(kind), *_ARGS[kind]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(initial=st.lists(_node_spec, min_size=2, max_size=16), ops=st.lists(_op, min_size=5, max_size=60),
       seed=st.integers(0, 2**16))
def test_cache_is_exact(initial, ops, seed):
    fw = default_framework()
    table = table_of(*(_node_from(f"n{i}", s) for i, s in enumerate(initial)))
    cached = GenericScheduler(fw, table, seed=seed)
    placed: list[PodInfo] = []
    counter = itertools.count()

    def fresh_view(p: PodInfo) -> dict[str, int]:
        """The same decision from a scheduler with no history (and new plugin instances)."""
        return scheduler_totals(GenericScheduler(default_framework(), table), p)

    def check(p: PodInfo) -> None:
        mine = scheduler_totals(cached, p)
        assert mine == fresh_view(p)
        assert best(mine) == best(kube_totals(fw, table, p))

    for op, *args in ops:
        names = sorted(table.index)
        if op == "schedule":
            p = TEMPLATES[args[0]]().info()  # a new uid each time
            result = cached.schedule(p, assume=False)  # the cached path updates its entry itself here
            totals = fresh_view(p)
            if result.node is None:
                assert totals == {}
                assert result.status.message == GenericScheduler(default_framework(), table).schedule(
                    p, assume=False).status.message
            else:
                assert result.node in best(totals)
                table.add_pod(PodUsage.of(p), result.node)
                placed.append(p)
        elif op == "check":
            check(TEMPLATES[args[0]]().info())
        elif op == "remove_pod" and placed:
            table.remove_pod(placed.pop(args[0] % len(placed)).uid)
        elif op == "observe":
            for name in names[args[0] % 3:]:
                foreign = pod(f"f{next(counter)}", cpu="100m", memory="128Mi").on(name).info()
                table.add_pod(PodUsage.of(foreign), name)
        elif op == "add_node":
            name = f"added{next(counter)}"
            table.add_node(_node_from(name, args[0]).info())
        elif op == "remove_node" and len(names) > 1:
            table.remove_node(names[args[0] % len(names)])
            placed = [p for p in placed if table.node_of(p.uid) is not None]
        elif op == "cordon":
            table.set_unschedulable(names[args[0] % len(names)], args[1])
        elif op == "relabel":  # labels, taints and allocatable change; the node's pods stay
            name = names[args[0] % len(names)]
            table.add_node(_node_from(name, args[1]).cordoned(bool(table.unschedulable[table.index[name]])).info())
    for make in TEMPLATES:
        check(make().info())


def test_spec_node_name_is_part_of_the_signature():
    """Two pods identical but for spec.nodeName must not share a cached decision."""
    sched = GenericScheduler(default_framework(), table_of(node("n1"), node("n2")))
    assert sched.schedule(pod("a", cpu="1").on("n1").info()).node == "n1"
    assert sched.schedule(pod("b", cpu="1").on("n2").info()).node == "n2"


@pytest.mark.parametrize("refused, partial_view, plugin", [
    (pod("x", cpu="1").with_pod_affinity_term("podAffinity"), True, "InterPodAffinity"),
    (pod("x", cpu="1").with_spread("DoNotSchedule"), True, "PodTopologySpread"),
    (pod("x", cpu="1").with_volume("data", persistentVolumeClaim={"claimName": "data"}), False, "VolumeBinding"),
], ids=["affinity-in-a-shard", "spread-in-a-shard", "pvc"])
@pytest.mark.parametrize("refused_first", [True, False], ids=["refused-first", "plain-first"])
def test_what_prefilter_refusals_read_is_part_of_the_signature(refused, partial_view, plugin, refused_first):
    """A pod refused at PreFilter (a constraint shardsched does not implement, or one a shard cannot
    check from its own nodes: a cached decision of its signature) and a pod identical but for that
    constraint must not share the cached decision, in either order."""
    sched = GenericScheduler(default_framework(partial_view=partial_view), table_of(node("n1"), node("n2")))
    plain = pod("plain", cpu="1").info()
    order = [refused.info(), plain] if refused_first else [plain, refused.info()]
    results = {r.pod.name: r for r in (sched.schedule(p) for p in order)}
    assert results["plain"].node in ("n1", "n2")
    assert results["x"].node is None and results["x"].status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert f"(plugin {plugin}" in results["x"].status.message


def test_framework_reused_with_a_new_table():
    """Plugins keep per-table data; a framework outliving its table (a shard rebuilding its table
    after a relist) must never see the old table's data, even where Python reuses its id()."""
    fw = default_framework()
    for i in range(40):
        effect = "NoSchedule" if i % 2 else "PreferNoSchedule"
        table = table_of(node("n1").with_taint("k", "v", effect))
        result = GenericScheduler(fw, table).schedule(pod(f"p{i}").info())
        assert result.scheduled == (effect == "PreferNoSchedule"), i
        del table


# --------------------------------------------------------------------------- never overcommit
_res_pod = st.fixed_dictionaries({"cpu": st.integers(1, 3000), "memory": st.integers(1, 6 * 2**30)},
                                 optional={GPU: st.integers(1, 2)})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.lists(_node_spec, min_size=1, max_size=6), pods=st.lists(_res_pod, min_size=1, max_size=6),
       seed=st.integers(0, 2**16))
def test_fit_never_exceeds_allocatable(nodes, pods, seed):
    table = table_of(*(_node_from(f"n{i}", s) for i, s in enumerate(nodes)))
    sched = GenericScheduler(default_framework(), table, seed=seed)
    for k, reqs in enumerate(pods):
        for i in range(60):  # place copies until one does not fit
            p = pod(f"p{k}-{i}", requests={r: (f"{v}m" if r == "cpu" else str(v)) for r, v in reqs.items()})
            p.with_toleration()  # tolerate every taint: only resources limit placement
            if not sched.schedule(p.info()).scheduled:
                break
    valid = table.valid_slots()
    assert (table.requested[:, : table.n][:, valid] <= table.alloc[:, : table.n][:, valid]).all()


# ------------------------------------------------------------------ percentageOfNodesToScore
@pytest.mark.parametrize(
    "percentage, nodes, expected",
    [
        (None, 5000, 5000),  # shardsched's default: score every feasible node
        (0, 50, 50),  # fewer than minFeasibleNodesToFind (100): all
        (0, 99, 99),
        (0, 100, 100),  # 50% of 100 = 50, raised to 100
        (0, 200, 100),  # 49% = 98 -> 100
        (0, 1000, 420),  # 50 - 1000/125 = 42%
        (0, 5000, 500),  # 10%
        (0, 6000, 300),  # 50 - 48 = 2% -> at least 5%
        (0, 10000, 500),
        (10, 500, 100),
        (10, 5000, 500),
        (50, 1000, 500),
        (100, 1000, 1000),
        (1, 200, 100),
    ],
    ids=lambda v: str(v),
)
def test_num_feasible_nodes_to_find(percentage, nodes, expected):
    assert num_feasible_nodes_to_find(percentage, nodes) == expected


def test_sampled_path_returns_feasible_nodes():
    # 300 nodes, 2 of 3 cordoned; 10% -> look for 100 feasible nodes, starting where the last pod stopped
    nodes = [node(f"n{i:03}", cpu="2").cordoned(i % 3 != 0) for i in range(300)]
    table = table_of(*nodes)
    sched = GenericScheduler(default_framework(percentage=10), table, seed=1)
    feasible = {f"n{i:03}" for i in range(0, 300, 3)}
    chosen = []
    for i in range(150):
        result = sched.schedule(pod(f"p{i}", cpu="1").info())
        assert result.node in feasible
        chosen.append(result.node)
    assert len(set(chosen)) == 100  # 2 pods of 1 cpu fit each feasible node, all 200 cpu slots reachable
    assert sched.schedule(pod("x", cpu="1").info()).scheduled
    result = sched.schedule(pod("too-big", cpu="3").info())
    assert result.status.message == (
        "0/300 nodes are available: 100 Insufficient cpu, 200 node(s) were unschedulable.")


def test_sampled_path_finds_a_lone_feasible_node():
    nodes = [node(f"n{i:03}").with_labels(zone="b" if i == 217 else "a") for i in range(250)]
    sched = GenericScheduler(default_framework(percentage=5), table_of(*nodes), seed=3)
    for i in range(3):
        assert sched.schedule(pod(f"p{i}", cpu="1").with_node_selector(zone="b").info()).node == "n217"


# ------------------------------------------------------- schedule_many: many pods of one signature
MOST_ALLOCATED = """
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
  pluginConfig:
  - name: NodeResourcesFit
    args: {scoringStrategy: {type: MostAllocated}}
"""
NO_SCORES = """
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
  plugins: {score: {disabled: [{name: "*"}]}}
"""


def _framework(config: str | None) -> Framework:
    from shardsched.config import load_config
    from shardsched.scheduler.algorithm import build_schedulers
    return build_schedulers(load_config(config), NodeTable(), 0)["default-scheduler"].framework


@pytest.mark.parametrize("config, nodes, make, count", [
    (None, [node(f"n{i}") for i in range(12)], lambda i: pod(f"p{i}", cpu="500m", memory="256Mi"), 60),
    (None, [node(f"n{i}", cpu=c) for i, c in enumerate([2, 4, 8] * 3)], lambda i: pod(f"p{i}", cpu="700m"), 70),
    (MOST_ALLOCATED, [node(f"n{i}") for i in range(6)], lambda i: pod(f"p{i}", cpu="1"), 30),
    (None, [node(f"n{i}", cpu="64", memory="512Gi") for i in range(5)], lambda i: pod(f"p{i}", cpu="1m"), 40),
], ids=["spread-then-full", "mixed-sizes", "most-allocated-packs", "scores-that-stay"])
def test_schedule_many_chooses_as_one_by_one_scheduling_would(config, nodes, make, count):
    """Every node schedule_many chooses is one of kube's best nodes for that pod once the pods
    before it are assumed (replayed without cache or shortcut), and a pod it leaves out fits no node,
    with the one-by-one message; MostAllocated (a node's score rises once taken) packs."""
    fw = _framework(config)
    sched = GenericScheduler(fw, table_of(*nodes), seed=4)
    pods = [make(i).info() for i in range(count)]
    results = sched.schedule_many(pods)
    replay = table_of(*nodes)
    for p, r in zip(pods, results):
        totals = kube_totals(fw, replay, p)
        if r.node is None:
            assert not totals
            assert r.status.message == GenericScheduler(fw, replay).schedule(p, assume=False).status.message
            continue
        assert r.node in best(totals), (p.name, r.node, best(totals))
        replay.add_pod(PodUsage.of(p), r.node)
    assert [sched.table.pod_slot.get(p.uid) for p in pods] == [replay.pod_slot.get(p.uid) for p in pods]


def test_schedule_many_draws_each_choice_among_every_tied_node():
    """No score plugin: every node ties for every pod. One-by-one selection puts two pods on one
    of two nodes half of the time; placing distinct nodes at once would never do it."""
    fw = _framework(NO_SCORES)
    same = 0
    for seed in range(200):
        sched = GenericScheduler(fw, table_of(node("a"), node("b")), seed=seed)
        first, second = sched.schedule_many([pod(f"p{i}", cpu="100m").info() for i in range(2)])
        same += first.node == second.node
    assert 70 <= same <= 130, same
