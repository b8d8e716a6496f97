"""Ray actors: where ``ray.remote`` is applied to the plain Shard and Coordinator classes (the
simulated cluster's actor is `shardsched.sharding.sim_actor`, so that a real cluster's run never
imports the simulator).

Actors are created with ``num_cpus=0`` by default so that a local Ray on a 2-core machine can host
the coordinator, the simulated cluster and several shards; on a Ray cluster, pass
``shard_num_cpus=1`` so that shards declare their CPU and Ray's autoscaler can add worker nodes.

The coordinator of ``shardsched run`` and ``shardsched serve`` is a named actor
(`COORDINATOR_NAME` in the Ray namespace `RAY_NAMESPACE`), so that ``shardsched scale`` finds it
from another process (`find_coordinator`).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError

from shardsched import gctune
from shardsched.config import SchedulerConfiguration
from shardsched.errors import ShardschedError
from shardsched.sharding.coordinator import Coordinator
from shardsched.sharding.calls import ClusterBinds, ClusterClient, CoordinatorClient, ShardClient
from shardsched.sharding.rayaccess import enable_token_auth
from shardsched.sharding.remote import RayChannel, channel
from shardsched.sharding.scaling import COORDINATOR_NAME, RAY_NAMESPACE, AutoscalerOptions
from shardsched.sharding.shard import Shard, ShardOptions
from shardsched.store.ledger import Ledger
from shardsched.store.server import connect

#: concurrent method calls per actor: the loop runs in its own thread, calls arrive meanwhile
MAX_CONCURRENCY = 16
#: the runtime environment of every actor of the scheduler: Ray starts worker processes 15 nice
#: levels below the raylet (``RAY_worker_niceness``, for batch tasks), so on a loaded machine the
#: coordinator and the shards would wait behind every other process, the one that feeds them
#: included, and a pod arriving alone would wait with them; they run at the raylet's priority, as
#: Ray's own job supervisor does
ACTOR_RUNTIME_ENV = {"env_vars": {"RAY_worker_niceness": "0"}}
#: how long `coordinator_actor` waits for the name of a coordinator just killed to be free
NAME_RELEASE_TIMEOUT_S = 10.0

log = logging.getLogger(__name__)


class ShardHost(Shard):
    """A Shard inside a Ray actor: it connects to Redis in the actor's process, runs its loop in a
    thread, and calls the cluster and the coordinator through their clients. Its methods are the
    Shard's (`shardsched.sharding.calls.ShardAPI`), plus what only the host knows: the backend copy
    of this process (``capabilities.per_process``) and the process id."""

    def __init__(self, index: int, member: str, config: SchedulerConfiguration, redis_url: str, prefix: str,
                 cluster: Any, coordinator: Any, options: ShardOptions) -> None:
        gctune.tune()  # this actor's process (shardsched.gctune)
        backend = ClusterClient(channel(cluster))
        # a backend copy living in this process (the Kubernetes backend binds from each shard:
        # `shardsched.cluster.PerProcessBackend`) has counters of its own (binds by code, Events
        # written): `metric_samples` adds them
        self._own_backend = None if backend.channel.is_actor or not cluster.capabilities.per_process else cluster
        self._backend_stopped = False
        super().__init__(index, member, config, Ledger(connect(redis_url), prefix), ClusterBinds(backend),
                         CoordinatorClient(RayChannel(coordinator)), options)
        self.thread = threading.Thread(target=self.run_forever, name=f"shard-{index}", daemon=True)
        self.thread.start()
        # before this constructor returns, i.e. before the coordinator's start-up ping is answered:
        # the backend's connections for this shard's binding cycles (`KubeCluster.open_connections`)
        if self._own_backend is not None and options.binding_cycles > 0:
            self._own_backend.open_connections(options.binding_cycles)

    def adopt(self, coordinator: Any) -> str:
        """A new coordinator (actor handle) takes this shard over (`Shard.adopt`); returns the member."""
        super().adopt(CoordinatorClient(RayChannel(coordinator)))
        return self.member

    def metric_samples(self) -> list:
        own = self._own_backend.metric_samples() if self._own_backend is not None else []
        return super().metric_samples() + own

    def pid(self) -> int:
        return os.getpid()

    def stop(self, flush_timeout_s: float = 5.0) -> None:
        """Stop the loop; once its binding cycles are applied (up to 5 s), write what the shard's
        own backend still queues (the Kubernetes backend's Scheduled Events, up to
        ``flush_timeout_s`` more), once."""
        super().stop()
        self.wait_idle(5.0)
        if self._own_backend is not None and not self._backend_stopped:
            self._backend_stopped = True
            try:
                self._own_backend.stop(flush_timeout_s)
            except Exception as e:  # noqa: BLE001 - stopping: best effort
                log.warning("shard %s: stopping its backend: %s", self.member, e)

    def drain_binds(self) -> None:
        """Whole-scheduler stop: this shard's backend sends no more binds (`KubeCluster.drain_binds`)."""
        if self._own_backend is not None:
            self._own_backend.drain_binds()


class CoordinatorHost:
    """The Coordinator inside a Ray actor; it creates the shard actors itself.

    Shard actors are named ``<prefix><member>`` (``ss:ab12:shard-0@1``). With ``adoptable`` they
    are also detached, so they outlive this actor: a new coordinator started with
    ``start(adopt=True)`` takes them over (Ray Serve's controller re-adopts its replicas the same
    way), and whoever started the run kills them at its end (`kill_shard_actors`). Without it they
    share this actor's fate, as Ray's owned actors do.

    Args:
        shard_redis_url: the Redis URL the shards use (default ``redis_url``), e.g. through a
            proxy that a chaos scenario controls; the coordinator always uses ``redis_url``.
        autoscaler: let the coordinator set the shard count (`Coordinator.enable_autoscaler`).
    """

    def __init__(self, config: SchedulerConfiguration, redis_url: str, prefix: str, cluster: Any, num_shards: int,
                 shard_options: ShardOptions, shard_num_cpus: float = 0, shard_redis_url: str | None = None,
                 adoptable: bool = False, autoscaler: AutoscalerOptions | None = None) -> None:
        gctune.tune()  # this actor's process (shardsched.gctune)
        me = ray.get_runtime_context().current_actor
        self.me = me
        self.prefix = prefix
        self.shard_handles: dict[str, Any] = {}

        def factory(index: int, member: str) -> ShardClient:
            handle = ray.remote(ShardHost).options(
                name=f"{prefix}{member}", lifetime="detached" if adoptable else None,
                max_concurrency=MAX_CONCURRENCY, num_cpus=shard_num_cpus, max_restarts=0, runtime_env=ACTOR_RUNTIME_ENV,
            ).remote(index, member, config, shard_redis_url or redis_url, prefix, cluster, me, shard_options)
            self.shard_handles[member] = handle
            return ShardClient(RayChannel(handle))

        self.coordinator = Coordinator(config, Ledger(connect(redis_url), prefix), ClusterClient(channel(cluster)),
                                       factory, num_shards)
        # the cluster just listed (start, and again after a 410 relist): out of later collections
        self.coordinator.on_relist = gctune.freeze_loaded
        if autoscaler is not None:
            self.coordinator.enable_autoscaler(autoscaler)
        self.thread: threading.Thread | None = None

    def start(self, adopt: bool = False) -> dict:
        """Create the shards (or, with ``adopt``, take over the live ones of a previous coordinator
        of this prefix and create only the missing ones), list the cluster, and run the loop."""
        if adopt:
            found = {}
            for index, (member, handle) in shard_actors(self.prefix).items():
                try:
                    ray.get(handle.adopt.remote(self.me), timeout=10)
                except (RayError, GetTimeoutError) as e:
                    log.warning("shard %s not adopted (%s); a new incarnation replaces it", member, type(e).__name__)
                    continue
                self.shard_handles[member] = handle
                found[index] = (member, ShardClient(RayChannel(handle)))
            self.coordinator.adopt(found)
        self.coordinator.start()
        self.thread = threading.Thread(target=self.coordinator.run_forever, name="coordinator", daemon=True)
        self.thread.start()
        return self.coordinator.status()

    def handoff(self, shard, items): self.coordinator.handoff(shard, items)
    def committed(self, shard, epoch, uids): self.coordinator.committed(shard, epoch, uids)
    def status(self): return self.coordinator.status()
    def unschedulable_reasons(self): return self.coordinator.unschedulable_reasons()
    def pending_keys(self): return self.coordinator.pending_keys()
    def catch_up(self): self.coordinator.catch_up()
    def kill_shard(self, index): self.coordinator.kill_shard(index)

    def replace_shard(self, index: int) -> str:
        """Replace shard ``index`` by a new incarnation now, as after failed health checks, whether or
        not the old one still runs (chaos: two owners of the same nodes). Returns the new member."""
        with self.coordinator.state.lock:
            self.coordinator.replace_shard(index)
            return self.coordinator.state.shards[index].member
    def scale(self, n, trigger="api"): return self.coordinator.scale(n, trigger).to_json()
    def scale_history(self): return self.coordinator.scale_history()
    def retired_shard_stats(self): return self.coordinator.scaler.retired_stats
    def metric_samples(self): return self.coordinator.state.metrics.samples()
    def pid(self): return os.getpid()

    def shards(self) -> list[Any]:
        """Handles of the current shard actors."""
        return [s.client.channel.target for s in self.coordinator.state.shards]

    def stop(self, flush_timeout_s: float = 5.0) -> None:
        """Stop the coordinator, then every shard at once (each applies its binding cycles, up to
        5 s, and writes its queued Events, up to ``flush_timeout_s``: `ShardHost.stop`)."""
        self.coordinator.stop()
        for s in self.coordinator.state.shards:  # binds not yet sent are not sent (pods back in the queue)
            try:
                s.client.channel.target.drain_binds.remote()
            except Exception:  # noqa: BLE001 - stopping: a dead shard is fine
                pass
        refs = []
        for s in self.coordinator.state.shards:
            try:
                refs.append(s.client.channel.target.stop.remote(flush_timeout_s))
            except Exception:  # noqa: BLE001 - stopping: a dead shard is fine
                pass
        deadline = time.monotonic() + flush_timeout_s + 7
        for ref in refs:
            try:
                ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - stopping: a dead or slow shard is fine
                pass


def coordinator_actor(*args: Any, name: str | None = None, **kwargs: Any) -> Any:
    """Start a `CoordinatorHost` actor; with ``name``, as a named actor in `RAY_NAMESPACE`.

    Raises:
        ShardschedError: the name stays taken for `NAME_RELEASE_TIMEOUT_S` (another run's
            coordinator is alive on this Ray cluster; a killed one's name is released within it).
    """
    return named_actor(ray.remote(CoordinatorHost), name, num_cpus=0).remote(*args, **kwargs)


class BackendCoordinatorHost(CoordinatorHost):
    """`CoordinatorHost` whose cluster backend lives in its process (``serve``'s `KubeCluster` copy):
    the backend's health and metrics, and its stop, are the ``cluster_*`` calls of `CoordinatorAPI`."""

    def _backend(self) -> Any:
        return self.coordinator.state.cluster.channel.target

    def cluster_health(self) -> dict:
        return self._backend().health()

    def cluster_metrics(self) -> list:
        return self._backend().metric_samples()

    def coordinator_metrics(self) -> list:
        return self.coordinator.state.metrics.samples()

    def stop_cluster(self, flush_timeout_s: float = 5.0) -> None:
        self._backend().stop(flush_timeout_s)


def serve_coordinator_actor(*args: Any, **kwargs: Any) -> CoordinatorClient:
    """Start ``serve``'s coordinator: a `BackendCoordinatorHost` actor named `COORDINATOR_NAME` (so
    that ``shardsched scale`` finds it), on this process's Ray node: it declares no CPU, so a worker
    hosting only it would look idle to Ray's autoscaler and be removed. ``args`` and ``kwargs`` are
    `CoordinatorHost`'s. Returns its client.

    Raises:
        ShardschedError: the name stays taken (`named_actor`).
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    handle = named_actor(ray.remote(BackendCoordinatorHost), COORDINATOR_NAME, num_cpus=0,
                         scheduling_strategy=here).remote(*args, **kwargs)
    return CoordinatorClient(RayChannel(handle))


def named_actor(cls: Any, name: str | None, **options: Any) -> Any:
    """``cls.options(...)`` for a coordinator actor named ``name`` in `RAY_NAMESPACE` (unnamed when
    ``name`` is None), once the name is free: a coordinator killed just before (the previous run on
    a shared Ray, a restarted ``serve``) releases its name within moments.

    Raises:
        ShardschedError: the name is still taken after `NAME_RELEASE_TIMEOUT_S`.
    """
    options.setdefault("max_concurrency", MAX_CONCURRENCY)
    options.setdefault("runtime_env", ACTOR_RUNTIME_ENV)
    if name is None:
        return cls.options(**options)
    deadline = time.monotonic() + NAME_RELEASE_TIMEOUT_S
    while True:
        try:
            ray.get_actor(name, namespace=RAY_NAMESPACE)
        except ValueError:  # no live actor of that name
            return cls.options(name=name, namespace=RAY_NAMESPACE, **options)
        if time.monotonic() > deadline:
            raise ShardschedError(f"a coordinator named {name!r} already runs in Ray namespace {RAY_NAMESPACE!r} "
                                  "(another shardsched run or serve on this Ray cluster)")
        time.sleep(0.1)


class NoRayError(ShardschedError):
    """`find_coordinator` found no Ray instance on this machine to join (none was named)."""


def find_coordinator(ray_address: str | None = None, name: str = COORDINATOR_NAME) -> CoordinatorClient:
    """Join a running Ray cluster (``ray_address``, default ``auto``: the one started on this
    machine) and return a client of the coordinator named ``name`` in `RAY_NAMESPACE`.

    Token authentication is turned on when a token is found (`rayaccess.enable_token_auth`), for
    a given address as Ray does for ``auto``.

    Raises:
        NoRayError: no ``ray_address`` was given and no Ray instance runs on this machine.
        ShardschedError: Ray cannot be joined, or no such coordinator runs there.
    """
    if not ray.is_initialized():
        enable_token_auth()
        try:
            ray.init(address=ray_address or "auto", namespace=RAY_NAMESPACE, logging_level=logging.WARNING,
                     log_to_driver=False, configure_logging=False)
        except ConnectionError as e:
            if ray_address is None and "Could not find any running Ray instance" in str(e):
                raise NoRayError("no Ray instance runs on this machine (is shardsched run or serve running?)") from None
            raise ShardschedError(f"could not join Ray at {ray_address or 'auto'}: {e}") from None
        except Exception as e:  # noqa: BLE001 - Ray raises many types; the message is what matters
            raise ShardschedError(f"could not join Ray at {ray_address or 'auto'}: {e}") from None
    try:
        handle = ray.get_actor(name, namespace=RAY_NAMESPACE)
    except ValueError:
        raise ShardschedError(f"no coordinator named {name!r} in Ray namespace {RAY_NAMESPACE!r} "
                              "(is shardsched run or serve running on this Ray cluster?)") from None
    return CoordinatorClient(RayChannel(handle))


_SHARD_NAME = re.compile(r"shard-(\d+)@(\d+)")


def shard_actors(prefix: str) -> dict[int, tuple[str, Any]]:
    """The live shard actors named with ``prefix`` (see `CoordinatorHost`): shard index -> (member,
    handle) of its newest incarnation. Older incarnations still alive (zombies) are left out."""
    newest: dict[int, tuple[int, str]] = {}
    for name in ray.util.list_named_actors():
        if not name.startswith(prefix):
            continue
        m = _SHARD_NAME.fullmatch(name[len(prefix):])
        if m and int(m.group(2)) > newest.get(int(m.group(1)), (0, ""))[0]:
            newest[int(m.group(1))] = (int(m.group(2)), m.group(0))
    out = {}
    for index, (_, member) in newest.items():
        try:
            out[index] = (member, ray.get_actor(f"{prefix}{member}"))
        except ValueError:  # died since it was listed
            continue
    return out


def kill_shard_actors(prefix: str) -> int:
    """Kill every shard actor named with ``prefix``, zombies of replaced incarnations included (the
    end of a run whose shards are detached). Returns how many."""
    killed = 0
    for name in ray.util.list_named_actors():
        if name.startswith(prefix) and _SHARD_NAME.fullmatch(name[len(prefix):]):
            try:
                ray.kill(ray.get_actor(name), no_restart=True)
                killed += 1
            except (ValueError, RayError):
                continue
    return killed
