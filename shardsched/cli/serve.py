"""``shardsched serve``: schedule the pods of a real cluster, next to the default scheduler."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import signal
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import click
from click.core import ParameterSource

from shardsched.cli import MAX_BATCH_SIZE_HELP, autoscale_options, autoscaler_from, redis_url_option
from shardsched.errors import ConfigError, PermanentError, ShardschedError, TemporaryError

log = logging.getLogger("shardsched.serve")

#: upstream's lock name; shardsched must never contend for kube-scheduler's own Lease
UPSTREAM_LOCK = "kube-scheduler"
DEFAULT_LOCK = "shardsched"

EXIT_CONFIG, EXIT_LOST, EXIT_COORDINATOR = 2, 3, 4
#: how often the leader checks that its coordinator is alive (seconds)
COORDINATOR_CHECK_S = 2.0
#: binding cycles each shard runs in the background while it schedules its next batch
#: (`ShardOptions.binding_cycles`): a batch's binds against an API server take most of a second
BINDING_CYCLES = 2

#: the profile served without --config: kube's defaults under the name "shardsched", so that nothing
#: is taken from the default scheduler unless a pod asks for shardsched
DEFAULT_PROFILE = """apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: shardsched
"""


class _State:
    """What /healthz, /readyz and /metrics report; written by the main loop."""

    def __init__(self) -> None:
        self.phase = "starting"  # starting | standby | waiting | leading | stopping
        self.reason = ""
        self.runtime = None
        self.leading = False


def _health_server(state: _State, address: str, port: int) -> ThreadingHTTPServer:
    """``/healthz`` (the process runs), ``/readyz`` (standby, or leading with Redis answering and
    the watches working: 200; else 503 and why), ``/metrics`` (Prometheus text: shards, coordinator, Kubernetes backend)."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    from shardsched.metrics import AggregateCollector

    def families() -> dict[str, list]:
        out = state.runtime.metric_families() if state.runtime is not None and state.phase == "leading" else {}
        out["serve"] = [("shardsched_leader", "gauge", "1 when this process is the active coordinator.",
                         [("shardsched_leader", {}, 1.0 if state.leading else 0.0)])]
        return out

    registry = CollectorRegistry()
    registry.register(AggregateCollector(families))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?")[0]
            if path == "/healthz":
                return self._send(200, b"ok")
            if path == "/readyz":
                ready = state.phase in ("standby", "leading")
                detail = {"phase": state.phase, "reason": state.reason}
                if state.phase == "leading" and state.runtime is not None:
                    problems = state.runtime.problems()  # Redis away, the API server's watches failing
                    if problems:
                        ready, detail["reason"] = False, "; ".join(problems)
                return self._send(200 if ready else 503, json.dumps(detail).encode(), "application/json")
            if path == "/metrics":
                return self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            self._send(404, b"not found")

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server


def _whole_s(value_s: float, field: str) -> int:
    """A leaderElection duration in whole seconds (the client's leader election counts seconds),
    with a warning when the file's value had to be rounded."""
    whole = max(1, round(value_s))
    if whole != value_s:
        log.warning("leaderElection.%s: %g s rounded to %d s (leader election counts whole seconds)",
                    field, value_s, whole)
    return whole


def _retry_until(attempt, state: _State, stop: threading.Event) -> bool:
    """Run ``attempt`` until it returns without raising, or ``stop``. `PermanentError` (RBAC) and
    `TemporaryError` (API server unreachable or failing) are logged with what to do, put on /readyz
    (phase ``waiting``, 503, the reason) and retried with backoff: never a crash loop. Returns False
    if ``stop`` was set first."""
    from shardsched.kube.informer import Backoff

    backoff = Backoff(base_s=1.0, cap_s=30.0)
    while not stop.is_set():
        try:
            attempt()
            return True
        except (PermanentError, TemporaryError) as e:
            delay = backoff.next_s()
            state.phase, state.reason = "waiting", str(e)
            log.log(logging.ERROR if isinstance(e, PermanentError) else logging.WARNING,
                    "%s; retrying in %.0f s", e, delay)
            stop.wait(delay)
    return False


def _check_permissions(cluster_probe, lease: tuple[str, str] | None) -> None:
    """Raises `PermanentError` naming every permission shardsched's service account lacks (the
    scheduler's, and the Lease's when ``lease`` = (namespace, name) is given)."""
    missing = cluster_probe.missing_permissions(*(lease or (None, None)))
    if missing:
        raise PermanentError("RBAC denied: shardsched's service account lacks " + ", ".join(missing)
                             + " (apply deploy/rbac/)")


def _wait_for_permissions(cluster_probe, lease: tuple[str, str], state: _State, stop: threading.Event) -> bool:
    """Before campaigning for the Lease: wait until the permissions are there (`_retry_until`).
    Without this a candidate denied the Lease would wait as a silent "standby"."""
    return _retry_until(lambda: _check_permissions(cluster_probe, lease), state, stop)


def _start_runtime(runtime, cluster_probe, lease: tuple[str, str] | None, state: _State, stop: threading.Event) -> bool:
    """Preflight (RBAC) and start, retrying until it works or ``stop`` (`_retry_until`)."""
    def attempt() -> None:
        _check_permissions(cluster_probe, lease)
        runtime.start()

    return _retry_until(attempt, state, stop)


@click.command()
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None,
              help="kubeconfig file; default: in-cluster config in a pod, else $KUBECONFIG or ~/.kube/config "
                   "(the profile file's clientConnection.kubeconfig if it sets one).")
@click.option("--context", default=None, help="kubeconfig context (default: its current-context).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="KubeSchedulerConfiguration file (profiles; clientConnection; leaderElection).")
@click.option("--shards", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Shards (at start; with --mode ray, `shardsched scale --shards N` changes it while "
                   "serving).")
@autoscale_options(max_shards_help="With --autoscale; with --shard-cpus 1, at most the CPUs Ray's workers "
                                   "can offer.")
@click.option("--mode", type=click.Choice(["ray", "threads"]), default="ray", show_default=True,
              help="ray: coordinator and shards as Ray actors; threads: all in this process, no Ray.")
@click.option("--ray-address", help="Join this Ray cluster instead of starting a local one (auto: the local node's).")
@click.option("--shard-cpus", type=click.FloatRange(0), default=0.0, show_default=True,
              help="CPUs each shard actor declares (ray mode); 1 lets Ray's autoscaler add workers for shards.")
@click.option("--redis-url", callback=redis_url_option, help="Use this Redis (redis://[:password@]host:port/db) instead of starting one.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve /metrics, /healthz and /readyz on this port (0 = a free port, logged).")
@click.option("--metrics-address", default="0.0.0.0", show_default=True, help="Address of the metrics server.")
@click.option("--leader-elect/--no-leader-elect", default=None,
              help="Elect one active coordinator through a Lease (default: the profile file's "
                   "leaderElection.leaderElect, true).")
@click.option("--leader-elect-lease-name", default=None, help=f"Lease name (default: {DEFAULT_LOCK}).")
@click.option("--leader-elect-lease-namespace", default=None,
              help="Lease namespace (default: the profile file's leaderElection.resourceNamespace, kube-system).")
@click.option("--leader-elect-lease-duration", type=click.IntRange(2), default=None,
              help="Seconds a standby waits before taking over (default: the file's, 15).")
@click.option("--leader-elect-renew-deadline", type=click.IntRange(2), default=None,
              help="Seconds the leader keeps trying to renew before giving up (default: the file's, 10).")
@click.option("--leader-elect-retry-period", type=click.IntRange(1), default=None,
              help="Seconds between attempts (default: the file's, 2).")
@click.option("--identity", default=None, help="holderIdentity in the Lease (default: <hostname>_<uuid>).")
@click.option("--kube-api-qps", type=click.FloatRange(0), default=None,
              help="Binding requests per second for the whole scheduler, split over the shards "
                   "(default: the file's clientConnection.qps, 50 as kube-scheduler; 0 = unlimited).")
@click.option("--kube-api-burst", type=click.IntRange(1), default=None,
              help="Bursts of binding requests (default: the file's clientConnection.burst, 100).")
@click.option("--watch-timeout", "watch_timeout_s", type=click.FloatRange(1), default=300.0, show_default=True,
              help="Seconds one watch call lasts before it is renewed (randomized up to 2x).")
@click.option("--shutdown-grace-seconds", "shutdown_grace_s", type=click.FloatRange(0), default=20.0, show_default=True,
              help="On SIGTERM/SIGINT, how long the Events and pod conditions already decided may take to be written, "
                   "after the binds in flight (up to 5 s); what is left then is dropped and logged. The default and "
                   "the binds fit in a pod's default terminationGracePeriodSeconds (30).")
@click.option("--batch-size", type=click.IntRange(0), default=0, show_default=True,
              help="Pods per batch; 0 = adaptive.")
@click.option("--max-batch-size", type=click.IntRange(1), default=1000, show_default=True, help=MAX_BATCH_SIZE_HELP)
@click.option("--bench", "bench_pods", type=click.IntRange(1), default=None,
              help="Benchmark: create this many pods, measure bound pods/s and latency next to the API "
                   "server's own binding rate from one client (measured before and after shardsched's "
                   "window), delete them, exit.")
@click.option("--bench-namespace", default="default", show_default=True,
              help="Namespace (existing) of the bench's pods.")
@click.option("--bench-nodes", type=click.IntRange(0), default=0, show_default=True,
              help="Create this many nodes for the benchmark first and report them Ready, as a kubelet "
                   "would (for an API server without kubelets); they are deleted at the end.")
@click.option("--bench-null", is_flag=True, default=False,
              help="With --bench: a null run, to calibrate. No scheduler starts; the baseline's client binds the "
                   "backlog in shardsched's window, measured the same way. Its ratio is 1.0 up to this cluster's "
                   "own scatter between phases: run it a few times next to real runs to see how far from 1.0 a "
                   "ratio can fall when nothing differs (docs/kubernetes.md, Benchmark).")
@click.option("--bench-null-watch", is_flag=True, default=False,
              help="With --bench-null: the null run's window also holds the watches a scheduler of the bench's "
                   "pods holds (shardsched's informers, listed before the window), so its ratio includes what "
                   "those watches cost the server per bind: the floor a scheduler's ratio can reach here.")
@click.option("--bench-timeout", type=click.FloatRange(min=1.0), default=300.0, show_default=True,
              help="Seconds to wait for shardsched to bind the bench's pods.")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def serve(**kw) -> None:
    """Schedule the pods of a Kubernetes cluster whose spec.schedulerName is one of the profiles.

    \b
    Runs next to the default scheduler: pods opt in with spec.schedulerName (the profile file's
    names; "shardsched" without a file). Watches nodes, namespaces and pods, binds through
    pods/binding, writes the Scheduled and FailedScheduling Events and the PodScheduled=False
    condition, like kube-scheduler. With leader election (the default) any number of serve
    processes run and one is active. See docs/kubernetes.md.

    \b
    Exit status: 0 after SIGTERM/SIGINT; 1 when Redis or Ray cannot start; 2 for a bad profile file or
    kubeconfig; 3 when the leader lost its Lease (restart it: it comes back as a candidate); 4 when
    the coordinator died (Ray mode): the Lease is released for a standby. RBAC denied
    or an unreachable API server are not fatal: it logs why, reports 503 on /readyz, and retries.
    """
    from shardsched import gctune
    from shardsched.config import load_config, parse_config
    from shardsched.kube.client import ClientSpec
    from shardsched.kube.cluster import KubeCluster
    from shardsched.kube.serving import KubeRuntime, RuntimeOptions
    from shardsched.sharding.shard import ShardOptions

    # serve's own progress (where it serves, candidate, leader) is INFO, shown without -v as
    # kube-scheduler shows its Info lines; other loggers keep the level of -v
    log.setLevel(min(logging.INFO, logging.getLogger().getEffectiveLevel()))
    try:
        config = load_config(kw["config_path"]) if kw["config_path"] else parse_config(DEFAULT_PROFILE, "<serve default>")
        autoscaler = autoscaler_from(kw)
    except (ConfigError, ShardschedError, OSError, ValueError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_CONFIG)
    if kw["bench_null"] and not kw["bench_pods"]:
        click.echo("error: --bench-null is a kind of bench run: give --bench N too", err=True)
        sys.exit(EXIT_CONFIG)
    if kw["bench_null_watch"] and not kw["bench_null"]:
        click.echo("error: --bench-null-watch is a kind of null run: give --bench-null too", err=True)
        sys.exit(EXIT_CONFIG)
    ctx = click.get_current_context()
    stray = [f"--{name.replace('_', '-')}" for name in ("bench_nodes", "bench_namespace", "bench_timeout")
             if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)]
    if stray and not kw["bench_pods"]:
        click.echo(f"error: {', '.join(stray)} only apply to a bench run: give --bench N too (without it serve "
                   "schedules the cluster's pods)", err=True)
        sys.exit(EXIT_CONFIG)
    gctune.tune()  # in threads mode this process holds the whole scheduler (shardsched.gctune)
    cc, le = config.client_connection, config.leader_election
    spec = ClientSpec(kubeconfig=kw["kubeconfig"] or cc.kubeconfig or None, context=kw["context"],
                      qps=cc.qps if kw["kube_api_qps"] is None else kw["kube_api_qps"],
                      burst=kw["kube_api_burst"] or cc.burst)
    try:
        api_client = spec.api_client()
    except PermanentError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_CONFIG)
    leader_elect = le.leader_elect if kw["leader_elect"] is None else kw["leader_elect"]
    if kw["bench_pods"] and kw["leader_elect"] is None:
        leader_elect = False
    lease_name = kw["leader_elect_lease_name"] or (le.resource_name if le.resource_name != UPSTREAM_LOCK else DEFAULT_LOCK)
    lease_ns = kw["leader_elect_lease_namespace"] or le.resource_namespace
    if kw["bench_pods"]:
        # the bench serves a scheduler name of its own (the first profile's plugins under another
        # name): the cluster's real pending pods are neither scheduled nor written to by it
        from shardsched.bench.serve_cluster import bench_scheduler_name

        config = dataclasses.replace(config, profiles=[dataclasses.replace(config.profiles[0],
                                                                           scheduler_name=bench_scheduler_name())])
        if spec.qps > 0:
            log.warning("--bench with shardsched's client-side rate limit of %g requests/s (--kube-api-qps): its rate "
                        "will show that limit, not the scheduler; pass --kube-api-qps 0 to measure the scheduler", spec.qps)
    names = [p.scheduler_name for p in config.profiles]
    if "default-scheduler" in names:
        log.warning("a profile is named default-scheduler: shardsched will compete with the default scheduler for "
                    "every pod that does not name a scheduler")
    options = RuntimeOptions(shards=kw["shards"], mode=kw["mode"], redis_url=kw["redis_url"],
                             ray_address=kw["ray_address"] or None, watch_timeout_s=kw["watch_timeout_s"],
                             shard_num_cpus=kw["shard_cpus"], autoscaler=autoscaler, freeze_gc=True,
                             shutdown_grace_s=kw["shutdown_grace_s"],
                             shard_options=ShardOptions(batch_size=kw["batch_size"], max_batch_size=kw["max_batch_size"],
                                                        binding_cycles=BINDING_CYCLES),
                             prefix=f"ss:{lease_name}:{uuid.uuid4().hex[:8]}:")
    state = _State()
    stop = threading.Event()
    lost = threading.Event()
    become_leader = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = None
    if kw["metrics_port"] is not None:
        try:
            server = _health_server(state, kw["metrics_address"], kw["metrics_port"])
        except OSError as e:
            click.echo(f"error: --metrics-port {kw['metrics_port']}: {e.strerror or e}", err=True)
            sys.exit(EXIT_CONFIG)
        log.info("serving /metrics, /healthz, /readyz on %s:%d", kw["metrics_address"], server.server_address[1])

    probe = KubeCluster(spec, names, pod_groups=config.enables("Coscheduling"),
                        watch_storage=config.watches_storage())
    elector = None
    if leader_elect:
        from shardsched.kube.leader import LeaderElector

        identity = kw["identity"] or f"{socket.gethostname()}_{uuid.uuid4()}"
        try:
            elector = LeaderElector(api_client, lease_name, lease_ns, identity, on_started=become_leader.set,
                                    on_stopped=lambda: None if stop.is_set() else lost.set(),
                                    lease_duration_s=kw["leader_elect_lease_duration"]
                                    or _whole_s(le.lease_duration_s, "leaseDuration"),
                                    renew_deadline_s=kw["leader_elect_renew_deadline"]
                                    or _whole_s(le.renew_deadline_s, "renewDeadline"),
                                    retry_period_s=kw["leader_elect_retry_period"]
                                    or _whole_s(le.retry_period_s, "retryPeriod"))
        except ValueError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(EXIT_CONFIG)
        if _wait_for_permissions(probe, (lease_ns, lease_name), state, stop):
            state.phase, state.reason = "standby", ""
            log.info("leader election: %s is a candidate for Lease %s/%s", identity, lease_ns, lease_name)
            elector.start()
    else:
        become_leader.set()

    runtime = KubeRuntime(config, spec, options)
    code = 0
    bench = bench_events = None
    try:
        while not (stop.is_set() or lost.is_set() or become_leader.is_set()):
            stop.wait(0.1)
        if become_leader.is_set() and not (stop.is_set() or lost.is_set()):
            state.leading = True
            state.runtime = runtime
            bench, report = _bench_prepare(spec, config, kw, stop) if kw["bench_pods"] else (None, None)
            bench_events = bench  # whose Events to delete once the scheduler has stopped
            null = bench is not None and kw["bench_null"]  # a null run starts no scheduler
            if null or _start_runtime(runtime, probe, (lease_ns, lease_name) if leader_elect else None, state, stop):
                started_at = time.time()
                state.phase, state.reason = "leading", ""
                if null:
                    log.warning("bench: null run: the baseline's client binds the backlog in shardsched's place%s",
                                " (with a scheduler's watches)" if kw["bench_null_watch"] else "")
                else:
                    log.info("scheduling pods of %s (%d shards, %s mode)", ", ".join(names), kw["shards"], kw["mode"])
                if bench is not None:
                    code = _bench_report(bench, report, started_at, kw, runtime, spec.qps)
                    bench = None
                    stop.set()
                next_check = time.monotonic() + COORDINATOR_CHECK_S
                while not (stop.is_set() or lost.is_set()):
                    stop.wait(0.2)
                    if time.monotonic() >= next_check:
                        next_check = time.monotonic() + COORDINATOR_CHECK_S
                        why = runtime.coordinator_dead()
                        if why:
                            # leading without a coordinator would hold the Lease and schedule
                            # nothing: step down (the Lease is released), a standby or a restart
                            # takes over
                            log.error("the coordinator died (%s); stopping so that a standby or a restart takes "
                                      "over (exit %d)", why, EXIT_COORDINATOR)
                            code = EXIT_COORDINATOR
                            break
        if lost.is_set() and not stop.is_set():
            log.error("leader election lost; stopping (exit %d)", EXIT_LOST)
            code = EXIT_LOST
    except ShardschedError as e:  # Redis or Ray could not start: the operator must act
        click.echo(f"error: {e}", err=True)
        code = 1
    finally:
        state.phase = "stopping"
        if bench is not None:
            bench.cleanup()
        runtime.stop()
        if bench_events is not None:  # written until the scheduler stopped: deleted after it
            deleted = bench_events.delete_events()
            if deleted is not None:
                log.info("bench: deleted %d Events of %s", deleted, bench_events.scheduler_name)
        if elector is not None:
            elector.release()
        if server is not None:
            server.shutdown()
    sys.exit(code)


def _bench_prepare(spec, config, kw: dict, stop: threading.Event):
    """Baseline and backlog before the scheduler starts (`shardsched.bench.serve`); (None, None)
    when ``stop`` was set meanwhile (everything the bench made is deleted)."""
    from shardsched.bench.serve import Bench, BenchInterrupted

    from shardsched.kube.client import Forbidden

    bench = Bench(spec, config.profiles[0].scheduler_name, kw["bench_namespace"], stop=stop, config=config)
    try:
        report = bench.prepare(kw["bench_pods"], kw["bench_nodes"])
        if not report.api_binds and report.errors:  # nothing to measure (no nodes): no scheduler to start
            raise PermanentError(f"--bench: {'; '.join(report.errors)}")
        return bench, report
    except Exception as e:
        bench.cleanup()  # whatever failed, nothing of the bench is left behind
        if isinstance(e, BenchInterrupted):
            log.warning("bench interrupted while preparing; its pods and nodes were deleted")
            return None, None
        if isinstance(e, Forbidden):
            denied = str(e).split("; grant it")[0]  # the generic advice names shardsched's service account
            raise Forbidden(f"{denied}. --bench creates and deletes pods (and nodes with --bench-nodes) itself: run "
                            "it with a kubeconfig allowed to (a cluster admin's or a test cluster's), not "
                            "shardsched's service account") from None
        if isinstance(e, (RuntimeError, TimeoutError)):  # the bench's observer process failed
            raise PermanentError(f"--bench: {e}") from None
        raise


def _floor2(x: float) -> str:
    """Rounded down to 2 decimals, so that 0.896 does not print as a 0.90 that is below 0.9."""
    return f"{math.floor(x * 100 + 1e-9) / 100:.2f}"


def _bench_diagnosis(cpu: dict, what: str = "ratio") -> str:
    """Why ``what`` (a ratio) is below the target, from the API server's CPU over the same window
    (``api_server_cpu_binds`` for the binds, ``api_server_cpu`` with the Events, of
    `shardsched.bench.serve_report.BenchReport`): shardsched's rate / the baseline's ~= busy_ratio /
    cost_ratio."""
    if cpu["busy_ratio"] is None:
        return (f"diagnosis ({what}): unknown (the API server's /metrics could not be read): shardsched, the API "
                "server, or the machine they share set the pace")
    if cpu["busy_ratio"] >= BENCH_BUSY_AS_BASELINE:
        return (f"diagnosis ({what}): shardsched kept the API server as busy as the baseline's client did "
                f"({cpu['busy_ratio']:.2f}x its CPU load), but each of its pods cost the server {cpu['cost_ratio']:.2f}x "
                "the CPU of a bare bind (the Scheduled Event, the scheduler's watches): that extra work per pod, not "
                "shardsched's pace, accounts for the ratio")
    return (f"diagnosis ({what}): shardsched kept the API server less busy than the baseline's client did "
            f"({cpu['busy_ratio']:.2f}x its CPU load; each pod cost the server {cpu['cost_ratio']:.2f}x a bare bind): "
            "shardsched, or the machine they share, set the pace")


#: the API server at least this busy in shardsched's window (relative to the baselines): shardsched drove it
#: as hard as the baseline's client
BENCH_BUSY_AS_BASELINE = 0.9

#: fewer bench pods than this: too short a window for the CPU-based diagnosis
BENCH_MIN_PODS = 1000

#: the two baselines' rates further apart than this (after / before) make the ratio uncertain
BENCH_DRIFT_WARN = 1.25


def _bench_report(bench, report, started_at: float, kw: dict, runtime, qps: float = 0.0) -> int:
    """Measure shardsched's window (a null run's, with ``--bench-null``), stop the scheduler, run the
    second baseline, print the report. ``qps``: shardsched's client-side rate limit (0 = none), named when it capped the rate."""
    null = kw["bench_null"]
    if report.api_binds:
        if null:
            started_at = bench.start_null(report, watch=bool(kw.get("bench_null_watch")))
            report = bench.measure(report, started_at, kw["bench_timeout"])
            bench.end_null(report)
        else:
            report = bench.measure(report, started_at, kw["bench_timeout"])
            bench.wait_events(report, runtime.events_settled)  # none dropped at the stop; the rate with them
            runtime.stop()  # the second baseline runs with the scheduler gone, as the first did
        report = bench.finish(report)
    data = report.to_json()
    if kw["output"] == "json":
        click.echo(json.dumps(data, indent=2))
    else:
        lat = data["latency_ms"] or {"p50": 0.0, "p99": 0.0}
        # a null run's window is the baseline's client binding the backlog (`Bench.start_null`)
        who = ("shardsched" if not null else "null run (the baseline's client in shardsched's place, with a "
               "scheduler's watches)" if kw.get("bench_null_watch") else "null run (the baseline's client in shardsched's place)")
        began = "its binds began" if null else "start-up ended"
        subject = "null run" if null else "shardsched"
        measured = not (data["interrupted"] and not data["bound"])  # interrupted in shardsched's window
        complete = data["bound"] >= data["pods"]
        if not measured:
            click.echo(f"{who}: interrupted before its {data['pods']} pods were bound: not measured")
        else:
            click.echo(f"{who}: {data['bound']}/{data['pods']} pending pods bound in {data['wall_s']:.2f} s = "
                       f"{data['pods_per_s']:.1f} pods/s (first bind {data['first_bind_s'] or 0:.2f} s after {began}); "
                       f"pending->bound P50 {lat['p50']:.0f} ms, P99 {lat['p99']:.0f} ms")
            if data["events_lag_s"] is not None:
                click.echo(f"shardsched with its Scheduled Events: the last written {data['events_lag_s']:.2f} s after the "
                           f"last bind = {data['with_events_pods_per_s']:.1f} pods/s")
        phases = ", ".join(f"{b['phase']} {b['binds_per_s']:.1f}" for b in data["api_baselines"])
        count = len(data["api_baselines"])
        click.echo(f"API server: {data['api_binds']} binds from one client ({count} baseline{'s' if count != 1 else ''} of "
                   f"{data['pods']} pods) in {data['api_bind_wall_s']:.2f} s = "
                   f"{data['api_binds_per_s']:.1f} binds/s (binds/s before and after {subject}'s window: {phases})")
        drift = data["api_drift"]
        if drift is not None and not 1 / BENCH_DRIFT_WARN <= drift <= BENCH_DRIFT_WARN:
            click.echo(f"note: the API server's own rate moved by a factor of {drift:.2f} between the two baselines: the "
                       "machine's speed drifted during the run, so the ratio is uncertain; run again", err=True)
        phase_names = {"before": "the first baseline", "shardsched": f"{subject}'s window", "after": "the second baseline"}
        not_collected = [phase_names.get(phase, phase) for phase, took in data["api_server_gc_s"].items() if took is None]
        if not_collected:
            click.echo(f"note: the API server could not be asked to collect its garbage before {', '.join(not_collected)} "
                       "(GET /debug/pprof/heap?gc=1: needs its --profiling, on by default, and get on that URL); its "
                       "own collection cycle then adds noise to the ratio", err=True)
        server = data["api_server_bind_ms"]
        if server["baseline"] is not None and server["shardsched"] is not None:
            click.echo(f"API server's own time per bind (apiserver_request_duration_seconds): {server['baseline']:.1f} ms "
                       f"during the baseline, {server['shardsched']:.1f} ms while {subject} ran")
        cpu, cpu_binds = data["api_server_cpu"], data["api_server_cpu_binds"]
        if cpu["baseline"] is not None:
            line = (f"API server's CPU (process_cpu_seconds_total): {cpu['baseline']['cores']:.2f} cores busy, "
                    f"{cpu['baseline']['ms_per_pod']:.2f} ms per bind during the baselines")
            if cpu_binds["shardsched"] is not None:
                line += (f"; {cpu_binds['shardsched']['cores']:.2f} cores, {cpu_binds['shardsched']['ms_per_pod']:.2f} ms "
                         f"per pod while {subject} bound")
            if cpu["shardsched"] is not None and data["events_lag_s"] is not None:
                line += (f"; {cpu['shardsched']['cores']:.2f} cores, {cpu['shardsched']['ms_per_pod']:.2f} ms per pod "
                         "until its Events were written")
            click.echo(line)
        if not measured:
            click.echo(f"ratio {subject} / API server: not measured (interrupted)")
        elif not complete:
            click.echo(f"ratio {subject} / API server: not comparable (only {data['bound']} of {data['pods']} pods "
                       "bound before --bench-timeout)")
        elif null:
            floor = ("with a scheduler's watches: this cluster's scatter between phases plus what those watches "
                     "cost the server, the floor of a scheduler's ratio" if kw.get("bench_null_watch") else
                     "the distance from 1.00 is this cluster's own scatter between phases, the noise floor of "
                     "shardsched's ratio")
            click.echo(f"ratio null run / API server: {_floor2(report.ratio)} (no scheduler ran: {floor})")
        else:
            ratio = report.ratio  # not the JSON's, rounded to 3 decimals: 0.8996 must not read as 0.9
            verdict = "target met: the API server is the limit" if ratio >= 0.9 else "below the 0.9 target"
            with_events = ("" if report.ratio_with_events is None else
                           f"; with its Events {_floor2(report.ratio_with_events)}")
            click.echo(f"ratio shardsched / API server: {_floor2(ratio)} ({verdict}){with_events}")
            # each ratio below the target explained by the server's CPU over its own window
            below = [(name, r, c) for name, r, c in (("binds", ratio, cpu_binds),
                                                     ("with its Events", report.ratio_with_events, cpu))
                     if r is not None and r < 0.9]
            if qps > 0:
                click.echo(f"diagnosis: shardsched's own client-side rate limit (--kube-api-qps {qps:g}) capped its "
                           "binds; pass --kube-api-qps 0 to measure the scheduler")
            elif below and data["pods"] < BENCH_MIN_PODS:
                click.echo(f"diagnosis: not given below {BENCH_MIN_PODS} pods (start-up and the reads of /metrics weigh "
                           "on so short a window); run with --bench 2000 or more")
            else:
                for name, _, window in below:
                    click.echo(_bench_diagnosis(window, name))
        for err in data["errors"]:
            click.echo(f"note: {err}", err=True)
    # interrupted (SIGINT/SIGTERM): exit 0 as serve does, the report says so
    return 0 if not data["errors"] or bench.interrupted else 1

