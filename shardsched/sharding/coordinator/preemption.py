"""Preemption in the sharded runtime: kube's PostFilter (DefaultPreemption) for a pod that no shard
could place, over the coordinator's table of the whole cluster, and what upstream's
``prepareCandidate`` writes.

When a pod's round over the shards ends without a node (`Rebalancer`), the coordinator runs the
pod's profile over the whole cluster (every plugin, every node) and then its PostFilter plugins,
with the PodDisruptionBudgets of the watch. Pods nominated before (assumed in the table, not bound)
of lower priority than the pod do not count for it, and are never victims (upstream adds only
nominated pods of equal or higher priority, `RunFilterPluginsWithNominatedPods`). When the plugin
nominates a node:

1. the nomination is recorded in the Redis ledger first (`Ledger.nominate_many`, one call for the
   preemptions of a rebalance pass): the preemptor's
   requests are held on the node for every pod of equal or lower priority, the shards' Reserve
   included, so the room the victims leave goes to the preemptor; the ledger refuses it when
   another preemptor holds the room (the second preemptor is re-evaluated after a backoff, nothing
   is deleted for it); nominations of lower priority on the node are dropped and their pods'
   ``status.nominatedNodeName`` cleared;
2. each victim gets the ``DisruptionTarget`` condition, then is deleted with a uid precondition and
   its own grace period, and a ``Preempted`` Event (``Preempted by pod <uid> on node <node>``); then
   the preemptor gets its FailedScheduling Event, PodScheduled=False and ``status.nominatedNodeName``
   (upstream's ``handleSchedulingFailure`` after a PostFilter that nominated). The writes of a whole
   rebalance pass go to the cluster in one call (`Preemption.flush`,
   `ClusterBackend.prepare_candidates`); a victim already gone (404) or re-created under its name
   (409) counts as gone; a victim is never deleted twice for the same preemptor, nor one already
   terminating by a preemption (another preemptor's victim, which kube's rules may choose again: it
   still holds its room);
3. the preemptor is assumed on the node in the coordinator's table and waits, pinned to the node,
   among the unschedulable pods of the node's owner shard, which retries it when the victims are
   gone (an assigned pod deleted).

The preemptors of a rebalance pass are decided one after the other in queue order (higher priority
first), each over the table as the ones before left it (their victims terminating, themselves
assumed on their nodes), so two never pick the same victims or the same freed room.

A victim that cannot be deleted (403 Forbidden, the API away) undoes the nomination: it is released,
the victims not deleted are no longer counted as going, the pod gets a FailedScheduling Event with
the error and is retried after a backoff; the victims deleted so far stay remembered. The
nomination is released when the preemptor binds or is deleted (the watch), or when a later
PostFilter clears it; it expires after `NOMINATION_TTL_MS` unless the coordinator renews it
(`renew`, every health period).
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from dataclasses import dataclass, replace

from shardsched.api.objects import PodInfo
from shardsched.cache.node_table import PodUsage
from shardsched.cluster import ApiError, Candidate, Victim
from shardsched.errors import TemporaryError
from shardsched.framework.interface import PostFilterResult
from shardsched.scheduler.algorithm import GenericScheduler, ScheduleResult
from shardsched.store.ledger import NominateItem
from shardsched.sharding.coordinator.nominator import nomination_devices, release_ledger_holds, unnominate
from shardsched.sharding.coordinator.state import CoordinatorState, Nomination

log = logging.getLogger(__name__)

#: lifetime of a nomination in the ledger without renewal: the coordinator renews it every health
#: period; if the coordinator dies it frees the node after this long
NOMINATION_TTL_MS = 60_000

#: the queue move that retries a preemptor whose victim could not be deleted (metric label)
PREEMPTION_FAILED = "PreemptionFailed"

#: outcomes of `Preemption.run`
FITS, NOMINATED, WAITING, FAILED = "fits", "nominated", "waiting", "failed"


@dataclass
class Outcome:
    """What `Preemption.run` decided for one pod.

    Attributes:
        kind: FITS (the pod fits ``node`` now: no preemption), NOMINATED (the pod nominated to
            ``node``, its victims to be deleted by `Preemption.flush`), WAITING (not eligible while
            its victims terminate: it keeps its nomination on ``node``) or FAILED (no node can be
            freed; ``message`` has upstream's ``preemption: ...`` part).
        node: the node for FITS, NOMINATED and WAITING.
        message: the FailedScheduling message of the attempt.
        devices: the GPU devices the pod takes or is nominated to on ``node`` (() for none).
    """

    kind: str
    node: str | None = None
    message: str = ""
    devices: tuple[int, ...] = ()


def cluster_scheduler(state: CoordinatorState, pod: PodInfo) -> GenericScheduler:
    """The pod's profile over the whole cluster (`CoordinatorState.cluster_schedulers`)."""
    return state.cluster_schedulers.get(pod.scheduler_name) or next(iter(state.cluster_schedulers.values()))


@dataclass
class _Writes:
    """What one preemption writes (`Preemption.flush`): its nomination on ``node`` with
    ``all_victims`` (uids) in the ledger, replacing the one on ``previous`` ("" for none), the
    deletion of its new ``victims``, and its attempt's FailedScheduling ``message``."""

    pod: PodInfo
    node: str
    victims: list[PodUsage]
    all_victims: tuple[str, ...]
    previous: str
    message: str
    devices: tuple[int, ...] = ()


class _Failed:
    """A call that raised at once (a channel in this process): its error, as a reply's."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def wait(self, timeout_s: float | None = 30.0) -> None:
        raise self.error


def _send(method, *args):
    """``method(*args)`` (a `ClusterClient` call) as a reply, whether it raises at once or on wait."""
    try:
        return method(*args)
    except (ApiError, TemporaryError) as e:
        return _Failed(e)


def _outcome(reply) -> Exception | None:
    """Wait for a reply: None when it succeeded, else its `ApiError` or `TemporaryError`."""
    try:
        reply.wait()
    except (ApiError, TemporaryError) as e:
        return e
    return None


def _split(key: str) -> tuple[str, str]:
    ns, _, name = key.partition("/")
    return (ns, name) if name else ("default", ns)


class Preemption:
    """The coordinator's preemption job over ``state`` (module docstring); call with the state lock
    held."""

    def __init__(self, state: CoordinatorState) -> None:
        self.state = state
        self._writes: list[_Writes] = []  # decided, written by `flush`
        #: `begin_pass`' nominated pods, (priority, uid, node) lowest priority first; None outside a pass
        self._pass: list[tuple[int, str, str]] | None = None
        self._pass_priorities: list[int] = []

    def begin_pass(self) -> None:
        """Before a rebalance pass's decisions (taken highest priority first; `flush` ends the
        pass): note the nominated pods by priority, so that each decision finds the ones it hides
        (`_hide_nominated`: those of lower priority) without going through every nomination. A
        nomination taken during the pass is of at least the priority of every pod decided after it,
        so it is never one of those."""
        table = self.state.table
        held = []
        for uid, node in self.state.nominated.items():
            slot = table.pod_slot.get(uid)
            if slot is not None:
                held.append((table.pods[slot][uid].priority, uid, node))
        held.sort(key=lambda h: h[0])
        self._pass = held
        self._pass_priorities = [h[0] for h in held]

    def has_post_filter(self, pod: PodInfo) -> bool:
        return bool(cluster_scheduler(self.state, pod).framework.post_filter_plugins)

    # ------------------------------------------------------------------ the decision
    def run(self, pod: PodInfo, fallback: ScheduleResult | None) -> Outcome:
        """One failed round's PostFilter for ``pod`` (without its nomination; the nomination it
        holds, if any, is looked up here). ``fallback``: the round's failed decision, whose message
        is kept when the profile has no PostFilter plugin."""
        state = self.state
        sched = cluster_scheduler(state, pod)
        if not sched.framework.post_filter_plugins:
            return Outcome(FAILED, None, fallback.status.message if fallback is not None else "")
        held = state.preempting.get(pod.uid)
        nominated = held.node if held is not None else ""
        hidden = self._hide_nominated(pod)
        try:
            result = sched.schedule(pod, assume=False)
            if result.node is not None:
                return Outcome(FITS, result.node, devices=result.devices)
            sched.pdbs = list(state.pdbs.values())
            t0 = time.perf_counter()
            pf = sched.post_filter(pod.nominated(nominated), result.status)
            state.metrics.preemption_evaluation.observe(time.perf_counter() - t0)
            state.metrics.preemption_attempts.inc()
            devices = nomination_devices(sched, pod, pf) if pf is not None and pf.status.is_success() else ()
        finally:
            for usage, node in hidden:
                state.table.add_pod(usage, node)
        d = result.status.diagnosis
        message = d.message() if d is not None else result.status.message
        if pf is None:
            return Outcome(FAILED, None, message)
        if not pf.status.is_success():
            if pf.nominated_node is None and nominated:
                return Outcome(WAITING, nominated, message, held.devices)
            self.clear(pod)
            return Outcome(FAILED, None, message)
        self._prepare(pod, pf, message, devices)
        return Outcome(NOMINATED, pf.nominated_node, message, devices)

    def _hide_nominated(self, pod: PodInfo) -> list:
        """Take out of the table the pod itself and the nominated pods of lower priority (upstream
        counts only nominated pods of equal or higher priority, and never makes one a victim);
        returns (usage, node) to put back."""
        table = self.state.table
        nominated = self.state.nominated
        out = []
        if self._pass is None:
            items = list(nominated.items())
        else:  # the pass's nominations of lower priority still held, and the pod's own
            below = bisect_left(self._pass_priorities, pod.priority)
            items = [(uid, node) for _, uid, node in self._pass[:below] if nominated.get(uid) == node]
            if pod.uid in nominated:
                items.append((pod.uid, nominated[pod.uid]))
        for uid, node in items:
            slot = table.pod_slot.get(uid)
            if slot is None:
                continue
            usage = table.pods[slot][uid]
            if uid == pod.uid or usage.priority < pod.priority:
                table.remove_pod(uid)
                out.append((usage, node))
        return out

    # ------------------------------------------------------------------ the writes
    def _prepare(self, pod: PodInfo, pf: PostFilterResult, message: str, devices: tuple[int, ...] = ()) -> None:
        """Upstream ``prepareCandidate``, decided here and written by `flush` (module docstring):
        the victims marked terminating by a preemption in the table and the pod's nomination
        recorded, so that the pods decided next in this pass see both. ``message``: the attempt's
        FailedScheduling message, written with the nomination; ``devices``: the GPU devices it
        holds on the node (`nomination_devices`)."""
        state = self.state
        node = pf.nominated_node
        held = state.preempting.get(pod.uid)
        nom = Nomination(node, dict(held.victims) if held else {}, devices)
        fresh = []
        for u in pf.victims:
            if u.uid in nom.victims or (u.deleting and u.preempted):  # already going: not deleted again
                continue
            nom.victims[u.uid] = u.key
            fresh.append(u)
            if state.table.remove_pod(u.uid) is not None:
                state.table.add_pod(replace(u, deleting=True, preempted=True, pinned=True), node)
        state.metrics.preemption_victims.observe(len(pf.victims))
        state.counters["preemptions"] += 1
        state.preempting[pod.uid] = nom
        self._writes.append(_Writes(pod, node, fresh, tuple(u.uid for u in pf.victims), held.node if held else "",
                                    message, devices))

    def flush(self) -> None:
        """What the preemptions decided since the last call write, in two calls for a whole
        rebalance pass: their nominations in the ledger, in one call, before anything is deleted
        (a nomination refused undoes its preemption, `_undo`); then one `prepare_candidates` call to
        the cluster with every accepted preemption's writes (each victim's ``DisruptionTarget``,
        its delete with a uid precondition and its ``Preempted`` Event, then the preemptor's
        FailedScheduling Event, PodScheduled condition and ``nominatedNodeName``). A victim gone
        (404) or re-created (409) counts as gone; a preemptor one of whose victims could not be
        deleted loses its nomination (`_undo`) and is retried after a backoff. Call with the state
        lock held, after the decisions (`Rebalancer.rebalance` does)."""
        writes, self._writes = self._writes, []
        self._pass = None
        if not writes:
            return
        state = self.state
        items = [NominateItem(w.pod.uid, w.node, w.pod.priority, w.pod.requests, w.all_victims, w.devices)
                 for w in writes]
        try:
            results = state.ledger.nominate_many(items, NOMINATION_TTL_MS)
        except TemporaryError as e:
            for w in writes:
                self._undo(w, set(), f"preemption: the ledger is unavailable: {e}")
            return
        accepted = []
        for w, res in zip(writes, results):
            if not res.ok:
                state.counters["nominations_refused"] += 1
                self._undo(w, set(), f"preemption: node {w.node} is held for another preemptor (insufficient "
                                     f"{res.resource or 'room'} in the ledger once the victims are gone).")
                continue
            if w.previous and w.previous != w.node:
                self._unnominate_ledger({w.pod.uid: w.previous})
            for uid in res.dropped:
                self._clear_uid(uid, w.node)
            accepted.append(w)
        if not accepted:
            return
        candidates = [Candidate(w.pod.namespace, w.pod.name, w.pod.uid, w.pod.scheduler_name, w.node,
                                tuple(Victim(*_split(u.key), u.uid) for u in w.victims), w.message)
                      for w in accepted]
        try:
            outcomes = state.cluster.prepare_candidates(candidates).wait()
        except TemporaryError as e:  # no answer: nothing known deleted; the watch shows what was
            log.warning("preemption writes of %d preemptors not answered: %s", len(accepted), e)
            state.counters["victim_delete_errors"] += len(accepted)
            for w in accepted:
                self._undo(w, set(), f"preemption: the victims on node {w.node} were not deleted: "
                                     f"{type(e).__name__}: {e}")
            return
        for w, out in zip(accepted, outcomes):
            state.counters["victims"] += len(out.gone)
            if out.failed_victim:
                log.warning("preemption of %s for %s failed: %s", out.failed_victim, w.pod.key, out.error)
                state.counters["victim_delete_errors"] += 1
                self._undo(w, set(out.gone), f"preemption: could not delete victim {out.failed_victim} on node "
                                             f"{w.node}: {out.error}")
            elif out.status_error:  # the pod deleted meanwhile: the watch forgets it
                log.warning("status of %s not written: %s", w.pod.key, out.status_error)

    def _undo(self, w: "_Writes", deleted: set[str], error: str) -> None:
        """A victim of ``w`` could not be deleted: the victims not deleted are no longer going (in
        the table, and for this preemptor), its nomination is released (ledger, table), the
        FailedScheduling Event says why, and its shard retries it after a backoff. The victims
        deleted stay deleted and remembered (upstream's prepareCandidate stops the same way)."""
        state = self.state
        held = state.preempting.get(w.pod.uid)
        for u in w.victims:
            if u.uid in deleted:
                continue
            if held is not None:
                held.victims.pop(u.uid, None)
            slot = state.table.pod_slot.get(u.uid)
            if slot is not None and state.table.names[slot] == w.node:
                state.table.remove_pod(u.uid)
                state.table.add_pod(u, w.node)
        if held is not None and held.node == w.node:
            self._unnominate_ledger({w.pod.uid: w.node})
            held.node = ""
        unnominate(state, w.pod.uid)
        t = state.pending.get(w.pod.uid)
        if t is None:
            return
        message = f"{w.message} {error}" if w.message else error
        t.message = message
        ref = {"kind": "Pod", "namespace": w.pod.namespace, "name": w.pod.name, "uid": w.pod.uid}
        state.cluster.record_event(ref, "Warning", "FailedScheduling", message)
        state.cluster.set_pod_condition(w.pod.namespace, w.pod.name, {"type": "PodScheduled", "status": "False",
                                                                      "reason": "Unschedulable", "message": message})
        if 0 <= t.shard < len(state.shards):
            state.shards[t.shard].client.move_all_to_active_or_backoff_queue(PREEMPTION_FAILED)

    def _write_nominated_node_name(self, pod: PodInfo, node: str) -> None:
        e = _outcome(_send(self.state.cluster.set_nominated_node_name, pod.namespace, pod.name, node))
        if e is not None:  # the pod deleted meanwhile: the watch forgets it
            log.warning("status.nominatedNodeName of %s not written: %s", pod.key, e)

    # ------------------------------------------------------------------ releases
    def clear(self, pod: PodInfo) -> None:
        """Clear the pod's nomination (a PostFilter that found no node): the ledger's, the API's
        ``status.nominatedNodeName``; the victims stay remembered. Safe for any pod."""
        held = self.state.preempting.get(pod.uid)
        if held is None:
            return
        if held.node:
            self._unnominate_ledger({pod.uid: held.node})
            held.node = ""
        self._write_nominated_node_name(pod, "")  # no request when the pod has none (the backends check)

    def _clear_uid(self, uid: str, node: str) -> None:
        """A lower-priority preemptor lost its nomination on ``node`` to a new one (the ledger
        dropped it): clear it here and in the API; it is re-evaluated at its next attempt."""
        held = self.state.preempting.get(uid)
        t = self.state.pending.get(uid)
        if held is None or held.node != node:
            return
        held.node = ""
        unnominate(self.state, uid)
        if t is not None:
            self._write_nominated_node_name(t.pod, "")

    def forget(self, uids: list[str]) -> None:
        """Preemptors bound or deleted (the watch): their nominations leave the ledger."""
        gone = {}
        for uid in uids:
            held = self.state.preempting.pop(uid, None)
            if held is not None and held.node:
                gone[uid] = held.node
        self._unnominate_ledger(gone)

    def renew(self) -> None:
        """Extend the live nominations in the ledger. One the ledger lost (a Redis restart) or
        never had (a nomination this coordinator found on a pod's status after a restart) is
        recorded again, with the pod's victims: those it remembers and the pods of lower priority
        still terminating by a preemption on the node; refused, the nomination is dropped and the
        preemptor re-evaluated at its next attempt. Call with the state lock held."""
        state = self.state
        live = {uid: n.node for uid, n in state.preempting.items() if n.node and uid in state.pending}
        if not live:
            return
        try:
            renewed = state.ledger.renew_nominations(live, NOMINATION_TTL_MS)
            for uid in set(live) - renewed:
                pod, held = state.pending[uid].pod, state.preempting[uid]
                slot = state.table.index.get(held.node)
                going = [] if slot is None else [u.uid for u in state.table.pods[slot].values()
                                                 if u.deleting and u.preempted and u.priority < pod.priority]
                victims = list(dict.fromkeys([*held.victims, *going]))
                if not state.ledger.nominate(uid, held.node, pod.priority, pod.requests, victims,
                                             NOMINATION_TTL_MS, held.devices).ok:
                    held.node = ""
        except TemporaryError as e:
            state.last_error = f"nominations not renewed: {e}"

    def _unnominate_ledger(self, nominations: dict[str, str]) -> None:
        release_ledger_holds(self.state, nominations, "nominations")
