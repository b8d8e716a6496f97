"""Coordinator, without Ray: a plain `Coordinator` over a real `SimCluster`, real Redis ledger and
plain `Shard`s, each stepped by the test. The watch is polled by hand, so a test decides which
events arrive together in one poll."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from shardsched.config import load_config
from shardsched.errors import TemporaryError
from shardsched.sharding.calls import ClusterClient, Local, RemoteUnavailable, ShardClient
from shardsched.sharding.coordinator import Coordinator
from shardsched.sharding.shard import Shard, ShardOptions
from shardsched.sim import SimCluster, uniform_nodes, uniform_pods

CONFIG_TEXT = """\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
podInitialBackoffSeconds: 0.01
podMaxBackoffSeconds: 0.05
profiles:
- schedulerName: shardsched
"""
CONFIG = load_config(CONFIG_TEXT)


class World:
    """A coordinator and its shards, all plain objects; shards are stepped by `settle`."""

    def __init__(self, ledger, n_nodes: int = 4, shards: int = 2, config=CONFIG,
                 cluster: SimCluster | None = None) -> None:
        self.config = config
        self.cluster = cluster or SimCluster(seed=0)
        self.cluster.create_nodes(uniform_nodes(n_nodes, cpu="4"))
        self.shards: dict[int, Shard] = {}
        self.coordinator = Coordinator(config, ledger, ClusterClient(Local(self.cluster)), self._new_shard, shards)
        self.ledger = ledger
        self.coordinator.start()

    def _new_shard(self, index: int, member: str) -> ShardClient:
        shard = Shard(index, member, self.config, self.ledger, self.cluster, self.coordinator, ShardOptions(seed=0))
        self.shards[index] = shard
        return ShardClient(Local(shard))

    def create(self, n: int, prefix: str = "pod-") -> list[dict]:
        return self.cluster.create_pods(uniform_pods(n, cpu="1", scheduler_name="shardsched", prefix=prefix))

    def settle(self, timeout_s: float = 10.0, parked_ok: bool = False) -> None:
        """Step the coordinator and the shards until nothing moves and every pending pod is bound
        or known unschedulable (``parked_ok``: and waits among a shard's unschedulable pods)."""
        deadline = time.monotonic() + timeout_s
        while True:
            busy = self.coordinator.step()
            busy = sum(s.step() for s in self.shards.values()) > 0 or busy
            status = self.coordinator.status()
            if not busy and status["pending"] == status["unschedulable"] and (parked_ok or not self.in_shards()):
                return
            assert time.monotonic() < deadline, f"not settled: {status}"
            time.sleep(0.005)

    def in_shards(self) -> set[str]:
        return {k for s in self.shards.values() for k in s.pending_keys()}


def test_a_pod_created_and_deleted_between_two_polls_is_not_tracked(ledger):
    """ADDED and DELETED of one pod arrive in the same poll: the pod must not be routed after its
    deletion (it would stay pending for ever, and the run would never settle)."""
    world = World(ledger)
    world.create(3)
    world.cluster.delete_pod("default", "pod-00001")

    world.coordinator.poll_watch()

    assert sorted(world.coordinator.pending_keys()) == ["default/pod-00000", "default/pod-00002"]
    assert world.in_shards() == {"default/pod-00000", "default/pod-00002"}
    world.settle()
    assert world.coordinator.status()["pending"] == 0
    assert world.cluster.invariants()["pods_bound"] == 2


def test_a_pod_created_and_bound_by_someone_else_between_two_polls_is_not_routed(ledger):
    world = World(ledger)
    world.create(2)
    world.cluster.bind("default", "pod-00000", "node-00000")

    world.coordinator.poll_watch()

    assert world.coordinator.pending_keys() == ["default/pod-00001"]
    assert world.in_shards() == {"default/pod-00001"}
    assert world.ledger.node_usage("node-00000").used["cpu"] == 1000  # observed
    world.settle()
    inv = world.cluster.invariants()
    assert inv["pods_bound"] == 2 and inv["bind_conflicts"] == 0


class ConditionCountingCluster(SimCluster):
    """The simulated cluster, counting the condition writes it receives per (pod, reason)."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.condition_writes: Counter = Counter()

    def set_pod_condition(self, namespace, name, condition, resource_version=None):
        self.condition_writes[(name, condition.get("reason"))] += 1
        return super().set_pod_condition(namespace, name, condition, resource_version)


def test_a_gated_pod_waits_outside_the_queues_until_its_last_gate_is_removed(ledger):
    """SchedulingGates' PreEnqueue: the gated pod is not routed (no attempt, no FailedScheduling),
    it gets PodScheduled=False, reason SchedulingGated, once (not at its later updates), and is
    routed and bound when an update removes its last gate."""
    world = World(ledger, cluster=ConditionCountingCluster())
    gated, free = uniform_pods(2, cpu="1", scheduler_name="shardsched")
    gated["spec"]["schedulingGates"] = [{"name": "a"}, {"name": "b"}]
    world.cluster.create_pods([gated, free])
    world.settle()
    gauge = world.coordinator.state.metrics.pending_pods.labels("gated")

    status = world.coordinator.status()
    assert (status["gated"], status["pending"], status["unschedulable"]) == (1, 0, 0)
    assert world.in_shards() == set() and gauge._value.get() == 1
    assert world.cluster.invariants()["pods_unbound"] == ["default/pod-00000"]
    [cond] = world.cluster.get_pod("default", "pod-00000")["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("PodScheduled", "False", "SchedulingGated")

    world.cluster.remove_scheduling_gates("default", "pod-00000", ["a"])  # one gate left
    world.settle()
    assert world.coordinator.status()["gated"] == 1
    assert world.cluster.condition_writes == {("pod-00000", "SchedulingGated"): 1}

    world.cluster.remove_scheduling_gates("default", "pod-00000")
    world.settle()
    assert world.cluster.get_pod("default", "pod-00000")["spec"].get("nodeName")
    assert world.coordinator.status()["gated"] == 0 and gauge._value.get() == 0
    assert not [e for e in world.cluster.events_for("default", "pod-00000") if e["reason"] == "FailedScheduling"]


@pytest.mark.parametrize("bound_first", [True, False], ids=["watch-first", "handoff-first"])
def test_a_bind_rejected_because_someone_else_bound_the_pod_ends_with_it(ledger, bound_first):
    """A shard's bind answers 409 (another scheduler bound the pod first); whether the watch or the
    shard's hand-off reaches the coordinator first, the pod ends bound once and tracked nowhere."""
    world = World(ledger, n_nodes=2, shards=1)
    world.create(1)
    world.coordinator.poll_watch()  # routed
    world.cluster.bind("default", "pod-00000", "node-00001")
    if bound_first:
        world.coordinator.poll_watch()
    [shard] = world.shards.values()
    shard.step()

    world.settle()

    assert world.coordinator.status()["pending"] == 0 and not world.in_shards()
    assert world.cluster.invariants()["binds"] == 1
    assert world.ledger.node_usage("node-00001").used["cpu"] == 1000 and not world.ledger.node_usage("node-00000").used


def test_a_pod_the_admission_rejects_at_bind_stops_counting_in_the_ledger_and_the_shard(ledger):
    """A scheduler that bypasses the ledger takes a node's room between the shard's Reserve and its
    bind: the shard's pod is bound but the kubelet rejects it (Failed, OutOfcpu), which the watch
    shows in the same event as the binding. The shard had committed it; once the watch says it is
    terminal, neither the ledger nor the shard's table may count it (they would drift for ever)."""
    world = World(ledger, n_nodes=1, shards=1)
    world.create(4)
    world.coordinator.poll_watch()  # routed; the shard's view: 4 CPUs free
    world.cluster.create_pods([{**uniform_pods(1, cpu="1", scheduler_name="rival", prefix="rival-")[0],
                                "spec": {**uniform_pods(1, cpu="1", scheduler_name="rival")[0]["spec"],
                                         "nodeName": "node-00000"}}])  # bypass: bound at creation
    [shard] = world.shards.values()
    shard.step()  # reserves 4 (the ledger does not know the rival's pod yet), binds 4: 1 rejected

    world.settle()

    inv = world.cluster.invariants()
    assert inv["admission_rejections"] == 1 and inv["overcommitted_nodes"] == []
    truth = world.cluster.requested("node-00000")
    assert truth["cpu"] == 4000 and truth["pods"] == 4
    assert ledger.node_usage("node-00000").used == truth
    assert shard.table.requested_of("node-00000")["cpu"] == 4000


class FlakyLedger:
    """A real `Ledger` whose watch-side writes fail while ``down`` (Redis unreachable from the
    coordinator only, as in a network partition)."""

    def __init__(self, ledger) -> None:
        self._ledger = ledger
        self.down = False

    def _maybe_fail(self, name):
        def call(*args, **kwargs):
            if self.down:
                raise TemporaryError(f"ledger {name}: Redis unavailable (test)")
            return getattr(self._ledger, name)(*args, **kwargs)
        return call

    def __getattr__(self, name):
        if name in ("observe", "forget", "upsert_nodes", "remove_nodes"):
            return self._maybe_fail(name)
        return getattr(self._ledger, name)


def test_what_the_watch_shows_while_redis_is_away_reaches_the_ledger_later(ledger):
    """Pods deleted and bound while the coordinator cannot reach Redis: the ledger's forget and
    observe are owed, not dropped, and written once Redis answers (else the ledger would count the
    deleted pods for ever and refuse room the cluster has)."""
    flaky = FlakyLedger(ledger)
    world = World(flaky, n_nodes=2)
    world.create(4)
    world.settle()
    flaky.down = True
    world.cluster.delete_pod("default", "pod-00000")
    world.cluster.delete_pod("default", "pod-00001")
    world.cluster.create_pods(uniform_pods(1, cpu="1", scheduler_name="rival", prefix="rival-"))
    world.cluster.bind("default", "rival-00000", "node-00000")  # another scheduler's pod
    world.coordinator.poll_watch()  # forget and observe fail: owed
    flaky.down = False

    world.coordinator.ledger_sync.check()

    for name in ("node-00000", "node-00001"):
        assert ledger.node_usage(name).used == world.cluster.requested(name), name


def test_a_hung_shard_does_not_hold_up_the_control_loop(ledger):
    """A shard whose health ping hangs (a frozen process: the ping waits out its timeout) must not
    stall the watch and the routing: the coordinator's loop runs on while its health thread waits."""
    world = World(ledger, n_nodes=4, shards=2)
    world.coordinator.health.period_s = 0.05
    hang = threading.Event()
    frozen = world.shards[1]
    frozen.ping = lambda: hang.wait(10) and frozen.member  # answers only once released
    loops = [threading.Thread(target=world.coordinator.run_forever, daemon=True)]
    loops += [threading.Thread(target=s.run_forever, daemon=True) for s in world.shards.values()]
    for t in loops:
        t.start()
    try:
        time.sleep(0.2)  # the health thread is now stuck in the frozen shard's ping
        started = time.monotonic()
        world.create(6)
        while world.cluster.invariants()["pods_unbound"] and time.monotonic() - started < 5:
            time.sleep(0.01)
        waited = time.monotonic() - started
    finally:
        hang.set()
        world.coordinator.stop()
        for s in world.shards.values():
            s.stop()
        for t in loops:
            t.join(5)

    assert not world.cluster.invariants()["pods_unbound"]
    assert waited < 2.0


def test_the_relist_hook_runs_once_the_cluster_is_loaded_at_start_and_after_410(ledger):
    """`Coordinator.on_relist` (the hosts freeze the loaded cluster out of the collector there)
    runs after the first list and after a relist, with the listed pods already tracked."""
    cluster = SimCluster(seed=0)
    cluster.create_nodes(uniform_nodes(4, cpu="4"))
    cluster.create_pods(uniform_pods(5, cpu="1", scheduler_name="shardsched"))
    shards: dict[int, Shard] = {}

    def new_shard(index: int, member: str) -> ShardClient:
        shards[index] = Shard(index, member, CONFIG, ledger, cluster, coordinator, ShardOptions(seed=0))
        return ShardClient(Local(shards[index]))

    coordinator = Coordinator(CONFIG, ledger, ClusterClient(Local(cluster)), new_shard, 2)
    seen: list[int] = []
    coordinator.on_relist = lambda: seen.append(len(coordinator.state.pending))
    coordinator.start()
    assert seen == [5]
    cluster.create_pods(uniform_pods(2, cpu="1", scheduler_name="shardsched", prefix="late-"))
    coordinator.state.rv = 10**9  # a resourceVersion the cluster never gave: 410 Gone, relist
    assert coordinator.poll_watch()
    assert seen == [5, 7]


def test_a_relist_keeps_the_owners_drops_nodes_gone_and_places_new_ones_by_load(ledger):
    """After 410 Gone the coordinator lists again. Nodes still there keep their shard (no
    handover for them), a node deleted meanwhile leaves its shard and the ledger, and a node
    created meanwhile goes to a shard below its share (the map stays balanced)."""
    world = World(ledger, n_nodes=6, shards=2)
    before = dict(world.coordinator.state.owners)
    assert sorted(Counter(before.values()).values()) == [3, 3]
    gone = sorted(before)[0]
    world.cluster.delete_node(gone)
    world.cluster.create_nodes(uniform_nodes(1, cpu="4", prefix="late-"))
    world.coordinator.state.rv = 10**9  # a resourceVersion the cluster never gave: 410 Gone, relist
    assert world.coordinator.poll_watch()

    after = world.coordinator.state.owners
    assert {n: after[n] for n in before if n != gone} == {n: i for n, i in before.items() if n != gone}
    (late,) = set(after) - set(before)
    assert after[late] == before[gone]  # the shard that lost a node is the one below its share
    owner = world.shards[before[gone]]
    assert gone not in owner.table.index and late in owner.table.index
    assert gone not in ledger.owners() and ledger.owners()[late] == owner.member


def test_a_node_deleted_and_created_again_in_one_poll_stays_with_its_shard(ledger):
    """Both events arrive in one poll of the watch: the node is still there, so its shard and the
    ledger keep it and every pod that fits is bound (before, the removal was applied after the
    re-add, and the node was lost to its shard and the ledger)."""
    world = World(ledger, n_nodes=6, shards=2)
    owner = world.coordinator.state.owners["node-00000"]
    world.cluster.delete_node("node-00000")
    world.cluster.create_nodes(uniform_nodes(1, cpu="4"))
    world.coordinator.poll_watch()

    assert world.coordinator.state.owners["node-00000"] == owner
    assert "node-00000" in world.shards[owner].table.index
    assert ledger.owners()["node-00000"] == world.shards[owner].member
    world.create(24)  # 6 nodes x 4 cpu
    world.settle()
    assert world.cluster.invariants()["pods_bound"] == 24


def test_a_node_created_and_deleted_in_one_poll_is_never_owned(ledger):
    world = World(ledger, n_nodes=6, shards=2)
    world.cluster.create_nodes(uniform_nodes(1, cpu="4", prefix="brief-"))
    world.cluster.delete_node("brief-00000")
    world.coordinator.poll_watch()

    assert "brief-00000" not in world.coordinator.state.owners and "brief-00000" not in ledger.owners()
    assert all("brief-00000" not in s.table.index for s in world.shards.values())
    assert sorted(Counter(world.coordinator.state.owners.values()).values()) == [3, 3]
    world.create(24)
    world.settle()
    assert world.cluster.invariants()["pods_bound"] == 24


def test_start_returns_once_every_shard_answers_and_before_it_hands_them_work(ledger):
    """`Coordinator.start` pings each new shard (a Ray actor's process takes a second or more to
    start) before it lists the cluster and hands out nodes and pods: when start returns the shards
    are up, so ``serve --bench`` does not time their start-up as scheduling, and a shard that
    cannot start fails the start instead of being handed work."""
    cluster = SimCluster(seed=0)
    cluster.create_nodes(uniform_nodes(4, cpu="4"))
    cluster.create_pods(uniform_pods(3, cpu="1", scheduler_name="shardsched"))
    calls: list[tuple[int, str]] = []

    class Recording(Shard):
        def ping(self) -> str:
            calls.append((self.index, "ping"))
            return super().ping()

        def apply_nodes(self, upserts, removals) -> None:
            calls.append((self.index, "apply_nodes"))
            super().apply_nodes(upserts, removals)

    def new_shard(index: int, member: str) -> ShardClient:
        return ShardClient(Local(Recording(index, member, CONFIG, ledger, cluster, coordinator, ShardOptions(seed=0))))

    coordinator = Coordinator(CONFIG, ledger, ClusterClient(Local(cluster)), new_shard, 2)
    coordinator.start()
    assert calls[:2] == [(0, "ping"), (1, "ping")] and (0, "apply_nodes") in calls[2:]

    def broken(index: int, member: str) -> ShardClient:
        shard = Recording(index, member, CONFIG, ledger, cluster, coordinator, ShardOptions(seed=0))
        if index == 1:
            def dead() -> str:
                raise RemoteUnavailable("ping: the actor died")
            shard.ping = dead
        return ShardClient(Local(shard))

    calls.clear()
    coordinator = Coordinator(CONFIG, ledger, ClusterClient(Local(cluster)), broken, 2)
    with pytest.raises(RemoteUnavailable):
        coordinator.start()
    assert (0, "apply_nodes") not in calls  # nothing handed out


def test_pods_created_one_at_a_time_spread_over_every_shards_nodes(ledger):
    """Pods that arrive one at a time (each bound before the next comes) are routed to the shard
    with the most free room, not always to the first: they spread over all the nodes as
    kube-scheduler's LeastAllocated spreads them, instead of piling onto one shard's half."""
    world = World(ledger, n_nodes=6, shards=2)
    owners = world.coordinator.state.owners
    assert set(owners.values()) == {0, 1}, owners
    for i in range(12):
        world.create(1, prefix=f"one-{i}-")
        world.coordinator.poll_watch()
        world.settle()
    per_node = {name: 0 for name in owners}
    for p in world.cluster.list_pods()[0]:
        per_node[p["spec"]["nodeName"]] += 1
    assert sorted(per_node.values()) == [2] * 6, per_node


#: NodeResourcesFit packing (MostAllocated), as pluginConfig of a profile
PACKING_ARGS = ("  pluginConfig:\n  - name: NodeResourcesFit\n    args:\n      scoringStrategy:\n"
                "        type: MostAllocated\n")
PACKING = load_config(CONFIG_TEXT + PACKING_ARGS)


def _pods_per_node(world: World) -> list[int]:
    per_node = {name: 0 for name in world.coordinator.state.owners}
    for p in world.cluster.list_pods()[0]:
        per_node[p["spec"]["nodeName"]] += 1
    return sorted(per_node.values())


@pytest.mark.parametrize("arrival", ["one at a time", "burst"])
def test_a_packing_profile_fills_nodes_across_shards_in_kube_schedulers_order(ledger, arrival):
    """With MostAllocated, kube-scheduler fills the fullest node with room first, over the whole
    cluster. Routing by free room (the spreading rule) split the pods over both shards, and each
    shard packed its own half: 12 one-cpu pods on six 4-cpu nodes ended as 4, 4, 2, 2 (a burst)
    or 4, 4, 3, 1 (one at a time) instead of three full nodes. The coordinator now routes such a profile's pods to
    the shard holding the fullest node with room, for a burst as for pods arriving one at a time."""
    world = World(ledger, n_nodes=6, shards=2, config=PACKING)
    assert set(world.coordinator.state.owners.values()) == {0, 1}
    if arrival == "burst":
        world.create(12, prefix="pack-")
        world.coordinator.poll_watch()
        world.settle()
    else:
        for i in range(12):
            world.create(1, prefix=f"pack-{i}-")
            world.coordinator.poll_watch()
            world.settle()
    assert _pods_per_node(world) == [0, 0, 0, 4, 4, 4]


def test_which_profiles_pack():
    """`Framework.packs`: MostAllocated, and RequestedToCapacityRatio whose shape rises with utilization
    (kube's bin-packing example); not the default LeastAllocated nor a falling shape."""
    from shardsched.scheduler.algorithm import build_schedulers
    from shardsched.cache.node_table import NodeTable

    def packs(args: str) -> bool:
        config = load_config("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
                             "profiles:\n- schedulerName: p\n" + args)
        return build_schedulers(config, NodeTable(), seed=0)["p"].framework.packs

    rtcr = ("  pluginConfig:\n  - name: NodeResourcesFit\n    args:\n      scoringStrategy:\n"
            "        type: RequestedToCapacityRatio\n        requestedToCapacityRatio:\n          shape:\n"
            "          - {utilization: 0, score: %d}\n          - {utilization: 100, score: %d}\n")
    assert not packs("")
    assert packs(PACKING_ARGS)
    assert packs(rtcr % (0, 10))
    assert not packs(rtcr % (10, 0))
    assert not packs(PACKING_ARGS + "  plugins:\n    score:\n      disabled:\n      - name: NodeResourcesFit\n")


# ------------------------------------------------------------------ constraints across shards
ZONE = "topology.kubernetes.io/zone"


def zoned_world(ledger, zones: int = 3, per_zone: int = 2, shards: int = 2) -> World:
    """Nodes ``node-<zone><i>`` in zones z0.. (so each zone's nodes fall to both shards, by hashing)."""
    cluster = SimCluster(seed=0)
    nodes = uniform_nodes(zones * per_zone, cpu="8")
    for i, n in enumerate(nodes):
        n["metadata"]["labels"][ZONE] = f"z{i % zones}"
    cluster.create_nodes(nodes)
    return World(ledger, n_nodes=0, shards=shards, cluster=cluster)


def constrained_pods(n: int, prefix: str, **spec) -> list[dict]:
    pods = uniform_pods(n, cpu="1", scheduler_name="shardsched", prefix=prefix)
    for p in pods:
        p["metadata"]["labels"] = {"app": prefix}
        p["spec"].update(spec)
    return pods


def zones_of(world: World, prefix: str) -> Counter:
    pods, _ = world.cluster.list_pods()
    nodes = {n["metadata"]["name"]: n for n in world.cluster.list_nodes()[0]}
    return Counter(nodes[p["spec"]["nodeName"]]["metadata"]["labels"][ZONE] for p in pods
                   if p["metadata"]["name"].startswith(prefix) and p["spec"].get("nodeName"))


def test_zone_spread_across_shards_is_kept_through_nominated_nodes(ledger):
    """A DoNotSchedule zone spread (maxSkew 1) whose zones span both shards: no shard can know the
    global minimum, so the coordinator nominates each pod's node over the whole cluster, counting the
    pods it nominated before (kube's assume); 9 pods end 3/3/3, all bound, none refused."""
    world = zoned_world(ledger)
    assert {len(s.table.index) for s in world.shards.values()} == {3}
    spread = [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
               "labelSelector": {"matchLabels": {"app": "web"}}}]
    world.cluster.create_pods(constrained_pods(9, "web", topologySpreadConstraints=spread))
    world.settle()
    assert zones_of(world, "web") == {"z0": 3, "z1": 3, "z2": 3}
    assert world.coordinator.state.counters["nominated"] >= 9
    assert world.coordinator.state.nominated == {}  # every assume gave way to the binding
    inv = world.cluster.invariants()
    assert inv["pods_bound"] == 9 and inv["bind_conflicts"] == 0


def test_zone_affinity_and_anti_affinity_across_shards(ledger):
    """Required affinity to a pod in zone z1 places every follower in z1 (on nodes of both shards);
    required zone anti-affinity places one replica per zone and reports the fourth unschedulable
    with kube's message over the whole cluster."""
    world = zoned_world(ledger)
    [db] = constrained_pods(1, "db")
    world.cluster.create_pods([db])
    world.settle()
    db_zone = next(iter(zones_of(world, "db")))
    affinity = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": ZONE}]}}
    world.cluster.create_pods(constrained_pods(4, "follower", affinity=affinity))
    anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "solo"}}, "topologyKey": ZONE}]}}
    world.cluster.create_pods(constrained_pods(4, "solo", affinity=anti))
    world.settle(parked_ok=True)
    assert zones_of(world, "follower") == {db_zone: 4}
    assert sorted(zones_of(world, "solo").values()) == [1, 1, 1]
    assert world.coordinator.unschedulable_reasons() == {
        "0/6 nodes are available: 6 node(s) didn't match pod anti-affinity rules. preemption: 0/6 nodes are "
        "available: 6 No preemption victims found for incoming pod..": 1}


def test_a_nominated_node_that_no_longer_fits_is_replaced(ledger):
    """The nominated node is cordoned before the shard's attempt: the shard hands the pod back, the
    coordinator nominates another node over the whole cluster, and the pod binds there."""
    world = zoned_world(ledger)
    spread = [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
               "labelSelector": {"matchLabels": {"app": "web"}}}]
    world.cluster.create_pods(constrained_pods(1, "web", topologySpreadConstraints=spread))
    world.coordinator.poll_watch()
    [(uid, first)] = world.coordinator.state.nominated.items()
    world.cluster.cordon(first)
    world.settle()
    [pod] = [p for p in world.cluster.list_pods()[0] if p["metadata"]["uid"] == uid]
    assert pod["spec"]["nodeName"] not in ("", None, first)


def test_the_ledger_rebuild_does_not_count_nominated_pods(ledger):
    """A nominated pod is assumed in the coordinator's table until bound; rebuilding the ledger from
    that table must count only bound pods (the assume is no usage)."""
    world = zoned_world(ledger)
    spread = [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
               "labelSelector": {"matchLabels": {"app": "web"}}}]
    world.cluster.create_pods(constrained_pods(1, "web", topologySpreadConstraints=spread))
    world.coordinator.poll_watch()
    [node] = world.coordinator.state.nominated.values()
    assert world.coordinator.state.table.requested_of(node).get("cpu") == 1000  # assumed for the next decision
    world.coordinator.ledger_sync.rebuild()
    assert world.ledger.node_usage(node).used.get("cpu", 0) == 0


# ------------------------------------------------------------------------ namespaces' labels
HOST = "kubernetes.io/hostname"


def guarded_world(ledger) -> World:
    """Four nodes over two shards, each holding a ``guard`` pod (app=guard) of namespace ``team-a``
    (labelled team=a), bound by someone else."""
    world = World(ledger, n_nodes=4)
    world.cluster.create_namespace({"metadata": {"name": "team-a", "labels": {"team": "a"}}})
    names = sorted(n["metadata"]["name"] for n in world.cluster.list_nodes()[0])
    guards = uniform_pods(len(names), cpu="100m", scheduler_name="default-scheduler", prefix="guard-")
    for g, name in zip(guards, names):
        g["metadata"].update(namespace="team-a", labels={"app": "guard"})
        g["spec"]["nodeName"] = name
    world.cluster.create_pods(guards)
    world.settle()
    return world


def shy_pods(n: int) -> list[dict]:
    """Pods required to keep off any node holding an app=guard pod of a namespace labelled team=a."""
    anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "guard"}}, "topologyKey": HOST,
         "namespaceSelector": {"matchLabels": {"team": "a"}}}]}}
    return constrained_pods(n, "shy", affinity=anti)


def test_a_namespace_selector_sees_the_watched_namespaces_labels_in_every_shard(ledger):
    """The shards decide hostname anti-affinity themselves, so each needs the namespaces' labels:
    with team-a labelled team=a every node holds a selected guard and the pods stay unschedulable;
    once team-a is relabelled, the watch's update reaches the shards, moves the pods out of the
    unschedulable pods (no 5-minute wait) and they bind."""
    world = guarded_world(ledger)
    assert {len(s.table.index) for s in world.shards.values()} == {2}
    assert all(s.table.labels_of_namespace("team-a")["team"] == "a" for s in world.shards.values())
    world.cluster.create_pods(shy_pods(3))
    world.settle(parked_ok=True)
    assert not bound_per_node(world, "shy")
    assert world.coordinator.status()["unschedulable"] == 3
    world.cluster.update_namespace({"metadata": {"name": "team-a", "labels": {"team": "retired"}}})
    world.settle(timeout_s=20)
    assert sum(bound_per_node(world, "shy").values()) == 3
    assert all(s.table.labels_of_namespace("team-a")["team"] == "retired" for s in world.shards.values())


def test_a_new_shard_incarnation_and_a_relist_get_the_namespaces(ledger):
    """A shard replaced after a crash, and every shard after a relist (410 Gone), start from the
    coordinator's namespaces, so their first decisions already see team=a; a namespace deleted
    while the watch was away is gone after the relist."""
    world = guarded_world(ledger)
    world.coordinator.replace_shard(0)
    assert world.shards[0].table.labels_of_namespace("team-a")["team"] == "a"
    world.cluster.create_pods(shy_pods(2))
    world.settle(parked_ok=True)
    assert not bound_per_node(world, "shy")
    world.cluster.create_namespace({"metadata": {"name": "team-b", "labels": {"team": "b"}}})
    world.cluster.delete_namespace("team-a")  # and its guards
    world.coordinator.relist()  # before any poll: the relist alone must bring both changes
    assert all(s.table.namespace_labels.keys() == {"team-b"} for s in world.shards.values())
    assert world.coordinator.state.table.labels_of_namespace("team-b")["team"] == "b"
    world.settle()
    assert sum(bound_per_node(world, "shy").values()) == 2


def bound_per_node(world: World, prefix: str) -> Counter:
    """Bound pods named ``prefix*`` per node."""
    return Counter(p["spec"]["nodeName"] for p in world.cluster.list_pods()[0]
                   if p["metadata"]["name"].startswith(prefix) and p["spec"].get("nodeName"))


def test_the_plain_coordinator_and_shard_import_without_ray():
    """Only the actor layer imports ray: a process where ``import ray`` fails still imports the
    coordinator, the shard and their typed clients (the product and these tests use them so)."""
    code = ("import sys, importlib.abc\n"
            "class NoRay(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.split('.')[0] == 'ray':\n"
            "            raise ImportError('no ray here')\n"
            "sys.meta_path.insert(0, NoRay())\n"
            "import shardsched.sharding.coordinator, shardsched.sharding.shard, shardsched.sharding.calls\n"
            "print('ray' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=os.environ)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


# ------------------------------------------------------------------------------------------ volumes

def storage_class(name: str, mode: str = "Immediate") -> dict:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
            "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": mode}


def volume(name: str, claim: str | None = None, *, labels: dict | None = None, node: str | None = None,
           modes: tuple[str, ...] = ("ReadWriteOnce",), klass: str = "manual") -> dict:
    """A 10Gi PersistentVolume, pre-bound to ``claim`` (the PV controller binds it), with ``labels``
    and a node affinity to the hostname ``node``."""
    spec: dict = {"capacity": {"storage": "10Gi"}, "accessModes": list(modes), "storageClassName": klass,
                  "hostPath": {"path": f"/data/{name}"}}
    if claim:
        spec["claimRef"] = {"namespace": "default", "name": claim}
    if node:
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name, "labels": labels or {}},
            "spec": spec}


def claim(name: str, klass: str = "manual", size: str = "1Gi", modes: tuple[str, ...] = ("ReadWriteOnce",)) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": "default"},
            "spec": {"storageClassName": klass, "accessModes": list(modes),
                     "resources": {"requests": {"storage": size}}}}


def claiming(prefix: str, claim_name: str, n: int = 1) -> list[dict]:
    pods = uniform_pods(n, cpu="1", scheduler_name="shardsched", prefix=prefix)
    for p in pods:
        p["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}]
    return pods


def node_of(world: World, name: str) -> str | None:
    return world.cluster.get_pod("default", name)["spec"].get("nodeName")


def test_the_shards_check_claims_with_kube_s_volume_rules(ledger):
    """The coordinator lists the storage objects and every shard gets them: a pod whose claim is
    bound to a PV labelled zone z1 lands in z1 (VolumeZone), one whose PV's node affinity names a
    node lands there (VolumeBinding), on nodes of both shards; a ReadWriteOncePod claim binds on the
    node the coordinator nominates; WaitForFirstConsumer claims take the local PVs, one each, on
    their nodes, written through PreBind; an unbound Immediate claim, and a WaitForFirstConsumer
    one left without a PV, are refused with kube's words."""
    world = zoned_world(ledger)
    for obj in (storage_class("manual"), storage_class("local", "WaitForFirstConsumer"),
                volume("pv-zoned", "zoned", labels={ZONE: "z1"}), volume("pv-pinned", "pinned", node="node-00004"),
                volume("pv-once", "once", modes=("ReadWriteOncePod",)),
                *(volume(f"pv-local-{i}", node=f"node-{i:05d}", klass="local") for i in (0, 1, 5)),
                claim("zoned"), claim("pinned"), claim("once", modes=("ReadWriteOncePod",)),
                claim("immediate", size="100Gi"), *(claim(f"local-{i}", klass="local") for i in range(4))):
        world.cluster.create_volume_object(obj)
    assert world.cluster.claim_bound("default", "zoned") and not world.cluster.claim_bound("default", "immediate")
    world.coordinator.poll_watch()
    assert all(s.table.volumes is not None and "default/zoned" in s.table.volumes.pvcs for s in world.shards.values())
    world.cluster.create_pods(claiming("zoned-", "zoned", 3) + claiming("pinned-", "pinned") + claiming(
        "immediate-", "immediate") + claiming("once-", "once") + [
        p for i in range(4) for p in claiming(f"local{i}-", f"local-{i}")])
    world.settle(parked_ok=True)

    assert zones_of(world, "zoned-") == {"z1": 3}
    assert {world.coordinator.state.owners[node_of(world, f"zoned-{i:05d}")] for i in range(3)} == {0, 1}
    assert node_of(world, "pinned-00000") == "node-00004"
    assert node_of(world, "once-00000")
    local = {i: node_of(world, f"local{i}-00000") for i in range(4)}
    assert sorted(n for n in local.values() if n) == ["node-00000", "node-00001", "node-00005"]
    for i, node in local.items():
        if node:
            pv = world.cluster.get_volume_object("PersistentVolumeClaim", f"local-{i}", "default")["spec"]["volumeName"]
            assert pv == f"pv-local-{int(node[-1])}"
    fail = " preemption: 0/6 nodes are available: 6 Preemption is not helpful for scheduling.."
    assert world.coordinator.unschedulable_reasons() == {
        "0/6 nodes are available: pod has unbound immediate PersistentVolumeClaims." + fail: 1,
        "0/6 nodes are available: 6 node(s) didn't find available persistent volumes to bind." + fail: 1}


def test_a_claim_bound_after_its_pod_came_lets_the_pod_bind(ledger):
    """A pod whose claim does not exist yet is refused with kube's words; the claim and its PV
    created later reach the shards through the watch, which move the pod back to the queue: it
    binds on the PV's node. A shard replaced meanwhile, a shard a scale step adds and a relist
    keep the storage objects."""
    world = zoned_world(ledger)
    world.cluster.create_volume_object(storage_class("manual"))
    world.cluster.create_pods(claiming("late-", "late"))
    world.settle(parked_ok=True)
    fail = " preemption: 0/6 nodes are available: 6 Preemption is not helpful for scheduling.."
    assert world.coordinator.unschedulable_reasons() == {
        '0/6 nodes are available: persistentvolumeclaim "late" not found.' + fail: 1}
    world.cluster.create_volume_object(volume("pv-late", "late", node="node-00003"))
    world.cluster.create_volume_object(claim("late"))
    world.coordinator.replace_shard(world.coordinator.state.owners["node-00003"])
    world.settle()
    assert node_of(world, "late-00000") == "node-00003"
    world.coordinator.scale(3)
    assert "pv-late" in world.shards[2].table.volumes.pvs
    world.coordinator.relist()
    assert len(world.shards) == 3 and all("pv-late" in s.table.volumes.pvs for s in world.shards.values())


# ------------------------------------------------------------------ commit reports


class ObserveRecordingLedger:
    """A real `Ledger` that records the uids the coordinator observes."""

    def __init__(self, ledger) -> None:
        self._ledger = ledger
        self.observed: list[str] = []

    def observe(self, pods):
        pods = list(pods)
        self.observed.extend(p.uid for p in pods)
        return self._ledger.observe(pods)

    def __getattr__(self, name):
        return getattr(self._ledger, name)


def cpu_used(ledger, cluster: SimCluster) -> int:
    return sum(ledger.node_usage(n["metadata"]["name"]).used.get("cpu", 0) for n in cluster.list_nodes()[0])


def test_pods_their_shard_reported_committed_are_counted_but_not_observed_again(ledger):
    """The shard's report that it committed its batch comes before the watch shows the pods bound
    (as in a burst, where the coordinator's watch lags): the coordinator counts them in its table
    and sends them to the shard as any bound pod, but writes nothing to the ledger for them."""
    recording = ObserveRecordingLedger(ledger)
    world = World(recording, n_nodes=2, shards=1)
    world.create(3)
    world.coordinator.poll_watch()  # routed
    [shard] = world.shards.values()
    shard.step()  # bound, committed, reported

    world.coordinator.poll_watch()

    uids = {p["metadata"]["uid"] for p in world.cluster.list_pods()[0]}
    assert recording.observed == []
    assert world.coordinator.status()["bound_seen"] == 3 and world.coordinator.state.commits == {}
    assert set(world.coordinator.state.table.pod_slot) == uids == set(shard.table.pod_slot)
    assert cpu_used(ledger, world.cluster) == 3000


def test_a_commit_reported_before_the_ledger_was_rebuilt_is_observed_again(ledger):
    """Redis restarted and lost the shard's commit (appendonly fsyncs once a second), and the
    coordinator rebuilt the ledger from its table before its watch showed the pod bound: the
    rebuild's new epoch drops the report, so the watch's bound event is observed and the ledger
    counts the pod again (a report kept across the rebuild left it uncounted for good)."""
    recording = ObserveRecordingLedger(ledger)
    world = World(recording, n_nodes=1, shards=1)
    [created] = world.create(1)
    world.coordinator.poll_watch()  # routed
    [shard] = world.shards.values()
    shard.step()  # bound, committed, reported under the current epoch
    epoch = world.coordinator.state.epoch
    with world.coordinator.state.lock:
        world.coordinator.ledger_sync.rebuild()  # from a table that has not seen the bind yet
    assert world.coordinator.state.epoch == epoch + 1 and cpu_used(ledger, world.cluster) == 0

    world.coordinator.poll_watch()

    assert recording.observed == [created["metadata"]["uid"]]
    assert cpu_used(ledger, world.cluster) == 1000


def test_a_report_that_comes_after_the_watch_showed_the_pod_bound_is_dropped(ledger):
    """A pod the watch shows bound before its shard's report arrives is observed at once (its bind
    looks like another scheduler's); the late report is then dropped, not kept for ever."""
    recording = ObserveRecordingLedger(ledger)
    world = World(recording, n_nodes=1, shards=1)
    held: list[tuple] = []
    world.coordinator.committed = lambda *report: held.append(report)  # the shard's report, delayed
    [first] = world.create(1)
    world.coordinator.poll_watch()
    [shard] = world.shards.values()
    shard.step()
    world.coordinator.poll_watch()
    assert recording.observed == [first["metadata"]["uid"]] and len(held) == 1

    world.coordinator.intake.committed(*held[0])
    world.create(1, prefix="second-")
    world.coordinator.poll_watch()  # the reports are taken with the next pod events

    assert world.coordinator.state.commits == {}
    assert cpu_used(ledger, world.cluster) == 1000


def test_running_loops_bind_pods_on_their_wake_ups_alone_and_stop_at_once(ledger):
    """With the coordinator's loop and the shards' loops running, pods created while everything
    is idle are routed and bound although no loop would look again on its own before ten minutes
    (``poll_s``, ``idle_sleep_s``): the watch's long poll wakes the coordinator, the routed pods
    wake their shard. `stop` ends every loop, also in the middle of its wait."""
    world = World(ledger, n_nodes=4, shards=2)
    world.coordinator.poll_s = 600.0
    for s in world.shards.values():
        s.options.idle_sleep_s = 600.0
    loops = [threading.Thread(target=world.coordinator.run_forever, daemon=True)]
    loops += [threading.Thread(target=s.run_forever, daemon=True) for s in world.shards.values()]
    for t in loops:
        t.start()
    try:
        for round_ in range(3):  # each round finds every loop waiting again
            world.create(2, prefix=f"r{round_}-")
            deadline = time.monotonic() + 60
            while world.cluster.invariants()["pods_unbound"] and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not world.cluster.invariants()["pods_unbound"], world.coordinator.status()
    finally:
        world.coordinator.stop()
        for s in world.shards.values():
            s.stop()
        for t in loops:
            t.join(30)
    assert not any(t.is_alive() for t in loops)
    world.coordinator.catch_up()  # the last binds' watch events, if the loop stopped before them
    assert world.coordinator.status()["bound_seen"] == 6


def test_a_watch_answer_is_applied_once_from_the_rv_it_was_asked_from(ledger):
    """The pump's answer is applied only while the coordinator is still at the rv it was asked
    from: after it (or a direct poll, or a relist) moved the rv on, the same answer is dropped, so
    no pod is routed twice."""
    from shardsched.sharding.coordinator.watch_pump import fetch

    world = World(ledger, n_nodes=2, shards=1)
    state = world.coordinator.state
    world.create(1)
    answer = fetch(state)
    assert answer.rv_from == state.rv and len(answer.events) == 1

    first = world.coordinator.intake.poll(answer)
    again = world.coordinator.intake.poll(answer)

    assert [p.name for p in first.new_pods] == ["pod-00000"] and state.rv == answer.rv
    assert (again.events, again.new_pods) == (0, [])
