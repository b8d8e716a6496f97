"""Builds the coordinator and the shards for a real cluster (what ``shardsched serve`` runs).

Two ways to run them, same classes as the embedded run:

- ``ray`` (default): the coordinator and each shard are Ray actors (``shardsched.sharding.actors``;
  the coordinator's, `BackendCoordinatorHost`, with the backend's health and metrics), called
  through `CoordinatorClient`; this module does not import Ray. Each process gets its
  own copy of the `KubeCluster` (it pickles as its connection settings): the coordinator's copy
  runs the informers and writes Events and conditions; each shard's copy binds, with 1/shards of
  the binding rate budget.
- ``threads``: everything in this process, the shards' loops in threads, one `KubeCluster` for all
  (no Ray: for small clusters, tests, and machines where Ray cannot run).

The Redis ledger's keys get a prefix unique to this run (``ss:<lease>:<random>:``): a new leader
starts from the cluster's truth (list + watch), not from what a previous leader left in Redis.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from shardsched.config import SchedulerConfiguration
from shardsched.errors import ShardschedError
from shardsched.kube.client import ClientSpec
from shardsched.kube.cluster import KubeCluster
from shardsched.sharding.calls import ActorFailed, NoAnswer, ShardHostClient, wait_all
from shardsched.sharding.scaling import RAY_NAMESPACE, AutoscalerOptions
from shardsched.sharding.shard import ShardOptions
from shardsched.store.server import EmbeddedRedis

log = logging.getLogger(__name__)

RAY, THREADS = "ray", "threads"


#: on `KubeRuntime.stop`, how long the binds already in flight may take (then closing the
#: connection cancels the rest: their pods are requeued, their reservations expire)
BINDS_GRACE_S = 5.0


@dataclass
class RuntimeOptions:
    """What `KubeRuntime` runs (``shardsched serve --help`` explains each).

    Attributes:
        mode: RAY or THREADS.
        shard_num_cpus: CPUs each shard actor declares (RAY): 0 packs them anywhere; 1 lets Ray's
            autoscaler add workers as shards are added.
        watch_timeout_s: server-side timeout of one watch call.
        prefix: Redis key prefix; None = a fresh ``ss:<random>:``.
        autoscaler: let the coordinator set the shard count (`Coordinator.enable_autoscaler`);
            ``shards`` is the count at start.
        freeze_gc: in THREADS mode, freeze the cluster out of this process's collector after each
            relist (`shardsched.gctune.freeze_loaded`; serve sets it, the process is its own). In
            RAY mode the coordinator's actor always does.
        shutdown_grace_s: on `KubeRuntime.stop`, how long the Events and conditions already decided
            may take to be written, after the binds in flight (at most `BINDS_GRACE_S`). Default
            20 s: both fit in the 30 s a pod is given to stop (``terminationGracePeriodSeconds``'s
            default) before its SIGKILL; at serve's default 50 requests/s that is room for 1,000
            writes.
    """

    shards: int = 2
    shard_options: ShardOptions = field(default_factory=ShardOptions)
    redis_url: str | None = None
    ray_address: str | None = None
    mode: str = RAY
    watch_timeout_s: float = 300.0
    prefix: str | None = None
    shard_num_cpus: float = 0.0
    autoscaler: AutoscalerOptions | None = None
    freeze_gc: bool = False
    shutdown_grace_s: float = 20.0


class _CoordinatorRef:
    """`Rebalancer` for in-process shards: hands pods to the coordinator once it exists."""

    def __init__(self) -> None:
        self.coordinator = None

    def handoff(self, shard: int, items) -> None:
        self.coordinator.handoff(shard, items)

    def committed(self, shard: int, epoch: int, uids) -> None:
        self.coordinator.committed(shard, epoch, uids)


class KubeRuntime:
    """Redis (embedded unless ``redis_url``), then the coordinator and shards (module docstring).

    Args:
        config: the scheduler configuration (its profiles' schedulerNames are the pods served).
        spec: how to reach the API server.
        options: see `RuntimeOptions`.
        cluster: THREADS mode only: a backend object to use instead of a new `KubeCluster` (any
            object with the cluster protocol and ``bind_many``, e.g. a `SimCluster`: the tests run
            the same scenarios on both backends this way).
    """

    def __init__(self, config: SchedulerConfiguration, spec: ClientSpec | None, options: RuntimeOptions,
                 cluster: Any = None) -> None:
        self.config = config
        self.spec = spec
        self.options = options
        self.names = [p.scheduler_name for p in config.profiles]
        self.redis: EmbeddedRedis | None = None
        self.redis_url = options.redis_url
        self.prefix = options.prefix or f"ss:{uuid.uuid4().hex[:8]}:"
        self.cluster = cluster  # THREADS: the shared backend
        self.coordinator: Any = None  # THREADS: Coordinator; RAY: its CoordinatorClient
        self.shards: list[Any] = []
        self._threads: list[threading.Thread] = []
        self.started = False

    def _start_redis(self) -> None:
        if self.redis_url:
            return
        self.redis = EmbeddedRedis()
        self.redis.start()
        self.redis_url = self.redis.url

    def start(self) -> None:
        """Start everything; the informers' first lists happen here (the caches are synced when it
        returns).

        Raises: `PermanentError` (kubeconfig, RBAC) or `TemporaryError` (API unreachable) from the
        first lists; `ShardschedError` when Redis or Ray cannot start. Safe to call again after it
        raised (what started is reused).
        """
        self._start_redis()
        if self.options.mode == THREADS:
            self._start_threads()
        else:
            self._start_ray()
        self.started = True

    def _start_threads(self) -> None:
        from shardsched.sharding.coordinator import Coordinator
        from shardsched.sharding.calls import ClusterClient, Local, ShardClient
        from shardsched.sharding.shard import Shard
        from shardsched.store.ledger import Ledger
        from shardsched.store.server import connect

        if self.cluster is None:
            self.cluster = KubeCluster(self.spec, self.names, watch_timeout_s=self.options.watch_timeout_s,
                                       pod_groups=self.config.enables("Coscheduling"),
                                       watch_storage=self.config.watches_storage())
        if isinstance(self.cluster, KubeCluster):
            self.cluster.start()
            if self.options.shard_options.binding_cycles > 0:  # every shard's binding cycles share it
                self.cluster.open_connections(self.options.shards * self.options.shard_options.binding_cycles)
        ref = _CoordinatorRef()

        def factory(index: int, member: str) -> ShardClient:
            shard = Shard(index, member, self.config, Ledger(connect(self.redis_url), self.prefix), self.cluster, ref,
                          self.options.shard_options)
            t = threading.Thread(target=shard.run_forever, name=f"shard-{index}", daemon=True)
            t.start()
            self.shards.append(shard)
            self._threads.append(t)
            return ShardClient(Local(shard))

        coordinator = Coordinator(self.config, Ledger(connect(self.redis_url), self.prefix),
                                  ClusterClient(Local(self.cluster)), factory, self.options.shards)
        if self.options.autoscaler is not None:
            coordinator.enable_autoscaler(self.options.autoscaler)
        ref.coordinator = coordinator
        if self.options.freeze_gc:
            from shardsched import gctune

            coordinator.on_relist = gctune.freeze_loaded
        coordinator.start()
        self.coordinator = coordinator
        t = threading.Thread(target=coordinator.run_forever, name="coordinator", daemon=True)
        t.start()
        self._threads.append(t)

    def _start_ray(self) -> None:
        from shardsched.sharding import rayaccess
        from shardsched.sharding.actors import serve_coordinator_actor

        if not rayaccess.connected():
            # ray.init installs a SIGTERM handler that exits at once (status 15, no orderly stop);
            # the caller's own handler (serve's: stop, release the Lease, exit 0) is kept
            in_main = threading.current_thread() is threading.main_thread()
            sigterm = signal.getsignal(signal.SIGTERM) if in_main else None
            try:
                # serve's job in shardsched's namespace, where its named (and detached) actors live
                rayaccess.init(self.options.ray_address, RAY_NAMESPACE)
            except Exception as e:  # noqa: BLE001 - Ray raises many types; the message is what matters
                raise ShardschedError(f"could not start or join Ray ({self.options.ray_address or 'local'}): {e}") from None
            finally:
                if in_main and sigterm not in (None, signal.SIG_DFL):
                    signal.signal(signal.SIGTERM, sigterm)
        if self.coordinator is None:
            cluster = KubeCluster(self.spec, self.names, bind_share=1.0 / self.options.shards,
                                  watch_timeout_s=self.options.watch_timeout_s,
                                  pod_groups=self.config.enables("Coscheduling"),
                                  watch_storage=self.config.watches_storage())
            self.coordinator = serve_coordinator_actor(
                self.config, self.redis_url, self.prefix, cluster, self.options.shards, self.options.shard_options,
                self.options.shard_num_cpus, autoscaler=self.options.autoscaler)
        # its own errors raise as they are, another as MethodFailed
        self.coordinator.start().wait(None)

    # ------------------------------------------------------------------ inspection
    def status(self) -> dict:
        """Coordinator status plus the backend's health (``cluster``), as plain dicts."""
        if not self.started:
            return {"started": False}
        if self.options.mode == THREADS:
            health = self.cluster.health() if isinstance(self.cluster, KubeCluster) else {}
            return {**self.coordinator.status(), "cluster": health}
        status, health = wait_all([self.coordinator.status(), self.coordinator.cluster_health()], 10)
        return {**status, "cluster": health}

    def coordinator_dead(self) -> str:
        """Why the coordinator is gone ("" while it lives or cannot be told): in Ray mode its actor
        died (killed, or its node lost), which takes the shards with it; in threads mode it runs in
        this process and cannot die alone."""
        if not self.started or self.options.mode == THREADS:
            return ""
        try:
            self.coordinator.status().wait(10)
        except ActorFailed as e:
            return f"{e.kind}: {e}"
        except NoAnswer:
            return ""  # busy, not dead
        return ""

    def problems(self) -> list[str]:
        """Why the running scheduler cannot work right now (empty when it can): Redis not answering
        a PING, a watch of the API server failing (its newest error). For ``/readyz``.

        Never raises: a status that cannot be read is itself a problem."""
        if not self.started:
            return ["not started"]
        out = []
        try:
            import redis

            redis.Redis.from_url(self.redis_url, socket_timeout=1, socket_connect_timeout=1).ping()
        except (redis.RedisError, OSError) as e:
            out.append(f"Redis not answering: {type(e).__name__}: {e}")
        try:
            health = self.status().get("cluster") or {}
        except Exception as e:  # noqa: BLE001 - readiness must answer
            return out + [f"status unavailable: {type(e).__name__}: {e}"]
        for name, w in (health.get("watches") or {}).items():
            if w.get("failing"):
                out.append(f"watch {name} failing: {w.get('last_error', '')}")
        return out

    def metric_families(self) -> dict[str, list]:
        """{source label: samples} for `shardsched.metrics.AggregateCollector`: each shard, the
        coordinator, and the Kubernetes backend."""
        if not self.started:
            return {}
        if self.options.mode == THREADS:
            # the current shards, labelled by index as in Ray mode (removed shards stop reporting)
            out = {str(ref.index): ref.client.channel.target.metric_samples() for ref in list(self.coordinator.state.shards)}
            kube = self.cluster.metric_samples() if isinstance(self.cluster, KubeCluster) else []
            out["coordinator"] = self.coordinator.state.metrics.samples() + kube
            return out
        from shardsched.sharding.remote import channel

        handles = self.coordinator.shards().wait(5)
        samples = wait_all([ShardHostClient(channel(h)).metric_samples() for h in handles], 5)
        out = {str(i): s for i, s in enumerate(samples)}
        coord, kube = wait_all([self.coordinator.coordinator_metrics(), self.coordinator.cluster_metrics()], 5)
        out["coordinator"] = coord + kube
        return out

    def events_settled(self) -> int:
        """Events every part of the scheduler has written or given up on (written, failed, dropped:
        ``shardsched_kube_events_written_total``), summed; a queued Event is not counted yet. For
        ``serve --bench`` (`shardsched.bench.serve.Bench.wait_events`)."""
        total = 0
        for families in self.metric_families().values():
            for name, _kind, _doc, samples in families:
                if name == "shardsched_kube_events_written":
                    total += int(sum(v for _n, labels, v in samples if labels.get("outcome") != "retries"))
        return total

    def stop(self) -> None:
        """Stop the coordinator and shards (binds in flight finish, within `BINDS_GRACE_S`), write
        the Events and conditions already queued (within ``options.shutdown_grace_s``; what is
        left then is dropped and logged), stop Redis if embedded. Safe to call more than once."""
        grace_s = self.options.shutdown_grace_s
        try:
            if self.options.mode == THREADS:
                if self.coordinator is not None:
                    self.coordinator.stop()
                if isinstance(self.cluster, KubeCluster):
                    self.cluster.drain_binds()  # binds not yet sent are not sent (pods back in the queue)
                for s in self.shards:
                    s.stop()
                # binds in flight get 5 s in all; then closing the connection cancels the rest
                # (their pods are requeued, reservations expire), so a stop never hangs on a slow
                # or rate-limited API server
                deadline = time.monotonic() + BINDS_GRACE_S
                for t in self._threads:
                    t.join(timeout=max(0.0, deadline - time.monotonic()))
                if isinstance(self.cluster, KubeCluster):
                    self.cluster.stop(grace_s)
                for t in self._threads:
                    t.join(timeout=2)
            elif self.coordinator is not None:
                from shardsched.sharding import rayaccess
                from shardsched.sharding.remote import channel

                try:
                    handles = self.coordinator.shards().wait(5)
                    # the shards write their Events while the coordinator's backend writes its own
                    wait_all([self.coordinator.stop(grace_s), self.coordinator.stop_cluster(grace_s)],
                             BINDS_GRACE_S + grace_s + 10)
                    for h in handles:
                        channel(h).terminate()
                    self.coordinator.channel.terminate()
                except Exception:  # noqa: BLE001 - stopping: a dead actor is fine
                    pass
                if not self.options.ray_address:
                    rayaccess.shutdown()
        finally:
            self.coordinator = None
            if self.redis is not None:
                self.redis.stop()
                self.redis = None
