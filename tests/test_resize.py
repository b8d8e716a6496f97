"""In-place pod resize accounting, table-driven against upstream's ``PodRequests`` with
``UseStatusResources`` (k8s.io/component-helpers/resource): the effective requests from the spec
and the container statuses, the NodeTable and the Redis ledger moving a counted pod's usage, the
simulated cluster's kubelet answer (actuated, Deferred, Infeasible), and the sharded runtime keeping
a node mid-resize from being overcommitted; bad and absurd resizes are refused or logged, never a
crash."""

from __future__ import annotations

import logging

import pytest

from builders import node, pod, table_of
from shardsched.api.requests import pod_requests
from shardsched.cache.node_table import PodUsage
from shardsched.errors import InvalidObjectError
from shardsched.sim import SimCluster, uniform_nodes, uniform_pods
from shardsched.cluster import Invalid
from shardsched.store.ledger import BoundPod, LedgerCode, NodeEntry

from test_coordinator import World

INFEASIBLE = {"type": "PodResizePending", "status": "True", "reason": "Infeasible"}
DEFERRED = {"type": "PodResizePending", "status": "True", "reason": "Deferred"}


def resized(spec_cpu: str, alloc: str | None = None, actual: str | None = None, conditions=(), **status) -> dict:
    """Containers a (``spec_cpu``, with a status of ``alloc``/``actual`` when given) and b (1 cpu,
    allocated and actuated 1)."""
    a = {"name": "a"}
    if alloc is not None:
        a["allocatedResources"] = {"cpu": alloc}
    if actual is not None:
        a["resources"] = {"requests": {"cpu": actual}}
    b = {"name": "b", "allocatedResources": {"cpu": "1"}, "resources": {"requests": {"cpu": "1"}}}
    return {"spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": spec_cpu}}},
                                    {"name": "b", "resources": {"requests": {"cpu": "1"}}}]},
            "status": {"containerStatuses": [a, b], "conditions": list(conditions), **status}}


# ------------------------------------------------------------------------------- PodRequests
@pytest.mark.parametrize(
    "obj, cpu",
    [
        ({"spec": resized("2")["spec"]}, 3000),  # no statuses (a pending pod): the spec
        (resized("1", "1", "1"), 2000),  # nothing resized
        (resized("3", "1", "1"), 4000),  # resize up asked, not allocated yet: the spec counts
        (resized("500m", "1", "1"), 2000),  # resize down asked: the allocated 1 still counts
        (resized("500m", "500m", "1"), 2000),  # allocated down, not yet actuated: the actual 1
        (resized("500m", "500m", "500m"), 1500),  # done
        (resized("3", "1", "1", [DEFERRED]), 4000),  # Deferred: the spec still counts
        (resized("64", "1", "1", [INFEASIBLE]), 2000),  # Infeasible: the spec is left out
        (resized("64", "1", "2", [INFEASIBLE]), 3000),  # ... max(actuated, allocated)
        (resized("64", "1", "1", resize="Infeasible"), 2000),  # before v1.33: status.resize
        (resized("3", "1"), 4000),  # allocated only: the actual falls back to it, the spec is higher
        (resized("3", None, "2"), 4000),  # actual only: allocated falls back to the spec
        (resized("64", None, None, [INFEASIBLE]), 1000),  # a's status has neither: nothing of a
    ],
    ids=["pending", "unchanged", "up-asked", "down-asked", "down-allocated", "down-done", "deferred",
         "infeasible", "infeasible-actual-higher", "infeasible-legacy", "allocated-only", "actual-only",
         "infeasible-without-status-values"],
)
def test_pod_requests_with_status_resources(obj, cpu):
    assert pod_requests(obj)["cpu"] == cpu


def test_a_sidecar_resize_counts_in_the_sum_and_in_the_init_max():
    """A sidecar (restartPolicy Always) allocated 2 cpus while its spec says 1: the app containers'
    sum gets 2, and the classic init container declared after it runs beside 2."""
    obj = {"spec": {"initContainers": [{"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
                                       {"name": "init", "resources": {"requests": {"cpu": "3"}}}],
                    "containers": [{"name": "app", "resources": {"requests": {"cpu": "1"}}}]},
           "status": {"initContainerStatuses": [{"name": "side", "allocatedResources": {"cpu": "2"}}],
                      "containerStatuses": [{"name": "app", "allocatedResources": {"cpu": "1"}}]}}
    assert pod_requests(obj)["cpu"] == 5000  # allocated: max(1 + 2, 2 + 3) = 5; the spec's max(2, 4)


@pytest.mark.parametrize(
    "status, path",
    [
        ({"containerStatuses": [{"name": "a", "allocatedResources": {"cpu": "lots"}}]},
         "status.containerStatuses[0].allocatedResources.cpu"),
        ({"containerStatuses": [{"name": "a", "resources": {"requests": {"cpu": "1e30"}}}]},
         "status.containerStatuses[0].resources.requests.cpu"),
        ({"containerStatuses": "a"}, "status.containerStatuses"),
    ],
    ids=["not-a-quantity", "absurd", "not-a-list"],
)
def test_a_malformed_or_absurd_status_is_refused_naming_the_field(status, path):
    with pytest.raises(InvalidObjectError) as e:
        pod_requests({"spec": {"containers": [{"name": "a"}]}, "status": status})
    assert e.value.path == path


# ------------------------------------------------------------------------- NodeTable and ledger
def test_the_table_counts_a_resized_pod_again():
    p = pod("p", cpu="1").on("n1")
    table = table_of(node("n1"), pods=[p])
    cpu = table.res_index["cpu"]
    bigger = p.info()
    bigger.requests = {**bigger.requests, "cpu": 3000}
    assert table.add_pod(PodUsage.of(bigger), "n1")
    assert table.requested[cpu, table.index["n1"]] == 3000
    assert table.add_pod(PodUsage.of(bigger), "n1")  # idempotent
    assert table.requested[cpu, table.index["n1"]] == 3000 and len(table.pod_slot) == 1


def test_the_ledger_moves_a_resized_pods_usage(ledger):
    ledger.upsert_nodes([NodeEntry("n1", {"cpu": 4000, "pods": 10})])
    one = {"cpu": 1000}
    assert ledger.observe([BoundPod("u1", "n1", one)]) == {"u1": LedgerCode.ADDED}
    assert ledger.observe([BoundPod("u1", "n1", one)]) == {"u1": LedgerCode.ALREADY}
    assert ledger.observe([BoundPod("u1", "n1", {"cpu": 3000})]) == {"u1": LedgerCode.RESIZED}
    assert ledger.node_usage("n1").used == {"cpu": 3000, "pods": 1}
    assert ledger.observe([BoundPod("u1", "n1", {"cpu": 500})]) == {"u1": LedgerCode.RESIZED}
    assert ledger.node_usage("n1").used == {"cpu": 500, "pods": 1}


# ------------------------------------------------------------------- the simulated kubelet
def _bound(sim: SimCluster, name: str, cpu: str, node_name: str = "node-00000") -> dict:
    [p] = uniform_pods(1, cpu=cpu, prefix=name)
    p["metadata"]["name"] = name
    sim.create_pod(p)
    sim.bind("default", name, node_name)
    return sim.get_pod("default", name)


@pytest.mark.parametrize(
    "new_cpu, reason, used",
    [("2", None, 3000), ("3", "Deferred", 2000), ("64", "Infeasible", 2000)],
    ids=["actuated", "deferred", "infeasible"],
)
def test_simulated_kubelet_answers_a_resize(new_cpu, reason, used):
    """Node 4 cpus: a and b (1 cpu each) bound, c resized from 0 to 1 (actuated: 3 used); then a
    resized to ``new_cpu``: 2 fits (4 used), 3 does not now (Deferred), 64 never (Infeasible)."""
    sim = SimCluster(seed=0)
    sim.create_nodes(uniform_nodes(1, cpu="4"))
    _bound(sim, "a", "1")
    _bound(sim, "b", "1")
    _bound(sim, "c", "0")
    sim.resize_pod("default", "c", {"main": {"cpu": "1"}})  # c: 0 -> 1, actuated: used 3
    out = sim.resize_pod("default", "a", {"main": {"cpu": new_cpu}})
    pending = [c for c in out["status"]["conditions"] if c["type"] == "PodResizePending"]
    assert [c["reason"] for c in pending] == ([reason] if reason else [])
    assert sim.requested("node-00000")["cpu"] == used + 1000
    assert out["status"]["containerStatuses"][0]["allocatedResources"]["cpu"] == (new_cpu if reason is None else "1")
    if reason == "Infeasible":
        assert pending[0]["message"] == "Node didn't have enough capacity: cpu, requested: 64000, capacity: 4000"


def test_simulated_cluster_refuses_a_bad_resize_naming_it():
    sim = SimCluster(seed=0)
    sim.create_nodes(uniform_nodes(1, cpu="4"))
    _bound(sim, "a", "1")
    with pytest.raises(Invalid, match=r"pod default/a: spec.containers\[0\].resources.requests.cpu: quantity '1e30' "
                                      "for cpu is too large"):
        sim.resize_pod("default", "a", {"main": {"cpu": "1e30"}})
    with pytest.raises(Invalid, match="no container named 'x'"):
        sim.resize_pod("default", "a", {"x": {"cpu": "1"}})
    sim.create_pod(uniform_pods(1, prefix="pending-")[0])
    with pytest.raises(Invalid, match="only a bound pod"):
        sim.resize_pod("default", "pending-00000", {"main": {"cpu": "1"}})
    assert sim.requested("node-00000")["cpu"] == 1000


# ----------------------------------------------------------------------- the sharded runtime
def _world(ledger, *sizes: str) -> World:
    """One 4-cpu node, one shard, and pods of ``sizes`` cpus bound there."""
    world = World(ledger, n_nodes=1, shards=1)
    for i, cpu in enumerate(sizes):
        _bound(world.cluster, f"old-{i}", cpu)
    world.settle()
    return world


@pytest.mark.parametrize(
    "resizes, counted, fits",
    [
        ([("old-0", "3")], 4000, 0),  # actuated: 3 + 1, the node is full
        ([("old-1", "2"), ("old-0", "3")], 5000, 0),  # old-0's 3 + 2 > 4: Deferred, its spec still counts
        ([("old-0", "100000")], 2000, 2),  # Infeasible: the spec is left out, 1 + 1
    ],
    ids=["actuated-to-full", "deferred-holds-the-room", "infeasible-absurd-size"],
)
def test_a_node_mid_resize_is_not_overcommitted(ledger, resizes, counted, fits):
    """old-0 and old-1 (1 cpu each) on a 4-cpu node, resized in place; the coordinator's table, the
    shard's and the ledger count upstream's PodRequests with status resources; then two 1-cpu pods
    come: as many bind as that count leaves room for, and the kubelet rejects none."""
    world = _world(ledger, "1", "1")
    for name, cpu in resizes:
        world.cluster.resize_pod("default", name, {"main": {"cpu": cpu}})
    world.settle()
    shard = world.shards[0]
    cpu_row = shard.table.res_index["cpu"]
    assert world.ledger.node_usage("node-00000").used["cpu"] == counted
    assert int(shard.table.requested[cpu_row, shard.table.index["node-00000"]]) == counted
    coordinator_table = world.coordinator.state.table
    assert int(coordinator_table.requested[cpu_row, coordinator_table.index["node-00000"]]) == counted
    world.cluster.create_pods(uniform_pods(2, cpu="1", scheduler_name="shardsched", prefix="new-"))
    world.settle(parked_ok=True)
    pods = {p["metadata"]["name"]: p for p in world.cluster.list_pods()[0]}
    assert sum(bool(pods[n]["spec"].get("nodeName")) for n in ("new-00000", "new-00001")) == fits
    assert world.cluster.invariants()["admission_rejections"] == 0


def test_an_unreadable_resize_is_logged_and_the_old_usage_kept(ledger, caplog):
    """An update whose status cannot be read (from a real API server: the simulated one refuses
    it): logged with the pod and the field; the pod keeps counting what it did."""
    world = _world(ledger, "1")
    obj = world.cluster.get_pod("default", "old-0")
    bad = {**obj, "status": {**obj["status"], "containerStatuses": [
        {"name": "main", "allocatedResources": {"cpu": "1e30"}}]}}
    with caplog.at_level(logging.ERROR, logger="shardsched.sharding.coordinator.intake"):
        world.coordinator.intake._apply_pods([("MODIFIED", bad)])
    assert any("pod default/old-0 on node-00000: its resize cannot be read (status.containerStatuses[0]."
               "allocatedResources.cpu: quantity '1e30' for cpu is too large)" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert world.ledger.node_usage("node-00000").used["cpu"] == 1000
