"""Preemption in the sharded runtime: the coordinator's PostFilter over the whole cluster, the API
writes (DisruptionTarget, deletion with a uid precondition, Events, nominatedNodeName), and the
nomination as a reservation in the Redis ledger. A plain `Coordinator` over a real `SimCluster`,
a real Redis ledger and plain `Shard`s stepped by the test (`World` of test_coordinator)."""

from __future__ import annotations

import json
import time

import pytest

from shardsched.cluster import Forbidden, prepare_candidates
from shardsched.config import load_config
from shardsched.sim import SimCluster
from shardsched.sharding.coordinator import rebalancer
from shardsched.sharding.nominations import NominatedPods
from shardsched.sharding.protocols import UNSCHEDULABLE_HERE, Handoff
from shardsched.store.ledger import BoundPod, NodeEntry, NominateItem, ReserveCode, ReserveItem

from builders import node, pod, table_of
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


def plain(obj: dict) -> dict:
    """A builder's pod as plain dicts and lists (what another process can unpickle)."""
    return json.loads(json.dumps(obj))


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


def settle_fully(world: World, timeout_s: float = 15.0) -> None:
    """`World.settle` with unschedulable pods allowed, until no pod is left backing off either
    (settle alone may return while a pod waits out its backoff)."""
    deadline = time.monotonic() + timeout_s
    while True:
        world.settle(timeout_s=timeout_s, parked_ok=True)
        if not any(s.queue.pending_counts()["backoff"] for s in world.shards.values()):
            return
        assert time.monotonic() < deadline, "pods still backing off"
        time.sleep(0.01)


def retry_all(world: World) -> None:
    """Every unschedulable pod gets another attempt (a cluster event), and the world settles."""
    for s in world.shards.values():
        s.move_all_to_active_or_backoff_queue("NodeUpdate")
    settle_fully(world)


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
    settle_fully(world)
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
    world = World(ledger, n_nodes=1, shards=2,
                  cluster=SimCluster(seed=0, clock=lambda: clock[0], grace_period_scale=1.0))
    world.cluster.create_pods(low_pods(4))
    world.settle()
    world.cluster.create_pods([high_pod()])
    settle_fully(world)
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
    settle_fully(world)
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
    first, refused, lower = ledger.nominate_many([NominateItem("p1", "n", HIGH, {"cpu": 2000}, ("v0",)),
                                                  NominateItem("p2", "n", HIGH, {"cpu": 3000}, ("v1",)),
                                                  NominateItem("p3", "n", LOW, {"cpu": 1000}, ())], 60_000)
    assert first.ok and refused.code == ReserveCode.INSUFFICIENT and refused.resource == "cpu"
    assert lower.code == ReserveCode.INSUFFICIENT  # p1's 2 cpu and v1's 2 cpu leave none for it
    assert ledger.nominate("p2", "n", HIGH, {"cpu": 2000}, ["v1"], 60_000).ok  # with both victims gone: room
    assert ledger.nominations("n") == {"p1": HIGH, "p2": HIGH}
    ledger.unnominate({"p2": "n"})
    ledger.forget({"v0": "n", "v1": "n"})
    ledger.set_owners({"n": "s"}, 99)
    tokens = ledger.acquire_leases(["low", "p1"], "s", 10_000)
    [low] = ledger.reserve("s", 99, [ReserveItem("low", "n", tokens["low"], {"cpu": 3000}, LOW)], 10_000)
    assert low.code == ReserveCode.INSUFFICIENT  # 2 cpu held for p1
    [mine] = ledger.reserve("s", 99, [ReserveItem("p1", "n", tokens["p1"], {"cpu": 2000}, HIGH)], 10_000)
    assert mine.ok  # its own nomination does not count against it


class _RecordedBatches:
    """The cluster, with the preemption batches the coordinator sends recorded."""

    def __init__(self, cluster) -> None:
        self._cluster = cluster
        self.batches: list[list] = []

    def prepare_candidates(self, candidates):
        self.batches.append(list(candidates))
        return self._cluster.prepare_candidates(candidates)

    def __getattr__(self, name):
        return getattr(self._cluster, name)


def test_the_preemptors_of_one_pass_are_decided_in_priority_order_with_disjoint_victims(ledger):
    """Three preemptors reach the coordinator in one pass, the lowest first; two nodes have room
    for two of them. They are decided highest first, each over the table the ones before left:
    the two higher ones get a node each with victims of their own, sent in one batch; the lowest
    finds no node (the nominations of higher priority count for it and are never its victims)."""
    world = full_world(ledger)
    recorded = _RecordedBatches(world.cluster)
    world.coordinator.state.cluster.channel.target = recorded
    world.cluster.create_pods([high_pod("p100", cpu="3", priority=100), high_pod("p200", cpu="3", priority=200),
                               high_pod("p300", cpu="3", priority=300)])
    world.coordinator.poll_watch()  # routed to the shards: taken back and handed off, lowest first,
    qpis = sorted((q for s in world.shards.values() for q in s.drain()), key=lambda q: q.pod_info.priority)
    for q in qpis:  # as after a round over both shards
        world.coordinator.state.pending[q.pod_info.uid].tried = {0, 1}
    world.coordinator.handoff(0, [Handoff(q, UNSCHEDULABLE_HERE, "0/1 nodes are available: 1 Insufficient cpu.",
                                          {"Insufficient cpu": 1}, 1) for q in qpis])
    settle_fully(world)
    first = recorded.batches[0]
    assert [c.name for c in first] == ["p300", "p200"]  # one batch, in queue order
    victims = [{v.uid for v in c.victims} for c in first]
    assert all(len(v) == 3 for v in victims) and not victims[0] & victims[1]
    assert first[0].node != first[1].node
    pods = pods_by_name(world)
    assert pods["p300"]["spec"]["nodeName"] == first[0].node and pods["p200"]["spec"]["nodeName"] == first[1].node
    assert not pods["p100"]["spec"].get("nodeName") and "nominatedNodeName" not in pods["p100"]["status"]
    assert all(c.name != "p100" for batch in recorded.batches for c in batch)
    assert world.coordinator.state.counters["victims"] == 6
    assert world.cluster.invariants()["pods_bound"] == 4


def test_a_pass_decides_the_preemptors_its_budget_allows_and_the_rest_first_at_the_next(ledger, monkeypatch):
    """A rebalance pass holds the state lock: with no time budget left it still decides one
    preemptor (the highest), and the others wait for the next pass instead of holding the lock
    (the watch and the status calls need it) for all of them."""
    class Clock:  # the rebalancer's clock, 0.1 s a reading: the budget runs out after the hand-offs
        now = 0.0

        @classmethod
        def monotonic(cls) -> float:
            cls.now += 0.1
            return cls.now

    monkeypatch.setattr(rebalancer, "REBALANCE_BUDGET_S", 0.25)
    world = full_world(ledger)
    recorded = _RecordedBatches(world.cluster)
    world.coordinator.state.cluster.channel.target = recorded
    world.cluster.create_pods([high_pod("p200", cpu="3", priority=200), high_pod("p300", cpu="3", priority=300)])
    world.coordinator.poll_watch()
    qpis = sorted((q for s in world.shards.values() for q in s.drain()), key=lambda q: q.pod_info.priority)
    for q in qpis:
        world.coordinator.state.pending[q.pod_info.uid].tried = {0, 1}
    world.coordinator.handoff(0, [Handoff(q, UNSCHEDULABLE_HERE, "0/1 nodes are available: 1 Insufficient cpu.",
                                          {"Insufficient cpu": 1}, 1) for q in qpis])
    with monkeypatch.context() as m:
        m.setattr(rebalancer, "time", Clock)
        for _ in range(2):
            with world.coordinator.state.lock:
                assert world.coordinator.rebalancer.rebalance()
    assert [[c.name for c in batch] for batch in recorded.batches] == [["p300"], ["p200"]]
    settle_fully(world)
    pods = pods_by_name(world)
    assert pods["p300"]["spec"].get("nodeName") and pods["p200"]["spec"].get("nodeName")


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
    settle_fully(world)
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

    def prepare_candidates(self, candidates):  # the batch through this double's delete_pod
        return prepare_candidates(self, candidates)

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


SLOW_BACKOFF = load_config("""\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
podInitialBackoffSeconds: 1
podMaxBackoffSeconds: 1
profiles:
- schedulerName: shardsched
""")


def test_the_owner_shard_counts_a_nomination_so_a_pod_of_equal_priority_is_not_placed_there(ledger):
    """The preemptor backs off after its attempt (1 s) while a pod of the same priority (which may
    not preempt) arrives and is tried first: the node's owner shard counts the nomination on the
    freed node in its table (RunFilterPluginsWithNominatedPods), so it does not place that pod
    there at all (no Reserve for the ledger to refuse), and the preemptor binds there; without the
    nomination that pod would have taken the room and the preemptor would have preempted again."""
    world = World(ledger, n_nodes=1, shards=2, config=SLOW_BACKOFF)
    world.cluster.create_pods(low_pods(4))
    world.settle()
    [high] = world.cluster.create_pods([high_pod()])
    world.coordinator.step()  # route
    for _ in range(3):
        for s in world.shards.values():
            s.step()
        world.coordinator.step()  # the round fails, the preemption deletes two pods
    assert world.coordinator.state.counters["preemptions"] == 1
    [owner] = [s for s in world.shards.values() if s.table.num_nodes]
    uid = high["metadata"]["uid"]
    assert uid in owner.nominated and owner.table.node_of(uid) == "node-00000"
    assert owner.table.requested_of("node-00000")["cpu"] == 4000  # 2 cpu left by the victims, 2 nominated
    world.cluster.create_pods([high_pod("peer", policy="Never")])
    settle_fully(world)
    pods = pods_by_name(world)
    assert pods["high"]["spec"].get("nodeName") == "node-00000"
    assert not pods["peer"]["spec"].get("nodeName")
    assert sum(s.stats.reserve_failures for s in world.shards.values()) == 0
    assert uid not in owner.nominated  # bound: counted as bound, no longer as nominated
    assert owner.table.requested_of("node-00000")["cpu"] == 4000
    assert world.coordinator.state.counters["victims"] == 2


def test_a_pod_another_scheduler_binds_onto_the_freed_node_is_preempted_once_and_no_victim_twice(ledger):
    """Loop-freedom against a rival scheduler (no ledger): right after the victims go, another
    scheduler binds a pod of lower priority onto the freed node. The preemptor preempts again (kube's
    rules choose its victims among the pods now there), never deletes a pod twice, and binds."""
    clock = [0.0]
    world = World(ledger, n_nodes=1, shards=2,
                  cluster=SimCluster(seed=0, clock=lambda: clock[0], grace_period_scale=1.0))
    world.cluster.create_pods(low_pods(4))
    world.settle()
    world.cluster.create_pods([high_pod()])
    settle_fully(world)
    candidates = ["low-0", "low-1", "low-2", "low-3", "rival"]
    preempted = preempted_now(world, candidates)  # while they terminate (the cluster drops a gone pod's Events)
    clock[0] += 31  # victims gone; the rival is faster than our next attempt
    world.cluster.list_pods()
    world.cluster.create_pods([pod("rival", cpu="2").with_priority(LOW).on("node-00000")])
    settle_fully(world)
    preempted += preempted_now(world, candidates)
    clock[0] += 31
    world.cluster.list_pods()
    retry_all(world)
    pods = pods_by_name(world)
    assert pods["high"]["spec"].get("nodeName") == "node-00000"
    state = world.coordinator.state
    assert state.counters["preemptions"] == 2
    gone = [name for name in candidates if name not in pods]
    assert sorted(preempted) == sorted(gone) and len(gone) == state.counters["victims"] == 4  # each once
    assert world.cluster.invariants()["pods_bound"] == 2  # the preemptor and the rival's pod


def preempted_now(world: World, names: list[str]) -> list[str]:
    """The pods among ``names`` that have a Preempted Event, once per Event (a repeat counts)."""
    return [name for name in names for e in world.cluster.events_for("default", name)
            if e["reason"] == "Preempted" for _ in range(e.get("count", 1))]


def test_a_new_coordinator_keeps_a_nomination_it_finds_on_the_pod_and_deletes_nothing_more(ledger):
    """The coordinator is replaced while the victims terminate: the new one (new shards, same
    cluster and ledger) takes the preemptor's nomination from ``status.nominatedNodeName``, records
    it in the ledger with the victims it sees terminating, deletes no other pod, and the preemptor
    binds once the victims are gone."""
    clock = [0.0]
    world = World(ledger, n_nodes=1, shards=2,
                  cluster=SimCluster(seed=0, clock=lambda: clock[0], grace_period_scale=1.0))
    world.cluster.create_pods(low_pods(4))
    world.settle()
    [created] = world.cluster.create_pods([high_pod()])
    settle_fully(world)
    assert world.coordinator.state.counters["victims"] == 2
    ledger.unnominate({created["metadata"]["uid"]: "node-00000"})  # as if Redis lost it too
    again = World(ledger, n_nodes=0, shards=2, cluster=world.cluster)  # the old one is no longer stepped
    state = again.coordinator.state
    assert state.preempting[created["metadata"]["uid"]].node == "node-00000"
    assert state.nominated == {created["metadata"]["uid"]: "node-00000"}  # the pods decided next see it
    settle_fully(again)
    again.coordinator._renew_nominations()  # what its health thread does every period
    assert ledger.nominations("node-00000") == {created["metadata"]["uid"]: HIGH}
    retry_all(again)
    assert state.counters["victims"] == 0 and not pods_by_name(again)["high"]["spec"].get("nodeName")
    clock[0] += 31
    again.cluster.list_pods()
    settle_fully(again)
    pods = pods_by_name(again)
    assert pods["high"]["spec"].get("nodeName") == "node-00000"
    assert len(pods) == 3  # the two pods that were not victims are kept
    assert state.counters["victims"] == 0


def test_a_pod_disruption_budget_steers_the_preemption_to_the_unprotected_node(ledger):
    world = World(ledger, n_nodes=2, shards=2)
    world.cluster.create_pods(low_pods(4, prefix="db", cpu="2"))  # two per node
    world.settle()
    on = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in world.cluster.list_pods()[0]}
    guarded = on["db-0"]
    world.cluster.create_pdb({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                              "metadata": {"name": "db", "namespace": "default"},
                              "spec": {"minAvailable": 4, "selector": {"matchLabels": {"app": "db"}}}})
    # the budget covers every db pod: both nodes violate it equally; a second set without a budget
    world.cluster.delete_pod("default", next(n for n, node in on.items() if node != guarded))
    world.cluster.create_pods(low_pods(1, prefix="free", cpu="2"))
    settle_fully(world)
    assert world.coordinator.state.pdbs  # from the watch
    world.cluster.create_pods([high_pod(cpu="2")])
    settle_fully(world)
    pods = pods_by_name(world)
    assert "free-0" not in pods  # the victim without a budget
    assert sum(1 for n in pods if n.startswith("db-")) == 3
    assert pods["high"]["spec"]["nodeName"] != guarded


def test_negative_priorities_preempt_as_kube_orders_them(ledger):
    world = World(ledger, n_nodes=1, shards=2)
    world.cluster.create_pods(low_pods(4, priority=-10))
    world.settle()
    world.cluster.create_pods([high_pod("zero", priority=0), high_pod("below", priority=-20)])
    settle_fully(world)
    pods = pods_by_name(world)
    assert pods["zero"]["spec"].get("nodeName") == "node-00000"
    assert not pods["below"]["spec"].get("nodeName")
    assert world.coordinator.state.counters["victims"] == 2


class _NoPriorityAdmission:
    """A cluster without the Priority admission plugin: pod ``gold`` comes with its
    ``priorityClassName`` unresolved (no ``spec.priority``), naming a class that does not exist."""

    def __init__(self, cluster) -> None:
        self._cluster = cluster

    def list_pods(self):
        pods, rv = self._cluster.list_pods()
        for p in pods:
            if p["metadata"]["name"] == "gold":
                p["spec"] = {k: v for k, v in p["spec"].items() if k != "priority"} | {"priorityClassName": "gold"}
        return pods, rv

    def __getattr__(self, name):
        return getattr(self._cluster, name)


def test_an_unknown_priority_class_is_reported_and_the_rest_preempt(ledger):
    world = full_world(ledger)
    world.cluster.create_pods([high_pod("gold"), high_pod()])
    world.coordinator.state.cluster.channel.target = _NoPriorityAdmission(world.cluster)
    world.coordinator.relist()
    settle_fully(world)
    assert ("FailedScheduling", "invalid pod spec: spec.priorityClassName: no PriorityClass with name 'gold' "
            "was found") in reasons(world, "gold")
    pods = pods_by_name(world)
    assert pods["high"]["spec"].get("nodeName") and not pods["gold"]["spec"].get("nodeName")
    assert world.coordinator.status()["invalid"] == 1


class _BadBudgetInList:
    """A cluster whose PDB list also holds a budget with a selector that does not parse (an older
    API server, or an object written around validation)."""

    def __init__(self, cluster) -> None:
        self._cluster = cluster

    def list_pdbs(self):
        pdbs, rv = self._cluster.list_pdbs()
        bad = {"metadata": {"name": "broken", "namespace": "default"},
               "spec": {"selector": {"matchExpressions": [{"key": "app", "operator": "Sideways"}]}},
               "status": {"disruptionsAllowed": 0}}
        return pdbs + [bad], rv

    def __getattr__(self, name):
        return getattr(self._cluster, name)


def test_a_budget_with_a_bad_selector_is_left_out_and_the_others_hold(ledger, caplog):
    world = full_world(ledger)
    world.cluster.create_pdb({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                              "metadata": {"name": "good", "namespace": "default"},
                              "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "low"}}}})
    world.coordinator.state.cluster.channel.target = _BadBudgetInList(world.cluster)
    world.coordinator.relist()
    assert set(world.coordinator.state.pdbs) == {"default/good"}
    assert any("default/broken" in r.getMessage() for r in caplog.records)
    world.cluster.create_pods([high_pod()])
    settle_fully(world)
    # every victim breaks the good budget; kube still preempts (violations are a tie-break, not a ban)
    assert pods_by_name(world)["high"]["spec"].get("nodeName")


class _RacingDeletes:
    """A cluster where each victim is deleted by someone else just before the scheduler's delete
    (404), or deleted and re-created under its name (the uid precondition then fails: 409)."""

    def __init__(self, cluster, recreate: bool) -> None:
        self._cluster = cluster
        self.recreate = recreate

    def delete_pod(self, namespace, name, uid=None, grace_period_s=None):
        stored = self._cluster.get_pod(namespace, name)
        self._cluster.delete_pod(namespace, name)
        if self.recreate:
            again = pod(name, cpu="1").with_priority(LOW)
            again.spec["schedulerName"] = "other-scheduler"  # not ours: it stays pending
            self._cluster.create_pods([again])
        return self._cluster.delete_pod(namespace, name, stored["metadata"]["uid"], grace_period_s)

    def prepare_candidates(self, candidates):  # the batch through this double's delete_pod
        return prepare_candidates(self, candidates)

    def __getattr__(self, name):
        return getattr(self._cluster, name)


@pytest.mark.parametrize("recreate", [False, True], ids=["404", "409"])
def test_a_victim_gone_or_recreated_before_the_delete_counts_as_gone(ledger, recreate):
    world = full_world(ledger)
    world.coordinator.state.cluster.channel.target = _RacingDeletes(world.cluster, recreate)
    world.cluster.create_pods([high_pod()])
    settle_fully(world)
    pods = pods_by_name(world)
    assert pods["high"]["spec"].get("nodeName")
    bound_low = [n for n, p in pods.items() if n.startswith("low-") and p["spec"].get("nodeName")]
    assert len(bound_low) == 6


def test_the_embedded_runtime_preempts_on_a_full_cluster(redis_server, ray_session):
    """End to end on the runtime's actors (the simulated cluster, the coordinator and two shards as
    Ray actors, as `EmbeddedRun` starts them): a high-priority pod on a full cluster is bound after
    two victims are deleted, with the Events and nominatedNodeName in the simulated cluster and the
    coordinator's preemption metrics."""
    from test_runtime import Deployment

    from shardsched.sim import uniform_nodes

    with Deployment(redis_server.url, uniform_nodes(2, cpu="4"), shards=2) as d:
        d.create([plain(p) for p in low_pods(8)])  # the actor cannot import the test's builders
        d.wait_settled()
        [created] = d.ask(d.cluster.create_pods, [plain(high_pod())])
        deadline = time.monotonic() + 30
        while True:
            pods = {p["metadata"]["name"]: p for p in d.ask(d.cluster.list_pods)[0]}
            if pods["high"]["spec"].get("nodeName"):
                break
            assert time.monotonic() < deadline, f"not bound: {d.ask(d.coordinator.status)}"
            time.sleep(0.1)
        node = pods["high"]["spec"]["nodeName"]
        gone = [f"low-{i}" for i in range(8) if f"low-{i}" not in pods]
        victim_events = {name: d.ask(d.cluster.events_for, "default", name) for name in gone}
        high_events = d.ask(d.cluster.events_for, "default", "high")
        status = d.ask(d.coordinator.status)
        samples = {name: fam for name, _, _, fam in d.ask(d.coordinator.metric_samples)}
        inv = d.ask(d.cluster.invariants)
    assert len(gone) == 2 and status["preemptions"] == 1 and status["victims"] == 2
    assert pods["high"]["status"]["nominatedNodeName"] == node
    for name, events in victim_events.items():
        assert [e["message"] for e in events if e["reason"] == "Preempted"] == [
            f"Preempted by pod {created['metadata']['uid']} on node {node}"], name
    assert any(e["reason"] == "FailedScheduling" and e["message"] == "0/2 nodes are available: 2 Insufficient cpu."
               for e in high_events)
    attempts = samples["shardsched_scheduler_preemption_attempts"]
    assert [v for n, _, v in attempts if n.endswith("_total")] == [1.0]
    victims = samples["shardsched_scheduler_preemption_victims"]
    assert [v for n, _, v in victims if n.endswith("_sum")] == [2.0]
    assert inv["overcommitted_nodes"] == [] and inv["double_binds"] == 0


def test_shardsched_run_waits_for_a_preemptor_and_counts_every_pod_once(redis_server, ray_session):
    """`EmbeddedRun` (what ``shardsched run`` runs): eight low-priority pods fill two nodes, a
    high-priority pod arrives a second later; the run ends only once the preemptor is bound (not
    while it waits for its victims), with the victims counted among the pods bound then deleted."""
    from test_runtime import CONFIG, assert_counted_once, assert_invariants

    from shardsched.sharding.embedded import EmbeddedRun
    from shardsched.sharding.run_control import RunOptions
    from shardsched.sim import uniform_nodes

    workload = [(0.0, None, plain(p)) for p in low_pods(8)] + [(1.0, None, plain(high_pod()))]
    report = EmbeddedRun(CONFIG, uniform_nodes(2, cpu="4"), workload,
                         RunOptions(redis_url=redis_server.url, shards=2, timeout_s=60.0)).run()
    data = report.to_json()
    assert_invariants(data)
    assert_counted_once(data)
    assert data["pods_bound"] == 9 and data["pods_unschedulable"] == 0 and data["pods_pending"] == 0


@pytest.mark.parametrize("priority, counted", [(HIGH - 1, True), (HIGH, True), (HIGH + 1, False)],
                         ids=["lower-pod", "equal-pod", "higher-pod"])
def test_a_shards_nominated_pods_count_only_for_pods_of_equal_or_lower_priority(priority, counted):
    """`NominatedPods` in a shard's table, as upstream's RunFilterPluginsWithNominatedPods: a
    nomination counts on its node for a pod of equal or lower priority, not for a higher one (for
    which it is taken out until a pod that counts it comes); bound, it stays counted as bound."""
    table = table_of(node("n", cpu="4"))
    nominated = NominatedPods(table)
    preemptor = high_pod("pre", cpu="3").info().nominated("n")
    nominated.add(preemptor)
    assert table.requested_of("n")["cpu"] == 3000
    nominated.for_pod(high_pod("other", cpu="2", priority=priority).info())
    assert table.requested_of("n").get("cpu", 0) == (3000 if counted else 0)
    nominated.for_pod(high_pod("low", cpu="1", priority=LOW).info())
    assert table.requested_of("n")["cpu"] == 3000  # counted again for a pod of lower priority
    nominated.for_pod(high_pod("top", cpu="1", priority=HIGH + 5).info())
    nominated.restore()
    assert table.requested_of("n")["cpu"] == 3000
    nominated.add(preemptor.nominated(""))  # the nomination cleared
    assert table.requested_of("n").get("cpu", 0) == 0 and preemptor.uid not in nominated
    nominated.add(preemptor)
    nominated.forget(preemptor.uid)  # the watch shows it bound: the table's count is the bound pod's now
    assert preemptor.uid not in nominated and table.requested_of("n")["cpu"] == 3000
