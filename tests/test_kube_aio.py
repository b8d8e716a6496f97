"""The asyncio connection of the per-pod writes (`shardsched.kube.aio`) against the HTTP peer on
127.0.0.1 (`SimApiServer`): the same typed errors as the blocking `Api`, credentials from the
kubeconfig and a refreshed token, binds bounded by ``bind_workers``."""

from __future__ import annotations

import socket
import threading
import time
import uuid

import pytest

from shardsched.kube.aio import AioApi
from shardsched.kube.client import ClientSpec, Garbage, TokenBucket, Unauthorized, Unreachable
from shardsched.kube.cluster import KubeCluster
from shardsched.cluster import NotFound, ServerError, Timeout

from builders import pod

SCHED = "shardsched-test"


@pytest.fixture
def api(simapi_spec):
    a = AioApi(simapi_spec)
    yield a
    a.close()


def test_requests_decode_json_and_raise_the_blocking_clients_typed_errors(simapi, api):
    assert api.request("GET", "/version", verb="get", resource="version")["major"] == "1"
    with pytest.raises(NotFound):
        api.request("GET", "/api/v1/namespaces/default/pods/nope", verb="get", resource="pods")
    simapi.fail("GET", "/version", action="garbage")
    with pytest.raises(Garbage):
        api.request("GET", "/version", verb="get", resource="version")
    simapi.fail("GET", "/version", status=429)
    with pytest.raises(ServerError) as e:
        api.request("GET", "/version", verb="get", resource="version")
    assert e.value.delay_s >= 0.1
    simapi.fail("POST", "/api/v1/namespaces/default/events", action="drop")  # (a GET aiohttp retries once)
    with pytest.raises(Unreachable):
        api.request("POST", "/api/v1/namespaces/default/events", verb="create", resource="events", body={})
    assert api.request("GET", "/version", verb="get", resource="version")["major"] == "1"  # still usable


def test_wrong_token_is_unauthorized(simapi, tmp_path):
    bad = AioApi(ClientSpec(kubeconfig=simapi.write_kubeconfig(str(tmp_path / "bad"), token="wrong")))
    try:
        with pytest.raises(Unauthorized):
            bad.request("GET", "/api/v1/nodes", verb="list", resource="nodes")
    finally:
        bad.close()


def _refused_kubeconfig(simapi, tmp_path) -> str:
    """A kubeconfig like the HTTP peer's that names a port nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = tmp_path / "refused"
    path.write_text(open(simapi.write_kubeconfig(str(tmp_path / "kc-good"))).read()
                    .replace(simapi.url, f"http://127.0.0.1:{port}"))
    return str(path)


def test_refused_connection_is_unreachable_and_a_slow_answer_a_timeout(simapi, tmp_path):
    refused = AioApi(ClientSpec(kubeconfig=_refused_kubeconfig(simapi, tmp_path)))
    try:
        with pytest.raises(Unreachable):
            refused.request("GET", "/version", verb="get", resource="version")
    finally:
        refused.close()
    slow = AioApi(ClientSpec(kubeconfig=simapi.write_kubeconfig(str(tmp_path / "kc2")), request_timeout_s=0.3))
    real = simapi.sim.bind_many
    simapi.sim.bind_many = lambda b: (time.sleep(1.0), real(b))[1]
    try:
        p = pod("slow", cpu="100m")
        p["metadata"].pop("uid")
        p = simapi.sim.create_pod(p)
        with pytest.raises(Timeout):
            slow.request("POST", "/api/v1/namespaces/default/pods/slow/binding", verb="create", resource="pods/binding",
                         body={"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "slow", "uid": p["metadata"]["uid"]},
                               "target": {"kind": "Node", "name": "n0"}})
    finally:
        simapi.sim.bind_many = real
        slow.close()


def test_a_refreshed_token_is_used_on_the_next_request(simapi, simapi_spec, monkeypatch):
    """An exec/OIDC kubeconfig refreshes its token through the blocking loader's hook; the asyncio
    connection picks the new token up (at most a second later, `_at_most_every`)."""
    real = ClientSpec.configuration
    current = {"token": simapi.token}

    def with_hook(self):
        cfg = real(self)

        def refresh(c):  # as the kubeconfig loader stores a token
            c.api_key["BearerToken"] = "Bearer " + current["token"]
        cfg.refresh_api_key_hook = refresh
        return cfg

    monkeypatch.setattr(ClientSpec, "configuration", with_hook)
    a = AioApi(simapi_spec)
    try:
        assert a.request("GET", "/api/v1/nodes", verb="list", resource="nodes")["items"]
        simapi.token = current["token"] = "rotated-" + uuid.uuid4().hex
        deadline = time.monotonic() + 5
        while True:
            try:
                a.request("GET", "/api/v1/nodes", verb="list", resource="nodes")
                break
            except Unauthorized:
                assert time.monotonic() < deadline, "the refreshed token was never sent"
                time.sleep(0.2)
    finally:
        a.close()


def test_rate_limit_applies_to_each_view(api):
    limited = api.with_bucket(TokenBucket(qps=20, burst=1))
    t0 = time.monotonic()
    for _ in range(5):
        limited.request("GET", "/version", verb="get", resource="version")
    assert time.monotonic() - t0 >= 0.18  # 1 at once, then 20/s: 4 waits of 50 ms
    t0 = time.monotonic()
    for _ in range(5):
        api.request("GET", "/version", verb="get", resource="version")  # the unlimited view does not wait
    assert limited.loop is api.loop


def _pending_pods(simapi, prefix: str, n: int) -> list[dict]:
    """``n`` pending pods of our scheduler created in the HTTP peer's cluster (with their uids)."""
    pods = []
    for i in range(n):
        p = pod(f"{prefix}{i}", cpu="1m")
        p["metadata"].pop("uid")
        p["spec"]["schedulerName"] = SCHED
        pods.append(simapi.sim.create_pod(p))
    return pods


def test_many_binds_with_few_slots_all_land_once(simapi, simapi_spec):
    pods = _pending_pods(simapi, "p", 120)
    kc = KubeCluster(simapi_spec, [SCHED], bind_workers=3, emit_scheduled=False)
    in_flight, peak, lock = [0], [0], threading.Lock()
    real = simapi.sim.bind_many

    def counting(bindings):
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        try:
            time.sleep(0.002)
            return real(bindings)
        finally:
            with lock:
                in_flight[0] -= 1

    simapi.sim.bind_many = counting
    try:
        results = kc.bind_many([("default", p["metadata"]["name"], f"n{i % 2}", p["metadata"]["uid"])
                                for i, p in enumerate(pods)])
        assert [r.code for r in results] == [201] * 120
        assert [r.name for r in results] == [p["metadata"]["name"] for p in pods]  # in order
        assert 1 <= peak[0] <= 3
        again = kc.bind_many([("default", "p0", "n1", pods[0]["metadata"]["uid"])])
        assert again[0].code == 409  # already bound: the API server's answer passes through
    finally:
        simapi.sim.bind_many = real
        kc.stop()


def test_a_binding_s_annotations_are_sent_in_its_metadata(simapi, simapi_spec):
    """The GPU devices travel in the Binding's ``metadata.annotations`` (the API server sets them
    on the pod with the binding): one request per pod, and a pod bound without them has none."""
    pods = _pending_pods(simapi, "g", 2)
    kc = KubeCluster(simapi_spec, [SCHED], bind_workers=2, emit_scheduled=False)
    try:
        results = kc.bind_many([("default", "g0", "n0", pods[0]["metadata"]["uid"], {"shardsched.io/gpu-devices": "0,3"}),
                                ("default", "g1", "n1", pods[1]["metadata"]["uid"])])
        assert [r.code for r in results] == [201, 201]
    finally:
        kc.stop()
    g0, g1 = simapi.sim.get_pod("default", "g0"), simapi.sim.get_pod("default", "g1")
    assert g0["spec"]["nodeName"] == "n0" and g0["metadata"]["annotations"]["shardsched.io/gpu-devices"] == "0,3"
    assert "shardsched.io/gpu-devices" not in (g1["metadata"].get("annotations") or {})


def _count_connections(monkeypatch) -> list[int]:
    """Count the TCP connections the HTTP peer accepts from now on (one handler per connection)."""
    from shardsched.testing import simapi as simapi_module

    accepted = [0]
    real_setup = simapi_module._Handler.setup

    def setup(self):
        accepted[0] += 1
        real_setup(self)

    monkeypatch.setattr(simapi_module._Handler, "setup", setup)
    return accepted


def test_connections_opened_ahead_serve_a_burst_of_binds_without_new_ones(simapi, simapi_spec, monkeypatch):
    accepted = _count_connections(monkeypatch)
    pods = _pending_pods(simapi, "w", 16)
    kc = KubeCluster(simapi_spec, [SCHED], bind_workers=4, emit_scheduled=False)
    real = simapi.sim.bind_many
    simapi.sim.bind_many = lambda b: (time.sleep(0.05), real(b))[1]  # slow enough that 4 are in flight
    try:
        assert kc.open_connections(2) == 8  # 2 binding cycles x 4 binds in flight
        assert accepted[0] == 8
        first, second = pods[:8], pods[8:]
        results = []
        cycles = [threading.Thread(target=lambda ps=ps: results.extend(
            kc.bind_many([("default", p["metadata"]["name"], "n0", p["metadata"]["uid"]) for p in ps])))
            for ps in (first, second)]
        for t in cycles:
            t.start()
        for t in cycles:
            t.join()
        assert sorted(r.code for r in results) == [201] * 16
        assert accepted[0] == 8  # the two cycles' binds (4 in flight each) used the open connections
    finally:
        simapi.sim.bind_many = real
        kc.stop()


def test_connections_opened_ahead_stay_within_the_bind_rate_limits_burst(simapi, tmp_path, monkeypatch):
    accepted = _count_connections(monkeypatch)
    spec = ClientSpec(kubeconfig=simapi.write_kubeconfig(str(tmp_path / "kc")), qps=10, burst=6, request_timeout_s=5)
    kc = KubeCluster(spec, [SCHED], bind_share=0.5, bind_workers=32, emit_scheduled=False)
    try:
        assert kc.open_connections(2) <= 3  # the bind share of the burst (half of 6), not 2 x 32
        assert 1 <= accepted[0] <= 3
    finally:
        kc.stop()


def test_opening_connections_to_an_unreachable_server_returns_0_without_raising(simapi, tmp_path):
    kc = KubeCluster(ClientSpec(kubeconfig=_refused_kubeconfig(simapi, tmp_path), qps=0), [SCHED], bind_workers=4,
                     emit_scheduled=False)
    try:
        t0 = time.monotonic()
        assert kc.open_connections(2) == 0
        assert time.monotonic() - t0 < 5
    finally:
        kc.stop()


def test_idle_connections_live_as_long_as_the_idle_setting(simapi, simapi_spec, monkeypatch):
    """The connector is ours (`IDLE_CONNECTION_S`, client-go's 90 s, not aiohttp's 15 s): set to
    0.3 s here, a connection idle for 1 s is closed and the next request opens a new one; within
    the setting it is reused."""
    from shardsched.kube import aio as aio_module

    monkeypatch.setattr(aio_module, "IDLE_CONNECTION_S", 0.3)
    accepted = _count_connections(monkeypatch)
    a = AioApi(simapi_spec)
    try:
        a.request("GET", "/version", verb="get", resource="version")
        a.request("GET", "/version", verb="get", resource="version")
        assert accepted[0] == 1  # reused while fresh
        time.sleep(1.0)
        a.request("GET", "/version", verb="get", resource="version")
        assert accepted[0] == 2  # closed after 0.3 s idle (aiohttp's own 15 s would have kept it)
    finally:
        a.close()
