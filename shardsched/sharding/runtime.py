"""The embedded main job: local Ray, local Redis, the simulated cluster, a coordinator and shards.

`EmbeddedRun` starts everything, feeds the workload (a burst, or a trace replayed in time), changes
the shard count at given times (``scale_at``) or lets the coordinator's autoscaler do it, follows
progress, restarts the embedded redis-server when it exits, collects the report (latency,
throughput, CPU, memory, invariants, scale steps with the throughput around each) and stops
everything, also on errors, on Ctrl-C (SIGINT) and on SIGTERM.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
import psutil
import ray

from shardsched.config import SchedulerConfiguration
from shardsched.errors import ShardschedError
from shardsched.sharding.actors import COORDINATOR_NAME, coordinator_actor, kill_shard_actors
from shardsched.sharding.rayaccess import describe_access
from shardsched.sharding.sim_actor import sim_cluster_actor, unschedulable
from shardsched.sharding.scaling import RAY_NAMESPACE, AutoscalerOptions
from shardsched.sharding.shard import CREATED_AT_ANNOTATION, ShardOptions, ShardStats
from shardsched.sim.cluster import FaultConfig
from shardsched.sim.trace import TraceReplay
from shardsched.store.server import EmbeddedRedis, RedisServerError

log = logging.getLogger(__name__)

CREATE_CHUNK = 2000
#: progress following period once the run is past its first seconds (shorter before: `_follow`)
FOLLOW_PERIOD_S = 0.25
#: the plot's sampling period: the simulated cluster is read this often (`EmbeddedRun._sample`)
SAMPLE_PERIOD_S = 0.25
#: a scale step's "during" window lasts this long after its handover: new shards fill their first
#: batches, queues spread, stale owners' fenced batches come back through the rebalancer
SCALE_SETTLE_S = 1.0


class _DropMessage(logging.Filter):
    """Drops the log records whose message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


def _how_it_ended(returncode: int | None) -> str:
    """A process's end in words: ``killed by SIGKILL`` (a negative return code, as subprocess gives
    it) or ``exit status N``."""
    if returncode is not None and returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit status {returncode}"


class RunError(ShardschedError):
    """The run could not start or went wrong in a way that needs the operator (message says what)."""


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached `EmbeddedRun.run` (raised in the main thread by its handler, as
    Python raises KeyboardInterrupt for SIGINT); ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def _interruptible():
    """While inside, SIGINT and SIGTERM raise `Interrupted` in the main thread, once. The yielded
    dict steers it: after ``"stopping"`` is set (the run already stops in order) a signal is logged
    and ignored; while ``"defer"`` is set it is kept in ``"pending"`` for the caller to raise later
    (`_init_ray`); ``"received"`` is the signal that was raised. The previous handlers are restored on exit. A no-op outside the main thread
    (Python runs signal handlers in the main thread only)."""
    state: dict[str, Any] = {"stopping": False, "defer": False, "pending": None, "received": None}
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def handler(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if state["stopping"]:
            log.warning("%s received while stopping; still stopping", name)
        elif state["defer"]:
            log.warning("%s received while Ray starts; stopping once it has started", name)
            state["pending"] = state["pending"] or signum
        else:
            state["stopping"] = True
            state["received"] = signum  # Ray may turn the exception into a plain KeyboardInterrupt
            raise Interrupted(signum)

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in saved:
        signal.signal(sig, handler)
    try:
        yield state
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)


@dataclass
class RunOptions:
    """What `EmbeddedRun` runs (see ``shardsched run --help`` for the meaning of each)."""

    shards: int = 2
    shard_options: ShardOptions = field(default_factory=ShardOptions)
    redis_url: str | None = None
    #: the Redis URL of the shards only (default: redis_url), e.g. a fault proxy in front of it
    shard_redis_url: str | None = None
    ray_address: str | None = None
    faults: FaultConfig | None = None
    seed: int = 0
    timeout_s: float = 600.0
    time_scale: float = 1.0
    #: a replay's pauses between steps are shortened to this (replay seconds; `TraceReplay`); None: kept
    trace_max_pause_s: float | None = None
    #: a replay holds its clock, at a pod's deletion, until the pod is bound or unschedulable, for
    #: at most this long (`EmbeddedRun._wait_for_bind`); None: pods are deleted on time
    trace_bind_wait_s: float | None = None
    metrics_port: int | None = None
    #: (seconds after the workload starts, shard count): `Coordinator.scale` steps of the run
    scale_at: list[tuple[float, int]] = field(default_factory=list)
    autoscaler: AutoscalerOptions | None = None
    #: the coordinator's Ray actor name (``shardsched scale`` finds it); None = unnamed
    coordinator_name: str | None = COORDINATOR_NAME


@dataclass
class Sample:
    """The simulated cluster at one moment of the run, from one read of it
    (`SimClusterHost.progress`), for the plot. The pod counts split the workload as the summary
    does (`RunReport`): ``bound`` (ever) = ``running`` + ``deleted_bound``; the pods created so far
    are ``created`` = ``running`` + ``unschedulable`` + ``queued`` + ``deleted_bound`` +
    ``deleted_unbound``, and ``pending(total)`` adds those not created yet to ``queued``."""

    #: seconds after the workload started
    t_s: float
    created: int
    bound: int
    #: bound pods that still exist
    running: int
    #: unbound pods with the condition PodScheduled=False, reason Unschedulable
    unschedulable: int
    #: created, not bound, not unschedulable, not deleted: in a queue or in flight in a shard
    queued: int
    deleted_bound: int
    deleted_unbound: int
    #: resource name -> total request of the bound pods that run, canonical units (millicores, bytes, counts)
    requested: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, t_s: float, progress: dict[str, Any]) -> "Sample":
        """The sample of a `SimClusterHost.progress` answer taken ``t_s`` after the workload started."""
        deleted = progress["deleted_bound"] + progress["deleted_unbound"]
        return cls(t_s=t_s, created=progress["pods"] + deleted, bound=progress["binds"], running=progress["bound"],
                   unschedulable=progress["unschedulable"], queued=progress["unbound"] - progress["unschedulable"],
                   deleted_bound=progress["deleted_bound"], deleted_unbound=progress["deleted_unbound"],
                   requested=dict(progress["requested"]))

    def pending(self, total: int) -> int:
        """The summary's pending pods out of ``total``: not created yet, queued, or in flight."""
        return total - self.created + self.queued


@dataclass
class RunReport:
    """The summary of a run; `to_json` gives the ``-o json`` contract.

    Every pod of the workload is counted once: ``pods_total`` = ``pods_bound`` (ever bound, a
    trace's pods deleted after binding included) + ``pods_unschedulable`` + ``pods_pending`` (not
    created yet, queued, or in flight in a shard) + ``pods_deleted_unbound`` (a trace's pods deleted
    before they were bound) + ``lost_pods`` (unbound in the cluster and unknown to the coordinator
    once it caught up with the watch: a bug, must be 0)."""

    pods_total: int = 0
    pods_bound: int = 0
    pods_unschedulable: int = 0
    pods_pending: int = 0
    pods_deleted_unbound: int = 0
    #: False when the run stopped (interrupted, or failed) before the workload started
    started: bool = False
    #: "SIGINT" or "SIGTERM" when a signal stopped the run, else None
    interrupted: str | None = None
    #: the run gave up after ``RunOptions.timeout_s`` with pods pending
    timed_out: bool = False
    #: what died and when, when an actor the run cannot replace died (the simulated cluster, the
    #: coordinator while the run started): ``"the simulated cluster died 3.2 s into the run"``
    died: str | None = None
    #: restarts of the embedded redis-server after it exited: {"at_s", "pid", "exit"}
    redis_restarts: list[dict] = field(default_factory=list)
    ledger_rebuilds: int = 0
    wall_s: float = 0.0
    schedule_wall_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    invariants: dict[str, Any] = field(default_factory=dict)
    conflicts: int = 0
    requeues: int = 0
    shards: int = 0
    #: shards running when the run ended (differs from ``shards``, the count at start, after
    #: ``scale_at`` steps, `shardsched scale` or the autoscaler)
    shards_at_end: int = 0
    nodes: int = 0
    #: CPU seconds of the run's processes (driver, coordinator, shards, cluster, Redis) over
    #: ``metered_s``: from the workload's start until the counts were taken (the run settled)
    cpu_s: float = 0.0
    metered_s: float = 0.0
    cpu_s_by_process: dict[str, float] = field(default_factory=dict)
    peak_rss_by_process: dict[str, int] = field(default_factory=dict)
    ray_system_cpu_s: float = 0.0
    peak_rss_bytes: int = 0
    lost_pods: int = 0
    unschedulable_reasons: dict[str, int] = field(default_factory=dict)
    #: the cluster every `SAMPLE_PERIOD_S` from the workload's start to the end of the run
    samples: list[Sample] = field(default_factory=list)
    #: seconds after the start when the workload's first and last pods were created (None: none was)
    created_first_s: float | None = None
    created_last_s: float | None = None
    #: resource name -> the cluster's total allocatable, canonical units (the plot's 100%)
    allocatable: dict[str, int] = field(default_factory=dict)
    #: a trace replay (pods created and deleted over time), not a burst
    replay: bool = False
    shard_snapshots: list[dict] = field(default_factory=list)
    replaced_shards: int = 0
    coordinator_restarts: int = 0
    #: scale steps (`ScaleStep.to_json`) with ``at_s`` and the throughput before, during, after
    scaling: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def shards_label(self) -> str:
        """The shard count for titles: ``"2"``, or ``"1 -> 2"`` when it changed during the run."""
        if self.shards_at_end in (0, self.shards):
            return str(self.shards)
        return f"{self.shards} -> {self.shards_at_end}"

    @property
    def throughput(self) -> float:
        return self.pods_bound / self.schedule_wall_s if self.schedule_wall_s > 0 else 0.0

    def latency_ms(self) -> dict[str, float]:
        if not self.latencies_s:
            return {"avg": 0.0, "p50": 0.0, "p99": 0.0}
        a = np.asarray(self.latencies_s) * 1000
        return {"avg": float(a.mean()), "p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99))}

    def to_json(self) -> dict[str, Any]:
        inv = self.invariants
        return {
            "pods_total": self.pods_total, "pods_bound": self.pods_bound,
            "pods_unschedulable": self.pods_unschedulable, "pods_pending": self.pods_pending,
            "pods_deleted_unbound": self.pods_deleted_unbound,
            "started": self.started, "interrupted": self.interrupted, "timed_out": self.timed_out, "died": self.died,
            "redis_restarts": self.redis_restarts, "ledger_rebuilds": self.ledger_rebuilds,
            "throughput_pods_per_s": round(self.throughput, 1), "latency_ms": self.latency_ms(),
            "overcommitted_nodes": len(inv.get("overcommitted_nodes", ())),
            "admission_rejections": int(inv.get("admission_rejections", 0)),
            "double_binds": int(inv.get("double_binds", 0)), "lost_pods": self.lost_pods,
            "conflicts": self.conflicts, "requeues": self.requeues, "shards": self.shards,
            "shards_at_end": self.shards_at_end, "nodes": self.nodes,
            "wall_s": round(self.wall_s, 3), "schedule_wall_s": round(self.schedule_wall_s, 3),
            "cpu_cores_used": round(self.cpu_s / self.metered_s, 2) if self.metered_s else 0.0,
            "ray_system_cpu_cores": round(self.ray_system_cpu_s / self.metered_s, 2) if self.metered_s else 0.0,
            "peak_rss_bytes": self.peak_rss_bytes, "cpu_s_by_process": self.cpu_s_by_process,
            "peak_rss_bytes_by_process": self.peak_rss_by_process,
            "replaced_shards": self.replaced_shards, "coordinator_restarts": self.coordinator_restarts,
            "created_first_s": _rounded(self.created_first_s), "created_last_s": _rounded(self.created_last_s),
            "unschedulable_reasons": self.unschedulable_reasons, "scaling": self.scaling, "errors": self.errors,
        }


def _rounded(t_s: float | None) -> float | None:
    return None if t_s is None else round(t_s, 3)


class _ProcessMeter:
    """CPU seconds and peak total RSS of a set of processes (sampled)."""

    def __init__(self) -> None:
        self.procs: dict[int, psutil.Process] = {}
        self.cpu0: dict[int, float] = {}
        self.labels: dict[int, str] = {}
        self.cpu_last: dict[int, float] = {}  # last sampled CPU seconds (kept after the process ends)
        self.peak_rss = 0
        #: peak RSS of each process label (bytes); the total's peak is `peak_rss`
        self.peak_rss_by_label: dict[str, int] = {}

    def add(self, pid: int, label: str = "") -> None:
        if pid in self.procs:
            return
        self.labels[pid] = label or str(pid)
        try:
            p = psutil.Process(pid)
            t = p.cpu_times()
            self.procs[pid] = p
            self.cpu0[pid] = t.user + t.system
        except psutil.Error:
            pass

    def sample(self) -> None:
        total = 0
        for pid, p in list(self.procs.items()):
            try:
                rss = p.memory_info().rss
                total += rss
                label = self.labels.get(pid, str(pid))
                self.peak_rss_by_label[label] = max(self.peak_rss_by_label.get(label, 0), rss)
                t = p.cpu_times()
                self.cpu_last[pid] = t.user + t.system
            except psutil.Error:
                continue
        self.peak_rss = max(self.peak_rss, total)

    def cpu_s(self) -> float:
        return sum(self.cpu_by_label().values())

    def cpu_by_label(self) -> dict[str, float]:
        """CPU seconds used since `add`, per process label (a process that ended, e.g. a removed
        shard, counts up to its last `sample`)."""
        out: dict[str, float] = {}
        for pid, p in self.procs.items():
            try:
                t = p.cpu_times()
                now = t.user + t.system
            except psutil.Error:
                if pid not in self.cpu_last:
                    continue
                now = self.cpu_last[pid]
            out[self.labels[pid]] = round(out.get(self.labels[pid], 0.0) + now - self.cpu0[pid], 3)
        return out


def _allocatable(nodes: list[dict]) -> dict[str, int]:
    """Resource name -> total allocatable of ``nodes`` (Node dicts), canonical units."""
    from shardsched.api.quantity import canonical_quantity

    total: dict[str, int] = {}
    for n in nodes:
        for resource, q in ((n.get("status") or {}).get("allocatable") or {}).items():
            total[resource] = total.get(resource, 0) + canonical_quantity(resource, q)
    return total


def _ray_system_pids() -> list[int]:
    names = ("raylet", "gcs_server", "dashboard", "log_monitor", "monitor.py", "runtime_env")
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "name"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        if any(n in cmd for n in names) and "ray" in cmd:
            out.append(p.info["pid"])
    return out


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
        self.cluster = None
        self.coordinator = None
        self.meter = _ProcessMeter()
        self.system_meter = _ProcessMeter()
        self._feeder_error: list[str] = []
        self._metrics_server = None
        self._started_ray = False
        self._ray_down = threading.Event()  # set by _stop once Ray is shut down (see _init_ray)
        self._signals: dict[str, Any] = {"stopping": False, "defer": False, "pending": None, "received": None}  # see _interruptible
        self._actors: list[Any] = []  # every actor this run created, killed by _stop
        self.coordinator_restarts = 0
        self._created = 0  # workload pods created in the cluster so far (by the feeder)
        self._created_first_s: float | None = None  # seconds after the start: `RunReport.created_first_s`
        self._created_last_s: float | None = None
        self._t0 = 0.0  # time.monotonic() when the workload started
        self._allocatable = _allocatable(nodes)
        self._instant = {id(p) for c, d, p in workload if d == c}  # pods of a trace deleted when created

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
        if not ray.is_initialized():
            self._init_ray()
        self.meter.add(os.getpid(), "driver")
        if self.redis is not None and self.redis.pid:
            self.meter.add(self.redis.pid, "redis")
        for pid in _ray_system_pids():
            self.system_meter.add(pid)
        self.prefix = f"ss:{uuid.uuid4().hex[:8]}:"
        self.redis_url = redis_url
        self.cluster = self._new_cluster()
        self._actors.append(self.cluster)
        ray.get(self.cluster.create_nodes.remote(self.nodes))
        self._start_coordinator(adopt=False)
        self.meter.add(ray.get(self.cluster.pid.remote()), "cluster")
        if o.metrics_port:
            self._serve_metrics(o.metrics_port)

    def _init_ray(self) -> None:
        """Start (or join) Ray, with SIGINT and SIGTERM deferred until it has started.

        A signal in the middle of ``ray.init`` would leave what it started so far without an owner
        (``ray.shutdown`` knows the node only at the end): the raylet goes with this process, but
        its dashboard and runtime-env agents ignore SIGTERM and outlive it. So ``ray.init`` runs in
        a helper thread, where it installs no SIGTERM handler of its own (in the main thread it
        installs one that exits at once); the main thread waits, `_interruptible` keeps the signal,
        and it is raised once Ray is up, when `_stop` can shut all of it down. The helper thread
        lives until `_stop` has shut Ray down: Ray ties its daemons to the thread that started them
        (``PR_SET_PDEATHSIG``), which would end them with it. The handlers are set again afterwards:
        Ray's core worker installs a native SIGTERM handler that dumps a stack and exits.

        Raises:
            RunError: Ray could not start or be joined.
            Interrupted: a signal came while it started (Ray is up; `_stop` shuts it down).
        """
        o = self.options
        self._started_ray = True
        outcome: list[BaseException] = []

        up = threading.Event()

        def init() -> None:
            try:
                # the run's job in shardsched's namespace, where its named (and detached) actors live
                ray.init(address=o.ray_address, namespace=RAY_NAMESPACE, include_dashboard=False,
                         logging_level=logging.WARNING, log_to_driver=True, configure_logging=False)
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                outcome.append(e)
            up.set()
            self._ray_down.wait()

        in_main = threading.current_thread() is threading.main_thread()
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} if in_main else {}
        worker_log = logging.getLogger("ray._private.worker")
        not_main = _DropMessage("SIGTERM handler is not set because current thread is not the main thread")
        worker_log.addFilter(not_main)
        self._signals["defer"] = True
        try:
            thread = threading.Thread(target=init, name="ray-init", daemon=True)
            thread.start()
            while not up.wait(0.1):
                pass
        finally:
            self._signals["defer"] = False
            worker_log.removeFilter(not_main)
            for sig, handler in handlers.items():
                if handler is not None:
                    signal.signal(sig, handler)
        if outcome:
            e = outcome[0]
            raise RunError(f"could not start or join Ray ({o.ray_address or 'local'}): {e}") from None
        if self._signals["pending"]:
            self._signals["stopping"] = True
            self._signals["received"] = self._signals["pending"]
            raise Interrupted(self._signals["pending"])

    def _new_cluster(self) -> Any:
        """The simulated cluster's actor (a subclass may serve a variant of `SimClusterHost`)."""
        return sim_cluster_actor(seed=self.options.seed, faults=self.options.faults)

    def _start_coordinator(self, adopt: bool) -> None:
        """Start a coordinator actor; with ``adopt``, one that takes over the shards of the previous
        (dead) one. Shards are detached (`CoordinatorHost`), so they survive a coordinator's death;
        `_stop` kills them."""
        o = self.options
        try:
            self.coordinator = coordinator_actor(self.config, self.redis_url, self.prefix, self.cluster, o.shards,
                                                 o.shard_options, shard_redis_url=o.shard_redis_url, adoptable=True,
                                                 autoscaler=o.autoscaler, name=o.coordinator_name)
        except ShardschedError as e:
            raise RunError(str(e)) from None
        self._actors.append(self.coordinator)
        try:
            ray.get(self.coordinator.start.remote(adopt))
        except ray.exceptions.RayTaskError as e:  # its first list, the ledger's set-up in Redis, ...
            cause = e.cause if isinstance(getattr(e, "cause", None), Exception) else e
            if self.redis is not None and not self.redis.running:
                raise RunError(f"the embedded redis-server exited ({_how_it_ended(self.redis.returncode)}) while the run started; nothing was "
                               "scheduled") from None
            raise RunError(f"the coordinator could not start: {type(cause).__name__}: {cause}") from None
        self.meter.add(ray.get(self.coordinator.pid.remote()), "coordinator")
        self._meter_shards()

    def _meter_shards(self) -> None:
        """Meter the current shard processes (new ones after a scale step; known ones are kept)."""
        for i, handle in enumerate(ray.get(self.coordinator.shards.remote())):
            self.meter.add(ray.get(handle.pid.remote()), f"shard-{i}")

    def coordinator_status(self) -> dict:
        """The coordinator's status; when its actor died, a new coordinator is started first and
        adopts the running shards (the run's supervisor, as a Kubernetes Deployment restarts a
        crashed scheduler)."""
        try:
            return ray.get(self.coordinator.status.remote(), timeout=30)
        except ray.exceptions.ActorDiedError:
            log.warning("the coordinator died; starting a new one that adopts the running shards")
            # a named actor that died keeps its name while handles to it live; killing it frees it
            ray.kill(self.coordinator, no_restart=True)
            self._start_coordinator(adopt=True)
            self.coordinator_restarts += 1
            return ray.get(self.coordinator.status.remote(), timeout=30)

    def _serve_metrics(self, port: int) -> None:
        from prometheus_client import CollectorRegistry

        from shardsched.metrics import AggregateCollector, serve

        def fetch() -> dict:
            shards = ray.get(self.coordinator.shards.remote(), timeout=5)
            samples = ray.get([s.metric_samples.remote() for s in shards], timeout=5)
            out = {str(i): s for i, s in enumerate(samples)}
            out["coordinator"] = ray.get(self.coordinator.metric_samples.remote(), timeout=5)
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
                self._actors.extend(ray.get(self.coordinator.shards.remote(), timeout=15))
                ray.get(self.coordinator.stop.remote(), timeout=15)
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        if ray.is_initialized():
            for actor in self._actors:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # noqa: BLE001 - already dead is fine
                    pass
            if self.coordinator is not None:
                kill_shard_actors(self.prefix)  # detached: replaced incarnations still alive too
        if self._started_ray:
            ray.shutdown()
            self._ray_down.set()
        if self.redis is not None:
            self.redis.stop()

    # ------------------------------------------------------------------ workload
    def _feed(self, t0: float, stop: threading.Event) -> None:
        """Create (and delete) pods at their times; a burst is created in chunks at once."""
        try:
            steps = list(TraceReplay(self.workload, self.options.time_scale, self.options.trace_max_pause_s)
                         ) if self._is_replay() else None
            if steps is None:
                pods = [p for _, _, p in self.workload]
                for i in range(0, len(pods), CREATE_CHUNK):
                    if stop.is_set():
                        return
                    self._create(pods[i:i + CREATE_CHUNK])
                return
            pending: list = []
            held_s = 0.0  # the replay's clock held so far, waiting for binds (`_wait_for_bind`)
            for step in steps:
                if stop.is_set():
                    return
                if t0 + held_s + step.due_s - time.monotonic() > 0.005:
                    held_s += self._flush(pending, stop)
                    stop.wait(max(0.0, t0 + held_s + step.due_s - time.monotonic()))
                pending.append(step)
            self._flush(pending, stop)
        except Exception as e:  # noqa: BLE001 - report, do not crash the run
            self._feeder_error.append(f"workload feeder: {type(e).__name__}: {e}")
            log.exception("workload feeder failed")

    def _is_replay(self) -> bool:
        """The workload is replayed over time (some pod is created after the start or deleted)."""
        return any(c > 0 or d is not None for c, d, _ in self.workload)

    def _create(self, pods: list[dict]) -> None:
        """Create workload pods in the cluster, stamped with the time of creation (where their
        latency starts), and note when the first and the last were created."""
        started = time.monotonic()
        now = time.time()
        for p in pods:
            p.setdefault("metadata", {}).setdefault("annotations", {})[CREATED_AT_ANNOTATION] = repr(now)
        ray.get(self.cluster.create_pods.remote(pods))
        self._created += len(pods)
        if self._created_first_s is None:
            self._created_first_s = started - self._t0
        self._created_last_s = time.monotonic() - self._t0

    def _flush(self, steps: list, stop: threading.Event) -> float:
        """Carry out replay steps due now (creations first, as `TraceReplay` orders them); returns
        the seconds the replay's clock was held (`_wait_for_bind`)."""
        held_s = 0.0
        creates = [s.pod for s in steps if s.action == "create"]
        if creates:
            self._create(creates)
        for s in steps:
            if s.action == "delete":
                meta = s.pod["metadata"]
                namespace = meta.get("namespace") or "default"
                if id(s.pod) not in self._instant:  # a pod the trace deletes when created is not waited for
                    held_s += self._wait_for_bind(namespace, meta["name"], stop)
                try:
                    ray.get(self.cluster.delete_pod.remote(namespace, meta["name"]))
                except Exception:  # noqa: BLE001 - already gone is fine
                    pass
        steps.clear()
        return held_s

    def _wait_for_bind(self, namespace: str, name: str, stop: threading.Event) -> float:
        """Before a replay deletes a pod: while it is neither bound nor `unschedulable` (nor gone),
        wait, for at most ``trace_bind_wait_s`` (a pod does not end before it ran). Returns the
        seconds waited, 0 when the pod was ready or waiting is off."""
        if not self.options.trace_bind_wait_s:
            return 0.0
        started = None
        while not stop.is_set():
            try:
                pod = ray.get(self.cluster.get_pod.remote(namespace, name))
            except Exception:  # noqa: BLE001 - gone
                break
            if pod["spec"].get("nodeName") or unschedulable(pod):
                break
            started = started or time.monotonic()
            if time.monotonic() - started > self.options.trace_bind_wait_s:
                break
            stop.wait(0.01)
        return 0.0 if started is None else time.monotonic() - started

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
        with _interruptible() as signals:
            self._signals = signals
            try:
                log.info("starting Redis, Ray, the simulated cluster and the actors")
                self._start()
                if self.on_started:
                    self.on_started(*describe_access())
                log.info("scheduling: %d pods on %d nodes, %d shards", len(self.workload), len(self.nodes),
                         self.options.shards)
                t0 = self._t0 = time.monotonic()
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
            except ray.exceptions.RayActorError as e:
                signals["stopping"] = True
                report.died = f"{self._what_died(e)} died"
                if report.started:
                    report.schedule_wall_s = report.schedule_wall_s or time.monotonic() - t0
                    report.died += f" {report.schedule_wall_s:.1f} s into the run"
                    try:
                        self._settle(report, stop, feeder, sampler)
                    except ray.exceptions.RayError:  # the cluster is gone: what its last sample showed
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

    def _what_died(self, error: ray.exceptions.RayActorError) -> str:
        """The run's actor that ``error`` is about, in words ("the simulated cluster")."""
        for handle, what in ((self.cluster, "the simulated cluster"), (self.coordinator, "the coordinator")):
            if handle is not None and handle._actor_id.hex() == getattr(error, "actor_id", None):
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
            ray.get(self.coordinator.stop.remote(), timeout=30)
            ray.get(self.coordinator.catch_up.remote(), timeout=30)
        self._collect(report)

    def _drive(self, t0: float, stop: threading.Event) -> None:
        """Feed the workload and carry out the ``scale_at`` steps at their times; ends when both are
        done (the run does not settle before its last scale step)."""
        scaler = threading.Thread(target=self._scale_at, args=(t0, stop), daemon=True)
        scaler.start()
        self._feed(t0, stop)
        scaler.join()

    def _scale_at(self, t0: float, stop: threading.Event) -> None:
        for at_s, n in sorted(self.options.scale_at):
            if stop.wait(max(0.0, t0 + at_s - time.monotonic())):
                return
            try:
                ray.get(self.coordinator.scale.remote(n), timeout=self.options.timeout_s)
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
            counts = ray.get(self.cluster.progress.remote())
            status = self.coordinator_status()
            self.meter.sample()
            bound = status["bound_seen"]
            elapsed = time.monotonic() - t0
            if self.on_progress:
                self.on_progress(bound, total, status)
            # settled: the workload is all created, and every pod not bound is known to the
            # coordinator as unschedulable (or as having an invalid spec)
            settled = (feeder_done and counts["unbound"] == status["unschedulable"] + status["invalid"]
                       and status["pending"] == status["unschedulable"])
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
        pid, how = self.redis.pid, _how_it_ended(self.redis.returncode)
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
                progress = ray.get(self.cluster.progress.remote(), timeout=10)
            except ray.exceptions.RayActorError:  # the cluster died: the run ends and says so
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
        inv = ray.get(self.cluster.invariants.remote())
        status = ray.get(self.coordinator.status.remote())
        shards = ray.get(self.coordinator.shards.remote())
        report.shards_at_end = len(shards)
        stats: list[ShardStats] = list(ray.get(self.coordinator.retired_shard_stats.remote()))
        for s in shards:
            try:
                stats.append(ray.get(s.take_stats.remote(), timeout=10))
                report.shard_snapshots.append(ray.get(s.snapshot.remote(), timeout=10))
            except Exception as e:  # noqa: BLE001 - a dead shard's numbers are lost, say so
                report.errors.append(f"a shard did not report: {type(e).__name__}")
        timeline = [entry for st in stats for entry in st.timeline]
        if timeline and not (report.interrupted or report.timed_out or report.errors):
            # the window ends at the last bind, as the shards timed it (progress is followed less often)
            report.schedule_wall_s = min(report.schedule_wall_s, max(t for t, _ in timeline) - self._t0_unix)
        steps = ray.get(self.coordinator.scale_history.remote())
        if steps:
            report.scaling = scale_phases(steps, timeline, self._t0_unix, self._t0_unix + report.schedule_wall_s)
        for st in stats:
            report.latencies_s.extend(st.latencies_s)
            report.conflicts += st.conflicts
        report.invariants = inv
        tracked = set(ray.get(self.coordinator.pending_keys.remote()))
        unbound = inv["pods_unbound"]
        report.lost_pods = len([k for k in unbound if k not in tracked])
        # pods ever bound (a trace's pods bound, then deleted at their end time, count too): every
        # successful bind, less those of a pod already bound (double_binds, reported on their own)
        report.pods_bound = int(inv["binds"]) - int(inv["double_binds"])
        report.pods_unschedulable = status["unschedulable"]
        report.pods_deleted_unbound = max(0, self._created - report.pods_bound - len(unbound))
        report.pods_pending = max(0, report.pods_total - report.pods_bound - report.pods_unschedulable
                                  - report.pods_deleted_unbound - report.lost_pods)
        if report.timed_out:  # the summary's pending count (the coordinator's includes the unschedulable)
            report.errors.append(f"timed out after {self.options.timeout_s:g} s with {report.pods_pending} pods pending")
        report.samples.append(Sample.of(time.monotonic() - self._t0, ray.get(self.cluster.progress.remote())))
        report.created_first_s, report.created_last_s = self._created_first_s, self._created_last_s
        report.allocatable = dict(self._allocatable)
        report.replay = self._is_replay()
        report.requeues = status["requeues"]
        report.replaced_shards = status["replaced_shards"]
        report.ledger_rebuilds = status["ledger_rebuilds"]
        report.coordinator_restarts = self.coordinator_restarts
        report.unschedulable_reasons = ray.get(self.coordinator.unschedulable_reasons.remote())
        report.cpu_s = self.meter.cpu_s()
        report.metered_s = time.monotonic() - self._t0
        report.cpu_s_by_process = self.meter.cpu_by_label()
        report.ray_system_cpu_s = self.system_meter.cpu_s()
        self.meter.sample()
        report.peak_rss_bytes = self.meter.peak_rss
        report.peak_rss_by_process = dict(self.meter.peak_rss_by_label)


def scale_phases(steps: list[dict], timeline: list[tuple[float, int]], start_unix_s: float,
                 end_unix_s: float) -> list[dict]:
    """Scale steps with the throughput around each, in pods bound per second from the shards'
    bind timeline (Unix time, pods bound) of all shards, removed ones included: ``before`` from the
    end of the previous step's "during" window (or ``start_unix_s``) to the step's start; ``during``
    from its start (new shards starting included) to `SCALE_SETTLE_S` after its handover; ``after``
    from there to the next step's start (or ``end_unix_s``, when the last pod was bound). A window
    of no length gives None. ``at_s``: the step's start, seconds after ``start_unix_s``."""
    times = np.array([t for t, _ in timeline], float)
    counts = np.array([n for _, n in timeline], float)

    def rate(a: float, b: float) -> float | None:
        if b - a <= 0:
            return None
        return round(float(counts[(times >= a) & (times < b)].sum() / (b - a)), 1)

    out = []
    begin = start_unix_s
    for i, step in enumerate(steps):
        start = step["started_unix_s"]
        settled = start + step["start_s"] + step["handover_s"] + SCALE_SETTLE_S
        until = steps[i + 1]["started_unix_s"] if i + 1 < len(steps) else end_unix_s
        out.append({**step, "at_s": round(start - start_unix_s, 3),
                    "throughput_before_pods_per_s": rate(begin, start),
                    "throughput_during_pods_per_s": rate(start, min(settled, until)),
                    "throughput_after_pods_per_s": rate(settled, until)})
        begin = settled
    return out
