"""Scaling: the shard count changed at run time, by `Scaler.scale` (``shardsched scale``,
``shardsched run --scale-at``) or by the optional autoscaler (`Scaler.enable_autoscaler`, policy in
`shardsched.sharding.scaling`): rendezvous hashing moves about the ideal share of the nodes, the new
owners are published with a bumped epoch before anything else (a stale owner is fenced off at once),
and queued pods are drained and routed again; see `Scaler.scale`."""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import Any, Callable

import numpy as np

from shardsched.sharding.coordinator.partition import assign_owners
from shardsched.sharding.coordinator.rebalancer import Rebalancer
from shardsched.sharding.coordinator.router import reroute
from shardsched.sharding.coordinator.state import LIMBO, CoordinatorState, ShardRef
from shardsched.sharding.hashing import moved_fraction
from shardsched.sharding.protocols import FENCED, Handoff
from shardsched.sharding.calls import RemoteUnavailable, Reply, ShardClient
from shardsched.sharding.scaling import Autoscaler, AutoscalerOptions, Load, ScaleStep, ideal_moved_fraction

log = logging.getLogger(__name__)


class Scaler:
    """Scale steps, one at a time, and the autoscaler's periods.

    Attributes:
        scale_steps: every step so far, oldest first.
        retired_stats: ShardStats of removed shards, for the run's report.
        shard_start_timeout_s: how long a step waits for a new shard to answer (Ray's autoscaler
            may have to add a node).
        retire_timeout_s: how long a removed shard may take to end its batch in flight.
        handover_grace_s: after this, pods of a removed shard whose fate has not arrived are routed
            again.
    """

    def __init__(self, state: CoordinatorState, shard_factory: Callable[[int, str], ShardClient],
                 rebalancer: Rebalancer) -> None:
        self.state = state
        self.shard_factory = shard_factory
        self.rebalancer = rebalancer
        self.autoscaler: Autoscaler | None = None
        self.scale_steps: list[ScaleStep] = []
        self.retired_stats: list[Any] = []
        self.shard_start_timeout_s = 300.0
        self.retire_timeout_s = 30.0
        self.handover_grace_s = 5.0
        self._limbo: dict[str, float] = {}  # uid -> time.monotonic() when it is routed again
        self.last_incarnation: dict[int, int] = {}  # index -> incarnation of its removed shard
        self._scale_lock = threading.Lock()  # one scale step at a time
        self._last_autoscale = 0.0

    def scale(self, n: int, trigger: str = "api") -> ScaleStep:
        """Run with ``n`` shards from now on: add shards, or remove the highest-numbered ones.

        1. New shards are started and must answer (`shard_start_timeout_s`; on a Ray cluster Ray's
           autoscaler may first add a worker node); the others keep scheduling meanwhile.
        2. Under the state lock (steps 2-5): owners are recomputed by rendezvous hashing over the new
           shard ids, so about the ideal share of nodes moves (growth: the new shards' share;
           shrinking: the removed shards' nodes).
        3. Their new owners are published in the ledger with a bumped epoch, before anything else:
           from then on reserve.lua refuses (FENCED) every reservation of a stale owner, so the old
           owner's batch in flight comes back through the rebalancer. Reservations made before stay
           in the ledger until committed or expired, and the new owner's second check counts them.
        4. Every shard gets the epoch; the moved nodes and the pods bound on them go to their new
           owners and are taken from the old ones.
        5. Queued pods move: a removed shard hands back its whole queue, a kept one (when growing)
           the added shards' share of it (1 - before/n, from its tail: it goes on with the head),
           drained from their `SchedulingQueue` (`Shard.drain`). They are routed again as new pods
           are (`router.Room`); pods known unschedulable wait among the unschedulable pods
           of the shard with most matching nodes.
        6. Outside the lock (the watch and the rebalancer go on): removed shards end their batch in
           flight, all at once (`Shard.retire`); what it put back in their queue goes to the
           rebalancer; then their actors are stopped. Pods of that last batch come back through
           the rebalancer or are seen bound on the watch; any whose fate has not arrived after
           `handover_grace_s` is routed again then (its lease, if the shard kept it, expires first).

        Args:
            n: the new shard count, >= 1.
            trigger: who asks, for the report (``api``, ``autoscaler``).

        Returns: the step (also kept in `scale_steps`, unless ``n`` is the current count: then
            nothing happens).

        Raises:
            ValueError: ``n`` < 1.
            RemoteUnavailable: a new shard did not answer in time; nothing changed.
            TemporaryError: Redis did not take the new map; nothing changed.
            FencedOffError: a newer coordinator published a map; nothing changed.
        """
        if n < 1:
            raise ValueError(f"the shard count must be >= 1, got {n}")
        with self._scale_lock:
            return self._scale(n, trigger)

    def _scale(self, n: int, trigger: str) -> ScaleStep:
        state = self.state
        started_unix, t0 = time.time(), time.monotonic()
        before = len(state.shards)
        if n == before:
            return ScaleStep(before, n, trigger, state.epoch, started_unix, nodes=len(state.owners))
        added = []
        for i in range(before, n):
            incarnation = self.last_incarnation.get(i, 0) + 1
            member = f"shard-{i}@{incarnation}"
            added.append(ShardRef(i, member, self.shard_factory(i, member), incarnation))
        try:
            for ref in added:
                ref.client.ping().wait(self.shard_start_timeout_s)
            t1 = time.monotonic()
            with state.lock:
                step, removed = self._handover(n, added, trigger, started_unix)
        except Exception:
            for ref in added:
                ref.client.channel.terminate()
            raise
        # Outside the state lock (the watch and the rebalancer go on): removed shards end their
        # batch in flight, all at once, then their actors are stopped.
        for ref in removed:
            ref.client.stop()
        for ref in removed:
            self._retire(ref)
        step.start_s = t1 - t0
        step.handover_s = time.monotonic() - t1
        self.scale_steps.append(step)
        if self.autoscaler is not None:
            self.autoscaler.changed()
        log.info("shards %d -> %d (%s, epoch %d): %d of %d nodes moved (%.3f, ideal %.3f), %d pods routed again, "
                 "%d in flight; start %.2f s, handover %.3f s", before, n, trigger, step.epoch, step.nodes_moved,
                 step.nodes, step.moved_fraction, step.ideal_fraction, step.pods_rerouted, step.pods_in_flight,
                 step.start_s, step.handover_s)
        return step

    def _handover(self, n: int, added: list[ShardRef], trigger: str,
                  started_unix: float) -> tuple[ScaleStep, list[ShardRef]]:
        """Steps 2-5 of `scale`, with the state lock held. Raises before changing anything when
        the ledger refuses the new map. Returns the step and the removed shards (still running)."""
        state = self.state
        before = len(state.shards)
        kept, removed = state.shards[:n], state.shards[n:]
        shards = kept + added
        after = assign_owners(list(state.owners), range(n))
        moved = {name: index for name, index in after.items() if index != state.owners[name]}
        nodes = len(after)
        removed_share = sum(1 for index in state.owners.values() if index >= n) / nodes if nodes else 0.0
        fraction = moved_fraction(state.owners, after)
        epoch = max(state.epoch, state.ledger.epoch()) + 1
        state.ledger.set_owners({name: shards[index].member for name, index in moved.items()}, epoch)
        # From here on every stale owner is fenced off in the ledger.
        gained: dict[int, list[str]] = defaultdict(list)
        lost: dict[int, list[str]] = defaultdict(list)
        for name, index in moved.items():
            gained[index].append(name)
            if state.owners[name] < n:
                lost[state.owners[name]].append(name)
        state.epoch = epoch
        state.owners.update(moved)
        state.shards = shards
        state.routed = np.concatenate([state.routed[:n], np.zeros(n - min(n, len(state.routed)), np.int64)])
        state.refresh_owner_slots()
        for s in state.shards:
            self._tell(s, ShardClient.set_epoch, epoch)
        storage = state.storage_snapshot()
        for s in added:
            self._tell(s, ShardClient.apply_namespaces, state.table.namespace_labels, [], True)
            self._tell(s, ShardClient.apply_spread_selectors, state.table.spread_selectors.objects(), [], True)
            if storage is not None:
                self._tell(s, ShardClient.apply_storage, *storage)
        for index, names in gained.items():
            slots = [state.table.index[name] for name in names if name in state.table.index]
            self._tell(state.shards[index], ShardClient.apply_nodes, [state.table.nodes[slot].obj for slot in slots], [])
            bound = [(usage, state.table.names[slot]) for slot in slots for usage in state.bound_usages(slot)]
            if bound:
                self._tell(state.shards[index], ShardClient.apply_bound, bound, [])
        for index, names in lost.items():
            self._tell(state.shards[index], ShardClient.apply_nodes, [], names)

        # Queued pods: all of a removed shard's; the added shards' share of a kept one's (its tail).
        share = 1.0 - before / n if n > before else 0.0
        items = []
        for ref in removed + (kept if share else []):
            try:
                qpis = ref.client.drain(1.0 if ref.index >= n else share).wait(30.0)
            except RemoteUnavailable as e:
                log.warning("shard %s did not hand back its queue (%s)", ref.member, e)
                continue
            for q in qpis:
                t = state.pending.get(q.pod_info.uid)
                if t is not None and t.shard == ref.index:  # else bound, deleted or routed elsewhere since
                    items.append((t, q))
        reroute(state, items)
        # The removed shards' pods not drained are in their last batch (or bound, and not yet seen).
        in_flight = 0
        deadline = time.monotonic() + self.handover_grace_s
        for t in state.pending.values():
            if t.shard >= n:
                t.shard = LIMBO
                self._limbo[t.pod.uid] = deadline
                in_flight += 1
        step = ScaleStep(before, n, trigger, epoch, started_unix, nodes=nodes, nodes_moved=len(moved),
                         moved_fraction=fraction, ideal_fraction=ideal_moved_fraction(before, n, removed_share),
                         removed_share=removed_share, pods_rerouted=len(items), pods_in_flight=in_flight)
        return step, removed

    def _tell(self, ref: ShardRef, method: Callable[..., Reply[None]], *args: Any) -> None:
        """Call a shard and wait, so that it has its nodes before pods are routed to it; a shard that
        does not answer is left to the health check (a new incarnation gets everything it owns)."""
        try:
            method(ref.client, *args).wait(10.0)
        except RemoteUnavailable as e:
            log.warning("shard %s: %s during a scale step failed: %s", ref.member, method.__name__, e)

    def _retire(self, ref: ShardRef) -> None:
        """Stop a removed shard (fenced off, its queue drained): wait for its batch in flight to end,
        hand what that batch put back in its queue to the rebalancer, keep its counters, stop its
        actor."""
        try:
            leftovers = ref.client.retire(self.retire_timeout_s).wait(self.retire_timeout_s + 10.0)
            if leftovers:
                self.rebalancer.handoff(ref.index, [Handoff(q, FENCED, f"shard {ref.member} was removed")
                                                    for q in leftovers])
            self.retired_stats.append(ref.client.take_stats().wait(10.0))
        except RemoteUnavailable as e:
            log.warning("shard %s did not retire cleanly (%s); its pods are routed again in %.0f s", ref.member, e,
                        self.handover_grace_s)
        ref.client.channel.terminate()
        self.last_incarnation[ref.index] = ref.incarnation

    def sweep_limbo(self) -> None:
        """Route again the pods of removed shards whose fate did not arrive within the grace."""
        state = self.state
        if not self._limbo:
            return
        now = time.monotonic()
        items = []
        for uid in [uid for uid, deadline in self._limbo.items() if deadline <= now]:
            del self._limbo[uid]
            t = state.pending.get(uid)
            if t is not None and t.shard == LIMBO:
                items.append((t, None))
        if items:
            log.warning("%d pods of removed shards routed again after %.0f s", len(items), self.handover_grace_s)
            state.counters["limbo_rerouted"] += len(items)
            reroute(state, items)


    # ------------------------------------------------------------------ autoscaling
    def enable_autoscaler(self, options: AutoscalerOptions) -> None:
        """Let the control loop set the shard count every ``options.period_s`` (`Autoscaler`); a
        count outside the bounds is corrected at the first period."""
        self.autoscaler = Autoscaler(options)

    def autoscale_due(self) -> bool:
        """Whether an autoscaler period has passed since the last `autoscale` (False without one)."""
        if self.autoscaler is None or time.monotonic() - self._last_autoscale < self.autoscaler.options.period_s:
            return False
        self._last_autoscale = time.monotonic()
        return True

    def autoscale(self) -> None:
        """One autoscaler period: read the shards' load (`Shard.snapshot`) and, when the policy asks
        for another count, start the step in a thread (the loop goes on; one step at a time)."""
        state = self.state
        if self.autoscaler is None or not self._scale_lock.acquire(blocking=False):
            return
        try:
            snapshots = []
            for s in list(state.shards):
                try:
                    snapshots.append(s.client.snapshot().wait(2.0))
                except RemoteUnavailable:
                    continue
            target = self.autoscaler.decide(Load.of(len(state.shards), snapshots))
        except Exception:
            self._scale_lock.release()
            raise
        if target is None or target == len(state.shards):
            self._scale_lock.release()
            return
        threading.Thread(target=self._autoscale_step, args=(target,), name="autoscale", daemon=True).start()

    def _autoscale_step(self, n: int) -> None:
        try:
            self._scale(n, "autoscaler")
        except Exception as e:  # noqa: BLE001 - logged; the next period decides again
            self.state.last_error = f"autoscaler: {type(e).__name__}: {e}"
            log.exception("autoscaler: scaling to %d shards failed", n)
        finally:
            self._scale_lock.release()
