"""A preemption's writes through the cluster contract, on both backends: the simulated cluster
itself (``sim``) and the Kubernetes backend over HTTP against it (``kube``: `KubeCluster` and the
real kubernetes client talking to `SimApiServer`). The victim's ``DisruptionTarget`` condition,
its graceful deletion with a uid precondition (409 for a stale uid, 404 once gone, 403 when RBAC
denies it), and the preemptor's ``status.nominatedNodeName`` set and cleared."""

from __future__ import annotations

import time
import uuid

import pytest

from shardsched.api.objects import PodInfo
from shardsched.cluster import DELETED, MODIFIED, POD, Candidate, Conflict, Forbidden, NotFound, Victim
from shardsched.kube.client import ClientSpec
from shardsched.kube.cluster import KubeCluster
from shardsched.sim.cluster import SimCluster
from shardsched.testing.simapi import SimApiServer

from builders import node, pod

SCHED = "shardsched-test"


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class World:
    """A simulated cluster on a hand-moved clock, served over HTTP; ``target`` is the backend
    under test (the simulated cluster itself, or a `KubeCluster` talking to the server)."""

    def __init__(self, backend: str, tmp_path) -> None:
        self.clock = Clock()
        self.sim = SimCluster(clock=self.clock, grace_period_scale=1.0)
        self.sim.create_nodes([node("n0")])
        self.server = SimApiServer(self.sim, token="t-" + uuid.uuid4().hex, bookmark_s=0.2).start()
        spec = ClientSpec(kubeconfig=self.server.write_kubeconfig(str(tmp_path / "kc")), qps=0, request_timeout_s=5)
        self.kube = KubeCluster(spec, [SCHED], watch_timeout_s=5) if backend == "kube" else None
        self.target = self.kube or self.sim

    def victim(self, name: str = "victim", grace: int = 30) -> dict:
        p = pod(name, cpu="1")
        p["metadata"].pop("uid")
        p["spec"].update(nodeName="n0", terminationGracePeriodSeconds=grace)
        return self.sim.create_pod(p)

    def preemptor(self, name: str = "high") -> dict:
        p = pod(name, cpu="1")
        p["metadata"].pop("uid")
        p["spec"]["schedulerName"] = SCHED
        return self.sim.create_pod(p)

    def close(self) -> None:
        if self.kube is not None:
            self.kube.stop()
        self.server.stop()


@pytest.fixture(params=["sim", "kube"])
def world(request, tmp_path):
    w = World(request.param, tmp_path)
    yield w
    w.close()


def wait_for(check, timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_victim_gets_disruption_target_then_terminates_for_its_grace_period(world):
    uid = world.victim()["metadata"]["uid"]
    _, rv = world.sim.list_pods()
    assert world.target.set_disruption_target("default", "victim", "preemptor-scheduler") is True
    cond = next(c for c in world.sim.get_pod("default", "victim")["status"]["conditions"]
                if c["type"] == "DisruptionTarget")
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "True", "PreemptionByScheduler", "preemptor-scheduler: preempting to accommodate a higher priority pod")
    assert cond["lastTransitionTime"]
    assert PodInfo.from_object(world.sim.get_pod("default", "victim")).preempted

    answer = world.target.delete_pod("default", "victim", uid=uid)
    assert answer["metadata"]["deletionTimestamp"] and answer["metadata"]["deletionGracePeriodSeconds"] == 30
    assert world.sim.requested("n0")["cpu"] == 1000  # the victim keeps its room while it terminates
    world.clock.now += 30
    with pytest.raises(NotFound):
        world.sim.get_pod("default", "victim")
    events, _ = world.sim.events_since(rv, [POD])
    assert [e.type for e in events] == [MODIFIED, MODIFIED, DELETED]  # condition, deletionTimestamp, gone


def test_kube_watch_sees_the_victim_terminating_then_deleted(world):
    if world.kube is None:
        pytest.skip("the Kubernetes backend's informers")
    uid = world.victim()["metadata"]["uid"]
    world.kube.list_pods()
    _, rv = world.kube.events_since(0)
    world.kube.delete_pod("default", "victim", uid=uid)
    world.clock.now += 30
    seen: list[tuple[str, bool]] = []

    def both() -> bool:
        nonlocal rv
        events, rv = world.kube.events_since(rv, [POD])
        seen.extend((e.type, bool(e.object["metadata"].get("deletionTimestamp"))) for e in events
                    if e.object["metadata"]["name"] == "victim")
        return len(seen) >= 2

    world.sim.list_pods()  # the simulated cluster notices the clock (the server's watch does too)
    wait_for(both, what="the victim's MODIFIED and DELETED on the watch")
    assert seen == [(MODIFIED, True), (DELETED, True)]


def test_disruption_target_is_written_once(world):
    world.victim()
    assert world.target.set_disruption_target("default", "victim", SCHED) is True
    if world.kube is not None:
        world.kube.list_pods()
        wait_for(lambda: any(c["type"] == "DisruptionTarget" for c in
                             (world.kube.store.pod("default", "victim") or {}).get("status", {}).get("conditions", [])),
                 what="the condition in the watch cache")
    _, rv = world.sim.list_pods()
    assert world.target.set_disruption_target("default", "victim", SCHED) is False
    assert world.sim.events_since(rv)[0] == []


def test_delete_with_a_stale_uid_is_409_and_of_a_gone_pod_404(world):
    uid = world.victim(grace=0)["metadata"]["uid"]
    with pytest.raises(Conflict):
        world.target.delete_pod("default", "victim", uid="not-" + uid)
    assert world.sim.get_pod("default", "victim")["metadata"]["uid"] == uid
    world.target.delete_pod("default", "victim", uid=uid)  # grace 0: gone at once
    with pytest.raises(NotFound):
        world.target.delete_pod("default", "victim", uid=uid)
    with pytest.raises(NotFound):
        world.target.set_disruption_target("default", "victim", SCHED)
    with pytest.raises(NotFound):
        world.target.set_nominated_node_name("default", "victim", "n0")


def test_delete_denied_by_rbac_is_forbidden_and_deletes_nothing(world):
    if world.kube is None:
        pytest.skip("RBAC is the API server's")
    uid = world.victim()["metadata"]["uid"]
    world.server.deny("delete", "pods")
    with pytest.raises(Forbidden, match="delete pods"):
        world.kube.delete_pod("default", "victim", uid=uid)
    assert not world.sim.get_pod("default", "victim")["metadata"].get("deletionTimestamp")


def test_nominated_node_name_set_and_cleared(world):
    world.preemptor()
    _, rv = world.sim.list_pods()
    assert world.target.set_nominated_node_name("default", "high", "n0") is True
    assert world.sim.get_pod("default", "high")["status"]["nominatedNodeName"] == "n0"
    if world.kube is not None:
        world.kube.list_pods()
        wait_for(lambda: (world.kube.store.pod("default", "high") or {}).get("status", {}).get("nominatedNodeName"),
                 what="the nomination in the watch cache")
    assert world.target.set_nominated_node_name("default", "high", "n0") is False  # no change, no write
    assert world.target.set_nominated_node_name("default", "high", "") is True
    assert "nominatedNodeName" not in world.sim.get_pod("default", "high")["status"]
    events, _ = world.sim.events_since(rv, [POD])
    assert [e.object["status"].get("nominatedNodeName") for e in events] == ["n0", None]


def test_prepare_candidates_writes_each_preemption_and_counts_404_and_409_as_gone(world):
    kept = world.victim("kept")["metadata"]["uid"]
    gone = world.victim("gone", grace=0)["metadata"]["uid"]
    world.sim.delete_pod("default", "gone")  # someone else deleted it first: 404
    recreated = world.victim("recreated")["metadata"]["uid"]
    world.preemptor("high")
    world.preemptor("second")
    candidates = [
        Candidate("default", "high", "uid-high", SCHED, "n0", (Victim("default", "kept", kept),
                                                               Victim("default", "gone", gone)), "0/1 nodes ..."),
        Candidate("default", "second", "uid-second", SCHED, "n0",
                  (Victim("default", "recreated", "not-" + recreated),), "0/1 nodes ..."),
    ]
    first, second = world.target.prepare_candidates(candidates)
    assert set(first.gone) == {kept, gone} and not first.failed_victim and not first.status_error
    assert second.gone == ("not-" + recreated,) and not second.failed_victim  # 409: re-created, left alone
    assert world.sim.get_pod("default", "kept")["metadata"]["deletionTimestamp"]
    assert not world.sim.get_pod("default", "recreated")["metadata"].get("deletionTimestamp")
    for name in ("high", "second"):
        assert world.sim.get_pod("default", name)["status"]["nominatedNodeName"] == "n0"
    wait_for(lambda: {"FailedScheduling"} <= {e["reason"] for e in world.sim.events_for("default", "second")}
             and any(c["type"] == "PodScheduled" and c["reason"] == "Unschedulable"
                     for c in world.sim.get_pod("default", "high")["status"].get("conditions", [])),
             what="the preemptors' Events and conditions")
    wait_for(lambda: [e["message"] for e in world.sim.events_for("default", "kept") if e["reason"] == "Preempted"]
             == ["Preempted by pod uid-high on node n0"], what="the victim's Preempted Event")


def test_prepare_candidates_stops_a_candidate_at_a_victim_rbac_refuses(world):
    if world.kube is None:
        pytest.skip("RBAC is the API server's")
    uid = world.victim()["metadata"]["uid"]
    world.preemptor()
    world.server.deny("delete", "pods")
    [out] = world.kube.prepare_candidates([Candidate("default", "high", "uid-high", SCHED, "n0",
                                                     (Victim("default", "victim", uid),), "0/1 nodes ...")])
    assert out.failed_victim == "default/victim" and out.error.startswith("Forbidden:") and out.gone == ()
    assert not world.sim.get_pod("default", "victim")["metadata"].get("deletionTimestamp")
    assert "nominatedNodeName" not in world.sim.get_pod("default", "high")["status"]
