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
   runs in a process of its own (`observe`), so that the observer's decoding does not take the
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
import logging
import multiprocessing
import threading
import time
from typing import Callable

import numpy as np

from shardsched.bench.serve_cluster import (BENCH_NODE_PODS, UNSERVED, BenchInterrupted, BenchObjects, bench_pod,
                                            observe)
from shardsched.bench.serve_report import (BenchReport, CpuTally, ServerSample, cpu_ratios, mean_bind_ms,
                                           server_gc, server_sample)
from shardsched.cluster import NotFound
from shardsched.errors import PermanentError
from shardsched.kube.client import ClientSpec
from shardsched.kube.cluster import KubeCluster

log = logging.getLogger(__name__)


class Bench(BenchObjects):
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
        super().__init__(spec, scheduler_name, namespace, workers, stop)
        self.config = config
        self._nodes: list[str] = []
        self._server_baseline = [0.0, 0.0]  # the API server's (seconds, count) of the baselines' binds
        self._cpu_baseline = CpuTally()
        self._prepared: ServerSample | None = None  # read once the backlog was created
        self._observer: multiprocessing.Process | None = None
        self._null_binder: KubeCluster | None = None
        self._window: tuple[ServerSample | None, int] = (None, 0)  # shardsched's window: start, pods bound

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
        from shardsched.scheduler.algorithm import build_schedulers

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
            bench_pod("bench-fit", self.namespace, self.scheduler_name, self._run_nodes)))
        usable = [table.names[i] for i in np.flatnonzero(feasible)]
        fits, status = 0, None
        for i in range(n):
            result = scheduler.schedule(PodInfo.from_object(
                bench_pod(f"bench-fit-{i:06d}", self.namespace, self.scheduler_name, self._run_nodes)))
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
        created = self._create([bench_pod(name, self.namespace, UNSERVED, self._run_nodes) for name in names])
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
        cpu_ratios(report)
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
        self._backlog = self._create([bench_pod(name, self.namespace, self.scheduler_name, self._run_nodes)
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
        binder = self._null_binder
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
        """Start the observer process (`observe`) and wait until it has listed the pods.

        Raises: TimeoutError after 120 s; RuntimeError when it died or could not list."""
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._observer = ctx.Process(target=observe, name="shardsched-bench-observer", daemon=True,
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
        report.api_server_bind_ms["shardsched"] = mean_bind_ms(self._prepared, window_end)
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
        start, pods = self._window
        tally = CpuTally()
        tally.add(start, end, pods)
        report.api_server_cpu["shardsched"] = tally.figures()
        cpu_ratios(report)

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
            self._delete(self._names)
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
        observer = self._observer
        if observer is not None and observer.is_alive():
            try:
                self._conn.send(("stop", None))
            except OSError:
                pass
            observer.join(5)
            if observer.is_alive():
                observer.kill()
        self.delete_objects()
