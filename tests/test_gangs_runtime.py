"""Gangs in the sharded runtime, without Ray: a plain `Coordinator` with plain `Shard`s (stepped by
the test, `World` of test_coordinator), a real `SimCluster` and a real Redis ledger. A gang is
decided whole by the coordinator, held in the ledger in one call, bound by the shards owning its
nodes; gangs summing to 150% of the cluster fill it with whole gangs only; bad input waits with
an Event; a member whose bind is refused is decided again and the gang completes."""

from __future__ import annotations

import time
from collections import Counter

from shardsched.cluster import BindResult
from shardsched.config import load_config
from shardsched.sim import SimCluster, uniform_pods

from test_coordinator import World

LABEL = "scheduling.x-k8s.io/pod-group"
#: the gang profile (Coscheduling instead of PrioritySort) with short backoffs
CONFIG_YAML = """
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
podInitialBackoffSeconds: 0.01
podMaxBackoffSeconds: 0.05
profiles:
- schedulerName: shardsched
  plugins:
    multiPoint:
      enabled: [{name: Coscheduling}]
      disabled: [{name: PrioritySort}]
"""
CONFIG = load_config(CONFIG_YAML)


def gang(world: World, name: str, size: int, cpu: str = "1", min_member: int | None = None,
         group: bool = True) -> list[dict]:
    if group:
        world.cluster.create_pod_group({"metadata": {"name": name}, "spec": {"minMember": min_member or size}})
    pods = uniform_pods(size, cpu=cpu, scheduler_name="shardsched", prefix=f"{name}-")
    for p in pods:
        p["metadata"].setdefault("labels", {})[LABEL] = name
    return world.cluster.create_pods(pods)


def bound_per_group(world: World) -> Counter:
    pods, _ = world.cluster.list_pods()
    return Counter(p["metadata"]["labels"][LABEL] for p in pods
                   if p["spec"].get("nodeName") and LABEL in (p["metadata"].get("labels") or {}))


def holds(world: World) -> dict:
    return {n: world.ledger.nominations(n) for n in world.coordinator.state.owners if world.ledger.nominations(n)}


def messages(world: World, name: str) -> list[str]:
    return [e["message"] for e in world.cluster.events_for("default", name) if e["reason"] == "FailedScheduling"]


def test_a_gang_spanning_three_shards_binds_whole_and_releases_its_hold(ledger) -> None:
    world = World(ledger, n_nodes=6, shards=3, config=CONFIG)
    gang(world, "train", 9, cpu="2")  # 18 of 24 cpus: two members per node at most
    world.settle()
    assert bound_per_group(world) == {"train": 9}
    pods, _ = world.cluster.list_pods()
    shards = {world.coordinator.state.owners[p["spec"]["nodeName"]] for p in pods}
    assert shards == {0, 1, 2}
    assert holds(world) == {}  # each member's hold left the ledger when it bound
    attempts = world.coordinator.state.metrics.podgroup_attempts
    assert attempts.labels("scheduled")._value.get() == 1
    assert world.cluster.get_pod_group("default", "train")["status"]["phase"] == "Running"
    assert world.cluster.invariants()["overcommitted_nodes"] == []


def test_gangs_summing_to_150_percent_fill_the_cluster_with_whole_gangs(ledger) -> None:
    """No deadlock: six gangs of six 1-cpu pods on 24 cpus (36 asked). Whichever can be placed
    whole is placed; the others hold nothing and wait."""
    world = World(ledger, n_nodes=6, shards=3, config=CONFIG)
    for g in range(6):
        gang(world, f"g{g}", 6)
    world.settle(parked_ok=True, timeout_s=30)
    bound = bound_per_group(world)
    assert sorted(bound.values()) == [6, 6, 6, 6]  # four whole gangs: the cluster is full
    waiting = sorted({f"g{g}" for g in range(6)} - set(bound))
    assert len(waiting) == 2
    assert holds(world) == {}  # the waiting gangs hold no room
    inv = world.cluster.invariants()
    assert inv["pods_bound"] == 24 and inv["overcommitted_nodes"] == [] and inv["double_binds"] == 0
    status = world.coordinator.status()
    assert status["pending"] == status["unschedulable"] == 12
    for g in waiting:
        want = f"pod group default/{g}: 0/6 members schedulable; default/{g}-00000: 0/6 nodes are available: 6 Insufficient cpu."
        assert set(messages(world, f"{g}-00000")) == {want} and set(messages(world, f"{g}-00005")) == {want}
    # room freed: a waiting gang goes in whole
    for p in world.cluster.list_pods()[0]:
        if p["metadata"]["labels"][LABEL] == sorted(bound)[0]:
            world.cluster.delete_pod("default", p["metadata"]["name"])
    world.settle(parked_ok=True, timeout_s=30)
    assert sorted(bound_per_group(world).values()) == [6, 6, 6, 6]


def test_bad_input_waits_with_an_event_and_nothing_is_lost(ledger) -> None:
    world = World(ledger, n_nodes=2, shards=2, config=CONFIG)
    gang(world, "orphan", 2, group=False)              # names a group that does not exist
    gang(world, "short", 2, min_member=3)              # minMember larger than its pods
    gang(world, "doomed", 2)
    world.cluster.delete_pod_group("default", "doomed")  # deleted before its pods could go
    world.settle(parked_ok=True)
    assert bound_per_group(world) == {}
    assert messages(world, "orphan-00000")[-1] == "0/2 nodes are available: PodGroup default/orphan not found."
    assert messages(world, "doomed-00001")[-1] == "0/2 nodes are available: PodGroup default/doomed not found."
    assert messages(world, "short-00000")[-1] == (
        "0/2 nodes are available: pre-filter pod short-00000 cannot find enough sibling pods, current pods "
        "number: 2, minMember of group: 3.")
    assert world.coordinator.status()["pending"] == 6
    with_min_0 = {"metadata": {"name": "zero"}, "spec": {"minMember": 0}}
    try:
        world.cluster.create_pod_group(with_min_0)
    except Exception as e:  # the API server refuses it (the CRD's minimum)
        assert "spec.minMember" in str(e)
    world.cluster.create_pod_group({"metadata": {"name": "orphan"}, "spec": {"minMember": 2}})
    world.settle(parked_ok=True)
    assert bound_per_group(world) == {"orphan": 2}


class RefusesOnce(SimCluster):
    """Answers 409 (not applied) to the first bind of one pod."""

    def __init__(self, victim: str) -> None:
        super().__init__(seed=0)
        self.victim, self.refused = victim, 0

    def bind_many(self, bindings):
        bindings = list(bindings)
        out = super().bind_many([b for b in bindings if not (b[1] == self.victim and not self.refused)])
        if len(out) == len(bindings):
            return out
        self.refused += 1
        out = iter(out)
        return [BindResult(b[0], b[1], b[2], 409, "Conflict", "injected", "") if b[1] == self.victim else next(out)
                for b in bindings]


def test_a_member_whose_bind_is_refused_is_decided_again_and_the_gang_completes(ledger) -> None:
    cluster = RefusesOnce("train-00002")
    world = World(ledger, n_nodes=4, shards=2, config=CONFIG, cluster=cluster)
    gang(world, "train", 4)
    world.settle()
    assert cluster.refused == 1
    assert bound_per_group(world) == {"train": 4}
    assert holds(world) == {}
    assert world.coordinator.state.metrics.podgroup_attempts.labels("scheduled")._value.get() == 2


def test_a_shard_replaced_while_its_members_are_held_and_the_gang_completes(ledger) -> None:
    """The gang is held in the ledger and its members sent to their shards; before shard 1 binds
    anything it dies and is replaced (new member id, epoch bumped). The new incarnation gets the
    held members again and binds them on their nodes: the gang ends whole, nothing bound twice."""
    world = World(ledger, n_nodes=6, shards=3, config=CONFIG)
    gang(world, "train", 9, cpu="2")
    world.coordinator.step()  # intake, then the gang decided and held
    assert world.coordinator.state.counters["gangs_placed"] == 1 and holds(world)
    dead = world.shards[1]
    assert dead.pending_keys()  # some of the gang's members wait in the shard that dies
    world.coordinator.replace_shard(1)
    assert world.shards[1] is not dead and world.coordinator.state.shards[1].member == "shard-1@2"
    world.settle()
    assert bound_per_group(world) == {"train": 9}
    inv = world.cluster.invariants()
    assert inv["double_binds"] == 0 and inv["overcommitted_nodes"] == [] and inv["bind_conflicts"] == 0
    assert holds(world) == {}


def test_gangs_decided_in_one_pass_are_held_each_all_or_nothing(ledger) -> None:
    """Three gangs due at once are decided in one pass and held in one ledger call; the ledger
    refuses one of them (a shard holds the lease of one of its members), which holds nothing and
    is decided again, while the other two are held and bound."""
    world = World(ledger, n_nodes=4, shards=2, config=CONFIG)
    made = {g: gang(world, g, 2) for g in ("g0", "g1", "g2")}
    uids = {g: {p["metadata"]["uid"] for p in pods} for g, pods in made.items()}
    ledger.acquire_leases([made["g1"][1]["metadata"]["uid"]], "elsewhere@1", 300)
    world.coordinator.step()  # intake, then one pass over the three gangs
    counters = world.coordinator.state.counters
    assert (counters["gangs_placed"], counters["gang_refusals"]) == (2, 1)
    held = {uid for on_node in holds(world).values() for uid in on_node}
    assert held == uids["g0"] | uids["g2"]
    world.settle()
    assert bound_per_group(world) == {"g0": 2, "g1": 2, "g2": 2}
    assert holds(world) == {}
    attempts = world.coordinator.state.metrics.podgroup_attempts
    assert attempts.labels("scheduled")._value.get() == 3 and attempts.labels("error")._value.get() >= 1


def test_pod_group_backoff_keeps_a_failed_gang_waiting_although_room_was_freed(ledger) -> None:
    """Coscheduling's podGroupBackoffSeconds: a gang (with its minMember pods) that could not be
    placed is not tried again for that long, even once the room it lacked is freed; then it is."""
    config = load_config(CONFIG_YAML + """\
  pluginConfig:
  - name: Coscheduling
    args: {podGroupBackoffSeconds: 1}
""")
    world = World(ledger, n_nodes=2, shards=2, config=config)
    [blocker] = world.cluster.create_pods(uniform_pods(1, cpu="2", scheduler_name="shardsched", prefix="blocker-"))
    world.settle()
    gang(world, "train", 2, cpu="3")  # one 3-cpu member fits beside the blocker's 2 of 4 cpus, not two
    world.settle(parked_ok=True)
    failed_at = time.monotonic()
    assert bound_per_group(world) == {} and messages(world, "train-00000")
    world.cluster.delete_pod("default", blocker["metadata"]["name"])

    def step_until(done, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while not done() and time.monotonic() < deadline:
            world.coordinator.step()
            for s in world.shards.values():
                s.step()
            time.sleep(0.005)

    step_until(lambda: bool(bound_per_group(world)), 0.5)
    assert bound_per_group(world) == {}  # room enough now, but the group failed recently
    step_until(lambda: bound_per_group(world) == {"train": 2}, 10.0)
    assert bound_per_group(world) == {"train": 2} and time.monotonic() - failed_at >= 1.0
