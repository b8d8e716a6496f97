"""The coordinator: its jobs over one `CoordinatorState`, and the control loop that runs them.

Each step, under the state lock: the watch intake (`Intake.poll`) applies what the cluster changed
(the long poll of the watch pump, `shardsched.sharding.coordinator.watch_pump`, in a thread of its own)
and returns the pending pods first seen, the router (`router.route`) sends them to shards (a gang's
members wait for their group instead, `Gangs.take`), the rebalancer (`Rebalancer.rebalance`)
decides for the pods shards handed back, the gangs that are due are decided whole and held in the
ledger (`Gangs.step`), and the scaler routes
again the pods of removed shards whose fate did not arrive (`Scaler.sweep_limbo`). Outside the lock,
in a thread of their own: shard health (`Health.check`), ledger sync (`LedgerSync.check`) and the
renewal of the preemptors' nominations in the ledger (`Preemption.renew`); and
every autoscaler period, the autoscaler (`Scaler.autoscale`). Each step logs its own errors and the
loop goes on. Between two steps that found nothing to do the loop waits for a wake-up (`wake`: the
watch pump has an answer, a shard handed pods back, `stop`), at most ``poll_s``, so a pod that
arrives alone is routed as soon as the watch shows it, and nothing holds the state lock meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import Any, Callable, Mapping

import numpy as np

from shardsched.config import SchedulerConfiguration
from shardsched.errors import TemporaryError
from shardsched.sharding.coordinator import router
from shardsched.sharding.coordinator.gangs import Gangs
from shardsched.sharding.coordinator.health import Health
from shardsched.sharding.coordinator.intake import Changes, Intake
from shardsched.sharding.coordinator.ledger_sync import LedgerSync
from shardsched.sharding.coordinator.preemption import Preemption
from shardsched.sharding.coordinator.rebalancer import Rebalancer
from shardsched.sharding.coordinator.scaling import Scaler
from shardsched.sharding.coordinator.state import CoordinatorState, ShardRef
from shardsched.sharding.coordinator.watch_pump import WatchPump
from shardsched.sharding.protocols import Handoff
from shardsched.sharding.calls import ClusterClient, ShardClient
from shardsched.sharding.scaling import AutoscalerOptions, ScaleStep
from shardsched.sharding.shard_plugins import yield_writes_to_binds
from shardsched.store.ledger import Ledger

log = logging.getLogger(__name__)


class Coordinator:
    """Partitions nodes into shards, routes pods, rebalances, watches shard health, scales.

    Args:
        config: scheduler configuration (profiles decide which pods are ours).
        ledger: the Redis ledger.
        cluster: the cluster's client (list_nodes, list_pods, list_namespaces, events_since,
            record_event, set_pod_condition).
        shard_factory: (index, member) -> `ShardClient` of a new shard (a Ray actor in the product).
        num_shards: initial number of shards.
        health_period_s: seconds between two health checks of the shards.
        health_failures: consecutive failed health checks that replace a shard.
        poll_s: seconds the loop waits at most after a step that found nothing to do (it is woken
            at once by the watch, a hand-off or `stop`): the delay of what is due by time
            alone (a gang's backoff, the limbo sweep, the autoscaler).

    Attributes:
        state: the shared state (`CoordinatorState`).
        intake, rebalancer, preemption, ledger_sync, health, scaler: the jobs.
        on_relist: called after every relist (start, 410 Gone), when the cluster has just been
            loaded: the hosts of a process of its own freeze it out of the collector there
            (`shardsched.gctune`).
    """

    def __init__(self, config: SchedulerConfiguration, ledger: Ledger, cluster: ClusterClient,
                 shard_factory: Callable[[int, str], ShardClient], num_shards: int,
                 health_period_s: float = 1.0, health_failures: int = 3, poll_s: float = 0.05) -> None:
        self.num_shards = num_shards
        # its FailedScheduling Events and conditions yield to the shards' binds too
        if not cluster.channel.is_actor:
            yield_writes_to_binds(cluster.channel.target, ledger)
        self.shard_factory = shard_factory
        self.poll_s = poll_s
        self.state = CoordinatorState(config, ledger, cluster)
        self.ledger_sync = LedgerSync(self.state)
        self.preemption = Preemption(self.state)
        self.intake = Intake(self.state, self.ledger_sync, self.preemption)
        self.rebalancer = Rebalancer(self.state, self.preemption)
        self.gangs = Gangs(self.state)
        self.intake.gangs = self.rebalancer.gangs = self.gangs
        self.health = Health(self.state, shard_factory, health_period_s, health_failures)
        self.scaler = Scaler(self.state, shard_factory, self.rebalancer)
        self.on_relist: Callable[[], None] | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        #: the watch's long poll (`WatchPump`), running while `run_forever` does
        self.pump = WatchPump(self.state, self.wake)
        self._last_health = 0.0
        self._health_thread: threading.Thread | None = None  # `run_forever` checks health there

    # ------------------------------------------------------------------ start
    def adopt(self, shards: Mapping[int, tuple[str, ShardClient]]) -> None:
        """Take over the running shards of a previous coordinator (index -> (member, `ShardClient`));
        call before `start`, which creates the missing ones and lists the cluster again (epoch
        bumped, every pending pod routed again). Each shard must already hand its pods to this
        coordinator (`Shard.adopt`). A missing index gets a new incarnation, numbered after every
        member the ledger's shard map still names for it, so a zombie of it stays fenced off."""
        if not shards:
            return
        state = self.state
        try:
            known = set(state.ledger.owners().values())
        except TemporaryError:
            known = set()
        self.num_shards = max(self.num_shards, max(shards) + 1)
        state.shards = []
        for i in range(self.num_shards):
            if i in shards:
                member, client = shards[i]
                state.shards.append(ShardRef(i, member, client, int(member.rsplit("@", 1)[1])))
                continue
            seen = [int(m.rsplit("@", 1)[1]) for m in known if m.startswith(f"shard-{i}@")]
            incarnation = max(seen, default=0) + 1
            member = f"shard-{i}@{incarnation}"
            state.shards.append(ShardRef(i, member, self.shard_factory(i, member), incarnation))
        log.warning("adopted %d running shards: %s", len(shards), ", ".join(m for m, _ in shards.values()))

    def start(self) -> None:
        """Create the shards, wait until each answers a ping (a shard actor's process must start
        and import first: about a second and a half, `Scaler.shard_start_timeout_s` at most), then
        list the cluster and hand every shard its nodes and pods. So when this returns the shards
        are scheduling: a caller that times the scheduler from here (``serve --bench``) does not
        count the processes' start-up as scheduling time, and ``/readyz`` is not ready before them.

        Raises: `RemoteUnavailable` when a shard does not answer in time (its actor died at start).
        """
        state = self.state
        for i in range(len(state.shards), self.num_shards):
            member = f"shard-{i}@1"
            state.shards.append(ShardRef(i, member, self.shard_factory(i, member)))
        for ref in state.shards:
            ref.client.ping().wait(self.scaler.shard_start_timeout_s)
        state.routed = np.zeros(len(state.shards), np.int64)
        self.relist()

    def relist(self) -> None:
        """List nodes and pods and rebuild everything from them (start, and after 410 Gone)."""
        self._apply(self.intake.relist())

    # ------------------------------------------------------------------ the loop
    def run_forever(self) -> None:
        """Apply the watch, rebalance, check health; each step logs its own errors and goes on.
        Health checks run in a thread of their own: a hung shard's pings wait out their timeout,
        which must not hold up the watch and the routing for every other shard. The watch is
        long-polled by the pump's thread (`WatchPump`); the loop waits for a wake-up between steps
        that found nothing to do (module docstring)."""
        self._health_thread = threading.Thread(target=self._health_loop, name="coordinator-health", daemon=True)
        self._health_thread.start()
        self.pump.start()
        try:
            while not self._stop.is_set():
                self._wake.clear()  # a wake-up during the step makes the wait below return at once
                try:
                    busy = self.step()
                except Exception as e:  # noqa: BLE001 - the control loop never dies
                    self.state.last_error = f"{type(e).__name__}: {e}"
                    log.exception("coordinator step failed")
                    busy = False
                if not busy:
                    self._wake.wait(self.poll_s)
        finally:
            self.pump.stop()

    def wake(self) -> None:
        """Make the loop take its next step now (the watch pump has an answer, a shard handed pods
        back); safe from any thread."""
        self._wake.set()

    def _health_loop(self) -> None:
        while not self._stop.wait(self.health.period_s):
            try:
                self.health.check()
                self.ledger_sync.check()
                self._renew_nominations()
            except Exception as e:  # noqa: BLE001 - the health loop never dies
                self.state.last_error = f"health check: {type(e).__name__}: {e}"
                log.exception("coordinator health check failed")

    def _renew_nominations(self) -> None:
        if self.state.preempting:
            with self.state.lock:
                self.preemption.renew()

    def stop(self) -> None:
        self._stop.set()
        self.pump.stop()
        self._wake.set()

    def catch_up(self) -> None:
        """Apply every watch event the cluster has sent so far (`poll_watch` until it finds none),
        so that `status` and `pending_keys` describe the cluster as it is: pods created since the
        last poll are tracked, bound ones forgotten. For a report after `stop` (the shards no
        longer bind, so this ends); a cluster that does not answer ends it too."""
        with self.state.lock:
            while self.poll_watch(direct=True):
                pass

    def step(self) -> bool:
        """One turn of the loop (module docstring). Returns whether anything was done."""
        with self.state.lock:
            busy = self.poll_watch()
            busy = self.rebalancer.rebalance() or busy
            busy = self.gangs.step() or busy
            self.scaler.sweep_limbo()
        if self._health_thread is None and time.monotonic() - self._last_health >= self.health.period_s:
            self._last_health = time.monotonic()
            self.health.check()
            self.ledger_sync.check()
            self._renew_nominations()
        if self.scaler.autoscale_due():
            self.scaler.autoscale()
        return busy

    def poll_watch(self, direct: bool = False) -> bool:
        """Apply the watch's new events and route the pods first seen; returns whether there were
        any. While the watch pump runs (`run_forever`), the events are its answer, if it has one;
        else, or with ``direct``, they are asked now without waiting."""
        pump = self.pump if self.pump.running and not direct else None
        answer = pump.take() if pump is not None else None
        if pump is not None and answer is None:
            return False
        try:
            changes = self.intake.poll(answer)
        finally:
            if answer is not None:
                pump.resume()
        self._apply(changes)
        return changes.any

    def _apply(self, changes: Changes) -> None:
        if changes.new_pods:
            others = self.gangs.take(changes.new_pods)
            if others:
                router.route(self.state, others)
        if changes.relisted and self.on_relist is not None:
            self.on_relist()

    # ------------------------------------------------------------------ calls from shards and operators
    def handoff(self, shard: int, items: list[Handoff]) -> None:
        """Called by shards (fire and forget): pods they cannot place now (`Rebalancer.handoff`);
        the loop decides for them at once (`wake`)."""
        self.rebalancer.handoff(shard, items)
        self._wake.set()

    def committed(self, shard: int, epoch: int, uids: list[str]) -> None:
        """Called by shards (fire and forget): pods they bound and committed (`Intake.committed`)."""
        self.intake.committed(shard, epoch, uids)

    def replace_shard(self, index: int) -> None:
        """`Health.replace_shard`, with the state lock held."""
        with self.state.lock:
            self.health.replace_shard(index)

    def scale(self, n: int, trigger: str = "api") -> ScaleStep:
        """`Scaler.scale`: run with ``n`` shards from now on."""
        return self.scaler.scale(n, trigger)

    def enable_autoscaler(self, options: AutoscalerOptions) -> None:
        """`Scaler.enable_autoscaler`."""
        self.scaler.enable_autoscaler(options)

    def scale_history(self) -> list[dict[str, Any]]:
        """Every scale step so far (`ScaleStep.to_json`), oldest first."""
        return [step.to_json() for step in self.scaler.scale_steps]

    # ------------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        state = self.state
        with state.lock:
            unsched = sum(1 for t in state.pending.values() if t.unschedulable)
            return {
                "nodes": state.table.num_nodes, "shards": len(state.shards), "epoch": state.epoch,
                "pending": len(state.pending), "unschedulable": unsched, "gated": len(state.gated),
                "gave_up": state.counters["gave_up"], "bound_seen": state.counters["bound"],
                "routed": state.counters["routed"], "requeues": state.counters["requeues"],
                "nominated": state.counters["nominated"], "nominated_pending": len(state.nominated),
                "preemptions": state.counters["preemptions"], "victims": state.counters["victims"],
                "gangs_placed": state.counters["gangs_placed"], "gang_refusals": state.counters["gang_refusals"],
                "preemptors_waiting": sum(1 for uid, n in state.preempting.items() if n.node and uid in state.pending),
                "invalid": len(state.invalid), "replaced_shards": self.health.replaced,
                "ledger_rebuilds": self.ledger_sync.rebuilds, "last_error": state.last_error,
                "scale_steps": len(self.scaler.scale_steps), "autoscaler": self.scaler.autoscaler is not None,
            }

    def unschedulable_reasons(self) -> dict[str, int]:
        """Message -> number of pending pods whose last round ended unschedulable."""
        out: dict[str, int] = defaultdict(int)
        with self.state.lock:
            for t in self.state.pending.values():
                if t.unschedulable:
                    out[t.message] += 1
        return dict(out)

    def pending_keys(self) -> list[str]:
        with self.state.lock:
            return [t.pod.key for t in self.state.pending.values()]

    def kill_shard(self, index: int) -> None:
        """For chaos tests and demos: kill the shard's actor process (SIGKILL through Ray); a shard
        in this process is left alone."""
        self.state.shards[index].client.channel.terminate()
