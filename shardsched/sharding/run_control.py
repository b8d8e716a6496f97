"""How the embedded run is steered: its options (`RunOptions`), its errors (`RunError`), and the
signals that stop it (SIGINT and SIGTERM raise `Interrupted` in the main thread, `interruptible`)."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from dataclasses import dataclass, field
from typing import Any

from shardsched.errors import ShardschedError
from shardsched.sharding import rayaccess
from shardsched.sharding.scaling import COORDINATOR_NAME, AutoscalerOptions
from shardsched.sharding.shard import ShardOptions
from shardsched.sim.cluster import FaultConfig

log = logging.getLogger(__name__)


class DropMessage(logging.Filter):
    """Drops the log records whose message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


def how_it_ended(returncode: int | None) -> str:
    """A process's end in words: ``killed by SIGKILL`` (a negative return code, as subprocess gives
    it) or ``exit status N``."""
    if returncode is not None and returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit status {returncode}"


class RunError(ShardschedError):
    """The run could not start or went wrong in a way that needs the operator (message says what)."""


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached `EmbeddedRun.run` (raised in the main thread by its handler, as
    Python raises KeyboardInterrupt for SIGINT); ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def interruptible():
    """While inside, SIGINT and SIGTERM raise `Interrupted` in the main thread, once. The yielded
    dict steers it: after ``"stopping"`` is set (the run already stops in order) a signal is logged
    and ignored; while ``"defer"`` is set it is kept in ``"pending"`` for the caller to raise later
    (`_init_ray`); ``"received"`` is the signal that was raised. The previous handlers are restored on exit. A no-op outside the main thread
    (Python runs signal handlers in the main thread only)."""
    state: dict[str, Any] = {"stopping": False, "defer": False, "pending": None, "received": None}
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def handler(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if state["stopping"]:
            log.warning("%s received while stopping; still stopping", name)
        elif state["defer"]:
            log.warning("%s received while Ray starts; stopping once it has started", name)
            state["pending"] = state["pending"] or signum
        else:
            state["stopping"] = True
            state["received"] = signum  # Ray may turn the exception into a plain KeyboardInterrupt
            raise Interrupted(signum)

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in saved:
        signal.signal(sig, handler)
    try:
        yield state
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)


def init_ray_deferring_signals(address: str | None, namespace: str, signals: dict[str, Any],
                               ray_down: threading.Event) -> None:
    """Start (or join) Ray at ``address`` (None: a local one) in ``namespace``, with SIGINT and
    SIGTERM deferred until it has started; ``signals`` is the run's state that `interruptible`
    keeps (``defer``, ``pending``, ``stopping``, ``received``); Ray's helper thread lives until
    ``ray_down`` is set.

    A signal in the middle of ``ray.init`` would leave what it started so far without an owner
    (``ray.shutdown`` knows the node only at the end): the raylet goes with this process, but
    its dashboard and runtime-env agents ignore SIGTERM and outlive it. So ``ray.init`` runs in
    a helper thread, where it installs no SIGTERM handler of its own (in the main thread it
    installs one that exits at once); the main thread waits, `interruptible` keeps the signal,
    and it is raised once Ray is up, when the run's stop can shut all of it down. The helper thread
    lives until the run's stop has shut Ray down: Ray ties its daemons to the thread that started them
    (``PR_SET_PDEATHSIG``), which would end them with it. The handlers are set again afterwards:
    Ray's core worker installs a native SIGTERM handler that dumps a stack and exits.

    Raises:
        RunError: Ray could not start or be joined.
        Interrupted: a signal came while it started (Ray is up; the run's stop shuts it down).
    """
    outcome: list[BaseException] = []

    up = threading.Event()

    def init() -> None:
        try:
            # the run's job in shardsched's namespace, where its named (and detached) actors live
            rayaccess.init(address, namespace)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            outcome.append(e)
        up.set()
        ray_down.wait()

    in_main = threading.current_thread() is threading.main_thread()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} if in_main else {}
    worker_log = logging.getLogger("ray._private.worker")
    not_main = DropMessage("SIGTERM handler is not set because current thread is not the main thread")
    worker_log.addFilter(not_main)
    signals["defer"] = True
    try:
        thread = threading.Thread(target=init, name="ray-init", daemon=True)
        thread.start()
        while not up.wait(0.1):
            pass
    finally:
        signals["defer"] = False
        worker_log.removeFilter(not_main)
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)
    if outcome:
        e = outcome[0]
        raise RunError(f"could not start or join Ray ({address or 'local'}): {e}") from None
    if signals["pending"]:
        signals["stopping"] = True
        signals["received"] = signals["pending"]
        raise Interrupted(signals["pending"])


@dataclass
class RunOptions:
    """What `EmbeddedRun` runs (see ``shardsched run --help`` for the meaning of each)."""

    shards: int = 2
    shard_options: ShardOptions = field(default_factory=ShardOptions)
    redis_url: str | None = None
    #: the Redis URL of the shards only (default: redis_url), e.g. a fault proxy in front of it
    shard_redis_url: str | None = None
    ray_address: str | None = None
    faults: FaultConfig | None = None
    seed: int = 0
    timeout_s: float = 600.0
    time_scale: float = 1.0
    #: a replay's pauses between steps are shortened to this (replay seconds; `TraceReplay`); None: kept
    trace_max_pause_s: float | None = None
    #: a replay holds its clock, at a pod's deletion, until the pod is bound or unschedulable, for
    #: at most this long (`EmbeddedRun._wait_for_bind`); None: pods are deleted on time
    trace_bind_wait_s: float | None = None
    metrics_port: int | None = None
    #: (seconds after the workload starts, shard count): `Coordinator.scale` steps of the run
    scale_at: list[tuple[float, int]] = field(default_factory=list)
    autoscaler: AutoscalerOptions | None = None
    #: the coordinator's Ray actor name (``shardsched scale`` finds it); None = unnamed
    coordinator_name: str | None = COORDINATOR_NAME
    #: Services, ReplicationControllers, ReplicaSets and StatefulSets put into the simulated cluster
    #: with the nodes (`SimCluster.put_spread_selector`): PodTopologySpread's default selectors
    spread_selectors: list[dict] = field(default_factory=list)
    #: PodGroups (scheduler-plugins') put into the simulated cluster with the nodes, before any pod
    pod_groups: list[dict] = field(default_factory=list)
    #: storage objects (PersistentVolumes, claims, StorageClasses, CSINodes, CSIStorageCapacities)
    #: created in the simulated cluster with the nodes, in order, before any pod
    #: (`SimCluster.create_volume_objects`)
    storage: list[dict] = field(default_factory=list)
