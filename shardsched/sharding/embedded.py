"""The embedded run (``shardsched run``): local Ray, local Redis, the simulated cluster, a coordinator
and shards.

`EmbeddedRun` starts everything, feeds the workload (a burst, or a trace replayed in time), changes
the shard count at given times (``scale_at``) or lets the coordinator's autoscaler do it, follows
progress, restarts the embedded redis-server when it exits, collects the report (latency,
throughput, CPU, memory, invariants, scale steps with the throughput around each) and stops
everything, also on errors, on Ctrl-C (SIGINT) and on SIGTERM. Its options, errors and signal
handling are in `shardsched.sharding.run_control`, its workload feeder in `shardsched.sharding.run_feed`,
its report in `shardsched.sharding.run_report`. It calls its actors through their clients
(`SimClusterClient`, `CoordinatorClient`, `ShardHostClient`) and does not import Ray.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from typing import Any, Callable

from shardsched.config import SchedulerConfiguration
from shardsched.errors import ShardschedError
from shardsched.sharding import rayaccess
from shardsched.sharding.actors import coordinator_actor, kill_shard_actors
from shardsched.sharding.calls import (ActorFailed, Channel, CoordinatorClient, MethodFailed, NoAnswer, RemoteDead,
                                      RemoteUnavailable, ShardHostClient, SimClusterClient, wait_all)
from shardsched.sharding.remote import channel
from shardsched.sharding.run_control import RunError, RunOptions, how_it_ended, init_ray_deferring_signals, interruptible
from shardsched.sharding.run_feed import WorkloadFeeder
from shardsched.sharding.run_report import (ProcessMeter, RunReport, Sample, allocatable_of, ray_system_pids,
                                            scale_phases)
from shardsched.sharding.scaling import RAY_NAMESPACE
from shardsched.sharding.shard import ShardStats
from shardsched.sharding.sim_actor import sim_cluster_actor
from shardsched.store.server import EmbeddedRedis, RedisServerError

log = logging.getLogger(__name__)

#: progress following period once the run is past its first seconds (shorter before: `_follow`)
FOLLOW_PERIOD_S = 0.25
#: the plot's sampling period: the simulated cluster is read this often (`EmbeddedRun._sample`)
SAMPLE_PERIOD_S = 0.25


class EmbeddedRun:
    """Local Ray + local Redis + simulated cluster + coordinator + shards (see module docstring).

    Args:
        config: scheduler configuration; pods use its first profile's schedulerName.
        nodes: Node objects (dicts) of the simulated cluster.
        workload: (creation time in s from the start, deletion time or None, Pod dict) triples;
            a burst has every creation time 0.
        options: run options.
        on_progress: called about 4 times a second with (bound, total, status dict).
        on_started: called once everything has started, before the workload, with how another
            process joins this run's Ray: its address and authentication (`rayaccess.describe_access`).
    """

    def __init__(self, config: SchedulerConfiguration, nodes: list[dict], workload: list[tuple[float, float | None, dict]],
                 options: RunOptions, on_progress: Callable[[int, int, dict], None] | None = None,
                 on_started: Callable[[str, str], None] | None = None) -> None:
        self.config = config
        self.nodes = nodes
        self.workload = workload
        self.options = options
        self.on_progress = on_progress
        self.on_started = on_started
        self.redis: EmbeddedRedis | None = None
        self.cluster: SimClusterClient | None = None
        self.coordinator: CoordinatorClient | None = None
        self.meter = ProcessMeter()
        self.system_meter = ProcessMeter()
        self._feeder_error: list[str] = []
        self._metrics_server = None
        self._started_ray = False
        self._ray_down = threading.Event()  # set by _stop once Ray is shut down (see _init_ray)
        self._signals: dict[str, Any] = {"stopping": False, "defer": False, "pending": None, "received": None}  # see interruptible
        self._actors: list[Channel] = []  # the channel of every actor this run created, ended by _stop
        self.coordinator_restarts = 0
        self.feeder = WorkloadFeeder(workload, options, self._feeder_error)
        self._t0 = 0.0  # time.monotonic() when the workload started
        self._allocatable = allocatable_of(nodes)

    # ------------------------------------------------------------------ lifecycle
    def _start(self) -> None:
        o = self.options
        if o.redis_url:
            redis_url = o.redis_url
        else:
            try:
                self.redis = EmbeddedRedis()
                self.redis.start()
            except ShardschedError as e:
                raise RunError(f"could not start the embedded Redis: {e}") from None
            redis_url = self.redis.url
        if not rayaccess.connected():
            self._init_ray()
        self.meter.add(os.getpid(), "driver")
        if self.redis is not None and self.redis.pid:
            self.meter.add(self.redis.pid, "redis")
        for pid in ray_system_pids():
            self.system_meter.add(pid)
        self.prefix = f"ss:{uuid.uuid4().hex[:8]}:"
        self.redis_url = redis_url
        self.cluster = self.feeder.cluster = self._new_cluster()
        self._actors.append(self.cluster.channel)
        # the coordinator's process starts while the cluster's does (its constructor does not call
        # the cluster; its start, which lists it, waits for the nodes below)
        self._new_coordinator()
        self.cluster.create_nodes(self.nodes).wait(None)
        wait_all([self.cluster.put_spread_selector(obj) for obj in o.spread_selectors], None)
        wait_all([self.cluster.create_pod_group(obj) for obj in o.pod_groups], None)
        if o.storage:
            self.cluster.create_volume_objects(o.storage).wait(None)
        self._start_coordinator(adopt=False)
        self.meter.add(self.cluster.pid().wait(None), "cluster")
        if o.metrics_port:
            self._serve_metrics(o.metrics_port)

    def _init_ray(self) -> None:
        """Start (or join) Ray with SIGINT and SIGTERM deferred until it has started
        (`init_ray_deferring_signals`; Ray's helper thread lives until `_stop` sets ``_ray_down``).

        Raises:
            RunError: Ray could not start or be joined.
            Interrupted: a signal came while it started (Ray is up; `_stop` shuts it down).
        """
        self._started_ray = True
        init_ray_deferring_signals(self.options.ray_address, RAY_NAMESPACE, self._signals, self._ray_down)

    def _new_cluster(self) -> SimClusterClient:
        """The simulated cluster's actor, as its client (a subclass may serve a variant of
        `SimClusterHost`)."""
        return SimClusterClient(channel(sim_cluster_actor(seed=self.options.seed, faults=self.options.faults)))

    def _new_coordinator(self) -> None:
        """Create the coordinator's actor (`self.coordinator`), not started yet."""
        o = self.options
        try:
            handle = coordinator_actor(self.config, self.redis_url, self.prefix, self.cluster.channel.target, o.shards,
                                       o.shard_options, shard_redis_url=o.shard_redis_url, adoptable=True,
                                       autoscaler=o.autoscaler, name=o.coordinator_name)
        except ShardschedError as e:
            raise RunError(str(e)) from None
        self.coordinator = CoordinatorClient(channel(handle))
        self._actors.append(self.coordinator.channel)

    def _start_coordinator(self, adopt: bool) -> None:
        """Start the coordinator actor created by `_new_coordinator`; with ``adopt``, a new one
        (created here) that takes over the shards of the previous (dead) one. Shards are detached
        (`CoordinatorHost`), so they survive a coordinator's death; `_stop` kills them."""
        if adopt:
            self._new_coordinator()
        try:
            self.coordinator.start(adopt).wait(None)
        except ShardschedError as e:  # its first list, the ledger's set-up in Redis, ... (MethodFailed: not ours)
            if isinstance(e, ActorFailed) and self._what_died(e) == "the coordinator":
                raise  # run() says it died
            cause = e.cause if isinstance(e, MethodFailed) and isinstance(e.cause, Exception) else e
            if self.redis is not None and not self.redis.running:
                raise RunError(f"the embedded redis-server exited ({how_it_ended(self.redis.returncode)}) while the run started; nothing was "
                               "scheduled") from None
            raise RunError(f"the coordinator could not start: {type(cause).__name__}: {cause}") from None
        self.meter.add(self.coordinator.pid().wait(None), "coordinator")
        self._meter_shards()

    def _meter_shards(self) -> None:
        """Meter the current shard processes (new ones after a scale step; known ones are kept)."""
        for i, shard in enumerate(self._shard_clients(None)):
            self.meter.add(shard.pid().wait(None), f"shard-{i}")

    def _shard_clients(self, timeout_s: float | None) -> list[ShardHostClient]:
        """The clients of the coordinator's current shards (asked within ``timeout_s``)."""
        return [ShardHostClient(channel(h)) for h in self.coordinator.shards().wait(timeout_s)]

    def coordinator_status(self) -> dict:
        """The coordinator's status; when its actor died, a new coordinator is started first and
        adopts the running shards (the run's supervisor, as a Kubernetes Deployment restarts a
        crashed scheduler)."""
        try:
            return self.coordinator.status().wait(30)
        except RemoteDead:
            log.warning("the coordinator died; starting a new one that adopts the running shards")
            # a named actor that died keeps its name while handles to it live; killing it frees it
            self.coordinator.channel.terminate()
            self._start_coordinator(adopt=True)
            self.coordinator_restarts += 1
            return self.coordinator.status().wait(30)

    def _serve_metrics(self, port: int) -> None:
        from prometheus_client import CollectorRegistry

        from shardsched.metrics import AggregateCollector, serve

        def fetch() -> dict:
            samples = wait_all([s.metric_samples() for s in self._shard_clients(5)], 5)
            out = {str(i): s for i, s in enumerate(samples)}
            out["coordinator"] = self.coordinator.metric_samples().wait(5)
            return out

        registry = CollectorRegistry()
        registry.register(AggregateCollector(fetch))
        try:
            self._metrics_server = serve(port, registry)
        except OSError as e:
            raise RunError(f"--metrics-port {port}: {e.strerror or e}") from None

    def _stop(self) -> None:
        """Stop the loops, kill this run's actors (shards, coordinator, cluster) and shut down Ray
        if this run started it: a Ray that was already there (a test session's, or one joined with
        ``ray_address``) is left running, without our actors."""
        try:
            if self.coordinator is not None:
                self._actors.extend(s.channel for s in self._shard_clients(15))
                self.coordinator.stop().wait(15)
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        if rayaccess.connected():
            for actor in self._actors:
                try:
                    actor.terminate()
                except Exception:  # noqa: BLE001 - already dead is fine
                    pass
            if self.coordinator is not None:
                kill_shard_actors(self.prefix)  # detached: replaced incarnations still alive too
        if self._started_ray:
            rayaccess.shutdown()
            self._ray_down.set()
        if self.redis is not None:
            self.redis.stop()

    # ------------------------------------------------------------------ main
    def run(self) -> RunReport:
        """Start, feed the workload, follow it until it settles (or ``timeout_s``), report, stop.

        SIGINT and SIGTERM (when called in the main thread) stop the run in order: the feeder stops,
        the coordinator and shards stop (binds in flight finish), the report counts what was done,
        and everything started is stopped, Ray included (also during its start-up). The report's
        ``interrupted`` names the signal; ``started`` is False when it came before the workload.

        An actor that dies and cannot be replaced (the simulated cluster; the coordinator before
        the workload started: after, a new one adopts the shards) ends the run: ``died`` says which
        and when, and the counts are those of the last sample of the cluster when it is the one gone.

        Raises:
            RunError: Redis, Ray or the actors could not start, or the embedded redis-server
                exited and could not be started again.
        """
        report = RunReport(shards=self.options.shards, nodes=len(self.nodes), pods_total=len(self.workload))
        started = time.monotonic()
        stop = threading.Event()
        feeder = sampler = None
        with interruptible() as signals:
            self._signals = signals
            try:
                log.info("starting Redis, Ray, the simulated cluster and the actors")
                self._start()
                if self.on_started:
                    self.on_started(*rayaccess.describe_access())
                log.info("scheduling: %d pods on %d nodes, %d shards", len(self.workload), len(self.nodes),
                         self.options.shards)
                t0 = self._t0 = self.feeder.t0 = time.monotonic()
                self._t0_unix = time.time()
                feeder = threading.Thread(target=self._drive, args=(t0, stop), daemon=True)
                sampler = threading.Thread(target=self._sample, args=(report, t0, stop), daemon=True)
                report.started = True
                feeder.start()
                sampler.start()
                self._follow(report, t0, feeder)
                self._settle(report, stop, feeder, sampler)
            except KeyboardInterrupt as interrupt:
                signals["stopping"] = True
                signum = signals.get("received") or getattr(interrupt, "signum", signal.SIGINT)
                report.interrupted = signal.Signals(signum).name
                log.warning("%s: stopping the run", report.interrupted)
                if report.started:
                    if not report.schedule_wall_s:
                        report.schedule_wall_s = time.monotonic() - t0
                    try:
                        self._settle(report, stop, feeder, sampler)
                    except Exception as e:  # noqa: BLE001 - on the way out: say what is missing
                        report.errors.append(f"the report is incomplete: {type(e).__name__}: {e}")
            except ActorFailed as e:
                signals["stopping"] = True
                report.died = f"{self._what_died(e)} died"
                if report.started:
                    report.schedule_wall_s = report.schedule_wall_s or time.monotonic() - t0
                    report.died += f" {report.schedule_wall_s:.1f} s into the run"
                    try:
                        self._settle(report, stop, feeder, sampler)
                    except RemoteUnavailable:  # the cluster is gone: what its last sample showed
                        self._count_last_sample(report)
                else:
                    report.died += " while the run started"
                log.info("%s: stopping the run", report.died)
            finally:
                signals["stopping"] = True
                report.wall_s = time.monotonic() - started
                self._stop()
        report.errors.extend(self._feeder_error)
        return report

    def _what_died(self, error: ActorFailed) -> str:
        """The run's actor that ``error`` is about, in words ("the simulated cluster")."""
        for client, what in ((self.cluster, "the simulated cluster"), (self.coordinator, "the coordinator")):
            if client is not None and client.channel.actor_id == error.actor_id:
                return what
        return "an actor of the run"

    def _count_last_sample(self, report: RunReport) -> None:
        """The counts of the cluster's last sample (`_sample`), once it can no longer be asked: the
        pods it did not show bound, unschedulable or deleted are counted pending."""
        last = report.samples[-1] if report.samples else None
        if last is not None:
            report.pods_bound, report.pods_unschedulable = last.bound, last.unschedulable
            report.pods_deleted_unbound = last.deleted_unbound
        report.pods_pending = max(0, report.pods_total - report.pods_bound - report.pods_unschedulable
                                  - report.pods_deleted_unbound)
        report.errors.append("the counts are those of the cluster's last sample, before it died")

    def _settle(self, report: RunReport, stop: threading.Event, feeder: threading.Thread | None,
                sampler: threading.Thread | None) -> None:
        """Stop feeding and sampling, and `_collect`. A run that did not settle (interrupted, timed
        out) first stops the coordinator and shards (binds in flight finish) and lets the coordinator
        catch up with the watch: its counts are then read from a cluster that no longer changes, so
        each pod is counted once and a pod created or bound a moment ago is not taken for lost."""
        stop.set()
        for thread in (feeder, sampler):
            if thread is not None and thread.ident is not None:
                thread.join(timeout=5)
        if report.interrupted or report.timed_out:
            self.coordinator.stop().wait(30)
            self.coordinator.catch_up().wait(30)
        self._collect(report)

    def _drive(self, t0: float, stop: threading.Event) -> None:
        """Feed the workload and carry out the ``scale_at`` steps at their times; ends when both are
        done (the run does not settle before its last scale step)."""
        scaler = threading.Thread(target=self._scale_at, args=(t0, stop), daemon=True)
        scaler.start()
        self.feeder.feed(t0, stop)
        scaler.join()

    def _scale_at(self, t0: float, stop: threading.Event) -> None:
        for at_s, n in sorted(self.options.scale_at):
            if stop.wait(max(0.0, t0 + at_s - time.monotonic())):
                return
            try:
                self.meter.sample()  # the shards this step removes keep their CPU up to here
                self.coordinator.scale(n).wait(self.options.timeout_s)
                self._meter_shards()
            except Exception as e:  # noqa: BLE001 - report, do not crash the run
                self._feeder_error.append(f"scaling to {n} shards at {at_s:g} s: {type(e).__name__}: {e}")
                log.exception("scale step failed")

    def _follow(self, report: RunReport, t0: float, feeder: threading.Thread) -> None:
        """Follow progress (the coordinator's status, ``on_progress``) until the run settles or
        times out; the period grows from 20 ms to `FOLLOW_PERIOD_S` over the first seconds, so that
        a short run is seen settled promptly. The plot's samples are `_sample`'s."""
        total = report.pods_total
        last_bound = -1
        done_at = None
        while True:
            time.sleep(min(FOLLOW_PERIOD_S, max(0.02, (time.monotonic() - t0) / 20)))
            self._supervise_redis(report, t0)
            # read before the counts: pods created after this read are then counted next time
            feeder_done = not feeder.is_alive()
            counts = self.cluster.progress().wait(None)
            status = self.coordinator_status()
            self.meter.sample()
            bound = status["bound_seen"]
            elapsed = time.monotonic() - t0
            if self.on_progress:
                self.on_progress(bound, total, status)
            # settled: the workload is all created, and every pod not bound is known to the
            # coordinator as unschedulable (or as having an invalid spec), none of them a preemptor
            # nominated to a node (its attempt failed, but its victims are going: it binds next)
            settled = (feeder_done and counts["unbound"] == status["unschedulable"] + status["invalid"]
                       and status["pending"] == status["unschedulable"] and not status["preemptors_waiting"])
            if counts["bound"] != last_bound:
                done_at = elapsed
            last_bound = counts["bound"]
            if settled:
                report.schedule_wall_s = done_at or elapsed
                return
            if elapsed > self.options.timeout_s:
                report.timed_out = True  # said among the errors once the summary's counts are taken
                report.schedule_wall_s = elapsed
                return

    def _supervise_redis(self, report: RunReport, t0: float) -> None:
        """When the embedded redis-server exited, log it and start it again on the same port with
        the same password (`EmbeddedRedis.restart`): it comes back empty, and the coordinator
        rebuilds the ledger from the cluster when it sees Redis' new run id
        (`LedgerSync.check`), as after any Redis restart. A Redis given by URL is not ours
        to restart.

        Raises:
            RunError: it does not start again.
        """
        if self.redis is None or self.redis.running:
            return
        pid, how = self.redis.pid, how_it_ended(self.redis.returncode)
        at_s = time.monotonic() - t0
        log.error("the embedded redis-server (pid %s) exited (%s) %.1f s into the run; starting it again on port %d",
                  pid, how, at_s, self.redis.port)
        try:
            self.redis.restart()
        except RedisServerError as e:
            raise RunError(f"the embedded redis-server exited ({how}) and did not start again: {e}") from None
        self.meter.add(self.redis.pid, "redis")
        report.redis_restarts.append({"at_s": round(at_s, 1), "pid": pid, "exit": how})

    def _sample(self, report: RunReport, t0: float, stop: threading.Event) -> None:
        """Read the simulated cluster every `SAMPLE_PERIOD_S` (on a fixed grid from ``t0``; a late
        answer skips the points it overran) into ``report.samples`` until ``stop`` is set. The
        cluster answers on a thread of its own, so the period holds while the coordinator is busy.
        A sample's time is the middle of its read."""
        k = 0
        while True:
            asked = time.monotonic()
            try:
                progress = self.cluster.progress().wait(10)
            except ActorFailed:  # the cluster died: the run ends and says so
                return
            except Exception as e:  # noqa: BLE001 - the plot has what was sampled; the run goes on
                log.warning("sampling the cluster stopped: %s: %s", type(e).__name__, e)
                return
            now = time.monotonic()
            report.samples.append(Sample.of((asked + now) / 2 - t0, progress))
            k = max(k + 1, int((now - t0) / SAMPLE_PERIOD_S) + 1)
            if stop.wait(max(0.0, t0 + k * SAMPLE_PERIOD_S - time.monotonic())):
                return

    def _collect(self, report: RunReport) -> None:
        inv = self.cluster.invariants().wait(None)
        status = self.coordinator.status().wait(None)
        shards = self._shard_clients(None)
        report.shards_at_end = len(shards)
        stats: list[ShardStats] = list(self.coordinator.retired_shard_stats().wait(None))
        for s in shards:
            try:
                stats.append(s.take_stats().wait(10))
                report.shard_snapshots.append(s.snapshot().wait(10))
            except Exception as e:  # noqa: BLE001 - a dead shard's numbers are lost, say so
                # Ray's error type when it got no answer (ActorDiedError, GetTimeoutError), else the error's
                report.errors.append(f"a shard did not report: {e.kind if isinstance(e, NoAnswer) else type(e).__name__}")
        binds = self.cluster.bind_times().wait(None)
        timeline = binds["timeline"]
        if timeline and not (report.interrupted or report.timed_out or report.errors):
            # the window ends at the last bind, as the cluster timed it (progress is followed less often)
            report.schedule_wall_s = min(report.schedule_wall_s, max(t for t, _ in timeline) - self._t0_unix)
        steps = self.coordinator.scale_history().wait(None)
        if steps:
            report.scaling = scale_phases(steps, timeline, self._t0_unix, self._t0_unix + report.schedule_wall_s)
        report.latencies_s.extend(binds["latencies_s"])
        for st in stats:
            report.conflicts += st.conflicts
        report.invariants = inv
        tracked = set(self.coordinator.pending_keys().wait(None))
        unbound = inv["pods_unbound"]
        report.lost_pods = len([k for k in unbound if k not in tracked])
        # pods ever bound (a trace's pods bound, then deleted at their end time, count too): every
        # successful bind, less those of a pod already bound (double_binds, reported on their own)
        report.pods_bound = int(inv["binds"]) - int(inv["double_binds"])
        report.pods_unschedulable = status["unschedulable"]
        report.pods_deleted_unbound = max(0, self.feeder.created - report.pods_bound - len(unbound))
        report.pods_pending = max(0, report.pods_total - report.pods_bound - report.pods_unschedulable
                                  - report.pods_deleted_unbound - report.lost_pods)
        if report.timed_out:  # the summary's pending count (the coordinator's includes the unschedulable)
            report.errors.append(f"timed out after {self.options.timeout_s:g} s with {report.pods_pending} pods pending")
        report.samples.append(Sample.of(time.monotonic() - self._t0, self.cluster.progress().wait(None)))
        report.created_first_s, report.created_last_s = self.feeder.created_first_s, self.feeder.created_last_s
        report.allocatable = dict(self._allocatable)
        report.replay = self.feeder.replay
        report.requeues = status["requeues"]
        report.replaced_shards = status["replaced_shards"]
        report.ledger_rebuilds = status["ledger_rebuilds"]
        report.coordinator_restarts = self.coordinator_restarts
        report.unschedulable_reasons = self.coordinator.unschedulable_reasons().wait(None)
        report.cpu_s = self.meter.cpu_s()
        report.metered_s = time.monotonic() - self._t0
        report.cpu_s_by_process = self.meter.cpu_by_label()
        report.ray_system_cpu_s = self.system_meter.cpu_s()
        self.meter.sample()
        report.peak_rss_bytes = self.meter.peak_rss
        report.peak_rss_by_process = dict(self.meter.peak_rss_by_label)
