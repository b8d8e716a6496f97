"""``bench field``: the field report's table, every row measured in the same run.

Scenario (the report's): a cluster of identical nodes (default 5,000 of 8 CPU / 16Gi / 110 pods) and
a burst of identical pods (1 CPU / 1Gi) created at once, or with ``rate_pods_per_s`` the same pods
created at that steady rate (a paced load: the latency of a pod arriving at an ordinary load). Rows:

- ``kube-like``: kube-scheduler's loop emulated in one process (`shardsched.bench.kubelike`): one
  pod per cycle, full default plugin set, adaptive ``percentageOfNodesToScore``, one bind at a time;
- ``single``: shardsched, one shard, batch of 1 (the report's "custom scheduler, one pod");
- ``batch-10``: one shard, batches of 10 (the report's "batch of 10");
- ``batch-auto``: one shard, adaptive batch (everything ready, up to 1,000);
- ``shards-N``: N shards, adaptive batch. ``shards-1`` is the same configuration as
  ``batch-auto``, run again: the difference between the two is the run-to-run noise.

Every row gets the same burst (``pods``) unless ``row_pods`` says otherwise: the kube-like loop
turned out fast enough here (vectorized Filter/Score in one process, no API round trips) that it
needs no smaller burst, and equal bursts keep the latency columns comparable (a burst's latency
grows with its size; throughput is a rate).

Each shardsched row is one `EmbeddedRun` (fresh Redis, simulated cluster, coordinator, shards) on
one shared local Ray. Columns follow the report: average and P99 latency from pod creation to bound,
throughput (pods bound / time from the burst's start to the last bind), CPU cores (CPU seconds of
the scheduler's processes, the simulated API server and Redis per second of that time; Ray's own
daemons excluded) and peak memory (summed RSS of the same processes). Ratios are to ``kube-like``
measured in the same run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardsched.bench import kubelike, profile
from shardsched.bench.harness import (Measurement, Progress, RaySession, fmt_bytes, fmt_rate, fmt_ratio, fmt_s,
                                      markdown_table, measurement_of, run_embedded)
from shardsched.bench.profile import Profiler
from shardsched.config import SchedulerConfiguration, load_config
from shardsched.sharding.shard import ShardOptions
from shardsched.sim.cluster import FaultConfig
from shardsched.sim.workload import uniform_nodes, uniform_pods

KUBE_LIKE = "kube-like"


@dataclass(frozen=True)
class RowSpec:
    """One shardsched configuration of the table (``shards`` = 0 marks the kube-like baseline)."""

    name: str
    shards: int
    batch_size: int
    report_row: str | None = None  # the field report's row it corresponds to


def row_specs(shard_counts: tuple[int, ...] = (1, 2, 4)) -> list[RowSpec]:
    return [RowSpec(KUBE_LIKE, 0, 1, "kube-scheduler (report)"),
            RowSpec("single", 1, 1, "custom, one pod (report)"),
            RowSpec("batch-10", 1, 10, "custom, batch of 10 (report)"),
            RowSpec("batch-auto", 1, 0),
            *(RowSpec(f"shards-{n}", n, 0) for n in shard_counts)]


#: the field report's table (docs/benchmarks.md, "The field report"; 5,000 nodes of 8C/16G, 1C/1Gi
#: pods, on a real cluster and other hardware): avg, P99 latency (s), pods/s, scheduler cores, memory (GB)
FIELD_REPORT = {
    "kube-scheduler (report)": (1.2, 4.0, 8, 3.2, 4.5),
    "custom, one pod (report)": (0.32, 0.8, 300, 1.8, 1.2),
    "custom, batch of 10 (report)": (0.11, 0.25, 800, 2.5, 2.0),
}


def report_figures() -> dict[str, tuple[float, float, float, float, float]]:
    """The field report's table (section 六): avg s, P99 s, pods/s, cores, GB, by its row name."""
    return FIELD_REPORT


@dataclass
class FieldParams:
    """Sizes of the run. Defaults: the report's scenario on this 2-core machine (see docs/benchmarks.md)."""

    nodes: int = 5000
    node_cpu: str = "8"
    node_memory: str = "16Gi"
    node_pods: int = 110
    pods: int = 20000
    pod_cpu: str = "1"
    pod_memory: str = "1Gi"
    #: pods per row overriding ``pods`` (e.g. ``{"single": 5000}``)
    row_pods: dict[str, int] = field(default_factory=dict)
    rows: list[str] | None = None  # None = all
    shard_counts: tuple[int, ...] = (1, 2, 4)
    max_batch_size: int = 1000
    bind_latency_ms: float = 0.0
    #: pods created per second, steadily (each row's pods over pods / rate seconds); None = a burst
    rate_pods_per_s: float | None = None
    seed: int = 0
    timeout_s: float = 600.0
    config_path: str | None = None
    #: run py-spy on every process of each row and write its files here (throughput then suffers)
    profile_dir: str | None = None

    def pods_for(self, row: str) -> int:
        return self.row_pods.get(row, self.pods)

    def to_json(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "node": {"cpu": self.node_cpu, "memory": self.node_memory, "pods": self.node_pods},
                "pods": self.pods, "pod": {"cpu": self.pod_cpu, "memory": self.pod_memory}, "row_pods": self.row_pods,
                "shard_counts": list(self.shard_counts), "max_batch_size": self.max_batch_size,
                "bind_latency_ms": self.bind_latency_ms, "rate_pods_per_s": self.rate_pods_per_s, "seed": self.seed,
                "config": self.config_path}

    def created_at(self, n: int) -> list[float]:
        """Creation time of each of ``n`` pods, seconds after the row's start: all 0 for a burst,
        ``i / rate`` for a paced load."""
        return [i / self.rate_pods_per_s if self.rate_pods_per_s else 0.0 for i in range(n)]


def selected_specs(params: FieldParams) -> list[RowSpec]:
    """The rows to run, in table order. Raises ValueError for an unknown row name."""
    specs = row_specs(params.shard_counts)
    if params.rows is None:
        return specs
    known = {s.name: s for s in specs}
    unknown = [r for r in params.rows if r not in known]
    if unknown:
        raise ValueError(f"unknown row(s) {', '.join(unknown)}; rows: {', '.join(known)}")
    return [s for s in specs if s.name in params.rows]


def run(params: FieldParams, progress: Progress | None = None) -> list[Measurement]:
    """Run every selected row (kube-like first, in its own process; the others on one shared Ray).

    Raises:
        ConfigError: ``params.config_path`` is invalid. ValueError: an unknown row.
    """
    config = load_config(params.config_path)
    specs = selected_specs(params)
    progress = progress or Progress("field", quiet=True)
    scheduler_name = config.profiles[0].scheduler_name
    faults = FaultConfig(bind_latency_s=params.bind_latency_ms / 1000) if params.bind_latency_ms else None
    out: list[Measurement] = []
    nodes = uniform_nodes(params.nodes, cpu=params.node_cpu, memory=params.node_memory, pods=params.node_pods)

    def pods_of(row: str) -> list[dict]:
        return uniform_pods(params.pods_for(row), cpu=params.pod_cpu, memory=params.pod_memory,
                            scheduler_name=scheduler_name)

    for spec in specs:
        if spec.shards == 0:
            out.append(_kube_like(config, nodes, pods_of(spec.name), params, faults, progress))
    embedded = [s for s in specs if s.shards > 0]
    if embedded:
        with RaySession() as ray_session:
            for spec in embedded:
                out.append(_embedded(spec, config, nodes, pods_of(spec.name), params, faults, ray_session, progress))
    order = {s.name: i for i, s in enumerate(specs)}
    out.sort(key=lambda m: order[m.name])
    return out


def _kube_like(config: SchedulerConfiguration, nodes: list[dict], pods: list[dict], params: FieldParams,
               faults: FaultConfig | None, progress: Progress) -> Measurement:
    from shardsched.sharding.run_feed import CREATE_CHUNK

    progress.start(KUBE_LIKE, len(pods), "one process, one pod per cycle")
    profiler = Profiler(params.profile_dir, KUBE_LIKE) if params.profile_dir else None
    m = kubelike.run_in_subprocess(config, nodes, pods, params.seed, params.timeout_s, CREATE_CHUNK,
                                   bind_latency_s=faults.bind_latency_s if faults else 0.0,
                                   created_at=params.created_at(len(pods)),
                                   on_progress=lambda bound, total: progress.update(bound, "scheduling"),
                                   on_start=(lambda pid: profiler.attach({pid: KUBE_LIKE})) if profiler else None)
    m.params["bind_latency_ms"] = params.bind_latency_ms
    if profiler is not None:
        m.params["profile"] = profiler.stop()
        m.errors += profiler.errors
    progress.finish(KUBE_LIKE, m)
    return m


def _embedded(spec: RowSpec, config: SchedulerConfiguration, nodes: list[dict], pods: list[dict], params: FieldParams,
              faults: FaultConfig | None, ray_session: RaySession, progress: Progress) -> Measurement:
    options = ray_session.options(
        shards=spec.shards, faults=faults, seed=params.seed, timeout_s=params.timeout_s,
        shard_options=ShardOptions(batch_size=spec.batch_size, max_batch_size=params.max_batch_size, seed=params.seed))
    progress.start(spec.name, len(pods), f"{spec.shards} shard(s), batch {spec.batch_size or 'adaptive'}")
    profiler = Profiler(params.profile_dir, spec.name) if params.profile_dir else None

    def on_progress(run, bound: int, total: int, status: dict) -> None:
        if profiler is not None:
            profiler.attach(run.meter.labels)
        progress.update(bound, f"pending {status['pending']}")

    workload = [(t, None, p) for t, p in zip(params.created_at(len(pods)), pods)]
    report = run_embedded(config, nodes, workload, options, on_progress=on_progress)
    m = measurement_of(spec.name, report, {"nodes": params.nodes, "shards": spec.shards,
                                           "batch_size": spec.batch_size, "bind_latency_ms": params.bind_latency_ms})
    if profiler is not None:
        m.params["profile"] = profiler.stop()
        m.errors += profiler.errors
    progress.finish(spec.name, m)
    return m


# ------------------------------------------------------------------------------------ output

def ratios(rows: list[Measurement]) -> dict[str, dict[str, float | None]]:
    """Per row: throughput, avg latency, P99 latency, CPU and memory divided by kube-like's (None
    when there is no kube-like row or its value is 0)."""
    base = next((m for m in rows if m.name == KUBE_LIKE and m.bound), None)

    def div(a: float, b: float) -> float | None:
        return a / b if base is not None and b else None

    out = {}
    for m in rows:
        out[m.name] = {} if base is None else {
            "throughput": div(m.throughput_pods_per_s, base.throughput_pods_per_s),
            "avg_latency": div(m.avg_latency_s, base.avg_latency_s),
            "p99_latency": div(m.p99_latency_s, base.p99_latency_s),
            "cpu_cores": div(m.cpu_cores, base.cpu_cores),
            "peak_memory": div(m.peak_rss_bytes, base.peak_rss_bytes),
        }
    return out


def to_json(rows: list[Measurement], params: FieldParams, machine: dict) -> dict[str, Any]:
    rat = ratios(rows)
    figures = report_figures()
    specs = {s.name: s for s in row_specs(params.shard_counts)}
    out_rows = []
    for m in rows:
        d = m.to_json()
        d["vs_kube_like"] = {k: (None if v is None else round(v, 3)) for k, v in rat[m.name].items()}
        rep = specs[m.name].report_row
        if rep is not None:
            avg, p99, tput, cores, gb = figures[rep]
            d["field_report"] = {"row": rep, "avg_latency_s": avg, "p99_latency_s": p99, "throughput_pods_per_s": tput,
                                 "cpu_cores": cores, "memory_gb": gb}
        out_rows.append(d)
    return {"benchmark": "field", "machine": machine, "params": params.to_json(), "rows": out_rows}


def markdown(rows: list[Measurement], params: FieldParams) -> str:
    rat = ratios(rows)
    figures = report_figures()
    specs = {s.name: s for s in row_specs(params.shard_counts)}
    body = []
    for m in rows:
        r = rat[m.name]
        body.append([f"**{m.name}**", f"{m.bound:,}/{m.pods:,}", fmt_s(m.avg_latency_s), fmt_s(m.p50_latency_s),
                     fmt_s(m.p99_latency_s),
                     fmt_rate(m.throughput_pods_per_s), f"{m.cpu_cores:.2f}", fmt_bytes(m.peak_rss_bytes),
                     fmt_ratio(r.get("throughput")), fmt_ratio(r.get("p99_latency")),
                     "ok" if m.invariants_ok and not m.errors else "; ".join(m.errors) or "VIOLATED"])
        rep = specs[m.name].report_row
        if rep is not None:
            avg, p99, tput, cores, gb = figures[rep]
            body.append([f"  ↳ {rep}", "", f"{avg:.2f} s", "", f"{p99:.2f} s", fmt_rate(tput), f"{cores}", f"{gb} GB",
                         "", "", ""])
    load = (f"pods created at {params.rate_pods_per_s:,g}/s" if params.rate_pods_per_s else "burst")
    title = (f"Field report table: {params.nodes:,} nodes of {params.node_cpu} CPU / {params.node_memory}, {load} of "
             f"{params.pod_cpu} CPU / {params.pod_memory} pods"
             + (f", bind latency {params.bind_latency_ms:g} ms per API call" if params.bind_latency_ms else ""))
    table = markdown_table(["row", "bound/pods", "avg latency", "P50 latency", "P99 latency", "pods/s", "CPU cores", "peak memory",
                            "pods/s vs kube-like", "P99 vs kube-like", "invariants"], body)
    profiles = [profile.markdown(m.name, m.params["profile"], m.cpu_s_by_process) for m in rows if m.params.get("profile")]
    if profiles:
        profiles.insert(0, "Profiled with py-spy (the figures above are then slower than unprofiled runs; the shares "
                           "are what matters): CPU seconds per process, and the share of its samples per shardsched "
                           "function nearest the leaf.\n")
    return f"### {title}\n\n{table}\n" + "\n".join(["", *profiles] if profiles else [])


def plot(rows: list[Measurement], params: FieldParams, directory: str) -> list[str]:
    """Bar charts of throughput and P99 latency per row (PNG); returns the paths written."""
    from shardsched.bench.plots import bars

    names = [m.name for m in rows]
    return [bars(f"{directory}/field-throughput.png", names, [m.throughput_pods_per_s for m in rows], "pods/s",
                 f"throughput, {params.nodes:,} nodes (higher is better)"),
            bars(f"{directory}/field-p99.png", names, [m.p99_latency_s for m in rows], "P99 latency (s)",
                 f"P99 creation→bound latency, {params.nodes:,} nodes (lower is better)")]
