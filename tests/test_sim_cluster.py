"""SimCluster: the API server's bind semantics, kubelet-like admission, watch history, node
operations, fault injection, invariants, and use inside a Ray actor."""

from __future__ import annotations

import random
import re
import threading
import time

import pytest

from shardsched.api import pod_requests
from shardsched.api.objects import UNSCHEDULABLE_TAINT_KEY
from shardsched.errors import PermanentError, TemporaryError
from shardsched.cluster import (
    DELETED,
    MODIFIED,
    AlreadyExists,
    Binding,
    Conflict,
    Gone,
    MAX_WATCH_WAIT_S,
    Invalid,
    NotFound,
    ServerError,
    Timeout,
)
from shardsched.sim import FaultConfig, SimCluster, uniform_nodes, uniform_pods


def make_node(name: str = "n1", cpu: str = "2", memory: str = "4Gi", pods: int = 110, **extra: str) -> dict:
    node = uniform_nodes(1, cpu=cpu, memory=memory, pods=pods)[0]
    node["metadata"]["name"] = name
    node["status"]["allocatable"].update(extra)
    return node


def make_pod(name: str = "p1", cpu: str = "1", memory: str = "1Gi", node_name: str = "", **extra: str) -> dict:
    pod = uniform_pods(1, cpu=cpu, memory=memory)[0]
    pod["metadata"]["name"] = name
    reqs = pod["spec"]["containers"][0]["resources"]["requests"]
    reqs.update(extra)
    if extra:
        pod["spec"]["containers"][0]["resources"]["limits"] = dict(extra)
    if node_name:
        pod["spec"]["nodeName"] = node_name
    return pod


def cluster_with(nodes=(), pods=(), **kwargs) -> SimCluster:
    c = SimCluster(**kwargs)
    c.create_nodes(list(nodes))
    c.create_pods(list(pods))
    return c


# ------------------------------------------------------------------------------------------ errors

@pytest.mark.parametrize(
    "cls, base, code",
    [
        (NotFound, PermanentError, 404),
        (Conflict, PermanentError, 409),
        (AlreadyExists, PermanentError, 409),
        (Gone, PermanentError, 410),
        (Invalid, PermanentError, 422),
        (ServerError, TemporaryError, 500),
        (Timeout, TemporaryError, 504),
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_error_types(cls, base, code):
    err = cls("boom")
    assert isinstance(err, base) and cls.code == code and str(err) == "boom"


# --------------------------------------------------------------------------------------- creation

def test_create_pod_defaults_and_status_reset():
    c = SimCluster()
    obj = make_pod()
    del obj["metadata"]["namespace"]
    del obj["spec"]["schedulerName"]
    obj["status"] = {"phase": "Running"}
    pod = c.create_pod(obj)
    assert pod["metadata"]["namespace"] == "default"
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    assert pod["spec"]["priority"] == 0
    assert pod["status"] == {"phase": "Pending"}
    assert pod["metadata"]["uid"] and pod["metadata"]["creationTimestamp"].endswith("Z")
    assert obj["status"] == {"phase": "Running"}, "the caller's object is copied, not changed"


def test_uids_repeat_with_the_seed():
    a, b = (cluster_with(pods=[make_pod()], seed=7) for _ in range(2))
    assert a.get_pod("default", "p1")["metadata"]["uid"] == b.get_pod("default", "p1")["metadata"]["uid"]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda p: p["spec"].pop("containers"), "spec.containers"),
        (lambda p: p["spec"]["containers"][0]["resources"]["requests"].update(cpu="lots"), "requests.cpu"),
        (lambda p: p["metadata"].update(name="Bad_Name"), "metadata.name"),
        (lambda p: p["spec"].update(priorityClassName="nope"), "spec.priorityClassName"),
        (lambda p: p["spec"]["containers"][0]["resources"]["requests"].update(foo="1"),
         "requests.foo: 'foo' is not a resource a container can request"),
        (lambda p: p["spec"]["containers"][0]["resources"].update(limits={"cpu": "500m"}),
         "requests.cpu: 1 must be less than or equal to the cpu limit of 500m"),
        (lambda p: p["spec"]["containers"][0]["resources"]["requests"].update({"example.com/gpu": "1"}),
         "limits.example.com/gpu: a limit is required"),
        (lambda p: p["spec"]["containers"][0]["resources"].update(limits={"example.com/gpu": "500m"}),
         "limits.example.com/gpu: 500m is not a whole number"),
    ],
    ids=["no-containers", "bad-quantity", "bad-name", "unknown-priority-class", "unqualified-resource",
         "request-above-limit", "extended-without-limit", "fractional-extended"],
)
def test_create_pod_invalid(change, message):
    c = SimCluster()
    obj = make_pod()
    change(obj)
    with pytest.raises(Invalid, match=message):
        c.create_pod(obj)
    assert c.list_pods() == ([], 0)


def test_create_pods_is_all_or_nothing():
    c = cluster_with(pods=[make_pod("p1")])
    with pytest.raises(AlreadyExists):
        c.create_pods([make_pod("p2"), make_pod("p1")])
    with pytest.raises(AlreadyExists):
        c.create_pods([make_pod("p3"), make_pod("p3")])
    assert [p["metadata"]["name"] for p in c.list_pods()[0]] == ["p1"]


def test_priority_class_resolved_on_create():
    c = SimCluster(priority_classes={"high": 1000})
    pods = c.create_pods([
        {**make_pod("a"), "spec": {**make_pod()["spec"], "priorityClassName": "high"}},
        {**make_pod("b"), "spec": {**make_pod()["spec"], "priorityClassName": "system-node-critical"}},
    ])
    assert [p["spec"]["priority"] for p in pods] == [1000, 2_000_001_000]


def test_create_node_invalid_and_duplicate():
    c = cluster_with(nodes=[make_node("n1")])
    with pytest.raises(AlreadyExists):
        c.create_node(make_node("n1"))
    bad = make_node("n2")
    bad["status"]["allocatable"]["cpu"] = "-1"
    with pytest.raises(Invalid, match="status.allocatable.cpu"):
        c.create_node(bad)


# ------------------------------------------------------------------------------------- namespaces

NAME_LABEL = "kubernetes.io/metadata.name"


def test_namespaces_created_relabelled_and_deleted_with_their_pods():
    """Create sets the API server's name label; update replaces the labels (uid kept); delete takes
    the namespace's pods first; each write is one watch event of kind Namespace."""
    c = cluster_with(nodes=[make_node("n1")])
    ns = c.create_namespace({"metadata": {"name": "team-a", "labels": {"team": "a", NAME_LABEL: "spoofed"}}})
    assert ns["metadata"]["labels"] == {"team": "a", NAME_LABEL: "team-a"}
    assert ns["status"] == {"phase": "Active"} and ns["kind"] == "Namespace"
    with pytest.raises(AlreadyExists):
        c.create_namespace({"metadata": {"name": "team-a"}})
    c.create_pods([{**make_pod("a1", node_name="n1"), "metadata": {"name": "a1", "namespace": "team-a"}},
                   make_pod("other")])
    relabelled = c.update_namespace({"metadata": {"name": "team-a", "labels": {"team": "b"}}})
    assert relabelled["metadata"]["uid"] == ns["metadata"]["uid"]
    assert relabelled["metadata"]["labels"] == {"team": "b", NAME_LABEL: "team-a"}
    assert c.list_namespaces()[0] == [relabelled] and c.get_namespace("team-a") == relabelled
    rv = int(relabelled["metadata"]["resourceVersion"])
    c.delete_namespace("team-a")
    assert [p["metadata"]["name"] for p in c.list_pods()[0]] == ["other"]
    assert not any(c.requested("n1").values())
    events, _ = c.events_since(rv)
    assert [(e.type, e.kind) for e in events] == [(DELETED, "Pod"), (DELETED, "Namespace")]
    assert c.list_namespaces()[0] == []
    with pytest.raises(NotFound):
        c.delete_namespace("team-a")
    with pytest.raises(NotFound):
        c.get_namespace("team-a")
    with pytest.raises(NotFound):
        c.update_namespace({"metadata": {"name": "team-a"}})


@pytest.mark.parametrize("obj, message", [
    ({"metadata": {"name": "Team_A"}}, "metadata.name: 'Team_A' is not a valid DNS-1123 label"),
    ({"metadata": {"name": "a.b"}}, "not a valid DNS-1123 label"),
    ({"metadata": {"name": "a", "labels": {"team": 1}}}, "metadata.labels: must be a map of strings"),
    ({"metadata": {"name": "a", "labels": {"team": "a b"}}}, "metadata.labels.team: 'a b' is not a valid label value"),
    ({"metadata": {}}, "metadata.name: Required value"),
    ("not an object", "expected a Kubernetes object"),
], ids=["uppercase", "dot", "non-string", "bad-value", "no-name", "not-a-mapping"])
def test_invalid_namespaces_are_refused_with_the_field(obj, message):
    c = SimCluster()
    with pytest.raises(Invalid, match=re.escape(message)):
        c.create_namespace(obj)
    assert c.list_namespaces()[0] == [] and c.events_since(0)[0] == []


# ------------------------------------------------------------------------------------------- bind

def _recreate(c: SimCluster) -> str:
    """Delete and re-create p1; returns the old uid."""
    old_uid = c.get_pod("default", "p1")["metadata"]["uid"]
    c.delete_pod("default", "p1")
    c.create_pod(make_pod("p1"))
    return old_uid


@pytest.mark.parametrize(
    "prepare, binding, code",
    [
        (lambda c: None, ("default", "p1", "n1"), 201),
        (lambda c: c.bind("default", "p1", "n1"), ("default", "p1", "n2"), 409),
        (lambda c: c.bind("default", "p1", "n1"), ("default", "p1", "n1"), 409),
        (lambda c: None, ("default", "nope", "n1"), 404),
        (lambda c: None, ("other", "p1", "n1"), 404),
        (lambda c: None, ("default", "p1", "gone-node"), 404),
        (lambda c: c.delete_pod("default", "p1"), ("default", "p1", "n1"), 404),
        (lambda c: c.delete_node("n1"), ("default", "p1", "n1"), 404),
        (_recreate, None, 404),
    ],
    ids=["ok", "already-bound-elsewhere", "already-bound-same-node", "no-pod", "wrong-namespace",
         "no-node", "pod-deleted", "node-deleted", "pod-recreated-old-uid"],
)
def test_bind_rules(prepare, binding, code):
    c = cluster_with(nodes=[make_node("n1"), make_node("n2")], pods=[make_pod("p1")])
    old_uid = prepare(c)
    if binding is None:
        binding = Binding("default", "p1", "n1", old_uid)
    [result] = c.bind_many([binding])
    assert result.code == code
    if code == 201:
        assert result.ok and result.phase == "Running" and result.error() is None
        pod = c.get_pod("default", "p1")
        assert pod["spec"]["nodeName"] == "n1" and pod["status"]["phase"] == "Running"
        assert pod["status"]["conditions"][0] == {**pod["status"]["conditions"][0], "type": "PodScheduled", "status": "True"}
    else:
        assert not result.ok and result.error().code == code
        with pytest.raises(type(result.error())):
            c.bind(*binding)
    assert c.invariants()["double_binds"] == 0


def test_bind_recreated_pod_with_new_uid():
    c = cluster_with(nodes=[make_node("n1")], pods=[make_pod("p1")])
    _recreate(c)
    uid = c.get_pod("default", "p1")["metadata"]["uid"]
    assert c.bind("default", "p1", "n1", uid=uid).ok


def test_bind_conflicts_are_counted():
    c = cluster_with(nodes=[make_node("n1")], pods=[make_pod("p1")])
    results = c.bind_many([("default", "p1", "n1")] * 3)
    assert [r.code for r in results] == [201, 409, 409]
    inv = c.invariants()
    assert inv["bind_conflicts"] == 2 and inv["binds"] == 1 and inv["double_binds"] == 0


def test_concurrent_binds_bind_each_pod_once():
    c = cluster_with(nodes=[make_node(f"n{i}", cpu="100", memory="100Gi") for i in range(4)],
                     pods=[make_pod(f"p{i}", cpu="10m", memory="1Mi") for i in range(200)])
    results: list = []

    def binder(k: int) -> None:
        batch = [("default", f"p{i}", f"n{(i + k) % 4}") for i in range(200)]
        for start in range(0, 200, 50):
            results.extend(c.bind_many(batch[start:start + 50]))

    threads = [threading.Thread(target=binder, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.name for r in results if r.ok) == sorted(f"p{i}" for i in range(200))
    inv = c.invariants()
    assert (inv["binds"], inv["bind_conflicts"], inv["double_binds"]) == (200, 600, 0)


# -------------------------------------------------------------------------------------- admission

@pytest.mark.parametrize(
    "node, pods, phases, reason",
    [
        (make_node(cpu="2"), [make_pod(f"p{i}", cpu="1", memory="1Mi") for i in range(3)],
         ["Running", "Running", "Failed"], "OutOfcpu"),
        (make_node(memory="1Gi"), [make_pod(f"p{i}", cpu="10m", memory="600Mi") for i in range(2)],
         ["Running", "Failed"], "OutOfmemory"),
        (make_node(pods=1), [make_pod(f"p{i}", cpu="10m", memory="1Mi") for i in range(2)],
         ["Running", "Failed"], "OutOfpods"),
        (make_node(), [make_pod("p0", cpu="10m", memory="1Mi", **{"nvidia.com/gpu": "1"})],
         ["Failed"], "OutOfnvidia.com/gpu"),
        (make_node(**{"nvidia.com/gpu": "1"}), [make_pod(f"p{i}", cpu="10m", memory="1Mi", **{"nvidia.com/gpu": "1"}) for i in range(2)],
         ["Running", "Failed"], "OutOfnvidia.com/gpu"),
        (make_node(cpu="1", pods=1), [make_pod(f"p{i}", cpu="1") for i in range(2)],
         ["Running", "Failed"], "OutOfpods"),  # pods is checked first, as kubelet
        (make_node(cpu="2"), [make_pod(f"p{i}", cpu="1", memory="1Mi") for i in range(2)],
         ["Running", "Running"], ""),
    ],
    ids=["cpu", "memory", "pods", "extended-not-advertised", "extended-used-up", "pods-before-cpu", "exact-fit"],
)
def test_admission(node, pods, phases, reason):
    c = cluster_with(nodes=[node], pods=pods)
    results = c.bind_many([("default", p["metadata"]["name"], "n1") for p in pods])
    assert all(r.ok for r in results)
    assert [r.phase for r in results] == phases
    assert results[-1].reason == reason
    failed = [p for p in c.list_pods()[0] if p["status"]["phase"] == "Failed"]
    assert c.invariants()["admission_rejections"] == len(failed)
    for pod in failed:
        assert pod["spec"]["nodeName"] == "n1" and pod["status"]["reason"] == reason
        assert pod["status"]["message"].startswith(f"Pod was rejected: Node didn't have enough resource: {reason[5:]}, requested: ")
    assert c.invariants()["overcommitted_nodes"] == []


def test_admission_message_like_kubelet():
    c = cluster_with(nodes=[make_node(cpu="1500m")], pods=[make_pod("a", cpu="1"), make_pod("b", cpu="1")])
    c.bind("default", "a", "n1")
    r = c.bind("default", "b", "n1")
    assert (r.phase, r.reason) == ("Failed", "OutOfcpu")
    assert r.message == "Pod was rejected: Node didn't have enough resource: cpu, requested: 1000, used: 1000, capacity: 1500"


def test_rejected_and_deleted_pods_free_room():
    c = cluster_with(nodes=[make_node(cpu="1")], pods=[make_pod(n, cpu="1") for n in ("a", "b", "c")])
    assert c.bind("default", "a", "n1").phase == "Running"
    assert c.bind("default", "b", "n1").phase == "Failed"  # terminal: counts for nothing
    assert c.requested("n1")["cpu"] == 1000
    c.delete_pod("default", "a")
    assert c.requested("n1")["cpu"] == 0
    assert c.bind("default", "c", "n1").phase == "Running"


def test_pod_created_bound_goes_through_admission():
    c = cluster_with(nodes=[make_node(cpu="1")])
    a, b = c.create_pods([make_pod("a", cpu="1", node_name="n1"), make_pod("b", cpu="1", node_name="n1")])
    assert (a["status"]["phase"], b["status"]["phase"], b["status"]["reason"]) == ("Running", "Failed", "OutOfcpu")
    orphan = c.create_pod(make_pod("c", cpu="1", node_name="later"))
    assert orphan["status"]["phase"] == "Pending" and c.requested("later")["cpu"] == 1000


# ------------------------------------------------------------------------------------------ watch

def test_watch_order_and_resource_versions():
    c = SimCluster()
    _, rv0 = c.list_pods()
    c.create_node(make_node("n1"))
    c.create_pod(make_pod("p1"))
    c.bind("default", "p1", "n1")
    c.delete_pod("default", "p1")
    events, rv = c.events_since(rv0)
    assert [(e.type, e.kind) for e in events] == [("ADDED", "Node"), ("ADDED", "Pod"), (MODIFIED, "Pod"), (DELETED, "Pod")]
    assert [e.rv for e in events] == [1, 2, 3, 4] and rv == 4
    assert [e.object["metadata"]["resourceVersion"] for e in events] == ["1", "2", "3", "4"]
    assert events[1].object["spec"].get("nodeName") is None, "an event's object is the state at that version"
    assert events[2].object["spec"]["nodeName"] == "n1"
    assert c.events_since(rv) == ([], 4)
    assert c.events_since("2")[0] == events[2:]


def test_a_long_poll_of_the_watch_answers_the_first_change_and_leaves_the_cluster_free_meanwhile():
    """``events_since(..., wait_s)`` with nothing new waits for a change; the cluster's lock is free
    during the wait (creations and binds go on), and the answer comes with the first change of the
    kinds asked for."""
    c = SimCluster()
    c.create_node(make_node("n1"))
    _, rv = c.list_pods()
    answers = []
    nodes_only = threading.Thread(target=lambda: answers.append(c.events_since(rv, ["Node"], None, MAX_WATCH_WAIT_S)))
    nodes_only.start()
    c.create_pod(make_pod("p1"))  # not a kind the poll asked for: it keeps waiting
    assert c.bind("default", "p1", "n1").ok  # the lock is free meanwhile
    assert nodes_only.is_alive()
    c.cordon("n1")
    nodes_only.join(60)
    assert not nodes_only.is_alive()
    (events, new_rv), = answers
    assert [(e.type, e.kind) for e in events] == [(MODIFIED, "Node")] and new_rv == rv + 3
    assert c.events_since(new_rv, wait_s=0.0) == ([], new_rv)  # a zero wait answers at once
    with pytest.raises(Invalid, match="wait_s"):
        c.events_since(new_rv, wait_s="a while")
    with pytest.raises(Gone):
        c.events_since(new_rv + 10, wait_s=MAX_WATCH_WAIT_S)  # errors come before any wait


def test_scheduling_gates_are_removed_by_name_or_all_with_one_event_each():
    c = SimCluster()
    p = make_pod("g")
    p["spec"]["schedulingGates"] = [{"name": "a"}, {"name": "b"}]
    c.create_pod(p)
    _, rv = c.list_pods()
    assert c.remove_scheduling_gates("default", "g", ["x"])["metadata"]["resourceVersion"] == str(rv)  # no-op
    assert c.remove_scheduling_gates("default", "g", ["a"])["spec"]["schedulingGates"] == [{"name": "b"}]
    assert "schedulingGates" not in c.remove_scheduling_gates("default", "g")["spec"]
    events, _ = c.events_since(rv)
    assert [(e.type, e.object["spec"].get("schedulingGates")) for e in events] == [
        (MODIFIED, [{"name": "b"}]), (MODIFIED, None)]
    with pytest.raises(NotFound):
        c.remove_scheduling_gates("default", "nope")


def test_watch_kinds_and_limit():
    c = cluster_with(nodes=[make_node("n1"), make_node("n2")], pods=[make_pod("a"), make_pod("b"), make_pod("c")])
    pods, rv = c.events_since(0, kinds=["Pod"])
    assert [e.object["metadata"]["name"] for e in pods] == ["a", "b", "c"] and rv == 5
    first, rv = c.events_since(0, kinds=["Pod"], limit=2)
    assert [e.rv for e in first] == [3, 4] and rv == 4
    rest, rv = c.events_since(rv, kinds=["Pod"], limit=2)
    assert [e.rv for e in rest] == [5] and rv == 5
    assert [e.rv for e in c.events_since(0, limit=2)[0]] == [1, 2]


def test_watch_gone_after_compaction_then_relist():
    c = SimCluster(history_limit=4)
    for i in range(10):
        c.create_pod(make_pod(f"p{i}"))
    with pytest.raises(Gone):
        c.events_since(0)
    with pytest.raises(Gone):
        c.events_since(99)  # newer than this cluster
    pods, rv = c.list_pods()
    assert len(pods) == 10 and rv == 10
    c.create_pod(make_pod("p10"))
    events, _ = c.events_since(rv)
    assert [e.object["metadata"]["name"] for e in events] == ["p10"]
    assert len(c.events_since(c.list_pods()[1] - 4)[0]) == 4, "at least history_limit events are kept"


# ------------------------------------------------------------------------------------------ nodes

def test_cordon_and_uncordon():
    c = cluster_with(nodes=[make_node("n1")])
    _, rv = c.list_nodes()
    node = c.cordon("n1")
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [{"key": UNSCHEDULABLE_TAINT_KEY, "effect": "NoSchedule"}]
    assert c.cordon("n1") is node, "no write when nothing changes"
    node = c.cordon("n1", False)
    assert "unschedulable" not in node["spec"] and "taints" not in node["spec"]
    events, _ = c.events_since(rv)
    assert [(e.type, e.kind) for e in events] == [(MODIFIED, "Node")] * 2
    with pytest.raises(NotFound):
        c.cordon("nope")


@pytest.mark.parametrize("delete_pods", [False, True], ids=["pods-stay", "pod-gc"])
def test_delete_node(delete_pods):
    c = cluster_with(nodes=[make_node("n1")], pods=[make_pod("a"), make_pod("b")])
    c.bind("default", "a", "n1")
    _, rv = c.list_pods()
    c.delete_node("n1", delete_pods=delete_pods)
    events, _ = c.events_since(rv)
    expected = [(DELETED, "Node")] + ([(DELETED, "Pod")] if delete_pods else [])
    assert [(e.type, e.kind) for e in events] == expected
    names = [p["metadata"]["name"] for p in c.list_pods()[0]]
    assert names == (["b"] if delete_pods else ["a", "b"])
    assert c.requested("n1").get("cpu", 0) == (0 if delete_pods else 1000)
    with pytest.raises(NotFound):
        c.delete_node("n1")
    with pytest.raises(NotFound):
        c.bind("default", "b", "n1")


def test_update_node_keeps_identity_and_can_overcommit():
    c = cluster_with(nodes=[make_node("n1", cpu="2")], pods=[make_pod("a", cpu="2")])
    c.bind("default", "a", "n1")
    before = c.get_node("n1")
    smaller = make_node("n1", cpu="1")
    smaller["metadata"]["labels"]["zone"] = "z1"
    after = c.update_node(smaller)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["metadata"]["labels"]["zone"] == "z1"
    assert c.invariants()["overcommitted_nodes"] == ["n1"]
    with pytest.raises(NotFound):
        c.update_node(make_node("n9"))


# ------------------------------------------------------------------------------ conditions, events

def test_set_pod_condition():
    c = cluster_with(pods=[make_pod("p1")])
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/0 nodes are available"}
    assert c.set_pod_condition("default", "p1", cond) is True
    assert c.set_pod_condition("default", "p1", cond) is False, "same condition: no write"
    [stored] = c.get_pod("default", "p1")["status"]["conditions"]
    assert stored == {**cond, "lastTransitionTime": stored["lastTransitionTime"]}
    assert c.get_pod("default", "p1")["status"]["phase"] == "Pending"
    with pytest.raises(Invalid):
        c.set_pod_condition("default", "p1", {"type": "PodScheduled", "status": "maybe"})
    with pytest.raises(NotFound):
        c.set_pod_condition("default", "nope", cond)


def test_record_event_deduplicates_and_is_queryable():
    c = cluster_with(pods=[make_pod("p1")])
    ref = {"kind": "Pod", "namespace": "default", "name": "p1"}
    c.record_event(ref, "Warning", "FailedScheduling", "0/3 nodes are available")
    c.record_event(ref, "Warning", "FailedScheduling", "0/3 nodes are available")
    c.record_event(ref, "Normal", "Scheduled", "Successfully assigned default/p1 to n1")
    c.record_event({"kind": "Node", "name": "n1"}, "Normal", "NodeReady", "ready")
    events = c.events_for("default", "p1")
    assert [(e["reason"], e["count"]) for e in events] == [("FailedScheduling", 2), ("Scheduled", 1)]
    assert [e["reason"] for e in c.events_for("", "n1")] == ["NodeReady"]
    with pytest.raises(Invalid):
        c.record_event(ref, "Bad", "X", "y")
    c.delete_pod("default", "p1")
    assert c.events_for("default", "p1") == []


# --------------------------------------------------------------------------------- fault injection

def _bind_all(faults: FaultConfig, n: int = 2000, seed: int = 3) -> tuple[SimCluster, list]:
    c = cluster_with(nodes=[make_node("n1", cpu="1000", memory="1Ti", pods=n)],
                     pods=[make_pod(f"p{i}", cpu="10m", memory="1Mi") for i in range(n)], seed=seed, faults=faults)
    return c, c.bind_many([("default", f"p{i}", "n1") for i in range(n)])


@pytest.mark.parametrize(
    "faults, code",
    [
        (FaultConfig(bind_error_rate=0.1), 500),
        (FaultConfig(bind_conflict_rate=0.1), 409),
        (FaultConfig(bind_timeout_rate=0.1), 504),
    ],
    ids=["500", "409", "timeout"],
)
def test_fault_rates(faults, code):
    c, results = _bind_all(faults)
    hits = sum(r.code == code for r in results)
    assert 150 <= hits <= 250  # 10% of 2000, well within 5 sigma
    assert {r.code for r in results} == {201, code}
    bound = sum(1 for p in c.list_pods()[0] if p["spec"].get("nodeName"))
    if code == 504:
        applied = c.invariants()["injected_faults"]["timeouts_applied"]
        assert 0 < applied < hits and bound == 2000 - hits + applied
    else:
        assert bound == 2000 - hits, "errors are not applied"
    assert c.invariants()["double_binds"] == 0


def test_faults_repeat_with_the_seed():
    faults = FaultConfig(bind_error_rate=0.1, bind_conflict_rate=0.1, bind_timeout_rate=0.1)
    codes = [[r.code for r in _bind_all(faults, n=300, seed=s)[1]] for s in (5, 5, 6)]
    assert codes[0] == codes[1] != codes[2]


@pytest.mark.parametrize("applied", [0.0, 1.0], ids=["lost-request", "lost-answer"])
def test_timeouts_may_apply_the_bind(applied):
    c, results = _bind_all(FaultConfig(bind_timeout_rate=1.0, timeout_applied_fraction=applied), n=5)
    assert [r.code for r in results] == [504] * 5
    assert c.invariants()["pods_bound"] == (5 if applied else 0)
    with pytest.raises(Timeout):
        c.bind("default", "p0", "n1")


def test_bind_latency_is_paid_once_per_call():
    c, _ = _bind_all(FaultConfig(bind_latency_s=0.05), n=1)
    c.create_pods([make_pod(f"q{i}", cpu="10m", memory="1Mi") for i in range(50)])
    start = time.monotonic()
    results = c.bind_many([("default", f"q{i}", "n1") for i in range(50)])
    assert time.monotonic() - start >= 0.05 and all(r.ok for r in results)


@pytest.mark.parametrize(
    "kwargs",
    [{"bind_error_rate": 1.5}, {"bind_latency_s": -1}, {"bind_error_rate": 0.6, "bind_timeout_rate": 0.6}],
    ids=["rate-above-1", "negative-latency", "rates-sum-above-1"],
)
def test_fault_config_validation(kwargs):
    with pytest.raises(ValueError):
        FaultConfig(**kwargs)


# -------------------------------------------------------------------------------------- invariants

def test_invariants_and_incremental_totals_match_a_recount():
    rng = random.Random(11)
    c = cluster_with(nodes=[make_node(f"n{i}", cpu="4", pods=5) for i in range(4)])
    live: list[str] = []
    for step in range(400):
        op = rng.random()
        if op < 0.45:
            name = f"p{step}"
            c.create_pod(make_pod(name, cpu=rng.choice(["500m", "1", "2"]), memory="1Mi"))
            live.append(name)
        elif op < 0.85 and live:
            c.bind_many([("default", rng.choice(live), f"n{rng.randrange(5)}")])  # n4 does not exist
        elif live:
            c.delete_pod("default", live.pop(rng.randrange(len(live))))
    pods, _ = c.list_pods()
    for i in range(4):
        recount: dict[str, int] = {}
        for p in pods:
            if p["spec"].get("nodeName") == f"n{i}" and p["status"]["phase"] not in ("Failed", "Succeeded"):
                for r, v in {**pod_requests(p), "pods": 1}.items():
                    recount[r] = recount.get(r, 0) + v
        assert {k: v for k, v in c.requested(f"n{i}").items() if v} == recount
    inv = c.invariants()
    assert inv["overcommitted_nodes"] == [] and inv["double_binds"] == 0
    assert inv["pods_bound"] + len(inv["pods_unbound"]) == len(pods)
    assert inv["pods_unbound"] == sorted(f"default/{p['metadata']['name']}" for p in pods if not p["spec"].get("nodeName"))
    assert inv["admission_rejections"] > 0 and inv["bind_conflicts"] > 0


# ---------------------------------------------------------------------------------------- workload

def test_uniform_builders():
    nodes, pods = uniform_nodes(3, labels={"zone": "a"}), uniform_pods(2, scheduler_name="s")
    assert [n["metadata"]["name"] for n in nodes] == ["node-00000", "node-00001", "node-00002"]
    assert nodes[0]["metadata"]["labels"] == {"zone": "a", "kubernetes.io/hostname": "node-00000"}
    assert nodes[0]["status"]["allocatable"] == {"cpu": "8", "memory": "16Gi", "pods": "110"}
    assert [p["metadata"]["name"] for p in pods] == ["pod-00000", "pod-00001"]
    assert pods[0]["spec"]["schedulerName"] == "s"
    c = cluster_with(nodes=nodes, pods=pods)
    assert c.bind("default", "pod-00000", "node-00000").phase == "Running"


# --------------------------------------------------------------------------------------------- ray

def test_works_as_a_ray_actor(ray_session):
    ray = ray_session
    actor = ray.remote(SimCluster).remote(seed=1)
    try:
        ray.get(actor.create_nodes.remote(uniform_nodes(2)))
        ray.get(actor.create_pods.remote(uniform_pods(2)))
        results = ray.get(actor.bind_many.remote([Binding("default", "pod-00000", "node-00000"),
                                                  ("default", "pod-00000", "node-00001")]))
        assert [r.code for r in results] == [201, 409]
        with pytest.raises(Conflict):
            ray.get(actor.bind.remote("default", "pod-00000", "node-00001"))
        events, rv = ray.get(actor.events_since.remote(0, kinds=["Pod"]))
        assert [e.type for e in events] == ["ADDED", "ADDED", MODIFIED] and rv == 5
    finally:
        ray.kill(actor)
