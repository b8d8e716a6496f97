"""DefaultPreemption's shared search (`shared.SharedSearch`) against searching afresh for every pod:
on random small clusters, preemptors of one or two specs decided one after the other over the table
the ones before left (their victims terminating, themselves on their nodes, now and then a victim
gone or a node changed between two of them), both ways with the same random source: the same node,
victims (in order), PDB violations and message at every step."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from builders import default_framework, node, pod, table_of
from shardsched.api.disruption import PodDisruptionBudget
from shardsched.cache.node_table import PodUsage
from shardsched.framework.cycle_state import CycleState
from shardsched.plugins.defaultpreemption.plugin import DefaultPreemption
from shardsched.scheduler.algorithm import GenericScheduler
from test_preemption_search import random_cluster


def _spec(rng: np.random.Generator) -> dict:
    """A preemptor's spec: requests, priority, labels, now and then a host port or a spread
    constraint (a topology plugin: the shared search steps aside)."""
    roll = rng.random()
    return {"cpu": str(rng.choice(["1", "2", "3"])), "memory": str(rng.choice(["512Mi", "1Gi", "3Gi"])),
            "priority": int(rng.choice([1, 5, 10, 20])), "app": str(rng.choice(["w", "a"])),
            "port": roll < 0.1, "spread": 0.1 <= roll < 0.15}


def _preemptor(spec: dict, k: int):
    p = pod(f"pre{k}", cpu=spec["cpu"], memory=spec["memory"]).with_priority(spec["priority"])
    p = p.with_labels(app=spec["app"])
    if spec["port"]:
        p = p.with_host_port(9090)
    if spec["spread"]:
        p = p.with_spread(app="a")
    return p.info()


def _outcome(pf):
    return (pf.status.code, pf.status.message, pf.nominated_node, [u.key for u in pf.victims], pf.num_pdb_violations)


def _prepare(table, info, node_name, victims) -> None:
    """What the coordinator's preemption leaves in the table: the victims terminating by a
    preemption, the preemptor assumed on its node."""
    for u in victims:
        if u.deleting and u.preempted:
            continue
        if table.remove_pod(u.uid) is not None:
            table.add_pod(replace(u, deleting=True, preempted=True), node_name)
    table.add_pod(PodUsage.of(info), node_name)


def _decide_all(nodes, running, pdbs, specs, steps, seed, pct, absolute, shared):
    table = table_of(*nodes, pods=running)
    sched = GenericScheduler(default_framework(), table, seed=seed)
    sched.pdbs = list(pdbs)
    plugin = DefaultPreemption(pct, absolute, shared=shared)
    out = []
    for k, (which, event) in enumerate(steps):
        info = _preemptor(specs[which], k)
        result = sched.schedule(info, assume=False)
        if result.node is not None:
            out.append(("fits", result.node))
            table.add_pod(PodUsage.of(info), result.node)
        else:
            pf = plugin.post_filter(CycleState(), info, result.status.diagnosis, sched)
            out.append(_outcome(pf))
            if pf.nominated_node:
                _prepare(table, info, pf.nominated_node, pf.victims)
        if event == "gone":  # a victim's grace period ended
            going = sorted(u for u, s in table.pod_slot.items() if table.pods[s][u].deleting)
            if going:
                table.remove_pod(going[0])
        elif event == "budget" and sched.pdbs:  # the disruption controller moved a budget
            b = sched.pdbs[0]
            sched.pdbs[0] = replace(b, disruptions_allowed=b.disruptions_allowed + 1)
        elif event == "node":  # a node joins: the table's nodes change
            table.add_node(node(f"late{k}", cpu="2").info())
    kept = plugin._shared.reads - plugin._shared.evaluations if plugin._shared is not None else 0
    return out, kept


def test_shared_search_decides_as_searching_afresh():
    compared = kept = preempted = 0
    for case in range(160):
        rng = np.random.default_rng(1000 + case)
        nodes, running, pdbs, _ = random_cluster(rng)
        specs = [_spec(rng), _spec(rng)]
        steps = [(int(rng.random() < 0.25), str(rng.choice(["", "", "", "", "gone", "budget", "node"])))
                 for _ in range(int(rng.integers(3, 12)))]
        pct, absolute = (10, 100) if case % 3 else (0, int(rng.integers(1, 3)))
        (a, reused), (b, _) = (_decide_all(nodes, running, pdbs, specs, steps, case, pct, absolute, shared)
                               for shared in (True, False))
        assert a == b, f"case {case}"
        compared += len(a)
        kept += reused
        preempted += sum(1 for o in a if o[0] != "fits" and o[2])
    # many decisions were read from an evaluation kept from an earlier one, many preempted
    assert compared > 900 and kept > 150 and preempted > 300, (compared, kept, preempted)


def test_a_burst_of_one_spec_reads_one_evaluation():
    """PreemptionBasic in small: every node full of low-priority pods, preemptors of one spec one
    after another: each is read from the one evaluation (kept current on the node the one before
    took), and decides as searching afresh; once every node is taken, none fits."""
    nodes = [node(f"n{i:02d}", cpu="4") for i in range(30)]
    running = [pod(f"v{i:02d}-{j}", cpu="900m").started(j + 1).on(f"n{i:02d}") for i in range(30) for j in range(4)]
    pdbs = [PodDisruptionBudget.from_object({"metadata": {"name": "none", "namespace": "default"},
                                             "spec": {"selector": {"matchLabels": {"app": "x"}}}})]
    spec = {"cpu": "3", "memory": "512Mi", "priority": 10, "app": "w", "port": False, "spread": False}
    steps = [(0, "")] * 35
    (a, kept), (b, _) = (_decide_all(nodes, [p.info() for p in running], pdbs, [spec], steps, 7, 10, 5, shared)
                         for shared in (True, False))
    assert a == b
    assert kept == 34  # one evaluation of every node, then the changed node only
    assert sum(1 for o in a if o[2]) == 30 and all(len(o[3]) == 3 for o in a[:30])
    assert a[-1][2] == "" and "30 Insufficient cpu" in a[-1][1]
