"""Coscheduling (scheduler-plugins'): QueueSort keeping a gang together, PreFilter's rejections,
Permit holding members until the group's quorum (bound members counted, the group's timeout),
Unreserve rejecting the waiting siblings; through the framework's binding cycle with DefaultBinder
binding into a real `SimCluster`; and `simulate` reporting a gang Scheduled only whole."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from builders import node, pod, pod_group, table_of
from shardsched.api.objects import PodInfo
from shardsched.api.podgroup import PodGroup
from shardsched.framework.binding_cycle import PERMIT, BindingCycle
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import Handle
from shardsched.framework.status import Code
from shardsched.plugins.coscheduling.plugin import NAME, Coscheduling
from shardsched.plugins.defaultbinder.plugin import DefaultBinder
from shardsched.scheduler.simulate import simulate as run_simulation
from shardsched.sim import SimCluster

ROOT = Path(__file__).resolve().parent.parent


def plugin_with(*groups: dict, pods=(), invalid: dict | None = None, handle: Handle | None = None) -> Coscheduling:
    handle = handle or Handle()
    handle.pod_groups.set_groups({g.key: g for g in map(PodGroup.from_object, groups)}, invalid or {})
    for p in pods:
        handle.pod_groups.add_pod(p if isinstance(p, PodInfo) else p.info())
    return Coscheduling(handle)


def member(name: str, group: str, cpu: str = "1", created: str = "2026-01-01T00:00:00Z", priority: int = 0):
    p = pod(name, cpu=cpu).in_group(group).with_priority(priority)
    p["metadata"]["creationTimestamp"] = created
    return p


# ---------------------------------------------------------------- QueueSort

def test_queue_sort_keeps_each_gang_together() -> None:
    early, late = "2026-01-01T00:00:00Z", "2026-01-01T00:00:05Z"
    pods = [member("b-0", "b", created=late), pod("solo").with_priority(0), member("a-0", "a"),
            member("b-1", "b", created=late), member("a-1", "a"), member("vip", "c", priority=10),
            member("a-2", "a")]
    pods[1]["metadata"]["creationTimestamp"] = "2026-01-01T00:00:03Z"
    plugin = plugin_with(pod_group("a", 3, created=early), pod_group("b", 2, created=early),
                         pod_group("c", 1, created=late), pods=pods)
    infos = [p.info() for p in pods]
    order = sorted(range(len(infos)), key=lambda i: plugin.sort_key(infos[i], float(i), i))
    # priority first; then the group's creation time (a and b share it: by group name, never
    # interleaved), the solo pod by its own creation time; within a group, queue time
    assert [infos[i].name for i in order] == ["vip", "a-0", "a-1", "a-2", "b-0", "b-1", "solo"]


# ---------------------------------------------------------------- PreFilter

PRE_FILTER_CASES = [
    ("no-group", [], [pod("p")], None),
    ("missing-group", [], [member("p", "x")], "PodGroup default/x not found"),
    ("invalid-group", [], [member("p", "bad")], "PodGroup default/bad is invalid: spec.minMember: 0 is below"),
    ("too-few-pods", [pod_group("g", 3)], [member("p", "g"), member("q", "g")],
     "pre-filter pod p cannot find enough sibling pods, current pods number: 2, minMember of group: 3"),
    ("gated-sibling", [pod_group("g", 2)], [member("p", "g"), member("q", "g").with_gates("wait")],
     "pre-filter pod p cannot proceed due to gated pods in the same PodGroup"),
    ("min-resources-gap", [pod_group("g", 2, cpu="9")], [member("p", "g"), member("q", "g")],
     "PodGroup default/g resource gap: cpu 1"),
    ("min-resources-pods-gap", [pod_group("g", 3, cpu="1")], [member(f"p{i}", "g") for i in range(3)],
     "PodGroup default/g resource gap: pods 1"),
    ("min-resources-fit", [pod_group("g", 2, cpu="8")], [member("p", "g"), member("q", "g")], None),
    ("enough-pods", [pod_group("g", 2)], [member("p", "g"), member("q", "g"), member("r", "g")], None),
]


@pytest.mark.parametrize("groups, pods, want", [c[1:] for c in PRE_FILTER_CASES], ids=[c[0] for c in PRE_FILTER_CASES])
def test_pre_filter(groups, pods, want) -> None:
    plugin = plugin_with(*groups, pods=pods, invalid={"default/bad": "spec.minMember: 0 is below the minimum of 1"})
    table = table_of(node("n1", cpu="4", pods=1), node("n2", cpu="4", pods=1))
    st = plugin.pre_filter(CycleState(), pods[0].info(), table)
    if want is None:
        assert st.is_success()
    else:
        assert st.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE and st.plugin == NAME
        assert st.message.startswith(want)


def test_pre_filter_counts_the_groups_own_pods_as_free() -> None:
    """upstream's CheckClusterResource removes the group's pods from each node first."""
    pods = [member("p", "g", cpu="3"), member("q", "g", cpu="3")]
    plugin = plugin_with(pod_group("g", 2, cpu="8"), pods=pods)
    table = table_of(node("n1", cpu="4"), node("n2", cpu="4"), pods=[pods[0].on("n1")])
    assert plugin.pre_filter(CycleState(), pods[1].info(), table).is_success()


# ---------------------------------------------------------------- Permit and Unreserve

def gang_cluster(n: int, group: dict, bound: int = 0) -> tuple[SimCluster, Handle, Coscheduling, list[PodInfo]]:
    cluster = SimCluster(seed=0)
    cluster.create_node(node("n1", cpu="16"))
    created = []
    for i in range(n):
        p = member(f"m{i}", group["metadata"]["name"])
        p["metadata"].pop("uid")
        if i < bound:
            p.on("n1")
        created.append(PodInfo.from_object(cluster.create_pod(p)))
    handle = Handle(cluster)
    plugin = plugin_with(group, pods=created, handle=handle)
    return cluster, handle, plugin, created[bound:]


def cycle_of(plugin: Coscheduling, handle: Handle) -> BindingCycle:
    return BindingCycle([plugin], [plugin], [], [DefaultBinder(handle)], [], handle, forget=lambda state, pods: None)


def bound_names(cluster: SimCluster) -> set[str]:
    return {p["metadata"]["name"] for p in cluster.list_pods()[0] if p["spec"].get("nodeName")}


def test_a_whole_gang_in_one_batch_binds_at_once() -> None:
    cluster, handle, plugin, pods = gang_cluster(3, pod_group("g", 3))
    cycle = cycle_of(plugin, handle)
    state = CycleState()
    assert cycle.reserve(state, pods, ["n1"] * 3) == {}
    assert cycle.permit_and_bind(state, pods, ["n1"] * 3) == {}
    assert bound_names(cluster) == {"m0", "m1", "m2"}


def test_bound_members_count_toward_the_quorum() -> None:
    cluster, handle, plugin, pods = gang_cluster(3, pod_group("g", 3), bound=2)
    cycle = cycle_of(plugin, handle)
    assert cycle.permit_and_bind(CycleState(), pods, ["n1"]) == {}
    assert bound_names(cluster) == {"m0", "m1", "m2"}


def test_members_in_two_batches_wait_for_each_other() -> None:
    cluster, handle, plugin, pods = gang_cluster(3, pod_group("g", 3, timeout_s=30))
    cycle = cycle_of(plugin, handle)
    first: dict = {}
    runner = threading.Thread(target=lambda: first.update(cycle.permit_and_bind(CycleState(), pods[:2], ["n1"] * 2)))
    runner.start()
    deadline = time.monotonic() + 10
    while handle.get_waiting_pod(pods[1].uid) is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert bound_names(cluster) == set()  # held at Permit: nothing bound before the quorum
    assert handle.get_waiting_pod(pods[0].uid).get_pending_plugins() == [NAME]
    assert cycle.permit_and_bind(CycleState(), pods[2:], ["n1"]) == {}
    runner.join(10)
    assert first == {} and bound_names(cluster) == {"m0", "m1", "m2"}


def test_an_incomplete_gang_is_rejected_after_the_groups_timeout() -> None:
    cluster, handle, plugin, pods = gang_cluster(3, pod_group("g", 3, timeout_s=0))
    failures = cycle_of(plugin, handle).permit_and_bind(CycleState(), pods[:2], ["n1"] * 2)
    assert set(failures) == {0, 1} and all(f.point == PERMIT for f in failures.values())
    assert failures[0].status.message == "rejected due to timeout after waiting 0s at plugin Coscheduling"
    assert bound_names(cluster) == set()


def test_unreserve_of_a_member_rejects_its_waiting_siblings() -> None:
    cluster, handle, plugin, pods = gang_cluster(3, pod_group("g", 3, timeout_s=30))
    cycle = cycle_of(plugin, handle)
    first: dict = {}
    runner = threading.Thread(target=lambda: first.update(cycle.permit_and_bind(CycleState(), pods[:2], ["n1"] * 2)))
    runner.start()
    deadline = time.monotonic() + 10
    while handle.get_waiting_pod(pods[1].uid) is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    cycle.rollback(CycleState(), pods[2:], ["n1"])  # the third member failed after its Reserve
    runner.join(10)
    assert {f.status.message for f in first.values()} == {"rejection in Unreserve"} and set(first) == {0, 1}
    assert bound_names(cluster) == set()
    assert handle.pod_groups.placed("default/g") == 2  # still assigned until their own rollback
    cycle.rollback(CycleState(), pods[:2], ["n1"] * 2)
    assert handle.pod_groups.placed("default/g") == 0


def test_permit_refuses_a_member_whose_group_is_gone() -> None:
    _, handle, plugin, pods = gang_cluster(2, pod_group("g", 2))
    handle.pod_groups.set_groups({}, {})
    (st, _), = plugin.permit(CycleState(), pods[:1], ["n1"])
    assert st.code == Code.UNSCHEDULABLE and st.message == "PodGroup not found"


# ---------------------------------------------------------------- simulate

NODES = """
apiVersion: v1
kind: Node
metadata: {name: n1}
status: {allocatable: {cpu: "4", memory: 16Gi, pods: "10"}}
---
apiVersion: v1
kind: Node
metadata: {name: n2}
status: {allocatable: {cpu: "2", memory: 16Gi, pods: "10"}}
"""


def gang_yaml(name: str, min_member: int, cpus: list[str], created: str = "2026-01-01T00:00:00Z",
              bound: dict[int, str] | None = None, group: bool = True) -> str:
    docs = []
    if group:
        docs.append(f"""apiVersion: scheduling.x-k8s.io/v1alpha1
kind: PodGroup
metadata: {{name: {name}, creationTimestamp: "{created}"}}
spec: {{minMember: {min_member}}}""")
    for i, cpu in enumerate(cpus):
        on = f", nodeName: {bound[i]}" if bound and i in bound else ""
        docs.append(f"""apiVersion: v1
kind: Pod
metadata: {{name: {name}-{i}, labels: {{scheduling.x-k8s.io/pod-group: {name}}}, creationTimestamp: "{created}"}}
spec: {{schedulerName: gang-scheduler{on}, containers: [{{name: c, image: i, resources: {{requests: {{cpu: "{cpu}"}}}}}}]}}""")
    return "\n---\n".join(docs)


def simulate(tmp_path: Path, *docs: str) -> dict[str, dict]:
    f = tmp_path / "in.yaml"
    f.write_text("\n---\n".join((NODES, *docs)))
    report = run_simulation([f], ROOT / "deploy/config/coscheduling.yaml")
    assert not report.errors
    return {p["name"]: p for p in report.to_json()["pods"]}


SOLO = """apiVersion: v1
kind: Pod
metadata: {name: solo, creationTimestamp: "2026-01-01T00:00:09Z"}
spec: {containers: [{name: c, image: i, resources: {requests: {cpu: "2"}}}]}"""


def test_simulate_places_a_whole_gang(tmp_path: Path) -> None:
    pods = simulate(tmp_path, gang_yaml("train", 3, ["2", "2", "2"]))
    assert {p["status"] for p in pods.values()} == {"Scheduled"}
    assert sorted(p["node"] for p in pods.values()) == ["n1", "n1", "n2"]


def test_simulate_places_no_member_of_a_gang_that_does_not_fit(tmp_path: Path) -> None:
    pods = simulate(tmp_path, gang_yaml("train", 3, ["2", "2", "3"]), SOLO)
    gang = [pods[f"train-{i}"] for i in range(3)]
    assert {p["status"] for p in gang} == {"Unschedulable"} and {p["node"] for p in gang} == {None}
    assert gang[0]["reason"] == ("pod group default/train: 2/3 members schedulable; default/train-2: 0/2 nodes are "
                                 "available: 2 Insufficient cpu. preemption: 0/2 nodes are available: 2 No preemption "
                                 "victims found for incoming pod..")
    assert {p["reason"] for p in gang} == {gang[0]["reason"]}
    assert pods["solo"]["status"] == "Scheduled"  # the gang's rolled-back room is free for the pods after it


def test_simulate_gang_with_a_bound_member_and_spare_pods(tmp_path: Path) -> None:
    pods = simulate(tmp_path, gang_yaml("train", 2, ["1", "1", "9"], bound={0: "n1"}))
    assert pods["train-1"]["status"] == "Scheduled"
    assert pods["train-2"]["status"] == "Unschedulable"  # one member short of all is fine: minMember is 2
    assert pods["train-2"]["reason"].startswith("0/2 nodes are available: 2 Insufficient cpu.")


@pytest.mark.parametrize("docs, want", [
    ((gang_yaml("train", 3, ["1", "1"]),),
     "0/2 nodes are available: pre-filter pod train-0 cannot find enough sibling pods, current pods number: 2, "
     "minMember of group: 3."),
    ((gang_yaml("train", 2, ["1", "1"], group=False),), "0/2 nodes are available: PodGroup default/train not found."),
], ids=["min-member-above-its-pods", "missing-group"])
def test_simulate_holds_members_of_a_group_that_cannot_start(tmp_path: Path, docs, want) -> None:
    pods = simulate(tmp_path, *docs)
    assert pods["train-0"]["status"] == "Unschedulable" and pods["train-0"]["reason"].startswith(want)
