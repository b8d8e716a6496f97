"""``bench gangs``: how fast the coordinator decides gangs and holds them in the ledger, and how
fast their members are bound, in one process.

The coordinator and its shards are plain objects (no Ray), stepped in turn, over a simulated
cluster and a private redis-server; every profile has Coscheduling (`docs/gangs.md`). Per
workload (``G x S``: G gangs of S pods, 100m CPU each, minMember S, created at once with their
PodGroups):

- **decide + hold**: from the first step after the intake caught up with the burst to the last
  gang held in the ledger: every member's decision over every node, the gangs' holds
  (`Ledger.reserve_gangs`, one call for the gangs of one pass), the members sent to their shards;
  pods/s = members / that time;
- **to bound**: from the same start until every member is bound (the shards' reserve, permit
  and bind of the held members included); pods/s likewise.

Single-threaded by construction (the shards are stepped by this loop), so **to bound** is the
sum of the coordinator's and the shards' work, not their overlap as in ``run``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass

from shardsched.api.podgroup import POD_GROUP_LABEL
from shardsched.config import load_config
from shardsched.sim import SimCluster, uniform_nodes, uniform_pods

CONFIG = """
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: shardsched
  plugins:
    multiPoint:
      enabled: [{name: Coscheduling}]
      disabled: [{name: PrioritySort}]
"""


@dataclass
class GangResult:
    """One workload: ``gangs`` x ``size`` pods over ``nodes`` nodes and ``shards`` shards; seconds
    and pods/s of the two phases (module docstring); ``held`` gangs held in the ledger."""

    gangs: int
    size: int
    nodes: int
    shards: int
    held: int
    decide_hold_s: float
    to_bound_s: float

    @property
    def pods(self) -> int:
        return self.gangs * self.size

    def to_json(self) -> dict:
        return {**asdict(self), "pods": self.pods, "decide_hold_pods_per_s": self.pods / self.decide_hold_s,
                "to_bound_pods_per_s": self.pods / self.to_bound_s}


def run_one(gangs: int, size: int, nodes: int, shards: int, timeout_s: float = 600.0) -> GangResult:
    """Run one workload (module docstring). Raises TimeoutError when it does not end in time."""
    from shardsched.sharding.calls import ClusterClient, Local, ShardClient
    from shardsched.sharding.coordinator import Coordinator
    from shardsched.sharding.shard import Shard, ShardOptions
    from shardsched.store import EmbeddedRedis, Ledger, connect

    config = load_config(CONFIG)
    cluster = SimCluster(seed=0)
    cluster.create_nodes(uniform_nodes(nodes))
    with EmbeddedRedis() as redis:
        ledger = Ledger(connect(redis.url), prefix=f"bench-{uuid.uuid4().hex[:8]}:")
        hosted: list[Shard] = []
        coordinator: Coordinator | None = None

        def new_shard(index: int, member: str) -> ShardClient:
            shard = Shard(index, member, config, ledger, cluster, coordinator, ShardOptions(seed=index))
            hosted.append(shard)
            return ShardClient(Local(shard))

        coordinator = Coordinator(config, ledger, ClusterClient(Local(cluster)), new_shard, shards)
        coordinator.start()
        for g in range(gangs):
            cluster.create_pod_group({"metadata": {"name": f"gang-{g}"}, "spec": {"minMember": size}})
            pods = uniform_pods(size, cpu="100m", memory="128Mi", scheduler_name="shardsched", prefix=f"gang-{g}-")
            for p in pods:
                p["metadata"]["labels"] = {POD_GROUP_LABEL: f"gang-{g}"}
            cluster.create_pods(pods)
        with coordinator.state.lock:
            while coordinator.poll_watch():
                pass
        start = time.perf_counter()
        deadline = start + timeout_s
        held_at = None
        while True:
            coordinator.step()
            if held_at is None and not coordinator.gangs.held:
                held_at = time.perf_counter()
            for shard in hosted:
                shard.step()
            if not coordinator.state.pending:
                break
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{gangs}x{size}: not bound after {timeout_s:.0f} s")
        end = time.perf_counter()
        return GangResult(gangs, size, nodes, shards, int(coordinator.state.counters["gangs_placed"]),
                          (held_at or end) - start, end - start)


def markdown(results: list[GangResult]) -> str:
    lines = ["| gangs x pods | nodes | shards | decide + hold | pods/s | to bound | pods/s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r.gangs} x {r.size} | {r.nodes} | {r.shards} | {r.decide_hold_s:.2f} s | "
                     f"{r.pods / r.decide_hold_s:,.0f} | {r.to_bound_s:.2f} s | {r.pods / r.to_bound_s:,.0f} |")
    return "\n".join(lines)
