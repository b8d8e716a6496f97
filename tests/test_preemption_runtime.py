"""Preemption in the sharded runtime: the coordinator's PostFilter over the whole cluster, the API
writes (DisruptionTarget, deletion with a uid precondition, Events, nominatedNodeName), and the
nomination as a reservation in the Redis ledger. A plain `Coordinator` over a real `SimCluster`,
a real Redis ledger and plain `Shard`s stepped by the test (`World` of test_coordinator)."""

from __future__ import annotations

from shardsched.cluster import Forbidden
from shardsched.store.ledger import BoundPod, NodeEntry, ReserveCode, ReserveItem

from builders import pod
from test_coordinator import World

HIGH, LOW = 1000, 0


def low_pods(n: int, prefix: str = "low", cpu: str = "1", priority: int = LOW, labels: dict | None = None) -> list[dict]:
    out = []
    for i in range(n):
        p = pod(f"{prefix}-{i}", cpu=cpu).with_priority(priority).with_labels(labels or {"app": prefix})
        p.spec["schedulerName"] = "shardsched"
        out.append(p)
    return out


def high_pod(name: str = "high", cpu: str = "2", priority: int = HIGH, policy: str | None = None) -> dict:
    p = pod(name, cpu=cpu).with_priority(priority, policy)
    p.spec["schedulerName"] = "shardsched"
    return p


def full_world(ledger, nodes: int = 2, shards: int = 2) -> World:
    """``nodes`` nodes of 4 cpu, every cpu taken by a low-priority pod (1 cpu each)."""
    world = World(ledger, n_nodes=nodes, shards=shards)
    world.cluster.create_pods(low_pods(4 * nodes))
    world.settle()
    assert world.cluster.invariants()["pods_bound"] == 4 * nodes
    return world


def pods_by_name(world: World) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in world.cluster.list_pods()[0]}


def reasons(world: World, name: str) -> list[tuple[str, str]]:
    return [(e["reason"], e["message"]) for e in world.cluster.events_for("default", name)]


def retry_all(world: World) -> None:
    """Every unschedulable pod gets another attempt (a cluster event), and the world settles."""
    for s in world.shards.values():
        s.move_all_to_active_or_backoff_queue("NodeUpdate")
    world.settle(parked_ok=True)


def test_a_high_priority_pod_on_a_full_cluster_preempts_two_victims_and_binds(ledger):
    world = full_world(ledger)
    [created] = world.cluster.create_pods([high_pod()])
    world.settle()
    pods = pods_by_name(world)
    high = pods["high"]
    node = high["spec"].get("nodeName")
    assert node, "the preemptor is bound"
    assert high["status"]["nominatedNodeName"] == node
    gone = sorted(f"low-{i}" for i in range(8) if f"low-{i}" not in pods)
    assert len(gone) == 2  # the fewest victims that make room: two 1-cpu pods on one node
    for name in gone:
        assert ("Preempted", f"Preempted by pod {created['metadata']['uid']} on node {node}") in reasons(world, name)
    # the attempt that preempted failed, with kube's message and no preemption part
    assert ("FailedScheduling", "0/2 nodes are available: 2 Insufficient cpu.") in reasons(world, "high")
    state = world.coordinator.state
    assert state.preempting == {} and state.nominated == {}  # released once it bound
    assert ledger.nominations(node) == {}
    assert state.metrics.preemption_attempts._value.get() >= 1
    inv = world.cluster.invariants()
    assert inv["pods_bound"] == 7 and inv["bind_conflicts"] == 0 and not inv.get("overcommitted")


def test_a_pod_that_cannot_preempt_gets_upstreams_preemption_message(ledger):
    world = full_world(ledger)
    world.cluster.create_pods([high_pod("never", policy="Never"), high_pod("peer", priority=LOW)])
    world.settle(parked_ok=True)
    assert world.coordinator.unschedulable_reasons() == {
        "0/2 nodes are available: 2 Insufficient cpu. preemption: not eligible due to preemptionPolicy=Never..": 1,
        "0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are available: 2 No preemption "
        "victims found for incoming pod..": 1}
    assert len(world.cluster.list_pods()[0]) == 10  # nothing deleted


def test_the_nomination_keeps_the_freed_room_from_a_lower_priority_pod(ledger):
    """The victims terminate (grace period on the cluster's clock): the preemptor waits nominated,
    a lower-priority pod created meanwhile does not take the room, and the preemptor binds once
    the victims are gone."""
    clock = [0.0]
    from shardsched.sim import SimCluster
    world = World(ledger, n_nodes=1, shards=2,
                  cluster=SimCluster(seed=0, clock=lambda: clock[0], grace_period_scale=1.0))
    world.cluster.create_pods(low_pods(4))
    world.settle()
    world.cluster.create_pods([high_pod()])
    world.settle(parked_ok=True)
    pods = pods_by_name(world)
    assert "nominatedNodeName" in pods["high"]["status"] and not pods["high"]["spec"].get("nodeName")
    assert sum(1 for p in pods.values() if p["metadata"].get("deletionTimestamp")) == 2
    assert world.coordinator.unschedulable_reasons() == {"0/1 nodes are available: 1 Insufficient cpu.": 1}
    retry_all(world)  # its next attempt, while the victims still terminate: it keeps its nomination
    assert world.coordinator.unschedulable_reasons() == {
        "0/1 nodes are available: 1 Insufficient cpu. preemption: not eligible due to a terminating pod on the "
        "nominated node..": 1}
    clock[0] += 31  # the victims' grace period ends
    world.cluster.create_pods(low_pods(1, prefix="late"))
    world.settle(parked_ok=True)
    pods = pods_by_name(world)
    assert pods["high"]["spec"].get("nodeName") == "node-00000"
    assert not pods["late-0"]["spec"].get("nodeName")
    assert world.cluster.invariants()["pods_bound"] == 3


def test_two_preemptors_on_one_node_across_two_shards_one_wins_the_ledger(ledger):
    """Two shards, one node, two preemptors that each need half of it: both nominated, each with its
    own victims (the second sees the first's nomination), both bound; the ledger refuses a third
    nomination that would need the same room, and a pod of lower priority cannot reserve it."""
    world = full_world(ledger, nodes=1)
    world.cluster.create_pods([high_pod("a"), high_pod("b")])
    world.settle()
    pods = pods_by_name(world)
    assert pods["a"]["spec"]["nodeName"] == pods["b"]["spec"]["nodeName"] == "node-00000"
    assert sum(1 for name in pods if name.startswith("low-")) == 0
    assert world.coordinator.state.counters["victims"] == 4

    # the arbiter itself: a full node, two preemptors naming the same victims
    ledger.upsert_nodes([NodeEntry("n", {"cpu": 4000, "pods": 10})])
    ledger.observe([BoundPod("v0", "n", {"cpu": 2000}), BoundPod("v1", "n", {"cpu": 2000})])
    assert ledger.nominate("p1", "n", HIGH, {"cpu": 2000}, ["v0"], 60_000).ok
    refused = ledger.nominate("p2", "n", HIGH, {"cpu": 3000}, ["v1"], 60_000)
    assert refused.code == ReserveCode.INSUFFICIENT and refused.resource == "cpu"
    ledger.forget({"v0": "n", "v1": "n"})
    ledger.set_owners({"n": "s"}, 99)
    tokens = ledger.acquire_leases(["low", "p1"], "s", 10_000)
    [low] = ledger.reserve("s", 99, [ReserveItem("low", "n", tokens["low"], {"cpu": 3000}, LOW)], 10_000)
    assert low.code == ReserveCode.INSUFFICIENT  # 2 cpu held for p1
    [mine] = ledger.reserve("s", 99, [ReserveItem("p1", "n", tokens["p1"], {"cpu": 2000}, HIGH)], 10_000)
    assert mine.ok  # its own nomination does not count against it


def test_victims_recreated_by_their_set_do_not_take_the_room_and_nothing_loops(ledger):
    """Loop-freedom: the victims belong to a ReplicaSet-like set that recreates each at once, with
    the same labels and priority. The recreated pods are ours to schedule too; the nomination keeps
    them off the freed room, the preemptor binds, exactly two pods are ever deleted, and no pod is
    deleted twice."""
    world = World(ledger, n_nodes=1, shards=2)
    template = low_pods(1, prefix="web")[0]
    world.cluster.create_replica_set({"metadata": {"name": "web", "namespace": "default"},
                                      "spec": {"replicas": 4, "template": template}})
    world.settle()
    world.cluster.create_pods([high_pod()])
    world.settle(parked_ok=True)
    for _ in range(3):  # more rounds: the recreated pods retry and must keep failing
        retry_all(world)
    pods = pods_by_name(world)
    assert pods["high"]["spec"]["nodeName"] == "node-00000"
    state = world.coordinator.state
    assert state.counters["victims"] == 2 and state.counters["preemptions"] == 1
    bound_web = [p for name, p in pods.items() if name.startswith("web") and p["spec"].get("nodeName")]
    assert len(bound_web) == 2
    assert world.cluster.invariants()["pods_bound"] == 3


class _ForbiddenDeletes:
    """A cluster whose pods/delete is refused (RBAC without pods/delete)."""

    def __init__(self, cluster) -> None:
        self._cluster = cluster

    def delete_pod(self, namespace, name, uid=None, grace_period_s=None):
        raise Forbidden(f'pods "{name}" is forbidden: User "shardsched" cannot delete resource "pods"')

    def __getattr__(self, name):
        return getattr(self._cluster, name)


def test_a_victim_that_cannot_be_deleted_leaves_the_preemptor_queued_with_the_error(ledger):
    world = full_world(ledger)
    world.coordinator.state.cluster.channel.target = _ForbiddenDeletes(world.cluster)
    world.cluster.create_pods([high_pod()])
    for _ in range(20):
        world.coordinator.step()
        for s in world.shards.values():
            s.step()
    messages = [m for r, m in reasons(world, "high") if r == "FailedScheduling"]
    assert messages and "could not delete victim" in messages[-1] and "Forbidden" in messages[-1]
    state = world.coordinator.state
    assert any(t.pod.name == "high" for t in state.pending.values())  # kept, retried
    assert len(world.cluster.list_pods()[0]) == 9  # nothing deleted
    assert all(ledger.nominations(n) == {} for n in ("node-00000", "node-00001"))
    assert state.counters["victim_delete_errors"] >= 1
