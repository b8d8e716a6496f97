"""What the end-to-end benchmarks share: one Ray for many embedded runs, one result row, the machine
they ran on, Markdown tables, and progress on stderr.

A benchmark runs `EmbeddedRun` (the main job: simulated cluster, private Redis, coordinator,
shards) once per configuration. Starting Ray costs seconds, so `RaySession` starts one local Ray
for all of them (or uses the one the caller started, e.g. the tests' session fixture) and passes
its address in `RunOptions.ray_address`, so that each `EmbeddedRun` joins it and leaves it running;
each run still gets its own Redis, cluster, coordinator and shard actors, all stopped when it ends.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import psutil

if TYPE_CHECKING:  # the embedded run imports ray: not loaded by the kube-like baseline's process
    from shardsched.sharding.embedded import EmbeddedRun
    from shardsched.sharding.run_control import RunOptions
    from shardsched.sharding.run_report import RunReport


@dataclass
class Measurement:
    """One row of a benchmark table: what was run and how it did.

    Attributes:
        name: row name (``kube-like``, ``shards-2``, a workload name, ...).
        pods: pods whose scheduling is measured (init pods and churn excluded).
        bound: of those, pods bound by the end.
        latencies_s: creation -> bound, seconds, one per bound measured pod.
        throughput_pods_per_s: measured pods bound per second of the measurement window.
        cpu_cores: CPU seconds of the scheduler's processes (and the simulated API server and Redis)
            per second of the window.
        peak_rss_bytes: peak of the summed RSS of those processes.
        wall_s: the measurement window, seconds.
        cpu_s_by_process: CPU seconds per process label (``shard-0``, ``coordinator``, ...).
        invariants_ok: no overcommitted node, no double bind, no admission rejection, no lost pod.
        params: the configuration of the row (nodes, shards, batch size, ...).
        notes: caveats a reader of the row must know.
        errors: what went wrong (a timeout, a shard that did not report, ...).
    """

    name: str
    pods: int
    bound: int
    latencies_s: list[float] = field(default_factory=list, repr=False)
    throughput_pods_per_s: float = 0.0
    cpu_cores: float = 0.0
    peak_rss_bytes: int = 0
    wall_s: float = 0.0
    cpu_s_by_process: dict[str, float] = field(default_factory=dict)
    invariants_ok: bool = True
    params: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def avg_latency_s(self) -> float:
        return float(np.mean(self.latencies_s)) if self.latencies_s else 0.0

    @property
    def p50_latency_s(self) -> float:
        return float(np.percentile(self.latencies_s, 50)) if self.latencies_s else 0.0

    @property
    def p99_latency_s(self) -> float:
        return float(np.percentile(self.latencies_s, 99)) if self.latencies_s else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "pods": self.pods, "bound": self.bound,
            "avg_latency_s": round(self.avg_latency_s, 4), "p50_latency_s": round(self.p50_latency_s, 4),
            "p99_latency_s": round(self.p99_latency_s, 4),
            "throughput_pods_per_s": round(self.throughput_pods_per_s, 1), "cpu_cores": round(self.cpu_cores, 2),
            "peak_rss_bytes": int(self.peak_rss_bytes), "wall_s": round(self.wall_s, 3),
            "cpu_s_by_process": self.cpu_s_by_process, "invariants_ok": self.invariants_ok,
            "params": self.params, "notes": self.notes, "errors": self.errors,
        }


def measurement_of(name: str, report: "RunReport", params: dict[str, Any]) -> Measurement:
    """A row from an `EmbeddedRun` report, with the report's own definitions: throughput = pods
    bound / scheduling wall time (workload start to the last bind, sampled every 0.25 s), CPU =
    driver + Redis + simulated cluster + coordinator + shards (Ray's own daemons excluded; their
    cores go into ``params["ray_system_cpu_cores"]``)."""
    data = report.to_json()
    invariants_ok = not (data["overcommitted_nodes"] or data["admission_rejections"] or data["double_binds"]
                         or data["lost_pods"])
    params = {**params, "ray_system_cpu_cores": data["ray_system_cpu_cores"], "schedule_wall_s": data["schedule_wall_s"]}
    return Measurement(
        name=name, pods=report.pods_total, bound=report.pods_bound, latencies_s=list(report.latencies_s),
        throughput_pods_per_s=report.throughput, cpu_cores=data["cpu_cores_used"],
        peak_rss_bytes=report.peak_rss_bytes, wall_s=report.schedule_wall_s,
        cpu_s_by_process=dict(report.cpu_s_by_process), invariants_ok=invariants_ok, params=params,
        errors=list(report.errors) + ended_early(report),
    )


def ended_early(report: "RunReport") -> list[str]:
    """An error when the run ended with pods neither bound nor known unschedulable. Without a
    timeout this means the runtime's end-of-run check raced the workload feeder: `EmbeddedRun._follow`
    reads the cluster's counts before it asks whether the feeder is done, so a last create call that
    lands in between ends the run before its pods are scheduled."""
    if report.pods_pending <= 0 or report.timed_out or report.interrupted:
        return []
    return [f"the run ended with {report.pods_pending} pods pending (end-of-run check raced the feeder)"]


# ---------------------------------------------------------------------------------------- Ray

class RaySession:
    """One local Ray for a series of embedded runs (context manager).

    If Ray is already initialized in this process (a caller's, e.g. the tests' ``ray_session``), it
    is used and left running; otherwise a local instance is started and shut down on exit.
    ``address`` is what to put in `RunOptions.ray_address`: with it, `EmbeddedRun` joins this Ray
    and does not shut it down at its end.
    """

    def __init__(self) -> None:
        self.address: str | None = None
        self._started = False

    def __enter__(self) -> "RaySession":
        from shardsched.sharding.rayaccess import start_or_join_local
        from shardsched.sharding.scaling import RAY_NAMESPACE

        # in shardsched's namespace, as `run`'s job: the runs' detached actors live there (else
        # Ray's raylet warns on stdout about each, into `-o json`)
        self.address, self._started = start_or_join_local(RAY_NAMESPACE)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._started:
            from shardsched.sharding.rayaccess import shutdown

            shutdown()

    def options(self, **kw: Any) -> "RunOptions":
        """`RunOptions` joining this Ray."""
        from shardsched.sharding.run_control import RunOptions

        return RunOptions(ray_address=self.address, **kw)


def run_embedded(config: Any, nodes: list[dict], workload: list[tuple[float, float | None, dict]],
                 options: "RunOptions", on_progress: Callable[["EmbeddedRun", int, int, dict], None] | None = None,
                 ) -> "RunReport":
    """Run `EmbeddedRun` once; ``on_progress(run, bound, total, status)`` is called about four times a
    second from the run's follow loop (the run's ``cluster`` actor is usable from there: churn)."""
    from shardsched.sharding.embedded import EmbeddedRun

    holder: list[EmbeddedRun] = []

    def progress(bound: int, total: int, status: dict) -> None:
        if on_progress is not None:
            on_progress(holder[0], bound, total, status)

    run = EmbeddedRun(config, nodes, workload, options, on_progress=progress)
    holder.append(run)
    return run.run()


# ---------------------------------------------------------------------------------- machine

def machine() -> dict[str, Any]:
    """The machine the figures were measured on: cores, CPU model, memory, load when it started."""
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        model = platform.processor()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "nproc": os.cpu_count(), "cpu_model": model, "memory_bytes": psutil.virtual_memory().total,
        "python": platform.python_version(), "platform": platform.platform(),
        "load_avg_1m_5m_15m": [round(x, 2) for x in load],
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


# ---------------------------------------------------------------------------------- rendering

def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A GitHub Markdown table; ``align`` has one of ``l``/``r`` per column (default: first left,
    the rest right)."""
    align = align or "l" + "r" * (len(headers) - 1)
    marks = [":---" if a == "l" else "---:" for a in align]
    lines = ["| " + " | ".join(str(h) for h in headers) + " |", "|" + "|".join(marks) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt_s(seconds: float) -> str:
    return f"{seconds:.3f} s" if seconds < 10 else f"{seconds:.1f} s"


def fmt_rate(rate: float) -> str:
    return f"{rate:,.0f}"


def fmt_bytes(n: int) -> str:
    return f"{n / 2**30:.2f} GB" if n >= 2**30 else f"{n / 2**20:.0f} MB"


def fmt_ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}×"


def parse_int_list(text: str) -> list[int]:
    """``"1k,5000,20k"`` -> [1000, 5000, 20000] (``k`` = thousand). Raises ValueError."""
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        out.append(int(float(part[:-1]) * 1000) if part.endswith("k") else int(part))
    if not out:
        raise ValueError("empty list")
    return out


# ---------------------------------------------------------------------------------- progress

class Progress:
    """Progress of a long benchmark on stderr: a live bar per row on a terminal, one line per row
    otherwise (logs, CI). ``quiet`` prints nothing."""

    def __init__(self, title: str, quiet: bool = False) -> None:
        self.title = title
        self.quiet = quiet
        self._live = None
        self._task = None
        self._started = 0.0
        if not quiet and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn

            self._live = RichProgress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                      console=Console(stderr=True), transient=False)

    def __enter__(self) -> "Progress":
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.stop()

    def start(self, row: str, total: int, info: str = "starting") -> None:
        self._started = time.monotonic()
        if self._live is not None:
            self._task = self._live.add_task(f"{self.title} {row}", total=max(total, 1), info=info)
        elif not self.quiet:
            print(f"[{self.title}] {row}: {info} ({total} pods)", file=sys.stderr, flush=True)

    def update(self, done: int, info: str = "") -> None:
        if self._live is not None and self._task is not None:
            self._live.update(self._task, completed=done, info=info)

    def finish(self, row: str, m: Measurement) -> None:
        summary = (f"{m.bound}/{m.pods} bound, {m.throughput_pods_per_s:,.0f} pods/s, "
                   f"P99 {m.p99_latency_s:.3f} s" + (f", errors: {'; '.join(m.errors)}" if m.errors else ""))
        if self._live is not None and self._task is not None:
            self._live.update(self._task, completed=m.bound, info=summary)
        elif not self.quiet:
            print(f"[{self.title}] {row}: {summary} ({time.monotonic() - self._started:.1f} s)",
                  file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        if self.quiet:
            return
        if self._live is not None:
            self._live.console.print(text)
        else:
            print(f"[{self.title}] {text}", file=sys.stderr, flush=True)


