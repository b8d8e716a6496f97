"""Gangs in the sharded runtime: a PodGroup's pending members are decided together by the
coordinator, over its table of the whole cluster, and held in the Redis ledger all or nothing
before any of them reaches a shard.

A pending pod of a profile with Coscheduling that names a PodGroup (its
``scheduling.x-k8s.io/pod-group`` label) is not routed on its own: the coordinator holds it
(`Tracked.shard` = `HELD`) with the other members of its group. The groups with held members
that are due (at most once per backoff) are decided in one pass (`Gangs.step`), in queue order
(priority, then the group's creation time), over one table:

1. **Decide the whole gang**: the members in queue order, each with every plugin of its profile
   over every node, each assumed on its node before the next one is decided (so the gang spreads
   or packs as one kube-scheduler would place the pods in a row; members of one signature are
   placed many at a time, `GenericScheduler.schedule_many`), and each gang's members assumed
   before the next gang is decided; Coscheduling's PreFilter holds the members of a missing or
   invalid group, or of a group short of ``minMember`` pods or of ``minResources``.
2. **All or nothing**: when the group's bound members, its members on their way to a shard and the
   members just placed reach ``minMember``, the placed ones are held in the ledger; the gangs of
   one pass share **one** call (`Ledger.reserve_gangs`, up to `HOLD_BATCH_MEMBERS` members; each
   gang all or nothing: each member's node owner under the current epoch, no shard holding its
   lease, the room); otherwise, or when the ledger refuses a gang, its assumes are undone and
   nothing is held for it: no gang ever holds part of the cluster, so gangs cannot deadlock each
   other.
3. **Bind**: each held member goes to its node's owner shard with ``nominated_node_name``; the
   shard reserves and binds it there (Coscheduling lets it through over a shard's partial view),
   the gang's hold keeping its room from every other pod of equal or lower priority meanwhile.

A member a shard hands back (its node no longer fits it there, a failed or rejected bind) comes
back here, not to the router: its hold is released and it is decided again with the group's other
members, the bound and the in-flight ones counted, so the gang is completed rather than placed
again (the members bound keep their nodes, as Coscheduling's Permit/Unreserve has it). A group
that cannot be placed counts one failed attempt for each held member: FailedScheduling and
PodScheduled=False with the gang's words and the first failure's (``pod group default/train:
2/3 members schedulable; default/train-2: 0/4 nodes are available: 4 Insufficient cpu.``), then a
retry once the cluster changed (a pod gone or finished, a node changed; after
``podMaxInUnschedulablePodsDurationSeconds`` at the latest), no sooner than a backoff
(``podInitialBackoffSeconds`` doubling to ``podMaxBackoffSeconds``), or as soon as the group or its
members change; with Coscheduling's ``podGroupBackoffSeconds``, a group that has its ``minMember``
pods is not tried again before that many seconds, whatever changes. A refusal of the ledger (the coordinator's table was behind) is retried after
the backoff alone. The holds of members on their way are renewed every
health period and released when the member binds or is deleted.

Metrics: ``scheduler_podgroup_schedule_attempts_total{result}`` and
``scheduler_podgroup_scheduling_attempt_duration_seconds{result}`` (KEP-4671's names).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import defaultdict
from dataclasses import dataclass

from shardsched.api.objects import PodInfo
from shardsched.api.podgroup import group_key_of
from shardsched.cluster import DELETED, apply_pod_group_events
from shardsched.errors import InvalidObjectError, TemporaryError
from shardsched.metrics import ERROR, SCHEDULED, UNSCHEDULABLE
from shardsched.plugins.coscheduling.plugin import NAME as COSCHEDULING
from shardsched.queue import QueuedPodInfo
from shardsched.sharding.coordinator.events import record_unschedulable
from shardsched.sharding.coordinator.nominator import release_ledger_holds, unnominate
from shardsched.sharding.coordinator.preemption import NOMINATION_TTL_MS, cluster_scheduler
from shardsched.sharding.coordinator.router import slim
from shardsched.sharding.coordinator.state import CoordinatorState, Tracked
from shardsched.store.ledger import GangMember

log = logging.getLogger(__name__)

#: `Tracked.shard` of a gang member the coordinator holds until its gang is placed
HELD = -2
#: gangs decided in one pass are held in one ledger call until their members reach this many
#: (a gang is never split): one Redis round trip for many small gangs, and no call so long that it
#: keeps the shards' Reserve calls waiting much longer than one big gang's does
HOLD_BATCH_MEMBERS = 4096


@dataclass(slots=True)
class _Placed:
    """A group whose members were placed (and assumed) with its quorum met, not yet held."""

    key: str
    placed: list[tuple[Tracked, str]]
    decide_s: float


class Gangs:
    """The gangs of one coordinator (module docstring); every method with the state lock held."""

    def __init__(self, state: CoordinatorState) -> None:
        self.state = state
        self.groups = state.pod_groups
        #: group key -> uid -> Tracked: members held here, not yet placed
        self.held: dict[str, dict[str, Tracked]] = defaultdict(dict)
        #: group key -> uid -> node: members held in the ledger on their way to a shard
        self.in_flight: dict[str, dict[str, str]] = defaultdict(dict)
        self._due: dict[str, float] = {}  # group key -> monotonic time of its next decision
        self._backoff: dict[str, float] = {}
        #: cluster events that may free room (a pod gone or finished, a node changed), counted;
        #: an unschedulable group waits for one (or its deadline): group key -> (count, deadline)
        self._changes = 0
        self._unschedulable_since: dict[str, tuple[int, float]] = {}
        #: group key -> monotonic time until which it is not tried (``podGroupBackoffSeconds``)
        self._failed_recently: dict[str, float] = {}
        self._views: dict = {}  # the PodGroups as listed and watched: key -> PodGroup
        self._invalid: dict[str, str] = {}
        self._served = True
        self._last_renew = time.monotonic()
        #: the intake's last poll reached the end of the watch (set by `Intake.poll`): a gang is
        #: decided only then, so that a burst's members and its group arrive before the decision
        self.caught_up = True

    # ------------------------------------------------------------------ intake
    def is_member(self, pod: PodInfo) -> bool:
        """Whether the pod is a gang member: it names a group and its profile has Coscheduling."""
        return (group_key_of(pod.namespace, pod.labels) is not None
                and COSCHEDULING in cluster_scheduler(self.state, pod).framework.plugins)

    def take(self, pods: list[PodInfo]) -> list[PodInfo]:
        """Hold the gang members among new pending pods; returns the others (for the router)."""
        others = []
        for pod in pods:
            if not self.is_member(pod):
                others.append(pod)
                continue
            key = group_key_of(pod.namespace, pod.labels)
            t = Tracked(slim(pod), HELD)
            self.state.pending[pod.uid] = t
            self.held[key][pod.uid] = t
            self._due.setdefault(key, 0.0)
        return others

    def relist(self, pods: list[dict]) -> None:
        """After the intake's relist: the PodGroups and every member listed again."""
        try:
            groups, _ = self.state.cluster.list_pod_groups().wait()
            self._served = True
        except Exception as e:  # noqa: BLE001 - a backend without PodGroups (its kinds lack them)
            if self._served:
                log.info("the cluster serves no PodGroups (%s); gang members wait as 'PodGroup not found'", e)
            self._served, groups = False, []
        self._views.clear()
        self._invalid.clear()
        apply_pod_group_events(self._views, self._invalid, [("ADDED", g) for g in groups])
        self.groups.set_groups(self._views, self._invalid)
        self.observe([("ADDED", p) for p in pods])
        self._due = {key: 0.0 for key in self.held}

    def apply_group_events(self, events: list[tuple[str, dict]]) -> None:
        """PodGroup watch events: the groups they change are decided again at once. A group
        deleted leaves its members held (``PodGroup ... not found``) until it comes back."""
        if apply_pod_group_events(self._views, self._invalid, events):
            self.groups.set_groups(self._views, self._invalid)
        for _, obj in events:
            meta = obj.get("metadata") or {}
            key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
            if key in self.held:
                self._due[key] = 0.0
                self._unschedulable_since.pop(key, None)

    def observe(self, events: list[tuple[str, dict]]) -> None:
        """Pod watch events: members counted (pending, bound, gone) for Coscheduling's checks;
        a member bound or deleted leaves the holds (its ledger hold released)."""
        release: dict[str, str] = {}
        for typ, obj in events:
            meta = obj.get("metadata") or {}
            phase = (obj.get("status") or {}).get("phase") or "Pending"
            if typ == DELETED or phase in ("Succeeded", "Failed"):
                self._changes += 1
            key = group_key_of(meta.get("namespace") or "default", meta.get("labels") or {})
            if key is None:
                continue
            uid = meta.get("uid") or ""
            bound = bool((obj.get("spec") or {}).get("nodeName"))
            if typ == DELETED or phase in ("Succeeded", "Failed"):
                self.groups.remove_pod(uid)
            elif not self.groups.is_member(uid):
                try:
                    self.groups.add_pod(PodInfo.from_object(obj))
                except InvalidObjectError:
                    continue
            elif bound:
                self.groups.bound(uid)
            if typ == DELETED or bound or phase in ("Succeeded", "Failed"):
                self.held.get(key, {}).pop(uid, None)
                node = self.in_flight.get(key, {}).pop(uid, None)
                if node is not None:
                    release[uid] = node
            if self.held.get(key) and (typ == DELETED or not bound):
                self._due[key] = 0.0  # membership changed: decide again
                self._unschedulable_since.pop(key, None)
        self._release(release)

    def nodes_changed(self) -> None:
        """Nodes were added, changed or removed: unschedulable groups are decided again."""
        self._changes += 1

    def handed_back(self, t: Tracked, qpi: QueuedPodInfo) -> bool:
        """A shard handed back ``t``'s pod: if it is a gang member, it is held again here (its
        ledger hold released) and decided with its group; returns whether it was one."""
        pod = t.pod
        if not self.is_member(pod):
            return False
        key = group_key_of(pod.namespace, pod.labels)
        node = self.in_flight.get(key, {}).pop(pod.uid, None)
        if node is not None:
            self._release({pod.uid: node})
        unnominate(self.state, pod.uid)
        self.state.unroute(t.shard)
        t.pod, t.shard = t.pod.nominated(""), HELD
        self.held[key][pod.uid] = t
        self._due[key] = 0.0
        self._unschedulable_since.pop(key, None)
        return True

    # ------------------------------------------------------------------ decisions
    def step(self) -> bool:
        """Decide every group that is due, once the intake has caught up with the watch; renew the
        holds every health period. Returns whether any group was decided."""
        now = time.monotonic()
        due = [key for key, at in self._due.items() if at <= now and self.held.get(key) and self._may_help(key, now)
               and self._failed_recently.get(key, 0.0) <= now] if self.caught_up else []
        if due:
            self._decide(due)
        for key in [k for k, held in self.held.items() if not held]:
            del self.held[key]
            self._due.pop(key, None)
            self._backoff.pop(key, None)
            self._unschedulable_since.pop(key, None)
            self._failed_recently.pop(key, None)
        for key in [k for k, flight in self.in_flight.items() if not flight]:
            del self.in_flight[key]
        if now - self._last_renew >= 10.0:
            self._last_renew = now
            self._renew()
        return bool(due)

    def _may_help(self, key: str, now: float) -> bool:
        """An unschedulable group is tried again once the cluster changed since (a pod gone or
        finished, a node changed) or after ``podMaxInUnschedulablePodsDurationSeconds``, as kube moves
        an unschedulable pod back to activeQ."""
        since = self._unschedulable_since.get(key)
        return since is None or self._changes > since[0] or now >= since[1]

    def _decide(self, keys: list[str]) -> None:
        """Decide the groups in queue order (priority, then the group's creation time), each
        member assumed before the next one and each gang's assumes before the next gang's; hold
        the gangs placed whole in one ledger call per `HOLD_BATCH_MEMBERS` members."""
        for key in keys:
            self.held[key] = dict(sorted(self.held[key].items(), key=lambda kv: self._order(kv[1])))
        keys.sort(key=lambda k: self._order(next(iter(self.held[k].values()))))
        batch: list[_Placed] = []
        size = 0
        for key in keys:
            try:
                ready = self._place(key)
            except Exception as e:  # noqa: BLE001 - one gang's bug must not stop the others
                for t in self.held[key].values():  # none of them is assumed but by this decision
                    self.state.table.remove_pod(t.pod.uid)
                self._failed(key, e)
                continue
            if ready is not None:
                batch.append(ready)
                size += len(ready.placed)
                if size >= HOLD_BATCH_MEMBERS:
                    self._hold(batch)
                    batch, size = [], 0
        if batch:
            self._hold(batch)

    def _place(self, key: str) -> _Placed | None:
        """Decide group ``key``'s held members (in order) over the whole cluster, each placed one
        assumed on its node. Returns the placement when the group's quorum is met; else undoes the
        assumes, records the failed attempt and returns None."""
        state = self.state
        self._unschedulable_since.pop(key, None)
        t0 = time.perf_counter()
        held = list(self.held[key].values())
        group = self.groups.groups.get(key)
        first_failure: tuple[PodInfo, str, str] | None = None
        placed: list[tuple[Tracked, str]] = []
        results = []
        for sched, run in itertools.groupby(held, key=lambda t: cluster_scheduler(state, t.pod)):
            results += sched.schedule_many([t.pod for t in run])
        for t, result in zip(held, results):
            if result.node is not None and state.owners.get(result.node) is not None:
                placed.append((t, result.node))
                continue
            if result.node is not None:  # no live owner: not placed
                state.table.remove_pod(t.pod.uid)
            if first_failure is None:
                d = result.status.diagnosis
                first_failure = (t.pod, d.message() if d is not None else result.status.message,
                                 result.status.plugin)
        bound = self.groups.bound_count(key)
        have = bound + len(self.in_flight.get(key, ())) + len(placed)
        if group is not None and have >= group.min_member:
            return _Placed(key, placed, time.perf_counter() - t0)
        self._undo(placed)
        if group is None or first_failure is None:
            why = first_failure[1] if first_failure else f"PodGroup {key} not found"
        elif first_failure[2] == COSCHEDULING:
            why = first_failure[1]
        else:
            why = (f"pod group {key}: {have}/{group.min_member} members schedulable; "
                   f"{first_failure[0].key}: {first_failure[1]}")
        self._unschedulable(key, held, why)
        self._measure(UNSCHEDULABLE, time.perf_counter() - t0)
        return None

    def _hold(self, batch: list[_Placed]) -> None:
        """Hold the placed gangs in the ledger, each all or nothing, in one call; send the members
        of each gang held to their nodes' owner shards (one call per shard); undo the others and
        retry them after a backoff. A gang's attempt lasts its decision plus the ledger call."""
        state = self.state
        t0 = time.perf_counter()
        # each member's GPU devices: those its assume took in the table (`GenericScheduler.device_choice`)
        gangs = [[GangMember(t.pod.uid, node, state.shards[state.owners[node]].member, t.pod.requests, t.pod.priority,
                             state.table.devices_of(t.pod.uid)) for t, node in p.placed] for p in batch]
        try:
            results = state.ledger.reserve_gangs(state.epoch, gangs, NOMINATION_TTL_MS)
        except Exception as e:  # noqa: BLE001 - the ledger away (TemporaryError) or a bug: nothing held
            hold_s = time.perf_counter() - t0
            for p in batch:
                self._undo(p.placed)
                self._retry(p.key)
                self._measure(ERROR, p.decide_s + hold_s)
            state.last_error = f"gangs not held: {type(e).__name__}: {e}"
            if not isinstance(e, TemporaryError):
                log.exception("gangs not held")
            return
        hold_s = time.perf_counter() - t0
        by_shard: dict[int, list[PodInfo]] = defaultdict(list)
        for p, res, members in zip(batch, results, gangs):
            if not res.ok:
                # the ledger knows better than this table (another scheduler's pods, a shard's
                # batch, a new epoch): nothing is held, the gang is decided again after a backoff
                self._undo(p.placed)
                log.info("gang %s not held by the ledger: %s %s %s", p.key, res.code.name, res.uid, res.detail)
                state.counters["gang_refusals"] += 1
                self._retry(p.key)
                self._measure(ERROR, p.decide_s + hold_s)
                continue
            for (t, node), m in zip(p.placed, members):
                owner = state.owners[node]
                state.nominated[t.pod.uid] = node  # the assume stays until the pod binds
                # t.pod is slim; the shard binds it on the devices held for it when they fit there
                t.pod, t.shard, t.unschedulable = t.pod.nominated(node, m.devices), owner, False
                state.routed[owner] += 1
                by_shard[owner].append(t.pod)
                self.in_flight[p.key][t.pod.uid] = node
                del self.held[p.key][t.pod.uid]
            state.counters["gangs_placed"] += 1
            state.counters["routed"] += len(p.placed)
            self._due.pop(p.key, None)
            self._backoff.pop(p.key, None)
            self._measure(SCHEDULED, p.decide_s + hold_s)
        for index, pods in by_shard.items():
            state.shards[index].client.add_pods(pods)

    def _failed(self, key: str, e: Exception) -> None:
        self.state.last_error = f"gang {key}: {type(e).__name__}: {e}"
        log.exception("gang %s: decision failed", key)
        self._retry(key)

    def _order(self, t: Tracked) -> tuple:
        return cluster_scheduler(self.state, t.pod).framework.queue_sort.sort_key(t.pod, 0.0, 0)

    def _undo(self, placed: list[tuple[Tracked, str]]) -> None:
        for t, _ in placed:
            self.state.table.remove_pod(t.pod.uid)

    def _unschedulable(self, key: str, held: list[Tracked], why: str) -> None:
        """One failed attempt for each held member (kube's FailureHandler, per pod), then a retry
        after the group's backoff."""
        for t in held:
            t.rounds += 1
            t.unschedulable = True
            record_unschedulable(self.state, t, why)
        self._retry(key)
        self._unschedulable_since[key] = (self._changes,
                                          time.monotonic() + self.state.config.pod_max_in_unschedulable_s)
        # Coscheduling's podGroupBackoffSeconds: a group with its minMember pods that failed is left
        # alone that long, whatever changes meanwhile (upstream's "podGroup ... failed recently")
        group = self.groups.groups.get(key)
        backoff_s = cluster_scheduler(self.state, held[0].pod).framework.plugins[COSCHEDULING].pod_group_backoff_s
        if backoff_s and group is not None and self.groups.counts(key)[0] >= group.min_member:
            self._failed_recently[key] = time.monotonic() + backoff_s

    def _retry(self, key: str) -> None:
        config = self.state.config
        backoff = min(self._backoff.get(key, config.pod_initial_backoff_s / 2) * 2, config.pod_max_backoff_s)
        self._backoff[key] = backoff
        self._due[key] = time.monotonic() + backoff

    def _measure(self, result: str, duration_s: float) -> None:
        m = self.state.metrics
        m.podgroup_attempts.labels(result).inc()
        m.podgroup_attempt_duration.labels(result).observe(duration_s)

    # ------------------------------------------------------------------ ledger holds
    def _release(self, holds: dict[str, str]) -> None:
        release_ledger_holds(self.state, holds, "gang holds")

    def _renew(self) -> None:
        """Extend the holds of the members on their way; a member whose hold the ledger lost (a
        Redis restart, an expiry) keeps going: its shard's Reserve is the second check."""
        live = {uid: node for flight in self.in_flight.values() for uid, node in flight.items()}
        if not live:
            return
        try:
            self.state.ledger.renew_nominations(live, NOMINATION_TTL_MS)
        except TemporaryError as e:
            self.state.last_error = f"gang holds not renewed: {e}"
