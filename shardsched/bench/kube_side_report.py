"""The arithmetic of ``shardsched bench kube-vs-shardsched`` (`shardsched.bench.kube_side`): the
figures of one scheduler's run from the timestamps the bench collected, the medians over repeats,
and the side-by-side table (kube-scheduler against each shardsched mode, with the ratio).

Every time here is in seconds (Unix time from one clock: the bench's watcher process saw the binds
and the Events, its main process timed launches and pod creations); figures come out in seconds,
milliseconds, pods/s, MiB and cores as their names say. No function here reads a clock.
"""

from __future__ import annotations

import statistics
from typing import Iterable, Mapping

import numpy as np

#: the scheduler variants, in the order of the table's columns
KUBE = "kube-scheduler"
THREADS = "shardsched-threads"
RAY = "shardsched-ray"
VARIANTS = (KUBE, THREADS, RAY)


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values``, as `numpy.percentile` (linear interpolation
    between the closest ranks); None for no values.

    Raises: ValueError when ``q`` is outside [0, 100].
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside [0, 100]")
    xs = list(values)
    return float(np.percentile(xs, q)) if xs else None


def p50_p99_ms(seconds: Iterable[float]) -> dict:
    """{"p50": ms, "p99": ms, "max": ms, "n": count} of durations in seconds (None figures when empty)."""
    xs = list(seconds)
    to_ms = (lambda v: None if v is None else round(v * 1000, 2))
    return {"p50": to_ms(percentile(xs, 50)), "p99": to_ms(percentile(xs, 99)),
            "max": to_ms(max(xs) if xs else None), "n": len(xs)}


def backlog_figures(launched_at: float, bound_at: Mapping[str, float], pods: int) -> dict:
    """A backlog's figures: ``pods`` pending before the scheduler was launched at ``launched_at``;
    ``bound_at``: pod -> bind seen. ``first_bind_s`` / ``last_bind_s``: launch to the first / last
    bind; ``first_to_last_pods_per_s``: binds after the first / (last - first) (None with fewer than
    two binds or all at one instant); ``launch_to_last_pods_per_s``: bound / (last - launch)."""
    times = sorted(bound_at.values())
    out = {"pods": pods, "bound": len(times), "first_bind_s": None, "last_bind_s": None,
           "first_to_last_pods_per_s": None, "launch_to_last_pods_per_s": None}
    if not times:
        return out
    first, last = times[0], times[-1]
    out["first_bind_s"] = round(first - launched_at, 3)
    out["last_bind_s"] = round(last - launched_at, 3)
    if len(times) > 1 and last > first:
        out["first_to_last_pods_per_s"] = round((len(times) - 1) / (last - first), 1)
    if last > launched_at:
        out["launch_to_last_pods_per_s"] = round(len(times) / (last - launched_at), 1)
    return out


def paced_figures(rate: float, duration_s: float, created_at: Mapping[str, float],
                  bound_at: Mapping[str, float]) -> dict:
    """A paced phase's figures: pods created at ``rate`` pods/s for ``duration_s``; ``created_at``:
    pod -> its create call returned; ``bound_at``: pod -> bind seen. Latency = bound - created per
    pod bound (a bind seen before the create call returned counts 0), P50/P99 in ms;
    ``created_per_s``: the rate the creations reached (created / first-to-last creation span)."""
    lat = [max(0.0, bound_at[k] - created_at[k]) for k in created_at if k in bound_at]
    times = sorted(created_at.values())
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    return {"rate": rate, "duration_s": duration_s, "created": len(created_at),
            "created_per_s": round((len(times) - 1) / span, 1) if span > 0 else None,
            "bound": len(lat), "latency_ms": p50_p99_ms(lat)}


def event_figures(bound_at: Mapping[str, float], event_at: Mapping[str, float]) -> dict:
    """The Scheduled Events of a run's bound pods: ``delay_ms`` (Event seen - bind seen, P50/P99;
    an Event seen first counts 0) and ``missing`` (bound pods without an Event)."""
    delays = [max(0.0, event_at[k] - t) for k, t in bound_at.items() if k in event_at]
    return {"bound": len(bound_at), "with_event": len(delays), "missing": len(bound_at) - len(delays),
            "delay_ms": p50_p99_ms(delays)}


def cores(cpu_before_s: float | None, cpu_after_s: float | None, wall_s: float) -> float | None:
    """Mean cores busy: CPU seconds spent over ``wall_s`` seconds (None when unknown or wall_s <= 0)."""
    if cpu_before_s is None or cpu_after_s is None or wall_s <= 0:
        return None
    return round((cpu_after_s - cpu_before_s) / wall_s, 3)


def ratio(shardsched: float | None, kube: float | None) -> float | None:
    """shardsched / kube-scheduler, 3 decimals; None when either is unknown or kube's is 0."""
    if shardsched is None or kube is None or kube == 0:
        return None
    return round(shardsched / kube, 3)


def median(values: Iterable[float | None]) -> float | None:
    """The median of the known values (None when there are none)."""
    xs = [v for v in values if v is not None]
    return round(statistics.median(xs), 3) if xs else None


#: (label, how to read a run's figure, better when "lower"/"higher") for the table's rows; the
#: paced rows are added per rate by `measures`
BASE_MEASURES: list[tuple[str, tuple, str]] = [
    ("backlog: launch → first bind (s)", ("backlog", "first_bind_s"), "lower"),
    ("backlog: launch → last bind (s)", ("backlog", "last_bind_s"), "lower"),
    ("backlog: first → last (pods/s)", ("backlog", "first_to_last_pods_per_s"), "higher"),
    ("backlog: launch → last (pods/s)", ("backlog", "launch_to_last_pods_per_s"), "higher"),
    ("backlog: cores busy", ("backlog", "cores"), "lower"),
]
TAIL_MEASURES: list[tuple[str, tuple, str]] = [
    ("Scheduled Event after its bind, P50 (ms)", ("events", "delay_ms", "p50"), "lower"),
    ("Scheduled Event after its bind, P99 (ms)", ("events", "delay_ms", "p99"), "lower"),
    ("Events missing after SIGTERM", ("events", "missing"), "lower"),
    ("resident memory, peak (MiB)", ("memory", "rss_peak_mib"), "lower"),
    ("processes", ("memory", "processes"), "lower"),
]


def measures(rates: Iterable[float]) -> list[tuple[str, tuple, str]]:
    """Every row of the table, the paced rows for each of ``rates``."""
    paced = []
    for r in rates:
        key = f"{r:g}"
        paced += [(f"paced {key}/s: P50 creation → bound (ms)", ("paced", key, "latency_ms", "p50"), "lower"),
                  (f"paced {key}/s: P99 creation → bound (ms)", ("paced", key, "latency_ms", "p99"), "lower"),
                  (f"paced {key}/s: cores busy", ("paced", key, "cores"), "lower")]
    return BASE_MEASURES + paced + TAIL_MEASURES


def dig(run: Mapping, path: tuple):
    """``run[path[0]][path[1]]...``, None where a key is missing or a level is None."""
    cur = run
    for k in path:
        if not isinstance(cur, Mapping) or k not in cur:
            return None
        cur = cur[k]
    return cur


def completed(run: Mapping) -> bool:
    """Whether a run bound its whole backlog (a scheduler that failed to start, or stopped, did not:
    its partial figures are kept in the raw runs but left out of the medians)."""
    b = run.get("backlog") or {}
    return bool(b.get("pods")) and b.get("bound") == b.get("pods")


def summary(runs: list[dict], rates: Iterable[float]) -> list[dict]:
    """The table's rows: per measure, each variant's median over its `completed` runs (``runs``: one
    dict per run with its ``variant``), and ``ratio`` per shardsched variant = its median /
    kube-scheduler's, with ``better`` ("lower"/"higher") saying which way is good."""
    runs = [r for r in runs if completed(r)]
    rows = []
    for label, path, better in measures(rates):
        row: dict = {"measure": label, "better": better}
        for v in VARIANTS:
            vals = [dig(r, path) for r in runs if r.get("variant") == v]
            row[v] = median(vals) if vals else None
            row[f"{v}_runs"] = vals
        for v in (THREADS, RAY):
            row[f"ratio_{v}"] = ratio(row[v], row[KUBE])
        rows.append(row)
    return rows


def markdown(rows: list[dict], variants: Iterable[str]) -> str:
    """The summary as a Markdown table: medians, and shardsched / kube-scheduler per mode."""
    variants = [v for v in VARIANTS if v in set(variants)]
    shard = [v for v in variants if v != KUBE]
    head = ["measure", *variants] + ([f"{v.split('-', 1)[1]} / kube" for v in shard] if KUBE in variants else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(x) -> str:
        if x is None:
            return "–"
        return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"
    for row in rows:
        cells = [row["measure"]] + [cell(row[v]) for v in variants]
        if KUBE in variants:
            cells += [cell(row[f"ratio_{v}"]) for v in shard]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
