"""The sharded runtime on the session's local Ray and real Redis: `EmbeddedRun` end to end (burst,
bind faults, a shard killed mid-run, the Alibaba trace), the coordinator and actors started directly
where a test needs to look into the simulated cluster, and ``shardsched run -o json`` as users run
it (a subprocess).

Every run checks the invariants of docs/design.md: no overcommitted node and no admission rejection, no
double bind, no lost pod. Sizes are small enough for a 2-core machine; `heavy` tests run a short
form unless ``SHARDSCHED_HEAVY=1``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner

from forked_cli import run_cli, warm
from shardsched.cli.main import cli
from shardsched.cli.run import _plot, _print_summary, _trace_replay
from shardsched.config import load_config
from shardsched.sharding.actors import coordinator_actor
from shardsched.sharding.sim_actor import sim_cluster_actor
from shardsched.sharding.embedded import EmbeddedRun
from shardsched.sharding.run_control import RunOptions
from shardsched.sharding.run_report import RunReport
from shardsched.sharding.shard import ShardOptions
from shardsched.sim import FaultConfig, trace, uniform_nodes, uniform_pods

SCHEDULER = "shardsched"
CONFIG = load_config("""\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: shardsched
""")
HEAVY = os.environ.get("SHARDSCHED_HEAVY") == "1"
TRACE = Path(__file__).parent / "data" / "alibaba-slice"
CLI = [sys.executable, "-m", "shardsched.cli.main"]
RUN_JSON_KEYS = {
    "pods_total", "pods_bound", "pods_unschedulable", "pods_pending", "throughput_pods_per_s", "latency_ms",
    "overcommitted_nodes", "double_binds", "lost_pods", "conflicts", "requeues", "shards", "shards_at_end", "nodes", "wall_s",
    "peak_rss_bytes",
}


@pytest.fixture(autouse=True)
def _ray(ray_session):
    """Every test here runs on the session's Ray, and leaves it running for the next."""
    yield
    assert ray_session.is_initialized(), "the runtime shut down a Ray it did not start"


def burst(n: int, cpu: str = "500m", prefix: str = "pod-") -> list[tuple[float, None, dict]]:
    return [(0.0, None, p) for p in uniform_pods(n, cpu=cpu, memory="1Gi", scheduler_name=SCHEDULER, prefix=prefix)]


def run(redis_server, nodes: list[dict], workload: list, on_progress=None, **options: Any) -> RunReport:
    options.setdefault("timeout_s", 180.0)  # a cap: a loaded machine starts the actors slowly
    return EmbeddedRun(CONFIG, nodes, workload, RunOptions(redis_url=redis_server.url, **options),
                       on_progress=on_progress).run()


def assert_counted_once(data: dict) -> None:
    """Every pod of the workload in exactly one of the report's counts."""
    assert (data["pods_bound"] + data["pods_unschedulable"] + data["pods_pending"] + data["pods_deleted_unbound"]
            + data["lost_pods"]) == data["pods_total"], data


def assert_invariants(data: dict) -> None:
    """The ``-o json`` report's invariants (docs/design.md 1-3)."""
    assert data["overcommitted_nodes"] == 0
    assert data["admission_rejections"] == 0
    assert data["double_binds"] == 0
    assert data["lost_pods"] == 0
    assert data["errors"] == []


# --------------------------------------------------------------------------------------- bursts


@pytest.mark.heavy
@pytest.mark.parametrize("shards", [2, 3])
def test_a_burst_is_all_bound(redis_server, shards):
    nodes, pods = (1000, 10_000) if HEAVY else (300, 3000)
    report = run(redis_server, uniform_nodes(nodes), burst(pods), shards=shards)
    data = report.to_json()

    assert_invariants(data)
    assert data["pods_bound"] == data["pods_total"] == pods
    assert data["pods_unschedulable"] == data["pods_pending"] == 0
    assert data["shards"] == data["shards_at_end"] == shards and data["nodes"] == nodes
    assert len(report.latencies_s) == pods and data["latency_ms"]["p99"] >= data["latency_ms"]["p50"] > 0
    assert data["throughput_pods_per_s"] > 0
    assert all(s["bound"] > 0 for s in report.shard_snapshots)  # every shard did its part


def test_bind_faults_lose_nothing_and_overcommit_nothing(redis_server):
    """The API answers 500s, spurious 409s and 504s (half of them applied): every pod still ends
    bound exactly once, and no bind whose answer was lost lets another pod take its room."""
    faults = FaultConfig(bind_error_rate=0.1, bind_conflict_rate=0.1, bind_timeout_rate=0.1)
    # a reservation kept after a lost answer holds its room for one reservation TTL: keep it short
    report = run(redis_server, uniform_nodes(50, cpu="4"), burst(340), shards=2, faults=faults,
                 shard_options=ShardOptions(reservation_ttl_ms=2000))
    data = report.to_json()

    assert_invariants(data)
    assert data["pods_bound"] == 340 and data["pods_pending"] == data["pods_unschedulable"] == 0
    assert report.invariants["injected_faults"]["timeouts_applied"] > 0
    assert data["requeues"] > 0 and data["conflicts"] > 0


def test_an_over_full_cluster_reports_the_surplus_as_unschedulable(redis_server):
    """20 nodes of 2 CPU, 50 pods of 1 CPU: 40 bound; 10 get kube's message, the PodScheduled=False
    condition and a FailedScheduling Event in the cluster; none lost."""
    with Deployment(redis_server.url, uniform_nodes(20, cpu="2"), shards=2) as d:
        d.create(uniform_pods(50, cpu="1", scheduler_name=SCHEDULER))
        status = d.wait_settled()
        inv = d.ask(d.cluster.invariants)
        pods = {p["metadata"]["name"]: p for p in d.ask(d.cluster.list_pods)[0]}
        unbound = inv["pods_unbound"]
        events = {k: d.ask(d.cluster.events_for, *k.split("/")) for k in unbound}
        reasons = d.ask(d.coordinator.unschedulable_reasons)
        tracked = set(d.ask(d.coordinator.pending_keys))

    message = ("0/20 nodes are available: 20 Insufficient cpu. preemption: 0/20 nodes are available: 20 No "
               "preemption victims found for incoming pod..")
    assert inv["pods_bound"] == 40 and len(unbound) == 10
    assert inv["overcommitted_nodes"] == [] and inv["admission_rejections"] == 0 and inv["double_binds"] == 0
    assert status["unschedulable"] == status["pending"] == 10
    assert reasons == {message: 10}
    assert set(unbound) == tracked  # not lost: the coordinator holds every one
    for key in unbound:
        [cond] = [c for c in pods[key.split("/")[1]]["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert (cond["status"], cond["reason"], cond["message"]) == ("False", "Unschedulable", message)
        assert any(e["type"] == "Warning" and e["reason"] == "FailedScheduling" and e["message"] == message
                   for e in events[key])


def test_a_burst_s_summary_says_what_each_figure_measures_and_the_plot_agrees(redis_server, capsys, tmp_path):
    """20 nodes of 2 CPU and 50 pods of 1 CPU: the table gives this run's figures with what each
    measures (the window of pods/s, why a burst's latency grows), replaced shards, coordinator
    restarts and requeues as rows, and no figure measured elsewhere; every sample of the plot comes
    from one read of the cluster, splits the workload as the summary does, and ends where it ends."""
    report = run(redis_server, uniform_nodes(20, cpu="2"), burst(50, cpu="1"), shards=2)
    data = report.to_json()
    _print_summary(report)
    out = capsys.readouterr().out

    assert (data["pods_bound"], data["pods_unschedulable"], data["pods_pending"]) == (40, 10, 0)
    assert "(report)" not in out and "kube-scheduler (report)" not in out
    assert "pods (burst)" in out and "over the scheduling window" in out and "first pod created to last pod bound" in out
    assert "a pod also waits for the pods ahead of it" in out and "bench field" in out and "docs/benchmarks.md" in out
    for label in ("requeues", "bind conflicts", "replaced shards", "coordinator restarts", "ledger rebuilds"):
        assert label in out
    assert f"{data['throughput_pods_per_s']:,.0f} pods/s" in out
    assert 0 < data["schedule_wall_s"] <= report.metered_s  # the window ends at the last bind

    samples = report.samples
    assert len(samples) >= 2 and [x.t_s for x in samples] == sorted(x.t_s for x in samples)
    for x in samples:  # each pod in one state at every moment, as in the summary
        assert (50 - x.created) + x.queued + x.unschedulable + x.running + x.deleted_bound + x.deleted_unbound == 50
        assert x.requested.get("cpu", 0) == 1000 * x.running
    last = samples[-1]
    assert (last.bound, last.unschedulable, last.pending(50)) == (40, 10, 0)
    assert report.allocatable["cpu"] == 20 * 2000 and report.created_first_s is not None
    assert 0 <= report.created_first_s <= report.created_last_s <= last.t_s

    plot = tmp_path / "run.svg"
    _plot(report, str(plot))
    assert f"plot: {plot} ({len(samples)} samples" in capsys.readouterr().err
    svg = plot.read_text()
    for text in ("pods bound / s", "requested / allocatable (%)", "seconds since the workload started", "last bind",
                 "pods being created", "unschedulable"):
        assert text in svg


def test_a_pod_whose_constraint_is_not_implemented_stays_pending_and_spread_pods_bind(redis_server):
    """A PersistentVolumeClaim that does not exist (VolumeBinding, with the storage objects the
    coordinator sends the shards: kube's words) and a resource claim (DynamicResources: not
    implemented, enabled in kube's default profile): each pod is refused, not placed in breach; it is
    kept by the coordinator, counted unschedulable with kube's message or one naming the plugin,
    and gets the PodScheduled=False condition and FailedScheduling Event. Required anti-affinity over hostnames is checked by the shards (the two
    replicas bind on two nodes); DoNotSchedule spread over hostnames, which no shard can check
    alone, binds on the nodes the coordinator nominates: one pod per node, on nodes of both shards."""
    anti1, anti2, claim, plain = uniform_pods(4, cpu="1", scheduler_name=SCHEDULER)
    for p, name in ((anti1, "anti1"), (anti2, "anti2")):
        p["metadata"].update(name=name, labels={"app": "w"})
        p["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "w"}}, "topologyKey": "kubernetes.io/hostname"}]}}
    claim["metadata"]["name"] = "claim"
    claim["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    [dra] = uniform_pods(1, cpu="1", scheduler_name=SCHEDULER, prefix="dra-")
    dra["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]
    dra["spec"]["containers"][0].setdefault("resources", {})["claims"] = [{"name": "gpu"}]
    spread = uniform_pods(4, cpu="100m", scheduler_name=SCHEDULER, prefix="spread-")
    for p in spread:
        p["metadata"]["labels"] = {"app": "s"}
        p["spec"]["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                                   "whenUnsatisfiable": "DoNotSchedule",
                                                   "labelSelector": {"matchLabels": {"app": "s"}}}]
    with Deployment(redis_server.url, uniform_nodes(4, cpu="2"), shards=2) as d:
        d.create([anti1, anti2, claim, dra, plain, *spread])
        status = d.wait_settled()
        inv = d.ask(d.cluster.invariants)
        pods = {p["metadata"]["name"]: p for p in d.ask(d.cluster.list_pods)[0]}
        events = d.ask(d.cluster.events_for, "default", "claim")
        reasons = d.ask(d.coordinator.unschedulable_reasons)
        tracked = set(d.ask(d.coordinator.pending_keys))

    not_helpful = " preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling.."
    message = '0/4 nodes are available: persistentvolumeclaim "data" not found.' + not_helpful
    dra_message = ("0/4 nodes are available: pod has resource claims of Dynamic Resource Allocation (gpu), which "
                   "shardsched does not implement (plugin DynamicResources)." + not_helpful)
    dra_key = f"default/{dra['metadata']['name']}"
    assert pods[plain["metadata"]["name"]]["spec"].get("nodeName")
    assert pods["anti1"]["spec"].get("nodeName") and pods["anti2"]["spec"].get("nodeName")
    assert pods["anti1"]["spec"]["nodeName"] != pods["anti2"]["spec"]["nodeName"]
    assert sorted(pods[p["metadata"]["name"]]["spec"].get("nodeName") or "" for p in spread) == [
        f"node-{i:05d}" for i in range(4)]
    assert sorted(inv["pods_unbound"]) == sorted(["default/claim", dra_key]) and tracked == {"default/claim", dra_key}
    assert status["unschedulable"] == status["pending"] == 2
    assert reasons == {message: 1, dra_message: 1}
    [cond] = [c for c in pods["claim"]["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "Unschedulable", message)
    assert any(e["reason"] == "FailedScheduling" and e["message"] == message for e in events)


def test_claims_bind_through_the_sharded_runtime(redis_server):
    """Four replicas, each with its own WaitForFirstConsumer claim, and three local PVs, one per
    node of three of the four nodes (what a StatefulSet on local volumes looks like), through two
    shard actors: three replicas bind, each on its PV's node with the PV bound to its claim (the
    ledger gave each PV to one pod, PreBind wrote the claimRef), the fourth is unschedulable with
    kube's words; a pod whose claim is bound to a PV labelled zone z1 lands in z1."""
    from test_coordinator import claim, claiming, storage_class, volume

    nodes = uniform_nodes(4, cpu="2")
    for i, n in enumerate(nodes):
        n["metadata"]["labels"]["topology.kubernetes.io/zone"] = f"z{i % 2}"
    with Deployment(redis_url=redis_server.url, nodes=nodes, shards=2) as d:
        for obj in (storage_class("local", "WaitForFirstConsumer"), storage_class("manual"),
                    *(volume(f"pv-{i}", node=f"node-{i:05d}", klass="local") for i in range(3)),
                    *(claim(f"data-{i}", klass="local") for i in range(4)),
                    volume("pv-zoned", "zoned", labels={"topology.kubernetes.io/zone": "z1"}), claim("zoned")):
            d.ask(d.cluster.create_volume_object, obj)
        pods = [p for i in range(4) for p in claiming(f"web-{i}-", f"data-{i}")] + claiming("zoned-", "zoned")
        for p in pods:
            p["spec"]["schedulerName"] = SCHEDULER
        d.create(pods)
        status = d.wait_settled(timeout_s=60.0)
        bound = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in d.ask(d.cluster.list_pods)[0]}
        claims = {c["metadata"]["name"]: c["spec"].get("volumeName") for c in d.ask(d.cluster.list_pvcs)[0]}
        reasons = d.ask(d.coordinator.unschedulable_reasons)
        inv = d.ask(d.cluster.invariants)

    placed = {i: bound[f"web-{i}-00000"] for i in range(4) if bound[f"web-{i}-00000"]}
    assert len(placed) == 3 and status["unschedulable"] == 1
    assert sorted(placed.values()) == ["node-00000", "node-00001", "node-00002"]
    for i, node in placed.items():
        assert claims[f"data-{i}"] == f"pv-{int(node[-1])}"
    assert bound["zoned-00000"] in ("node-00001", "node-00003")
    assert reasons == {"0/4 nodes are available: 4 node(s) didn't find available persistent volumes to bind. "
                       "preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling..": 1}
    assert inv["double_binds"] == 0 and inv["overcommitted_nodes"] == []


# ------------------------------------------------------------------------------------ shard death


def test_a_killed_shard_is_replaced_and_its_pods_still_bound(redis_server, ray_session):
    """Shard 0 is killed (SIGKILL through Ray) while pods keep arriving and binds are slow, so
    some of its pods are in flight under its leases. The coordinator replaces it; every pod ends
    bound within lease TTL + a few seconds of the kill (docs/design.md invariant 4)."""
    lease_ttl_s = 3.0
    n = 1500
    pods = uniform_pods(n, cpu="500m", scheduler_name=SCHEDULER)
    workload = [(3.0 * i / n, None, p) for i, p in enumerate(pods)]  # arriving over 3 s
    killed_at: list[float] = []
    progress: list[tuple[float, int]] = []  # (monotonic s, pods bound) as the run reports it
    holder: dict[str, EmbeddedRun] = {}

    def kill_once(bound: int, total: int, status: dict) -> None:
        progress.append((time.monotonic(), bound))
        if not killed_at and bound > 0:
            holder["run"].coordinator.kill_shard(0).wait(None)
            killed_at.append(time.monotonic())

    options = RunOptions(shards=2, redis_url=redis_server.url, timeout_s=60.0, time_scale=1.0,
                         faults=FaultConfig(bind_latency_s=0.02),
                         shard_options=ShardOptions(lease_ttl_ms=int(lease_ttl_s * 1000), reservation_ttl_ms=3000))
    holder["run"] = EmbeddedRun(CONFIG, uniform_nodes(200), workload, options, on_progress=kill_once)
    report = holder["run"].run()
    data = report.to_json()

    assert killed_at, "the shard was never killed"
    assert data["replaced_shards"] == 1
    assert_invariants(data)
    assert data["pods_bound"] == n and data["pods_pending"] == data["pods_unschedulable"] == 0
    all_bound_at = next(t for t, bound in progress if bound == n)
    health_s = 3 * 1.0 + 2.0  # 3 failed checks a second apart, + the last ping's timeout
    assert all_bound_at - killed_at[0] <= lease_ttl_s + health_s + 5.0


# ------------------------------------------------------------------------------------------ trace


def test_the_alibaba_trace_replays(redis_server):
    """The slice's 300 pods arrive and leave as in the trace, compressed into ~3 s: most live for
    minutes, i.e. well under a millisecond here, so creations, bindings and deletions of the same
    pod often reach the coordinator in one watch poll. The run must settle with nothing pending,
    nothing lost and nothing overcommitted."""
    nodes, _ = trace.load_nodes(TRACE / "openb_node_list_all_node.csv")
    pods, _ = trace.load_pods(TRACE / "openb_pod_list_default.csv", scheduler_name=SCHEDULER)
    span_s = max(p.creation_time_s for p in pods) - min(p.creation_time_s for p in pods)
    report = run(redis_server, nodes, [tuple(p) for p in pods], shards=2, time_scale=span_s / 3.0)
    data = report.to_json()

    assert_invariants(data)
    assert data["pods_total"] == len(pods) == 300 and data["nodes"] == len(nodes) == 140
    assert data["pods_pending"] == 0
    assert report.samples[-1].bound > 0  # pods the coordinator saw bound (all are deleted by the end)
    # pods bound and then deleted at their trace end time count as bound; each pod is counted once
    assert data["pods_bound"] > 0 and data["throughput_pods_per_s"] > 0
    assert_counted_once(data)
    for message in data["unschedulable_reasons"]:
        assert message.startswith(f"0/{len(nodes)} nodes are available: ")


# --------------------------------------------------------------------------------------------- CLI


def test_shardsched_run_json_contract(tmp_path):
    """``shardsched run -o json`` as a user runs it (its own Ray and Redis, started and stopped)."""
    proc = subprocess.run(CLI + ["run", "--nodes", "20", "--pods", "200", "--shards", "2", "-o", "json",
                                 "--timeout", "60"], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    # its detached actors live in shardsched's Ray namespace: no warning from Ray about an anonymous one
    assert "anonymous namespace" not in proc.stdout + proc.stderr

    assert RUN_JSON_KEYS <= set(data)
    assert set(data["latency_ms"]) == {"avg", "p50", "p99"}
    assert_invariants(data)
    # 20 nodes of 8 CPU and 110 pods each hold 160 pods of 1 CPU: the rest is unschedulable
    assert (data["pods_total"], data["pods_bound"], data["pods_unschedulable"], data["pods_pending"]) == (200, 160, 40, 0)
    assert data["unschedulable_reasons"] == {"0/20 nodes are available: 20 Insufficient cpu. preemption: 0/20 nodes "
                                             "are available: 20 No preemption victims found for incoming pod..": 40}
    assert (data["shards"], data["nodes"]) == (2, 20)
    assert data["conflicts"] >= 0 and data["requeues"] >= 40
    assert data["wall_s"] > 0 and data["peak_rss_bytes"] > 0 and data["throughput_pods_per_s"] > 0


# ------------------------------------------------------------------------------------ the pieces


class Deployment:
    """The runtime's actors started directly, as `EmbeddedRun` starts them, so that a test can look
    into the simulated cluster while they run; killed on exit."""

    def __init__(self, redis_url: str, nodes: list[dict], shards: int, faults: FaultConfig | None = None,
                 shard_options: ShardOptions | None = None, **coordinator_options: Any) -> None:
        import ray

        self.ray = ray
        self.cluster = sim_cluster_actor(seed=0, faults=faults)
        self.ask(self.cluster.create_nodes, nodes)
        self.coordinator = coordinator_actor(CONFIG, redis_url, f"test-{uuid.uuid4().hex[:8]}:", self.cluster,
                                             shards, shard_options or ShardOptions(), **coordinator_options)

    def __enter__(self) -> "Deployment":
        self.ask(self.coordinator.start)
        return self

    def __exit__(self, *exc: object) -> None:
        actors = [self.cluster, self.coordinator]
        try:
            actors += self.ask(self.coordinator.shards)
            self.ask(self.coordinator.stop)
        finally:
            for a in actors:
                self.ray.kill(a, no_restart=True)

    def ask(self, method, *args: Any) -> Any:
        return self.ray.get(method.remote(*args), timeout=120)  # a cap: start creates the shard actors

    def create(self, pods: list[dict]) -> None:
        self.ask(self.cluster.create_pods, pods)

    def wait_settled(self, timeout_s: float = 30.0) -> dict:
        """Until every pod not bound is known to the coordinator as unschedulable (what
        `EmbeddedRun` waits for); returns the coordinator's status."""
        deadline = time.monotonic() + timeout_s
        while True:
            counts = self.ask(self.cluster.progress)
            status = self.ask(self.coordinator.status)
            if counts["unbound"] == status["unschedulable"] == status["pending"]:
                return status
            assert time.monotonic() < deadline, f"not settled: {counts} {status}"
            time.sleep(0.1)


def test_a_trace_replay_says_how_its_time_is_compressed(capsys):
    """Without --time-scale the run says how long the replay takes and why (time divided, pauses
    shortened, so that each pod lives at least 0.25 s); a given scale is kept and uniform, with a
    warning when the replay outlasts --timeout and when pods live too briefly to be scheduled."""
    pods, _ = trace.load_pods(TRACE / "openb_pod_list_default.csv", scheduler_name=SCHEDULER)
    workload = [tuple(p) for p in pods]

    plan = _trace_replay(workload, None, 600.0)
    assert (plan.time_scale, plan.max_pause_s) == (20.0, 0.25)
    err = capsys.readouterr().err
    assert err == (f"note: replaying 149.3 days of trace (300 pods) in about {plan.duration_s:.0f} s: time divided by "
                   "20 and every pause shortened to at most 0.25 s, so that each pod lives at least 0.25 s (the "
                   "shortest lives 5 s of trace); a pod due for deletion before it is bound or found unschedulable "
                   "holds the replay up to 10 s; --time-scale N divides time by N instead\n")
    _trace_replay(workload, None, 60.0)
    assert f"longer than --timeout 60 s; raise --timeout to at least {plan.duration_s:.0f}\n" in capsys.readouterr().err

    assert _trace_replay(workload, 1000.0, 600.0).time_scale == 1000.0
    err = capsys.readouterr().err
    assert "in about 12903 s at time scale 1000" in err and "longer than --timeout 600" in err
    assert "at this scale 111 of the 300 pods live under 250 ms" in err  # trace lifetimes under 250 s


def test_a_default_trace_replay_binds_its_pods_and_says_what_became_of_them(redis_server, capsys):
    """The slice's first 40 pods at the default compression (about 15 s): each lives long enough to
    be scheduled, and the replay waits at a pod's end for its bind, so all that fit are bound
    before their trace end deletes them; the table counts the pods deleted after and before binding and the
    peak share of CPU and GPUs requested, and has no burst's rows."""
    nodes, _ = trace.load_nodes(TRACE / "openb_node_list_all_node.csv")
    pods, _ = trace.load_pods(TRACE / "openb_pod_list_default.csv", scheduler_name=SCHEDULER)
    workload = [tuple(p) for p in pods[:40]]
    plan = trace.replay_compression(workload)
    report = run(redis_server, nodes, workload, shards=2, time_scale=plan.time_scale,
                 trace_max_pause_s=plan.max_pause_s, trace_bind_wait_s=plan.bind_wait_s)
    data = report.to_json()
    _print_summary(report)
    out = capsys.readouterr().out

    assert_invariants(data)
    assert_counted_once(data)
    # openb-pod-0017 asks for 8 GPUs, the slice's nodes have at most 2: unschedulable until its end
    assert (data["pods_bound"], data["pods_deleted_unbound"], data["pods_pending"]) == (39, 1, 0)
    last = report.samples[-1]
    assert last.bound == data["pods_bound"] and last.deleted_unbound == data["pods_deleted_unbound"]
    assert last.deleted_bound + last.running == data["pods_bound"]
    assert "pods (trace replay)" in out and f"{last.deleted_bound:,} deleted after binding" in out
    assert "deleted before bound" in out and "GPU requested, peak" in out and "CPU requested, peak" in out
    assert "throughput" not in out and "ahead of it" not in out
    gpu = max(x.requested.get(trace.GPU_MILLI_RESOURCE, 0) for x in report.samples)
    assert gpu > 0 and f"{100 * gpu / report.allocatable[trace.GPU_MILLI_RESOURCE]:.1f}%" in out


# ------------------------------------------------------------------------- CLI: input and signals


@pytest.mark.parametrize("args, option", [
    (["--node-cpu", "2Gx"], "--node-cpu"),
    (["--pod-cpu", "-1"], "--pod-cpu"),
    (["--node-memory", "abc"], "--node-memory"),
    (["--pod-memory", "1Qi"], "--pod-memory"),
    (["--plot", "/nonexistent/dir/p.png"], "--plot"),
    (["--plot", "p.txt"], "--plot"),
    (["--plot", "plot"], "--plot"),
], ids=["node-cpu", "negative-pod-cpu", "node-memory", "pod-memory", "plot-folder", "plot-format", "plot-no-extension"])
def test_run_rejects_a_bad_value_before_starting(args, option):
    result = CliRunner().invoke(cli, ["run", *args])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("command, args, message", [
    ("run", ["--autoscale", "--min-shards", "4", "--max-shards", "2"], "--min-shards 4 is above --max-shards 2"),
    ("serve", ["--autoscale", "--min-shards", "4", "--max-shards", "2"], "--min-shards 4 is above --max-shards 2"),
    ("run", ["--trace", "pods.csv"], "--trace and --trace-nodes go together"),
], ids=["run-inverted-shard-range", "serve-inverted-shard-range", "run-trace-alone"])
def test_inconsistent_options_are_usage_errors(command, args, message):
    result = CliRunner().invoke(cli, [command, *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("flag, value", [
    ("--redis-url", "redis://127.0.0.1:{port}/0"),
    ("--ray-address", "127.0.0.1:{port}"),
], ids=["redis", "ray"])
def test_run_says_in_one_line_that_redis_or_ray_does_not_answer(flag, value, tmp_path):
    """Checked before Ray starts (Redis) or before Ray retries for minutes (its address)."""
    warm()
    started = time.monotonic()
    proc = run_cli(["run", "--nodes", "2", "--pods", "2", flag, value.format(port=_free_port())], timeout=60,
                   cwd=str(tmp_path))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"error: {flag}") and proc.stderr.count("\n") == 1, proc.stderr
    assert time.monotonic() - started < 15


class RunProcess:
    """``shardsched -v run ...`` in a subprocess, its stderr read as it comes (to wait for a log
    line before sending a signal); Ray's processes seen before it started are remembered so that
    `ray_orphans` finds only its own."""

    def __init__(self, cwd: Path, *args: str) -> None:
        self.before = {p.pid for p in psutil.process_iter()}
        # its own process group, as a command started from a shell: Ctrl-C goes to the group
        self.proc = subprocess.Popen(CLI + ["-v", "run", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, cwd=cwd, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True)
        self._reader.start()

    def wait_for(self, text: str, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None, f"exited {self.proc.returncode} before {text!r}: {self.stderr[-3000:]}"
            assert time.monotonic() < deadline, f"no {text!r} within {timeout_s} s: {self.stderr[-3000:]}"
            time.sleep(0.05)

    def finish(self, timeout_s: float = 120.0) -> tuple[int, str]:
        out = self.proc.stdout.read()
        self.proc.wait(timeout_s)
        self._reader.join(10)
        return self.proc.returncode, out

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def ray_orphans(self, grace_s: float = 10.0) -> list[str]:
        """Ray processes started by the run that outlived it (re-parented to init), after ``grace_s``."""
        deadline = time.monotonic() + grace_s
        while True:
            left = []
            for p in psutil.process_iter(["pid", "ppid", "cmdline"]):
                cmd = " ".join(p.info["cmdline"] or [])
                if p.info["pid"] not in self.before and p.info["ppid"] == 1 and "ray" in cmd:
                    left.append(f"{p.info['pid']} {cmd[:120]}")
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)


#: a run that lasts several seconds on 2 cores: small batches, each bind call answered in 100 ms
SLOW_RUN = ["--nodes", "20", "--pods", "1000", "--pod-cpu", "100m", "--pod-memory", "100Mi", "--max-batch-size", "20",
            "--bind-latency-ms", "100", "-o", "json", "--timeout", "120"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_run_stops_it_in_order_and_counts_each_pod_once(sig, tmp_path):
    """SIGINT (Ctrl-C) or SIGTERM to the main process while pods are in flight: the summary comes,
    says it was interrupted, counts each pod once with none lost, and the exit status is 128 +
    the signal's number (not 3, the invariant's); Ray is shut down."""
    run_ = RunProcess(tmp_path, *SLOW_RUN)
    run_.wait_for("scheduling: 1000 pods")
    time.sleep(1.5)
    run_.proc.send_signal(sig)
    code, out = run_.finish()

    assert code == 128 + sig, run_.stderr[-3000:]
    data = json.loads(out)
    assert data["interrupted"] == sig.name and data["started"] is True
    assert_counted_once(data)
    assert data["lost_pods"] == 0 and data["double_binds"] == 0 and data["overcommitted_nodes"] == 0
    assert 0 < data["pods_bound"] < 1000 and data["pods_pending"] > 0
    assert "SIGTERM received" not in run_.stderr and "Traceback" not in run_.stderr
    assert run_.ray_orphans() == []


@pytest.mark.parametrize("sig, group, after_s", [
    (signal.SIGINT, False, 1.0), (signal.SIGTERM, False, 1.0), (signal.SIGINT, True, 1.0), (signal.SIGINT, True, 2.0),
], ids=["SIGINT", "SIGTERM", "ctrl-c-early", "ctrl-c-late"])
def test_a_signal_during_start_up_says_so_and_leaves_no_ray_process(sig, group, after_s, tmp_path):
    """The signal while Ray starts, to the main process or to its whole process group (Ctrl-C in
    a shell): one line (no table of zeros), 128 + the signal's number, and nothing of Ray left
    running (Ray's agents ignore SIGTERM: interrupted in the middle of ray.init, they used to
    outlive the run)."""
    run_ = RunProcess(tmp_path, "--nodes", "2", "--pods", "2")
    run_.wait_for("starting Redis, Ray")
    time.sleep(after_s)
    if group:
        os.killpg(run_.proc.pid, sig)
    else:
        run_.proc.send_signal(sig)
    code, out = run_.finish()

    assert code == 128 + sig, run_.stderr[-3000:]
    assert out == "" and f"interrupted during start-up ({sig.name})" in run_.stderr
    assert "Traceback" not in run_.stderr
    assert run_.ray_orphans() == []


def test_a_killed_embedded_redis_is_reported_and_started_again(tmp_path):
    """SIGKILL to the redis-server that ``run`` started: the run says so, starts it again on the
    same port, the coordinator rebuilds the ledger, and every pod is still bound."""
    run_ = RunProcess(tmp_path, *SLOW_RUN)
    run_.wait_for("scheduling: 1000 pods")
    redis_proc = next(p for p in psutil.Process(run_.proc.pid).children() if "redis-server" in p.name())
    port = next(c.laddr.port for c in redis_proc.net_connections() if c.status == psutil.CONN_LISTEN)
    time.sleep(1.0)
    redis_proc.kill()
    code, out = run_.finish()

    assert code == 0, run_.stderr[-3000:]
    data = json.loads(out)
    assert [(r["pid"], r["exit"]) for r in data["redis_restarts"]] == [(redis_proc.pid, "killed by SIGKILL")]
    assert data["ledger_rebuilds"] >= 1
    assert f"redis-server (pid {redis_proc.pid}) exited (killed by SIGKILL)" in run_.stderr
    assert f"starting it again on port {port}" in run_.stderr
    assert_invariants(data)
    assert data["pods_bound"] == 1000


def test_ctrl_c_while_the_run_reads_its_input_exits_130_with_one_line(tmp_path):
    """A Ctrl-C before the run's own handlers are set (its input files are being read: here a
    trace that is a pipe nobody writes to, so the read waits) exits 130 with one line, not with
    click's "Aborted!" and status 1."""
    fifo = tmp_path / "trace.csv"
    os.mkfifo(fifo)
    # as from a terminal: SIGINT at its default (a test session started in the background of a
    # script ignores it, and a child inherits that until it sets a handler of its own)
    proc = subprocess.Popen(CLI + ["run", "--trace", str(fifo), "--trace-nodes", str(fifo)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(3)  # imported, reading the pipe
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == "interrupted during start-up (SIGINT); nothing was scheduled", err[-3000:]
    assert "Aborted!" not in err and out == ""


def test_a_run_that_times_out_exits_4_and_still_plots(tmp_path):
    """--timeout with pods pending: exit status 4, each pod counted once; a short run's plot has
    samples from its first moments (the sampling period starts short)."""
    plot = tmp_path / "p.png"
    proc = subprocess.run(CLI + ["run", *SLOW_RUN[:-2], "--timeout", "2", "--plot", str(plot)],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 4, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert data["timed_out"] is True and data["interrupted"] is None
    assert_counted_once(data)
    assert data["lost_pods"] == 0 and data["pods_pending"] > 0
    # the note gives the summary's pending count (not the coordinator's, which has the unschedulable too)
    assert f"timed out after 2 s with {data['pods_pending']} pods pending" in data["errors"]
    assert plot.stat().st_size > 0 and f"plot: {plot} (" in proc.stderr


def test_a_plot_format_matplotlib_cannot_write_is_refused_before_the_run():
    """``--plot x.txt``: exit status 2 at once, naming the formats that work."""
    result = CliRunner().invoke(cli, ["run", "--plot", "x.txt"])
    assert result.exit_code == 2, result.output
    assert "'.txt' is not an image format matplotlib writes; use one of " in result.output and ".png" in result.output
    assert "starting" not in result.output and "Traceback" not in result.output
