"""Ray actors: where ``ray.remote`` is applied to the plain Shard, Coordinator and SimCluster classes.

Actors are created with ``num_cpus=0`` by default so that a local Ray on a 2-core machine can host
the coordinator, the simulated cluster and several shards; on a Ray cluster, pass
``shard_num_cpus=1`` so that shards declare their CPU and Ray's autoscaler can add worker nodes.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import ray

from shardsched.config import SchedulerConfiguration
from shardsched.sharding.coordinator import Coordinator
from shardsched.sharding.remote import Remote, RemoteBindTarget, RemoteRebalancer
from shardsched.sharding.shard import Shard, ShardOptions
from shardsched.sim.cluster import SimCluster
from shardsched.store.ledger import Ledger
from shardsched.store.server import connect

#: concurrent method calls per actor: the loop runs in its own thread, calls arrive meanwhile
MAX_CONCURRENCY = 16


class ShardHost:
    """A Shard inside a Ray actor: builds its Redis connection in the actor and runs the loop in a
    thread; the methods forward to the Shard."""

    def __init__(self, index: int, member: str, config: SchedulerConfiguration, redis_url: str, prefix: str,
                 cluster: Any, coordinator: Any, options: ShardOptions) -> None:
        ledger = Ledger(connect(redis_url), prefix)
        self.shard = Shard(index, member, config, ledger, RemoteBindTarget(Remote(cluster)),
                           RemoteRebalancer(Remote(coordinator)), options)
        self.thread = threading.Thread(target=self.shard.run_forever, name=f"shard-{index}", daemon=True)
        self.thread.start()

    def set_epoch(self, epoch): self.shard.set_epoch(epoch)
    def apply_nodes(self, upserts, removals): self.shard.apply_nodes(upserts, removals)
    def apply_bound(self, adds, removes): self.shard.apply_bound(adds, removes)
    def add_pods(self, pods): self.shard.add_pods(pods)
    def accept(self, qpis, unschedulable=False): self.shard.accept(qpis, unschedulable)
    def remove_pods(self, keys): self.shard.remove_pods(keys)
    def nudge(self, event="NodeUpdate"): self.shard.nudge(event)
    def snapshot(self): return self.shard.snapshot()
    def pending_keys(self): return self.shard.pending_keys()
    def take_stats(self): return self.shard.take_stats()
    def metric_samples(self): return self.shard.metric_samples()
    def ping(self): return self.shard.ping()
    def pid(self): return os.getpid()
    def stop(self): self.shard.stop()


class CoordinatorHost:
    """The Coordinator inside a Ray actor; it creates the shard actors itself."""

    def __init__(self, config: SchedulerConfiguration, redis_url: str, prefix: str, cluster: Any, num_shards: int,
                 shard_options: ShardOptions, shard_num_cpus: float = 0) -> None:
        me = ray.get_runtime_context().current_actor
        self.shard_handles: dict[str, Any] = {}

        def factory(index: int, member: str) -> Remote:
            handle = ray.remote(ShardHost).options(
                name=None, max_concurrency=MAX_CONCURRENCY, num_cpus=shard_num_cpus, max_restarts=0,
            ).remote(index, member, config, redis_url, prefix, cluster, me, shard_options)
            self.shard_handles[member] = handle
            return Remote(handle)

        self.coordinator = Coordinator(config, Ledger(connect(redis_url), prefix), Remote(cluster), factory, num_shards)
        self.thread: threading.Thread | None = None

    def start(self) -> dict:
        self.coordinator.start()
        self.thread = threading.Thread(target=self.coordinator.run_forever, name="coordinator", daemon=True)
        self.thread.start()
        return self.coordinator.status()

    def handoff(self, shard, items): self.coordinator.handoff(shard, items)
    def status(self): return self.coordinator.status()
    def unschedulable_reasons(self): return self.coordinator.unschedulable_reasons()
    def pending_keys(self): return self.coordinator.pending_keys()
    def kill_shard(self, index): self.coordinator.kill_shard(index)
    def metric_samples(self): return self.coordinator.metrics.samples()
    def pid(self): return os.getpid()

    def shards(self) -> list[Any]:
        """Handles of the current shard actors."""
        return [s.remote.target for s in self.coordinator.shards]

    def stop(self) -> None:
        self.coordinator.stop()
        for s in self.coordinator.shards:
            try:
                ray.get(s.remote.target.stop.remote(), timeout=5)
            except Exception:  # noqa: BLE001 - stopping: a dead shard is fine
                pass


class SimClusterHost(SimCluster):
    """The simulated cluster as an actor (adds the process id, for the CPU/memory report)."""

    def pid(self) -> int:
        return os.getpid()

    def progress(self) -> dict[str, int]:
        """Cheap counters for progress display: pods, bound, unbound, admission rejections."""
        with self._lock:
            total = len(self._pods)
            unbound = sum(1 for p in self._pods.values() if not p["spec"].get("nodeName"))
        return {"pods": total, "bound": total - unbound, "unbound": unbound}


def sim_cluster_actor(**kwargs: Any) -> Any:
    """Start the simulated cluster as a Ray actor (the embedded "API server")."""
    return ray.remote(SimClusterHost).options(max_concurrency=MAX_CONCURRENCY, num_cpus=0).remote(**kwargs)


def coordinator_actor(*args: Any, **kwargs: Any) -> Any:
    return ray.remote(CoordinatorHost).options(max_concurrency=MAX_CONCURRENCY, num_cpus=0).remote(*args, **kwargs)
