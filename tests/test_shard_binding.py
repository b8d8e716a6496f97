"""A shard's binding cycle with plugins of its profile beside the ledger's, on a real Redis ledger
and a real `SimCluster`: the rollback order (the profile's Unreserve before the ledger's, then the
table forgets and the lease goes), the ledger's idempotent Unreserve, and a Permit that Waits until
the pod is allowed, rejected, or times out, through the framework's `Handle`."""

from __future__ import annotations

import time

import pytest

from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import PermitPlugin, ReservePlugin
from shardsched.framework.status import Code, Status
from shardsched.sharding.shard_plugins import LEASES_KEY, LedgerPlugin
from test_shard import (RecordingRebalancer, all_bound, assert_cluster_safe, assert_ledger_matches_cluster, cluster_of,
                        new_shard, publish)


class Refuser(ReservePlugin):
    """A profile Reserve plugin after the ledger: refuses the pods named in ``refuse``; its Unreserve
    records, per call, the pods and what the ledger still reserves for them at that moment."""

    name = "Refuser"

    def __init__(self, ledger, refuse: set[str]) -> None:
        self.ledger, self.refuse = ledger, refuse
        self.unreserved: list[tuple[list[str], dict[str, int]]] = []

    def reserve(self, state, pods, nodes):
        return [Status.unschedulable("refused") if p.name in self.refuse else Status.success() for p in pods]

    def unreserve(self, state, pods, nodes):
        self.unreserved.append(([p.name for p in pods], dict(self.ledger.node_usage(nodes[0]).reserved)))


class Gang(PermitPlugin):
    """A profile Permit plugin: every pod Waits (``timeout_s``) until the test allows or rejects it."""

    name = "Gang"

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    def permit(self, state, pods, nodes):
        return [(Status(Code.WAIT), self.timeout_s)] * len(pods)


def lease_holder(ledger, pod, node: str) -> str | None:
    return ledger.fence_views([(pod.uid, node)])[2][0].holder


def test_a_profile_reserve_rejection_rolls_back_in_reverse_order_with_real_redis(ledger):
    """The profile's plugin rejects pod-00001 after the ledger reserved it: its Unreserve runs
    while the ledger still holds the reservation, then the ledger's releases it, the table forgets
    the pod, the lease is released; the pod goes back to the queue and the other binds."""
    cluster = cluster_of(1, 2, node_cpu="4")
    publish(ledger, cluster, "shard-0@1")
    rebalancer = RecordingRebalancer()
    shard = new_shard(ledger, cluster, rebalancer, batch_size=2)
    refuser = Refuser(ledger, {"pod-00001"})
    shard.binding.default.reserve_plugins.append(refuser)
    refused = next(q.pod_info for q in shard.queue.pods() if q.pod_info.name == "pod-00001")

    assert shard.step() == 2
    assert refuser.unreserved == [(["pod-00001"], {"pods": 2, "cpu": 2000, "memory": 2 * 2**30})]
    node = "node-00000"
    assert ledger.node_usage(node).reserved == {}  # the ledger's Unreserve ran after: released
    assert ledger.node_usage(node).used == {"pods": 1, "cpu": 1000, "memory": 2**30}  # pod-00000 committed
    assert shard.table.node_of(refused.uid) is None  # forgotten
    assert lease_holder(ledger, refused, node) is None  # released
    assert "default/pod-00001" in shard.pending_keys()
    assert [q.last_failure_reason for q in shard.queue.pods()] == ["refused"]
    assert_cluster_safe(cluster)


def test_the_ledger_unreserve_is_idempotent_and_safe_without_reserve(ledger):
    cluster = cluster_of(1, 2, node_cpu="4")
    publish(ledger, cluster, "shard-0@1")
    shard = new_shard(ledger, cluster, RecordingRebalancer())
    plugin = LedgerPlugin(shard)
    shard.set_epoch(1)
    pods = [q.pod_info for q in shard.queue.pods()]
    nodes = ["node-00000"] * len(pods)
    tokens = ledger.acquire_leases([p.uid for p in pods], shard.member, 10_000)

    never = CycleState({LEASES_KEY: tokens})
    plugin.unreserve(never, pods, nodes)  # reserve never ran
    assert ledger.node_usage("node-00000").reserved == {}

    state = CycleState({LEASES_KEY: tokens})
    assert all(st.is_success() for st in plugin.reserve(state, pods, nodes))
    assert ledger.node_usage("node-00000").reserved["pods"] == 2
    plugin.unreserve(state, pods[:1], nodes[:1])
    plugin.unreserve(state, pods[:1], nodes[:1])  # again: no effect
    assert ledger.node_usage("node-00000").reserved == {"pods": 1, "cpu": 1000, "memory": 2**30}
    plugin.unreserve(state, pods, nodes)
    assert ledger.node_usage("node-00000").reserved == {}


@pytest.mark.parametrize("verdict", ["allow", "reject", "timeout"])
def test_a_permit_wait_holds_the_pod_until_allowed_rejected_or_timed_out(ledger, verdict: str):
    """A profile Permit plugin Waits (as a gang's does until its siblings are reserved): the pod stays
    reserved in the ledger and waits in the framework's Handle while its binding cycle runs in the
    background; allowed it binds; rejected or timed out it is rolled back (reservation and lease
    released, forgotten in the table) and goes back to the queue with the plugin's message."""
    cluster = cluster_of(1, 1, node_cpu="4")
    publish(ledger, cluster, "shard-0@1")
    shard = new_shard(ledger, cluster, RecordingRebalancer(), binding_cycles=1)
    shard.binding.default.permit_plugins.append(Gang(timeout_s=0.2 if verdict == "timeout" else 30.0))
    handle = shard.default_scheduler.framework.handle
    [pod] = [q.pod_info for q in shard.queue.pods()]
    assert shard.step() == 1  # scheduled and reserved; Permit and Bind run in the background
    if verdict != "timeout":
        deadline = time.monotonic() + 10
        while handle.get_waiting_pod(pod.uid) is None:
            assert time.monotonic() < deadline, "the pod never waited at Permit"
            time.sleep(0.005)
        waiting = handle.get_waiting_pod(pod.uid)
        assert waiting.get_pending_plugins() == ["Gang"] and waiting.node == "node-00000"
        assert ledger.node_usage("node-00000").reserved["pods"] == 1  # reserved while it waits
        if verdict == "allow":
            waiting.allow("Gang")
        else:
            waiting.reject("Gang", "a sibling found no room")
    assert shard.binding.reap(block=True) == 1
    assert handle.get_waiting_pod(pod.uid) is None
    if verdict == "allow":
        assert all_bound(cluster)()
        assert_ledger_matches_cluster(ledger, cluster)
    else:
        reason = "a sibling found no room" if verdict == "reject" else \
            "rejected due to timeout after waiting 0.2s at plugin Gang"
        assert [q.last_failure_reason for q in shard.queue.pods()] == [reason]
        assert cluster.invariants()["pods_unbound"] == ["default/pod-00000"]
        assert ledger.node_usage("node-00000").reserved == {}
        assert lease_holder(ledger, pod, "node-00000") is None
        assert shard.table.node_of(pod.uid) is None
    assert_cluster_safe(cluster)
