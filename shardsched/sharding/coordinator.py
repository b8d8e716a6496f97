"""Coordinator: partitions nodes into shards, routes pods, rebalances, watches shard health.

It consumes the cluster's watch (list, then events from the list's resourceVersion; relist on 410):

- nodes are assigned to shards by rendezvous hashing; the shard map is published in the Redis
  ledger with an epoch (the reserve script fences off a shard that no longer owns a node);
- pending pods whose ``schedulerName`` is one of the profiles are routed to a shard owning nodes
  where they fit (label- and capacity-aware, from the coordinator's own NodeTable of the whole
  cluster);
- pods bound by anyone are observed into the ledger (idempotent by uid) and forwarded to the
  shard that owns their node; deleted or terminal pods are forgotten.

The rebalancer takes pods a shard could not place: it tries shards not yet tried in this round;
when none is left the round counts as one failed attempt: the pod gets ``PodScheduled=False``
(reason Unschedulable) and a FailedScheduling Event with kube's message over all nodes, and waits in
the unschedulable pods of the shard with the most matching nodes. After ``maxSchedulingAttempts``
rounds a Warning event and the alert metric say so; the pod is still never dropped.

Shards are checked every `health_period_s`; a shard that does not answer `health_failures` times in
a row is replaced by a new incarnation (new member id, epoch bumped, so the old one is fenced off);
the pods routed to it are sent to the new one, and those it had leased wait for their leases to
expire.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from shardsched.api.objects import NodeInfo, PodInfo
from shardsched.cache.node_table import NodeTable, PodUsage
from shardsched.config import SchedulerConfiguration
from shardsched.errors import InvalidObjectError, TemporaryError
from shardsched.metrics import ShardMetrics
from shardsched.scheduler.algorithm import GenericScheduler, fit_error_message
from shardsched.scheduler.whatif import build_schedulers
from shardsched.sharding.hashing import assign
from shardsched.sharding.protocols import BIND_CONFLICT, FENCED, UNSCHEDULABLE_HERE, Handoff
from shardsched.sharding.remote import Remote, RemoteUnavailable
from shardsched.store.ledger import BoundPod, Ledger, NodeEntry

log = logging.getLogger(__name__)


@dataclass
class ShardRef:
    index: int
    member: str
    remote: Remote
    incarnation: int = 1
    failures: int = 0
    alive: bool = True


@dataclass
class Tracked:
    """A pending pod the coordinator routed."""

    pod: PodInfo
    shard: int
    tried: set[int] = field(default_factory=set)
    rounds: int = 0
    unschedulable: bool = False
    gave_up: bool = False
    message: str = ""


def _slim(pod: PodInfo) -> PodInfo:
    """The pod as sent to shards: the raw object reduced to its annotations (creation time)."""
    ann = (pod.obj.get("metadata") or {}).get("annotations")
    slim = PodInfo(**{f: getattr(pod, f) for f in PodInfo.__dataclass_fields__ if f != "obj"})
    slim.obj = {"metadata": {"annotations": ann}} if ann else {}
    return slim


class Coordinator:
    """See module docstring.

    Args:
        config: scheduler configuration (profiles decide which pods are ours).
        ledger: the Redis ledger.
        cluster: `Remote` of the cluster (list_nodes, list_pods, events_since, record_event,
            set_pod_condition).
        shard_factory: (index, member) -> `Remote` of a new shard (a Ray actor in the product).
        num_shards: initial number of shards.
    """

    def __init__(self, config: SchedulerConfiguration, ledger: Ledger, cluster: Remote,
                 shard_factory: Callable[[int, str], Remote], num_shards: int,
                 health_period_s: float = 1.0, health_failures: int = 3, poll_s: float = 0.01) -> None:
        self.config = config
        self.num_shards = num_shards
        self.ledger = ledger
        self.cluster = cluster
        self.shard_factory = shard_factory
        self.health_period_s = health_period_s
        self.health_failures = health_failures
        self.poll_s = poll_s
        self.profiles = {p.scheduler_name for p in config.profiles}
        self.table = NodeTable()
        self.schedulers: dict[str, GenericScheduler] = build_schedulers(config, self.table, seed=0)
        self.default = next(iter(self.schedulers.values()))
        self.shards: list[ShardRef] = []
        self.owners: dict[str, int] = {}
        self.owner_slots = np.zeros(0, np.int32)
        self.epoch = 0
        self.rv = 0
        self.pending: dict[str, Tracked] = {}  # uid -> tracked pending pod
        self.bound_on: dict[str, str] = {}  # uid -> node, pods counted in the table
        self.routed = np.zeros(0, np.int64)  # pods routed per shard and not yet bound
        self.metrics = ShardMetrics()
        self.counters = defaultdict(int)
        self.invalid: dict[str, str] = {}  # pod key -> why it cannot be scheduled (bad spec)
        self._inbox: list[tuple[int, list[Handoff]]] = []
        self._inbox_lock = threading.Lock()
        # the loop thread mutates the state below; Ray calls (status, ...) read it from other threads
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._last_health = 0.0
        self.last_error = ""
        self.replaced = 0

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        """Create the shards, list the cluster and hand every shard its nodes and pods."""
        for i in range(len(self.shards), self.num_shards):
            member = f"shard-{i}@1"
            self.shards.append(ShardRef(i, member, self.shard_factory(i, member)))
        self.routed = np.zeros(len(self.shards), np.int64)
        self.relist()

    def relist(self) -> None:
        """List nodes and pods and rebuild everything from them (start, and after 410 Gone)."""
        nodes, _ = self.cluster.ask("list_nodes")
        pods, rv = self.cluster.ask("list_pods")
        self.table = NodeTable()
        self.schedulers = build_schedulers(self.config, self.table, seed=0)
        self.default = next(iter(self.schedulers.values()))
        self.bound_on.clear()
        infos = []
        for obj in nodes:
            try:
                infos.append(NodeInfo.from_object(obj))
            except InvalidObjectError as e:
                log.error("node %s ignored: %s", (obj.get("metadata") or {}).get("name"), e)
        self.table.add_nodes(infos)
        self._repartition(infos)
        for s in self.shards:
            mine = [n.obj for n in infos if self.owners.get(n.name) == s.index]
            s.remote.call("set_epoch", self.epoch)
            s.remote.call("apply_nodes", mine, [])
        self._handle_pods([("ADDED", obj) for obj in pods])
        self.rv = rv

    def _repartition(self, infos: list[NodeInfo]) -> None:
        ids = [f"shard-{s.index}" for s in self.shards]
        by_id = {f"shard-{s.index}": s.index for s in self.shards}
        owners = {name: by_id[sid] for name, sid in assign([n.name for n in infos], ids).items()}
        self.owners = owners
        self.epoch = max(self.epoch, self.ledger.epoch()) + 1
        entries = [NodeEntry(n.name, n.allocatable, self.shards[owners[n.name]].member) for n in infos]
        self.ledger.upsert_nodes(entries)
        self.ledger.set_owners({n.name: self.shards[owners[n.name]].member for n in infos}, self.epoch)
        self._owner_slots()

    def _owner_slots(self) -> None:
        arr = np.full(self.table.n, -1, np.int32)
        for name, slot in self.table.index.items():
            arr[slot] = self.owners.get(name, -1)
        self.owner_slots = arr

    # ------------------------------------------------------------------ the loop
    def run_forever(self) -> None:
        """Poll the watch, rebalance, check health; each step logs its own errors and goes on."""
        while not self._stop.is_set():
            try:
                busy = self.step()
            except Exception as e:  # noqa: BLE001 - the control loop never dies
                self.last_error = f"{type(e).__name__}: {e}"
                log.exception("coordinator step failed")
                busy = False
            if not busy:
                self._stop.wait(self.poll_s)

    def stop(self) -> None:
        self._stop.set()

    def step(self) -> bool:
        with self._lock:
            busy = self.poll_watch()
            busy = self.rebalance() or busy
        if time.monotonic() - self._last_health >= self.health_period_s:
            self._last_health = time.monotonic()
            self.check_health()
        return busy

    def poll_watch(self) -> bool:
        from shardsched.sim.errors import Gone

        try:
            events, rv = self.cluster.ask("events_since", self.rv, None, 20000)
        except Gone:
            log.warning("watch history compacted; relisting")
            self.relist()
            return True
        except RemoteUnavailable as e:
            self.last_error = f"cluster unavailable: {e}"
            return False
        if not events:
            self.rv = rv
            return False
        node_events = [(e.type, e.object) for e in events if e.kind == "Node"]
        pod_events = [(e.type, e.object) for e in events if e.kind == "Pod"]
        if node_events:
            self._handle_nodes(node_events)
        if pod_events:
            self._handle_pods(pod_events)
        self.rv = rv
        return True

    # ------------------------------------------------------------------ watch handling
    def _handle_nodes(self, events: list[tuple[str, dict]]) -> None:
        upserts: dict[int, list[dict]] = defaultdict(list)
        removals: dict[int, list[str]] = defaultdict(list)
        new_infos, entries = [], []
        for typ, obj in events:
            name = (obj.get("metadata") or {}).get("name")
            if typ == "DELETED":
                self.table.remove_node(name)
                owner = self.owners.pop(name, None)
                if owner is not None:
                    removals[owner].append(name)
                continue
            try:
                info = NodeInfo.from_object(obj)
            except InvalidObjectError as e:
                log.error("node %s ignored: %s", name, e)
                continue
            self.table.add_node(info)
            if name not in self.owners:
                new_infos.append(info)
            else:
                entries.append(NodeEntry(name, info.allocatable, None))
                upserts[self.owners[name]].append(obj)
        if new_infos:
            ids = [f"shard-{s.index}" for s in self.shards]
            for name, sid in assign([n.name for n in new_infos], ids).items():
                self.owners[name] = int(sid.split("-")[1])
            for info in new_infos:
                owner = self.owners[info.name]
                entries.append(NodeEntry(info.name, info.allocatable, self.shards[owner].member))
                upserts[owner].append(info.obj)
        try:
            if entries:
                self.ledger.upsert_nodes(entries)
            gone = [n for ns in removals.values() for n in ns]
            if gone:
                self.ledger.remove_nodes(gone)
        except TemporaryError as e:
            self.last_error = f"ledger unavailable: {e}"
        self._owner_slots()
        for index in set(upserts) | set(removals):
            self.shards[index].remote.call("apply_nodes", upserts.get(index, []), removals.get(index, []))
        for s in self.shards:
            s.remote.call("nudge", "NodeUpdate")

    def _handle_pods(self, events: list[tuple[str, dict]]) -> None:
        # pending pods first seen in this batch, routed after it: a later event of the same batch
        # (deleted, bound by someone else, updated) replaces or cancels the entry
        new: dict[str, PodInfo] = {}
        observe: list[BoundPod] = []
        forget: dict[str, str] = {}
        adds: dict[int, list] = defaultdict(list)
        removes: dict[int, list[str]] = defaultdict(list)
        unqueue: dict[int, list[str]] = defaultdict(list)
        for typ, obj in events:
            meta = obj.get("metadata") or {}
            spec = obj.get("spec") or {}
            uid = meta.get("uid") or f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
            node = spec.get("nodeName") or ""
            phase = (obj.get("status") or {}).get("phase") or "Pending"
            terminal = phase in ("Succeeded", "Failed")
            if typ == "DELETED" or (node and terminal):
                new.pop(uid, None)
                if typ == "DELETED":
                    self.invalid.pop(f"{meta.get('namespace') or 'default'}/{meta.get('name')}", None)
                old = self.bound_on.pop(uid, None)
                if old is not None:
                    self.table.remove_pod(uid)
                    forget[uid] = old
                    if old in self.owners:
                        removes[self.owners[old]].append(uid)
                t = self.pending.pop(uid, None)
                if t is not None:
                    unqueue[t.shard].append(t.pod.key)
                    self._unroute(t.shard)
                continue
            if node:
                new.pop(uid, None)
                if self.bound_on.get(uid) == node:
                    continue
                t = self.pending.pop(uid, None)
                if t is not None:
                    pod = t.pod  # parsed when it was routed; the spec cannot change once bound
                else:
                    try:
                        pod = PodInfo.from_object(obj)
                    except InvalidObjectError as e:
                        log.error("bound pod %s/%s has an invalid spec (%s); not counted",
                                  meta.get("namespace"), meta.get("name"), e)
                        continue
                self.bound_on[uid] = node
                usage = PodUsage.of(pod)
                self.table.add_pod(usage, node)
                observe.append(BoundPod(uid, node, pod.requests))
                if node in self.owners:
                    adds[self.owners[node]].append((usage, node))
                if t is not None:
                    self._unroute(t.shard)
                    self.counters["bound"] += 1
                    if t.shard != self.owners.get(node):
                        unqueue[t.shard].append(t.pod.key)
                continue
            if uid in self.pending or meta.get("deletionTimestamp") or terminal:
                continue
            if (spec.get("schedulerName") or "default-scheduler") not in self.profiles:
                continue
            try:
                new[uid] = PodInfo.from_object(obj)
            except InvalidObjectError as e:
                key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
                if key not in self.invalid:
                    self.invalid[key] = str(e)
                    self._fail_pod(obj, f"invalid pod spec: {e}")
        try:
            if observe:
                self.ledger.observe(observe)
            if forget:
                self.ledger.forget(forget)
        except TemporaryError as e:
            self.last_error = f"ledger unavailable: {e}"  # reconciled on the next relist
        for index, items in adds.items():
            self.shards[index].remote.call("apply_bound", items, [])
        for index, uids in removes.items():
            self.shards[index].remote.call("apply_bound", [], uids)
        for index, keys in unqueue.items():
            self.shards[index].remote.call("remove_pods", keys)
        if new:
            self.route(list(new.values()))

    # ------------------------------------------------------------------ routing
    def _unroute(self, shard: int) -> None:
        if 0 <= shard < len(self.routed) and self.routed[shard] > 0:
            self.routed[shard] -= 1

    def _shard_counts(self, pod: PodInfo) -> tuple[np.ndarray, np.ndarray]:
        """(nodes where the pod fits now, nodes passing its static filters) per shard."""
        sched = self.schedulers.get(pod.scheduler_name, self.default)
        static_ok, feasible = sched.feasible_mask(pod)
        owner = self.owner_slots[: len(feasible)]
        k = len(self.shards)
        fits = np.bincount(owner[feasible & (owner >= 0)], minlength=k)[:k]
        static = np.bincount(owner[static_ok & (owner >= 0)], minlength=k)[:k]
        return fits, static

    def _choose(self, fits: np.ndarray, static: np.ndarray, exclude: set[int] = frozenset()) -> int | None:
        alive = np.array([s.alive for s in self.shards], bool)
        ok = alive & (fits > 0)
        for i in exclude:
            ok[i] = False
        if not ok.any():
            return None
        # most room per pod already routed there: spreads a burst in proportion to capacity
        weight = np.where(ok, fits / (1.0 + self.routed), -1.0)
        return int(np.argmax(weight))

    def route(self, pods: list[PodInfo]) -> None:
        """Send pending pods to shards (grouped into one call per shard)."""
        by_shard: dict[int, list[PodInfo]] = defaultdict(list)
        counts_cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for pod in pods:
            counts = counts_cache.get(pod.signature)
            if counts is None:
                counts = counts_cache[pod.signature] = self._shard_counts(pod)
            fits, static = counts
            target = self._choose(fits, static)
            if target is None:  # fits nowhere now: the shard with most matching nodes reports why
                target = int(np.argmax(static)) if static.any() else 0
            self.pending[pod.uid] = Tracked(pod, target)
            self.routed[target] += 1
            by_shard[target].append(_slim(pod))
        for index, items in by_shard.items():
            self.shards[index].remote.call("add_pods", items)
        self.counters["routed"] += len(pods)

    # ------------------------------------------------------------------ rebalancer
    def handoff(self, shard: int, items: list[Handoff]) -> None:
        """Called by shards (fire and forget): pods they cannot place now."""
        with self._inbox_lock:
            self._inbox.append((shard, items))

    def rebalance(self) -> bool:
        with self._inbox_lock:
            inbox, self._inbox = self._inbox, []
        if not inbox:
            return False
        forward: dict[int, list[PodInfo]] = defaultdict(list)
        park: dict[int, list] = defaultdict(list)
        retry: dict[int, list] = defaultdict(list)
        for shard, items in inbox:
            for h in items:
                pod = h.qpi.pod_info
                t = self.pending.get(pod.uid)
                if t is None:  # bound or deleted meanwhile
                    continue
                t.unschedulable = False
                self.metrics.requeues.labels(h.reason).inc()
                self.counters["requeues"] += 1
                if h.reason == FENCED:
                    t.tried.clear()
                elif h.reason != BIND_CONFLICT:  # a rejected bind says nothing about the shard's room
                    t.tried.add(shard)
                fits, static = self._shard_counts(pod)
                target = self._choose(fits, static, exclude=t.tried)
                self._unroute(t.shard)
                if target is not None:
                    t.shard = target
                    self.routed[target] += 1
                    forward[target].append(pod)
                    continue
                # No shard left to try in this round. If the coordinator's own view still sees
                # room, the shards' views are behind the watch: retry after a backoff, no attempt
                # is counted. Otherwise the round is one failed attempt (kube's FailureHandler).
                t.tried.clear()
                result = self.schedulers.get(pod.scheduler_name, self.default).schedule(pod, assume=False)
                if result.node is not None and self.owners.get(result.node) is not None:
                    target = self.owners[result.node]
                    t.shard = target
                    self.routed[target] += 1
                    retry[target].append(h.qpi)
                    continue
                t.rounds += 1
                t.unschedulable = True
                target = int(np.argmax(static)) if static.any() else shard
                if not self.shards[target].alive:
                    target = next((s.index for s in self.shards if s.alive), shard)
                t.shard = target
                self.routed[target] += 1
                self._record_unschedulable(t, result.status.message)
                park[target].append(h.qpi)
        for index, qpis in retry.items():
            self.shards[index].remote.call("accept", qpis, False)
        for index, pods in forward.items():
            self.shards[index].remote.call("add_pods", pods)
        for index, qpis in park.items():
            self.shards[index].remote.call("accept", qpis, True)
        return True

    def _record_unschedulable(self, t: Tracked, message: str) -> None:
        """PodScheduled=False and a FailedScheduling Event with kube's message over all nodes; after
        maxSchedulingAttempts rounds, the alert metric and a Warning event as well."""
        pod = t.pod
        t.message = message
        ref = {"kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.uid}
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
        self.cluster.call("record_event", ref, "Warning", "FailedScheduling", message)
        self.cluster.call("set_pod_condition", pod.namespace, pod.name, condition)
        self.counters["unschedulable_attempts"] += 1
        if t.rounds >= self.config.max_scheduling_attempts and not t.gave_up:
            t.gave_up = True
            self.metrics.unschedulable_alerts.inc()
            self.counters["gave_up"] += 1
            self.cluster.call("record_event", ref, "Warning", "FailedScheduling",
                              f"gave up after {t.rounds} scheduling attempts: {message}")

    def _fail_pod(self, obj: dict, message: str) -> None:
        meta = obj.get("metadata") or {}
        ref = {"kind": "Pod", "namespace": meta.get("namespace") or "default", "name": meta.get("name"), "uid": meta.get("uid")}
        self.cluster.call("record_event", ref, "Warning", "FailedScheduling", message)
        self.cluster.call("set_pod_condition", ref["namespace"], ref["name"],
                          {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message})
        self.counters["invalid"] += 1

    # ------------------------------------------------------------------ health
    def check_health(self) -> None:
        """Ping every shard (outside the state lock: a ping may take its whole timeout); replace a
        shard that failed `health_failures` checks in a row."""
        for s in list(self.shards):
            try:
                s.remote.ask("ping", timeout_s=2.0)
                s.failures = 0
            except RemoteUnavailable as e:
                s.failures += 1
                log.warning("shard %s did not answer (%d/%d): %s", s.member, s.failures, self.health_failures, e)
                if s.failures >= self.health_failures:
                    with self._lock:
                        self.replace_shard(s.index)

    def replace_shard(self, index: int) -> None:
        """Start a new incarnation of shard ``index``: it gets a new member id, the epoch is bumped
        (the old incarnation is fenced off), its nodes, the bound pods on them and its pending pods."""
        old = self.shards[index]
        member = f"shard-{index}@{old.incarnation + 1}"
        remote = self.shard_factory(index, member)
        ref = ShardRef(index, member, remote, old.incarnation + 1)
        self.shards[index] = ref
        mine = [n for n, o in self.owners.items() if o == index]
        self.epoch = max(self.epoch, self.ledger.epoch()) + 1
        self.ledger.set_owners({n: member for n in mine}, self.epoch)
        for s in self.shards:
            s.remote.call("set_epoch", self.epoch)
        nodes = [self.table.nodes[self.table.index[n]].obj for n in mine if n in self.table.index]
        remote.call("apply_nodes", nodes, [])
        bound = [(u, n) for n in mine if n in self.table.index for u in self.table.pods[self.table.index[n]].values()]
        remote.call("apply_bound", bound, [])
        pods = [_slim(t.pod) for t in self.pending.values() if t.shard == index]
        if pods:
            remote.call("add_pods", pods)
        self.replaced += 1
        log.warning("shard %d replaced by %s (epoch %d): %d nodes, %d pending pods", index, member, self.epoch, len(mine), len(pods))

    # ------------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        with self._lock:
            return self._status()

    def _status(self) -> dict[str, Any]:
        unsched = sum(1 for t in self.pending.values() if t.unschedulable)
        return {
            "nodes": self.table.num_nodes, "shards": len(self.shards), "epoch": self.epoch,
            "pending": len(self.pending), "unschedulable": unsched,
            "gave_up": self.counters["gave_up"], "bound_seen": self.counters["bound"],
            "routed": self.counters["routed"], "requeues": self.counters["requeues"],
            "invalid": len(self.invalid), "replaced_shards": self.replaced, "last_error": self.last_error,
        }

    def unschedulable_reasons(self) -> dict[str, int]:
        """Message -> number of pending pods whose last round ended unschedulable."""
        out: dict[str, int] = defaultdict(int)
        with self._lock:
            for t in self.pending.values():
                if t.unschedulable:
                    out[t.message] += 1
        return dict(out)

    def pending_keys(self) -> list[str]:
        with self._lock:
            return [t.pod.key for t in self.pending.values()]

    def shard_remotes(self) -> list[Remote]:
        return [s.remote for s in self.shards]

    def kill_shard(self, index: int) -> None:
        """For chaos tests and demos: kill the shard's actor process (SIGKILL through Ray)."""
        import ray

        target = self.shards[index].remote
        if target.is_actor:
            ray.kill(target.target, no_restart=True)
