"""`SimClusterHost`, the embedded run's simulated cluster: its progress counts, kept as pods are
written, match a scan of the pods; its bind times are those of the binds applied."""

from __future__ import annotations

import time

import pytest

from shardsched.cluster import Binding
from shardsched.sharding.binding_cycle import CREATED_AT_ANNOTATION
from shardsched.sharding.sim_actor import SimClusterHost, unschedulable
from shardsched.sim import FaultConfig, uniform_nodes, uniform_pods


@pytest.fixture
def host(monkeypatch) -> SimClusterHost:
    monkeypatch.setenv("SHARDSCHED_GC", "default")  # leave the test process' collector alone
    h = SimClusterHost(seed=1)
    h.create_nodes(uniform_nodes(3, cpu="2", memory="4Gi"))
    return h


def scanned(h: SimClusterHost) -> tuple[int, int]:
    pods, _ = h.list_pods()
    unbound = [p for p in pods if not p["spec"].get("nodeName")]
    return len(unbound), sum(1 for p in unbound if unschedulable(p))


UNSCHEDULABLE_CONDITION = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3"}


def test_progress_counts_follow_creates_binds_conditions_and_deletes(host):
    pods = uniform_pods(6, cpu="1", memory="1Gi")
    pods[5]["spec"]["nodeName"] = "node-00002"  # created bound
    host.create_pods(pods)
    host.set_pod_condition("default", "pod-00000", UNSCHEDULABLE_CONDITION)
    host.set_pod_condition("default", "pod-00001", UNSCHEDULABLE_CONDITION)
    host.set_pod_condition("default", "pod-00001", UNSCHEDULABLE_CONDITION)  # unchanged: no write
    host.bind_many([Binding("default", "pod-00001", "node-00000"), Binding("default", "pod-00002", "node-00000"),
                    Binding("default", "pod-00003", "node-00001")])
    host.delete_pod("default", "pod-00000")
    host.delete_pod("default", "pod-00002")

    got = host.progress()
    assert (got["unbound"], got["unschedulable"]) == scanned(host) == (1, 0)
    assert got["pods"] == 4 and got["bound"] == 3 and got["binds"] == 3
    assert got["deleted_bound"] == 1 and got["deleted_unbound"] == 1

    host.set_pod_condition("default", "pod-00004", UNSCHEDULABLE_CONDITION)
    got = host.progress()
    assert (got["unbound"], got["unschedulable"]) == scanned(host) == (1, 1)


def test_bind_times_are_those_of_the_binds_applied(monkeypatch):
    monkeypatch.setenv("SHARDSCHED_GC", "default")
    # every bind times out, and every one of them is applied: the pods are bound all the same
    host = SimClusterHost(seed=1, faults=FaultConfig(bind_timeout_rate=1.0, timeout_applied_fraction=1.0))
    host.create_nodes(uniform_nodes(2))
    pods = uniform_pods(3)
    created = time.time() - 0.5
    for p in pods[:2]:
        p["metadata"]["annotations"] = {CREATED_AT_ANNOTATION: str(created)}
    host.create_pods(pods)
    before = time.time()
    results = host.bind_many([Binding("default", p["metadata"]["name"], "node-00000") for p in pods])
    after = time.time()

    assert [r.code for r in results] == [504] * 3
    times = host.bind_times()
    assert len(times["timeline"]) == 3 and all(before <= t <= after and n == 1 for t, n in times["timeline"])
    assert len(times["latencies_s"]) == 2  # the third pod has no creation time
    assert all(before - created <= lat <= after - created for lat in times["latencies_s"])
