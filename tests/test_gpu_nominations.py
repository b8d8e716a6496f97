"""GPU devices in preemptors' nominations and gangs' holds: a nominated or held share counts on the
device chosen for it (never on the node's GPU sum alone, never over two devices), in the Redis
ledger (nominate, gang_reserve, and reserve net of both), in a shard's `NominatedPods` and in the
coordinator's whole-cluster table; the preemptor binds on that device; DefaultPreemption picks
victims that free one device.

Real Redis, a real `SimCluster`, a plain `Coordinator` with plain `Shard`s stepped by the test
(`World` of test_coordinator), as tests/test_preemption_runtime.py and tests/test_gangs_runtime.py."""

from __future__ import annotations

import json
import time

from shardsched.api.objects import PodInfo
from shardsched.cache.devices import DEVICES_ANNOTATION, GPU_MILLI_RESOURCE, GPU_RESOURCE, MILLI, device_resource
from shardsched.cache.node_table import PodUsage
from shardsched.config import load_config
from shardsched.plugins.gpudevice.plugin import NO_FREE_DEVICE, GPUDevice
from shardsched.sharding.nominations import NominatedPods
from shardsched.sim import SimCluster
from shardsched.store.ledger import GangCode, GangMember, Ledger, NodeEntry, NominateItem, ReserveCode, ReserveItem
from shardsched.store import BoundPod

from builders import node, pod, run_filter, table_of
from test_coordinator import World

HIGH, LOW = 1000, 0
GPU_NODE = {GPU_RESOURCE: 2, GPU_MILLI_RESOURCE: 2000, "cpu": 8000, "pods": 110}
OWNER = "s"
CONFIG = load_config("""\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
podInitialBackoffSeconds: 0.01
podMaxBackoffSeconds: 0.05
profiles:
- schedulerName: shardsched
  plugins:
    multiPoint:
      enabled:
      - name: GPUDevice
        weight: 10
""")


def share_request(milli: int) -> dict[str, int]:
    return {"cpu": 100, GPU_MILLI_RESOURCE: milli}


def share(name: str, milli: int, priority: int = LOW):
    gpu = {GPU_MILLI_RESOURCE: str(milli)}
    p = pod(name, cpu="100m", memory="64Mi", requests=gpu, limits=dict(gpu)).with_priority(priority)
    p.spec["schedulerName"] = "shardsched"
    return p


def gpu_node(name: str, gpus: int = 2):
    return node(name, cpu="8", memory="64Gi", alloc={GPU_RESOURCE: str(gpus), GPU_MILLI_RESOURCE: str(gpus * MILLI)})


def plain(obj) -> dict:
    return json.loads(json.dumps(obj))


def nominated_devices(ledger: Ledger, node_name: str, uid: str) -> dict[str, int]:
    """The device amounts a nomination or gang hold records on the node (its resource list)."""
    raw = ledger.client.hget(f"{ledger.prefix}nom:{node_name}", uid)
    assert raw is not None, f"no nomination of {uid} on {node_name}"
    flat = json.loads(json.loads(raw)[1])
    return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2) if flat[i].startswith("shardsched.io/")}


def reserve_one(ledger: Ledger, uid: str, milli: int, device: int, priority: int = LOW):
    token = ledger.acquire_leases([uid], OWNER, 30_000)[uid]
    return ledger.reserve(OWNER, 1, [ReserveItem(uid, "n", token, share_request(milli), priority, (device,))],
                          10_000)[0]


def gpu_ledger(ledger: Ledger) -> Ledger:
    ledger.upsert_nodes([NodeEntry("n", GPU_NODE, OWNER)])
    ledger.set_owners({"n": OWNER}, 1)
    return ledger


# ------------------------------------------------------------------------------- the ledger alone


def test_a_nominated_share_holds_its_device_not_the_node_sum(ledger):
    """Device 0 has 500 bound; the victim's 500 on device 1 goes for a 600 preemptor nominated to
    device 1. A 600 share of equal priority fits the node's GPU sum (500 + 600 + 600 < 2000) and
    device 1 once the victim is gone, but not net of the nomination: refused on device 1. A 400
    share fits device 1 beside the nomination, a 500 share device 0; releasing the nomination
    frees device 1 only."""
    gpu_ledger(ledger)
    ledger.observe([BoundPod("l0", "n", share_request(500), (0,)), BoundPod("victim", "n", share_request(500), (1,))])
    [res] = ledger.nominate_many([NominateItem("p", "n", HIGH, share_request(600), ("victim",), (1,))], 60_000)
    assert res.ok
    assert nominated_devices(ledger, "n", "p") == {device_resource(1): 600}
    ledger.forget({"victim": "n"})  # the victim is gone

    refused = reserve_one(ledger, "q", 600, 1, HIGH)
    assert refused.code == ReserveCode.INSUFFICIENT and refused.resource == device_resource(1)
    assert reserve_one(ledger, "r", 400, 1).ok
    assert reserve_one(ledger, "t", 500, 0).ok
    assert reserve_one(ledger, "u", 600, 1).code == ReserveCode.INSUFFICIENT  # 400 + 600 nominated + 600
    ledger.unnominate({"p": "n"})
    assert reserve_one(ledger, "after", 600, 1).ok  # 400 + 600: device 1 is free of the nomination


def test_preemptors_are_arbitrated_per_device(ledger):
    """Two victims of 500, one on each device: a first 600 preemptor nominated to device 1, a second
    one to device 1 as well is refused on the device (the sums have room for both), to device 0
    it is accepted."""
    gpu_ledger(ledger)
    ledger.observe([BoundPod("v0", "n", share_request(500), (0,)), BoundPod("v1", "n", share_request(500), (1,))])
    first, same, other = ledger.nominate_many([
        NominateItem("a", "n", HIGH, share_request(600), ("v1",), (1,)),
        NominateItem("b", "n", HIGH, share_request(600), ("v1",), (1,)),
        NominateItem("c", "n", HIGH, share_request(600), ("v0",), (0,))], 60_000)
    assert first.ok and other.ok
    assert same.code == ReserveCode.INSUFFICIENT and same.resource == device_resource(1)
    # the renewal path's single nomination carries the devices too
    assert ledger.nominate("a", "n", HIGH, share_request(600), ["v1"], 60_000, (1,)).ok
    assert nominated_devices(ledger, "n", "a") == {device_resource(1): 600}


def test_a_gang_hold_is_checked_and_kept_per_device(ledger):
    """Two 600 members on one device do not fit (the node sum would take them); on devices 0 and 1
    they are held, and a 500 share of equal priority is then refused on either device."""
    gpu_ledger(ledger)
    one_device = ledger.reserve_gang(1, [GangMember("m0", "n", OWNER, share_request(600), LOW, (0,)),
                                         GangMember("m1", "n", OWNER, share_request(600), LOW, (0,))], 60_000)
    assert one_device.code == GangCode.INSUFFICIENT and one_device.uid == "m1"
    assert one_device.detail == device_resource(0)
    assert ledger.nominations("n") == {}
    held = ledger.reserve_gang(1, [GangMember("m0", "n", OWNER, share_request(600), LOW, (0,)),
                                   GangMember("m1", "n", OWNER, share_request(600), LOW, (1,))], 60_000)
    assert held.ok
    assert nominated_devices(ledger, "n", "m1") == {device_resource(1): 600}
    for device in (0, 1):
        refused = reserve_one(ledger, f"q{device}", 500, device)
        assert refused.code == ReserveCode.INSUFFICIENT and refused.resource == device_resource(device)
    ledger.unnominate({"m0": "n", "m1": "n"})  # released: the same devices are free again
    assert reserve_one(ledger, "q", 1000, 0).ok


# ------------------------------------------------------------------------------ a shard's table


def test_a_shards_nomination_counts_on_its_device_while_the_victim_terminates():
    """The shard's table: device 0 has 500 bound, device 1 a terminating 500 victim; the preemptor
    (600) nominated to device 1 is counted there, over 1000 until the victim is gone (on the sums
    model, or on the best fit of the moment, it would count on device 0). Once the victim is gone,
    a 600 share of equal priority finds no device; a 400 one fits beside the nomination. A pod of
    higher priority does not see the nomination, and it comes back on the same device."""
    l0, v = share("l0", 500).on("n"), share("victim", 500).on("n")
    l0["metadata"]["annotations"] = {DEVICES_ANNOTATION: "0"}
    v["metadata"]["annotations"] = {DEVICES_ANNOTATION: "1"}
    table = table_of(gpu_node("n"), pods=[l0, v])
    slot = table.index["n"]
    victim = next(u for u, usage in table.pods[slot].items() if usage.key == "default/victim")
    on_device, other = 1, 0
    assert table.devices_of(victim) == (1,)
    nominations = NominatedPods(table)
    p = share("p", 600, HIGH).info().nominated("n", (on_device,))
    nominations.add(p)
    assert table.devices_of(p.uid) == (on_device,)
    assert int(table.devices.free[slot, on_device]) == -100
    table.remove_pod(victim)
    assert int(table.devices.free[slot, on_device]) == 400

    fits, reasons = run_filter(GPUDevice(), share("q", 600, HIGH), table)
    assert fits == set() and reasons == {NO_FREE_DEVICE: 1}
    assert run_filter(GPUDevice(), share("r", 400), table)[0] == {"n"}
    nominations.for_pod(share("top", 600, HIGH + 1).info())
    assert int(table.devices.free[slot, on_device]) == 1000
    nominations.restore()
    assert table.devices_of(p.uid) == (on_device,) and int(table.devices.free[slot, other]) == 500
    nominations.remove(p.uid)
    assert int(table.devices.free[slot, on_device]) == 1000


# ------------------------------------------------------------------------------ the victim search


def test_default_preemption_frees_one_device_with_the_fewest_victims_the_reprieve_allows():
    """Device 0 holds three 300 shares, device 1 one 500 share, all of priority 0 (started in that
    order): the node has 600 free in sum (so NodeResourcesFit passes) but no device with 600. With
    GPUDevice's Filter the search is per node and per device: every lower pod out, then put back
    most important first while one device keeps 600 free: the three 300s stay, the 500 goes. The
    nomination's device is the one freed; the vectorized and the per-node searches agree."""
    from shardsched.framework.runtime import Framework
    from shardsched.plugins.defaultpreemption.plugin import DefaultPreemption
    from shardsched.plugins.registry import IN_TREE
    from shardsched.scheduler.algorithm import GenericScheduler
    from shardsched.sharding.coordinator.nominator import nomination_devices

    running = []
    for i, (milli, device) in enumerate([(300, 0), (300, 0), (300, 0), (500, 1)]):
        p = share(f"low-{i}", milli).started(i).on("n")
        p["metadata"]["annotations"] = {DEVICES_ANNOTATION: str(device)}
        running.append(p)
    for vectorized in (True, False):
        table = table_of(gpu_node("n"), pods=running)
        sched = GenericScheduler(Framework(CONFIG.profiles[0], IN_TREE, None, False), table, seed=0)
        post = next(p for p in sched.framework.post_filter_plugins if isinstance(p, DefaultPreemption))
        post.vectorized = vectorized
        info = share("high", 600, HIGH).info()
        result = sched.schedule(info, assume=False)
        assert result.node is None and NO_FREE_DEVICE in result.status.message
        pf = sched.post_filter(info, result.status)
        assert pf.nominated_node == "n" and [u.key for u in pf.victims] == ["default/low-3"], vectorized
        free = table.devices.free[0, :2].tolist()
        assert nomination_devices(sched, info, pf) == (1,)
        assert table.devices.free[0, :2].tolist() == free == [100, 500]  # the table as it was


# ------------------------------------------------------------------------------- the runtime


def gpu_world(ledger, clock: list[float], bound: list[tuple[object, int]], shards: int = 1) -> World:
    """One node of 2 GPUs (8 cpu) with ``bound`` pods (builder, device) bound by someone else,
    each with its device annotation, before the coordinator starts."""
    cluster = SimCluster(seed=0, clock=lambda: clock[0], grace_period_scale=1.0)
    cluster.create_nodes([plain(gpu_node("node-00000"))])
    for p, device in bound:
        [obj] = cluster.create_pods([plain(p)])
        cluster.bind("default", obj["metadata"]["name"], "node-00000", obj["metadata"]["uid"],
                     {DEVICES_ANNOTATION: str(device)})
    return World(ledger, n_nodes=0, shards=shards, config=CONFIG, cluster=cluster)


def settle(world: World, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        world.settle(timeout_s=timeout_s, parked_ok=True)
        if not any(s.queue.pending_counts()["backoff"] for s in world.shards.values()):
            return
        assert time.monotonic() < deadline, "pods still backing off"
        time.sleep(0.01)


def pods_by_name(world: World) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in world.cluster.list_pods()[0]}


def test_a_gpu_share_preemptor_frees_one_device_and_binds_on_it(ledger):
    """Two low-priority 500 shares, one per device, and a 600 preemptor: the node has 1000 free in
    sum but no device with 600. DefaultPreemption's victims free ONE device (one victim: the
    other share is reprieved, since removing it too is not needed on a device); the nomination
    holds that device in the ledger, in the coordinator's table and in the shard's; while the
    victim terminates, a 600 share of lower priority is not placed on it; the preemptor binds
    there once the victim is gone, and no device ever holds more than 1000."""
    clock = [0.0]
    world = gpu_world(ledger, clock, [(share("l0", 500), 0), (share("l1", 500), 1)])
    [created] = world.cluster.create_pods([plain(share("high", 600, HIGH))])
    uid = created["metadata"]["uid"]
    settle(world)
    pods = pods_by_name(world)
    assert pods["high"]["status"].get("nominatedNodeName") == "node-00000"
    terminating = [n for n in ("l0", "l1") if pods[n]["metadata"].get("deletionTimestamp")]
    assert len(terminating) == 1, "one victim frees a device"
    device = int(pods[terminating[0]]["metadata"]["annotations"][DEVICES_ANNOTATION])
    state = world.coordinator.state
    assert state.preempting[uid].devices == (device,)
    assert state.table.devices_of(uid) == (device,)
    assert nominated_devices(ledger, "node-00000", uid) == {device_resource(device): 600}
    [shard] = world.shards.values()
    assert uid in shard.nominated and shard.table.devices_of(uid) == (device,)

    world.cluster.create_pods([plain(share("late", 600, LOW))])
    settle(world)
    clock[0] += 31  # the victim's grace period ends
    settle(world)
    pods = pods_by_name(world)
    assert pods["high"]["spec"].get("nodeName") == "node-00000"
    assert pods["high"]["metadata"]["annotations"][DEVICES_ANNOTATION] == str(device)
    assert not pods["late"]["spec"].get("nodeName")
    assert terminating[0] not in pods
    use = {}
    for p in pods.values():
        if p["spec"].get("nodeName"):
            d = int(p["metadata"]["annotations"][DEVICES_ANNOTATION])
            use[d] = use.get(d, 0) + int(p["spec"]["containers"][0]["resources"]["requests"][GPU_MILLI_RESOURCE])
    assert use == {1 - device: 500, device: 600}
    assert ledger.nominations("node-00000") == {} and state.preempting == {}


def test_a_gangs_members_are_held_on_distinct_devices_and_bind_there(ledger):
    """A gang of two 600 shares on one node of 2 GPUs: the coordinator holds each member on its own
    device in the ledger (the sums would let both on device 0), the shard binds each on it."""
    world = gpu_world(ledger, [0.0], [])
    config = load_config("""\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
podInitialBackoffSeconds: 0.01
podMaxBackoffSeconds: 0.05
profiles:
- schedulerName: shardsched
  plugins:
    multiPoint:
      enabled: [{name: Coscheduling}, {name: GPUDevice, weight: 10}]
      disabled: [{name: PrioritySort}]
""")
    world = World(ledger, n_nodes=0, shards=1, config=config, cluster=world.cluster)
    world.cluster.create_pod_group({"metadata": {"name": "g"}, "spec": {"minMember": 2}})
    members = []
    for i in range(2):
        p = share(f"g-{i}", 600)
        p.with_labels({"scheduling.x-k8s.io/pod-group": "g"})
        members.append(plain(p))
    created = world.cluster.create_pods(members)
    world.coordinator.step()
    world.coordinator.step()
    holds = {o["metadata"]["uid"]: nominated_devices(ledger, "node-00000", o["metadata"]["uid"]) for o in created}
    assert sorted(tuple(h) for h in holds.values()) == [(device_resource(0),), (device_resource(1),)]
    settle(world)
    pods = pods_by_name(world)
    devices = sorted(pods[f"g-{i}"]["metadata"]["annotations"][DEVICES_ANNOTATION] for i in range(2))
    assert devices == ["0", "1"]
    assert ledger.nominations("node-00000") == {}


def _random_gpu_cluster(rng):
    """(nodes, bound pods, preemptor): a few nodes of 0-4 GPUs, shares, whole GPUs and CPU pods of
    mixed priorities and start times (devices as the table places them), a GPU or CPU preemptor."""
    from shardsched.cache.devices import GPU_RESOURCE as WHOLE

    nodes, running = [], []
    for i in range(int(rng.integers(1, 7))):
        gpus = int(rng.choice([0, 1, 2, 4]))
        n = node(f"n{i}", cpu=str(rng.choice([4, 8])), memory="16Gi",
                 alloc={WHOLE: str(gpus), GPU_MILLI_RESOURCE: str(gpus * MILLI)} if gpus else None)
        nodes.append(n)
        for j in range(int(rng.integers(0, 9))):
            roll = rng.random()
            prio = int(rng.choice([-5, 0, 3, 10]))
            if gpus and roll < 0.55:
                p = share(f"n{i}-p{j}", int(rng.choice([100, 250, 400, 500, 700, 900])), prio)
            elif gpus and roll < 0.75:
                k = int(rng.integers(1, gpus + 1))
                gpu = {WHOLE: str(k), GPU_MILLI_RESOURCE: str(k * MILLI)}
                p = pod(f"n{i}-p{j}", cpu="500m", memory="64Mi", requests=gpu, limits=dict(gpu)).with_priority(prio)
            else:
                p = pod(f"n{i}-p{j}", cpu=str(rng.choice(["250m", "1", "2"])), memory="64Mi").with_priority(prio)
            start = int(rng.choice([0, 1, 2]))
            running.append((p.started(start) if start else p).on(f"n{i}").info())
    # the devices as a binder would leave them: a GPU pod that fits no device of its node is left out
    # (over 1000, the per-node search's remove and re-add of a pod could move it to other devices)
    scratch, kept = table_of(*nodes), []
    for info in running:
        usage = PodUsage.of(info)
        slot = scratch.index[info.node_name]
        if usage.gpu is None or scratch.devices.pick(slot, usage.gpu):
            scratch.add_pod(usage, info.node_name)
            kept.append(info)
    running = kept
    roll, prio = rng.random(), int(rng.choice([1, 5, 20]))
    if roll < 0.6:
        pre = share("preemptor", int(rng.choice([300, 600, 900, 1000 - 1])), prio)
    elif roll < 0.85:
        k = int(rng.choice([1, 2]))
        gpu = {WHOLE: str(k), GPU_MILLI_RESOURCE: str(k * MILLI)}
        pre = pod("preemptor", cpu="1", memory="64Mi", requests=gpu, limits=dict(gpu)).with_priority(prio)
    else:
        pre = pod("preemptor", cpu=str(rng.choice(["3", "6"])), memory="64Mi").with_priority(prio)
    return [n.info() for n in nodes], running, pre.info()


def test_the_vectorized_device_search_agrees_with_the_per_node_search():
    """DefaultPreemption under GPUDevice on random GPU clusters: the vectorized search (devices as
    arrays) and the per-node search (GPUDevice's Filter per potential victim) give the same node,
    victims in order, PDB violations and message; the table is left as it was."""
    import numpy as np

    from shardsched.framework.cycle_state import CycleState
    from shardsched.framework.runtime import Framework
    from shardsched.plugins.defaultpreemption import search
    from shardsched.plugins.defaultpreemption.plugin import DefaultPreemption
    from shardsched.plugins.registry import IN_TREE
    from shardsched.scheduler.algorithm import GenericScheduler

    framework = Framework(CONFIG.profiles[0], IN_TREE, None, False)
    compared = preempted = 0
    kinds = {}
    for case in range(250):
        rng = np.random.default_rng(1000 + case)
        nodes, running, pre = _random_gpu_cluster(rng)
        pct, absolute = (10, 100) if case % 3 else (0, int(rng.integers(1, 3)))
        outcomes = []
        for vectorized in (True, False):
            table = table_of(*nodes, pods=running)
            sched = GenericScheduler(framework, table, seed=case)
            result = sched.schedule(pre, assume=False)
            if result.node is not None:
                break
            before = (table.requested[:, : table.n].copy(), table.devices.free[: table.n].copy())
            if vectorized:
                for k in search.plan(pre, sched, np.flatnonzero(table.valid[: table.n])).kind.tolist():
                    kinds[k] = kinds.get(k, 0) + 1
            pf = DefaultPreemption(pct, absolute, vectorized=vectorized).post_filter(
                CycleState(), pre, result.status.diagnosis, sched)
            outcomes.append((pf.status.code, pf.status.message, pf.nominated_node, [u.key for u in pf.victims],
                             pf.num_pdb_violations))
            assert np.array_equal(before[0], table.requested[:, : table.n]), f"case {case}: table changed"
            assert np.array_equal(before[1], table.devices.free[: table.n]), f"case {case}: devices changed"
        if len(outcomes) == 2:
            compared += 1
            preempted += outcomes[0][2] not in (None, "")
            assert outcomes[0] == outcomes[1], f"case {case}"
    assert compared > 60 and 30 < preempted < compared, (compared, preempted)
    assert kinds.get(search.FEASIBLE, 0) > 50 and kinds.get(search.NO_FIT, 0) > 10, kinds


def test_a_node_whose_devices_no_victims_can_free_gets_the_device_reason():
    """Two 500 shares of higher priority than the preemptor, one per device, and a 100 share of
    lower priority: the node's GPU sum has room once the 100 goes (NodeResourcesFit passes), no
    device ever has 600: both searches say so with GPUDevice's reason."""
    import numpy as np

    from shardsched.framework.runtime import Framework
    from shardsched.plugins.defaultpreemption import search
    from shardsched.plugins.defaultpreemption.plugin import DefaultPreemption
    from shardsched.plugins.registry import IN_TREE
    from shardsched.scheduler.algorithm import GenericScheduler

    running = []
    for name, milli, prio, device in (("a", 500, HIGH + 1, 0), ("b", 500, HIGH + 1, 1), ("c", 100, LOW, 0)):
        p = share(name, milli, prio).on("n")
        p["metadata"]["annotations"] = {DEVICES_ANNOTATION: str(device)}
        running.append(p)
    messages = []
    for vectorized in (True, False):
        table = table_of(gpu_node("n"), pods=running)
        sched = GenericScheduler(Framework(CONFIG.profiles[0], IN_TREE, None, False), table, seed=0)
        post = next(p for p in sched.framework.post_filter_plugins if isinstance(p, DefaultPreemption))
        post.vectorized = vectorized
        info = share("high", 600, HIGH).info()
        if vectorized:
            assert search.plan(info, sched, np.array([0])).kind.tolist() == [search.NO_FIT]
        result = sched.schedule(info, assume=False)
        pf = sched.post_filter(info, result.status)
        assert not pf.status.is_success()
        messages.append(pf.status.message)
    assert messages[0] == messages[1] == f"preemption: 0/1 nodes are available: 1 {NO_FREE_DEVICE}."
