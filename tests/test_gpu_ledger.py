"""GPU devices in the Redis ledger: each device of a node is one more resource of the node, so the
second check before bind refuses a share that fits the node's GPU sum but no device; the chosen
devices are recorded on the pod at bind (`DEVICES_ANNOTATION`) and read back on restart.

Real Redis, a real `SimCluster` and real shards (driven in-process, as tests/test_shard.py, so
that the race is exact), plus one run through the Ray runtime."""

from __future__ import annotations

import time

from shardsched.api.objects import NodeInfo, PodInfo
from shardsched.cache.devices import DEVICES_ANNOTATION, device_resource, parse_devices
from shardsched.cache.node_table import PodUsage
from shardsched.config import load_config
from shardsched.sharding.shard import Shard, ShardOptions
from shardsched.sim import SimCluster, uniform_nodes, uniform_pods
from shardsched.store import BoundPod, Ledger, NodeEntry
from shardsched.store.ledger import ReservationRef, ReserveCode, ReserveItem

SCHEDULER = "shardsched"
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
A, B = "shard-0@1", "shard-1@1"
GPU_NODE = {"nvidia.com/gpu": 2, "alibabacloud.com/gpu-milli": 2000, "cpu": 8000, "pods": 110}


def gpu_nodes(n: int, devices: int = 2) -> list[dict]:
    nodes = uniform_nodes(n, cpu="8", memory="64Gi")
    for node in nodes:
        extra = {"nvidia.com/gpu": str(devices), "alibabacloud.com/gpu-milli": str(1000 * devices)}
        node["status"]["allocatable"].update(extra)
        node["status"]["capacity"].update(extra)
    return nodes


def share_pods(n: int, milli: int, prefix: str) -> list[dict]:
    pods = uniform_pods(n, cpu="100m", memory="64Mi", scheduler_name=SCHEDULER, prefix=prefix)
    for p in pods:
        res = p["spec"]["containers"][0]["resources"]
        res["requests"]["alibabacloud.com/gpu-milli"] = str(milli)
        res.setdefault("limits", {})["alibabacloud.com/gpu-milli"] = str(milli)
    return pods


def share_request(milli: int) -> dict[str, int]:
    return {"cpu": 100, "alibabacloud.com/gpu-milli": milli}


def lease(ledger: Ledger, uid: str, shard: str = A) -> int:
    return ledger.acquire_leases([uid], shard, 30_000)[uid]


# ------------------------------------------------------------------------------- the ledger alone


def test_a_share_that_fits_the_node_sum_but_no_device_is_refused(ledger):
    """Two GPUs, 600 taken on device 0: another 600 fits the node's 2000 in sum; on device 0 the
    ledger refuses it (naming the device), on device 1 it reserves it."""
    ledger.upsert_nodes([NodeEntry("n", GPU_NODE, A)])
    ledger.set_owners({"n": A}, 1)
    assert ledger.node_usage("n").allocatable[device_resource(1)] == 1000
    first = ReserveItem("a", "n", lease(ledger, "a"), share_request(600), 0, (0,))
    same = ReserveItem("b", "n", lease(ledger, "b"), share_request(600), 0, (0,))
    other = ReserveItem("c", "n", lease(ledger, "c"), share_request(600), 0, (1,))
    results = ledger.reserve(A, 1, [first, same, other], 10_000)
    assert [r.code for r in results] == [ReserveCode.OK, ReserveCode.INSUFFICIENT, ReserveCode.OK]
    assert results[1].resource == device_resource(0)
    reserved = ledger.node_usage("n").reserved
    assert reserved[device_resource(0)] == reserved[device_resource(1)] == 600
    assert reserved["alibabacloud.com/gpu-milli"] == 1200

    # commit turns the devices into usage; release and forget give them back
    ledger.commit([ReservationRef("a", "n", first.token)])
    ledger.release([ReservationRef("c", "n", other.token)])
    usage = ledger.node_usage("n")
    assert usage.used[device_resource(0)] == 600 and device_resource(1) not in usage.used
    assert usage.reserved == {}
    ledger.forget({"a": "n"})
    assert ledger.node_usage("n").used == {}


def test_whole_gpus_need_their_devices_wholly_free_in_the_ledger(ledger):
    ledger.upsert_nodes([NodeEntry("n", GPU_NODE, A)])
    ledger.set_owners({"n": A}, 1)
    share = ReserveItem("s", "n", lease(ledger, "s"), share_request(100), 0, (1,))
    whole = ReserveItem("w", "n", lease(ledger, "w"), {"nvidia.com/gpu": 2, "alibabacloud.com/gpu-milli": 2000},
                        0, (0, 1))
    assert ledger.reserve(A, 1, [share], 10_000)[0].ok
    refused = ledger.reserve(A, 1, [whole], 10_000)[0]
    assert refused.code == ReserveCode.INSUFFICIENT  # the sums (2100 > 2000) or device 1


def test_observe_and_reconcile_count_devices(ledger):
    """The watch's observe and a rebuild count a bound pod on its devices, idempotently; a pod
    observed again with the same devices changes nothing."""
    ledger.upsert_nodes([NodeEntry("n", GPU_NODE, A)])
    ledger.set_owners({"n": A}, 1)
    ledger.observe([BoundPod("a", "n", share_request(700), (1,))])
    assert ledger.node_usage("n").used[device_resource(1)] == 700
    ledger.observe([BoundPod("a", "n", share_request(700), (1,))])
    assert ledger.node_usage("n").used[device_resource(1)] == 700
    refused = ledger.reserve(A, 1, [ReserveItem("b", "n", lease(ledger, "b"), share_request(400), 0, (1,))], 10_000)
    assert refused[0].code == ReserveCode.INSUFFICIENT and refused[0].resource == device_resource(1)
    ledger.client.delete(f"{ledger.prefix}node:n")  # lost: rebuilt from the cluster's truth
    ledger.reconcile("n", GPU_NODE, {"a": share_request(700)}, {"a": (1,)})
    usage = ledger.node_usage("n")
    assert usage.used[device_resource(1)] == 700 and usage.allocatable[device_resource(0)] == 1000


# ------------------------------------------------------------------------------ shards racing


def publish(ledger: Ledger, cluster: SimCluster, owner: str, epoch: int) -> None:
    infos = [NodeInfo.from_object(n) for n in cluster.list_nodes()[0]]
    ledger.upsert_nodes([NodeEntry(n.name, n.allocatable, owner) for n in infos])
    ledger.set_owners({n.name: owner for n in infos}, epoch)


class Rebalancer:
    def __init__(self) -> None:
        self.items = []

    def handoff(self, shard: int, items) -> None:
        self.items.extend(items)

    def committed(self, shard: int, epoch: int, uids) -> None:
        """The shard's commit reports (`shardsched.sharding.protocols.Rebalancer`); not read here."""


def new_shard(ledger: Ledger, cluster: SimCluster, member: str, index: int, epoch: int, pods: list[dict]) -> Shard:
    shard = Shard(index, member, CONFIG, ledger, cluster, Rebalancer(), ShardOptions(seed=0))
    shard.set_epoch(epoch)
    shard.apply_nodes(cluster.list_nodes()[0])
    shard.add_pods([PodInfo.from_object(cluster.get_pod("default", p["metadata"]["name"])) for p in pods])
    return shard


def device_use(cluster: SimCluster) -> dict[tuple[str, int], int]:
    """(node, device) -> thousandths the bound pods take, from their annotations."""
    use: dict[tuple[str, int], int] = {}
    for p in cluster.list_pods()[0]:
        node = p["spec"].get("nodeName")
        if not node:
            continue
        milli = int(p["spec"]["containers"][0]["resources"]["requests"]["alibabacloud.com/gpu-milli"])
        devices = parse_devices((p["metadata"].get("annotations") or {}).get(DEVICES_ANNOTATION))
        assert devices, f"{p['metadata']['name']} bound without its devices"
        for i in devices:
            use[node, i] = use.get((node, i), 0) + milli
    return use


def test_a_new_owner_with_a_stale_table_cannot_overcommit_a_device(ledger):
    """Shard A binds a 600 share on device 0 of the only node; the map then gives the node to B,
    whose table has not seen that pod yet (the watch lags) and puts its own 600 share on device 0
    too: it fits the node's GPU sum (1200 of 2000), and the ledger refuses it on the device. Once
    B's table sees A's pod (with its annotation), B binds on device 1. No device holds more than
    1000 and the ledger's per-device usage is the annotations'."""
    cluster = SimCluster(seed=0)
    cluster.create_nodes(gpu_nodes(1))
    pods_a, pods_b = share_pods(1, 600, "a-"), share_pods(1, 600, "b-")
    cluster.create_pods(pods_a + pods_b)
    publish(ledger, cluster, A, 1)
    shard_a = new_shard(ledger, cluster, A, 0, 1, pods_a)
    shard_b = new_shard(ledger, cluster, B, 1, 1, pods_b)
    while shard_a.step():
        pass
    bound_a = cluster.get_pod("default", "a-00000")
    assert bound_a["metadata"]["annotations"][DEVICES_ANNOTATION] == "0"

    publish(ledger, cluster, B, 2)
    shard_b.set_epoch(2)
    shard_b.step()
    assert not cluster.get_pod("default", "b-00000")["spec"].get("nodeName")
    assert shard_b.metrics.ledger_reserve.labels("INSUFFICIENT")._value.get() == 1

    # the watch brings A's pod to B, with its devices
    shard_b.apply_bound(adds=[(PodUsage.of(PodInfo.from_object(bound_a)), "node-00000")])
    deadline = time.monotonic() + 10
    while not cluster.get_pod("default", "b-00000")["spec"].get("nodeName"):
        assert time.monotonic() < deadline, "b-00000 was not bound"
        if not shard_b.step():
            time.sleep(0.005)
    assert cluster.get_pod("default", "b-00000")["metadata"]["annotations"][DEVICES_ANNOTATION] == "1"
    use = device_use(cluster)
    assert use == {("node-00000", 0): 600, ("node-00000", 1): 600}
    usage = ledger.node_usage("node-00000")
    assert usage.reserved == {}
    assert {k: v for k, v in usage.used.items() if k.startswith("shardsched.io/")} == {
        device_resource(0): 600, device_resource(1): 600}


# ------------------------------------------------------------------------------- through Ray


def test_two_shards_through_ray_bind_shares_per_device(redis_server, ray_session):
    """Two shard actors, 10 nodes of 2 GPUs, 30 shares of 600: 18,000 of 20,000 fit the GPU
    sums but only one such share fits a device, so exactly 20 are bound, each with its device on
    the pod, and no device holds more than 1000."""
    from shardsched.sharding.embedded import EmbeddedRun
    from shardsched.sharding.run_control import RunOptions

    workload = [(0.0, None, p) for p in share_pods(30, 600, "s-")]
    report = EmbeddedRun(CONFIG, gpu_nodes(10), workload,
                         RunOptions(redis_url=redis_server.url, shards=2, timeout_s=40.0)).run()
    data = report.to_json()
    assert data["pods_bound"] == 20 and data["pods_unschedulable"] == 10, {k: data[k] for k in ("errors", "unschedulable_reasons", "pods_pending", "pods_total", "requeues") if k in data}
    assert data["overcommitted_nodes"] == 0 and data["double_binds"] == 0 and data["lost_pods"] == 0
    assert report.invariants["overcommitted_devices"] == []
    assert all(s["bound"] > 0 for s in report.shard_snapshots)


def test_the_coordinator_counts_a_bound_share_on_the_device_its_binder_chose(ledger):
    """A share routed to a shard and bound on device 1 (the Binding's annotation) counts on device
    1 in the coordinator's whole-cluster table and in the ledger's observe, not on the device the
    table would pick for it (0, the first of two empty devices): with the wrong device the
    coordinator sees room the shards do not have, and retries such a pod without end."""
    from shardsched.sharding.calls import ClusterClient, Local
    from shardsched.sharding.coordinator import Coordinator

    cluster = SimCluster(seed=0)
    cluster.create_nodes(gpu_nodes(1))
    shards: dict[int, Shard] = {}

    def new_shard(index, member):
        from shardsched.sharding.calls import ShardClient
        shards[index] = Shard(index, member, CONFIG, ledger, cluster, coordinator, ShardOptions(seed=0))
        return ShardClient(Local(shards[index]))

    coordinator = Coordinator(CONFIG, ledger, ClusterClient(Local(cluster)), new_shard, 1)
    coordinator.start()
    (obj,) = cluster.create_pods(share_pods(1, 600, "s-"))
    coordinator.step()  # routed to the shard, which is not stepped: the test binds instead
    uid = obj["metadata"]["uid"]
    assert uid in coordinator.state.pending
    cluster.bind("default", obj["metadata"]["name"], "node-00000", uid, {DEVICES_ANNOTATION: "1"})
    coordinator.step()
    assert coordinator.state.table.devices_of(uid) == (1,)
    coordinator.ledger_sync.flush()
    used = ledger.node_usage("node-00000").used
    assert used.get(device_resource(1)) == 600 and not used.get(device_resource(0))
