"""``shardsched bench kube-vs-shardsched``: kube-scheduler and shardsched ``serve`` side by side on
one real kube-apiserver, alternating in one run.

One control plane (`shardsched.testing.envtest.ControlPlane`, or the cluster of a kubeconfig) and
N nodes reported Ready (`BenchObjects.create_nodes`: labelled and tainted for the bench, so no
other pod lands on them). Then, ``repeats`` times, each variant in turn (kube-scheduler,
``serve --mode threads``, ``serve --mode ray``; the order rotates between repeats so that none is
always first on a fresh server), each with a schedulerName of its own:

a. **backlog**: P pods created *before* the scheduler is launched; from the launch to the first and
   the last bind, and the rate from the first bind to the last;
b. **paced**: once the backlog is bound (the scheduler is warm), pods created at each rate for T
   seconds (one create call every 1/rate s, answered concurrently); creation → bound per pod, P50
   and P99: created = the create call returned (a pod's ``creationTimestamp`` has 1-s resolution),
   bound = the watch event that first shows its ``spec.nodeName``;
c. **Events**: per bound pod, its ``Scheduled`` Event seen on the watch - its bind seen; SIGTERM
   goes to the scheduler ``sigterm_after_s`` after the last paced bind, and the pods of the run
   without an Event once it exited (and ``events_settle_s`` later) are ``missing``;
d. **resources**: resident memory summed over the scheduler's process tree (psutil: serve, its
   Redis, Ray's processes and workers in Ray mode), its peak, and the CPU cores it used in each
   phase (CPU seconds of the tree / wall seconds).

Binds and Events are timed by one watcher process (`kube_side_procs.Watcher`); pods are created
from this process, a client without a rate limit. Between runs every bench pod is deleted and the
bench waits until the server lists none, and the Scheduled Events are deleted. Every process
started is stopped on exit, SIGINT and SIGTERM.
"""

from __future__ import annotations

import logging
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from shardsched.bench import kube_side_report as rep
from shardsched.bench.kube_side_procs import (SIDE_APP, SchedulerProcess, Watcher, kube_scheduler_argv,
                                              kube_scheduler_config, kube_scheduler_version, serve_argv,
                                              shardsched_config)
from shardsched.bench.serve_cluster import BenchInterrupted, BenchObjects, bench_pod
from shardsched.kube.client import ClientSpec

log = logging.getLogger(__name__)


@dataclass
class SideOptions:
    """What one side-by-side run does (the command's options; module docstring)."""

    nodes: int = 5000
    pods: int = 3000
    rates: tuple[float, ...] = (50.0, 100.0, 200.0)
    paced_s: float = 30.0
    repeats: int = 2
    variants: tuple[str, ...] = rep.VARIANTS
    qps: float = 5000.0
    burst: int = 5000
    namespace: str = "default"
    kube_scheduler: str = ""
    timeout_s: float = 300.0
    sigterm_after_s: float = 0.5
    events_settle_s: float = 3.0
    sigterm_wait_s: float = 30.0
    workers: int = 32


@dataclass
class SideResult:
    """The raw runs (one dict per variant and repeat), the API server's version and the errors."""

    options: dict
    server_version: str = ""
    kube_scheduler_version: str = ""
    runs: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    nodes_s: float | None = None
    interrupted: bool = False

    def to_json(self) -> dict:
        return {"options": self.options, "api_server_version": self.server_version,
                "kube_scheduler_version": self.kube_scheduler_version, "nodes_s": self.nodes_s,
                "interrupted": self.interrupted, "errors": self.errors, "runs": self.runs,
                "summary": rep.summary(self.runs, self.options["rates"])}


class Interrupted(Exception):
    """SIGINT or SIGTERM while the bench ran."""


def order(variants: tuple[str, ...], repeat: int) -> list[str]:
    """The variants of repeat ``repeat`` (0-based): rotated by one per repeat."""
    k = repeat % len(variants)
    return list(variants[k:] + variants[:k])


class SideBySide:
    """One side-by-side run against the API server of ``kubeconfig`` (an admin's: it creates
    nodes, pods, and reads Events). ``progress``: called with a line to show on long runs."""

    def __init__(self, kubeconfig: str, opts: SideOptions, progress: Callable[[str], None] = log.warning,
                 throwaway: bool = False) -> None:
        self.kubeconfig = kubeconfig
        self.throwaway = throwaway  # the control plane is stopped after the run: its nodes are not deleted
        self.opts = opts
        self.progress = progress
        self.spec = ClientSpec(kubeconfig=kubeconfig, qps=0)
        self.stop = threading.Event()
        self.objects = BenchObjects(self.spec, "unused", opts.namespace, workers=opts.workers, stop=self.stop)
        self.api = self.objects.api
        self.dir = Path(tempfile.mkdtemp(prefix="shardsched-kube-vs-"))
        self.current: SchedulerProcess | None = None
        self.watcher: Watcher | None = None
        self.nodes_run_id = ""
        self._cleaned = False

    # ------------------------------------------------------------------ the run
    def run(self) -> SideResult:
        """Nodes, the watcher, then every variant ``repeats`` times; cleans up in every case."""
        o = self.opts
        # the binary's name, not its path; its version is asked below
        result = SideResult(options={**o.__dict__, "rates": list(o.rates), "variants": list(o.variants),
                                     "kube_scheduler": Path(o.kube_scheduler).name if o.kube_scheduler else ""})
        try:
            result.server_version = self.server_version()
            if rep.KUBE in o.variants:
                result.kube_scheduler_version = kube_scheduler_version(o.kube_scheduler)
            started = time.monotonic()
            self.progress(f"creating {o.nodes:,} nodes and reporting them Ready")
            self.objects.create_nodes(o.nodes)
            self.nodes_run_id = self.objects.run_id
            result.nodes_s = round(time.monotonic() - started, 1)
            self.watcher = Watcher(self.spec, o.namespace)
            for r in range(o.repeats):
                for variant in order(o.variants, r):
                    self.progress(f"repeat {r + 1}/{o.repeats}: {variant}")
                    run = self.one(variant, r)
                    result.runs.append(run)
                    result.errors += [f"{variant} #{r + 1}: {e}" for e in run["errors"]]
        except (Interrupted, BenchInterrupted, KeyboardInterrupt):
            result.interrupted = True
            result.errors.append("interrupted (SIGINT/SIGTERM): the runs finished before are reported")
        finally:
            self.cleanup()
        return result

    def server_version(self) -> str:
        v = self.api.request("GET", "/version", verb="get", resource="version")
        return str(v.get("gitVersion") or "")

    def _check(self) -> None:
        if self.stop.is_set():
            raise Interrupted()

    def _sleep(self, s: float) -> None:
        if self.stop.wait(s):
            raise Interrupted()

    def one(self, variant: str, repeat: int) -> dict:
        """One variant's run (module docstring, a to d); its raw figures and errors."""
        o = self.opts
        name = f"kvs-{variant.replace('shardsched-', 'ss-').replace('kube-scheduler', 'kube')}"
        prefix = f"{name}-{repeat}-"
        run: dict = {"variant": variant, "repeat": repeat + 1, "scheduler_name": name, "errors": [], "paced": {}}
        self.clear_pods()
        backlog = [f"{prefix}b{i:05d}" for i in range(o.pods)]
        t = time.monotonic()
        self._create_all(backlog, name)
        run["backlog_create_s"] = round(time.monotonic() - t, 2)
        proc = self.current = self._process(variant, name)
        launched = proc.launch()
        _, cpu0 = proc.sample()
        ok = self._wait_bound(f"{prefix}b", o.pods, o.timeout_s, proc, run)
        binds, _ = self.watcher.get(f"{prefix}b")
        _, cpu1 = proc.sample()
        run["backlog"] = rep.backlog_figures(launched, {k: v[0] for k, v in binds.items()}, o.pods)
        last = max((v[0] for v in binds.values()), default=time.time())
        run["backlog"]["cores"] = rep.cores(cpu0, cpu1, time.time() - launched)
        run["backlog"]["launch_to_last_wall_s"] = round(last - launched, 3)
        self.progress(f"  backlog: first bind {run['backlog']['first_bind_s']} s, last {run['backlog']['last_bind_s']} s "
                      f"after launch, {run['backlog']['first_to_last_pods_per_s']} pods/s first to last")
        if ok:
            for rate in o.rates:
                if not proc.alive():
                    break
                self._paced(proc, run, prefix, name, rate)
        self._sleep(o.sigterm_after_s)
        run["memory"] = {"rss_peak_mib": round(proc.rss_peak / 2**20, 1), "processes": proc.processes_peak}
        alive_at_end = proc.alive()
        run["sigterm_exit_s"] = proc.terminate(o.sigterm_wait_s)
        run["killed_after_sigterm"] = run["sigterm_exit_s"] is None and alive_at_end
        self.current = None
        if not alive_at_end and not any("exited" in e for e in run["errors"]):
            run["errors"].append(f"the scheduler exited early ({proc.proc.returncode}): {proc.tail()}")
        self._sleep(o.events_settle_s)
        binds, events = self.watcher.get(prefix)
        run["events"] = rep.event_figures({k: v[0] for k, v in binds.items()}, {k: v[0] for k, v in events.items()})
        run["events"]["reporters"] = dict(Counter(v[1] for v in events.values()))
        wrong = sorted(k for k, v in binds.items() if v[2] != name)
        if wrong:
            run["errors"].append(f"{len(wrong)} pods bound with another schedulerName, e.g. {wrong[0]}")
        run["bound_total"] = len(binds)
        run["log_tail"] = proc.tail(600)
        self.progress(f"  Events: P50 {run['events']['delay_ms']['p50']} ms, P99 {run['events']['delay_ms']['p99']} ms "
                      f"after the bind, {run['events']['missing']} missing after SIGTERM; peak RSS "
                      f"{run['memory']['rss_peak_mib']} MiB over {run['memory']['processes']} processes")
        self.clear_pods()
        return run

    def _process(self, variant: str, name: str) -> SchedulerProcess:
        o = self.opts
        cfg = self.dir / f"{name}.yaml"
        if variant == rep.KUBE:
            cfg.write_text(kube_scheduler_config(self.kubeconfig, name, o.qps, o.burst))
            argv = kube_scheduler_argv(o.kube_scheduler, str(cfg))
        else:
            cfg.write_text(shardsched_config(name))
            argv = serve_argv(self.kubeconfig, str(cfg), variant.rsplit("-", 1)[1], o.qps, o.burst)
        return SchedulerProcess(argv, self.dir / f"{name}.log")

    def _paced(self, proc: SchedulerProcess, run: dict, prefix: str, name: str, rate: float) -> None:
        o = self.opts
        key = f"{rate:g}"
        pp = f"{prefix}r{key}-"
        n = max(1, int(round(rate * o.paced_s)))
        names = [f"{pp}{i:05d}" for i in range(n)]
        created: dict[str, float] = {}
        errors: list[str] = []
        _, cpu0 = proc.sample()
        t0 = time.time()

        def create(pod_name: str) -> None:
            try:
                self.api.request("POST", f"/api/v1/namespaces/{o.namespace}/pods", verb="create", resource="pods",
                                 body=self._pod(pod_name, name))
                created[pod_name] = time.time()
            except Exception as e:  # noqa: BLE001 - counted and reported
                errors.append(f"{type(e).__name__}: {e}")
        with ThreadPoolExecutor(o.workers, thread_name_prefix="kube-vs-create") as pool:
            start = time.monotonic()
            for i, pod_name in enumerate(names):
                self._check()
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                pool.submit(create, pod_name)
        self._wait_bound(pp, len(created), o.paced_s + o.timeout_s, proc, run)
        binds, _ = self.watcher.get(pp)
        last = max((v[0] for v in binds.values()), default=time.time())
        _, cpu1 = proc.sample()
        fig = rep.paced_figures(rate, o.paced_s, created, {k: v[0] for k, v in binds.items()})
        fig["cores"] = rep.cores(cpu0, cpu1, max(last, time.time()) - t0)
        if errors:
            fig["create_errors"] = len(errors)
            run["errors"].append(f"paced {key}/s: {len(errors)} creates failed, first: {errors[0][:300]}")
        run["paced"][key] = fig
        lat = fig["latency_ms"]
        self.progress(f"  paced {key}/s ({fig['created_per_s']} created/s): P50 {lat['p50']} ms, P99 {lat['p99']} ms, "
                      f"{fig['cores']} cores")

    # ------------------------------------------------------------------ pods
    def _pod(self, pod_name: str, scheduler: str) -> dict:
        p = bench_pod(pod_name, self.opts.namespace, scheduler, self.nodes_run_id or None)
        p["metadata"]["labels"] = {"app": SIDE_APP}
        return p

    def _create_all(self, names: list[str], scheduler: str) -> None:
        def one(pod_name: str) -> None:
            self._check()
            self.api.request("POST", f"/api/v1/namespaces/{self.opts.namespace}/pods", verb="create",
                             resource="pods", body=self._pod(pod_name, scheduler))
        with ThreadPoolExecutor(self.opts.workers, thread_name_prefix="kube-vs-create") as pool:
            list(pool.map(one, names))

    def _wait_bound(self, prefix: str, n: int, timeout_s: float, proc: SchedulerProcess, run: dict) -> bool:
        deadline = time.monotonic() + timeout_s
        last_note = time.monotonic()
        while True:
            got = self.watcher.count(prefix)
            if got >= n:
                return True
            if not proc.alive():
                run["errors"].append(f"the scheduler exited ({proc.proc.returncode}) with {got}/{n} pods bound: "
                                     f"{proc.tail()}")
                return False
            if time.monotonic() > deadline:
                run["errors"].append(f"only {got}/{n} pods of {prefix}* bound within {timeout_s:.0f} s")
                return False
            if time.monotonic() - last_note > 15:
                self.progress(f"  {got:,}/{n:,} bound")
                last_note = time.monotonic()
            self._sleep(0.05)

    def clear_pods(self, timeout_s: float = 300.0) -> None:
        """Delete every bench pod (grace period 0: no kubelet) and the Scheduled Events, and wait
        until the server lists no bench pod."""
        ns = self.opts.namespace
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}
        deadline = time.monotonic() + timeout_s
        while True:
            left = self.api.request("GET", f"/api/v1/namespaces/{ns}/pods", verb="list", resource="pods",
                                    query=[("labelSelector", f"app={SIDE_APP}"), ("limit", "1")])
            if not left.get("items"):
                break
            self.api.request("DELETE", f"/api/v1/namespaces/{ns}/pods", verb="deletecollection", resource="pods",
                             query=[("labelSelector", f"app={SIDE_APP}")], body=body)
            if time.monotonic() > deadline:
                raise RuntimeError(f"bench pods still listed {timeout_s:.0f} s after their deletion")
            time.sleep(0.5)
        try:
            self.api.request("DELETE", f"/api/v1/namespaces/{ns}/events", verb="deletecollection", resource="events",
                             query=[("fieldSelector", "reason=Scheduled")])
        except Exception as e:  # noqa: BLE001 - they expire with the event TTL
            log.debug("delete Scheduled events: %s", e)

    def cleanup(self) -> None:
        """Stop the scheduler running and the watcher; delete the pods, the Events and the nodes
        (once: a second call, e.g. after a second Ctrl-C, does nothing)."""
        if self._cleaned:
            return
        self._cleaned = True
        shutil.rmtree(self.dir, ignore_errors=True)  # the configuration files and logs (tails are in the runs)
        if self.current is not None:
            self.current.terminate(timeout_s=10)
            self.current = None
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher = None
        try:
            self.stop.clear()  # cleanup's own requests go out after an interrupt
            if not self.throwaway:
                self.clear_pods(timeout_s=60)
        except Exception as e:  # noqa: BLE001 - best effort
            log.warning("bench pods not deleted: %s (kubectl delete pods -l app=%s --grace-period=0 --force)",
                        e, SIDE_APP)
        if self.throwaway:
            self.objects._made_nodes = []
        else:
            self.progress("deleting the bench's nodes")
        self.objects.delete_objects()
        self.objects.pool.shutdown(wait=False)


def control_plane_assets() -> tuple[Path | None, str]:
    """(folder, "") when ``KUBEBUILDER_ASSETS`` holds kube-apiserver and etcd, else (None, why not)."""
    from shardsched.testing.envtest import assets

    return assets()


def run_side_by_side(opts: SideOptions, kubeconfig: str | None, assets: Path | None,
                     progress: Callable[[str], None]) -> SideResult:
    """The whole command: a control plane from ``assets`` unless ``kubeconfig`` names a cluster,
    the run (`SideBySide.run`), then the plane stopped. SIGTERM stops it as SIGINT does."""
    from shardsched.testing.envtest import ControlPlane

    plane = None
    bench: SideBySide | None = None

    def on_signal(signum, frame) -> None:
        if bench is not None:
            bench.stop.set()
        raise KeyboardInterrupt
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM,)}
    try:
        if kubeconfig is None:
            progress("starting etcd and kube-apiserver")
            plane = ControlPlane(assets).start()
            kubeconfig = plane.kubeconfig("admin")
        bench = SideBySide(kubeconfig, opts, progress, throwaway=plane is not None)
        try:
            return bench.run()
        except KeyboardInterrupt:
            bench.stop.set()
            bench.cleanup()
            raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if plane is not None:
            plane.stop()
