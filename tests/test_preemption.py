"""DefaultPreemption (PostFilter) against kube-scheduler v1.28's rules, table-driven, over a real
NodeTable and the default profile's Filter plugins: who is a victim, the reprieve order, PDB
violations, the choice between nodes, eligibility and the messages."""

from __future__ import annotations

import json

import numpy as np
import pytest

from builders import default_framework, node, pod, table_of
from forked_cli import run_cli
from shardsched.api.disruption import PodDisruptionBudget
from shardsched.framework.status import Code
from shardsched.plugins.defaultpreemption.plugin import (NO_VICTIMS, NOT_ELIGIBLE_NEVER, NOT_ELIGIBLE_TERMINATING,
                                                         NOT_HELPFUL, DefaultPreemption)
from shardsched.scheduler.algorithm import GenericScheduler


def pdb(name: str, app: str, allowed: int, disrupted: tuple[str, ...] = ()) -> dict:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name, "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": app}}},
            "status": {"disruptionsAllowed": allowed, "disruptedPods": {n: "2026-01-01T00:00:00Z" for n in disrupted}}}


def low(name: str, cpu: str, prio: int = 0, start: int = 0, app: str | None = None, on: str = "n1"):
    p = pod(name, cpu=cpu).with_priority(prio).started(start).on(on)
    return p.with_labels(app=app) if app else p


def preempt(nodes, running, preemptor, pdbs=(), seed=0):
    """(PostFilterResult, the table) for ``preemptor``, which must fit no node first."""
    table = table_of(*nodes, pods=running)
    sched = GenericScheduler(default_framework(), table, seed=seed)
    sched.pdbs = [PodDisruptionBudget.from_object(p) for p in pdbs]
    info = preemptor.info()
    result = sched.schedule(info)
    assert result.node is None, "the preemptor fits without preemption"
    before = (table.requested[:, :table.n].copy(), {s: set(p) for s, p in enumerate(table.pods)})
    pf = sched.post_filter(info, result.status)
    # the plugin leaves the table as it found it
    assert np.array_equal(before[0], table.requested[:, :table.n])
    assert before[1] == {s: set(p) for s, p in enumerate(table.pods)}
    return pf, result


def names(pf) -> list[str]:
    return sorted(u.key.split("/")[1] for u in pf.victims)


HIGH = lambda cpu="3": pod("high", cpu=cpu).with_priority(10)  # noqa: E731

VICTIM_CASES = [
    # (id, nodes, running pods, preemptor, pdbs, node chosen, victims)
    ("lower-priority-only", [node("n1", cpu="4")], [low("a", "2", prio=5), low("b", "2", prio=20)],
     HIGH("2"), (), "n1", ["a"]),
    ("reprieve-earliest-start-first", [node("n1", cpu="4")],
     [low(f"p{i}", "900m", start=i) for i in range(1, 5)], HIGH("3"), (), "n1", ["p2", "p3", "p4"]),
    ("reprieve-higher-priority-first", [node("n1", cpu="4")],
     [low("late-high", "2", prio=5, start=9), low("early-low", "2", prio=1, start=1)], HIGH("2"), (), "n1",
     ["early-low"]),
    ("pdb-violating-reprieved-first", [node("n1", cpu="4")],
     [low("web-1", "900m", start=1, app="web"), low("db-2", "900m", start=2, app="db"),
      low("db-3", "900m", start=3, app="db"), low("web-4", "900m", start=4, app="web")],
     HIGH("3"), [pdb("db", "db", 1)], "n1", ["db-2", "web-1", "web-4"]),
    ("disrupted-pods-not-counted-again", [node("n1", cpu="4")],
     [low("db-1", "2", start=1, app="db"), low("db-2", "2", start=2, app="db")],
     HIGH("4"), [pdb("db", "db", 1, disrupted=("db-1",))], "n1", ["db-1", "db-2"]),
    ("fewest-pdb-violations", [node("n1", cpu="2"), node("n2", cpu="2")],
     [low("guarded", "2", app="db", on="n1"), low("free", "2", on="n2")], HIGH("2"), [pdb("db", "db", 0)],
     "n2", ["free"]),
    ("lowest-highest-victim-priority", [node("n1", cpu="2"), node("n2", cpu="2")],
     [low("p5", "2", prio=5, on="n1"), low("p3", "2", prio=3, on="n2")], HIGH("2"), (), "n2", ["p3"]),
    ("smallest-priority-sum", [node("n1", cpu="2"), node("n2", cpu="2")],
     [low("a1", "1", prio=3, on="n1"), low("a2", "1", prio=3, on="n1"), low("b1", "1", prio=3, on="n2"),
      low("b2", "1", prio=-5, on="n2")], HIGH("2"), (), "n2", ["b1", "b2"]),
    ("fewest-victims", [node("n1", cpu="2"), node("n2", cpu="2")],
     [low("a1", "1", on="n1"), low("a2", "1", on="n1"), low("b1", "2", on="n2")], HIGH("2"), (), "n2", ["b1"]),
    ("latest-start-of-highest-victims", [node("n1", cpu="2"), node("n2", cpu="2")],
     [low("old", "2", start=1, on="n1"), low("new", "2", start=50, on="n2")], HIGH("2"), (), "n2", ["new"]),
    ("host-port-freed", [node("n1", cpu="8")], [low("holder", "1").with_host_port(8080)],
     pod("high", cpu="1").with_priority(10).with_host_port(8080), (), "n1", ["holder"]),
    ("existing-anti-affinity-preempted", [node("n1", cpu="8")],
     [low("shy", "1").with_labels(app="shy").with_pod_affinity_term(app="w")],
     pod("high", cpu="1").with_priority(10).with_labels(app="w"), (), "n1", ["shy"]),
]


@pytest.mark.parametrize("nodes,running,preemptor,pdbs,want_node,want_victims",
                         [c[1:] for c in VICTIM_CASES], ids=[c[0] for c in VICTIM_CASES])
def test_victims_and_node(nodes, running, preemptor, pdbs, want_node, want_victims):
    pf, _ = preempt(nodes, running, preemptor, pdbs)
    assert pf.status.is_success(), pf.status.message
    assert (pf.nominated_node, names(pf)) == (want_node, want_victims)


def test_pdb_violations_counted():
    pf, _ = preempt([node("n1", cpu="2")], [low("db-1", "2", app="db")], HIGH("2"), [pdb("db", "db", 0)])
    assert (pf.nominated_node, names(pf), pf.num_pdb_violations) == ("n1", ["db-1"], 1)


FAIL_CASES = [
    ("policy-never", [node("n1", cpu="2")], [low("a", "2")], HIGH("2").with_priority(10, "Never"),
     NOT_ELIGIBLE_NEVER, None),
    ("equal-priority-is-no-victim", [node("n1", cpu="2")], [low("peer", "2", prio=10)], HIGH("2"),
     f"0/1 nodes are available: 1 {NO_VICTIMS}.", ""),
    ("too-big-even-when-empty", [node("n1", cpu="2")], [low("a", "1")], HIGH("3"),
     "0/1 nodes are available: 1 Insufficient cpu.", ""),
    ("unresolvable-everywhere", [node("n1", cpu="2").with_taint("dedicated"), node("n2", cpu="2").cordoned()],
     [low("a", "2"), low("b", "2", on="n2")], HIGH("2"), f"0/2 nodes are available: 2 {NOT_HELPFUL}.", ""),
    ("mixed", [node("n1", cpu="2").with_taint("dedicated"), node("n2", cpu="2")],
     [low("peer", "2", prio=10, on="n2")], HIGH("2"),
     f"0/2 nodes are available: 1 {NO_VICTIMS}, 1 {NOT_HELPFUL}.", ""),
]


@pytest.mark.parametrize("nodes,running,preemptor,message,nominated", [c[1:] for c in FAIL_CASES],
                         ids=[c[0] for c in FAIL_CASES])
def test_no_preemption(nodes, running, preemptor, message, nominated):
    """No victims, the preemption part of the message as upstream's, and the nomination cleared ("")
    when the search ran (left as is, None, when the pod was not eligible)."""
    pf, result = preempt(nodes, running, preemptor)
    assert pf.status.code == Code.UNSCHEDULABLE and not pf.victims
    assert pf.status.message == "preemption: " + message
    assert pf.nominated_node == nominated
    # the FitError message carries it after the Filters' part, with upstream's separator
    assert result.status.diagnosis.message().endswith(f". preemption: {message}.")


def test_terminating_victim_on_the_nominated_node_blocks_a_second_preemption():
    running = [low("going", "2").terminating_by_preemption(), low("other", "2", on="n2")]
    nominated = HIGH("2")
    nominated_info = nominated.info().nominated("n1")
    table = table_of(node("n1", cpu="2"), node("n2", cpu="2"), pods=running)
    sched = GenericScheduler(default_framework(), table, seed=0)
    result = sched.schedule(nominated.info())
    pf = sched.post_filter(nominated_info, result.status)
    assert pf.status.message == "preemption: " + NOT_ELIGIBLE_TERMINATING and pf.nominated_node is None
    # without the nomination the same pod may preempt (and takes the other node's pod or the same)
    assert sched.post_filter(nominated.info(), result.status).status.is_success()


@pytest.mark.parametrize("pct,absolute,nodes,want", [(10, 100, 5000, 500), (10, 100, 50, 50), (10, 100, 2000, 200),
                                                     (0, 3, 10, 3), (50, 0, 10, 5), (100, 0, 7, 7)])
def test_number_of_candidates(pct, absolute, nodes, want):
    """Upstream calculateNumCandidates: n * percentage / 100, at least the absolute, at most n."""
    assert DefaultPreemption(pct, absolute).num_candidates(nodes) == want


def test_the_search_covers_every_node_when_candidates_are_few():
    """With one node out of five that can be freed, it is found whatever the random offset."""
    nodes = [node(f"n{i}", cpu="2") for i in range(5)]
    running = [low(f"peer{i}", "2", prio=10, on=f"n{i}") for i in range(4)] + [low("victim", "2", on="n4")]
    for seed in range(5):
        pf, _ = preempt(nodes, running, HIGH("2"), seed=seed)
        assert (pf.nominated_node, names(pf)) == ("n4", ["victim"])


NOMINATED_YAML = """\
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: high}
value: 100
---
apiVersion: v1
kind: Node
metadata: {name: n1, labels: {kubernetes.io/hostname: n1}}
status: {allocatable: {cpu: '4', memory: 8Gi, pods: '110'}}
---
apiVersion: v1
kind: Pod
metadata: {name: slow-to-go, namespace: default}
spec:
  nodeName: n1
  terminationGracePeriodSeconds: 30
  containers: [{name: c, image: x, resources: {requests: {cpu: '3'}}}]
status: {phase: Running, startTime: '2026-01-01T00:00:01Z'}
---
apiVersion: v1
kind: Pod
metadata: {name: preemptor, namespace: default}
spec:
  priorityClassName: high
  containers: [{name: c, image: x, resources: {requests: {cpu: '3'}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: small-low, namespace: default}
spec:
  containers: [{name: c, image: x, resources: {requests: {cpu: '1'}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: small-higher, namespace: default}
spec:
  priority: 200
  containers: [{name: c, image: x, resources: {requests: {cpu: '1'}}}]
"""


def test_simulate_a_nominated_pod_holds_its_room_for_lower_priority_pods(tmp_path):
    """The victim has a grace period: it stays terminating, the preemptor waits nominated to n1; a
    pod of lower priority after it counts the nominated pod there (upstream
    RunFilterPluginsWithNominatedPods) and does not fit; the waiting preemptor is not in the node's
    usage."""
    (tmp_path / "in.yaml").write_text(NOMINATED_YAML)
    run = run_cli(["simulate", "-f", str(tmp_path / "in.yaml"), "-o", "json"], timeout=120)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    pods = {p["name"]: p for p in out["pods"]}
    assert pods["slow-to-go"]["status"] == "Preempted"
    assert "terminating (grace period 30 s)" in pods["slow-to-go"]["reason"]
    # queue order: small-higher (200) first, placed on the one free cpu; then the preemptor (100)
    assert (pods["small-higher"]["status"], pods["small-higher"]["node"]) == ("Scheduled", "n1")
    pre = pods["preemptor"]
    assert (pre["status"], pre["node"], pre["victims"], pre["nominatedNode"]) == (
        "Unschedulable", None, ["default/slow-to-go"], "n1")
    assert pre["reason"].endswith("preemption: not eligible due to a terminating pod on the nominated node..")
    low_pod = pods["small-low"]
    assert (low_pod["status"], low_pod["victims"]) == ("Unschedulable", [])
    assert low_pod["reason"].startswith("0/1 nodes are available: 1 Insufficient cpu.")
    assert out["nodes"][0]["requested"]["cpu"] == 4000  # the terminating victim and small-higher
