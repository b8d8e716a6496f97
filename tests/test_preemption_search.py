"""DefaultPreemption's vectorized victim search against the per-node search, on random small
clusters: the same nominated node, victims (in order), PDB violations and message, and the table
left as it was. Also the NodeTable's pod columns that the search reads."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner

from builders import default_framework, node, pod, table_of
from shardsched.api.disruption import PodDisruptionBudget
from shardsched.cache.node_table import PodUsage
from shardsched.cli.main import cli
from shardsched.framework.cycle_state import CycleState
from shardsched.plugins.defaultpreemption import search
from shardsched.plugins.defaultpreemption.plugin import DefaultPreemption
from shardsched.scheduler.algorithm import GenericScheduler

APPS = (None, "a", "b", "c")


def random_cluster(rng: np.random.Generator):
    """(nodes, bound pods, pdbs, preemptor), parsed: a few nodes, pods of mixed priorities with tied start
    times, now and then host ports, anti-affinity, taints, spread constraints and PDBs."""
    nodes = []
    for i in range(int(rng.integers(1, 8))):
        n = node(f"n{i}", cpu=str(rng.choice([2, 4, 8])), memory=str(rng.choice(["4Gi", "8Gi"])),
                 pods=int(rng.choice([3, 5, 110])))
        if rng.random() < 0.1:
            n = n.with_taint("dedicated")
        nodes.append(n)
    running = []
    for n in nodes:
        for j in range(int(rng.integers(0, 9))):
            p = pod(f"{n['metadata']['name']}-p{j}", cpu=str(rng.choice(["250m", "500m", "1", "2"])),
                    memory=str(rng.choice(["512Mi", "1Gi", "2Gi"])))
            p = p.with_priority(int(rng.choice([-5, 0, 3, 10])))
            start = int(rng.choice([0, 1, 2, 3]))
            if start:
                p = p.started(start)
            app = APPS[int(rng.integers(len(APPS)))]
            if app:
                p = p.with_labels(app=app)
            if rng.random() < 0.08:
                p = p.with_host_port(8080)
            if rng.random() < 0.05:
                p = p.with_pod_affinity_term(app="w")
            running.append(p.on(n["metadata"]["name"]).info())
    pdbs = [PodDisruptionBudget.from_object({
        "metadata": {"name": f"pdb-{app}", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": app}}},
        "status": {"disruptionsAllowed": int(rng.integers(0, 3))}}) for app in ("a", "b") if rng.random() < 0.4]
    pre = pod("preemptor", cpu=str(rng.choice(["2", "3", "5"])), memory=str(rng.choice(["1Gi", "3Gi"])))
    pre = pre.with_priority(int(rng.choice([1, 5, 10, 20]))).with_labels(app=str(rng.choice(["w", "a"])))
    roll = rng.random()
    if roll < 0.08:
        pre = pre.with_host_port(8080)
    elif roll < 0.16:
        pre = pre.with_spread(app="a")
    elif roll < 0.22:
        pre = pre.with_pod_affinity_term(app="b")
    elif roll < 0.26:
        pre = pre.with_pod_affinity_term(kind="podAffinity", app="c")
    return [n.info() for n in nodes], running, pdbs, pre.info()


def _outcome(pf):
    return (pf.status.code, pf.status.message, pf.nominated_node, [u.key for u in pf.victims], pf.num_pdb_violations)


def _snapshot(table):
    return table.requested[:, : table.n].copy(), [dict(p) for p in table.pods]


def test_vectorized_search_agrees_with_the_per_node_search():
    kinds: Counter[int] = Counter()
    compared = preempted = 0
    framework = default_framework()
    for case in range(250):
        rng = np.random.default_rng(case)
        nodes, running, pdbs, pre = random_cluster(rng)
        pct, absolute = (10, 100) if case % 3 else (0, int(rng.integers(1, 3)))
        outcomes = []
        for vectorized in (True, False):
            table = table_of(*nodes, pods=running)
            sched = GenericScheduler(framework, table, seed=case)
            sched.pdbs = pdbs
            info = pre
            result = sched.schedule(info, assume=False)
            if result.node is not None:
                break
            before = _snapshot(table)
            if vectorized:
                slots = np.flatnonzero(table.valid[: table.n])
                kinds.update(search.plan(info, sched, slots).kind.tolist())
            plugin = DefaultPreemption(pct, absolute, vectorized=vectorized)
            outcomes.append(_outcome(plugin.post_filter(CycleState(), info, result.status.diagnosis, sched)))
            after = _snapshot(table)
            assert np.array_equal(before[0], after[0]) and before[1] == after[1], f"case {case}: table changed"
        if len(outcomes) == 2:
            compared += 1
            preempted += outcomes[0][2] not in (None, "")
            assert outcomes[0] == outcomes[1], f"case {case}"
    # the comparison covered every kind of node and both outcomes
    assert compared > 120 and 40 < preempted < compared
    assert all(kinds[k] > 10 for k in (search.NO_VICTIMS, search.NO_FIT, search.EXACT, search.FEASIBLE)), kinds


def test_the_stop_after_enough_candidates_matches():
    """Many candidate nodes, few wanted: both searches stop at the same node and so report the
    same nominated node and victims (the walk cuts a reprieved stretch where the per-node one
    stops)."""
    nodes = [node(f"n{i:02d}", cpu="2") for i in range(40)]
    running = [pod(f"v{i:02d}", cpu="2").with_priority(i % 4).started(i % 3 + 1).on(f"n{i:02d}") for i in range(40)]
    for seed in range(10):
        outcomes = []
        for vectorized in (True, False):
            table = table_of(*nodes, pods=running)
            sched = GenericScheduler(default_framework(), table, seed=seed)
            info = pod("high", cpu="2").with_priority(10).info()
            result = sched.schedule(info, assume=False)
            plugin = DefaultPreemption(0, 3, vectorized=vectorized)
            outcomes.append(_outcome(plugin.post_filter(CycleState(), info, result.status.diagnosis, sched)))
        assert outcomes[0] == outcomes[1]
        assert outcomes[0][3][0].startswith("default/v")


@pytest.mark.parametrize("priority,want", [(0, None), (1, (1000, 1)), (5, (3000, 2)), (11, (4000, 3))])
def test_pod_columns_requested_below(priority, want):
    """Per node, the requests of the pods of strictly lower priority, kept as pods come and go."""
    table = table_of(node("n1", cpu="8"), node("n2", cpu="8"),
                     pods=[pod("a", cpu="1").with_priority(0).on("n1"), pod("b", cpu="2").with_priority(3).on("n1"),
                           pod("c", cpu="1").with_priority(10).on("n1"), pod("d", cpu="4").with_priority(11).on("n2")])
    got = table.pod_columns().requested_below(priority, table.n)
    if want is None:
        assert got is None
        return
    cpu, pods = table.res_index["cpu"], table.res_index["pods"]
    assert (int(got[cpu, 0]), int(got[pods, 0])) == want and int(got[cpu, 1]) == 0


def test_pod_columns_follow_the_table():
    """The columns follow the table through removed and re-counted pods, a removed node and a new
    resource; a pod's order is its place in its node's pod order."""
    table = table_of(node("n1", cpu="8"), node("n2", cpu="8"),
                     pods=[pod("a", cpu="1").with_priority(0).on("n1"), pod("b", cpu="2").with_priority(0).on("n1"),
                           pod("c", cpu="1").with_priority(5).on("n2")])
    cpu = table.res_index["cpu"]
    assert table.pod_columns().requested_below(6, table.n)[cpu].tolist() == [3000, 1000]
    a = next(u for u in table.pods[0].values() if u.key == "default/a")
    table.remove_pod(a.uid)
    assert int(table.pod_columns().requested_below(1, table.n)[cpu, 0]) == 2000
    table.add_pod(a, "n1")  # counted again: after b in the node's order
    cols = table.pod_columns()
    rows = cols.rows_below(1, np.ones(table.n, bool))
    by_order = [cols.usage[r].key for r in rows[np.argsort(cols.order[rows])]]
    assert by_order == [u.key for u in table.pods[0].values()] == ["default/b", "default/a"]
    table.remove_node("n2")
    assert table.pod_columns().requested_below(6, table.n)[cpu].tolist() == [3000, 0]
    table.add_pod(PodUsage.of(pod("g", requests={"example.com/gpu": 2}).with_priority(1).on("n1").info()), "n1")
    gpu = table.res_index["example.com/gpu"]
    below = table.pod_columns().requested_below(2, table.n)
    assert (int(below[gpu, 0]), int(below[cpu, 0])) == (2, 3000)


def test_bench_preemption_decides_as_the_per_node_search():
    """``bench preemption`` at a small size: both paths decide the same for each pod (the pod too
    big for any node, the pod with nothing to preempt, PreemptionBasic's preemptor and its 3 of 4
    victims)."""
    run = CliRunner().invoke(cli, ["bench", "preemption", "--nodes", "60", "--repeat", "2", "--per-node-repeat", "1",
                                   "-o", "json"])
    assert run.exit_code == 0, run.output
    by = {(r["pod"], r["path"]): r for r in json.loads(run.output)["results"]}
    assert by[("no-fit", "vectorized")]["outcome"] == "preemption: 0/60 nodes are available: 60 Insufficient cpu."
    assert by[("no-victims", "vectorized")]["outcome"].endswith("60 No preemption victims found for incoming pod.")
    for pod in ("no-fit", "no-victims"):
        assert by[(pod, "vectorized")]["outcome"] == by[(pod, "per-node")]["outcome"]
    assert [by[("preempts", p)]["outcome"].split(", ")[1] for p in ("vectorized", "per-node")] == ["3 victims"] * 2
    assert all(r["cpu_ms_per_decision"] > 0 for r in by.values())
