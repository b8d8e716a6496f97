"""What ``serve --bench`` reports (`BenchReport`, the ``-o json`` contract) and the API server's
own figures it reads from its ``/metrics`` (`server_sample`: time per bind, CPU) and
``/debug/pprof`` (`server_gc`). The run itself is `shardsched.bench.serve.Bench`."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from shardsched.kube.client import Api

log = logging.getLogger(__name__)


@dataclass
class BenchReport:
    """Numbers of one bench run (``to_json`` is the ``-o json`` contract)."""

    pods: int = 0
    bound: int = 0
    wall_s: float = 0.0
    pods_per_s: float = 0.0
    latency_ms: dict = field(default_factory=dict)
    #: seconds from shardsched's start (its start returned) to the first bind seen: how soon a
    #: burst starts being bound (0 when a bind came before start returned); None until measured
    first_bind_s: float | None = None
    #: both baselines together: binds, their summed durations, and binds / duration
    api_binds: int = 0
    api_bind_wall_s: float = 0.0
    api_binds_per_s: float = 0.0
    ratio: float = 0.0
    #: each baseline: {"phase": "before" | "after", "binds", "wall_s", "binds_per_s"}
    api_baselines: list = field(default_factory=list)
    #: after / before binds per second (1.0 = no drift); None until both ran
    api_drift: float | None = None
    #: stopped by SIGINT/SIGTERM: shardsched's figures are not measured when that happened in its
    #: window (``bound`` and the rates then read 0, not measured), see ``errors``
    interrupted: bool = False
    #: the API server's own mean time per ``pods/binding`` request (ms) during the baselines and
    #: during shardsched's window, from its ``apiserver_request_duration_seconds`` (all clients'
    #: binds in that window); None when its /metrics cannot be read
    api_server_bind_ms: dict = field(default_factory=lambda: {"baseline": None, "shardsched": None})
    #: the API server's own CPU (``process_cpu_seconds_total``) in the baselines and in shardsched's
    #: window: ``{"cores": mean cores busy, "ms_per_pod": CPU ms per pod bound}`` each (None when
    #: its /metrics cannot be read); ``busy_ratio`` = window cores / baseline cores (~1: shardsched
    #: kept the server as busy as the bare client did, so the server set the pace), ``cost_ratio`` =
    #: window ms per pod / baseline ms per bind (what shardsched's Events and watches add per pod).
    #: The window runs to when the Scheduled Events were written (`Bench.wait_events`; to the last
    #: bind when that was not measured): ``ratio_with_events`` ~= busy_ratio / cost_ratio.
    api_server_cpu: dict = field(default_factory=lambda: {"baseline": None, "shardsched": None,
                                                          "busy_ratio": None, "cost_ratio": None})
    #: ``api_server_cpu``'s shardsched, busy_ratio and cost_ratio over the binds alone (the window
    #: closed at the last bind, before the Events that trail it): what the server did while the
    #: pods' binding rate was measured
    api_server_cpu_binds: dict = field(default_factory=lambda: {"shardsched": None, "busy_ratio": None,
                                                                "cost_ratio": None})
    #: seconds from the last bind seen until shardsched had written the Scheduled Event of every
    #: pod bound (`Bench.wait_events`); None when not measured
    events_lag_s: float | None = None
    #: bound / (wall_s + events_lag_s): the rate with the Events a scheduler writes, and its ratio
    with_events_pods_per_s: float | None = None
    ratio_with_events: float | None = None
    #: seconds the API server took to collect its garbage before each phase ("before", "shardsched",
    #: "after"; `server_gc`), or None for a phase where it could not be asked (then that phase
    #: starts wherever the server's collection cycle happens to be)
    api_server_gc_s: dict = field(default_factory=dict)
    #: a null run (``serve --bench-null``): the baseline's client bound the backlog in shardsched's
    #: window, no scheduler ran; ``ratio`` is then the cluster's own scatter between phases
    null: bool = False
    #: a null run whose window also held a scheduler's watches (``serve --bench-null-watch``): the
    #: informers shardsched runs for the bench's scheduler name, listed before the window
    null_watch: bool = False
    errors: list[str] = field(default_factory=list)

    def set_ratios(self) -> None:
        """``ratio`` and ``ratio_with_events`` from the rates so far (again after each baseline)."""
        base = self.api_binds_per_s
        self.ratio = self.pods_per_s / base if base else 0.0
        if self.with_events_pods_per_s is not None:
            self.ratio_with_events = self.with_events_pods_per_s / base if base else 0.0

    def to_json(self) -> dict:
        """Floats to 3 decimals; the ratios rounded down (0.8996 is 0.899, never a 0.9 that a check
        ``ratio >= 0.9`` would pass), as the table prints them."""
        out = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}
        for k in ("ratio", "ratio_with_events"):
            if isinstance(getattr(self, k), float):
                out[k] = math.floor(getattr(self, k) * 1000 + 1e-9) / 1000
        return out



@dataclass(frozen=True)
class ServerSample:
    """One reading of the API server's ``/metrics`` (all cumulative since it started).

    Attributes:
        bind_s, binds: sum of seconds and count of its ``pods/binding`` requests
            (``apiserver_request_duration_seconds``; no binds yet is 0, 0).
        cpu_s: CPU seconds of the API server's process (``process_cpu_seconds_total``, user +
            system); None when it does not export it. Etcd's CPU is not in it.
        at: when it was read (``time.monotonic()``, s).
    """

    bind_s: float
    binds: float
    cpu_s: float | None
    at: float


def server_sample(api: Api) -> ServerSample | None:
    """Read the API server's ``/metrics`` (Prometheus text) into a `ServerSample`; None when it
    cannot be read (RBAC: ``get`` on the non-resource URL ``/metrics``; a server that does not serve
    it, or without ``apiserver_request_duration_seconds``)."""
    try:
        resp = api.send("GET", "/metrics", None, None, None, None, "get", "/metrics")
        try:
            status, text = resp.status, resp.read().decode("utf-8", "replace")
        finally:
            resp.response.release_conn()
    except Exception as e:  # noqa: BLE001 - optional figure
        log.debug("API server /metrics: %s", e)
        return None
    at = time.monotonic()
    if status != 200:
        return None
    total = count = 0.0
    cpu = None
    found = False  # the family is served (no binds yet is (0, 0))
    # a kube-apiserver's /metrics is megabytes: parse only the two families read here (parsing all
    # of it took ~0.2 s, inside the interval the baseline is timed over)
    wanted = ("# TYPE apiserver_request_duration_seconds ", "# TYPE process_cpu_seconds_total ",
              "apiserver_request_duration_seconds_sum{", "apiserver_request_duration_seconds_count{",
              "process_cpu_seconds_total")
    text = "\n".join(line for line in text.splitlines()
                     if line.startswith(wanted) and ("binding" in line or not line.startswith("apiserver_request")))
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as e:  # not Prometheus text
        log.debug("API server /metrics: %s", e)
        return None
    for family in families:
        if family.name == "process_cpu_seconds" and family.samples:
            cpu = float(family.samples[0].value)
        if family.name != "apiserver_request_duration_seconds":
            continue
        found = True
        for sample in family.samples:
            labels = sample.labels
            if labels.get("resource") != "pods" or labels.get("subresource") != "binding":
                continue
            if sample.name.endswith("_sum"):
                total += sample.value
            elif sample.name.endswith("_count"):
                count += sample.value
    return ServerSample(total, count, cpu, at) if found else None


def server_gc(api: Api, timeout_s: float = 60.0) -> float | None:
    """Have the API server collect its garbage now and return the seconds that took, or None when
    it cannot be asked (logged at debug level).

    A Go program runs a full collection (``runtime.GC``) before it answers
    ``GET /debug/pprof/heap?gc=1``; kube-apiserver serves that path while ``--profiling`` is on
    (the default) to a user allowed ``get`` on that non-resource URL (a cluster admin). The bench
    calls it before each phase so that all three start from the same point of the server's
    collection cycle: a heap just collected, its next collection about as far away as the live
    heap is large. The profile answered is read and dropped.
    """
    started = time.monotonic()
    try:
        resp = api.send("GET", "/debug/pprof/heap", [("gc", "1")], None, None, (5.0, timeout_s),
                        "get", "/debug/pprof/heap")
        try:
            status = resp.status
            resp.read()
        finally:
            resp.response.release_conn()
    except Exception as e:  # noqa: BLE001 - optional: the bench runs without it
        log.debug("API server /debug/pprof/heap?gc=1: %s", e)
        return None
    if status != 200:
        log.debug("API server /debug/pprof/heap?gc=1: HTTP %s", status)
        return None
    return round(time.monotonic() - started, 3)


def mean_bind_ms(before: ServerSample | None, after: ServerSample | None) -> float | None:
    if before is None or after is None or after.binds <= before.binds:
        return None
    return round((after.bind_s - before.bind_s) / (after.binds - before.binds) * 1000, 2)


def cpu_ratios(report: BenchReport) -> None:
    """busy_ratio and cost_ratio of both windows (to the Events, to the last bind) against the
    baselines so far (again after the second)."""
    base = report.api_server_cpu["baseline"]
    for cpu in (report.api_server_cpu, report.api_server_cpu_binds):
        window = cpu["shardsched"]
        if base and window and base["cores"] > 0 and base["ms_per_pod"] > 0:
            cpu["busy_ratio"] = round(window["cores"] / base["cores"], 3)
            cpu["cost_ratio"] = round(window["ms_per_pod"] / base["ms_per_pod"], 3)


class CpuTally:
    """The API server's CPU over one phase, possibly in several intervals: seconds of CPU, seconds
    of wall time, pods bound."""

    def __init__(self) -> None:
        self.cpu_s = self.wall_s = 0.0
        self.pods = 0

    def add(self, before: ServerSample | None, after: ServerSample | None, pods: int,
            wall_s: float | None = None) -> None:
        """Count the CPU from ``before`` to ``after`` for ``pods``, over ``wall_s`` (default: the
        time between the two readings; a phase timed more closely, e.g. its binds alone, passes
        its own: the server idles while the client reads /metrics)."""
        if before is None or after is None or before.cpu_s is None or after.cpu_s is None:
            return
        self.cpu_s += after.cpu_s - before.cpu_s
        self.wall_s += after.at - before.at if wall_s is None else wall_s
        self.pods += pods

    def figures(self) -> dict | None:
        """{"cores": mean cores busy, "ms_per_pod": CPU ms per pod bound}, or None (no data)."""
        if self.wall_s <= 0 or self.pods <= 0:
            return None
        return {"cores": round(self.cpu_s / self.wall_s, 3), "ms_per_pod": round(self.cpu_s / self.pods * 1000, 3)}
