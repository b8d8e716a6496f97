"""Error paths of the Kubernetes backend against an HTTP peer on 127.0.0.1 (`SimApiServer`, standard
library ``http.server``) that answers 401, 403, 429, 500, 504, garbage, dropped connections and
410, as a real API server (or a proxy in front of it) can."""

from __future__ import annotations

import threading
import time

import pytest

from shardsched.errors import PermanentError, TemporaryError
from shardsched.kube.client import Api, ClientSpec, Forbidden, Garbage, Unauthorized, Unreachable
from shardsched.kube.cluster import KubeCluster
from shardsched.testing.simapi import SimApiServer
from shardsched.sim.cluster import SimCluster
from shardsched.cluster import Conflict, NotFound, ServerError

from builders import pod

SCHED = "shardsched-test"


@pytest.fixture
def server(simapi):
    return simapi


@pytest.fixture
def spec(simapi_spec):
    return simapi_spec


@pytest.fixture
def cluster(spec):
    kc = KubeCluster(spec, [SCHED], watch_timeout_s=5)
    yield kc
    kc.stop()


def pending(sim: SimCluster, name: str) -> dict:
    p = pod(name, cpu="100m")
    p["metadata"].pop("uid")
    p["spec"]["schedulerName"] = SCHED
    return sim.create_pod(p)


def wait_for(check, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("backend", ["sim", "kube"])
def test_delete_pod_with_a_stale_uid_is_a_conflict_and_deletes_nothing(server, cluster, backend):
    """The cluster contract's ``delete_pod`` (a preemption's eviction), on both backends: a uid
    precondition naming another pod of that name answers 409 and leaves the pod; the current uid
    deletes it; deleting it again is 404."""
    uid = pending(server.sim, "victim")["metadata"]["uid"]
    target = server.sim if backend == "sim" else cluster
    with pytest.raises(Conflict):
        target.delete_pod("default", "victim", uid="not-" + uid, grace_period_s=0)
    assert server.sim.get_pod("default", "victim")["metadata"]["uid"] == uid
    target.delete_pod("default", "victim", uid=uid, grace_period_s=0)
    with pytest.raises(NotFound):
        server.sim.get_pod("default", "victim")
    with pytest.raises(NotFound):
        target.delete_pod("default", "victim")


def test_rbac_denied_list_is_a_clear_permanent_error(server, cluster):
    server.deny("list", "nodes")
    with pytest.raises(Forbidden) as e:
        cluster.list_nodes()
    assert isinstance(e.value, PermanentError)
    assert "RBAC denied: cannot list nodes" in str(e.value)
    server.allow("list", "nodes")
    nodes, _ = cluster.list_nodes()  # the same object recovers once RBAC is fixed
    assert len(nodes) == 2


def test_missing_permissions_are_listed_by_name(server, cluster):
    server.deny("create", "pods/binding")
    server.deny("update", "leases")
    assert cluster.missing_permissions("kube-system", "shardsched") == [
        "create pods/binding", "update coordination.k8s.io/leases shardsched in namespace kube-system"]


def test_wrong_token_is_unauthorized(server, tmp_path):
    kc = KubeCluster(ClientSpec(kubeconfig=server.write_kubeconfig(str(tmp_path / "bad"), token="wrong")), [SCHED])
    with pytest.raises(Unauthorized):
        kc.list_pods()


def test_unreachable_server_is_temporary(tmp_path):
    srv = SimApiServer().start()
    path = srv.write_kubeconfig(str(tmp_path / "kc"))
    srv.stop()
    with pytest.raises(Unreachable) as e:
        KubeCluster(ClientSpec(kubeconfig=path, connect_timeout_s=1), [SCHED]).list_nodes()
    assert isinstance(e.value, TemporaryError)


@pytest.mark.parametrize("action,status,error", [
    ("status", 500, ServerError), ("status", 429, ServerError), ("garbage", 200, Garbage),
], ids=["500", "429", "garbage"])
def test_list_failures_are_temporary_and_retried(server, cluster, action, status, error):
    server.fail("GET", "/api/v1/nodes", status=status, action=action)
    with pytest.raises(error):
        cluster.list_nodes()
    assert len(cluster.list_nodes()[0]) == 2


def test_watch_survives_garbage_errors_and_cuts_without_losing_events(server, cluster):
    sim = server.sim
    _, rv = cluster.list_pods()
    server.fail("GET", "/api/v1/pods", action="garbage", query="watch=true", times=1)
    server.fail("GET", "/api/v1/pods", status=500, query="watch=true", times=1)
    server.cut_watches()
    for i in range(5):
        pending(sim, f"p{i}")
        if i == 2:
            server.cut_watches()
    wait_for(lambda: len(cluster.events_since(rv)[0]) >= 5)
    names = sorted(e.object["metadata"]["name"] for e in cluster.events_since(rv)[0])
    assert names == [f"p{i}" for i in range(5)]
    watches = cluster.health()["watches"]
    assert all(w["lists"] == 1 for w in watches.values()), "no relist was needed"
    # one garbage answer and one 500, nothing more: the rest of the garbage answer was not read as
    # the start of the next answer on the same pooled connection
    assert sum(w["garbage"] for w in watches.values()) == 1
    assert sum(w["errors"] for w in watches.values()) == 2, watches


def test_a_watch_event_with_an_escaped_lone_surrogate_is_read(server, cluster):
    """Valid JSON that orjson refuses (an escaped lone surrogate in a string) is read with the
    standard library instead of being taken for garbage."""
    _, rv = cluster.list_pods()
    p = pod("odd", cpu="100m")
    p["metadata"].pop("uid")
    p["metadata"]["annotations"] = {"note": "\ud800"}
    p["spec"]["schedulerName"] = SCHED
    server.sim.create_pod(p)
    wait_for(lambda: [e for e in cluster.events_since(rv)[0] if e.object["metadata"]["name"] == "odd"])
    assert all(w["garbage"] == 0 for w in cluster.health()["watches"].values())


def test_a_listed_pod_with_an_escaped_lone_surrogate_is_read(server, cluster):
    """The same in a list (the informers' first list and every relist), not only on the watch."""
    p = pod("odd-listed", cpu="100m")
    p["metadata"].pop("uid")
    p["metadata"]["annotations"] = {"note": "\ud800"}
    p["spec"]["schedulerName"] = SCHED
    server.sim.create_pod(p)
    assert "odd-listed" in {x["metadata"]["name"] for x in cluster.list_pods()[0]}


def test_a_transient_403_on_a_watch_is_reported_then_cleared(server, cluster):
    """A real kube-apiserver answers 403 for a moment after it restarts (its RBAC caches are not
    filled yet): health reports the permanent error while it lasts and stops once a watch opens."""
    _, rv = cluster.list_pods()
    server.fail("GET", "/api/v1/pods", status=403, query="watch=true", times=2)
    server.cut_watches()
    wait_for(lambda: cluster.health()["permanent_error"] != "")
    assert "RBAC denied" in cluster.health()["permanent_error"]
    wait_for(lambda: cluster.health()["permanent_error"] == "")
    pending(server.sim, "after-403")
    wait_for(lambda: any(e.object["metadata"]["name"] == "after-403" for e in cluster.events_since(rv)[0]))


def test_watch_410_relists_and_reports_the_difference(server, cluster):
    sim = server.sim
    p = pending(sim, "early")
    _, rv = cluster.list_pods()
    server.fail("GET", "/api/v1/pods", status=500, query="watch=true", times=3)  # hold the reconnects off
    server.cut_watches()
    sim.delete_pod("default", "early")
    pending(sim, "late")
    server.compact()  # the reconnect from the old resourceVersion gets 410, then relists
    wait_for(lambda: {(e.type, e.object["metadata"]["name"]) for e in cluster.events_since(rv)[0]}
             >= {("DELETED", "early"), ("ADDED", "late")})
    lists = cluster.health()["watches"][f"pods-ours:{SCHED}"]["lists"]
    assert lists == 2
    assert p["metadata"]["uid"] not in {x["metadata"]["uid"] for x in cluster.list_pods()[0]}
    # as client-go: the first list from the watch cache (resourceVersion=0), the relist after 410
    # a consistent read (no resourceVersion)
    unbound_lists = [q for m, path, q in server.queries
                     if path == "/api/v1/pods" and "watch" not in q and q.get("fieldSelector", "").startswith(f"spec.schedulerName={SCHED},")]
    assert [q.get("resourceVersion") for q in unbound_lists] == ["0", None]


def test_the_first_list_comes_whole_from_the_watch_cache_and_a_consistent_relist_is_paged(server, spec):
    """A large collection: the first list (resourceVersion=0) is one answer; after 410 Gone the
    relist pages through ``limit``/``continue`` without a resourceVersion and sees the same pods."""
    from shardsched.kube.informer import Reflector
    from shardsched.kube.watches import Store, watch_specs

    for i in range(7):
        pending(server.sim, f"many-{i}")
    specs = {s.name: s for s in watch_specs([SCHED])}
    unbound = specs[f"pods-ours:{SCHED}"]
    api = Api(spec.api_client(pool_size=4), None, (spec.connect_timeout_s, spec.request_timeout_s))
    store = Store(specs.values())
    r = Reflector(api, store, unbound, watch_timeout_s=5, page_size=3)
    first = len(server.queries)
    r.list()
    assert [q for _, path, q in server.queries[first:] if path == "/api/v1/pods"] == [
        {"fieldSelector": unbound.field_selector, "limit": "3", "resourceVersion": "0"}]
    r.consistent_list = True  # as after a 410 Gone
    first = len(server.queries)
    r.list()
    pages = [q for _, path, q in server.queries[first:] if path == "/api/v1/pods"]
    assert len(pages) == 3 and all("resourceVersion" not in q for q in pages)
    assert [q.get("continue") for q in pages] == [None, "3", "6"]
    assert len(store.list_pods()[0]) == 7
    assert not r.consistent_list, "the list after that one is from the cache again"


@pytest.mark.parametrize("status,action,code", [
    (500, "status", 500), (429, "status", 500), (503, "status", 500), (504, "status", 504),
    (403, "status", 500), (0, "drop", 500),
], ids=["500", "429", "503", "504", "403", "dropped"])
def test_bind_failures_map_to_shard_codes(server, cluster, status, action, code):
    p = pending(server.sim, "p")
    server.fail("POST", "/api/v1/namespaces/default/pods/p/binding", status=status, action=action)
    [r] = cluster.bind_many([("default", "p", "n0", p["metadata"]["uid"])])
    assert r.code == code
    if status == 403:
        assert "RBAC denied: cannot create pods/binding" in r.message
    # the shard retries with backoff: the next attempt goes through
    assert [x.code for x in cluster.bind_many([("default", "p", "n0", p["metadata"]["uid"])])] == [201]


def test_bind_read_timeout_is_504_maybe_applied(server, tmp_path):
    spec = ClientSpec(kubeconfig=server.write_kubeconfig(str(tmp_path / "kc")), request_timeout_s=0.3)
    p = pending(server.sim, "slow")
    real = server.sim.bind_many

    def slow(bindings):
        out = real(bindings)
        time.sleep(1.0)
        return out

    server.sim.bind_many = slow
    kc = KubeCluster(spec, [SCHED])
    [r] = kc.bind_many([("default", "slow", "n0", p["metadata"]["uid"])])
    assert r.code == 504
    server.sim.bind_many = real
    wait_for(lambda: server.sim.get_pod("default", "slow")["spec"].get("nodeName") == "n0")  # it was applied


def test_uid_precondition_protects_a_recreated_pod(server, cluster):
    old = pending(server.sim, "again")
    server.sim.delete_pod("default", "again")
    pending(server.sim, "again")
    [r] = cluster.bind_many([("default", "again", "n0", old["metadata"]["uid"])])
    assert r.code in (404, 409)  # the real API server answers 409, the simulator 404: both release


def test_events_fall_back_to_core_v1_when_events_k8s_io_is_not_served(tmp_path):
    sim = SimCluster()
    with SimApiServer(sim, events_api=False) as srv:
        kc = KubeCluster(ClientSpec(kubeconfig=srv.write_kubeconfig(str(tmp_path / "kc")), qps=0), [SCHED])
        p = pending(sim, "p")
        ref = {"kind": "Pod", "namespace": "default", "name": "p", "uid": p["metadata"]["uid"]}
        for _ in range(3):
            kc.record_event(ref, "Warning", "FailedScheduling", "0/0 nodes are available")
        assert kc.flush(10)
        [ev] = srv.events_for("default", "p")
        assert ev["apiVersion"] == "v1" and ev["count"] == 3 and ev["involvedObject"]["uid"] == p["metadata"]["uid"]
        kc.stop()


def test_repeated_events_become_a_series_and_unchanged_conditions_are_not_rewritten(server, cluster):
    p = pending(server.sim, "p")
    cluster.list_pods()
    ref = {"kind": "Pod", "namespace": "default", "name": "p", "uid": p["metadata"]["uid"]}
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes are available"}
    for _ in range(3):
        cluster.record_event(ref, "Warning", "FailedScheduling", cond["message"])
    cluster.set_pod_condition("default", "p", cond)
    assert cluster.flush(10)
    [ev] = server.events_for("default", "p")
    assert ev["series"]["count"] == 3 and ev["reportingController"] == SCHED and ev["action"] == "Scheduling"
    wait_for(lambda: any(c.get("type") == "PodScheduled" for c in
                         (cluster.store.pod("default", "p") or {}).get("status", {}).get("conditions", [])))
    patches = sum(1 for m, path in server.requests if m == "PATCH" and path.endswith("/status"))
    cluster.set_pod_condition("default", "p", cond)
    assert cluster.flush(10)
    assert sum(1 for m, path in server.requests if m == "PATCH" and path.endswith("/status")) == patches


def test_status_patch_of_a_deleted_pod_is_dropped_quietly(server, cluster):
    cluster.set_pod_condition("default", "ghost", {"type": "PodScheduled", "status": "False"})
    assert cluster.flush(10)
    assert cluster.health()["conditions"]["failed"] == 0


def test_api_request_of_garbage_json_is_typed(server, spec):
    api = Api(spec.api_client(), None, (2.0, 5.0))
    server.fail("GET", "/version", action="garbage")
    with pytest.raises(Garbage):
        api.request("GET", "/version", verb="get", resource="version")
    assert api.request("GET", "/version", verb="get", resource="version")["major"] == "1"


def test_a_label_selected_watch_sees_only_the_labelled_pods(server, spec):
    """`WatchSpec.label_selector` goes to the server (list and watch); the peer serves equality
    and existence terms as kube does (``k!=v`` also matches pods without the label)."""
    from shardsched.kube.informer import Reflector
    from shardsched.kube.watches import BOUND, POD, Store, WatchSpec

    def make(name: str, labels: dict) -> None:
        p = pod(name, cpu="100m")
        p["metadata"].pop("uid")
        p["metadata"]["labels"] = labels
        server.sim.create_pod(p)

    make("listed-a", {"app": "a"})
    make("listed-b", {"app": "b"})
    path = "/api/v1/namespaces/default/pods"
    specs = {"app=a": WatchSpec("app-a", POD, path, "", BOUND, label_selector="app=a"),
             "app!=b,!skip": WatchSpec("not-b", POD, path, "", BOUND, label_selector="app!=b,!skip")}
    api = Api(spec.api_client(pool_size=4), None, (spec.connect_timeout_s, spec.request_timeout_s))
    stores = {sel: Store([w]) for sel, w in specs.items()}
    reflectors = [Reflector(api, stores[sel], w, watch_timeout_s=5) for sel, w in specs.items()]
    for r in reflectors:
        r.list()
        r.start()
    names = ["listed-a", "listed-b", "watched-a", "watched-b", "unlabelled", "skipped"]

    def seen(sel: str) -> set[str]:
        return {n for n in names if stores[sel].pod("default", n) is not None}

    try:
        make("watched-a", {"app": "a"})
        make("watched-b", {"app": "b"})
        make("unlabelled", {})
        make("skipped", {"skip": "yes"})
        wait_for(lambda: "watched-a" in seen("app=a") and "unlabelled" in seen("app!=b,!skip"))
        time.sleep(0.3)  # an event sent wrongly would arrive by now too
        assert seen("app=a") == {"listed-a", "watched-a"}
        assert seen("app!=b,!skip") == {"listed-a", "watched-a", "unlabelled"}
    finally:
        for r in reflectors:
            r.stop()


def test_drain_binds_sends_no_more_binds_and_lets_those_in_flight_finish(server, tmp_path):
    """A whole-scheduler stop (Ctrl-C) calls `KubeCluster.drain_binds`: the binds a binding cycle
    holds but has not sent answer NOT_APPLIED at once (its pods stay pending, the shard puts them
    back), those already sent are applied, and nothing waits for the whole batch. The drain comes
    once the first 4 binds (one per worker) have reached the server, however slow the start."""
    spec = ClientSpec(kubeconfig=server.write_kubeconfig(str(tmp_path / "kc")))
    pods = [pending(server.sim, f"d{i}") for i in range(40)]
    real = server.sim.bind_many
    arrived = threading.Semaphore(0)

    def slow(bindings):
        arrived.release()
        time.sleep(0.3)
        return real(bindings)

    drained_at = []

    def drain_when_four_arrived():
        for _ in range(4):
            arrived.acquire(timeout=30)
        drained_at.append(time.monotonic())
        kc.drain_binds()

    server.sim.bind_many = slow
    kc = KubeCluster(spec, [SCHED], bind_workers=4)
    try:
        threading.Thread(target=drain_when_four_arrived, daemon=True).start()
        results = kc.bind_many([("default", p["metadata"]["name"], "n0", p["metadata"]["uid"]) for p in pods])
        took = time.monotonic() - drained_at[0]
    finally:
        server.sim.bind_many = real
        kc.stop()
    codes = [r.code for r in results]
    bound = [r.name for r in results if r.code == 201]
    assert 4 <= len(bound) <= 12 and codes.count(500) == 40 - len(bound), codes  # 4 in flight per 0.3 s
    assert {r.reason for r in results if r.code == 500} == {"Stopping"}
    assert took < 2.0  # the 36 binds not yet sent, 4 at a time, 0.3 s each, would take 2.7 s more
    for r in results:
        assert bool(server.sim.get_pod("default", r.name)["spec"].get("nodeName")) == (r.code == 201)


def test_a_watch_cut_from_another_thread_never_reads_raw_tls_bytes(tmp_path):
    """`shutdown_socket` (what `Reflector.cut` and `stop` do to a watch's socket) shuts the TCP
    socket under a TLS one down without dropping its TLS state: a read after it gives decrypted
    bytes or the end of the stream, never the raw TLS records (``SSLSocket.shutdown`` would drop the
    state, and the read then returned ciphertext: "not a watch event" lines holding binary)."""
    import socket
    import ssl

    pytest.importorskip("cryptography")
    from shardsched.testing.envtest import _self_signed
    from shardsched.kube.informer import shutdown_socket

    cert, key = _self_signed(tmp_path)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.check_hostname = False
    client_ctx.verify_mode = ssl.CERT_NONE
    listener = socket.create_server(("127.0.0.1", 0))
    line = b'{"type": "MODIFIED", "object": {"metadata": {"resourceVersion": "1"}}}\n'

    def serve() -> None:
        conn, _ = listener.accept()
        with server_ctx.wrap_socket(conn, server_side=True) as tls:
            for _ in range(50):
                tls.sendall(line)
            time.sleep(1.0)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    client = client_ctx.wrap_socket(socket.create_connection(listener.getsockname()))
    try:
        first = client.recv(len(line))  # the stream works; more records wait in the kernel's buffer
        assert first and first in line
        time.sleep(0.3)
        shutdown_socket(client)
        read = b""
        try:
            while True:
                chunk = client.recv(4096)
                if not chunk:
                    break
                read += chunk
        except (ssl.SSLError, OSError):
            pass
        assert set(read.replace(b"\n", b"")) <= set(line), read[:200]  # plain text only, or nothing
    finally:
        client.close()
        listener.close()
        t.join(5)


def slow_server(real_bind, real_record, until_written_while_binding=0):
    """(state, slow_bind, slow_record): a bind that takes the server 0.8 s (and, with
    ``until_written_while_binding``, until that many Events were written while it bound, however
    loaded the machine: at most 10 s) and an Event write that takes 0.05 s, counting in ``state``
    the Events written, those written while a bind was in flight and the most written at once
    then (``peak_while_binding``)."""
    lock = threading.Lock()
    state = {"binding": False, "inside": 0, "peak_while_binding": 0, "written": 0, "written_while_binding": 0}

    def slow_bind(bindings):
        with lock:
            state["binding"] = True
        try:
            time.sleep(0.8)
            deadline = time.monotonic() + 10
            while state["written_while_binding"] < until_written_while_binding and time.monotonic() < deadline:
                time.sleep(0.01)
            return real_bind(bindings)
        finally:
            with lock:
                state["binding"] = False

    def slow_record(*args, **kwargs):
        with lock:
            state["inside"] += 1
            binding = state["binding"]
            if binding:
                state["peak_while_binding"] = max(state["peak_while_binding"], state["inside"])
        try:
            time.sleep(0.05)
            return real_record(*args, **kwargs)
        finally:
            with lock:
                state["inside"] -= 1
                state["written"] += 1
                state["written_while_binding"] += binding

    return state, slow_bind, slow_record


def test_scheduled_events_wait_for_the_binds_in_flight(server, cluster):
    """The Events of a process go out one at a time while it has binds in flight (the binds get
    the API server first) and all of them once the binds are done."""
    pods = [pending(server.sim, f"ev-{i}") for i in range(9)]
    real_bind, real_record = server.sim.bind_many, server.sim.record_event
    state, slow_bind, slow_record = slow_server(real_bind, real_record)

    server.sim.record_event = slow_record
    try:
        # the Scheduled Events of a first bind, then a second bind that takes the server 0.8 s
        assert [r.code for r in cluster.bind_many([("default", p["metadata"]["name"], "n0", p["metadata"]["uid"])
                                                   for p in pods[:8]])] == [201] * 8
        server.sim.bind_many = slow_bind
        assert [r.code for r in cluster.bind_many([("default", "ev-8", "n0", pods[8]["metadata"]["uid"])])] == [201]
        assert cluster.flush(10)
    finally:
        server.sim.bind_many, server.sim.record_event = real_bind, real_record
    assert state["written"] == 9
    assert state["peak_while_binding"] <= 1, state
    assert cluster.gate.waits >= 1, "Events were held back while binding"


@pytest.mark.parametrize("pods", [3, 40], ids=["small", "burst"])
def test_events_of_one_process_wait_for_the_binds_of_a_shard_in_another(server, spec, ledger, pods):
    """In Ray mode each shard binds from a process of its own, through a `KubeCluster` copy (and
    gate) of its own that it reaches as a `ClusterBinds` (as `ShardHost` builds it), and the
    coordinator writes from a third. A shard marks its binds in flight in the ledger, and a bind
    call that fills its request slots (40 pods, 32 slots) as a burst; the Event writers of every
    copy yield to them: one write at a time while the shard binds a few pods, none at all while
    it binds a burst (shorter than the hold), and all go out once the binds are done (the mark is
    then gone)."""
    from shardsched.api.objects import NodeInfo, PodInfo
    from shardsched.config import parse_config
    from shardsched.sharding.calls import ClusterBinds, ClusterClient, Local
    from shardsched.sharding.shard_plugins import yield_writes_to_binds
    from shardsched.sharding.shard import Shard, ShardOptions
    from shardsched.store import NodeEntry

    member = "shard-0@1"
    config = parse_config(f"apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
                          f"profiles:\n- schedulerName: {SCHED}\n", "<test>")
    binder = KubeCluster(spec, [SCHED], watch_timeout_s=5, emit_scheduled=False)  # the shard's copy
    writer = KubeCluster(spec, [SCHED], watch_timeout_s=5)  # another process's copy
    handed_off: list = []

    class Rebalancer:
        def handoff(self, shard, items):
            handed_off.extend(items)

        def committed(self, shard, epoch, uids):
            pass

    real_bind, real_record = server.sim.bind_many, server.sim.record_event
    # a few pods: their binds last until an Event went out meanwhile (one at a time); a burst's
    # binds last 0.8 s, shorter than the writers' hold
    state, slow_bind, slow_record = slow_server(real_bind, real_record, int(pods < binder.bind_workers))

    try:
        yield_writes_to_binds(writer, ledger)
        nodes = server.sim.list_nodes()[0]
        infos = [NodeInfo.from_object(n) for n in nodes]
        ledger.upsert_nodes([NodeEntry(n.name, n.allocatable, member) for n in infos])
        ledger.set_owners({n.name: member for n in infos}, 1)
        shard = Shard(0, member, config, ledger, ClusterBinds(ClusterClient(Local(binder))), Rebalancer(), ShardOptions(seed=0))
        shard.set_epoch(1)
        shard.apply_nodes(nodes)
        n = pods
        pods = [pending(server.sim, f"xp-{i}") for i in range(n)]
        shard.add_pods([PodInfo.from_object(p) for p in pods])
        server.sim.bind_many, server.sim.record_event = slow_bind, slow_record
        step = threading.Thread(target=shard.step)  # one batch: all the pods, bound in 0.8 s
        step.start()
        wait_for(lambda: state["binding"])
        assert ledger.binding_marks() == (1, int(n >= binder.bind_workers)), "the shard marked its binds in flight"
        # the writer's gate asks the ledger at most every PEER_POLL_S: let the answer it may hold
        # from before the mark (idle) expire, so that its next write reads the mark
        time.sleep(writer.gate.PEER_POLL_S)
        for p in pods[:3] * 2:
            writer.record_event({"kind": "Pod", "namespace": "default", "name": p["metadata"]["name"]},
                                "Normal", "Test", "written by another process")
        step.join(10)
        assert writer.flush(10)
    finally:
        server.sim.bind_many, server.sim.record_event = real_bind, real_record
        binder.stop()
        writer.stop()
    assert all(server.sim.get_pod("default", p["metadata"]["name"])["spec"].get("nodeName") for p in pods)
    assert not handed_off
    assert state["written"] == 6, state
    if n >= binder.bind_workers:
        assert state["peak_while_binding"] == 0, state
    else:
        assert state["peak_while_binding"] == 1, state
    assert writer.gate.waits >= 1, "the other process's Events were held back while the shard bound"
    assert ledger.binding_marks() == (0, 0), "the mark is removed when the shard's last bind call ends"
