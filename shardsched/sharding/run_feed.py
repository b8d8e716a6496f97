"""The embedded run's workload feeder: creates the pods of a burst in chunks at once, or replays a
trace in time (`TraceReplay`: creations and deletions at their compressed times, the replay's clock
held at a pod's deletion until it is bound or unschedulable, for at most ``trace_bind_wait_s``)."""

from __future__ import annotations

import logging
import threading
import time

from shardsched.sharding.binding_cycle import CREATED_AT_ANNOTATION
from shardsched.sharding.calls import SimClusterClient
from shardsched.sharding.run_control import RunOptions
from shardsched.sharding.sim_actor import unschedulable
from shardsched.sim.trace import TraceReplay

log = logging.getLogger(__name__)

CREATE_CHUNK = 2000


class WorkloadFeeder:
    """Feeds ``workload`` ((creation s, deletion s or None, Pod dict) triples) into the simulated
    cluster through ``cluster`` (a `SimClusterClient`, set before `feed`).

    Attributes:
        errors: what went wrong, one line each (shared with the run's other errors).
        created: workload pods created so far; ``created_first_s`` / ``created_last_s``: when the
            first and the last were created, seconds after ``t0`` (`RunReport.created_first_s`).
        t0: ``time.monotonic()`` when the workload started (set by the run).
    """

    def __init__(self, workload: list[tuple[float, float | None, dict]], options: RunOptions,
                 errors: list[str]) -> None:
        self.cluster: SimClusterClient | None = None
        self.workload = workload
        self.options = options
        self.errors = errors
        self.created = 0
        self.created_first_s: float | None = None
        self.created_last_s: float | None = None
        self.t0 = 0.0
        self._instant = {id(p) for c, d, p in workload if d == c}  # pods of a trace deleted when created

    def feed(self, t0: float, stop: threading.Event) -> None:
        """Create (and delete) pods at their times; a burst is created in chunks at once."""
        try:
            steps = list(TraceReplay(self.workload, self.options.time_scale, self.options.trace_max_pause_s)
                         ) if self.replay else None
            if steps is None:
                pods = [p for _, _, p in self.workload]
                for i in range(0, len(pods), CREATE_CHUNK):
                    if stop.is_set():
                        return
                    self._create(pods[i:i + CREATE_CHUNK])
                return
            pending: list = []
            held_s = 0.0  # the replay's clock held so far, waiting for binds (`_wait_for_bind`)
            for step in steps:
                if stop.is_set():
                    return
                if t0 + held_s + step.due_s - time.monotonic() > 0.005:
                    held_s += self._flush(pending, stop)
                    stop.wait(max(0.0, t0 + held_s + step.due_s - time.monotonic()))
                pending.append(step)
            self._flush(pending, stop)
        except Exception as e:  # noqa: BLE001 - report, do not crash the run
            self.errors.append(f"workload feeder: {type(e).__name__}: {e}")
            log.exception("workload feeder failed")

    @property
    def replay(self) -> bool:
        """The workload is replayed over time (some pod is created after the start or deleted)."""
        return any(c > 0 or d is not None for c, d, _ in self.workload)

    def _create(self, pods: list[dict]) -> None:
        """Create workload pods in the cluster, stamped with the time of creation (where their
        latency starts), and note when the first and the last were created."""
        started = time.monotonic()
        now = time.time()
        for p in pods:
            p.setdefault("metadata", {}).setdefault("annotations", {})[CREATED_AT_ANNOTATION] = repr(now)
        self.cluster.create_pods(pods).wait(None)
        self.created += len(pods)
        if self.created_first_s is None:
            self.created_first_s = started - self.t0
        self.created_last_s = time.monotonic() - self.t0

    def _flush(self, steps: list, stop: threading.Event) -> float:
        """Carry out replay steps due now (creations first, as `TraceReplay` orders them); returns
        the seconds the replay's clock was held (`_wait_for_bind`)."""
        held_s = 0.0
        creates = [s.pod for s in steps if s.action == "create"]
        if creates:
            self._create(creates)
        for s in steps:
            if s.action == "delete":
                meta = s.pod["metadata"]
                namespace = meta.get("namespace") or "default"
                if id(s.pod) not in self._instant:  # a pod the trace deletes when created is not waited for
                    held_s += self._wait_for_bind(namespace, meta["name"], stop)
                try:
                    self.cluster.delete_pod(namespace, meta["name"], None, None).wait(None)
                except Exception:  # noqa: BLE001 - already gone is fine
                    pass
        steps.clear()
        return held_s

    def _wait_for_bind(self, namespace: str, name: str, stop: threading.Event) -> float:
        """Before a replay deletes a pod: while it is neither bound nor `unschedulable` (nor gone),
        wait, for at most ``trace_bind_wait_s`` (a pod does not end before it ran). Returns the
        seconds waited, 0 when the pod was ready or waiting is off."""
        if not self.options.trace_bind_wait_s:
            return 0.0
        started = None
        while not stop.is_set():
            try:
                pod = self.cluster.get_pod(namespace, name).wait(None)
            except Exception:  # noqa: BLE001 - gone
                break
            if pod["spec"].get("nodeName") or unschedulable(pod):
                break
            started = started or time.monotonic()
            if time.monotonic() - started > self.options.trace_bind_wait_s:
                break
            stop.wait(0.01)
        return 0.0 if started is None else time.monotonic() - started
