"""``serve --bench N``: how fast does shardsched bind against this API server, and is the API server
or the scheduler the limit?

Three measurements in the namespace given, from this process and one helper process:

1. **API server baseline, before**: N pods with a schedulerName nobody serves are created, then
   bound directly from one client (`KubeCluster.bind_many`, the same concurrent ``pods/binding``
   path the shards use, without a rate limit), round-robin over the nodes: binds per second the
   API server accepts from one client. The pods are then deleted.
2. **shardsched**, on a backlog (the field report's burst: thousands of pods pending at once): N
   pods for the scheduler's first profile are created *before* shardsched starts (so the creation
   rate, itself limited by the API server, does not cap the measured rate); a watch of the bench's
   pods sees each get ``spec.nodeName``. It starts before the first baseline and runs until the
   second ends, so its own cost to the API server weighs on every measurement alike. That watch
   runs in a process of its own (`_observe`), so that the observer's decoding does not take the
   scheduler's CPU (in ``--mode threads`` shardsched is one Python process, and the watch cost
   about a tenth of its time). Pods/s = bound / (last bound seen - shardsched started, i.e. its
   start returned, Ray and the informers' first lists done, or the first bind seen if earlier);
   latency = from max(pod created, shardsched started) to the bind seen on the watch (the time a
   pod waited while shardsched was running), P50/P99.
3. **API server baseline, after**: the first measurement again, once shardsched has stopped and its
   pods are deleted. On a shared or throttled machine the server's rate drifts within a minute
   (here by up to a factor of two between runs); the two baselines bracket shardsched's window,
   and the rate it is compared with is theirs together (all binds over both durations). Both are
   reported (``api_baselines``) and ``api_drift`` = after / before tells how far apart they were.

Each of the three starts from a freshly collected API server heap when the server allows it
(`server_gc`): a Go server slows down as its heap nears the next collection (the collector's
marking takes CPU from the requests), and here the heap crossed a collection inside some 5-s
windows and not in others, which moved the server's CPU per bind by up to 1.8x between phases.

Before any of them, `Bench.check_fit` places the N pods with shardsched's own plugins on the nodes
they may use: pods that shardsched would leave pending (a not-ready taint, full nodes) are said
at once instead of after the timeout.

The report puts the rates side by side (``ratio`` = shardsched / API server; the issue's target is
>= 0.9, i.e. shardsched is never the limit), and, when the API server's ``/metrics`` can be read,
its own mean time per bind and its CPU (cores busy, CPU ms per pod) in the baselines and in
shardsched's window: ``ratio`` ~= ``busy_ratio / cost_ratio`` (`BenchReport.api_server_cpu`), which
tells a scheduler that did not keep the server busy from pods that cost the server more (each of
shardsched's pods also has a ``Scheduled`` Event and shows on the scheduler's watches).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
import multiprocessing
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from shardsched.errors import PermanentError
from shardsched.kube.client import MERGE_PATCH, Api, ClientSpec
from shardsched.kube.cluster import KubeCluster
from shardsched.kube.informer import BOUND, Reflector, Store, WatchSpec, list_all
from shardsched.sharding.shard import CREATED_AT_ANNOTATION
from shardsched.cluster import POD, AlreadyExists, Conflict, NotFound

log = logging.getLogger(__name__)

#: a schedulerName no scheduler serves: pods of the baseline stay pending until we bind them
UNSERVED = "shardsched-bench-unserved"
#: taint of the nodes the bench creates (NoSchedule; the bench's pods tolerate it), so that no
#: other scheduler puts real pods on nodes that have no kubelet and are deleted at the end
BENCH_TAINT = {"key": "shardsched.io/bench", "value": "true", "effect": "NoSchedule"}
#: label of the nodes the bench creates; the bench's pods then select them (nodeSelector)
BENCH_LABEL = "shardsched.io/bench"
#: label naming the run that made a node (its value is `Bench.run_id`); the run's pods select it, so
#: that nodes left by an interrupted run are neither used nor deleted by the next
BENCH_RUN_LABEL = "shardsched.io/bench-run"
#: ``app`` label of every bench pod (the observer's watch selects it; cleanup after a SIGKILL too)
BENCH_APP = "shardsched-bench"


#: objects per page of the bench's lists
LIST_PAGE = 500
#: pods one node made by ``--bench-nodes`` takes (its allocatable ``pods``)
BENCH_NODE_PODS = 10000


class BenchInterrupted(Exception):
    """The ``stop`` event of `Bench` was set (SIGINT/SIGTERM) while the bench prepared."""


def bench_scheduler_name() -> str:
    """The schedulerName a ``serve --bench`` run serves and gives its pods: unique per run, so that
    the bench never schedules (nor writes Events on) the cluster's own pending pods."""
    return f"shardsched-bench-{uuid.uuid4().hex[:6]}"


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


def _pod(name: str, namespace: str, scheduler_name: str, run_nodes: str | None = None) -> dict:
    """A bench pod; ``run_nodes``: the run id whose nodes alone it may go onto (nodeSelector), or
    None for any node."""
    spec = {"schedulerName": scheduler_name, "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.9",
                            "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}}}]}
    if run_nodes:  # only onto the nodes this run made, never the cluster's own nor another run's
        spec["nodeSelector"] = {BENCH_LABEL: "true", BENCH_RUN_LABEL: run_nodes}
        spec["tolerations"] = [{"key": BENCH_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": BENCH_APP},
                         "annotations": {CREATED_AT_ANNOTATION: repr(time.time())}},
            "spec": spec}


def register_node(api, node: dict, exist_ok: bool = False) -> None:
    """Create ``node`` through ``api`` (a `shardsched.kube.client.Api` with rights on nodes) and make
    it schedulable the way a kubelet and the node lifecycle controller would: status condition
    ``Ready=True``, and ``spec.taints`` set back to the node's own (dropping the
    ``node.kubernetes.io/not-ready`` taint added at admission).

    ``exist_ok``: a node of that name already there (left by an interrupted run) is made Ready
    the same way instead of failing.

    Raises: `shardsched.cluster.ApiError` from any of the three writes.
    """
    name = node["metadata"]["name"]
    try:
        api.request("POST", "/api/v1/nodes", verb="create", resource="nodes", body=node)
    except (Conflict, AlreadyExists):
        if not exist_ok:
            raise
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "no kubelet: marked Ready by shardsched"}
    api.request("PATCH", f"/api/v1/nodes/{name}/status", verb="patch", resource="nodes/status",
                body={"status": {"conditions": [ready]}}, content_type=MERGE_PATCH)
    patch: dict = {"spec": {"taints": (node.get("spec") or {}).get("taints")}}
    if node["metadata"].get("labels"):  # also on a node left by an interrupted run
        patch["metadata"] = {"labels": node["metadata"]["labels"]}
    api.request("PATCH", f"/api/v1/nodes/{name}", verb="patch", resource="nodes", body=patch,
                content_type=MERGE_PATCH)


def _observe(spec: ClientSpec, namespace: str, prefix: str, count: int, conn) -> None:
    """The bench's observer (a child process, talking over the pipe ``conn``): list then watch the
    namespace's bench pods (label ``app=shardsched-bench``: the baseline's and the backlog's, so
    that its watch loads the API server alike in both phases); send ``("ready", None)`` once
    listed; then, once every pod of ``names`` is bound, the deadline of the ``("go", timeout_s)``
    message passes or ``("stop", None)`` arrives, send ``("done", (bound_at, created_at))``: name
    -> bind seen and name -> created (Unix s, from the bench annotation). The pods counted are the
    ``count`` ones named ``prefix`` + 6 digits. The watch then goes on (through the second
    baseline) until the next message, or until the parent is gone."""
    # No cyclic collector here: what the observer holds is decoded JSON, which reference counting
    # frees, and its collections, rescanning every pod event held, took 0.2-1.7 s of the core it
    # shares with the scheduler under test once it held a few hundred thousand objects (0.6 s with
    # `gctune`'s thresholds), stalling the binds being measured.
    gc.disable()
    spec_w = WatchSpec("bench-pods", POD, f"/api/v1/namespaces/{namespace}/pods", "", BOUND,
                       label_selector=f"app={BENCH_APP}")
    api = Api(spec.api_client(pool_size=4), None, (spec.connect_timeout_s, spec.request_timeout_s))
    store = Store([spec_w])
    reflector = Reflector(api, store, spec_w, watch_timeout_s=60)
    try:
        reflector.list()
    except Exception as e:  # noqa: BLE001 - reported to the parent
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    reflector.start()
    conn.send(("ready", None))
    ours = {f"{prefix}{i:06d}" for i in range(count)}
    bound_at: dict[str, float] = {}
    created_at: dict[str, float] = {}
    seq = 0
    deadline = None
    try:
        while len(bound_at) < len(ours):
            try:
                if conn.poll():
                    msg, arg = conn.recv()
                    if msg == "stop":
                        return
                    deadline = time.monotonic() + arg
            except (EOFError, OSError):  # the parent is gone
                return
            if deadline is not None and time.monotonic() > deadline:
                break
            events, seq = store.since(seq)
            now = time.time()
            for ev in events:
                meta = ev.object.get("metadata") or {}
                name = meta.get("name")
                if name not in ours:
                    continue
                created = (meta.get("annotations") or {}).get(CREATED_AT_ANNOTATION)
                if created:
                    created_at.setdefault(name, float(created))
                if (ev.object.get("spec") or {}).get("nodeName"):
                    bound_at.setdefault(name, now)
            time.sleep(0.005)
        conn.send(("done", (bound_at, created_at)))
        # keep watching (and loading the API server as before) through the second baseline
        while not conn.poll(0.5):
            pass
    except (EOFError, OSError):  # the parent is gone, or sent "stop"
        pass
    finally:
        reflector.stop()


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


def _mean_ms(before: ServerSample | None, after: ServerSample | None) -> float | None:
    if before is None or after is None or after.binds <= before.binds:
        return None
    return round((after.bind_s - before.bind_s) / (after.binds - before.binds) * 1000, 2)


def _cpu_ratios(report: BenchReport) -> None:
    """busy_ratio and cost_ratio of both windows (to the Events, to the last bind) against the
    baselines so far (again after the second)."""
    base = report.api_server_cpu["baseline"]
    for cpu in (report.api_server_cpu, report.api_server_cpu_binds):
        window = cpu["shardsched"]
        if base and window and base["cores"] > 0 and base["ms_per_pod"] > 0:
            cpu["busy_ratio"] = round(window["cores"] / base["cores"], 3)
            cpu["cost_ratio"] = round(window["ms_per_pod"] / base["ms_per_pod"], 3)


class _CpuTally:
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


class Bench:
    """Runs the two measurements (module docstring).

    Args:
        spec: connection (its rate limit is not applied here: the bench measures the server).
        scheduler_name: the schedulerName shardsched serves (its first profile).
        namespace: where the bench pods live (must exist).
        workers: concurrent create/delete/bind requests.
        config: the `SchedulerConfiguration` shardsched runs (a profile named ``scheduler_name``):
            `prepare` then checks that the bench's pods fit (`check_fit`); None skips that check.
        stop: set by serve's SIGINT/SIGTERM handler: `prepare` then raises `BenchInterrupted`
            within a fraction of a second (binds in flight are cancelled), `measure` reports the
            run as interrupted, and `finish` skips the second baseline; `cleanup` still runs.
    """

    def __init__(self, spec: ClientSpec, scheduler_name: str, namespace: str = "default", workers: int = 32,
                 stop: threading.Event | None = None, config=None) -> None:
        self.spec = spec
        self.config = config
        self._stop = stop if stop is not None else threading.Event()
        self.scheduler_name = scheduler_name
        self.namespace = namespace
        self.workers = workers
        self.run_id = uuid.uuid4().hex[:6]  # in pod names: a run never collides with another's leftovers
        client = spec.api_client(pool_size=workers + 4)
        self.api = Api(client, None, (spec.connect_timeout_s, spec.request_timeout_s))
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="bench")
        self._run_nodes: str | None = None  # the run id once the bench makes its own nodes
        self._nodes: list[str] = []
        self._server_baseline = [0.0, 0.0]  # the API server's (seconds, count) of the baselines' binds
        self._cpu_baseline = _CpuTally()
        self._prepared: ServerSample | None = None  # read once the backlog was created

    @property
    def interrupted(self) -> bool:
        """True once the ``stop`` event is set."""
        return self._stop.is_set()

    def _check(self) -> None:
        if self._stop.is_set():
            raise BenchInterrupted("interrupted")

    def _create(self, pods: list[dict]) -> list[dict]:
        path = f"/api/v1/namespaces/{self.namespace}/pods"

        def one(pod: dict) -> dict:
            self._check()  # after a SIGINT the requests not yet sent are not sent
            return self.api.request("POST", path, verb="create", resource="pods", body=pod)
        return list(self.pool.map(one, pods))

    def _delete(self, names: list[str]) -> None:
        def one(name: str) -> None:
            try:
                self.api.request("DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{name}", verb="delete",
                                 resource="pods", body={"gracePeriodSeconds": 0})
            except Exception as e:  # noqa: BLE001 - cleanup is best effort
                log.debug("delete %s: %s", name, e)
        list(self.pool.map(one, names))

    def _list(self, path: str, resource: str, **selectors: str) -> list[dict]:
        """Every object of a list (`shardsched.kube.informer.list_all`, pages of `LIST_PAGE`: a
        large cluster's pods are not one response)."""
        query = [(k, v) for k, v in (("labelSelector", selectors.get("label")),
                                     ("fieldSelector", selectors.get("field"))) if v]
        return list_all(self.api, path, resource, query, LIST_PAGE)[0]

    def nodes(self) -> list[str]:
        return [n["metadata"]["name"] for n in self._list("/api/v1/nodes", "nodes")]

    def warn_leftovers(self) -> tuple[int, int]:
        """Log a warning when nodes or pods of an earlier bench run are still there (a run killed
        with SIGKILL cannot clean up): this run neither uses nor deletes them, the warning gives the
        commands that do. Returns (nodes, pods) found; (0, 0) when they cannot be listed."""
        try:
            nodes = self._list("/api/v1/nodes", "nodes", label=BENCH_LABEL)
            pods = self._list(f"/api/v1/namespaces/{self.namespace}/pods", "pods", label=f"app={BENCH_APP}")
        except Exception as e:  # noqa: BLE001 - only a warning
            log.debug("bench leftovers: %s", e)
            return 0, 0
        if nodes or pods:
            # the Events a killed run wrote name its scheduler (its measured pods carry that name)
            names = sorted({(p.get("spec") or {}).get("schedulerName") or "" for p in pods} - {"", UNSERVED})
            events = "".join(f"; kubectl delete events -n {self.namespace} --field-selector reportingComponent={name}"
                             for name in names)
            # without a kubelet a bound pod stays Terminating through its grace period: force it
            log.warning("bench: %d node(s) and %d pod(s) of an earlier bench run are still in the cluster (a run "
                        "stopped by SIGKILL cannot clean up); this run leaves them alone. Delete them with: "
                        "kubectl delete pods -n %s -l app=%s --grace-period=0 --force; kubectl delete nodes -l %s%s",
                        len(nodes), len(pods), self.namespace, BENCH_APP, BENCH_LABEL, events)
        return len(nodes), len(pods)

    def check_fit(self, n: int, config, nodes: list[str]) -> list[str]:
        """Before anything is measured: place ``n`` bench pods, as shardsched's Filter and Score
        plugins of ``config``'s bench profile would, onto ``nodes`` (their current objects, with the
        pods already bound to them counted), so that a cluster where they cannot all go (a
        ``node.kubernetes.io/not-ready`` taint, a full node, a cordon) is said at once instead of
        after ``--bench-timeout``. The baseline binds without asking the plugins; shardsched would
        leave those pods pending.

        Returns: the nodes of ``nodes`` a bench pod passes the Filter plugins on (the baseline binds
            onto those only: never onto a cordoned or not-ready node, nor another run's leftovers).

        Raises: PermanentError with the count that fits and the scheduler's own
            ``0/N nodes are available: ...`` message (the FailedScheduling Event it would write).
        """
        from shardsched.api.objects import InvalidObjectError, NodeInfo, PodInfo
        from shardsched.cache.node_table import NodeTable, PodUsage
        from shardsched.scheduler.whatif import build_schedulers

        wanted = set(nodes)
        infos, skipped = [], []
        for obj in self._list("/api/v1/nodes", "nodes"):
            if obj["metadata"]["name"] not in wanted:
                continue
            try:
                infos.append(NodeInfo.from_object(obj))
            except InvalidObjectError as e:
                skipped.append(f"{obj['metadata']['name']}: {e}")
        table = NodeTable()
        table.add_nodes(infos)
        if self._run_nodes is None:  # the cluster's own nodes: what is bound to them counts
            active = "status.phase!=Succeeded,status.phase!=Failed,spec.nodeName!="
            for obj in self._list("/api/v1/pods", "pods", field=active):
                node = (obj.get("spec") or {}).get("nodeName")
                if node not in wanted:
                    continue
                try:
                    table.add_pod(PodUsage.of(PodInfo.from_object(obj)), node)
                except InvalidObjectError as e:  # shardsched's informer skips it too
                    log.debug("bench fit check: pod %s: %s", obj["metadata"].get("name"), e)
        scheduler = build_schedulers(config, table, seed=0)[self.scheduler_name]
        _, feasible = scheduler.feasible_mask(PodInfo.from_object(
            _pod("bench-fit", self.namespace, self.scheduler_name, self._run_nodes)))
        usable = [table.names[i] for i in np.flatnonzero(feasible)]
        fits, status = 0, None
        for i in range(n):
            result = scheduler.schedule(PodInfo.from_object(
                _pod(f"bench-fit-{i:06d}", self.namespace, self.scheduler_name, self._run_nodes)))
            if result.node is None:
                status = result.status
                break
            fits += 1
        if fits < n:
            why = (status.message if status is not None and status.message else "no node fits").rstrip(".")
            if self._run_nodes:
                hint = (f"each node the bench makes takes {BENCH_NODE_PODS} pods: use --bench-nodes "
                        f"{-(-n // BENCH_NODE_PODS)} or more")
            else:
                hint = (f"pass --bench {fits} or fewer, or " if fits else "") + \
                    "use --bench-nodes K to let the bench create nodes of its own"
            extra = f" ({len(skipped)} node(s) not readable: {skipped[0]})" if skipped else ""
            raise PermanentError(f"--bench: only {fits} of the {n} bench pods fit the nodes, shardsched would leave "
                                 f"the rest pending: {why}{extra}; {hint}")
        return usable

    def create_nodes(self, count: int) -> list[str]:
        """Create ``count`` nodes with room for many pods (for clusters without kubelets, e.g. a bare
        API server), `workers` at once, a progress line every 1,000; returns their names."""
        self._run_nodes = self.run_id
        names = [f"shardsched-bench-{self.run_id}-node-{i:04d}" for i in range(count)]
        alloc = {"cpu": "1000", "memory": "4000Gi", "pods": str(BENCH_NODE_PODS)}
        self._made_nodes = made = []  # as they are made: an interrupted run deletes those
        lock = threading.Lock()

        def one(name: str) -> None:
            self._check()
            with lock:
                made.append(name)
                if len(made) % 1000 == 0:
                    log.warning("bench: creating nodes, %d of %d", len(made), count)
            register_node(self.api, {"apiVersion": "v1", "kind": "Node",
                                     "metadata": {"name": name, "labels": {BENCH_LABEL: "true",
                                                                           BENCH_RUN_LABEL: self.run_id}},
                                     "spec": {"taints": [dict(BENCH_TAINT)]},
                                     "status": {"capacity": alloc, "allocatable": alloc}})
        futures = [self.pool.submit(one, name) for name in names]  # `workers` at once
        wait(futures)  # all settled before an error is raised: `cleanup` then sees every node made
        for f in futures:
            f.result()
        return names

    def _baseline_client(self, pods: list[dict], nodes: list[str]) -> tuple[KubeCluster, list[tuple]]:
        """The baseline's client (the shards' bind path, no rate limit, no Events) with its
        connections open, and the binds of ``pods`` round-robin over ``nodes`` for its
        `KubeCluster.bind_many`. The connections open before any clock starts, as shardsched's
        shards open theirs at start-up."""
        binder = KubeCluster(dataclasses.replace(self.spec, qps=0), [UNSERVED], bind_workers=self.workers,
                             emit_scheduled=False)
        items = [(self.namespace, p["metadata"]["name"], nodes[i % len(nodes)], p["metadata"]["uid"])
                 for i, p in enumerate(pods)]
        binder.open_connections(1)
        return binder, items

    def api_baseline(self, n: int, nodes: list[str], report: BenchReport, phase: str = "before") -> None:
        """Measurements 1 and 3 (module docstring): ``n`` binds from one client; adds a row to
        ``report.api_baselines`` and updates the combined figures."""
        names = [f"bench-api-{self.run_id}-{phase[0]}{i:06d}" for i in range(n)]
        self._baseline_names = names  # for `cleanup`, should this be interrupted
        created = self._create([_pod(name, self.namespace, UNSERVED, self._run_nodes) for name in names])
        binder, items = self._baseline_client(created, nodes)
        self._server_gc(report, phase)
        before = server_sample(self.api)
        done = threading.Event()

        def cancel_on_stop() -> None:  # a SIGINT cancels the binds in flight (they report NOT_APPLIED)
            while not done.wait(0.1):
                if self._stop.is_set():
                    binder.stop()
                    return
        threading.Thread(target=cancel_on_stop, name="bench-cancel", daemon=True).start()
        t0 = time.perf_counter()
        try:
            results = binder.bind_many(items)
        except Exception:
            self._check()  # cancelled by the stop: BenchInterrupted instead of the connection's error
            raise
        finally:
            done.set()
            binder.stop()  # its connections stay closed through shardsched's window
        wall = time.perf_counter() - t0
        self._check()  # a cancelled baseline is not counted (`cleanup` deletes its pods)
        after = server_sample(self.api)
        binds = sum(1 for r in results if r.code == 201)
        if before is not None and after is not None:
            self._server_baseline = [self._server_baseline[0] + after.bind_s - before.bind_s,
                                     self._server_baseline[1] + after.binds - before.binds]
            seconds, count = self._server_baseline
            report.api_server_bind_ms["baseline"] = round(seconds / count * 1000, 2) if count else None
        self._cpu_baseline.add(before, after, binds, wall_s=wall)
        report.api_server_cpu["baseline"] = self._cpu_baseline.figures()
        _cpu_ratios(report)
        report.api_baselines.append({"phase": phase, "binds": binds, "wall_s": round(wall, 3),
                                     "binds_per_s": round(binds / wall, 3) if wall else 0.0})
        report.api_binds += binds
        report.api_bind_wall_s += wall
        report.api_binds_per_s = report.api_binds / report.api_bind_wall_s if report.api_bind_wall_s else 0.0
        rates = {b["phase"]: b["binds_per_s"] for b in report.api_baselines}
        if rates.get("before") and "after" in rates:
            report.api_drift = rates["after"] / rates["before"]
        self._delete(names)
        self._baseline_names = []
        self._check()
        bad = [r for r in results if r.code != 201]
        if bad:
            report.errors.append(f"baseline ({phase}): {len(bad)} binds failed, first: {bad[0].code} {bad[0].message}")

    def _server_gc(self, report: BenchReport, phase: str) -> None:
        """`server_gc` before ``phase``, in a helper thread so that a SIGINT meanwhile stops the
        bench at once (the collection then ends on the server alone). Raises: BenchInterrupted."""
        box: list = []
        t = threading.Thread(target=lambda: box.append(server_gc(self.api)), name="bench-server-gc", daemon=True)
        t.start()
        while t.is_alive() and not self._stop.is_set():
            t.join(0.1)
        self._check()
        report.api_server_gc_s[phase] = box[0] if box else None

    def prepare(self, n: int, create_nodes: int = 0) -> BenchReport:
        """Before shardsched starts: nodes (``create_nodes`` new ones if asked), the check that the
        ``n`` pods fit them (`check_fit`, raises PermanentError), the API server baseline, then the
        backlog of ``n`` pending pods and the watch that times their binds."""
        report = BenchReport(pods=n)
        try:
            self.api.request("GET", f"/api/v1/namespaces/{self.namespace}", verb="get", resource="namespaces")
        except NotFound:
            raise PermanentError(f"--bench-namespace {self.namespace!r}: no such namespace") from None
        except Exception as e:  # noqa: BLE001 - not allowed to read namespaces: creating the pods will tell
            log.debug("bench namespace %s: %s", self.namespace, e)
        self.warn_leftovers()
        if create_nodes:
            # the bench's pods go onto its own nodes only: the baseline binds round-robin over
            # them, and the measured pods select them
            self._made_nodes = nodes = self.create_nodes(create_nodes)
        else:
            nodes = self.nodes()
        if not nodes:
            report.errors.append("the cluster has no nodes (use --bench-nodes K to create some)")
            return report
        if self.config is not None:
            nodes = self.check_fit(n, self.config, nodes)
        # the observer watches from before the baseline: its watch then costs the API server the
        # same in both phases (one event per pod created, bound, deleted)
        prefix = f"bench-{self.run_id}-"
        self._nodes = nodes
        self._check()
        self._start_observer(prefix, n)
        self.api_baseline(n, nodes, report, "before")
        self._names = [f"{prefix}{i:06d}" for i in range(n)]
        self._backlog = self._create([_pod(name, self.namespace, self.scheduler_name, self._run_nodes)
                                      for name in self._names])
        # shardsched starts right after this; its start-up (Ray, the first lists) allocates little
        self._server_gc(report, "shardsched")
        self._prepared = server_sample(self.api)
        return report

    def start_null(self, report: BenchReport, watch: bool = False) -> float:
        """The null run's window (``serve --bench-null``), called instead of starting shardsched: the
        baseline's client (`api_baseline`'s binder, its connections opened first) binds the backlog
        in a background thread, round-robin over the nodes, while `measure` times the binds on the
        observer's watch as it times shardsched's. Everything else (pods, watches, the collection
        before the window, both baselines) is as in a real run, so the ratio that comes out is
        what this cluster's own rate scatters between phases: the noise floor of ``ratio``.

        ``watch`` (``--bench-null-watch``): the window also holds the watches a scheduler of the
        bench's pods holds (a `KubeCluster`'s informers for the bench's scheduler name, as
        shardsched's coordinator runs them, listed before the window starts), so the ratio also
        carries what those watches cost the server per bind: the floor a scheduler's ratio can
        reach on this cluster, where the plain null run's is a bare client's.

        Returns the window's start (Unix s, the ``started_at`` of `measure`); call `end_null`
        after `measure`.

        Raises: what `KubeCluster.start` raises when ``watch`` and the informers cannot list.
        """
        report.null = True
        report.null_watch = watch
        self._null_watch = None
        if watch:
            self._null_watch = KubeCluster(dataclasses.replace(self.spec, qps=0), [self.scheduler_name],
                                           emit_scheduled=False)
            self._null_watch.start()
        binder, items = self._baseline_client(self._backlog, self._nodes)
        self._null_binder = binder
        self._null_results: list = []
        self._null_error = ""

        def bind() -> None:
            try:
                self._null_results.extend(binder.bind_many(items))
            except Exception as e:  # noqa: BLE001 - reported by end_null
                self._null_error = f"{type(e).__name__}: {e}"
        self._null_thread = threading.Thread(target=bind, name="bench-null", daemon=True)
        started_at = time.time()
        self._null_thread.start()
        return started_at

    def end_null(self, report: BenchReport) -> None:
        """After `measure` in a null run: stop its binder (binds not sent yet are not sent) and
        note failed binds among the report's errors."""
        binder = getattr(self, "_null_binder", None)
        if binder is None:
            return
        if report.bound >= report.pods and not report.interrupted:
            self._null_thread.join(30)  # every bind was seen: its answers are coming in
        binder.stop()  # otherwise (stopped, timed out) the binds not answered yet are cancelled
        self._null_thread.join(10)
        self._null_binder = None
        if self._null_watch is not None:
            self._null_watch.stop()
            self._null_watch = None
        bad = [r for r in self._null_results if r.code != 201]
        if self._null_error and not report.interrupted:  # a stop's cancellation is said by ``interrupted``
            report.errors.append(f"null run: the binds stopped: {self._null_error}")
        elif bad:
            report.errors.append(f"null run: {len(bad)} binds failed, first: {bad[0].code} {bad[0].message}")

    def _start_observer(self, prefix: str, n: int) -> None:
        """Start the observer process (`_observe`) and wait until it has listed the pods.

        Raises: TimeoutError after 120 s; RuntimeError when it died or could not list."""
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._observer = ctx.Process(target=_observe, name="shardsched-bench-observer", daemon=True,
                                     args=(self.spec, self.namespace, prefix, n, child))
        self._observer.start()
        child.close()  # the child's end: a dead child then reads as EOF here
        try:
            waited = self._wait_observer(120)
            self._check()
            if waited == "timeout":
                raise TimeoutError("the bench's observer did not list the pods within 120 s")
            msg, arg = self._conn.recv()
        except EOFError:
            self._observer.join(5)
            raise RuntimeError(f"the bench's observer died before it listed the pods (exit code "
                               f"{self._observer.exitcode}; a Python error, if any, is printed above)") from None
        if msg != "ready":
            raise RuntimeError(f"the bench's observer could not list the pods: {arg}")

    def _wait_observer(self, timeout_s: float) -> str:
        """Wait for the observer's next message: "ready" when it can be read, "stopped" when the
        stop event was set first, "timeout" after ``timeout_s``. Raises: EOFError (observer gone)."""
        deadline = time.monotonic() + timeout_s
        while not self._conn.poll(0.2):
            if self._stop.is_set():
                return "stopped"
            if time.monotonic() > deadline:
                return "timeout"
        return "ready"

    def measure(self, report: BenchReport, started_at: float, timeout_s: float) -> BenchReport:
        """After shardsched started (``started_at``, Unix s, when its start returned; the window
        starts at the first bind seen if that was earlier): wait until every pod is bound (or
        ``timeout_s``) and compute shardsched's figures. Then stop the scheduler and call `finish`."""
        n = len(self._names)
        bound_at: dict[str, float] = {}
        created_at: dict[str, float] = {}
        unknown = ""
        # the window of the server's CPU figures opens here, after the scheduler's start-up (Ray's
        # start-up would otherwise be charged to the pods)
        window_start, window_start_unix = server_sample(self.api), time.time()
        try:
            self._conn.send(("go", timeout_s))
            waited = self._wait_observer(timeout_s + 30)
            if waited == "stopped":
                unknown = "interrupted (SIGINT/SIGTERM) while shardsched ran"
                report.interrupted = True
            elif waited == "timeout":
                unknown = "the bench's observer did not answer"
            else:
                msg, arg = self._conn.recv()
                if msg == "done":
                    bound_at, created_at = arg
        except (EOFError, OSError):
            self._observer.join(5)
            unknown = f"the bench's observer died (exit code {self._observer.exitcode})"
        if unknown:
            report.errors.append(f"{unknown}: shardsched's figures are unknown (not measured), not zero")
            try:
                self._conn.send(("stop", None))
            except OSError:
                pass
            self._observer.join(10)
            if self._observer.is_alive():
                self._observer.kill()
        window_end = server_sample(self.api)
        report.api_server_bind_ms["shardsched"] = _mean_ms(self._prepared, window_end)
        report.bound = len(bound_at)
        if not unknown:  # cores busy and CPU per pod bound, from measure's start to the last bind
            self._window = (window_start, sum(1 for t in bound_at.values() if t >= window_start_unix))
            self._server_window(report, window_end)
            report.api_server_cpu_binds = {k: report.api_server_cpu[k] for k in ("shardsched", "busy_ratio", "cost_ratio")}
        if bound_at:
            first = min(bound_at.values())
            report.first_bind_s = max(0.0, first - started_at)
            started_at = min(started_at, first)
            report.wall_s = max(bound_at.values()) - started_at
            report.pods_per_s = report.bound / report.wall_s if report.wall_s > 0 else 0.0
            lat = np.array([bound_at[k] - max(created_at.get(k, started_at), started_at) for k in bound_at]) * 1000
            report.latency_ms = {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
                                 "avg": float(lat.mean())}
        if report.bound < n and not unknown:
            report.errors.append(f"only {report.bound}/{n} pods bound within {timeout_s:.0f} s")
        report.set_ratios()
        return report

    def _server_window(self, report: BenchReport, end: ServerSample | None) -> None:
        start, pods = getattr(self, "_window", (None, 0))
        tally = _CpuTally()
        tally.add(start, end, pods)
        report.api_server_cpu["shardsched"] = tally.figures()
        _cpu_ratios(report)

    def wait_events(self, report: BenchReport, written: Callable[[], int], timeout_s: float = 60.0) -> None:
        """After `measure`, before the scheduler stops: wait until ``written()`` (Scheduled Events
        shardsched has written, or given up on) reaches the pods bound, so that none is dropped at
        the stop. shardsched writes them behind its binds (as kube-scheduler's event broadcaster
        does); the time they trail the last bind is ``events_lag_s``, and ``with_events_pods_per_s``
        = bound / (window + lag) is the rate it sustains with them. The API server's CPU figures
        then run to this point, so that they include the Events' work (``ratio_with_events`` ~=
        busy_ratio / cost_ratio). Returns early on the stop event or after ``timeout_s`` (then
        ``events_lag_s`` stays None and an error says so)."""
        if not report.bound or report.interrupted:
            return
        deadline = time.monotonic() + timeout_s
        last_bind = time.time()  # measure returned when the observer saw the last bind
        while True:
            try:
                done = written()
            except Exception as e:  # noqa: BLE001 - optional figure
                log.debug("bench: events written: %s", e)
                done = -1
            if done >= report.bound:
                break
            if self._stop.is_set():
                report.interrupted = True
                report.errors.append(f"interrupted (SIGINT/SIGTERM) while the Scheduled Events were written "
                                     f"({max(done, 0)} of {report.bound}): the rate with Events is not measured")
                return
            if time.monotonic() > deadline:
                report.errors.append(f"the Scheduled Events of {report.bound} pods were not all written within "
                                     f"{timeout_s:.0f} s of the last bind ({max(done, 0)} were)")
                return
            time.sleep(0.05)
        report.events_lag_s = time.time() - last_bind
        report.with_events_pods_per_s = report.bound / (report.wall_s + report.events_lag_s)
        report.set_ratios()
        self._server_window(report, server_sample(self.api))

    def finish(self, report: BenchReport) -> BenchReport:
        """Once shardsched has stopped: delete its pods, run the second baseline (module docstring)
        on the same nodes, set the ratio against both baselines, and clean up (`cleanup`)."""
        try:
            self._delete(getattr(self, "_names", []))
            self._names = []
            if self._nodes and report.api_baselines:
                if self._stop.is_set():  # stopped after the window, before the second baseline began
                    report.interrupted = True
                    report.errors.append("interrupted (SIGINT/SIGTERM) before the second baseline: the window is "
                                         "compared with the first alone")
                else:
                    try:
                        self.api_baseline(report.pods, self._nodes, report, "after")
                    except BenchInterrupted:
                        report.interrupted = True
                        report.errors.append("interrupted (SIGINT/SIGTERM) during the second baseline: the window "
                                             "is compared with the first alone")
                report.set_ratios()
        finally:
            self.cleanup()
        return report

    def cleanup(self) -> None:
        """Stop the observer, delete the bench pods (also those of a baseline that was interrupted)
        and the nodes made (best effort)."""
        observer = getattr(self, "_observer", None)
        if observer is not None and observer.is_alive():
            try:
                self._conn.send(("stop", None))
            except OSError:
                pass
            observer.join(5)
            if observer.is_alive():
                observer.kill()
        self._delete(getattr(self, "_names", []) + getattr(self, "_baseline_names", []))
        self._names, self._baseline_names = [], []
        for name in getattr(self, "_made_nodes", []):
            try:
                self.api.request("DELETE", f"/api/v1/nodes/{name}", verb="delete", resource="nodes")
            except Exception:  # noqa: BLE001 - cleanup
                pass
        self._names, self._made_nodes = [], []

    def delete_events(self) -> int | None:
        """Delete the Events shardsched wrote for the bench's pods (call once the scheduler has
        stopped and flushed them): one delete-collection of the namespace's Events whose reporting
        controller is the bench's scheduler name (``reportingComponent`` in core/v1), which no
        other writer uses. Returns how many were deleted, or None when the API server refused
        (logged with the kubectl command that does it; they then expire with the event TTL)."""
        try:
            data = self.api.request("DELETE", f"/api/v1/namespaces/{self.namespace}/events", verb="deletecollection",
                                    resource="events", query=[("fieldSelector", f"reportingComponent={self.scheduler_name}")])
        except Exception as e:  # noqa: BLE001 - cleanup is best effort
            log.warning("the bench's Events were not deleted (%s); they expire with the API server's event TTL, or: "
                        "kubectl delete events -n %s --field-selector reportingComponent=%s",
                        e, self.namespace, self.scheduler_name)
            return None
        return len(data.get("items") or []) if isinstance(data, dict) else 0
