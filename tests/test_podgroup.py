"""PodGroups (``scheduling.x-k8s.io/v1alpha1``): the view Coscheduling reads, the status the
PodGroup controller writes, the simulated cluster's objects and their watch events, and the
intake's parse of them (a bad one is kept as invalid, not dropped)."""

from __future__ import annotations

from collections import Counter

import pytest

from shardsched.api.podgroup import (FAILED, FINISHED, PENDING, RUNNING, SCHEDULING, PodGroup, group_key_of,
                                     group_status)
from shardsched.cluster import ADDED, DELETED, MODIFIED, PODGROUP, Binding, Invalid, NotFound, apply_pod_group_events
from shardsched.errors import InvalidObjectError
from shardsched.sim.cluster import SimCluster

from builders import node, pod, pod_group


def test_from_object_reads_the_spec() -> None:
    g = PodGroup.from_object(pod_group("train", 3, timeout_s=30, cpu="6", memory="1Gi"))
    assert (g.key, g.min_member, g.schedule_timeout_s) == ("default/train", 3, 30)
    assert g.min_resources == {"cpu": 6000, "memory": 2**30}
    assert g.min_resources_with_pods() == {"cpu": 6000, "memory": 2**30, "pods": 3}
    assert g.created_s == 1767225600.0


@pytest.mark.parametrize("spec, path", [
    ({"minMember": 0}, "spec.minMember"),
    ({}, "spec.minMember"),
    ({"minMember": "3"}, "spec.minMember"),
    ({"minMember": 2, "scheduleTimeoutSeconds": -1}, "spec.scheduleTimeoutSeconds"),
    ({"minMember": 2, "minResources": {"cpu": "lots"}}, "spec.minResources.cpu"),
], ids=["min-member-0", "min-member-missing", "min-member-string", "negative-timeout", "bad-quantity"])
def test_from_object_names_the_bad_field(spec: dict, path: str) -> None:
    obj = pod_group("g")
    obj["spec"] = spec
    with pytest.raises(InvalidObjectError) as e:
        PodGroup.from_object(obj)
    assert e.value.path == path


def test_group_key_of() -> None:
    assert group_key_of("ml", {"scheduling.x-k8s.io/pod-group": "a"}) == "ml/a"
    assert group_key_of("ml", {"scheduling.x-k8s.io/pod-group": ""}) is None
    assert group_key_of("ml", None) is None


NOW = "2026-01-01T00:00:05Z"


@pytest.mark.parametrize("old, phases, want", [
    ({}, [], {"phase": PENDING}),
    ({"phase": PENDING}, ["Pending"], {"phase": PENDING}),
    ({"phase": PENDING}, ["Pending", "Pending"], {"phase": SCHEDULING, "scheduleStartTime": NOW}),
    ({"phase": SCHEDULING}, ["Running", "Pending"],
     {"phase": SCHEDULING, "running": 1, "succeeded": 0, "failed": 0, "scheduleStartTime": NOW}),
    ({"phase": SCHEDULING}, ["Running", "Succeeded"],
     {"phase": RUNNING, "running": 1, "succeeded": 1, "failed": 0, "scheduleStartTime": NOW}),
    ({"phase": RUNNING}, ["Running"], {"phase": PENDING, "running": 1, "succeeded": 0, "failed": 0}),
    ({"phase": RUNNING}, ["Running", "Failed"],
     {"phase": FAILED, "running": 1, "succeeded": 0, "failed": 1, "scheduleStartTime": NOW}),
    ({"phase": RUNNING}, ["Succeeded", "Succeeded"],
     {"phase": FINISHED, "running": 0, "succeeded": 2, "failed": 0, "scheduleStartTime": NOW}),
    ({"phase": FAILED, "failed": 1}, ["Running", "Running"], {"phase": FAILED, "failed": 1}),
], ids=["new", "too-few", "enough-pods", "one-running", "quorum-running", "lost-a-pod", "failed", "finished",
        "final"])
def test_group_status_follows_the_controller(old: dict, phases: list, want: dict) -> None:
    assert group_status(2, Counter(phases), old, NOW) == want


def member(name: str, group: str = "g", cpu: str = "1") -> dict:
    p = pod(name, cpu=cpu).in_group(group)
    p["metadata"].pop("uid")
    return p


def test_sim_writes_the_status_as_members_come_and_bind() -> None:
    sim = SimCluster()
    sim.create_node(node("n0"))
    created = sim.create_pod_group(pod_group("g", 2))
    assert created["status"] == {"phase": PENDING}
    assert created["apiVersion"] == "scheduling.x-k8s.io/v1alpha1" and created["metadata"]["uid"]
    _, rv = sim.list_pod_groups()
    pods = [sim.create_pod(member(f"p{i}")) for i in range(2)]
    assert sim.get_pod_group("default", "g")["status"]["phase"] == SCHEDULING
    assert sim.get_pod_group("default", "g")["status"]["scheduleStartTime"]
    sim.bind_many([Binding("default", p["metadata"]["name"], "n0", p["metadata"]["uid"]) for p in pods])
    status = sim.get_pod_group("default", "g")["status"]
    assert (status["phase"], status["running"]) == (RUNNING, 2)
    events, _ = sim.events_since(rv, kinds=[PODGROUP])
    # enough pods, then one bound and running, then both
    assert [(e.object["status"]["phase"], e.object["status"].get("running")) for e in events] == [
        (SCHEDULING, 0), (SCHEDULING, 1), (RUNNING, 2)]
    assert all(e.type == MODIFIED for e in events)
    sim.delete_pod("default", "p0")
    assert sim.get_pod_group("default", "g")["status"]["phase"] == PENDING


def test_sim_group_created_after_its_pods_counts_them() -> None:
    sim = SimCluster()
    for i in range(3):
        sim.create_pod(member(f"p{i}"))
    assert sim.create_pod_group(pod_group("g", 3))["status"]["phase"] == SCHEDULING


def test_sim_refuses_bad_groups_and_deletes() -> None:
    sim = SimCluster()
    with pytest.raises(Invalid, match="PodGroup default/g: spec.minMember: 0 is below the minimum of 1"):
        sim.create_pod_group(pod_group("g", 0))
    sim.create_pod_group(pod_group("g", 2))
    updated = sim.update_pod_group(pod_group("g", 5))
    assert updated["metadata"]["generation"] == 2 and updated["spec"]["minMember"] == 5
    _, rv = sim.list_pod_groups()
    sim.delete_pod_group("default", "g")
    with pytest.raises(NotFound):
        sim.get_pod_group("default", "g")
    events, _ = sim.events_since(rv, kinds=[PODGROUP])
    assert [e.type for e in events] == [DELETED]
    assert sim.create_pod(member("p0"))  # a pod naming a missing group is stored as any pod


def test_namespace_deletion_deletes_its_groups() -> None:
    sim = SimCluster()
    sim.create_namespace({"metadata": {"name": "ml"}})
    sim.create_pod_group(pod_group("g", 2, namespace="ml"))
    sim.delete_namespace("ml")
    assert sim.list_pod_groups()[0] == []


def test_apply_pod_group_events_keeps_bad_groups_as_invalid() -> None:
    groups: dict = {}
    invalid: dict = {}
    bad = pod_group("bad", 0)
    changed = apply_pod_group_events(groups, invalid, [(ADDED, pod_group("g", 2)), (ADDED, bad), (ADDED, {"spec": {}})])
    assert changed == 2
    assert set(groups) == {"default/g"} and "spec.minMember" in invalid["default/bad"]
    fixed = pod_group("bad", 1)
    assert apply_pod_group_events(groups, invalid, [(MODIFIED, fixed), (DELETED, pod_group("g"))]) == 2
    assert set(groups) == {"default/bad"} and not invalid


# ---------------------------------------------------------------- the Kubernetes backend

def test_kube_backend_lists_and_watches_pod_groups_when_asked(simapi, simapi_spec) -> None:
    import time

    from shardsched.kube.cluster import KubeCluster
    from shardsched.kube.permissions import GANG_PERMISSIONS

    sim = simapi.sim
    sim.create_pod_group(pod_group("before", 2))
    plain = KubeCluster(simapi_spec, ["shardsched-test"], watch_timeout_s=5)
    gangs = KubeCluster(simapi_spec, ["shardsched-test"], watch_timeout_s=5, pod_groups=True)
    try:
        assert plain.list_pod_groups()[0] == [] and PODGROUP not in plain.capabilities.kinds
        listed, rv = gangs.list_pod_groups()
        assert [(g["apiVersion"], g["kind"], g["metadata"]["name"], g["status"]["phase"]) for g in listed] == [
            ("scheduling.x-k8s.io/v1alpha1", PODGROUP, "before", PENDING)]
        assert PODGROUP in gangs.capabilities.kinds
        sim.create_pod_group(pod_group("after", 1))
        sim.delete_pod_group("default", "before")
        seen: list = []
        deadline = time.monotonic() + 10
        while len(seen) < 2:
            assert time.monotonic() < deadline, seen
            events, rv = gangs.events_since(rv, [PODGROUP])
            seen += [(e.type, e.object["metadata"]["name"]) for e in events]
            time.sleep(0.05)
        assert seen == [(ADDED, "after"), (DELETED, "before")]
        simapi.deny("list", "podgroups")
        assert gangs.missing_permissions() == ["list scheduling.x-k8s.io/podgroups"]
        assert plain.missing_permissions() == []  # asked only of a scheduler with gangs
        assert ("watch", "scheduling.x-k8s.io", "podgroups") in GANG_PERMISSIONS
    finally:
        plain.stop()
        gangs.stop()
