"""The processes of ``shardsched bench kube-vs-shardsched`` (`shardsched.bench.kube_side`): the
watcher (a child process whose watches time every bind and every ``Scheduled`` Event), the
scheduler under test (kube-scheduler or ``shardsched serve``, launched with its configuration
file) and the resource sampler of its process tree (psutil)."""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from shardsched.cluster import POD
from shardsched.kube.client import Api, ClientSpec
from shardsched.kube.informer import Reflector
from shardsched.kube.watches import Store, WatchSpec

log = logging.getLogger(__name__)

#: ``app`` label of the pods of this bench (the watcher selects it; cleanup deletes by it)
SIDE_APP = "shardsched-kube-vs"
EVENT = "Event"


def watch_binds_and_events(spec: ClientSpec, namespace: str, conn) -> None:
    """The watcher (a child process, over the pipe ``conn``): list then watch the namespace's pods
    labelled ``app=`` `SIDE_APP` and its Events of reason ``Scheduled``; note per pod name the
    first time its ``spec.nodeName`` was seen (with the node and the pod's schedulerName) and the
    first time a Scheduled Event about it was seen. Sends ``("ready", None)`` once listed (or
    ``("error", text)``), then answers ``("count", prefix)`` with the number of binds seen of pods
    whose name starts with prefix, and ``("get", prefix)`` with ``(binds, events)``: name ->
    (seen, node, schedulerName) and name -> (seen, the Event's reporting component). Ends on ``("stop", None)`` or when the parent is
    gone."""
    gc.disable()  # decoded JSON only: reference counting frees it (see serve_cluster.observe)
    pods = WatchSpec("side-pods", POD, f"/api/v1/namespaces/{namespace}/pods", "", "ours",
                     label_selector=f"app={SIDE_APP}")
    events = WatchSpec("side-events", EVENT, f"/api/v1/namespaces/{namespace}/events", "reason=Scheduled", "events")
    api = Api(spec.api_client(pool_size=4), None, (spec.connect_timeout_s, spec.request_timeout_s))
    store = Store([pods, events])
    reflectors = [Reflector(api, store, s, watch_timeout_s=60) for s in (pods, events)]
    try:
        for r in reflectors:
            r.list()
    except Exception as e:  # noqa: BLE001 - reported to the parent
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    for r in reflectors:
        r.start()
    conn.send(("ready", None))
    binds: dict[str, tuple[float, str, str]] = {}
    seen_events: dict[str, tuple[float, str]] = {}
    seq = 0
    try:
        while True:
            evs, seq = store.since(seq)
            now = time.time()
            for ev in evs:
                obj = ev.object
                if ev.kind == POD:
                    name = (obj.get("metadata") or {}).get("name")
                    node = (obj.get("spec") or {}).get("nodeName")
                    if node and name not in binds:
                        binds[name] = (now, node, (obj.get("spec") or {}).get("schedulerName") or "")
                else:
                    about = obj.get("involvedObject") or {}
                    if about.get("kind") == "Pod" and about.get("name") and ev.type != "DELETED":
                        reporter = obj.get("reportingComponent") or (obj.get("source") or {}).get("component") or ""
                        seen_events.setdefault(about["name"], (now, reporter))
            if conn.poll(0.005):
                msg, arg = conn.recv()
                if msg == "stop":
                    return
                if msg == "count":
                    conn.send(sum(1 for k in binds if k.startswith(arg)))
                elif msg == "get":
                    conn.send(({k: v for k, v in binds.items() if k.startswith(arg)},
                               {k: v for k, v in seen_events.items() if k.startswith(arg)}))
    except (EOFError, OSError):  # the parent is gone
        pass
    finally:
        for r in reflectors:
            r.stop()


class Watcher:
    """The parent's end of `watch_binds_and_events`."""

    def __init__(self, spec: ClientSpec, namespace: str, timeout_s: float = 120.0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._lock = threading.Lock()
        self.proc = ctx.Process(target=watch_binds_and_events, name="shardsched-kube-vs-watcher", daemon=True,
                                args=(spec, namespace, child))
        self.proc.start()
        child.close()
        if not self._conn.poll(timeout_s):
            self.stop()
            raise RuntimeError(f"the bench's watcher did not list the pods within {timeout_s:.0f} s")
        try:
            msg, arg = self._conn.recv()
        except EOFError:
            raise RuntimeError(f"the bench's watcher died before it listed (exit code {self.proc.exitcode})") from None
        if msg != "ready":
            self.stop()
            raise RuntimeError(f"the bench's watcher could not list the pods and Events: {arg}")

    def _ask(self, msg: str, arg):
        with self._lock:
            self._conn.send((msg, arg))
            if not self._conn.poll(60):
                raise RuntimeError("the bench's watcher did not answer within 60 s")
            return self._conn.recv()

    def count(self, prefix: str) -> int:
        """Binds seen of the pods whose name starts with ``prefix``."""
        return self._ask("count", prefix)

    def get(self, prefix: str) -> tuple[dict, dict]:
        """(name -> (bind seen, node, schedulerName), name -> (Scheduled Event seen, its reporting
        component)) for the pods whose name starts with ``prefix``."""
        return self._ask("get", prefix)

    def stop(self) -> None:
        try:
            self._conn.send(("stop", None))
        except OSError:
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def kube_scheduler_config(kubeconfig: str, scheduler_name: str, qps: float, burst: int) -> str:
    """kube-scheduler v1.24's KubeSchedulerConfiguration (``v1beta3``): one profile named
    ``scheduler_name`` with the default plugins, ``clientConnection`` at ``qps``/``burst``, leader
    election off."""
    return (f"apiVersion: kubescheduler.config.k8s.io/v1beta3\nkind: KubeSchedulerConfiguration\n"
            f"clientConnection:\n  kubeconfig: {kubeconfig}\n  qps: {qps:g}\n  burst: {burst}\n"
            f"leaderElection:\n  leaderElect: false\nprofiles:\n- schedulerName: {scheduler_name}\n")


def shardsched_config(scheduler_name: str) -> str:
    """shardsched's profile file: one profile named ``scheduler_name``, kube's default plugins."""
    return (f"apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
            f"profiles:\n- schedulerName: {scheduler_name}\n")


class SchedulerProcess:
    """One scheduler under test, started by `launch`; its output goes to ``log_path``.

    Args:
        argv: the command. log_path: its stdout and stderr.
    """

    def __init__(self, argv: list[str], log_path: Path) -> None:
        self.argv = argv
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.launched_at = 0.0
        self._cpu: dict[int, float] = {}  # pid -> CPU seconds last seen (a process that exits keeps its share)
        self._ps: dict[int, object] = {}
        self.rss_peak = 0
        self.processes_peak = 0
        self._sampling = threading.Event()
        self._sampler: threading.Thread | None = None

    def launch(self) -> float:
        """Start the process (own session: a Ctrl-C of the terminal reaches the bench, which stops
        it) and the sampler; returns the launch time (Unix s)."""
        out = self.log_path.open("w")
        self.launched_at = time.time()
        self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_die_with_parent)
        out.close()
        self._sampler = threading.Thread(target=self._sample_loop, name="kube-vs-sampler", daemon=True)
        self._sampler.start()
        return self.launched_at

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, chars: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _tree(self) -> list:
        import psutil

        if self.proc is None:
            return []
        try:
            root = self._ps.get(self.proc.pid) or psutil.Process(self.proc.pid)
            self._ps[self.proc.pid] = root
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def sample(self) -> tuple[int, float]:
        """(resident bytes summed over the process tree now, CPU seconds of every process of the
        tree seen so far); updates the peaks."""
        import psutil

        rss, n = 0, 0
        for p in self._tree():
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    rss += p.memory_info().rss
                self._cpu[p.pid] = t.user + t.system
                n += 1
            except psutil.Error:
                continue
        self.rss_peak = max(self.rss_peak, rss)
        self.processes_peak = max(self.processes_peak, n)
        return rss, sum(self._cpu.values())

    def _sample_loop(self) -> None:
        while not self._sampling.wait(0.5) and self.alive():
            self.sample()

    def terminate(self, timeout_s: float = 60.0) -> float | None:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL the process group; returns the seconds it
        took to exit after SIGTERM (None when it had to be killed)."""
        self._sampling.set()
        if self.proc is None:
            return None
        took = None
        if self.proc.poll() is None:
            start = time.monotonic()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
                took = round(time.monotonic() - start, 2)
            except subprocess.TimeoutExpired:
                pass
        self.kill_group()
        return took

    def kill_group(self) -> None:
        """SIGKILL whatever is left of its session (Ray's and Redis's children included)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for p in list(self._ps.values()):
            try:
                for c in p.children(recursive=True):
                    c.kill()
            except Exception:  # noqa: BLE001 - gone already
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass


def kube_scheduler_argv(binary: str, config_path: str) -> list[str]:
    """kube-scheduler with its configuration file, without its HTTPS endpoint (``--secure-port 0``)."""
    return [binary, f"--config={config_path}", "--secure-port=0", "--v=1"]


def serve_argv(kubeconfig: str, config_path: str, mode: str, qps: float, burst: int) -> list[str]:
    """``shardsched serve`` in ``mode`` with its profile file, leader election off, binding QPS/burst."""
    return [sys.executable, "-m", "shardsched.cli.main", "serve", "--kubeconfig", kubeconfig, "--config", config_path,
            "--mode", mode, "--no-leader-elect", "--kube-api-qps", f"{qps:g}", "--kube-api-burst", str(burst)]


def kube_scheduler_version(binary: str) -> str:
    """What ``kube-scheduler --version`` prints (``Kubernetes v1.24.0``), or why it printed nothing."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({type(e).__name__}: {e})"
    return (out.stdout or out.stderr).strip()
