"""PodDisruptionBudgets delivered like the other kinds: listed and watched by the Kubernetes
backend (`KubeCluster` and the real kubernetes client against `SimApiServer`), served by the
simulated cluster's ``events_since``, and parsed at the coordinator's intake (`apply_pdb_events`),
where a bad one is a log line and skipped."""

from __future__ import annotations

import logging
import time

import pytest

from shardsched.api.disruption import PodDisruptionBudget
from shardsched.cluster import ADDED, DELETED, MODIFIED, PDB, Forbidden, apply_pdb_events
from shardsched.kube.cluster import KubeCluster
from shardsched.kube.permissions import PERMISSIONS

from builders import pod

SCHED = "shardsched-test"


def budget(name: str = "web", **spec) -> dict:
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, **spec}}


def web_pod(sim, name: str) -> dict:
    p = pod(name, cpu="100m")
    p["metadata"].pop("uid")
    p["metadata"]["labels"] = {"app": "web"}
    p["spec"]["nodeName"] = "n0"
    return sim.create_pod(p)


def wait_for(check, timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def cluster(simapi_spec):
    kc = KubeCluster(simapi_spec, [SCHED], watch_timeout_s=5)
    yield kc
    kc.stop()


def test_kube_backend_lists_and_watches_pdbs(simapi, cluster):
    sim = simapi.sim
    web_pod(sim, "w1")
    sim.create_pdb(budget("before", minAvailable=1))
    listed, rv = cluster.list_pdbs()
    assert [(p["apiVersion"], p["kind"], p["metadata"]["name"], p["status"]["disruptionsAllowed"])
            for p in listed] == [("policy/v1", PDB, "before", 0)]
    assert PDB in cluster.capabilities.kinds

    sim.create_pdb(budget("after", maxUnavailable=1))
    web_pod(sim, "w2")  # both budgets' status change
    sim.delete_pdb("default", "before")
    seen: list[tuple[str, str, int]] = []

    def all_seen() -> bool:
        nonlocal rv
        events, rv = cluster.events_since(rv, [PDB])
        seen.extend((e.type, e.object["metadata"]["name"], e.object["status"]["disruptionsAllowed"]) for e in events)
        return len(seen) >= 4

    wait_for(all_seen, what="the PDB watch events")
    # w2 counts for both: "after" expects 2 pods now (one may be unavailable), "before" has 2 healthy
    assert seen == [(ADDED, "after", 1), (MODIFIED, "after", 1), (MODIFIED, "before", 1), (DELETED, "before", 1)]
    pdbs: dict[str, PodDisruptionBudget] = {}
    apply_pdb_events(pdbs, [(ADDED, p) for p in cluster.list_pdbs()[0]])
    assert {k: v.disruptions_allowed for k, v in pdbs.items()} == {"default/after": 1}


def test_pdb_list_denied_by_rbac_is_forbidden(simapi, cluster):
    simapi.deny("list", "poddisruptionbudgets")
    with pytest.raises(Forbidden, match="poddisruptionbudgets"):
        cluster.list_nodes()  # the first list syncs every watch
    assert cluster.missing_permissions() == ["list policy/poddisruptionbudgets"]
    assert ("watch", "policy", "poddisruptionbudgets") in PERMISSIONS


def test_simulated_cluster_serves_pdb_events_with_the_others(simapi):
    sim = simapi.sim
    _, rv = sim.list_pdbs()
    sim.create_pdb(budget(minAvailable=1))
    events, _ = sim.events_since(rv)  # kinds None: every kind of its capabilities
    assert [(e.type, e.kind) for e in events] == [(ADDED, PDB)]
    assert PDB in sim.capabilities.kinds


def test_intake_parses_pdbs_and_skips_a_bad_one_with_a_log_line(caplog):
    good = {**budget(), "status": {"disruptionsAllowed": 2, "disruptedPods": {"w1": "2026-01-01T00:00:00Z"}}}
    bad_selector = budget("bad", selector={"matchExpressions": [{"key": "app", "operator": "Near"}]})
    bad_status = {**budget("worse"), "status": {"disruptionsAllowed": "many"}}
    pdbs: dict[str, PodDisruptionBudget] = {}
    with caplog.at_level(logging.ERROR, logger="shardsched.cluster.disruption"):
        changed = apply_pdb_events(pdbs, [(ADDED, good), (ADDED, bad_selector), (ADDED, bad_status),
                                          (ADDED, {"metadata": {}})])
    assert changed == 1 and list(pdbs) == ["default/web"]
    assert pdbs["default/web"].disruptions_allowed == 2 and pdbs["default/web"].disrupted_pods == {"w1"}
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("PodDisruptionBudget default/bad ignored: spec.selector.matchExpressions[0]")
               for m in messages), messages
    assert any(m.startswith("PodDisruptionBudget default/worse ignored: status.disruptionsAllowed") for m in messages)
    assert "PodDisruptionBudget without metadata.name ignored" in messages

    # a budget that turns bad is dropped; an unchanged one changes nothing; DELETED drops
    assert apply_pdb_events(pdbs, [(MODIFIED, good)]) == 0
    assert apply_pdb_events(pdbs, [(MODIFIED, {**good, "spec": {"selector": "app=web"}})]) == 1
    assert pdbs == {}
    apply_pdb_events(pdbs, [(ADDED, good)])
    assert apply_pdb_events(pdbs, [(DELETED, good), (DELETED, good)]) == 1 and pdbs == {}
