"""Shard, without Ray: a plain `Shard` on a real Redis ledger binding into a real `SimCluster`, its
`step` driven directly. Each test checks the invariants: the cluster's admission never rejected a
pod (no overcommit), no pod was bound twice, no pod was lost (bound, queued in a shard, or with the
rebalancer), and the ledger's counters match the cluster's truth."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import pytest

from shardsched.api.objects import NodeInfo, PodInfo
from shardsched.cache.node_table import PodUsage
from shardsched.config import load_config
from shardsched.sharding.protocols import BIND_CONFLICT, FENCED, UNSCHEDULABLE_HERE, Handoff
from shardsched.sharding.shard import START_BATCH, Shard, ShardOptions
from shardsched.cluster import BindResult
from shardsched.sim import FaultConfig, SimCluster, uniform_nodes, uniform_pods
from shardsched.store import BoundPod, EmbeddedRedis, Ledger, NodeEntry, connect

SCHEDULER = "shardsched"
#: short backoffs (kube's are 1 s doubling to 10 s) so that requeued pods come back within a test
CONFIG = load_config("""\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
podInitialBackoffSeconds: 0.01
podMaxBackoffSeconds: 0.05
profiles:
- schedulerName: shardsched
""")
A, B = "shard-0@1", "shard-1@1"
EPOCH = 1


@dataclass
class RecordingRebalancer:
    """The `Rebalancer` protocol: records what shards hand off."""

    items: list[tuple[int, Handoff]] = field(default_factory=list)
    commits: list[tuple[int, int, list[str]]] = field(default_factory=list)

    def handoff(self, shard: int, items: list[Handoff]) -> None:
        self.items.extend((shard, h) for h in items)

    def committed(self, shard: int, epoch: int, uids: list[str]) -> None:
        self.commits.append((shard, epoch, list(uids)))

    def by_reason(self, reason: str) -> list[Handoff]:
        return [h for _, h in self.items if h.reason == reason]

    def keys(self) -> set[str]:
        return {h.qpi.key for _, h in self.items}


class HookedLedger:
    """A real `Ledger` with a hook run right before `reserve`: what another process does between
    a shard's scheduling cycle and its Reserve (a new shard map, a stall)."""

    def __init__(self, ledger: Ledger, before_reserve: Callable[[], None]) -> None:
        self._ledger = ledger
        self._before_reserve = before_reserve

    def reserve(self, *args: Any, **kwargs: Any):
        self._before_reserve()
        return self._ledger.reserve(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)


def cluster_of(n_nodes: int, n_pods: int, *, node_cpu: str = "2", pod_cpu: str = "1",
               faults: FaultConfig | None = None) -> SimCluster:
    cluster = SimCluster(seed=0, faults=faults)
    cluster.create_nodes(uniform_nodes(n_nodes, cpu=node_cpu, memory="64Gi"))
    cluster.create_pods(uniform_pods(n_pods, cpu=pod_cpu, memory="1Gi", scheduler_name=SCHEDULER))
    return cluster


def publish(ledger: Ledger, cluster: SimCluster, owner: str, epoch: int = EPOCH) -> None:
    """What the coordinator does at start: every node into the ledger, owned by ``owner``."""
    nodes, _ = cluster.list_nodes()
    infos = [NodeInfo.from_object(n) for n in nodes]
    ledger.upsert_nodes([NodeEntry(n.name, n.allocatable, owner) for n in infos])
    ledger.set_owners({n.name: owner for n in infos}, epoch)


def new_shard(ledger: Any, cluster: SimCluster, rebalancer: RecordingRebalancer, member: str = A, *,
              index: int = 0, pods: Iterable[dict] | None = None, epoch: int = EPOCH, **options: Any) -> Shard:
    """A shard that holds every node of ``cluster`` in its table and ``pods`` (default: every
    pending pod; as the cluster stores them, with their uids) in its queue."""
    shard = Shard(index, member, CONFIG, ledger, cluster, rebalancer, ShardOptions(seed=0, **options))
    shard.set_epoch(epoch)
    shard.apply_nodes(cluster.list_nodes()[0])
    if pods is None:
        stored = [p for p in cluster.list_pods()[0] if not p["spec"].get("nodeName")]
    else:
        stored = [cluster.get_pod("default", p["metadata"]["name"]) for p in pods]
    shard.add_pods([PodInfo.from_object(p) for p in stored])
    return shard


def drive(shards: Sequence[Shard], done: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Step the shards until ``done()`` (backed-off pods come back after a short sleep)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out driving the shards"
        if not sum(s.step() for s in shards):
            time.sleep(0.005)


def bound_keys(cluster: SimCluster) -> set[str]:
    return {f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in cluster.list_pods()[0]
            if p["spec"].get("nodeName")}


def all_bound(cluster: SimCluster) -> Callable[[], bool]:
    return lambda: not cluster.invariants()["pods_unbound"]


def assert_cluster_safe(cluster: SimCluster) -> None:
    inv = cluster.invariants()
    assert inv["overcommitted_nodes"] == []
    assert inv["admission_rejections"] == 0
    assert inv["double_binds"] == 0


def assert_no_pod_lost(cluster: SimCluster, shards: Sequence[Shard], rebalancer: RecordingRebalancer) -> None:
    """Every unbound pod is still somewhere: queued or in flight in a shard, or handed off."""
    held = set(rebalancer.keys())
    for s in shards:
        held |= set(s.pending_keys())
    assert set(cluster.invariants()["pods_unbound"]) <= held


def assert_ledger_matches_cluster(ledger: Ledger, cluster: SimCluster) -> None:
    """The ledger's usage is the cluster's truth, node by node, and nothing stays reserved."""
    for node in cluster.list_nodes()[0]:
        name = node["metadata"]["name"]
        usage = ledger.node_usage(name)
        assert usage.used == cluster.requested(name), name
        assert usage.reserved == {}, name


def assert_nothing_held(ledger: Ledger, shard: Shard) -> None:
    """After a rollback (the shard bound nothing): nothing reserved in the ledger, nothing assumed
    in the table."""
    for name in shard.table.index:
        assert ledger.node_usage(name).reserved == {}, name
        assert shard.table.requested_of(name) == {}, name


def lease_is_free(ledger: Ledger, uid: str) -> bool:
    """True when nobody holds the pod's lease (another shard gets it at once)."""
    token = ledger.acquire_leases([uid], "probe", 10_000).get(uid)
    if token:
        ledger.release_leases({uid: token}, "probe")
    return token is not None


def uid_of(cluster: SimCluster, name: str) -> str:
    return cluster.get_pod("default", name)["metadata"]["uid"]


# ---------------------------------------------------------------------------- the happy path


def test_a_batch_binds_and_commits(ledger):
    cluster = cluster_of(4, 10, node_cpu="4")
    publish(ledger, cluster, A)
    rebalancer = RecordingRebalancer()
    shard = new_shard(ledger, cluster, rebalancer)

    assert shard.step() == 10  # one batch: the whole active queue

    assert bound_keys(cluster) == {f"default/pod-{i:05d}" for i in range(10)}
    assert shard.stats.bound == 10 and shard.stats.batches == 1
    assert shard.pending_keys() == [] and rebalancer.items == []
    assert_cluster_safe(cluster)
    assert_ledger_matches_cluster(ledger, cluster)
    assert all(lease_is_free(ledger, p["metadata"]["uid"]) for p in cluster.list_pods()[0])
    # the table counts what the cluster has, node by node
    for node in cluster.list_nodes()[0]:
        name = node["metadata"]["name"]
        assert shard.table.requested_of(name) == cluster.requested(name)
    assert shard.step() == 0


def test_a_batch_records_filter_and_score_as_their_own_extension_points(ledger):
    """kube's framework_extension_point_duration_seconds: one extension_point value per point
    (Filter, Score), one observation of each per batch."""
    cluster = cluster_of(4, 10, node_cpu="4")
    publish(ledger, cluster, A)
    shard = new_shard(ledger, cluster, RecordingRebalancer())
    assert shard.step() == 10
    family = next(f for f in shard.metrics.samples() if f[0].endswith("extension_point_duration_seconds"))
    counts = {labels["extension_point"]: value for name, labels, value in family[3] if name.endswith("_count")}
    assert counts == {"Filter": 1, "Score": 1}


def test_in_batch_assume_spreads_a_batch_larger_than_a_node(ledger):
    """6 pods of 1 CPU, 3 nodes of 2 CPU, one batch: each pod sees the ones placed before it, so
    the batch fills every node exactly instead of piling onto the best-scored one."""
    cluster = cluster_of(3, 6, node_cpu="2")
    publish(ledger, cluster, A)
    shard = new_shard(ledger, cluster, RecordingRebalancer())

    assert shard.step() == 6

    assert len(bound_keys(cluster)) == 6
    assert {n["metadata"]["name"]: cluster.requested(n["metadata"]["name"])["cpu"]
            for n in cluster.list_nodes()[0]} == {f"node-{i:05d}": 2000 for i in range(3)}
    assert shard.stats.reserve_failures == 0
    assert_cluster_safe(cluster)
    assert_ledger_matches_cluster(ledger, cluster)


def test_unschedulable_pods_are_handed_off_with_kube_reasons(ledger):
    cluster = cluster_of(3, 7, node_cpu="2")  # room for 6
    big = uniform_pods(1, cpu="100", scheduler_name=SCHEDULER, prefix="big-")[0]
    picky = uniform_pods(1, scheduler_name=SCHEDULER, prefix="picky-")[0]
    picky["spec"]["nodeSelector"] = {"zone": "nowhere"}
    cluster.create_pods([big, picky])
    publish(ledger, cluster, A)
    rebalancer = RecordingRebalancer()
    shard = new_shard(ledger, cluster, rebalancer)

    assert shard.step() == 9

    assert len(bound_keys(cluster)) == 6
    handed = {h.qpi.key: h for h in rebalancer.by_reason(UNSCHEDULABLE_HERE)}
    assert len(rebalancer.items) == len(handed) == 3
    assert handed["default/big-00000"].message == "0/3 nodes are available: 3 Insufficient cpu."
    assert handed["default/big-00000"].reasons == {"Insufficient cpu": 3}
    assert handed["default/picky-00000"].message == (
        "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.")
    assert handed["default/picky-00000"].nodes == 3
    [surplus] = [k for k in handed if k.startswith("default/pod-")]
    assert handed[surplus].message == "0/3 nodes are available: 3 Insufficient cpu."
    # handed off = no longer this shard's: not queued, lease free, nothing assumed or reserved
    assert shard.pending_keys() == []
    assert all(lease_is_free(ledger, h.qpi.pod_info.uid) for h in handed.values())
    assert_cluster_safe(cluster)
    assert_ledger_matches_cluster(ledger, cluster)
    assert_no_pod_lost(cluster, [shard], rebalancer)


# ------------------------------------------------------------------- bind failures: one rollback


def _prebind(cluster: SimCluster) -> None:
    """Someone else binds the pod first (the shard has not heard of it yet)."""
    cluster.bind("default", "pod-00000", "node-00001")


def _delete_pod(cluster: SimCluster) -> None:
    cluster.delete_pod("default", "pod-00000")


def _delete_node(cluster: SimCluster) -> None:
    cluster.delete_node("node-00000")


@dataclass(frozen=True)
class BindFailure:
    faults: FaultConfig | None = None
    before: Callable[[SimCluster], None] | None = None
    code: int = 0
    handed_off: bool = False  # else requeued in this shard with backoff
    still_pending: bool = True  # the pod still waits for a node in the cluster


BIND_FAILURES = {
    "409-already-bound": BindFailure(before=_prebind, code=409, handed_off=True, still_pending=False),
    "409-injected": BindFailure(FaultConfig(bind_conflict_rate=1.0), code=409, handed_off=True),
    "404-pod-deleted": BindFailure(before=_delete_pod, code=404, handed_off=True, still_pending=False),
    "404-node-deleted": BindFailure(before=_delete_node, code=404, handed_off=True),
    "500-injected": BindFailure(FaultConfig(bind_error_rate=1.0), code=500),
}


@pytest.mark.parametrize("case", BIND_FAILURES.values(), ids=BIND_FAILURES.keys())
def test_a_failed_bind_rolls_back_through_one_path(ledger, case: BindFailure):
    """Reservation released, assume forgotten, lease released; a 5xx is retried by this shard
    with backoff; a 409/404 goes to the rebalancer, which knows from the watch whether the pod
    is still pending (a 409 or 404 is not proof that it is bound or gone: the conflict may be
    spurious, or the node may be the one that went away)."""
    cluster = cluster_of(1 if case.before is _delete_node else 2, 1, node_cpu="2", faults=case.faults)
    publish(ledger, cluster, A)
    rebalancer = RecordingRebalancer()
    shard = new_shard(ledger, cluster, rebalancer)
    uid = uid_of(cluster, "pod-00000")
    if case.before is not None:
        case.before(cluster)

    assert shard.step() == 1

    assert shard.stats.bound == 0
    assert_nothing_held(ledger, shard)
    assert shard.table.node_of(uid) is None
    assert lease_is_free(ledger, uid)
    if case.handed_off:
        [handoff] = rebalancer.by_reason(BIND_CONFLICT)
        assert handoff.qpi.key == "default/pod-00000" and str(case.code) in handoff.message
        assert shard.pending_keys() == []
    else:
        assert rebalancer.items == []
        assert shard.pending_keys() == ["default/pod-00000"]
        assert shard.stats.bind_errors == 1
    assert ("default/pod-00000" in cluster.invariants()["pods_unbound"]) == case.still_pending
    assert_cluster_safe(cluster)
    assert_no_pod_lost(cluster, [shard], rebalancer)


def test_a_retried_bind_succeeds_once_the_api_answers(ledger):
    cluster = cluster_of(2, 4, node_cpu="2", faults=FaultConfig(bind_error_rate=0.5))
    publish(ledger, cluster, A)
    shard = new_shard(ledger, cluster, RecordingRebalancer())

    drive([shard], all_bound(cluster))

    assert shard.stats.bind_errors > 0 and shard.stats.bound == 4
    assert_cluster_safe(cluster)
    assert_ledger_matches_cluster(ledger, cluster)


def test_a_bind_timeout_keeps_the_reservation_until_the_watch_tells(ledger):
    """504: the API may have applied the bind. Releasing the reservation would let the next pod
    take the capacity the bound pod uses (the kubelet would reject it: overcommit); the
    reservation stays until `observe` turns it into usage (or it expires)."""
    cluster = cluster_of(1, 2, node_cpu="1",
                         faults=FaultConfig(bind_timeout_rate=1.0, timeout_applied_fraction=1.0))
    publish(ledger, cluster, A)
    rebalancer = RecordingRebalancer()
    shard = new_shard(ledger, cluster, rebalancer, batch_size=1)
    first = uid_of(cluster, "pod-00000")

    assert shard.step() == 1  # bound, but the answer was lost
    assert bound_keys(cluster) == {"default/pod-00000"}
    assert ledger.node_usage("node-00000").reserved == {"cpu": 1000, "memory": 2**30, "pods": 1}
    assert set(shard.pending_keys()) == {"default/pod-00000", "default/pod-00001"}

    drive([shard], lambda: shard.stats.reserve_failures >= 1)  # pod-00001 finds no room in the ledger
    assert bound_keys(cluster) == {"default/pod-00000"}
    assert_cluster_safe(cluster)

    # the watch shows pod-00000 bound: its reservation becomes usage
    ledger.observe([BoundPod(first, "node-00000", PodInfo.from_object(cluster.get_pod("default", "pod-00000")).requests)])
    assert_ledger_matches_cluster(ledger, cluster)
    assert_no_pod_lost(cluster, [shard], rebalancer)


class LostAnswers:
    """A BindTarget whose first ``calls`` calls time out (504) without binding anything, as when
    the request never reached the API server."""

    def __init__(self, cluster: SimCluster, calls: int) -> None:
        self.cluster = cluster
        self.calls = calls

    def bind_many(self, bindings):
        if self.calls:
            self.calls -= 1
            return [BindResult(ns, name, node, 504, "Timeout", "the server was unable to return a response")
                    for ns, name, node, _ in bindings]
        return self.cluster.bind_many(bindings)


def test_a_reservation_left_by_a_lost_bind_blocks_its_node_for_one_ttl_only(ledger):
    """The kept reservation of a bind that timed out and was never applied makes the second check
    fail on its node; the shard's table then counts it (a shadow of the ledger), but only for one
    reservation TTL: afterwards the node's room is used again."""
    cluster = cluster_of(1, 2, node_cpu="1")
    publish(ledger, cluster, A)
    rebalancer = RecordingRebalancer()
    shard = new_shard(ledger, cluster, rebalancer, batch_size=1, reservation_ttl_ms=300)
    shard.cluster = LostAnswers(cluster, calls=1)

    assert shard.step() == 1  # pod-00000: 504, not bound; its reservation stays
    cluster.delete_pod("default", "pod-00000")  # ... and its owner deletes it
    shard.remove_pods(["default/pod-00000"])
    drive([shard], lambda: bool(rebalancer.items))  # pod-00001: no room in the ledger, then none in the table
    [(_, handoff)] = rebalancer.items
    assert handoff.qpi.key == "default/pod-00001" and handoff.reason == UNSCHEDULABLE_HERE

    time.sleep(0.3)
    shard.accept([handoff.qpi])  # the rebalancer sends it back: the coordinator's view has room
    drive([shard], all_bound(cluster))
    assert_cluster_safe(cluster)
    assert_ledger_matches_cluster(ledger, cluster)


class WatchBeforeAnswer:
    """A BindTarget whose binds are applied but answered 504, the watch (the coordinator's
    `apply_bound`) reaching the shard before the answer does."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.shard: Shard | None = None

    def bind_many(self, bindings):
        self.cluster.bind_many(bindings)
        for ns, name, node, _ in bindings:
            self.shard.apply_bound([(PodUsage.of(PodInfo.from_object(self.cluster.get_pod(ns, name))), node)])
        return [BindResult(ns, name, node, 504, "Timeout", "the server was unable to return a response")
                for ns, name, node, _ in bindings]


def test_a_rollback_does_not_forget_what_the_watch_confirmed(ledger):
    """A bind answered 504 although it was applied, and the watch showed the pod bound before the
    answer came: the rollback must forget only the shard's assume, not the confirmed pod (its
    table would then miss the pod for good), and the pod is not scheduled again."""
    cluster = cluster_of(2, 3, node_cpu="2")
    publish(ledger, cluster, A)
    rebalancer = RecordingRebalancer()
    shard = new_shard(ledger, cluster, rebalancer)
    shard.cluster = target = WatchBeforeAnswer(cluster)
    target.shard = shard

    drive([shard], lambda: not shard.pending_keys())

    assert cluster.invariants()["binds"] == 3 and cluster.invariants()["bind_conflicts"] == 0
    for node in cluster.list_nodes()[0]:
        name = node["metadata"]["name"]
        assert shard.table.requested_of(name) == cluster.requested(name), name
    assert_cluster_safe(cluster)
    ledger.observe([BoundPod(p["metadata"]["uid"], p["spec"]["nodeName"], PodInfo.from_object(p).requests)
                    for p in cluster.list_pods()[0]])
    assert_ledger_matches_cluster(ledger, cluster)


def test_a_pod_the_watch_shows_bound_is_not_scheduled_again(ledger):
    """A queued pod that the watch shows bound (here: by another scheduler) is done: no lease, no
    reservation, no bind (kube-scheduler skips assigned pods)."""
    cluster = cluster_of(2, 1, node_cpu="2")
    publish(ledger, cluster, A)
    rebalancer = RecordingRebalancer()
    shard = new_shard(ledger, cluster, rebalancer)
    cluster.bind("default", "pod-00000", "node-00001")
    pod = PodInfo.from_object(cluster.get_pod("default", "pod-00000"))
    shard.apply_bound([(PodUsage.of(pod), "node-00001")])
    ledger.observe([BoundPod(pod.uid, "node-00001", pod.requests)])

    assert shard.step() == 1

    assert shard.pending_keys() == [] and rebalancer.items == []
    assert cluster.invariants()["bind_conflicts"] == 0 and shard.stats.conflicts == 0
    assert shard.table.node_of(pod.uid) == "node-00001"
    assert_ledger_matches_cluster(ledger, cluster)


def test_a_pod_leased_by_a_dead_shard_is_bound_as_soon_as_the_lease_expires(ledger):
    """A crashed shard's lease blocks the pod until it expires (server time). Meanwhile every try is
    "held elsewhere", which is not a scheduling attempt: the pod is retried after the initial
    backoff each time instead of backing off exponentially past the lease's expiry (with kube's
    1 s doubling to 10 s, a 10 s lease could keep it waiting ~18 s; docs/design.md invariant 4)."""
    config = load_config("""\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
podInitialBackoffSeconds: 0.1
podMaxBackoffSeconds: 5
profiles:
- schedulerName: shardsched
""")
    cluster = cluster_of(1, 1)
    publish(ledger, cluster, A)
    uid = uid_of(cluster, "pod-00000")
    lease_ttl_s = 1.0
    assert ledger.acquire_leases([uid], "shard-9@1", int(lease_ttl_s * 1000))  # the dead shard's lease
    started = time.monotonic()
    shard = Shard(0, A, config, ledger, cluster, RecordingRebalancer(), ShardOptions(seed=0))
    shard.set_epoch(EPOCH)
    shard.apply_nodes(cluster.list_nodes()[0])
    shard.add_pods([PodInfo.from_object(cluster.get_pod("default", "pod-00000"))])

    drive([shard], all_bound(cluster), timeout_s=10)

    waited = time.monotonic() - started
    assert shard.stats.lease_busy >= 3
    assert lease_ttl_s <= waited <= lease_ttl_s + 2 * config.pod_initial_backoff_s + 0.1
    assert_cluster_safe(cluster)


def test_a_shard_stalled_between_reserve_and_bind_past_its_lease_does_not_bind(ledger):
    """Shard A reserves, then stalls (a GC pause, a frozen process) past its lease TTL; meanwhile
    another shard takes the pod's lease with a newer token. A must not bind with its stale token:
    it checks its leases right before binding (renewing them) and rolls the pod back."""
    cluster = cluster_of(1, 1)
    publish(ledger, cluster, A)
    uid = uid_of(cluster, "pod-00000")
    rebalancer = RecordingRebalancer()
    taken: dict[str, int] = {}

    class StallAfterReserve(HookedLedger):
        def reserve(self, *args: Any, **kwargs: Any):
            results = self._ledger.reserve(*args, **kwargs)
            time.sleep(0.3)  # past A's lease TTL
            taken.update(self._ledger.acquire_leases([uid], B, 10_000))  # B now holds the pod
            return results

    shard = new_shard(StallAfterReserve(ledger, lambda: None), cluster, rebalancer, lease_ttl_ms=200)

    assert shard.step() == 1

    assert taken and cluster.invariants()["binds"] == 0  # no bind under the stale token
    assert shard.stats.bound == 0 and "default/pod-00000" in shard.pending_keys()  # back in the queue
    assert_nothing_held(ledger, shard)
    assert_cluster_safe(cluster)


def test_a_shard_repartitioned_between_reserve_and_bind_does_not_bind(ledger):
    """A's Reserve succeeds, then the coordinator hands A's node to B (epoch 2) before A binds: A is
    a stale owner now. Its Permit is refused (FENCED): nothing bound, the pod goes to the rebalancer
    (which routes it to the new owner), its reservation and assume are dropped."""
    cluster = cluster_of(1, 1)
    publish(ledger, cluster, A)
    rebalancer = RecordingRebalancer()

    class HandOverAfterReserve(HookedLedger):
        def reserve(self, *args: Any, **kwargs: Any):
            results = self._ledger.reserve(*args, **kwargs)
            self._ledger.set_owners({"node-00000": B}, EPOCH + 1)
            return results

    shard = new_shard(HandOverAfterReserve(ledger, lambda: None), cluster, rebalancer)

    assert shard.step() == 1

    assert cluster.invariants()["binds"] == 0
    assert [h.qpi.key for h in rebalancer.by_reason(FENCED)] == ["default/pod-00000"]
    assert_nothing_held(ledger, shard)
    assert lease_is_free(ledger, uid_of(cluster, "pod-00000"))
    assert_no_pod_lost(cluster, [shard], rebalancer)


def test_a_lease_lost_before_reserve_does_not_lose_the_pod(ledger):
    """The shard stalls past the lease TTL between its scheduling cycle and Reserve: the ledger
    answers LEASE_LOST. Nobody else has the pod, so it must stay with the shard and bind later."""
    cluster = cluster_of(1, 1, node_cpu="2")
    publish(ledger, cluster, A)
    stalls = [0.2]

    def stall() -> None:
        if stalls:
            time.sleep(stalls.pop())

    rebalancer = RecordingRebalancer()
    shard = new_shard(HookedLedger(ledger, stall), cluster, rebalancer, lease_ttl_ms=100)

    assert shard.step() == 1
    assert shard.stats.bound == 0
    assert_nothing_held(ledger, shard)
    assert_no_pod_lost(cluster, [shard], rebalancer)

    drive([shard], all_bound(cluster))
    assert_cluster_safe(cluster)
    assert_ledger_matches_cluster(ledger, cluster)


# ------------------------------------------------------------------------------ Redis goes away


@pytest.fixture
def own_redis():
    """A Redis of this test alone (with an AOF, so a restart keeps the ledger), to stop."""
    server = EmbeddedRedis(appendonly=True).start()
    yield server
    server.stop()


def stop_redis(server: EmbeddedRedis) -> None:
    """Stop the server (SIGTERM: it writes its AOF out) and keep it stopped; `restart` brings it
    back on the same URL."""
    os.kill(server.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while server.running:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_redis_away_pauses_binding_and_loses_nothing(own_redis):
    ledger = Ledger(connect(own_redis.url, timeout_s=0.5, connect_timeout_s=0.2, retries=1), "t:")
    cluster = cluster_of(4, 20, node_cpu="8")
    publish(ledger, cluster, A)
    rebalancer = RecordingRebalancer()
    shard = new_shard(ledger, cluster, rebalancer, batch_size=5)

    assert shard.step() == 5
    assert len(bound_keys(cluster)) == 5

    stop_redis(own_redis)
    for _ in range(3):
        assert shard.step() == 5  # popped, then put back: no lease, no reservation, no bind
    assert len(bound_keys(cluster)) == 5
    assert shard.stats.paused_s > 0 and "Redis unavailable" in shard.last_error
    assert_no_pod_lost(cluster, [shard], rebalancer)
    assert len(shard.pending_keys()) == 15

    own_redis.restart()
    drive([shard], all_bound(cluster))
    assert shard.stats.bound == 20 and rebalancer.items == []
    assert_cluster_safe(cluster)
    assert_ledger_matches_cluster(ledger, cluster)


class StopRedisDuringBind:
    """A BindTarget that binds, then stops Redis before the shard can commit."""

    def __init__(self, cluster: SimCluster, server: EmbeddedRedis) -> None:
        self.cluster = cluster
        self.server = server

    def bind_many(self, bindings):
        results = self.cluster.bind_many(bindings)
        if self.server.running:
            stop_redis(self.server)
        return results


def test_redis_lost_between_bind_and_commit_converges_through_the_watch(own_redis):
    ledger = Ledger(connect(own_redis.url, timeout_s=0.5, connect_timeout_s=0.2, retries=1), "t:")
    cluster = cluster_of(2, 6, node_cpu="8")
    publish(ledger, cluster, A)
    rebalancer = RecordingRebalancer()
    shard = new_shard(ledger, cluster, rebalancer)
    shard.cluster = StopRedisDuringBind(cluster, own_redis)

    assert shard.step() == 6
    assert len(bound_keys(cluster)) == 6  # bound in the cluster (the truth), not committed
    assert shard.pending_keys() == []
    own_redis.restart()

    # what the coordinator's watch does with the bindings it sees
    ledger.observe([BoundPod(p["metadata"]["uid"], p["spec"]["nodeName"], PodInfo.from_object(p).requests)
                    for p in cluster.list_pods()[0]])
    assert_cluster_safe(cluster)
    assert_ledger_matches_cluster(ledger, cluster)


# ---------------------------------------------------------------- a stale shard map: two owners


def test_two_shards_racing_on_the_same_nodes_one_is_fenced(ledger):
    """Shard B still thinks it owns the nodes (a stale shard map); the ledger names A. Both race
    for the last capacity with different pods: A gets every unit of it, B is FENCED and hands its
    pods to the rebalancer; nothing is overcommitted or bound twice."""
    cluster = SimCluster(seed=0)
    cluster.create_nodes(uniform_nodes(2, cpu="2", memory="64Gi"))
    pods_a = uniform_pods(4, cpu="1", scheduler_name=SCHEDULER, prefix="a-")
    pods_b = uniform_pods(4, cpu="1", scheduler_name=SCHEDULER, prefix="b-")
    cluster.create_pods(pods_a + pods_b)
    publish(ledger, cluster, A)
    rebalancer = RecordingRebalancer()
    shard_a = new_shard(ledger, cluster, rebalancer, A, index=0, pods=pods_a)
    shard_b = new_shard(ledger, cluster, rebalancer, B, index=1, pods=pods_b)

    start = threading.Barrier(2)

    def race(shard: Shard) -> None:
        start.wait()
        shard.step()

    threads = [threading.Thread(target=race, args=(s,)) for s in (shard_a, shard_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert bound_keys(cluster) == {f"default/a-{i:05d}" for i in range(4)}
    fenced = rebalancer.by_reason(FENCED)
    assert {h.qpi.key for h in fenced} == {f"default/b-{i:05d}" for i in range(4)}
    assert len(rebalancer.items) == 4 and shard_b.stats.bound == 0
    assert all(shard_b.table.requested_of(n) == {} for n in ("node-00000", "node-00001"))
    assert all(lease_is_free(ledger, h.qpi.pod_info.uid) for h in fenced)
    assert cluster.invariants()["bind_conflicts"] == 0
    assert_cluster_safe(cluster)
    assert_ledger_matches_cluster(ledger, cluster)
    assert_no_pod_lost(cluster, [shard_a, shard_b], rebalancer)


def test_the_same_pod_routed_to_two_shards_is_bound_once(ledger):
    """Pods routed twice (a stale route), both shards running their loops: the pod lease lets one
    shard at a time work on a pod, and the stale owner is FENCED. One bind per pod, no conflict."""
    cluster = cluster_of(4, 16, node_cpu="4")
    publish(ledger, cluster, A)
    rebalancer = RecordingRebalancer()
    shards = [new_shard(ledger, cluster, rebalancer, m, index=i, batch_size=4) for i, m in enumerate((B, A))]
    threads = [threading.Thread(target=s.run_forever, daemon=True) for s in shards]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 10
        while not all_bound(cluster)() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        for s in shards:
            s.stop()
        for t in threads:
            t.join()

    shard_b, shard_a = shards
    assert len(bound_keys(cluster)) == 16 and shard_a.stats.bound == 16 and shard_b.stats.bound == 0
    assert {h.reason for _, h in rebalancer.items} <= {FENCED}
    inv = cluster.invariants()
    assert inv["binds"] == 16 and inv["bind_conflicts"] == 0
    assert_cluster_safe(cluster)
    assert_ledger_matches_cluster(ledger, cluster)


def test_a_map_changed_between_schedule_and_reserve_fences_the_old_owner(ledger):
    """B owns the nodes when it schedules; before its Reserve the coordinator publishes a new map
    (epoch 2) that gives them to A. B's reservation is refused (FENCED): its pods go to the
    rebalancer, its assumes are forgotten; A, at epoch 2, takes the capacity."""
    cluster = SimCluster(seed=0)
    cluster.create_nodes(uniform_nodes(1, cpu="2", memory="64Gi"))
    pods_a = uniform_pods(2, cpu="1", scheduler_name=SCHEDULER, prefix="a-")
    pods_b = uniform_pods(2, cpu="1", scheduler_name=SCHEDULER, prefix="b-")
    cluster.create_pods(pods_a + pods_b)
    publish(ledger, cluster, B, epoch=1)
    rebalancer = RecordingRebalancer()

    def hand_over() -> None:
        ledger.set_owners({"node-00000": A}, 2)

    shard_b = new_shard(HookedLedger(ledger, hand_over), cluster, rebalancer, B, index=1, pods=pods_b, epoch=1)
    shard_a = new_shard(ledger, cluster, rebalancer, A, index=0, pods=pods_a, epoch=2)

    assert shard_b.step() == 2
    assert {h.qpi.key for h in rebalancer.by_reason(FENCED)} == {"default/b-00000", "default/b-00001"}
    assert shard_b.table.requested_of("node-00000") == {} and shard_b.stats.bound == 0
    assert bound_keys(cluster) == set()

    assert shard_a.step() == 2
    assert bound_keys(cluster) == {"default/a-00000", "default/a-00001"}
    # a zombie B that never heard of the new map stays fenced off
    leftover = uniform_pods(1, cpu="1", scheduler_name=SCHEDULER, prefix="late-")
    cluster.create_pods(leftover)
    shard_b.add_pods([PodInfo.from_object(cluster.get_pod("default", "late-00000"))])
    assert shard_b.step() == 1  # its table does not know A's pods either: it tries, and is refused
    assert "default/late-00000" in {h.qpi.key for h in rebalancer.by_reason(FENCED)}
    assert bound_keys(cluster) == {"default/a-00000", "default/a-00001"}
    assert_cluster_safe(cluster)
    assert_ledger_matches_cluster(ledger, cluster)
    assert_no_pod_lost(cluster, [shard_a, shard_b], rebalancer)


# ---------------------------------------------------------------------------- binding cycles in the background


def run_in_thread(shard: Shard) -> threading.Thread:
    t = threading.Thread(target=shard.run_forever, daemon=True)
    t.start()
    return t


def test_background_binding_cycles_bind_each_pod_once_and_retire_waits_for_them(ledger):
    """binding_cycles=2 (as serve runs): the next batches are scheduled while earlier ones bind,
    500s are retried, and when the shard retires every binding cycle has ended and been applied:
    the ledger matches the cluster, nothing is left reserved or in flight."""
    cluster = cluster_of(8, 32, node_cpu="4", pod_cpu="1", faults=FaultConfig(bind_error_rate=0.3))
    publish(ledger, cluster, A)
    rebalancer = RecordingRebalancer()
    shard = new_shard(ledger, cluster, rebalancer, batch_size=3, binding_cycles=2)
    t = run_in_thread(shard)
    deadline = time.monotonic() + 20
    while cluster.invariants()["pods_unbound"]:
        assert time.monotonic() < deadline, "not everything was bound"
        time.sleep(0.01)
    left = shard.retire(timeout_s=10)
    t.join(5)
    assert left == [] and not t.is_alive()
    assert shard.stats.bound == 32 and shard.stats.bind_errors > 0
    assert not shard.binding.running
    assert_cluster_safe(cluster)
    assert_ledger_matches_cluster(ledger, cluster)
    assert rebalancer.items == []


def test_adaptive_batches_start_small_and_grow_while_the_api_server_binds(ledger):
    """With background binding cycles the adaptive batch starts at START_BATCH pods, so the first
    binds of a burst go out after a short scheduling cycle, then doubles the pods still binding;
    without them (the simulated run) a batch is the whole active queue up to max_batch_size.
    The API server answers no bind until the last pods are popped, however slow the machine."""
    cluster = cluster_of(16, 1000, node_cpu="64")
    publish(ledger, cluster, A)
    rebalancer = RecordingRebalancer()
    shard = new_shard(ledger, cluster, rebalancer, binding_cycles=2)
    answer, real_bind = threading.Event(), cluster.bind_many

    def held_bind(bindings):
        answer.wait(30)
        return real_bind(bindings)

    def answer_once_all_popped():
        deadline = time.monotonic() + 30
        while shard.queue.pending_counts()["active"] and time.monotonic() < deadline:
            time.sleep(0.01)
        answer.set()

    cluster.bind_many = held_bind
    threading.Thread(target=answer_once_all_popped, daemon=True).start()
    sizes = [shard.step(), shard.step(), shard.step()]  # the third waits for the first cycle's binds
    assert sizes == [START_BATCH, 2 * START_BATCH, 1000 - 3 * START_BATCH]
    shard.stop()
    shard.run_forever()  # returns at once (stopped), after applying the binding cycles still out
    assert shard.stats.bound == 1000 and rebalancer.items == []
    assert_cluster_safe(cluster)

    other = cluster_of(16, 1000, node_cpu="64")
    publish(ledger, other, B)
    assert new_shard(ledger, other, RecordingRebalancer(), B).step() == 1000


def test_a_batch_scheduled_while_another_binds_sees_its_pods(ledger):
    """The in-batch assume holds across batches: pods of a batch still binding are counted when
    the next batch is scheduled, so a full cluster is never overcommitted (the simulated kubelet
    admission rejects nothing) and the pods that do not fit are handed off as unschedulable."""
    cluster = cluster_of(4, 12, node_cpu="2", pod_cpu="1")
    publish(ledger, cluster, A)
    rebalancer = RecordingRebalancer()
    shard = new_shard(ledger, cluster, rebalancer, batch_size=2, binding_cycles=2)
    drive([shard], lambda: len(bound_keys(cluster)) == 8 and len(rebalancer.by_reason(UNSCHEDULABLE_HERE)) == 4)
    shard.stop()
    shard.run_forever()  # returns at once (stopped), after applying the binding cycles still out
    assert_cluster_safe(cluster)
    assert_ledger_matches_cluster(ledger, cluster)
    assert_no_pod_lost(cluster, [shard], rebalancer)


def test_a_conflict_in_a_background_binding_cycle_is_handed_off(ledger):
    cluster = cluster_of(2, 1, node_cpu="2", faults=FaultConfig(bind_conflict_rate=1.0))
    publish(ledger, cluster, A)
    rebalancer = RecordingRebalancer()
    shard = new_shard(ledger, cluster, rebalancer, binding_cycles=1)
    uid = uid_of(cluster, "pod-00000")
    assert shard.step() == 1  # scheduled and reserved; binding in the background
    drive([shard], lambda: bool(rebalancer.by_reason(BIND_CONFLICT)))
    assert_nothing_held(ledger, shard)
    assert shard.table.node_of(uid) is None and lease_is_free(ledger, uid)
    assert shard.pending_keys() == []
    assert_no_pod_lost(cluster, [shard], rebalancer)


def test_failed_binds_are_logged_at_most_once_per_period(ledger, caplog):
    cluster = cluster_of(2, 6, node_cpu="4", faults=FaultConfig(bind_error_rate=1.0))
    publish(ledger, cluster, A)
    shard = new_shard(ledger, cluster, RecordingRebalancer())
    with caplog.at_level("WARNING", logger="shardsched.sharding.shard"):
        assert shard.step() == 6
    lines = [r.getMessage() for r in caplog.records if "bind(s) failed" in r.getMessage()]
    assert len(lines) == 1 and "1 bind(s) failed" in lines[0] and "500" in lines[0]
    assert shard.stats.bind_errors == 6


def test_a_stopping_shard_does_not_wait_for_a_binding_cycle_to_start_another(ledger):
    """stop() while the shard waits for a free binding cycle: the waiting batch is not bound (its
    reservations and leases are released, its pods go back to the queue) and the step returns at
    once instead of after the binds in flight; those still end bound."""
    cluster = cluster_of(4, 4, node_cpu="2", pod_cpu="1")
    publish(ledger, cluster, A)
    gate = threading.Event()
    real_bind = cluster.bind_many

    def gated(bindings):
        gate.wait(30)
        return real_bind(bindings)

    cluster.bind_many = gated
    rebalancer = RecordingRebalancer()
    shard = new_shard(ledger, cluster, rebalancer, batch_size=2, binding_cycles=1)
    assert shard.step() == 2  # the first batch binds in the background, held at the gate
    shard.stop()
    t0 = time.monotonic()
    assert shard.step() == 2  # the second batch: scheduled and reserved, then rolled back
    assert time.monotonic() - t0 < 5, "the step waited for the binding cycle in flight"
    waiting = [p for p in shard.pending_keys() if p not in shard.queue.in_flight]
    assert len(waiting) == 2
    uids = [uid_of(cluster, key.split("/")[1]) for key in waiting]
    assert all(shard.table.node_of(uid) is None and lease_is_free(ledger, uid) for uid in uids)
    gate.set()
    shard.run_forever()  # stopped: returns once the first batch's binding cycle is applied
    assert len(bound_keys(cluster)) == 2 and not set(waiting) & bound_keys(cluster)
    assert_cluster_safe(cluster)
    assert_ledger_matches_cluster(ledger, cluster)
    assert_no_pod_lost(cluster, [shard], rebalancer)


def test_an_epoch_that_arrives_out_of_order_is_read_back_after_fenced(ledger):
    """Two map changes a moment apart: the shard's set_epoch calls run on several threads of its
    actor and the older one lands last, so the shard is an epoch behind although the ledger names
    it the owner. Its Reserve is FENCED once; it reads the epoch back from the ledger and the pods
    bind on their next attempt (before, it stayed FENCED for good)."""
    cluster = cluster_of(2, 4)
    publish(ledger, cluster, A, epoch=EPOCH + 1)
    rebalancer = RecordingRebalancer()
    shard = new_shard(ledger, cluster, rebalancer, A, epoch=EPOCH + 1)
    shard.set_epoch(EPOCH)  # the older call, last
    shard.step()
    assert {h.reason for _, h in rebalancer.items} == {FENCED} and shard.epoch == EPOCH + 1
    shard.add_pods([h.qpi.pod_info for _, h in rebalancer.items])  # as the rebalancer sends them back
    drive([shard], all_bound(cluster))
    assert len(bound_keys(cluster)) == 4
    assert_cluster_safe(cluster)


def test_a_replaced_incarnation_stays_fenced_after_reading_the_epoch(ledger):
    """Reading the epoch back does not let a stale owner in: the ledger names another member, so
    the old incarnation is FENCED again at the current epoch and binds nothing."""
    cluster = cluster_of(2, 4)
    publish(ledger, cluster, B, epoch=EPOCH + 1)
    rebalancer = RecordingRebalancer()
    old = new_shard(ledger, cluster, rebalancer, A, epoch=EPOCH)
    old.step()
    assert old.epoch == EPOCH + 1
    old.add_pods([h.qpi.pod_info for _, h in rebalancer.items])
    old.step()
    assert {h.reason for _, h in rebalancer.items} == {FENCED} and len(rebalancer.items) == 8
    assert bound_keys(cluster) == set() and old.stats.bound == 0


# ------------------------------------------------------------------------------------------ volumes


def storage_of(cluster: SimCluster) -> list[Any]:
    """The cluster's storage objects as views (what the coordinator sends `Shard.apply_storage`)."""
    from shardsched.cluster import STORAGE_KINDS, storage_changes

    return storage_changes([("ADDED", kind, o) for kind in STORAGE_KINDS for o in cluster.list_storage(kind)[0]]).upserts


def test_two_shards_choosing_one_pv_bind_it_once(ledger):
    """Two shards own one node each; one local PV (no node affinity) is the only volume of its
    WaitForFirstConsumer class, and each shard has a pod whose claim of that class is unbound. Both
    shards' catalogs offer the PV; the ledger reserves it once: the first shard's pod binds it
    (its claimRef written through PreBind), the second's Reserve is refused and rolled back (its
    catalog, its ledger reservation, its node), the pod retried; once the second shard sees the PV
    bound it reports kube's reason. Nothing is overcommitted, the PV is bound to one claim."""
    cluster = SimCluster(seed=0)
    cluster.create_nodes(uniform_nodes(2, cpu="2", memory="64Gi"))
    cluster.create_volume_object({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                                  "metadata": {"name": "local"}, "provisioner": "kubernetes.io/no-provisioner",
                                  "volumeBindingMode": "WaitForFirstConsumer"})
    cluster.create_volume_object({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-shared"},
                                  "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"],
                                           "storageClassName": "local", "hostPath": {"path": "/data"}}})
    pods = {}
    for who in ("a", "b"):
        cluster.create_volume_object({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                      "metadata": {"name": f"data-{who}", "namespace": "default"},
                                      "spec": {"storageClassName": "local", "accessModes": ["ReadWriteOnce"],
                                               "resources": {"requests": {"storage": "1Gi"}}}})
        [pod] = uniform_pods(1, cpu="1", scheduler_name=SCHEDULER, prefix=f"{who}-")
        pod["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": f"data-{who}"}}]
        pods[who] = cluster.create_pods([pod])[0]
    nodes, _ = cluster.list_nodes()
    infos = [NodeInfo.from_object(n) for n in nodes]
    ledger.upsert_nodes([NodeEntry(n.name, n.allocatable, m) for n, m in zip(infos, (A, B))])
    ledger.set_owners({infos[0].name: A, infos[1].name: B}, EPOCH)
    rebalancer = RecordingRebalancer()
    shards = {}
    for i, (who, member) in enumerate((("a", A), ("b", B))):
        shard = Shard(i, member, CONFIG, ledger, cluster, rebalancer, ShardOptions(seed=0))
        shard.set_epoch(EPOCH)
        shard.apply_nodes([nodes[i]])
        shard.apply_storage(storage_of(cluster), replace=True)
        shard.add_pods([PodInfo.from_object(pods[who])])
        shards[who] = shard

    assert shards["a"].step() == 1  # Reserve (the PV in the ledger), PreBind, Bind
    assert bound_keys(cluster) == {"default/a-00000"}
    assert cluster.get_volume_object("PersistentVolumeClaim", "data-a", "default")["spec"]["volumeName"] == "pv-shared"
    assert shards["b"].step() == 1  # its catalog still offers the PV: the ledger refuses it
    [q] = shards["b"].queue.pods()
    assert q.last_failure_reason == 'PersistentVolume "pv-shared" was chosen for another pod (the ledger\'s check)'
    catalog_b = shards["b"].table.volumes
    assert catalog_b.pvs["pv-shared"].claim_ref is None and catalog_b.pvcs["default/data-b"].volume_name == ""
    assert shards["b"].table.requested_of("node-00001") == {}
    assert ledger.release_volumes(pods["b"]["metadata"]["uid"], ["pv/pv-shared", "pvc/default/data-b"]) == 0

    shards["b"].apply_storage(storage_of(cluster), replace=True)  # the watch: the PV is bound now
    drive([shards["b"]], lambda: bool(rebalancer.items))
    [h] = rebalancer.by_reason(UNSCHEDULABLE_HERE)
    assert h.reasons == {"node(s) didn't find available persistent volumes to bind": 1}
    assert cluster.get_volume_object("PersistentVolumeClaim", "data-b", "default")["spec"].get("volumeName") is None
    assert_cluster_safe(cluster)
    assert_ledger_matches_cluster(ledger, cluster)
