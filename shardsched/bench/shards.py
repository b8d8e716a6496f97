"""Shard scaling: what one pod costs in each process as the shard count changes, and a run whose
shard count changes during a burst; the figures behind docs/benchmarks.md's "Shard scaling".

    python -m shardsched.bench.shards [--shards 1,2,4,8] [--nodes 5000] [--pods 20000] [--repeats 2]
                                      [--save-json docs/benchmarks/shards.json]

Per shard count, `--repeats` embedded runs of the field report's scenario (identical 8 CPU / 16Gi
nodes, a burst of 1 CPU / 1Gi pods) on one local Ray and one Redis started here, so that Redis'
own counters can be read around each run (``CONFIG RESETSTAT``, then ``INFO commandstats`` and
``INFO cpu``). Per pod bound: CPU microseconds of the coordinator, the shards (summed), the
simulated API server and Redis; Redis script calls (round trips) and the commands they run; bind
calls. Then one run of ``--scale-pods`` pods
arriving over ``--scale-span`` seconds scaled 1 -> 4 -> 2 shards (`EmbeddedRun` ``scale_at``): the
fraction of nodes moved at each step and the throughput before, during and after.

Last, the decision path alone (`shardsched.bench.decision`) over 5,000, 2,500, 1,250 and 625
nodes, i.e. one shard's share of a 5,000-node cluster at 1, 2, 4 and 8 shards: how the per-pod
decision cost of distinct pods (no signature cache) changes when a shard owns fewer nodes.

`model` turns the per-pod costs into what a multi-node Ray cluster would reach: each stage's
ceiling is 1 / (its CPU per pod), shards in parallel (one core each), the coordinator, Redis and
the API server each one serial stage.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from shardsched.bench import decision
from shardsched.bench.harness import RaySession, machine, markdown_table, parse_int_list, run_embedded
from shardsched.config import load_config
from shardsched.sim.workload import uniform_nodes, uniform_pods
from shardsched.store.server import EmbeddedRedis, connect


def redis_counters(client: Any) -> tuple[float, dict[str, int]]:
    """(CPU seconds of the server so far, calls per command since the last CONFIG RESETSTAT)."""
    cpu = client.info("cpu")
    calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in client.info("commandstats").items()}
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), calls


def one_run(session: RaySession, redis: EmbeddedRedis, config: Any, nodes: int, pods: int, shards: int,
            scale_at: list[tuple[float, int]] | None = None, span_s: float = 0.0) -> dict[str, Any]:
    """One embedded run; its report's figures plus Redis' and the per-pod costs."""
    client = connect(redis.url)
    client.config_resetstat()
    cpu0, _ = redis_counters(client)
    workload = uniform_pods(pods, scheduler_name=config.profiles[0].scheduler_name)
    burst = [(span_s * i / pods, None, p) for i, p in enumerate(workload)]
    options = session.options(shards=shards, redis_url=redis.url, timeout_s=600.0, scale_at=scale_at or [],
                              coordinator_name=None)
    report = run_embedded(config, uniform_nodes(nodes), burst, options)
    cpu1, calls = redis_counters(client)
    client.close()
    data = report.to_json()
    bound = max(report.pods_bound, 1)
    by = data["cpu_s_by_process"]
    shard_cpu = sum(v for k, v in by.items() if k.startswith("shard-"))
    us = 1e6 / bound
    return {
        "nodes": nodes, "pods": pods, "shards": shards, "bound": report.pods_bound,
        "throughput_pods_per_s": data["throughput_pods_per_s"], "latency_ms": data["latency_ms"],
        "invariants_ok": not (data["overcommitted_nodes"] or data["admission_rejections"] or data["double_binds"]
                              or data["lost_pods"]),
        "cpu_us_per_pod": {"coordinator": round(by.get("coordinator", 0.0) * us, 1),
                           "shards": round(shard_cpu * us, 1),
                           "api_server": round(by.get("cluster", 0.0) * us, 1),
                           "redis": round((cpu1 - cpu0) * us, 1),
                           "driver": round(by.get("driver", 0.0) * us, 1)},
        # commandstats counts the commands run inside the Lua scripts too
        "redis_commands_per_pod": round(sum(calls.values()) / bound, 2),
        "redis_scripts_per_pod": round(calls.get("evalsha", 0) / bound, 4),
        "bind_calls_per_pod": round(sum(s["batches"] for s in report.shard_snapshots) / bound, 4),
        "cpu_s_by_process": by, "scaling": data["scaling"], "errors": data["errors"],
    }


def decision_cost(nodes: int, shard_counts: list[int]) -> list[dict[str, Any]]:
    """Per-pod decision microseconds (best of 3) for one shard's share of ``nodes`` nodes."""
    out = []
    for shards in shard_counts:
        results, _ = decision.run(nodes=nodes // shards, pods=4000, distinct=2000, repeat=3)
        out.append({"shards": shards, "nodes_per_shard": nodes // shards,
                    **{f"{r.workload}_us_per_pod": round(1e6 / r.decisions_per_s, 1) for r in results}})
    return out


def model(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Ceilings in pods/s from the medians of the per-pod CPU costs: shards = cores / (shard CPU
    per pod) for the shard counts measured (one core per shard, as on a Ray cluster with
    ``shard_num_cpus`` 1), and one serial stage each for the coordinator, Redis and the (simulated)
    API server."""
    def med(key: str) -> float:
        return statistics.median(r["cpu_us_per_pod"][key] for r in rows)

    shard_us = {s: statistics.median(r["cpu_us_per_pod"]["shards"] for r in rows if r["shards"] == s)
                for s in sorted({r["shards"] for r in rows})}
    return {
        "cpu_us_per_pod_median": {k: round(med(k), 1) for k in ("coordinator", "shards", "api_server", "redis")},
        "shard_stage_pods_per_s": {s: round(s * 1e6 / us) for s, us in shard_us.items()},
        "coordinator_pods_per_s": round(1e6 / med("coordinator")),
        "redis_pods_per_s": round(1e6 / med("redis")),
        "api_server_pods_per_s": round(1e6 / med("api_server")),
        "redis_commands_per_pod_median": round(statistics.median(r["redis_commands_per_pod"] for r in rows), 2),
        "redis_scripts_per_pod_median": round(statistics.median(r["redis_scripts_per_pod"] for r in rows), 4),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    out = []
    for r in rows:
        c = r["cpu_us_per_pod"]
        out.append([r["shards"], f"{r['bound']:,}/{r['pods']:,}", f"{r['throughput_pods_per_s']:,.0f}",
                    f"{r['latency_ms']['p99'] / 1000:.2f} s", c["coordinator"], c["shards"], c["api_server"], c["redis"],
                    r["redis_scripts_per_pod"], r["redis_commands_per_pod"], r["bind_calls_per_pod"],
                    "ok" if r["invariants_ok"] else "VIOLATED"])
    return markdown_table(["shards", "bound/pods", "pods/s", "P99", "coordinator µs/pod", "shards µs/pod",
                           "API server µs/pod", "Redis µs/pod", "Redis script calls/pod", "Redis commands/pod",
                           "bind calls/pod", "invariants"], out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", default="1,2,4,8")
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--pods", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--scale-pods", type=int, default=40000)
    p.add_argument("--scale-span", type=float, default=16.0, help="seconds over which the scaled run's pods arrive")
    p.add_argument("--scale-at", default="3:4,10:2", help="T:N steps of the scaled run")
    p.add_argument("--save-json", default=None)
    args = p.parse_args(argv)
    config = load_config(None)
    rows: list[dict[str, Any]] = []
    info = machine()
    with EmbeddedRedis() as redis, RaySession() as session:
        for _ in range(args.repeats):
            for shards in parse_int_list(args.shards):
                row = one_run(session, redis, config, args.nodes, args.pods, shards)
                print(f"shards={shards}: {row['throughput_pods_per_s']:,.0f} pods/s {row['cpu_us_per_pod']}",
                      file=sys.stderr, flush=True)
                rows.append(row)
        steps = [(float(t), int(n)) for t, n in (s.split(":") for s in args.scale_at.split(","))]
        scaled = one_run(session, redis, config, args.nodes, args.scale_pods, 1, steps, args.scale_span)
    rows.sort(key=lambda r: r["shards"])
    decisions = decision_cost(args.nodes, parse_int_list(args.shards))
    result = {"machine": info, "params": vars(args), "rows": rows, "model": model(rows), "scaled_run": scaled,
              "decision_cost": decisions}
    print(markdown(rows))
    print(json.dumps(decisions, indent=1))
    print(json.dumps(result["model"], indent=1))
    print(json.dumps(scaled["scaling"], indent=1))
    if args.save_json:
        with open(args.save_json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
