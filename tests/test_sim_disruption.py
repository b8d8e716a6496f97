"""The simulated cluster's side of preemption: graceful deletion on the cluster's clock, and
PodDisruptionBudgets whose status is computed from their pods as the disruption controller does."""

from __future__ import annotations

import pytest

from shardsched.cluster import ADDED, DELETED, MODIFIED, PDB, POD, AlreadyExists, Conflict, Invalid, NotFound
from shardsched.sim import SimCluster, uniform_nodes, uniform_pods
from shardsched.sim.disruption import parse_budget


class Clock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_pod(name: str, node: str = "n1", cpu: str = "1", grace: int | None = None, **labels: str) -> dict:
    pod = uniform_pods(1, cpu=cpu, memory="1Gi")[0]
    pod["metadata"]["name"] = name
    pod["metadata"]["labels"] = labels or {"app": "web"}
    if node:
        pod["spec"]["nodeName"] = node
    if grace is not None:
        pod["spec"]["terminationGracePeriodSeconds"] = grace
    return pod


def make_pdb(name: str = "web", selector: dict | None = None, **spec) -> dict:
    sel = {"matchLabels": {"app": "web"}} if selector is None else selector
    return {"metadata": {"name": name}, "spec": {"selector": sel, **spec}}


def cluster(scale: float = 1.0, pods=(), cpu: str = "4") -> tuple[SimCluster, Clock]:
    clock = Clock()
    c = SimCluster(clock=clock, grace_period_scale=scale)
    node = uniform_nodes(1, cpu=cpu, memory="16Gi")[0]
    node["metadata"]["name"] = "n1"
    c.create_node(node)
    c.create_pods(list(pods))
    return c, clock


# -------------------------------------------------------------------------- graceful deletion

def test_deleted_pod_terminates_for_its_grace_period_on_the_clock_and_keeps_its_room():
    c, clock = cluster(pods=[make_pod("a", grace=30), make_pod("b", grace=30)])
    _, rv = c.list_pods()
    pod = c.delete_pod("default", "a")
    assert pod["metadata"]["deletionTimestamp"] and pod["metadata"]["deletionGracePeriodSeconds"] == 30
    assert c.requested("n1")["cpu"] == 2000  # still counted on its node
    clock.now += 29.5
    assert c.get_pod("default", "a")["metadata"]["deletionTimestamp"]
    assert c.terminating() == [("default/a", pytest.approx(0.5))]
    clock.now += 0.5
    with pytest.raises(NotFound):
        c.get_pod("default", "a")
    assert c.requested("n1")["cpu"] == 1000
    events, _ = c.events_since(rv, [POD])
    assert [(e.type, e.object["metadata"]["name"]) for e in events] == [(MODIFIED, "a"), (DELETED, "a")]
    assert events[1].object["metadata"]["deletionTimestamp"]


@pytest.mark.parametrize("scale, pod, grace_arg, terminating_s", [
    (1.0, dict(grace=30), None, 30.0),
    (1.0, dict(grace=30), 5, 5.0),
    (0.01, dict(), None, 0.3),  # the pod's own default, 30 s, scaled
    (1.0, dict(grace=30), 0, None),
    (1.0, dict(grace=0), None, None),
    (1.0, dict(grace=30, node=""), None, None),  # not bound: deleted at once
    (1.0, dict(grace=30), -3, 1.0),  # a negative grace period is 1 s
    (0.0, dict(grace=30), None, None),  # the default scale: every deletion at once
], ids=["own-grace", "grace-arg", "scaled-default", "grace-0-arg", "grace-0-pod", "unbound", "negative", "scale-0"])
def test_grace_period_rules(scale, pod, grace_arg, terminating_s):
    c, clock = cluster(scale, [make_pod("a", **pod)])
    c.delete_pod("default", "a", grace_period_s=grace_arg)
    if terminating_s is None:
        assert c.terminating() == []
        with pytest.raises(NotFound):
            c.get_pod("default", "a")
        return
    assert c.terminating() == [("default/a", pytest.approx(terminating_s))]
    clock.now += terminating_s
    assert c.list_pods()[0] == []


def test_deleting_a_terminating_pod_again_only_shortens_its_grace_period():
    c, clock = cluster(pods=[make_pod("a", grace=30)])
    c.delete_pod("default", "a")
    clock.now += 10
    again = c.delete_pod("default", "a", grace_period_s=60)  # longer: unchanged, no event
    assert again["metadata"]["deletionGracePeriodSeconds"] == 30
    assert c.terminating() == [("default/a", pytest.approx(20.0))]
    c.delete_pod("default", "a", grace_period_s=5)
    assert c.terminating()[0][1] == pytest.approx(5.0)
    c.delete_pod("default", "a", grace_period_s=0)
    assert c.list_pods()[0] == []


def test_delete_preconditions_and_a_recreated_pod_is_not_deleted_by_the_old_grace_period():
    c, clock = cluster(pods=[make_pod("a", grace=30)])
    old_uid = c.get_pod("default", "a")["metadata"]["uid"]
    with pytest.raises(Conflict, match="Precondition failed"):
        c.delete_pod("default", "a", uid="not-the-uid")
    with pytest.raises(NotFound):
        c.delete_pod("default", "gone")
    c.delete_pod("default", "a", uid=old_uid)
    c.delete_pod("default", "a", grace_period_s=0)
    c.create_pod(make_pod("a", grace=30))
    clock.now += 60  # the first deletion's end passes
    assert c.get_pod("default", "a")["metadata"]["uid"] != old_uid
    assert not c.get_pod("default", "a")["metadata"].get("deletionTimestamp")


# ------------------------------------------------------------------------ disruption budgets

def _status(c: SimCluster, name: str = "web") -> tuple[int, int, int, int]:
    s = c.get_pdb("default", name)["status"]
    return s["expectedPods"], s["currentHealthy"], s["desiredHealthy"], s["disruptionsAllowed"]


@pytest.mark.parametrize("spec, expected", [
    (dict(minAvailable=2), (4, 3, 2, 1)),
    (dict(minAvailable=3), (4, 3, 3, 0)),
    (dict(minAvailable=5), (4, 3, 5, 0)),
    (dict(minAvailable="50%"), (4, 3, 2, 1)),
    (dict(minAvailable="60%"), (4, 3, 3, 0)),  # 2.4 rounds up
    (dict(maxUnavailable=1), (4, 3, 3, 0)),
    (dict(maxUnavailable=2), (4, 3, 2, 1)),
    (dict(maxUnavailable="30%"), (4, 3, 2, 1)),  # 1.2 rounds up to 2 unavailable
    (dict(maxUnavailable="100%"), (4, 3, 0, 3)),
    (dict(minAvailable=0), (4, 3, 0, 3)),
    (dict(), (4, 3, 0, 3)),
], ids=lambda v: str(v) if isinstance(v, dict) else None)
def test_pdb_status_like_the_disruption_controller(spec, expected):
    # 4 selected pods: 3 bound and Running, 1 pending; another app's pod is not selected
    c, _ = cluster(pods=[make_pod("a"), make_pod("b"), make_pod("c"), make_pod("d", node=""),
                         make_pod("other", app="db")])
    c.create_pdb(make_pdb(**spec))
    assert _status(c) == expected
    cond = c.get_pdb("default", "web")["status"]["conditions"][0]
    assert (cond["type"], cond["status"], cond["reason"]) == (
        ("DisruptionAllowed", "True", "SufficientPods") if expected[3] else
        ("DisruptionAllowed", "False", "InsufficientPods"))


@pytest.mark.parametrize("selector, expected_pods", [
    ({}, 2),  # policy/v1: the empty selector selects every pod of the namespace
    ({"matchExpressions": [{"key": "app", "operator": "In", "values": ["db"]}]}, 1),
], ids=["empty", "expression"])
def test_pdb_selector(selector, expected_pods):
    c, _ = cluster(pods=[make_pod("a"), make_pod("b", app="db")])
    c.create_pdb(make_pdb(selector=selector, minAvailable=1))
    assert _status(c)[0] == expected_pods


def test_pdb_without_selector_selects_nothing():
    c, _ = cluster(pods=[make_pod("a")])
    c.create_pdb({"metadata": {"name": "web"}, "spec": {"minAvailable": 1}})
    assert _status(c) == (0, 0, 1, 0)


def test_pdb_status_follows_its_pods_terminating_bound_and_deleted():
    c, clock = cluster(pods=[make_pod("a", grace=10), make_pod("b", grace=10), make_pod("p", node="")])
    c.create_pdb(make_pdb(minAvailable=1))
    _, rv = c.list_pdbs()
    assert _status(c) == (3, 2, 1, 1)
    c.delete_pod("default", "a")  # terminating: no longer healthy
    assert _status(c) == (3, 1, 1, 0)
    c.bind("default", "p", "n1")
    assert _status(c) == (3, 2, 1, 1)
    clock.now += 10  # a is gone
    assert _status(c) == (2, 2, 1, 1)
    c.create_pod(make_pod("late", app="db"))  # not selected: no status write
    events, _ = c.events_since(rv, [PDB])
    assert [e.object["status"]["disruptionsAllowed"] for e in events] == [0, 1, 1]
    assert all(e.type == MODIFIED for e in events)


def test_pdb_create_update_delete_and_watch():
    c, _ = cluster(pods=[make_pod("a"), make_pod("b")])
    _, rv = c.list_pdbs()
    created = c.create_pdb(make_pdb(minAvailable=2))
    assert (created["apiVersion"], created["kind"], created["metadata"]["generation"]) == ("policy/v1", PDB, 1)
    with pytest.raises(AlreadyExists):
        c.create_pdb(make_pdb(minAvailable=2))
    updated = c.update_pdb(make_pdb(minAvailable=1))
    assert updated["metadata"]["uid"] == created["metadata"]["uid"] and updated["metadata"]["generation"] == 2
    assert _status(c) == (2, 2, 1, 1) and updated["status"]["observedGeneration"] == 2
    assert [p["metadata"]["name"] for p in c.list_pdbs()[0]] == ["web"]
    c.delete_pdb("default", "web")
    with pytest.raises(NotFound):
        c.get_pdb("default", "web")
    with pytest.raises(NotFound):
        c.update_pdb(make_pdb(minAvailable=1))
    events, _ = c.events_since(rv, [PDB])
    assert [e.type for e in events] == [ADDED, MODIFIED, DELETED]


def test_namespace_deletion_deletes_its_pdbs():
    c, _ = cluster()
    c.create_namespace({"metadata": {"name": "team"}})
    c.create_pdb({**make_pdb(minAvailable=1), "metadata": {"name": "web", "namespace": "team"}})
    c.delete_namespace("team")
    assert c.list_pdbs()[0] == []


@pytest.mark.parametrize("spec, message", [
    (dict(minAvailable=1, maxUnavailable=1), "spec: minAvailable and maxUnavailable cannot be both set"),
    (dict(minAvailable=-1), "spec.minAvailable: -1 must be greater than or equal to 0"),
    (dict(maxUnavailable="120%"), "spec.maxUnavailable: '120%' must not be greater than 100%"),
    (dict(maxUnavailable="half"), "spec.maxUnavailable: 'half' must be an integer or a percentage"),
    (dict(minAvailable=1.5), "spec.minAvailable: 1.5 must be an integer or a percentage"),
    (dict(selector={"matchExpressions": [{"key": "app", "operator": "Near"}]}), "spec.selector.matchExpressions[0]"),
], ids=["both", "negative", "over-100", "not-percent", "float", "bad-selector"])
def test_invalid_pdbs_are_refused_with_the_field(spec, message):
    c, _ = cluster()
    with pytest.raises(Invalid, match=r"^PodDisruptionBudget default/web: ") as e:
        c.create_pdb(make_pdb(**spec))
    assert message in str(e.value)
    assert c.list_pdbs()[0] == []


def test_parse_budget_needs_a_name():
    from shardsched.errors import InvalidObjectError

    with pytest.raises(InvalidObjectError, match="metadata.name: Required value"):
        parse_budget({"spec": {}})


# ------------------------------------------------------------------- the ReplicaSet-like sets

def replica_set(name: str = "web", replicas: int = 2, node: str = "n1") -> dict:
    spec = {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}],
            "terminationGracePeriodSeconds": 10}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name}, "spec": {"replicas": replicas,
                                                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": spec}}}


def test_replica_set_recreates_a_deleted_pod_with_a_new_name_and_uid():
    c, _ = cluster(scale=0.0)
    rs = c.create_replica_set(replica_set(node=""))
    assert len(rs["pods"]) == 2
    first = c.get_pod("default", rs["pods"][0])
    owner = first["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("ReplicaSet", "web", rs["uid"], True)
    assert first["metadata"]["labels"] == {"app": "web"} and first["status"]["phase"] == "Pending"
    _, rv = c.list_pods()
    c.delete_pod("default", rs["pods"][0])
    pods = {p["metadata"]["name"]: p for p in c.list_pods()[0]}
    assert len(pods) == 2 and rs["pods"][0] not in pods and rs["pods"][1] in pods
    (new_name,) = set(pods) - set(rs["pods"])
    new = pods[new_name]
    assert new_name.startswith("web-") and new["metadata"]["uid"] != first["metadata"]["uid"]
    assert new["metadata"]["labels"] == {"app": "web"} and new["spec"]["containers"] == first["spec"]["containers"]
    events, _ = c.events_since(rv, [POD])
    assert [(e.type, e.object["metadata"]["name"]) for e in events] == [(DELETED, rs["pods"][0]), (ADDED, new_name)]


def test_replica_set_replaces_a_victim_as_soon_as_it_terminates():
    c, clock = cluster()
    rs = c.create_replica_set(replica_set(replicas=1))
    victim = rs["pods"][0]
    c.delete_pod("default", victim)  # terminating for 10 s: the set does not wait
    names = sorted(p["metadata"]["name"] for p in c.list_pods()[0])
    assert len(names) == 2 and victim in names
    assert c.requested("n1")["cpu"] == 2000  # the victim's room is still taken, and its replacement's
    (replacement,) = set(names) - {victim}
    clock.now += 10
    assert [p["metadata"]["name"] for p in c.list_pods()[0]] == [replacement]  # its end creates nothing more


def test_replica_set_stops_replacing_once_deleted_and_refuses_bad_input():
    c, _ = cluster(scale=0.0)
    rs = c.create_replica_set(replica_set(replicas=1, node=""))
    c.delete_replica_set("default", "web")
    c.delete_pod("default", rs["pods"][0])
    assert c.list_pods()[0] == []
    with pytest.raises(NotFound):
        c.delete_replica_set("default", "web")
    c.create_replica_set(replica_set("again", replicas=0))
    with pytest.raises(AlreadyExists):
        c.create_replica_set(replica_set("again"))
    with pytest.raises(Invalid, match="spec.replicas: -1 must be an integer >= 0"):
        c.create_replica_set(replica_set("neg", replicas=-1))
    bad = replica_set("bad")
    bad["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    with pytest.raises(Invalid, match="cpu"):
        c.create_replica_set(bad)
    assert c.list_pods()[0] == []
