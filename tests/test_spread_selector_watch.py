"""Services, ReplicationControllers, ReplicaSets and StatefulSets (the selectors of PodTopologySpread's
default constraints) delivered like the other kinds: stored and watched by the simulated cluster
(its ReplicaSet-like sets included), listed and watched by the Kubernetes backend (`KubeCluster`
and the real kubernetes client against `SimApiServer`), parsed at the coordinator's intake
(`spread_selector_changes`, a bad one logged and dropped) and sent to every shard, whose
scheduling then spreads a ReplicaSet's pods."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

from shardsched.cluster import ADDED, DELETED, MODIFIED, SPREAD_SELECTOR_KINDS, Forbidden, Invalid, NotFound, \
    spread_selector_changes
from shardsched.kube.cluster import KubeCluster
from shardsched.kube.permissions import PERMISSIONS
from shardsched.sim import SimCluster, uniform_nodes

from test_coordinator import World
from test_pdb_watch import wait_for

SCHED = "shardsched-test"


def service(name: str = "web", selector: dict | None = None, namespace: str = "default") -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"app": "web"} if selector is None else selector}}


def stateful_set(name: str = "db") -> dict:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}}, "serviceName": name,
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c"}]}}}}


def replica_set_spec(name: str = "web", replicas: int = 2) -> dict:
    return {"metadata": {"name": name},
            "spec": {"replicas": replicas, "template": {"metadata": {"labels": {"app": name}}, "spec": {
                "schedulerName": "shardsched",
                "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "500m"}}}]}}}}


# ------------------------------------------------------------------------- the simulated cluster
def test_simulated_cluster_stores_and_watches_them_with_its_sets():
    sim = SimCluster(seed=0)
    _, rv = sim.list_spread_selectors()
    sim.put_spread_selector(service())
    sim.put_spread_selector(service(selector={"app": "web", "tier": "fe"}))  # replaced: MODIFIED
    sim.put_spread_selector(stateful_set())
    rs = sim.create_replica_set(replica_set_spec())
    events, _ = sim.events_since(rv, SPREAD_SELECTOR_KINDS)
    assert [(e.type, e.kind, e.object["metadata"]["name"]) for e in events] == [
        (ADDED, "Service", "web"), (MODIFIED, "Service", "web"), (ADDED, "StatefulSet", "db"),
        (ADDED, "ReplicaSet", "web")]
    listed = {(o["kind"], o["metadata"]["name"]): o for o in sim.list_spread_selectors()[0]}
    assert listed[("ReplicaSet", "web")]["spec"]["selector"] == {"matchLabels": {"app": "web"}}
    assert listed[("ReplicaSet", "web")]["metadata"]["uid"] == rs["uid"]  # what its pods' ownerReference names
    assert listed[("Service", "web")]["spec"]["selector"] == {"app": "web", "tier": "fe"}
    assert set(SPREAD_SELECTOR_KINDS) <= sim.capabilities.kinds

    sim.delete_replica_set("default", "web")
    sim.delete_spread_selector("Service", "default", "web")
    with pytest.raises(NotFound):
        sim.delete_spread_selector("Service", "default", "web")
    assert [(o["kind"], o["metadata"]["name"]) for o in sim.list_spread_selectors()[0]] == [("StatefulSet", "db")]


def test_simulated_cluster_refuses_a_malformed_selector_naming_it():
    sim = SimCluster(seed=0)
    with pytest.raises(Invalid, match=r"ReplicaSet default/r: spec.selector.matchExpressions\[0\].operator"):
        sim.put_spread_selector({"kind": "ReplicaSet", "metadata": {"name": "r"},
                                 "spec": {"selector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}})
    with pytest.raises(Invalid, match="Service default/Bad_Name: metadata.name"):
        sim.put_spread_selector(service("Bad_Name"))
    assert sim.list_spread_selectors()[0] == []


def test_deleting_a_namespace_deletes_its_objects():
    sim = SimCluster(seed=0)
    sim.create_namespace({"metadata": {"name": "team"}})
    sim.put_spread_selector(service(namespace="team"))
    sim.put_spread_selector(service())
    sim.delete_namespace("team")
    assert [o["metadata"]["namespace"] for o in sim.list_spread_selectors()[0]] == ["default"]


# ---------------------------------------------------------------------------- the intake's parse
def test_changes_keep_each_objects_last_event_and_drop_a_bad_one_with_a_log_line(caplog):
    bad = {"kind": "ReplicaSet", "metadata": {"name": "r"}, "spec": {"selector": {"matchLabels": "app=web"}}}
    with caplog.at_level(logging.ERROR, logger="shardsched.cluster.spread"):
        upserts, removed = spread_selector_changes([
            (ADDED, service()), (MODIFIED, service(selector={"app": "db"})), (ADDED, stateful_set()),
            (DELETED, stateful_set()), (ADDED, bad), (ADDED, {"kind": "Service", "metadata": {}})])
    assert [(w.kind, w.name, w.selector.match_labels) for w in upserts] == [("Service", "web", (("app", "db"),))]
    assert removed == [("StatefulSet", "default", "db"), ("ReplicaSet", "default", "r")]
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("ReplicaSet default/r ignored: spec.selector.matchLabels") for m in messages), messages
    assert "Service without metadata.name ignored" in messages


# ---------------------------------------------------------------------------- the Kubernetes backend
@pytest.fixture
def cluster(simapi_spec):
    kc = KubeCluster(simapi_spec, [SCHED], watch_timeout_s=5)
    yield kc
    kc.stop()


def test_kube_backend_lists_and_watches_them(simapi, cluster):
    sim = simapi.sim
    sim.put_spread_selector(service("before"))
    listed, rv = cluster.list_spread_selectors()
    assert [(o["apiVersion"], o["kind"], o["metadata"]["name"]) for o in listed] == [("v1", "Service", "before")]
    assert set(SPREAD_SELECTOR_KINDS) <= cluster.capabilities.kinds

    sim.put_spread_selector(stateful_set())
    sim.create_replica_set({**replica_set_spec(replicas=0)})
    sim.delete_spread_selector("Service", "default", "before")
    seen: list[tuple[str, str, str, str]] = []

    def all_seen() -> bool:
        nonlocal rv
        events, rv = cluster.events_since(rv, SPREAD_SELECTOR_KINDS)
        seen.extend((e.type, e.kind, e.object["apiVersion"], e.object["metadata"]["name"]) for e in events)
        return len(seen) >= 3

    wait_for(all_seen, what="the watch events")
    assert sorted(seen) == sorted([(ADDED, "StatefulSet", "apps/v1", "db"), (ADDED, "ReplicaSet", "apps/v1", "web"),
                                   (DELETED, "Service", "v1", "before")])
    upserts, _ = spread_selector_changes((ADDED, o) for o in cluster.list_spread_selectors()[0])
    assert sorted((w.kind, w.name) for w in upserts) == [("ReplicaSet", "web"), ("StatefulSet", "db")]


def test_a_list_denied_by_rbac_is_forbidden_and_named(simapi, cluster):
    simapi.deny("list", "services")
    with pytest.raises(Forbidden, match="services"):
        cluster.list_nodes()  # the first list syncs every watch
    assert cluster.missing_permissions() == ["list services"]
    assert {("list", "", "services"), ("watch", "apps", "statefulsets")} <= set(PERMISSIONS)


# ---------------------------------------------------------------------- the coordinator and shards
def _zoned_world(ledger, shards: int) -> World:
    cluster = SimCluster(seed=0)
    cluster.create_nodes(uniform_nodes(1, cpu="32", memory="64Gi", prefix="big-"))
    return World(ledger, n_nodes=3, shards=shards, cluster=cluster)  # and node-00000..2: 4 cpus, 16 GiB


def test_the_intake_sends_every_change_to_every_shard(ledger):
    world = _zoned_world(ledger, shards=2)
    world.cluster.put_spread_selector(service())
    world.coordinator.poll_watch()
    assert all(len(s.table.spread_selectors) == 1 for s in world.shards.values())
    world.cluster.delete_spread_selector("Service", "default", "web")
    world.cluster.put_spread_selector(stateful_set())
    world.coordinator.poll_watch()
    assert all([w.kind for w in s.table.spread_selectors.objects()] == ["StatefulSet"]
               for s in world.shards.values())
    # a relist replaces the set, in the coordinator and in every shard
    world.cluster.put_spread_selector(service("other"))
    world.coordinator.relist()
    assert all(sorted(w.name for w in s.table.spread_selectors.objects()) == ["db", "other"]
               for s in world.shards.values())


@pytest.mark.parametrize("known, spread", [(True, True), (False, False)], ids=["replicaset-watched", "not-watched"])
def test_a_shard_spreads_a_replica_sets_pods(ledger, known, spread):
    """One big node (32 cpus) and three small ones: LeastAllocated alone piles 4 replicas on the big
    one; with their ReplicaSet watched, the system default constraints put one on each node
    (tests/test_default_spread.py works the scores out)."""
    world = _zoned_world(ledger, shards=1)
    world.cluster.create_replica_set(replica_set_spec(replicas=4))
    if not known:
        world.cluster.delete_replica_set("default", "web")  # the object goes, its pods stay
    world.settle()
    nodes = Counter(p["spec"]["nodeName"] for p in world.cluster.list_pods()[0])
    assert sum(nodes.values()) == 4
    if spread:
        assert nodes == {"big-00000": 1, "node-00000": 1, "node-00001": 1, "node-00002": 1}, nodes
    else:
        assert nodes == {"big-00000": 4}, nodes
