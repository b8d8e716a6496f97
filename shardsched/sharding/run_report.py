"""What the embedded run reports: `RunReport` (the summary and the ``-o json`` contract), the
cluster's `Sample` for the plot, the throughput around each scale step (`scale_phases`), and the
CPU and memory of the run's processes (`ProcessMeter`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil

#: a scale step's "during" window lasts this long after its handover: new shards fill their first
#: batches, queues spread, stale owners' fenced batches come back through the rebalancer
SCALE_SETTLE_S = 1.0


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
    #: the cluster every `shardsched.sharding.embedded.SAMPLE_PERIOD_S` from the workload's start to the end of the run
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


class ProcessMeter:
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


def allocatable_of(nodes: list[dict]) -> dict[str, int]:
    """Resource name -> total allocatable of ``nodes`` (Node dicts), canonical units."""
    from shardsched.api.quantity import canonical_quantity

    total: dict[str, int] = {}
    for n in nodes:
        for resource, q in ((n.get("status") or {}).get("allocatable") or {}).items():
            total[resource] = total.get(resource, 0) + canonical_quantity(resource, q)
    return total


def ray_system_pids() -> list[int]:
    names = ("raylet", "gcs_server", "dashboard", "log_monitor", "monitor.py", "runtime_env")
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "name"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        if any(n in cmd for n in names) and "ray" in cmd:
            out.append(p.info["pid"])
    return out


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
