"""``bench scaling``: how throughput and latency change with the cluster size, the number of shards
and the batch size, on the field report's scenario (identical 8 CPU / 16Gi nodes, a burst of
1 CPU / 1Gi pods), one `EmbeddedRun` per point on one shared local Ray.

Three sweeps:

- **nodes** (default 1k, 5k, 20k, 50k) at ``base_shards`` shards, adaptive batch. The burst is
  ``pods`` but at most 4 pods per node (50% of the cluster's CPU), so that the smallest cluster is
  not simply full: 1,000 nodes get 4,000 pods. Throughput is a rate, so points stay comparable;
  latency grows with the burst, so compare P99 only between points with the same burst.
- **shards** (default 1, 2, 4) at ``base_nodes`` nodes, adaptive batch.
- **batch size** (default 1, 10, 100, 1000 and 0 = adaptive) at ``base_nodes`` nodes, one shard (the
  batch effect alone). Small batches are slow, so this sweep uses ``batch_pods`` pods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardsched.bench.harness import (Measurement, Progress, RaySession, fmt_bytes, fmt_rate, fmt_s, markdown_table,
                                      measurement_of, run_embedded)
from shardsched.config import load_config
from shardsched.sharding.shard import ShardOptions
from shardsched.sim.workload import uniform_nodes, uniform_pods

PODS_PER_NODE_CAP = 4
SWEEPS = ("nodes", "shards", "batch")


@dataclass
class ScalingParams:
    nodes: list[int] = field(default_factory=lambda: [1000, 5000, 20000, 50000])
    shards: list[int] = field(default_factory=lambda: [1, 2, 4])
    batch_sizes: list[int] = field(default_factory=lambda: [1, 10, 100, 1000, 0])
    sweeps: tuple[str, ...] = SWEEPS
    pods: int = 20000
    batch_pods: int = 5000
    base_nodes: int = 5000
    base_shards: int = 2
    max_batch_size: int = 1000
    seed: int = 0
    timeout_s: float = 900.0
    config_path: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "shards": self.shards, "batch_sizes": self.batch_sizes, "sweeps": list(self.sweeps),
                "pods": self.pods, "batch_pods": self.batch_pods, "base_nodes": self.base_nodes,
                "base_shards": self.base_shards, "max_batch_size": self.max_batch_size, "pods_per_node_cap": PODS_PER_NODE_CAP,
                "seed": self.seed, "config": self.config_path}


@dataclass
class Point:
    sweep: str
    x: int
    measurement: Measurement

    def to_json(self) -> dict[str, Any]:
        return {"sweep": self.sweep, "x": self.x, **self.measurement.to_json()}


def plan(params: ScalingParams) -> list[tuple[str, int, int, int, int, int]]:
    """(sweep, x, nodes, pods, shards, batch size) per point, in run order. Raises ValueError for an
    unknown sweep."""
    unknown = [s for s in params.sweeps if s not in SWEEPS]
    if unknown:
        raise ValueError(f"unknown sweep(s) {', '.join(unknown)}; sweeps: {', '.join(SWEEPS)}")
    out = []
    if "nodes" in params.sweeps:
        out += [("nodes", n, n, min(params.pods, PODS_PER_NODE_CAP * n), params.base_shards, 0) for n in params.nodes]
    if "shards" in params.sweeps:
        pods = min(params.pods, PODS_PER_NODE_CAP * params.base_nodes)
        out += [("shards", s, params.base_nodes, pods, s, 0) for s in params.shards]
    if "batch" in params.sweeps:
        pods = min(params.batch_pods, PODS_PER_NODE_CAP * params.base_nodes)
        out += [("batch", b, params.base_nodes, pods, 1, b) for b in params.batch_sizes]
    return out


def run(params: ScalingParams, progress: Progress | None = None) -> list[Point]:
    """Run every point. Raises ConfigError (bad config) or ValueError (unknown sweep)."""
    config = load_config(params.config_path)
    scheduler_name = config.profiles[0].scheduler_name
    points = plan(params)
    progress = progress or Progress("scaling", quiet=True)
    out: list[Point] = []
    with RaySession() as ray_session:
        for sweep, x, nodes, pods, shards, batch in points:
            name = f"{sweep}={x if sweep != 'batch' or x else 'adaptive'}"
            options = ray_session.options(shards=shards, seed=params.seed, timeout_s=params.timeout_s,
                                          shard_options=ShardOptions(batch_size=batch, max_batch_size=params.max_batch_size,
                                                                     seed=params.seed))
            progress.start(name, pods, f"{nodes:,} nodes, {shards} shard(s), batch {batch or 'adaptive'}")
            burst = [(0.0, None, p) for p in uniform_pods(pods, scheduler_name=scheduler_name)]
            report = run_embedded(config, uniform_nodes(nodes), burst, options,
                                  on_progress=lambda run, bound, total, status: progress.update(bound, f"pending {status['pending']}"))
            m = measurement_of(name, report, {"nodes": nodes, "shards": shards, "batch_size": batch})
            progress.finish(name, m)
            out.append(Point(sweep, x, m))
    return out


def to_json(points: list[Point], params: ScalingParams, machine: dict) -> dict[str, Any]:
    return {"benchmark": "scaling", "machine": machine, "params": params.to_json(),
            "points": [p.to_json() for p in points]}


def markdown(points: list[Point]) -> str:
    titles = {"nodes": "throughput and latency vs nodes", "shards": "throughput and latency vs shards",
              "batch": "pods/s vs batch size (one shard)"}
    parts = []
    for sweep in SWEEPS:
        pts = [p for p in points if p.sweep == sweep]
        if not pts:
            continue
        rows = []
        for p in pts:
            m = p.measurement
            rows.append([m.name, f"{m.params['nodes']:,}", m.params["shards"], m.params["batch_size"] or "adaptive",
                         f"{m.bound:,}/{m.pods:,}", fmt_rate(m.throughput_pods_per_s), fmt_s(m.avg_latency_s),
                         fmt_s(m.p99_latency_s), f"{m.cpu_cores:.2f}", fmt_bytes(m.peak_rss_bytes),
                         "ok" if m.invariants_ok and not m.errors else "; ".join(m.errors) or "VIOLATED"])
        parts.append(f"### {titles[sweep]}\n\n" + markdown_table(
            ["point", "nodes", "shards", "batch", "bound/pods", "pods/s", "avg latency", "P99 latency", "CPU cores",
             "peak memory", "invariants"], rows))
    return "\n\n".join(parts) + "\n"


def plot(points: list[Point], directory: str) -> list[str]:
    from shardsched.bench.plots import lines

    out = []
    for sweep, xlabel, logx in (("nodes", "nodes", True), ("shards", "shards", False)):
        pts = [p for p in points if p.sweep == sweep]
        if pts:
            out.append(lines(f"{directory}/scaling-{sweep}.png", [p.x for p in pts],
                             {"pods/s": [p.measurement.throughput_pods_per_s for p in pts]}, xlabel,
                             f"throughput and P99 latency vs {sweep}", logx=logx, ylabel="pods/s",
                             secondary={"P99 latency (s)": [p.measurement.p99_latency_s for p in pts]},
                             secondary_label="P99 latency (s)", xticklabels=[f"{p.x:,}" for p in pts]))
    pts = [p for p in points if p.sweep == "batch"]
    if pts:
        xs = list(range(len(pts)))
        out.append(lines(f"{directory}/scaling-batch.png", xs, {"pods/s": [p.measurement.throughput_pods_per_s for p in pts]},
                         "batch size", "pods/s vs batch size (one shard)", ylabel="pods/s",
                         xticklabels=[str(p.x) if p.x else "adaptive" for p in pts]))
    return out
