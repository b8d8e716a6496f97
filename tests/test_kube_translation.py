"""Units of the Kubernetes backend that need no server: objects to camelCase dicts and to the model,
the error mapping, the token bucket, credentials loading, and the informer store's merge rules."""

from __future__ import annotations

import os
import threading
from datetime import datetime, timezone

import pytest
from kubernetes import client as k8s

from shardsched.api.objects import NodeInfo, PodInfo
from shardsched.errors import InvalidObjectError, PermanentError, TemporaryError
from shardsched.kube.client import ClientSpec, Forbidden, TokenBucket, Unauthorized, classify, to_dict
from shardsched.kube.watches import BOUND_WATCH, Store, watch_specs
from shardsched.cluster import (ADDED, DELETED, MAX_WATCH_WAIT_S, MODIFIED, Conflict, Gone, Invalid, NotFound, ServerError,
                                Timeout)

SCHED = "shardsched"


# ---------------------------------------------------------------------------------------- translation
def test_client_models_become_camelcase_dicts_the_model_understands():
    created = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="web", namespace="prod", uid="u1", creation_timestamp=created),
        spec=k8s.V1PodSpec(scheduler_name=SCHED, node_selector={"zone": "a"}, containers=[k8s.V1Container(
            name="c", image="nginx", resources=k8s.V1ResourceRequirements(requests={"cpu": "500m", "memory": "1Gi"}))],
            tolerations=[k8s.V1Toleration(key="gpu", operator="Exists", effect="NoSchedule")]))
    d = to_dict(pod)
    assert d["spec"]["schedulerName"] == SCHED and d["spec"]["nodeSelector"] == {"zone": "a"}
    assert d["metadata"]["creationTimestamp"].startswith("2024-05-01T12:00:00")
    assert "scheduler_name" not in d["spec"], "snake_case must not leak"
    info = PodInfo.from_object(d)
    assert (info.key, info.scheduler_name, info.requests["cpu"], info.requests["memory"]) == ("prod/web", SCHED, 500, 2**30)
    node = to_dict(k8s.V1Node(metadata=k8s.V1ObjectMeta(name="n1", labels={"zone": "a"}),
                              spec=k8s.V1NodeSpec(taints=[k8s.V1Taint(key="gpu", effect="NoSchedule")]),
                              status=k8s.V1NodeStatus(allocatable={"cpu": "4", "memory": "8Gi", "pods": "110"})))
    n = NodeInfo.from_object(node)
    assert (n.name, n.allocatable["cpu"], n.allocatable["pods"]) == ("n1", 4000, 110)
    assert to_dict(d) is d  # dicts (what list/watch deliver) pass through


def test_client_models_carry_gates_and_the_constraints_shardsched_refuses():
    """What the SchedulingGates PreEnqueue and the stand-ins of unimplemented plugins read survives
    the translation of the client's models (snake_case attributes to the API's camelCase)."""
    term = k8s.V1PodAffinityTerm(label_selector=k8s.V1LabelSelector(match_labels={"app": "w"}),
                                 topology_key="kubernetes.io/hostname")
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="w1", namespace="prod", labels={"app": "w"}),
        spec=k8s.V1PodSpec(
            scheduler_name=SCHED, containers=[k8s.V1Container(name="c", image="nginx")],
            scheduling_gates=[k8s.V1PodSchedulingGate(name="example.com/quota")],
            affinity=k8s.V1Affinity(pod_anti_affinity=k8s.V1PodAntiAffinity(
                required_during_scheduling_ignored_during_execution=[term])),
            topology_spread_constraints=[k8s.V1TopologySpreadConstraint(
                max_skew=1, topology_key="zone", when_unsatisfiable="DoNotSchedule")],
            resource_claims=[k8s.V1PodResourceClaim(name="gpu", resource_claim_template_name="gpu-template")],
            volumes=[k8s.V1Volume(name="data", persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(
                claim_name="data")), k8s.V1Volume(name="tmp", empty_dir=k8s.V1EmptyDirVolumeSource()),
                k8s.V1Volume(name="disk", gce_persistent_disk=k8s.V1GCEPersistentDiskVolumeSource(pd_name="d"))]))
    pod.spec.containers[0].resources = k8s.V1ResourceRequirements(claims=[k8s.CoreV1ResourceClaim(name="gpu")])
    info = PodInfo.from_object(to_dict(pod))
    assert info.scheduling_gates == ("example.com/quota",)
    assert (info.required_pod_affinity, info.required_pod_anti_affinity, info.hard_topology_spread) == (
        False, True, True)
    assert info.claim_volumes == ("data",)
    assert info.disk_volumes == (("disk", "gcePersistentDisk"),)
    assert info.resource_claims == ("gpu",)


def test_node_without_allocatable_has_no_room_and_bad_quantities_are_rejected_clearly():
    bare = NodeInfo.from_object({"metadata": {"name": "bare"}, "status": {}})  # as kube: valid, nothing fits
    assert not any(bare.allocatable.values())
    bad = {"metadata": {"name": "p", "namespace": "d"}, "spec": {"containers": [
        {"name": "c", "resources": {"requests": {"cpu": "lots"}}}]}}
    with pytest.raises(InvalidObjectError, match="cpu"):
        PodInfo.from_object(bad)


# ---------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("status,expected,base", [
    (401, Unauthorized, PermanentError), (403, Forbidden, PermanentError), (404, NotFound, PermanentError),
    (409, Conflict, PermanentError), (410, Gone, PermanentError), (422, Invalid, PermanentError),
    (429, ServerError, TemporaryError), (500, ServerError, TemporaryError), (503, ServerError, TemporaryError),
    (504, Timeout, TemporaryError),
], ids=lambda v: str(v) if isinstance(v, int) else None)
def test_http_status_maps_to_typed_error(status, expected, base):
    err = classify(status, b'{"kind":"Status","message":"m"}', "list", "pods")
    assert isinstance(err, expected) and isinstance(err, base)


def test_forbidden_names_verb_and_resource_and_the_fix():
    err = classify(403, b'{"message":"pods is forbidden: User \\"x\\" cannot create resource \\"pods/binding\\""}',
                   "create", "pods/binding")
    assert "RBAC denied: cannot create pods/binding" in str(err) and "deploy/rbac" in str(err)


def test_retry_after_sets_the_delay_and_garbage_bodies_are_quoted():
    err = classify(429, b"<html>slow down</html>", "create", "pods/binding", {"Retry-After": "3"})
    assert err.delay_s == 3.0 and "<html>slow down" in str(err)


# ---------------------------------------------------------------------------------------- rate limit
def test_token_bucket_allows_burst_then_qps():
    now = [0.0]
    bucket = TokenBucket(qps=10, burst=3, clock=lambda: now[0])
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.reserve() == pytest.approx(0.1)
    assert bucket.reserve() == pytest.approx(0.2)  # queued behind the previous reservation
    now[0] = 10.0  # refilled, capped at burst
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert TokenBucket(qps=0, burst=1).reserve() == 0.0  # 0 = unlimited


# ---------------------------------------------------------------------------------------- kubeconfig
@pytest.mark.parametrize("name, content, match", [
    ("garbage", b"{{{ not yaml", "garbage"),
    ("empty", b"apiVersion: v1\nkind: Config\n", "empty"),
    ("scalar", b"just some words\n", r"scalar: not a kubeconfig: its YAML is a str, expected a mapping"),
    ("listed", b"- a\n- b\n", r"listed: not a kubeconfig: its YAML is a list"),
    ("broken", b"apiVersion: v1\nclusters:\n- cluster: {server: [\n", r"broken: not valid YAML at line \d+, column \d+"),
    ("binary", b"\xff\xfe\x00garbage", "binary: not a text file"),
    ("blank", b"", "blank: the file is empty"),
])
def test_an_invalid_kubeconfig_says_what_is_wrong_with_it(tmp_path, monkeypatch, name, content, match):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(PermanentError, match=match):
        ClientSpec(kubeconfig=str(path)).configuration()


def test_missing_and_unreadable_kubeconfigs_are_permanent_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(PermanentError, match="no such file$"):  # given with --kubeconfig: no advice to pass it
        ClientSpec(kubeconfig=str(tmp_path / "nope")).configuration()
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "from-env"))
    with pytest.raises(PermanentError, match=r"from-env: no such file \(pass --kubeconfig"):
        ClientSpec().configuration()
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked"
        locked.write_text("x")
        locked.chmod(0)
        with pytest.raises(PermanentError, match="not readable"):
            ClientSpec(kubeconfig=str(locked)).configuration()


# ---------------------------------------------------------------------------------------- the store
def _pod(uid: str, rv: int, node: str = "") -> dict:
    spec = {"schedulerName": SCHED, "containers": [{"name": "c"}]}
    if node:
        spec["nodeName"] = node
    return {"kind": "Pod", "metadata": {"name": uid, "namespace": "d", "uid": uid, "resourceVersion": str(rv)},
            "spec": spec}


OURS = f"pods-ours:{SCHED}"


def test_each_pod_is_on_one_watch_and_a_bind_is_one_change():
    """Our pods (pending or bound) come from our schedulerName's watch, the other bound pods from
    the bound-pods watch, which excludes our names: no pod is on both, so a bind is one MODIFIED."""
    specs = {s.name: s for s in watch_specs([SCHED, "other-profile"])}
    assert set(specs) == {"nodes", "namespaces", "pdbs", "services", "replicationcontrollers", "replicasets",
                          "statefulsets", BOUND_WATCH, OURS, "pods-ours:other-profile"}
    assert specs["namespaces"].path == "/api/v1/namespaces" and not specs["namespaces"].field_selector
    live = "status.phase!=Succeeded,status.phase!=Failed"
    assert specs[OURS].field_selector == f"spec.schedulerName={SCHED},{live}"
    assert specs[BOUND_WATCH].field_selector == (
        f"spec.nodeName!=,{live},spec.schedulerName!=other-profile,spec.schedulerName!={SCHED}")  # names sorted


@pytest.mark.parametrize("steps,want_events,want_pods", [
    # our pending pod, then bound (by us or by a rival): one MODIFIED carrying the node
    ([(OURS, ADDED, 1, ""), (OURS, MODIFIED, 2, "n1")], [ADDED, MODIFIED], {"p": "n1"}),
    # a real deletion of a pending pod
    ([(OURS, ADDED, 1, ""), (OURS, DELETED, 2, "")], [ADDED, DELETED], {}),
    # another scheduler's pod bound to a node, then terminal (it leaves the selector: DELETED)
    ([(BOUND_WATCH, ADDED, 1, "n1"), (BOUND_WATCH, DELETED, 2, "n1")], [ADDED, DELETED], {}),
    # a DELETED for a pod never seen tells the coordinator nothing
    ([(OURS, DELETED, 1, "")], [], {}),
], ids=["bind", "pending-deleted", "other-bound-ends", "unknown-deleted"])
def test_store_applies_the_pod_watches(steps, want_events, want_pods):
    store = Store(watch_specs([SCHED]))
    for watch, typ, rv, node in steps:
        store.apply(watch, typ, _pod("p", rv, node))
    events, _ = store.since(0)
    assert [e.type for e in events] == want_events
    pods, _ = store.list_pods()
    assert {p["metadata"]["uid"]: p["spec"].get("nodeName", "") for p in pods} == want_pods


def test_relist_emits_the_differences_and_the_log_answers_gone_when_compacted():
    store = Store(watch_specs([SCHED]), log_limit=4)
    store.replace(OURS, [_pod("a", 1), _pod("b", 1)])
    _, seq = store.list_nodes()
    pods, seq2 = store.list_pods()
    assert seq == seq2 == 2 and len(pods) == 2  # list_pods pinned at list_nodes' moment
    n = store.replace(OURS, [_pod("a", 1), _pod("b", 5), _pod("c", 5)])  # b changed, c new
    assert n == 2
    assert store.replace(OURS, [_pod("c", 5)]) == 2  # a and b gone
    events, _ = store.since(2)
    assert [(e.type, e.object["metadata"]["uid"]) for e in events] == [
        (MODIFIED, "b"), (ADDED, "c"), (DELETED, "a"), (DELETED, "b")]
    for i in range(10):
        store.apply(OURS, MODIFIED, _pod("c", 10 + i))
    with pytest.raises(Gone):
        store.since(2)
    with pytest.raises(Gone):
        store.since(10**6)  # from another instance
    events, rv = store.since(store.list_pods()[1] - 2, limit=1)
    assert len(events) == 1 and rv == events[0].rv


def test_kubeconfig_token_refresh_runs_at_most_once_a_second_and_stays_wrapped(tmp_path, monkeypatch):
    """The loader's refresh hook runs before every request and re-installs itself each time it
    runs (it re-applies the configuration, ``host`` included); ours keeps it to once per
    TOKEN_REFRESH_S across those re-installs, and the token is still sent."""
    import json

    from shardsched.kube import client as kclient

    kc = tmp_path / "kc"
    kc.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "secret-token"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    now = [1000.0]
    monkeypatch.setattr(kclient.time, "monotonic", lambda: now[0])
    cfg = ClientSpec(kubeconfig=str(kc)).api_client().configuration
    wrapped = cfg.refresh_api_key_hook
    assert wrapped is not None
    # each run of the loader's hook writes `host`: count the writes
    hosts = []
    monkeypatch.setattr(type(cfg), "host", property(
        lambda self: self._base_path, lambda self, v: (hosts.append(v), object.__setattr__(self, "_base_path", v))))

    assert {cfg.get_api_key_with_prefix("BearerToken") for _ in range(20)} == {"Bearer secret-token"}
    assert len(hosts) == 1, "the first request runs it"
    assert cfg.refresh_api_key_hook is wrapped, "re-installed by the loader, wrapped again"
    for _ in range(20):
        cfg.get_api_key_with_prefix("BearerToken")
    assert len(hosts) == 1, "not again within the period"
    now[0] += kclient.TOKEN_REFRESH_S
    for _ in range(20):
        cfg.get_api_key_with_prefix("BearerToken")
    assert len(hosts) == 2, "once the period has passed, exactly once"
    assert cfg.refresh_api_key_hook is wrapped


def test_a_writer_queue_reports_given_up_items_once_per_interval_with_the_count(caplog):
    """An API server away for a while: every Event is given up, but the log says so once per
    interval with how many, not once per Event."""
    import logging
    import time

    from shardsched.kube.writers import WorkQueue

    def refuse(item):
        raise TemporaryError(f"API server unreachable ({item})")

    q = WorkQueue("events-test", refuse, workers=1, max_tries=1, log_every_s=0.5)
    try:
        with caplog.at_level(logging.WARNING, logger="shardsched.kube.writers"):
            for i in range(20):
                q.put(i, i)
            assert q.flush(5)
            # this queue's lines only: writers of clusters from earlier tests may still be retrying
            first = [r.getMessage() for r in caplog.records if r.getMessage().startswith("events-test:")]
            time.sleep(0.6)
            q.put("later", "later")
            assert q.flush(5)
            lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("events-test:")]
    finally:
        q.stop()
    assert q.stats["failed"] == 21
    assert len(first) == 1 and "1 item(s) given up" in first[0] and "(0)" in first[0]
    assert len(lines) == 2 and "20 item(s) given up" in lines[1] and "(later)" in lines[1]


def test_events_and_conditions_yield_to_binds_in_flight():
    """While this process binds, one Event/condition write at a time goes out (and does go out);
    once the binds are done (and the linger passed), writes go out side by side again."""
    import threading

    from shardsched.kube.gate import BindsFirst

    gate = BindsFirst(while_binding=1, linger_s=0.02)
    lock, inside, peak, done = threading.Lock(), [0], [0], []

    def write(barrier: threading.Barrier | None = None) -> None:
        with gate.writing():
            with lock:
                inside[0] += 1
                peak[0] = max(peak[0], inside[0])
            try:
                if barrier is not None:
                    barrier.wait(timeout=5)  # all four at once, or BrokenBarrierError
                else:
                    threading.Event().wait(0.01)
            finally:
                with lock:
                    inside[0] -= 1
                done.append(1)

    with gate.binding():
        assert gate.busy()
        writers = [threading.Thread(target=write) for _ in range(4)]
        for t in writers:
            t.start()
        for t in writers:
            t.join(5)
        assert len(done) == 4 and peak[0] == 1, "one write at a time while binding, and each went out"
        assert gate.waits >= 1
    barrier = threading.Barrier(4)
    writers = [threading.Thread(target=write, args=(barrier,)) for _ in range(4)]
    for t in writers:
        t.start()
    for t in writers:
        t.join(5)
    assert len(done) == 8 and peak[0] == 4 and not barrier.broken, "side by side once the binds are done"
    assert not gate.busy()
    with pytest.raises(ValueError, match="at least 1"):
        BindsFirst(while_binding=0)


def test_events_and_conditions_wait_out_a_burst_of_binds():
    """A bind call of ``burst_pods`` pods or more is a burst: while it is in flight each write
    waits ``hold_s`` first (none goes out), then one at a time; once it ends the rest go out side
    by side. A small bind call holds nothing longer than one write at a time. A peer answering
    BURST holds the writes like a local burst."""
    import threading
    import time

    from shardsched.kube.gate import BindsFirst

    gate = BindsFirst(while_binding=1, linger_s=0.02, hold_s=0.4, burst_pods=10)
    lock, entered, inside, peak = threading.Lock(), [], [0], [0]

    def write(takes_s: float) -> None:
        with gate.writing():
            with lock:
                entered.append(time.monotonic())
                inside[0] += 1
                peak[0] = max(peak[0], inside[0])
            time.sleep(takes_s)
            with lock:
                inside[0] -= 1

    def start(n: int, takes_s: float = 0.05) -> list[threading.Thread]:
        threads = [threading.Thread(target=write, args=(takes_s,)) for _ in range(n)]
        for t in threads:
            t.start()
        return threads

    with gate.binding(9):  # small: one at a time at once
        assert gate.level() == gate.BINDING
        started = time.monotonic()
        for t in start(3):
            t.join(5)
        assert len(entered) == 3 and peak[0] == 1 and entered[0] - started < 0.2
    time.sleep(0.05)
    entered.clear()
    peak[0] = 0
    with gate.binding(10):  # a burst
        assert gate.level() == gate.BURST
        started = time.monotonic()
        threads = start(3)
        time.sleep(0.3)
        assert entered == [], "no write while the burst is younger than hold_s"
        time.sleep(0.5)  # 0.8 s in: the holds are over, one at a time
        assert len(entered) == 3 and peak[0] == 1
        assert min(entered) - started >= 0.39
    for t in threads:
        t.join(5)
    time.sleep(0.05)
    entered.clear()
    peak[0] = 0
    gate.peers = lambda: gate.BURST  # another process binds a burst
    started = time.monotonic()
    for t in start(2):
        t.join(5)
    assert min(entered) - started >= 0.39 and peak[0] == 1
    gate.peers = lambda: gate.IDLE
    time.sleep(gate.PEER_POLL_S * 2)
    entered.clear()
    peak[0] = 0
    for t in start(4, takes_s=0.5):
        t.join(5)
    assert len(entered) == 4 and peak[0] == 4, "side by side once nobody binds"
    with pytest.raises(ValueError, match="hold_s"):
        BindsFirst(hold_s=-1)
    with pytest.raises(ValueError, match="burst_pods"):
        BindsFirst(burst_pods=0)


def test_a_long_burst_holds_its_writes_once_not_once_per_write():
    """The hold runs from the burst's start: in a burst longer than ``hold_s`` the writes queued
    meanwhile wait until then, and after it go out one at a time without each waiting ``hold_s``
    again (with a hold per write, two workers wrote 10 of 100 in a 3-s burst)."""
    import threading
    import time

    from shardsched.kube.gate import BindsFirst
    from shardsched.kube.writers import WorkQueue

    gate = BindsFirst(while_binding=1, linger_s=0.02, hold_s=0.5, burst_pods=10)
    done: list[float] = []
    lock = threading.Lock()

    def write(item) -> None:
        with lock:
            done.append(time.monotonic())

    queue = WorkQueue("test", write, workers=2, gate=gate)
    try:
        with gate.binding(10):
            started = time.monotonic()
            for i in range(100):
                queue.put(i, i)
            time.sleep(0.4)
            assert done == [], "nothing written in the burst's first hold_s"
            time.sleep(1.6)  # 2 s into the burst
            with lock:
                written = list(done)
        assert len(written) == 100 and min(written) - started >= 0.49, (len(written), min(written or [0]) - started)
    finally:
        queue.stop()


def test_a_write_held_by_a_burst_goes_out_when_the_burst_ends_though_a_small_call_still_runs():
    """After the burst's last call (and its linger) the level drops to BINDING even while a
    small bind call still runs; a write that waited for the burst then goes out at once (one at a
    time), not when the small call or its own hold ends."""
    import threading
    import time

    from shardsched.kube.gate import BindsFirst

    gate = BindsFirst(while_binding=1, linger_s=0.05, hold_s=3.0, burst_pods=10)
    small_may_end, went = threading.Event(), []

    def small() -> None:
        with gate.binding(1):
            small_may_end.wait(5)

    def write() -> None:
        with gate.writing():
            went.append(time.monotonic())

    small_call = threading.Thread(target=small)
    small_call.start()
    writer = threading.Thread(target=write)
    try:
        with gate.binding(10):
            writer.start()
            time.sleep(0.1)
            assert went == []
        ended = time.monotonic()
        writer.join(1.0)
        assert went and went[0] - ended < 0.5, "the write waited past the burst's end"
        assert gate.level() == gate.BINDING
    finally:
        small_may_end.set()
        small_call.join(5)
        writer.join(5)


def test_a_write_asks_the_peers_when_its_own_burst_ends_between_two_looks(monkeypatch):
    """A write sees its own process at BURST (the linger of a burst just ended), so it does not
    ask the peers; by its second look the linger is over. It must then ask the peers (another
    shard still bursts) rather than go out at full width on its own process's IDLE."""
    import threading
    import time
    import types

    from shardsched.kube import gate as gate_module
    from shardsched.kube.gate import BindsFirst

    real = time.monotonic
    looks = iter([100.04, 100.06])  # first look: 40 ms after the burst ended; second: 60 ms
    t0 = real()
    clock = types.SimpleNamespace(monotonic=lambda: next(looks, None) or 200.0 + (real() - t0),
                                  time=time.time, sleep=time.sleep)
    monkeypatch.setattr(gate_module, "time", clock)
    gate = BindsFirst(linger_s=0.05, hold_s=10.0, burst_pods=10)
    gate._burst_ended = gate._bind_ended = 100.0  # this process's burst just ended
    answers = {"level": gate.BURST, "asked": 0}

    def peers() -> int:
        answers["asked"] += 1
        return answers["level"]

    gate.peers = peers
    went = []

    def write() -> None:
        with gate.writing():
            went.append(1)

    writer = threading.Thread(target=write)
    writer.start()
    time.sleep(0.3)
    assert answers["asked"] >= 1 and went == [], "held for the peer's burst, not written at full width"
    answers["level"] = gate.IDLE
    writer.join(2)
    assert went == [1], "written once the peers stopped"


def test_events_and_conditions_yield_to_the_binds_of_other_processes():
    """With ``peers`` (other shards' binds, read from the ledger), writes go out one at a time
    while the peers bind, though this process binds nothing, and side by side once they stop; a
    ``peers`` that raises (Redis away) holds nothing back."""
    import threading
    import time

    from shardsched.kube.gate import BindsFirst

    gate = BindsFirst(while_binding=1, linger_s=0.02)
    peers_binding = threading.Event()
    peers_binding.set()
    gate.peers = peers_binding.is_set
    lock, inside, peak = threading.Lock(), [0], [0]

    def write(hold_s: float) -> None:
        with gate.writing():
            with lock:
                inside[0] += 1
                peak[0] = max(peak[0], inside[0])
            time.sleep(hold_s)
            with lock:
                inside[0] -= 1

    def burst(n: int, hold_s: float) -> float:
        peak[0] = 0
        started = time.monotonic()
        writers = [threading.Thread(target=write, args=(hold_s,)) for _ in range(n)]
        for t in writers:
            t.start()
        for t in writers:
            t.join(5)
        assert not any(t.is_alive() for t in writers)
        return time.monotonic() - started

    assert not gate.busy(), "busy() speaks of this process's binds only"
    burst(4, 0.02)
    assert peak[0] == 1 and gate.waits >= 1, "one at a time while another process binds"
    peers_binding.clear()
    time.sleep(gate.PEER_POLL_S * 2)  # the cached answer is renewed
    burst(4, 0.2)
    assert peak[0] == 4, "side by side once no process binds"

    def broken() -> bool:
        raise ConnectionError("Redis away")

    gate.peers = broken
    time.sleep(gate.PEER_POLL_S * 2)
    burst(4, 0.2)
    assert peak[0] == 4, "an unanswerable question holds nothing back"


def test_store_long_poll_answers_the_reflectors_next_change_and_frees_the_lock_meanwhile():
    """``since(..., wait_s)`` with nothing new waits for the next change; the wait holds no lock a
    reflector needs (it applies the change meanwhile), and its answer is that change."""
    store = Store(watch_specs([SCHED]))
    store.apply(OURS, ADDED, _pod("a", 1))
    _, seq = store.list_pods()
    answers = []
    waiter = threading.Thread(target=lambda: answers.append(store.since(seq, wait_s=MAX_WATCH_WAIT_S)))
    waiter.start()
    store.apply(OURS, MODIFIED, _pod("a", 2, "n1"))  # a reflector's write, while (or before) the poll waits
    waiter.join(60)
    assert not waiter.is_alive()
    (events, rv), = answers
    assert [(e.type, e.object["spec"].get("nodeName")) for e in events] == [(MODIFIED, "n1")] and rv == seq + 1
    assert store.since(rv, wait_s=0) == ([], rv)  # no wait asked: answered at once
    with pytest.raises(Invalid, match="wait_s"):
        store.since(rv, wait_s="soon")
