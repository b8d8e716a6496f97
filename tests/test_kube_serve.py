"""``shardsched serve`` as a process: against the simulated cluster behind the Kubernetes API
(`SimApiServer`, always), and against a real kube-apiserver + etcd (``KUBEBUILDER_ASSETS``,
skipped with the reason otherwise). Covers binding, /healthz, /readyz, /metrics, RBAC denied
(waits, no crash loop), a bad kubeconfig, and leader election: two processes, one leader, the
standby takes over when the leader stops."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
import warnings

import pytest

from shardsched.bench.serve_cluster import register_node
from shardsched.testing import envtest
from shardsched.kube.client import Api, ClientSpec
from shardsched.testing.simapi import SimApiServer
from shardsched.sim.cluster import SimCluster

from builders import node, pod
from forked_cli import run_cli

SCHED = "shardsched"  # serve's profile without --config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, timeout_s: float = 60.0, what: str = "condition") -> None:
    """Until ``check()`` holds, polled every 0.1 s; at most ``timeout_s`` (a cap for a loaded
    machine, where a serve process takes tens of seconds to start: no test waits that long when
    it passes)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


class Serve:
    """One ``shardsched serve`` process (threads mode) with its metrics port."""

    def __init__(self, kubeconfig: str, redis_url: str, *args: str) -> None:
        self.port = free_port()
        cmd = [sys.executable, "-m", "shardsched.cli.main", "serve", "--kubeconfig", kubeconfig, "--mode", "threads",
               "--redis-url", redis_url, "--metrics-port", str(self.port), "--metrics-address", "127.0.0.1",
               "--kube-api-qps", "0", "--watch-timeout", "5", *args]
        self.out = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, stdout=self.out, stderr=subprocess.STDOUT, text=True)

    def readyz(self) -> tuple[int, dict]:
        code, body = http_get(self.port, "/readyz")
        try:
            return code, json.loads(body)
        except ValueError:
            return code, {}

    def leading(self) -> bool:
        code, body = http_get(self.port, "/metrics")
        return code == 200 and 'shardsched_leader{shard="serve"} 1.0' in body

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def output(self) -> str:
        self.out.seek(0)
        return self.out.read()


@pytest.fixture
def api_server():
    sim = SimCluster()
    sim.create_nodes([node(f"n{i}", cpu="8") for i in range(3)])
    with SimApiServer(sim, token="tok-" + uuid.uuid4().hex) as srv:
        yield srv


@pytest.fixture
def kubeconfig(api_server, tmp_path):
    return api_server.write_kubeconfig(str(tmp_path / "kubeconfig"))


@pytest.fixture
def processes():
    started: list[Serve] = []
    yield started
    for p in started:
        p.stop(signal.SIGKILL)


def create(sim: SimCluster, *names: str) -> None:
    pods = []
    for name in names:
        p = pod(name, cpu="100m")
        p["metadata"].pop("uid")
        p["spec"]["schedulerName"] = SCHED
        pods.append(p)
    sim.create_pods(pods)


def bound(sim: SimCluster, *names: str) -> bool:
    return all(sim.get_pod("default", n)["spec"].get("nodeName") for n in names)


def test_serve_binds_and_serves_health_and_metrics(api_server, kubeconfig, redis_server, processes):
    create(api_server.sim, "a", "b", "c")
    s = Serve(kubeconfig, redis_server.url, "--no-leader-elect")
    processes.append(s)
    wait_for(lambda: bound(api_server.sim, "a", "b", "c"), what="pods bound")
    assert http_get(s.port, "/healthz") == (200, "ok")
    assert s.readyz()[0] == 200
    code, metrics = http_get(s.port, "/metrics")
    assert code == 200 and "shardsched_kube_binds_total" in metrics and 'code="201"' in metrics
    assert s.stop() == 0
    # where it serves is progress, not a warning: INFO, shown without -v
    out = s.output()
    assert f"INFO shardsched.serve: serving /metrics, /healthz, /readyz on 127.0.0.1:{s.port}\n" in out, out[-3000:]
    assert "WARNING shardsched.serve: serving" not in out


def test_sigterm_while_binds_wait_on_the_rate_limit_exits_promptly(api_server, kubeconfig, redis_server, processes):
    """Binding cycles still out when SIGTERM comes (here held back by a low --kube-api-qps) are cut
    short: the process exits 0 within seconds instead of waiting on them forever."""
    names = [f"q{i:03d}" for i in range(300)]
    create(api_server.sim, *names)
    s = Serve(kubeconfig, redis_server.url, "--no-leader-elect", "--kube-api-qps", "20", "--kube-api-burst", "5")
    processes.append(s)
    wait_for(lambda: sum(1 for n in names if api_server.sim.get_pod("default", n)["spec"].get("nodeName")) >= 10,
             what="the first binds")
    t0 = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=40) == 0, s.output()[-3000:]
    assert time.monotonic() - t0 < 25
    assert sum(1 for n in names if api_server.sim.get_pod("default", n)["spec"].get("nodeName")) < len(names)
    assert api_server.sim.invariants()["double_binds"] == 0


def scheduled_events(srv: SimApiServer) -> set[str]:
    return {(ev.get("regarding") or ev.get("involvedObject") or {}).get("name") for ev in list(srv.events.values())
            if ev.get("reason") == "Scheduled"}


def test_sigterm_right_after_the_binds_writes_every_scheduled_event_first(api_server, kubeconfig, redis_server,
                                                                         processes):
    """The Events behind the binds (a low --kube-api-qps, and Events yield to binds) are still
    queued when SIGTERM comes right after the last bind: serve writes them all before it exits,
    within its stated grace period (--shutdown-grace-seconds), and exits 0."""
    names = [f"e{i:03d}" for i in range(230)]  # 23 of the 24 CPUs
    create(api_server.sim, *names)
    s = Serve(kubeconfig, redis_server.url, "--no-leader-elect", "--kube-api-qps", "30", "--kube-api-burst", "5",
              "--shutdown-grace-seconds", "20")
    processes.append(s)
    wait_for(lambda: bound(api_server.sim, *names), timeout_s=60, what="every pod bound")
    left = len(names) - len(scheduled_events(api_server))
    t0 = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=40) == 0, s.output()[-3000:]
    assert time.monotonic() - t0 < 5 + 20 + 5  # binds' grace + the Events' grace + the process' own stop
    # more than 5 s of writes at 30 requests/s: what serve's stop wrote before it had a grace period
    assert left > 5 * 30 + 5, f"the test needs more Events queued at SIGTERM than 5 s can write, not {left}"
    assert scheduled_events(api_server) == set(names), s.output()[-3000:]


def test_rbac_denied_waits_with_a_clear_reason_then_recovers(api_server, kubeconfig, redis_server, processes):
    api_server.deny("create", "pods/binding")
    create(api_server.sim, "x")
    s = Serve(kubeconfig, redis_server.url, "--no-leader-elect")
    processes.append(s)
    wait_for(lambda: s.readyz()[0] == 503 and "create pods/binding" in s.readyz()[1].get("reason", ""),
             what="readyz 503 naming the missing permission")
    assert s.proc.poll() is None, "RBAC denied must not crash the process"
    api_server.allow("create", "pods/binding")
    wait_for(lambda: bound(api_server.sim, "x"), 40, "pod bound once RBAC is fixed")
    assert s.stop() == 0


def test_a_candidate_denied_the_lease_says_so_instead_of_waiting_as_a_silent_standby(
        api_server, kubeconfig, redis_server, processes):
    api_server.deny("update", "leases")
    create(api_server.sim, "y")
    s = Serve(kubeconfig, redis_server.url, "--leader-elect", "--leader-elect-lease-namespace", "kube-system")
    processes.append(s)
    wait_for(lambda: s.readyz()[0] == 503 and "update coordination.k8s.io/leases shardsched in namespace kube-system"
             in s.readyz()[1].get("reason", ""), what="readyz 503 naming the Lease permission")
    assert not s.leading()
    api_server.allow("update", "leases")
    wait_for(lambda: bound(api_server.sim, "y"), 40, "pod bound once RBAC is fixed")
    assert s.leading()
    assert "RBAC denied" in s.output()
    assert s.stop() == 0


def test_readyz_says_when_the_leader_cannot_work(api_server, kubeconfig, processes):
    """Leading is not enough to be ready: /readyz answers 503 with the reason while the API
    server's watches fail or Redis does not answer, and 200 again once the watches work."""
    from shardsched.store.server import EmbeddedRedis

    redis = EmbeddedRedis().start()
    try:
        s = Serve(kubeconfig, redis.url, "--no-leader-elect")
        processes.append(s)
        wait_for(lambda: s.readyz() == (200, {"phase": "leading", "reason": ""}), 40, "ready")
        # the nodes' watch fails until the 503 is seen, then works again (a fixed count of failures
        # would make the test wait out the informer's growing backoff)
        api_server.fail("GET", "/api/v1/nodes", status=500, query="watch=true", times=1_000_000)
        api_server.cut_watches()
        wait_for(lambda: s.readyz()[0] == 503 and "watch nodes failing" in s.readyz()[1]["reason"], what="503")
        api_server.clear_faults()
        wait_for(lambda: s.readyz()[0] == 200, 40, "ready again")
        redis.stop()
        wait_for(lambda: s.readyz()[0] == 503 and "Redis not answering" in s.readyz()[1]["reason"], what="503")
        assert s.proc.poll() is None
    finally:
        redis.stop()


def test_the_leader_steps_down_when_its_coordinator_dies(api_server, kubeconfig, redis_server, processes):
    """Ray mode: the coordinator actor killed (its shards die with it). Holding the Lease while
    scheduling nothing would stall the cluster's pods for good: serve exits 4 and releases it."""
    import psutil

    create(api_server.sim, "before")
    s = Serve(kubeconfig, redis_server.url, "--mode", "ray", "--leader-elect", "--leader-elect-lease-namespace",
              "kube-system", "--leader-elect-lease-duration", "4", "--leader-elect-renew-deadline", "3",
              "--leader-elect-retry-period", "1")
    processes.append(s)
    wait_for(lambda: bound(api_server.sim, "before"), 90, "bound in ray mode")

    def shard_bind_counted() -> bool:  # the shards' own backend counters reach /metrics
        code, body = http_get(s.port, "/metrics")
        return code == 200 and any(line.startswith("shardsched_kube_binds_total{") and 'code="201"' in line
                                   and 'shard="' in line and not line.endswith(" 0.0") for line in body.splitlines())

    wait_for(shard_bind_counted, 20, "shardsched_kube_binds_total of a shard")

    def coordinator() -> psutil.Process | None:
        for p in psutil.Process(s.proc.pid).children(recursive=True):
            try:
                if "BackendCoordinatorHost" in " ".join(p.cmdline()):
                    return p
            except psutil.Error:
                continue
        return None

    wait_for(lambda: coordinator() is not None, 30, "the coordinator's worker process")
    coordinator().kill()
    assert s.proc.wait(timeout=60) == 4
    assert "the coordinator died" in s.output()
    lease = api_server.leases[("kube-system", "shardsched")]
    assert not lease["spec"].get("holderIdentity"), "released for a standby"


def test_a_malformed_redis_url_is_a_usage_error(tmp_path):
    proc = run_cli(["serve", "--redis-url", "notaurl",
                    "--mode", "threads"], timeout=60)
    assert proc.returncode == 2
    assert "Invalid value for '--redis-url': 'notaurl'" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_kubeconfig_exits_with_a_clear_message(tmp_path, redis_server):
    missing = str(tmp_path / "missing.kubeconfig")
    proc = run_cli(["serve", "--kubeconfig", missing,
                    "--mode", "threads", "--redis-url", redis_server.url], timeout=60)
    assert proc.returncode == 2
    assert f"kubeconfig {missing}: no such file" in proc.stderr


def leader_election_scenario(api_server_sim_create, bound_check, kubeconfig: str, redis_url: str,
                             processes: list, lease_namespace: str) -> None:
    """Two serve processes: one leads and binds; SIGTERM to it; the standby takes over and binds."""
    args = ["--leader-elect", "--leader-elect-lease-name", "shardsched", "--leader-elect-lease-namespace",
            lease_namespace, "--leader-elect-lease-duration", "4", "--leader-elect-renew-deadline", "3",
            "--leader-elect-retry-period", "1"]
    a, b = Serve(kubeconfig, redis_url, *args), Serve(kubeconfig, redis_url, *args)
    processes.extend([a, b])
    wait_for(lambda: a.leading() or b.leading(), 60, "a leader")
    time.sleep(1.5)
    assert a.leading() != b.leading(), "exactly one active coordinator"
    leader, standby = (a, b) if a.leading() else (b, a)
    # the standby reports its phase once its own start-up is done (slow on a loaded machine)
    wait_for(lambda: standby.readyz()[1].get("phase") != "starting", 30, "the standby's start-up")
    assert standby.readyz()[1].get("phase") == "standby"
    assert not standby.leading(), "the standby never leads while the leader renews"
    try:
        api_server_sim_create("first")
        wait_for(lambda: bound_check("first"), what="bound by the leader")
        assert leader.stop() == 0
        wait_for(standby.leading, 15, "the standby to take over")
        api_server_sim_create("second")
        wait_for(lambda: bound_check("second"), what="bound by the new leader")
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- leader's output:\n{leader.output()[-3000:]}\n"
                             f"--- standby's output:\n{standby.output()[-3000:]}") from None


def test_two_serve_processes_elect_one_leader_and_the_standby_takes_over(api_server, kubeconfig, redis_server,
                                                                        processes):
    leader_election_scenario(lambda n: create(api_server.sim, n), lambda n: bound(api_server.sim, n),
                             kubeconfig, redis_server.url, processes, "kube-system")
    lease = api_server.leases[("kube-system", "shardsched")]
    assert lease["spec"]["holderIdentity"]
    assert lease["spec"]["leaseTransitions"] == 1, "created (0), released, taken over by the standby (1)"


def run_bench(kubeconfig: str, redis_url: str, pods: int, nodes: int, *extra: str) -> tuple[dict, str]:
    """``serve --bench`` as a user runs it (``extra``: more arguments); returns its JSON report and
    its log (stderr)."""
    proc = run_cli(["serve", "--kubeconfig", kubeconfig,
                    "--mode", "threads", "--redis-url", redis_url, "--no-leader-elect", "--kube-api-qps", "0",
                    "--metrics-address", "127.0.0.1", "--metrics-port", "0", "--bench", str(pods), "--bench-nodes", str(nodes),
                    "--bench-timeout", "120", "-o", "json", *extra], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), proc.stderr


def check_bench_report(report: dict, pods: int) -> None:
    assert report["errors"] == []
    assert report["pods"] == report["bound"] == pods
    # the API server's rate from one client, measured before and after shardsched's window
    phases = report["api_baselines"]
    assert [b["phase"] for b in phases] == ["before", "after"] and all(b["binds"] == pods for b in phases)
    assert report["api_binds"] == 2 * pods
    assert report["api_bind_wall_s"] == pytest.approx(sum(b["wall_s"] for b in phases), abs=0.01)
    assert report["api_binds_per_s"] == pytest.approx(2 * pods / report["api_bind_wall_s"], rel=0.01)
    assert report["api_drift"] == pytest.approx(phases[1]["binds_per_s"] / phases[0]["binds_per_s"], rel=0.01)
    assert report["pods_per_s"] > 0 and report["api_binds_per_s"] > 0
    assert report["ratio"] == pytest.approx(report["pods_per_s"] / report["api_binds_per_s"], rel=0.01)
    assert 0 <= report["latency_ms"]["p50"] <= report["latency_ms"]["p99"]
    # the first bind came within the window, and no pod was bound before it
    assert 0 <= report["first_bind_s"] <= report["wall_s"]
    assert report["latency_ms"]["p50"] / 1000 >= report["first_bind_s"] - 0.05
    assert set(report["api_server_bind_ms"]) == {"baseline", "shardsched"}
    # each phase started after the API server was asked for a garbage collection (None: could not be asked)
    assert set(report["api_server_gc_s"]) == {"before", "shardsched", "after"}
    # the bench waited for the Scheduled Events (written behind the binds) before stopping the scheduler
    assert report["events_lag_s"] is not None and report["events_lag_s"] >= 0
    assert report["with_events_pods_per_s"] == pytest.approx(
        pods / (report["wall_s"] + report["events_lag_s"]), rel=0.01)
    assert report["ratio_with_events"] == pytest.approx(report["with_events_pods_per_s"] / report["api_binds_per_s"],
                                                        rel=0.01)


def check_server_cpu(report: dict) -> None:
    cpu = report["api_server_cpu"]
    for phase in ("baseline", "shardsched"):
        assert cpu[phase]["cores"] > 0 and cpu[phase]["ms_per_pod"] > 0, cpu
    assert cpu["busy_ratio"] == pytest.approx(cpu["shardsched"]["cores"] / cpu["baseline"]["cores"], rel=0.01)
    assert cpu["cost_ratio"] == pytest.approx(cpu["shardsched"]["ms_per_pod"] / cpu["baseline"]["ms_per_pod"], rel=0.01)
    # the same over the binds alone (the window closed at the last bind, before the Events that trail it)
    binds = report["api_server_cpu_binds"]
    assert binds["shardsched"]["cores"] > 0 and binds["shardsched"]["ms_per_pod"] > 0, binds
    assert binds["busy_ratio"] == pytest.approx(binds["shardsched"]["cores"] / cpu["baseline"]["cores"], rel=0.01)
    assert binds["cost_ratio"] == pytest.approx(binds["shardsched"]["ms_per_pod"] / cpu["baseline"]["ms_per_pod"],
                                                rel=0.01)


def test_serve_bench_reports_both_rates_and_cleans_up(api_server, kubeconfig, redis_server):
    """The benchmark mode: nodes made Ready for a kubelet-less API server, the API server's own
    binding rate, shardsched's rate and latency on a backlog, and nothing of it left behind; a
    node and a pod left by an earlier run killed with SIGKILL are named in a warning, and neither
    used nor deleted."""
    left = node("shardsched-bench-node-0000", cpu="1000", pods=10000)  # the naming of older versions
    left["metadata"]["labels"]["shardsched.io/bench"] = "true"
    left["spec"]["taints"] = [{"key": "shardsched.io/bench", "value": "true", "effect": "NoSchedule"}]
    api_server.sim.create_nodes([left])
    old_pod = pod("bench-0a0a0a-000000", cpu="1m")
    old_pod["metadata"].pop("uid")
    old_pod["metadata"]["labels"] = {"app": "shardsched-bench"}
    old_pod["spec"]["nodeName"] = left["metadata"]["name"]
    api_server.sim.create_pods([old_pod])
    before = len(api_server.sim.list_nodes()[0])
    assert before > 0  # the cluster's own nodes, which the bench must not use
    create(api_server.sim, "a-real-pending-pod")  # of the profile the bench is run for
    targets: list[str] = []
    real_bind = api_server.sim.bind_many

    names_bound, scheduled = [], []
    real_record = api_server.sim.record_event

    def record_event(ref, type_, reason, message):
        if reason == "Scheduled":
            scheduled.append(ref.get("name"))
        return real_record(ref, type_, reason, message)

    def recording(bindings):
        targets.extend(b[2] for b in bindings)
        names_bound.extend(b[1] for b in bindings if b[1].startswith("bench-") and not b[1].startswith("bench-api-"))
        return real_bind(bindings)

    api_server.sim.bind_many = recording
    api_server.sim.record_event = record_event
    try:
        report, log = run_bench(kubeconfig, redis_server.url, 150, 4)
    finally:
        api_server.sim.bind_many = real_bind
        api_server.sim.record_event = real_record
    check_bench_report(report, 150)
    # baselines and measured pods went onto this run's own nodes only
    assert len(targets) >= 450 and len({t.rsplit("-node-", 1)[0] for t in targets}) == 1
    assert all(t.startswith("shardsched-bench-") and t != "shardsched-bench-node-0000" for t in targets)
    assert ("1 node(s) and 1 pod(s) of an earlier bench run are still in the cluster" in log
            and "kubectl delete nodes -l shardsched.io/bench" in log), log[-3000:]
    assert api_server.sim.get_pod("default", "bench-0a0a0a-000000")["spec"]["nodeName"] == "shardsched-bench-node-0000"
    # the API server's own figures, from its /metrics (the simulated one serves its binds' durations and
    # its process's CPU): time per bind, cores busy and CPU per pod in both phases
    assert report["api_server_bind_ms"]["baseline"] > 0 and report["api_server_bind_ms"]["shardsched"] > 0
    check_server_cpu(report)
    assert len(api_server.sim.list_nodes()[0]) == before, "the bench's nodes are deleted at the end"
    assert [p["metadata"]["name"] for p in api_server.sim.list_pods()[0]
            if p["metadata"]["name"].startswith("bench-")] == ["bench-0a0a0a-000000"]
    # the Scheduled Events of the measured pods were written (the simulated cluster's record keeps
    # them), then deleted from the API server once the scheduler had stopped
    assert set(scheduled) == set(names_bound) and len(names_bound) == 150
    assert not [e for e in api_server.events.values()
                if (e.get("reportingController") or "").startswith("shardsched-bench-")]
    # the bench serves a scheduler name of its own: the cluster's pending pods are left alone
    real = api_server.sim.get_pod("default", "a-real-pending-pod")
    assert not real["spec"].get("nodeName")
    assert api_server.events_for("default", "a-real-pending-pod") == []


def test_serve_bench_null_run_binds_the_backlog_with_the_baselines_client(api_server, kubeconfig, tmp_path):
    """``--bench-null``: the same bench with the baseline's client in shardsched's window and no
    scheduler at all (it needs no Redis: an unreachable --redis-url is never used), so that its
    ratio shows how far the cluster's own rate scatters between phases."""
    before = len(api_server.sim.list_nodes()[0])
    bound_by: list[tuple[str, str]] = []
    real_bind = api_server.sim.bind_many
    scheduled: list[str] = []
    real_record = api_server.sim.record_event

    def recording(bindings):
        bound_by.extend((b[1], b[2]) for b in bindings)
        return real_bind(bindings)

    def record_event(ref, type_, reason, message):
        scheduled.append(ref.get("name"))
        return real_record(ref, type_, reason, message)

    api_server.sim.bind_many, api_server.sim.record_event = recording, record_event
    base = ["serve", "--kubeconfig", kubeconfig, "--mode", "threads",
            "--redis-url", "redis://127.0.0.1:1/0", "--no-leader-elect", "--kube-api-qps", "0", "--bench", "80",
            "--bench-nodes", "3", "--bench-null"]
    try:
        proc = run_cli(base + ["-o", "json"], timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        report = json.loads(proc.stdout)
        window = [(n, t) for n, t in bound_by if n.startswith("bench-") and not n.startswith("bench-api-")]
        table = run_cli(base, timeout=300)
    finally:
        api_server.sim.bind_many, api_server.sim.record_event = real_bind, real_record
    assert report["null"] is True and report["errors"] == []
    assert report["pods"] == report["bound"] == 80 and report["pods_per_s"] > 0
    assert [b["phase"] for b in report["api_baselines"]] == ["before", "after"]
    assert report["ratio"] == pytest.approx(report["pods_per_s"] / report["api_binds_per_s"], rel=0.01)
    # the measured window's 80 pods were bound by the bench's own client, round-robin over its 3 nodes,
    # and nothing wrote a Scheduled Event (no scheduler ran)
    assert len(window) == 80 and len({t for _, t in window}) == 3
    assert scheduled == [] and report["events_lag_s"] is None
    assert "null run: the baseline's client binds the backlog" in proc.stderr
    assert "scheduling pods of" not in proc.stderr
    # the table names what ran, and gives no verdict on a scheduler
    assert table.returncode == 0, table.stderr[-3000:]
    assert re.search(r"null run \(the baseline's client in shardsched's place\): 80/80 pending pods bound", table.stdout)
    assert re.search(r"ratio null run / API server: [\d.]+ \(no scheduler ran", table.stdout), table.stdout
    assert "target" not in table.stdout and "diagnosis" not in table.stdout
    # nothing of either run is left
    assert len(api_server.sim.list_nodes()[0]) == before
    assert not [p for p in api_server.sim.list_pods()[0] if p["metadata"]["name"].startswith("bench-")]
    # a null run is a kind of bench run
    alone = run_cli(["serve", "--kubeconfig", kubeconfig,
                     "--bench-null"], timeout=60)
    assert alone.returncode == 2 and "--bench-null is a kind of bench run: give --bench N too" in alone.stderr


def test_serve_bench_null_run_with_a_schedulers_watches(api_server, kubeconfig):
    """``--bench-null-watch``: the null window also holds the informers a scheduler of the bench's
    pods runs (their watch of the bench's schedulerName opened before the window), and they are
    closed before the second baseline; without ``--bench-null`` the flag is refused."""
    base = ["serve", "--kubeconfig", kubeconfig, "--mode", "threads",
            "--redis-url", "redis://127.0.0.1:1/0", "--no-leader-elect", "--kube-api-qps", "0", "--bench", "60",
            "--bench-nodes", "2"]
    seen = len(api_server.queries)
    proc = run_cli(base + ["--bench-null", "--bench-null-watch", "-o", "json"], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["null"] is True and report["null_watch"] is True and report["errors"] == []
    assert report["pods"] == report["bound"] == 60
    assert "(with a scheduler's watches)" in proc.stderr
    ours = [q for m, path, q in api_server.queries[seen:] if m == "GET" and path == "/api/v1/pods"
            and q.get("watch") == "true" and q.get("fieldSelector", "").startswith("spec.schedulerName=shardsched-bench-")]
    assert ours, "the null window held no watch of the bench's scheduler name"
    plain = run_cli(base + ["--bench-null", "-o", "json"], timeout=300)
    assert plain.returncode == 0 and json.loads(plain.stdout)["null_watch"] is False
    alone = run_cli(base + ["--bench-null-watch"], timeout=60)
    assert alone.returncode == 2 and "--bench-null-watch is a kind of null run: give --bench-null too" in alone.stderr


@pytest.mark.parametrize("qps", ["0", "200"])
def test_serve_bench_table_says_which_side_set_the_pace(api_server, kubeconfig, redis_server, qps):
    """The table output (serve's default) gives the API server's CPU in both phases; below the
    target it says why when it can: shardsched's own rate limit, or too few pods to tell."""
    proc = run_cli(["serve", "--kubeconfig", kubeconfig, "--mode",
                    "threads", "--redis-url", redis_server.url, "--no-leader-elect", "--kube-api-qps", qps,
                    "--metrics-address", "127.0.0.1", "--metrics-port", "0", "--bench", "60", "--bench-nodes",
                    "2"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    # the simulated API server has no /debug/pprof: the table says the phases were not aligned
    assert ("note: the API server could not be asked to collect its garbage before the first baseline, "
            "shardsched's window, the second baseline") in proc.stderr, proc.stderr[-3000:]
    assert re.search(r"shardsched: 60/60 pending pods bound in [\d.]+ s = [\d.]+ pods/s \(first bind [\d.]+ s after "
                     r"start-up ended\); pending->bound P50", out), out
    assert "API server: 120 binds from one client (2 baselines of 60 pods)" in out
    assert re.search(r"API server's CPU \(process_cpu_seconds_total\): [\d.]+ cores busy, [\d.]+ ms per bind during "
                     r"the baselines; [\d.]+ cores, [\d.]+ ms per pod while shardsched bound; [\d.]+ cores, [\d.]+ ms "
                     r"per pod until its Events were written", out), out
    line = re.search(r"ratio shardsched / API server: ([\d.]+) \([^)]*\); with its Events ([\d.]+)", out)
    assert line, out
    below = float(line[1]) < 0.9 or float(line[2]) < 0.9  # either ratio below the target gets a diagnosis
    if qps != "0":
        assert "diagnosis: shardsched's own client-side rate limit (--kube-api-qps 200) capped its binds" in out, out
        assert "its rate will show that limit, not the scheduler" in proc.stderr
    else:
        assert ("diagnosis: not given below 1000 pods" in out) == below, out


def test_serve_bench_diagnoses_each_ratio_below_the_target_with_its_own_window(capsys):
    """The bind ratio is explained by the server's CPU while shardsched bound, the ratio with the
    Events by its CPU until they were written; a ratio that meets the target gets no diagnosis."""
    from shardsched.cli import serve as serve_cli
    from shardsched.bench.serve_report import BenchReport

    class Finished:  # a bench whose phases already ran: the report is what they measured
        interrupted = False

    report = BenchReport(pods=4000, bound=4000, wall_s=4.0, pods_per_s=1000.0, api_binds=8000, api_bind_wall_s=8.0,
                         api_binds_per_s=1000.0, events_lag_s=4.0, with_events_pods_per_s=500.0)
    report.set_ratios()
    report.api_server_cpu = {"baseline": {"cores": 0.7, "ms_per_pod": 0.7}, "shardsched": {"cores": 0.5, "ms_per_pod": 1.0},
                             "busy_ratio": 0.71, "cost_ratio": 1.43}
    report.api_server_cpu_binds = {"shardsched": {"cores": 0.7, "ms_per_pod": 0.7}, "busy_ratio": 1.0, "cost_ratio": 1.0}
    kw = {"output": "table", "bench_timeout": 300.0, "bench_null": False}
    report.api_binds = 0  # measure/finish are not run again
    report.api_binds_per_s = 1000.0
    assert serve_cli._bench_report(Finished(), report, 0.0, kw, runtime=None) == 0
    out = capsys.readouterr().out
    assert "ratio shardsched / API server: 1.00 (target met: the API server is the limit); with its Events 0.50" in out
    assert "0.70 cores, 0.70 ms per pod while shardsched bound; 0.50 cores, 1.00 ms per pod until its Events" in out
    assert "diagnosis (binds)" not in out
    assert "diagnosis (with its Events): shardsched kept the API server less busy than the baseline's client did " \
           "(0.71x its CPU load; each pod cost the server 1.43x a bare bind)" in out


def test_the_bench_diagnosis_reads_the_api_servers_cpu():
    from shardsched.cli.serve import _bench_diagnosis

    as_busy = _bench_diagnosis({"busy_ratio": 0.97, "cost_ratio": 1.5}, "binds")
    assert as_busy.startswith("diagnosis (binds): ")
    assert "as busy as the baseline's client did (0.97x" in as_busy and "1.50x the CPU of a bare bind" in as_busy
    assert "not shardsched's pace" in as_busy
    idle = _bench_diagnosis({"busy_ratio": 0.6, "cost_ratio": 1.1})
    assert "less busy than the baseline's client did (0.60x" in idle and "shardsched, or the machine" in idle
    assert "unknown (the API server's /metrics could not be read)" in _bench_diagnosis({"busy_ratio": None})


def _bench_phase(pod_name: str) -> str:
    """Which phase of `serve --bench` binds this pod (names from `shardsched.bench.serve`)."""
    if not pod_name.startswith("bench-api-"):
        return "scheduling"
    return "baseline" if pod_name.split("-")[3].startswith("b") else "second baseline"


@pytest.mark.parametrize("phase", ["baseline", "scheduling", "second baseline"])
def test_serve_bench_stops_at_once_on_sigint(api_server, kubeconfig, redis_server, phase):
    """Ctrl-C while a baseline's binds are in flight (they are cancelled) or while shardsched binds
    the backlog: serve exits 0 within seconds (not when the phase would have ended), says so, and
    leaves none of the bench's pods and nodes behind."""
    real_bind = api_server.sim.bind_many
    started = threading.Event()

    def slow(bindings):
        # a 1,000-pod baseline would take ~20 s (0.6 s per bind, 32 in flight); shardsched's
        # window ~30 s (4 s per bind, up to 128 in flight)
        if _bench_phase(bindings[0][1]) == phase:
            started.set()
            time.sleep(4.0 if phase == "scheduling" else 0.6)
        return real_bind(bindings)

    nodes_before = len(api_server.sim.list_nodes()[0])
    api_server.sim.bind_many = slow
    try:
        proc = subprocess.Popen([sys.executable, "-m", "shardsched.cli.main", "serve", "--kubeconfig", kubeconfig,
                                 "--mode", "threads", "--redis-url", redis_server.url, "--no-leader-elect",
                                 "--kube-api-qps", "0", "--metrics-address", "127.0.0.1", "--metrics-port", "0",
                                 "--bench", "1000", "--bench-nodes", "2"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            assert started.wait(90), f"no bind of the {phase} phase"
            t0 = time.monotonic()
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=60)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
    finally:
        api_server.sim.bind_many = real_bind
    assert proc.returncode == 0, out[-3000:]
    expected = {"baseline": "bench interrupted while preparing",
                "scheduling": "interrupted (SIGINT/SIGTERM) while shardsched ran",
                "second baseline": "interrupted (SIGINT/SIGTERM) during the second baseline"}[phase]
    assert expected in out
    if phase == "scheduling":
        assert "interrupted before its 1000 pods were bound: not measured" in out
        assert "ratio shardsched / API server: not measured (interrupted)" in out
    # the baseline stops at once; shardsched's window ends with the scheduler's orderly stop (binds
    # in flight get 5 s, then the connection is closed), ~9 s in all with binds this slow
    limit = 20 if phase == "scheduling" else 10
    assert took < limit, f"serve took {took:.1f} s to stop after SIGINT: {out[-4000:]}"
    assert not [p for p in api_server.sim.list_pods()[0] if p["metadata"]["name"].startswith("bench-")]
    assert len(api_server.sim.list_nodes()[0]) == nodes_before, "the bench's nodes are deleted"


def test_a_bench_stopped_after_its_window_says_so_and_what_it_compares(kubeconfig):
    """A stop after the window, while the Events are still written or before the second baseline
    begins, marks the run interrupted with what that leaves out (it used to read as complete: no
    second baseline and no word of it, or a 60-s Events timeout that never elapsed)."""
    from shardsched.bench.serve import Bench
    from shardsched.bench.serve_report import BenchReport

    stop = threading.Event()
    bench = Bench(ClientSpec(kubeconfig=kubeconfig, qps=0), "shardsched-bench-x", stop=stop)
    report = BenchReport(pods=10, bound=10, wall_s=1.0, pods_per_s=10.0)
    report.api_baselines = [{"phase": "before", "binds": 10, "wall_s": 0.5, "binds_per_s": 20.0}]
    report.api_binds, report.api_bind_wall_s, report.api_binds_per_s = 10, 0.5, 20.0
    stop.set()
    bench.wait_events(report, lambda: 3, timeout_s=60)
    assert report.interrupted and report.events_lag_s is None
    assert report.errors == ["interrupted (SIGINT/SIGTERM) while the Scheduled Events were written (3 of 10): "
                             "the rate with Events is not measured"]
    bench._nodes = ["n0"]
    report = bench.finish(report)
    assert [b["phase"] for b in report.api_baselines] == ["before"]
    assert report.errors[-1] == ("interrupted (SIGINT/SIGTERM) before the second baseline: the window is compared "
                                 "with the first alone")
    assert report.ratio == pytest.approx(0.5)


def test_report_ratios_are_rounded_down_in_the_json():
    """``ratio >= 0.9`` on the JSON must not pass a 0.8996 (the table rounds down too)."""
    from shardsched.bench.serve_report import BenchReport

    report = BenchReport(ratio=0.8996, ratio_with_events=0.95, pods_per_s=812.34567)
    data = report.to_json()
    assert data["ratio"] == 0.899 and data["ratio_with_events"] == 0.95 and data["pods_per_s"] == 812.346


def test_bench_options_without_bench_are_refused(kubeconfig):
    """--bench-nodes, --bench-namespace and --bench-timeout alone would start a real scheduler with
    the given (often admin) credentials: refused, exit 2, before anything starts."""
    proc = run_cli(["serve", "--kubeconfig", kubeconfig,
                    "--mode", "threads", "--no-leader-elect", "--bench-nodes", "5", "--bench-namespace", "x"],
                   timeout=60)
    assert proc.returncode == 2
    assert ("error: --bench-nodes, --bench-namespace only apply to a bench run: give --bench N too "
            "(without it serve schedules the cluster's pods)") in proc.stderr
    assert "scheduling pods of" not in proc.stderr


def test_serve_bench_on_a_cluster_without_nodes_stops_before_scheduling(redis_server, tmp_path):
    """Nothing to measure: a clear error, exit 1, no scheduler started, nothing left behind."""
    with SimApiServer(SimCluster(), token="tok-" + uuid.uuid4().hex) as srv:
        kc = srv.write_kubeconfig(str(tmp_path / "kubeconfig"))
        proc = run_cli(["serve", "--kubeconfig", kc, "--mode",
                        "threads", "--redis-url", redis_server.url, "--no-leader-elect", "--metrics-address",
                        "127.0.0.1", "--metrics-port", "0", "--bench", "50"], timeout=120)
        assert proc.returncode == 1
        assert "--bench: the cluster has no nodes (use --bench-nodes K to create some)" in proc.stderr
        assert "scheduling pods of" not in proc.stderr
        assert not [p for p in srv.sim.list_pods()[0] if p["metadata"]["name"].startswith("bench-")]


def test_serve_bench_says_at_once_when_its_pods_cannot_all_fit(redis_server, tmp_path):
    """Nodes shardsched must refuse (a not-ready taint) or too small for the backlog: the bench says
    so before measuring, with the scheduler's own reason, instead of waiting for --bench-timeout
    (the baseline, which binds without asking the plugins, would have passed)."""
    sim = SimCluster()
    not_ready = node("not-ready", cpu="8")
    not_ready["spec"]["taints"] = [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]
    sim.create_nodes([not_ready])
    with SimApiServer(sim, token="tok-" + uuid.uuid4().hex) as srv:
        kc = srv.write_kubeconfig(str(tmp_path / "kubeconfig"))

        def bench(pods: int) -> subprocess.CompletedProcess:
            return run_cli(["serve", "--kubeconfig", kc, "--mode",
                            "threads", "--redis-url", redis_server.url, "--no-leader-elect", "--metrics-address",
                            "127.0.0.1", "--metrics-port", "0", "--bench", str(pods)], timeout=120)
        proc = bench(50)
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert ("--bench: only 0 of the 50 bench pods fit the nodes, shardsched would leave the rest pending: "
                "0/1 nodes are available: 1 node(s) had untolerated taint") in proc.stderr, proc.stderr[-3000:]
        assert "node.kubernetes.io/not-ready" in proc.stderr and "use --bench-nodes K" in proc.stderr
        small = node("small", cpu="8", pods=10)
        sim.create_nodes([small])
        existing = pod("running", cpu="1")
        existing["metadata"].pop("uid")
        existing["spec"]["nodeName"] = "small"
        sim.create_pods([existing])
        proc = bench(50)
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "only 9 of the 50 bench pods fit the nodes" in proc.stderr, proc.stderr[-3000:]
        assert "pass --bench 9 or fewer" in proc.stderr
        assert "scheduling pods of" not in proc.stderr
        # nothing measured, nothing bound, nothing left
        assert [p["metadata"]["name"] for p in sim.list_pods()[0]] == ["running"]


def test_serve_bench_without_its_own_nodes_uses_only_nodes_its_pods_may_go_onto(redis_server, tmp_path):
    """Without --bench-nodes the baseline binds only onto the nodes the fit check found feasible:
    never a cordoned node, nor a node a killed bench run left (its taint is not tolerated then)."""
    sim = SimCluster()
    cordoned = node("cordoned", cpu="8")
    cordoned["spec"]["unschedulable"] = True
    left = node("shardsched-bench-0a0a0a-node-0000", cpu="1000", pods=10000)
    left["metadata"]["labels"].update({"shardsched.io/bench": "true", "shardsched.io/bench-run": "0a0a0a"})
    left["spec"]["taints"] = [{"key": "shardsched.io/bench", "value": "true", "effect": "NoSchedule"}]
    sim.create_nodes([cordoned, left, node("ready", cpu="8", pods=500)])
    targets: list[str] = []
    real_bind = sim.bind_many

    def recording(bindings):
        targets.extend(b[2] for b in bindings)
        return real_bind(bindings)

    sim.bind_many = recording
    with SimApiServer(sim, token="tok-" + uuid.uuid4().hex) as srv:
        kc = srv.write_kubeconfig(str(tmp_path / "kubeconfig"))
        proc = run_cli(["serve", "--kubeconfig", kc, "--mode",
                        "threads", "--redis-url", redis_server.url, "--no-leader-elect", "--kube-api-qps", "0",
                        "--metrics-address", "127.0.0.1", "--metrics-port", "0", "--bench", "100", "-o", "json"],
                       timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["bound"] == 100 and [b["binds"] for b in report["api_baselines"]] == [100, 100]
    assert len(targets) == 300 and set(targets) == {"ready"}, set(targets)
    assert "1 node(s) and 0 pod(s) of an earlier bench run" in proc.stderr


def test_serve_bench_hints_and_an_incomplete_window(api_server, kubeconfig, redis_server):
    """--bench-nodes too few for the pods: the hint names how many; a window cut by --bench-timeout
    before every pod was bound gives no ratio (exit 1)."""
    def serve_bench(*args: str) -> subprocess.CompletedProcess:
        return run_cli(["serve", "--kubeconfig", kubeconfig,
                        "--mode", "threads", "--redis-url", redis_server.url, "--no-leader-elect",
                        "--kube-api-qps", "0", "--metrics-address", "127.0.0.1", "--metrics-port", "0", *args],
                       timeout=300)

    proc = serve_bench("--bench", "10001", "--bench-nodes", "1")
    assert proc.returncode == 1
    assert ("only 10000 of the 10001 bench pods fit the nodes, shardsched would leave the rest pending: 0/1 nodes are "
            "available: 1 Too many pods; each node the bench makes takes 10000 pods: use --bench-nodes 2 or more"
            in proc.stderr), proc.stderr[-2000:]

    real_bind = api_server.sim.bind_many

    def slow(bindings):
        if _bench_phase(bindings[0][1]) == "scheduling":
            time.sleep(0.5)
        return real_bind(bindings)

    api_server.sim.bind_many = slow
    try:
        proc = serve_bench("--bench", "300", "--bench-nodes", "2", "--bench-timeout", "1")
    finally:
        api_server.sim.bind_many = real_bind
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert re.search(r"ratio shardsched / API server: not comparable \(only \d+ of 300 pods bound before "
                     r"--bench-timeout\)", proc.stdout), proc.stdout
    assert "diagnosis" not in proc.stdout


def test_the_fit_check_counts_every_page_of_bound_pods(monkeypatch, tmp_path):
    """`Bench.check_fit` lists the pods already bound in pages (a large cluster's pods are not one
    response) and counts every page: 3 pods bound, pages of 2, room for 5."""
    import dataclasses

    from shardsched.config import load_config
    from shardsched.errors import PermanentError
    from shardsched.bench import serve_cluster
    from shardsched.bench.serve import Bench

    sim = SimCluster()
    sim.create_nodes([node("small", cpu="8", pods=5)])
    running = []
    for i in range(3):
        p = pod(f"running-{i}", cpu="1")
        p["metadata"].pop("uid")
        p["spec"]["nodeName"] = "small"
        running.append(p)
    sim.create_pods(running)
    monkeypatch.setattr(serve_cluster, "LIST_PAGE", 2)
    config = load_config(None)
    config = dataclasses.replace(config, profiles=[dataclasses.replace(config.profiles[0], scheduler_name="b-x")])
    with SimApiServer(sim) as srv:
        spec = ClientSpec(kubeconfig=srv.write_kubeconfig(str(tmp_path / "kubeconfig")))
        bench = Bench(spec, "b-x", config=config)
        bench.check_fit(2, config, ["small"])  # fits: no error
        with pytest.raises(PermanentError, match=r"only 2 of the 10 bench pods fit the nodes.*Too many pods"):
            bench.check_fit(10, config, ["small"])
        pages = [q for m, path, q in srv.queries if path == "/api/v1/pods"]
        assert len(pages) >= 4 and {q.get("limit") for q in pages} == {"2"}  # two checks, two pages each


def test_the_bench_observer_reports_binds_and_runs_without_the_cyclic_collector(tmp_path):
    """`observe` (the bench's observer process, run here in a thread of this process so that its
    effect on the collector can be read): it lists, says ready, reports each counted pod's bind
    and creation time once all are bound, and has turned the cyclic collector off (its full
    collections stalled the binds being measured)."""
    import gc
    import multiprocessing

    from shardsched.bench import serve_cluster as bench_mod

    sim = SimCluster()
    sim.create_nodes([node("n0", cpu="8")])
    made = []
    for i in range(3):
        p = pod(f"obs{i:06d}", cpu="10m")
        p["metadata"].pop("uid")
        p["metadata"]["labels"] = {"app": bench_mod.BENCH_APP}
        p["metadata"]["annotations"] = {bench_mod.CREATED_AT_ANNOTATION: "1000.5"}
        made.append(p)
    sim.create_pods(made)
    parent, child = multiprocessing.Pipe()
    was_enabled = gc.isenabled()
    try:
        with SimApiServer(sim) as srv:
            spec = ClientSpec(kubeconfig=srv.write_kubeconfig(str(tmp_path / "kubeconfig")))
            t = threading.Thread(target=bench_mod.observe, args=(spec, "default", "obs", 3, child), daemon=True)
            t.start()
            assert parent.poll(20) and parent.recv() == ("ready", None)
            assert not gc.isenabled()
            parent.send(("go", 20.0))
            sim.bind_many([("default", f"obs{i:06d}", "n0") for i in range(3)])
            assert parent.poll(20)
            msg, (bound_at, created_at) = parent.recv()
            parent.send(("stop", None))
            t.join(10)
    finally:
        if was_enabled:
            gc.enable()
    assert msg == "done" and not t.is_alive()
    assert set(bound_at) == set(created_at) == {f"obs{i:06d}" for i in range(3)}
    assert set(created_at.values()) == {1000.5} and all(v > 1000.5 for v in bound_at.values())


# ---------------------------------------------------------------------------------------- envtest
@pytest.fixture(scope="module")
def plane():
    folder, why = envtest.assets()
    if folder is None:
        warnings.warn(f"envtest serve tests skipped: {why}", stacklevel=1)
        pytest.skip(why)
    try:
        cp = envtest.ControlPlane(folder).start()
    except ImportError as e:
        pytest.skip(f"envtest needs the cryptography package: {e}")
    from pathlib import Path

    from kubernetes import utils

    admin_client = ClientSpec(kubeconfig=cp.kubeconfig("admin")).api_client()
    for f in sorted((Path(__file__).resolve().parent.parent / "deploy" / "rbac").glob("*.yaml")):
        utils.create_from_yaml(admin_client, str(f))
    yield cp
    cp.stop()


def test_envtest_serve_and_leader_election(plane, redis_server, processes):
    admin = Api(ClientSpec(kubeconfig=plane.kubeconfig("admin")).api_client(), None, (5.0, 30.0))
    for i in range(2):
        register_node(admin, {"metadata": {"name": f"env-n{i}"},
                           "status": {"allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"}}})

    def create_one(name: str) -> None:
        admin.request("POST", "/api/v1/namespaces/default/pods", verb="create", resource="pods",
                      body={"metadata": {"name": name}, "spec": {"schedulerName": SCHED, "containers": [
                          {"name": "c", "image": "registry.k8s.io/pause:3.9",
                           "resources": {"requests": {"cpu": "100m"}}}]}})

    def is_bound(name: str) -> bool:
        p = admin.request("GET", f"/api/v1/namespaces/default/pods/{name}", verb="get", resource="pods")
        return bool(p["spec"].get("nodeName"))

    leader_election_scenario(create_one, is_bound, plane.kubeconfig("scheduler"), redis_server.url, processes,
                             "kube-system")
    lease = admin.request("GET", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/shardsched", verb="get",
                          resource="leases")
    assert lease["spec"]["leaseTransitions"] == 1


def test_envtest_serve_bench(plane, redis_server):
    """`serve --bench` against the real API server (as its admin: the bench creates nodes)."""
    report, _ = run_bench(plane.kubeconfig("admin"), redis_server.url, 200, 4)
    check_bench_report(report, 200)
    # a real kube-apiserver collects its garbage when asked (--profiling is on by default; admin may)
    assert all(took is not None and took >= 0 for took in report["api_server_gc_s"].values()), report["api_server_gc_s"]
    # the real API server's own time per bind, read from its /metrics in both phases
    assert report["api_server_bind_ms"]["baseline"] > 0 and report["api_server_bind_ms"]["shardsched"] > 0
    check_server_cpu(report)  # process_cpu_seconds_total of the real kube-apiserver
    # the null run: the same phases with the baseline's client in the window, no scheduler, no Events
    null, _ = run_bench(plane.kubeconfig("admin"), redis_server.url, 200, 4, "--bench-null")
    assert null["null"] is True and null["errors"] == [] and null["bound"] == 200
    assert null["events_lag_s"] is None and null["ratio"] > 0
    check_server_cpu(null)
    # a namespace that does not exist is said before anything is made
    proc = run_cli(["serve", "--kubeconfig",
                    plane.kubeconfig("admin"), "--mode", "threads", "--redis-url", redis_server.url,
                    "--no-leader-elect", "--metrics-address", "127.0.0.1", "--metrics-port", "0", "--bench", "10",
                    "--bench-nodes", "1", "--bench-namespace", "nosuchns"], timeout=120)
    assert proc.returncode == 1 and "--bench-namespace 'nosuchns': no such namespace" in proc.stderr, proc.stderr[-2000:]
    # the bench's Scheduled Events were deleted once the scheduler stopped (the field selector on
    # reportingComponent is served by the real API server)
    spec = ClientSpec(kubeconfig=plane.kubeconfig("admin"))
    api = Api(spec.api_client(pool_size=2), None, (5, 30))
    events = api.request("GET", "/api/v1/namespaces/default/events", verb="list", resource="events")["items"]
    assert not [e for e in events if (e.get("reportingComponent") or "").startswith("shardsched-bench-")]
