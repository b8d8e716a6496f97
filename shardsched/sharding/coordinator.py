"""Coordinator: partitions nodes into shards, routes pods, rebalances, watches shard health.

It consumes the cluster's watch (list, then events from the list's resourceVersion; relist on 410):

- nodes are assigned to shards by rendezvous hashing with bounded loads (even shards; a relist
  keeps the owners of the nodes still there); the shard map is published in the Redis
  ledger with an epoch (the reserve script fences off a shard that no longer owns a node);
- pending pods whose ``schedulerName`` is one of the profiles pass their profile's PreEnqueue plugins
  first (`_pre_enqueue`): a pod with ``spec.schedulingGates`` waits here, gated (not routed, no
  attempt, no FailedScheduling Event), until an update removes its last gate;
- pending pods that may be queued are routed to a shard owning nodes
  where they fit (label- and capacity-aware, from the coordinator's own NodeTable of the whole
  cluster): to the shard whose emptiest nodes stay emptiest once the pods already routed to it
  are placed (`_Room`), so that pods spread over all nodes as LeastAllocated spreads them; for a
  profile that packs (NodeResourcesFit's MostAllocated, or a RequestedToCapacityRatio shape that
  rises with utilization), to the shard whose fullest node with room is fullest, so that pods
  fill nodes in the order kube-scheduler would fill them over the whole cluster;
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

The shard count changes at run time with `Coordinator.scale` (``shardsched scale``, ``shardsched run
--scale-at``) or the optional autoscaler (`enable_autoscaler`, policy in
`shardsched.sharding.scaling`): rendezvous hashing moves about the ideal share of the nodes, the new
owners are published with a bumped epoch before anything else (a stale owner is fenced off at
once), and queued pods are drained and routed again; see `scale`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from shardsched.api.objects import NodeInfo, PodInfo
from shardsched.api.podaffinity import namespace_labels_of
from shardsched.api.quantity import CPU, MEMORY
from shardsched.cache.node_table import NodeTable, PodUsage
from shardsched.config import SchedulerConfiguration
from shardsched.errors import InvalidObjectError, TemporaryError
from shardsched.metrics import ShardMetrics
from shardsched.scheduler.algorithm import GenericScheduler, ScheduleResult, fit_error_message
from shardsched.scheduler.whatif import build_schedulers
from shardsched.queue import GATED, QueuedPodInfo
from shardsched.sharding.hashing import assign, moved_fraction
from shardsched.sharding.protocols import BIND_CONFLICT, FENCED, UNSCHEDULABLE_HERE, Handoff
from shardsched.sharding.remote import Remote, RemoteDead, RemoteUnavailable
from shardsched.sharding.scaling import Autoscaler, AutoscalerOptions, Load, ScaleStep, ideal_moved_fraction
from shardsched.sharding.shard import yield_writes_to_binds
from shardsched.store.ledger import BoundPod, Ledger, NodeEntry

log = logging.getLogger(__name__)

#: watch events taken per poll: enough to amortize the call, few enough that decoding a burst's
#: events does not balloon the coordinator's memory (a Python heap rarely shrinks back)
WATCH_BATCH = 4000

#: `Tracked.shard` of a pod whose shard was removed while the pod was in its last batch (see `scale`)
LIMBO = -1

#: the condition kube's API server gives a pod created with scheduling gates (its pod strategy's
#: ``applySchedulingGatedCondition``), unless the pod already has a PodScheduled condition
SCHEDULING_GATED_CONDITION = {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
                              "message": "Scheduling is blocked due to non-empty scheduling gates"}


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



def _parse_namespace(obj: dict) -> tuple[str, dict[str, str]] | None:
    """(name, labels) of a Namespace object (`namespace_labels_of`); one without a name is logged
    and gives None."""
    try:
        return namespace_labels_of(obj)
    except InvalidObjectError as e:
        log.error("namespace ignored: %s", e)
        return None


def _namespace_labels(objs: Iterable[dict]) -> dict[str, dict[str, str]]:
    """Namespace name -> labels of listed Namespace objects (`_parse_namespace`)."""
    return dict(filter(None, map(_parse_namespace, objs)))


def _slim(pod: PodInfo) -> PodInfo:
    """The pod as sent to shards: the raw object reduced to its annotations (creation time)."""
    ann = (pod.obj.get("metadata") or {}).get("annotations")
    slim = PodInfo(**{f: getattr(pod, f) for f in PodInfo.__dataclass_fields__ if f != "obj"})
    slim.obj = {"metadata": {"annotations": ann}} if ann else {}
    return slim


def _assign(names: list[str], indices: Iterable[int], owned: Mapping[int, int] | None = None) -> dict[str, int]:
    """`shardsched.sharding.hashing.assign` over the shard ids ``shard-<index>``: node -> shard
    index (``owned``: shard index -> nodes it keeps)."""
    ids = {f"shard-{i}": i for i in indices}
    kept = {f"shard-{i}": n for i, n in (owned or {}).items()}
    return {name: ids[sid] for name, sid in assign(names, list(ids), kept).items()}


class _Room:
    """Where a pod (one signature) fits in each shard, for routing: the free shares (LeastAllocated's
    0..1) of the shard's nodes where it fits, and what one such pod takes of a node (``cost``).

    ``level(shard, routed)`` ranks the shards for the next pod, once ``routed`` pods like this
    one are placed on the shard's nodes the way the profile's scoring places them; the coordinator
    routes to the highest. Spreading (LeastAllocated, the default): the free share of the shard's
    emptiest nodes, each pod going onto the emptiest node (water filling: the top nodes are
    brought down to a common level, and the pods' total cost, ``routed * cost``, is the volume
    taken off them); with nothing routed, the shard's emptiest node. Packing (``holds`` given,
    per shard how many such pods each of its nodes where the pod fits has room for, from the
    pod's requests: MostAllocated): minus the free share of the fullest node that still has room,
    each pod going onto the fullest node where it fits; below -1 once the shard's nodes are
    full. Routing pod by pod
    to the highest level then follows the cluster-wide order in which kube-scheduler's scoring
    would place them. O(log nodes) per call after O(nodes log nodes) set-up.
    """

    def __init__(self, shares: list[np.ndarray], cost: float, holds: list[np.ndarray] | None = None) -> None:
        self.cost = cost
        self.packing = holds is not None
        self.fits = np.array([len(f) for f in shares], np.int64)
        self._desc: list[np.ndarray] = []
        self._sums: list[np.ndarray] = []
        self._needs: list[np.ndarray] = []
        for i, f in enumerate(shares):
            if holds is not None:  # fullest first, with the running sum of the pods they hold
                order = np.argsort(f, kind="stable")
                self._desc.append(f[order])
                self._sums.append(np.cumsum(holds[i][order]))
                continue
            d = np.sort(f)[::-1]
            sums = np.cumsum(d)
            self._desc.append(d)
            self._sums.append(sums)
            # volume that brings the top k nodes down to the k-th's share (non-decreasing in k)
            self._needs.append(sums - np.arange(1, len(d) + 1) * d)

    def level(self, shard: int, routed: int) -> float:
        """The shard's rank for the next pod after ``routed`` pods (class docstring); -inf when it
        fits nowhere."""
        d = self._desc[shard]
        if not len(d):
            return -np.inf
        if self.packing:
            holds = self._sums[shard]
            j = int(np.searchsorted(holds, routed, side="right"))
            if j >= len(d):  # every node estimated full: the least overfull shard ranks first
                return -1.0 - (routed - float(holds[-1]) + 1) * self.cost
            placed = routed - (float(holds[j - 1]) if j else 0.0)  # already on node j
            return -float(d[j] - placed * self.cost)
        volume = routed * self.cost
        if volume <= 0:
            return float(d[0])
        k = max(1, int(np.searchsorted(self._needs[shard], volume, side="right")))
        return float((self._sums[shard][k - 1] - volume) / k)


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
        # its FailedScheduling Events and conditions yield to the shards' binds too
        if not cluster.is_actor:
            yield_writes_to_binds(cluster.target, ledger)
        self.shard_factory = shard_factory
        self.health_period_s = health_period_s
        self.health_failures = health_failures
        self.poll_s = poll_s
        self.profiles = {p.scheduler_name for p in config.profiles}
        self.table = NodeTable()
        self.schedulers: dict[str, GenericScheduler] = build_schedulers(config, self.table, seed=0, partial_view=True)
        self.default = next(iter(self.schedulers.values()))
        #: the same profiles over the whole cluster, to nominate nodes (`_nominate`)
        self.cluster_schedulers = build_schedulers(config, self.table, seed=0)
        self.shards: list[ShardRef] = []
        self.owners: dict[str, int] = {}
        self.owner_slots = np.zeros(0, np.int32)
        self.epoch = 0
        self.rv = 0
        #: called after every relist (start, 410 Gone), when the cluster has just been loaded: the
        #: hosts of a process of its own freeze it out of the collector there (`shardsched.gctune`)
        self.on_relist: Callable[[], None] | None = None
        self.pending: dict[str, Tracked] = {}  # uid -> tracked pending pod
        self.bound_on: dict[str, str] = {}  # uid -> node, pods counted in the table
        #: uid -> node: pending pods assumed in the table on the node nominated for them (`_nominate`)
        self.nominated: dict[str, str] = {}
        self.routed = np.zeros(0, np.int64)  # pods routed per shard and not yet bound
        self.metrics = ShardMetrics()
        self.counters = defaultdict(int)
        self.invalid: dict[str, str] = {}  # pod key -> why it cannot be scheduled (bad spec)
        self.gated: dict[str, str] = {}  # uid -> pod key, pods a PreEnqueue plugin keeps out of the queue
        self._inbox: list[tuple[int, list[Handoff]]] = []
        self._inbox_lock = threading.Lock()
        # the loop thread mutates the state below; Ray calls (status, ...) read it from other threads
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._last_health = 0.0
        self._health_thread: threading.Thread | None = None  # `run_forever` checks health there
        self.last_error = ""
        self.replaced = 0
        # run-time scaling (`scale`, `enable_autoscaler`)
        self.autoscaler: Autoscaler | None = None
        self.scale_steps: list[ScaleStep] = []
        self.retired_stats: list[Any] = []  # ShardStats of removed shards, for the run's report
        #: how long `scale` waits for a new shard to answer (Ray's autoscaler may have to add a node)
        self.shard_start_timeout_s = 300.0
        #: how long a removed shard may take to end its batch in flight
        self.retire_timeout_s = 30.0
        #: after this, pods of a removed shard whose fate has not arrived are routed again
        self.handover_grace_s = 5.0
        self._limbo: dict[str, float] = {}  # uid -> time.monotonic() when it is routed again
        self._last_incarnation: dict[int, int] = {}  # index -> incarnation of its removed shard
        self._scale_lock = threading.Lock()  # one scale step at a time
        self._last_autoscale = 0.0
        self.ledger_rebuilds = 0
        self._ledger_instance: str | None = None  # Redis run id the ledger was written to
        # what the watch showed and the ledger has not taken yet (Redis away): node upserts (None:
        # removal), pods bound (observe), pods gone (forget); written by `_flush_ledger`
        self._owed_nodes: dict[str, NodeEntry | None] = {}
        self._owed_observe: dict[str, BoundPod] = {}
        self._owed_forget: dict[str, str] = {}

    # ------------------------------------------------------------------ start
    def adopt(self, shards: Mapping[int, tuple[str, Remote]]) -> None:
        """Take over the running shards of a previous coordinator (index -> (member, `Remote`));
        call before `start`, which creates the missing ones and lists the cluster again (epoch
        bumped, every pending pod routed again). Each shard must already hand its pods to this
        coordinator (`Shard.adopt`). A missing index gets a new incarnation, numbered after every
        member the ledger's shard map still names for it, so a zombie of it stays fenced off."""
        if not shards:
            return
        try:
            known = set(self.ledger.owners().values())
        except TemporaryError:
            known = set()
        self.num_shards = max(self.num_shards, max(shards) + 1)
        self.shards = []
        for i in range(self.num_shards):
            if i in shards:
                member, remote = shards[i]
                self.shards.append(ShardRef(i, member, remote, int(member.rsplit("@", 1)[1])))
                continue
            seen = [int(m.rsplit("@", 1)[1]) for m in known if m.startswith(f"shard-{i}@")]
            incarnation = max(seen, default=0) + 1
            member = f"shard-{i}@{incarnation}"
            self.shards.append(ShardRef(i, member, self.shard_factory(i, member), incarnation))
        log.warning("adopted %d running shards: %s", len(shards), ", ".join(m for m, _ in shards.values()))

    def start(self) -> None:
        """Create the shards, wait until each answers a ping (a shard actor's process must start
        and import first: about a second and a half, `shard_start_timeout_s` at most), then list
        the cluster and hand every shard its nodes and pods. So when this returns the shards are
        scheduling: a caller that times the scheduler from here (``serve --bench``) does not count
        the processes' start-up as scheduling time, and ``/readyz`` is not ready before them.

        Raises: `RemoteUnavailable` when a shard does not answer in time (its actor died at start).
        """
        for i in range(len(self.shards), self.num_shards):
            member = f"shard-{i}@1"
            self.shards.append(ShardRef(i, member, self.shard_factory(i, member)))
        for ref in self.shards:
            ref.remote.ask("ping", timeout_s=self.shard_start_timeout_s)
        self.routed = np.zeros(len(self.shards), np.int64)
        self.relist()

    def relist(self) -> None:
        """List nodes and pods and rebuild everything from them (start, and after 410 Gone)."""
        nodes, _ = self.cluster.ask("list_nodes")
        pods, rv = self.cluster.ask("list_pods")
        self.table = NodeTable()
        self.schedulers = build_schedulers(self.config, self.table, seed=0, partial_view=True)
        self.default = next(iter(self.schedulers.values()))
        self.cluster_schedulers = build_schedulers(self.config, self.table, seed=0)
        self.nominated.clear()
        self.bound_on.clear()
        self.gated.clear()  # the list shows every gated pod again
        infos = []
        for obj in nodes:
            try:
                infos.append(NodeInfo.from_object(obj))
            except InvalidObjectError as e:
                log.error("node %s ignored: %s", (obj.get("metadata") or {}).get("name"), e)
        self.table.add_nodes(infos)
        namespaces, _ = self.cluster.ask("list_namespaces")
        self.table.set_namespaces(_namespace_labels(namespaces), replace=True)
        self._ledger_instance = self.ledger.instance_id()  # the Redis the map is written to
        gone = self._repartition(infos)
        for s in self.shards:
            mine = [n.obj for n in infos if self.owners.get(n.name) == s.index]
            s.remote.call("set_epoch", self.epoch)
            s.remote.call("apply_namespaces", self.table.namespace_labels, [], True)
            s.remote.call("apply_nodes", mine, gone.get(s.index, []))
        self._handle_pods([("ADDED", obj) for obj in pods])
        self.rv = rv
        if self.on_relist is not None:
            self.on_relist()

    def _assign_new(self, names: list[str]) -> dict[str, int]:
        """Owners (shard index) for nodes joining, counting the nodes each shard already owns."""
        return _assign(names, [s.index for s in self.shards], Counter(self.owners.values()))

    def _repartition(self, infos: list[NodeInfo]) -> dict[int, list[str]]:
        """Owners of ``infos`` (the listed nodes), published in the ledger under a new epoch. At the
        first list the whole map is computed; at a relist (after 410 Gone) the nodes still there
        keep their owners, new ones are placed as `_handle_nodes` places them, and nodes that are
        gone are returned per owner index (their shards must drop them)."""
        listed = {n.name for n in infos}
        gone: dict[int, list[str]] = defaultdict(list)
        for name, index in self.owners.items():
            if name not in listed:
                gone[index].append(name)
        self.owners = {name: index for name, index in self.owners.items() if name in listed}
        self.owners.update(self._assign_new([n.name for n in infos if n.name not in self.owners]))
        owners = self.owners
        self.epoch = max(self.epoch, self.ledger.epoch()) + 1
        entries = [NodeEntry(n.name, n.allocatable, self.shards[owners[n.name]].member) for n in infos]
        self.ledger.upsert_nodes(entries)
        self.ledger.set_owners({n.name: self.shards[owners[n.name]].member for n in infos}, self.epoch)
        if gone:
            self.ledger.remove_nodes([name for names in gone.values() for name in names])
        self._owner_slots()
        return gone

    def _owner_slots(self) -> None:
        arr = np.full(self.table.n, -1, np.int32)
        for name, slot in self.table.index.items():
            arr[slot] = self.owners.get(name, -1)
        self.owner_slots = arr

    # ------------------------------------------------------------------ the loop
    def run_forever(self) -> None:
        """Poll the watch, rebalance, check health; each step logs its own errors and goes on.
        Health checks run in a thread of their own: a hung shard's pings wait out their timeout,
        which must not hold up the watch and the routing for every other shard."""
        self._health_thread = threading.Thread(target=self._health_loop, name="coordinator-health", daemon=True)
        self._health_thread.start()
        while not self._stop.is_set():
            try:
                busy = self.step()
            except Exception as e:  # noqa: BLE001 - the control loop never dies
                self.last_error = f"{type(e).__name__}: {e}"
                log.exception("coordinator step failed")
                busy = False
            if not busy:
                self._stop.wait(self.poll_s)

    def _health_loop(self) -> None:
        while not self._stop.wait(self.health_period_s):
            try:
                self.check_health()
                self.check_ledger()
            except Exception as e:  # noqa: BLE001 - the health loop never dies
                self.last_error = f"health check: {type(e).__name__}: {e}"
                log.exception("coordinator health check failed")

    def stop(self) -> None:
        self._stop.set()

    def catch_up(self) -> None:
        """Apply every watch event the cluster has sent so far (`poll_watch` until it finds none),
        so that `status` and `pending_keys` describe the cluster as it is: pods created since the
        last poll are tracked, bound ones forgotten. For a report after `stop` (the shards no
        longer bind, so this ends); a cluster that does not answer ends it too."""
        with self._lock:
            while self.poll_watch():
                pass

    def step(self) -> bool:
        with self._lock:
            busy = self.poll_watch()
            busy = self.rebalance() or busy
            self._sweep_limbo()
        if self._health_thread is None and time.monotonic() - self._last_health >= self.health_period_s:
            self._last_health = time.monotonic()
            self.check_health()
            self.check_ledger()
        if self.autoscaler is not None and time.monotonic() - self._last_autoscale >= self.autoscaler.options.period_s:
            self._last_autoscale = time.monotonic()
            self.autoscale()
        return busy

    def poll_watch(self) -> bool:
        from shardsched.cluster import Gone

        try:
            events, rv = self.cluster.ask("events_since", self.rv, None, WATCH_BATCH)
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
        namespace_events = [(e.type, e.object) for e in events if e.kind == "Namespace"]
        if namespace_events:
            self._handle_namespaces(namespace_events)
        if node_events:
            self._handle_nodes(node_events)
        if pod_events:
            self._handle_pods(pod_events)
        self.rv = rv
        return True

    # ------------------------------------------------------------------ watch handling
    def _handle_namespaces(self, events: list[tuple[str, dict]]) -> None:
        """Namespaces created, relabelled or deleted: their labels decide which namespaces a pod
        affinity term's ``namespaceSelector`` selects, here and in every shard (`Shard.apply_namespaces`)."""
        last: dict[str, tuple[str, dict[str, str]]] = {}  # only a namespace's last event of the poll counts
        for typ, obj in events:
            parsed = _parse_namespace(obj)
            if parsed is not None:
                last[parsed[0]] = (typ, parsed[1])
        upserts = {name: labels for name, (typ, labels) in last.items() if typ != "DELETED"}
        removed = [name for name, (typ, _) in last.items() if typ == "DELETED"]
        if not self.table.set_namespaces(upserts, removed):
            return
        for s in self.shards:
            s.remote.call("apply_namespaces", upserts, removed, False)

    def _handle_nodes(self, events: list[tuple[str, dict]]) -> None:
        # Only a node's last event of the poll counts: a node deleted and created again under the
        # same name is an update (its shard and the ledger keep it), and one created and deleted
        # is never placed.
        last: dict[object, tuple[str, dict]] = {}
        for typ, obj in events:
            key = (obj.get("metadata") or {}).get("name") or id(obj)
            last.pop(key, None)
            last[key] = (typ, obj)
        upserts: dict[int, list[dict]] = defaultdict(list)
        removals: dict[int, list[str]] = defaultdict(list)
        new_infos, entries = [], []
        for typ, obj in last.values():
            name = (obj.get("metadata") or {}).get("name")
            if typ == "DELETED":
                self.table.remove_node(name, keep_pods=True)  # its pods count again if it comes back
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
            self.owners.update(self._assign_new([n.name for n in new_infos]))
            for info in new_infos:
                owner = self.owners[info.name]
                entries.append(NodeEntry(info.name, info.allocatable, self.shards[owner].member))
                upserts[owner].append(info.obj)
        for entry in entries:
            queued = self._owed_nodes.get(entry.name)
            keep_owner = entry.owner is None and queued is not None and queued.owner is not None
            self._owed_nodes[entry.name] = NodeEntry(entry.name, entry.allocatable, queued.owner) if keep_owner else entry
        for name in (n for ns in removals.values() for n in ns):
            self._owed_nodes[name] = None
        self._flush_ledger()
        self._owner_slots()
        for index in set(upserts) | set(removals):
            self.shards[index].remote.call("apply_nodes", upserts.get(index, []), removals.get(index, []))
        # A node deleted and created again under the same name while pods were still bound to it:
        # the table counted them again (orphans); its owner shard must count them too.
        for info in new_infos:
            slot = self.table.index.get(info.name)
            back = [(usage, info.name) for usage in self._bound_usages(slot)] if slot is not None else []
            if back:
                self.shards[self.owners[info.name]].remote.call("apply_bound", back, [])
        for s in self.shards:
            s.remote.call("move_all_to_active_or_backoff_queue", "NodeUpdate")

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
                self._unnominate(uid)
                if typ == "DELETED":
                    self.invalid.pop(f"{meta.get('namespace') or 'default'}/{meta.get('name')}", None)
                old = self.bound_on.pop(uid, None)
                if old is not None:
                    self.table.remove_pod(uid)
                # A pod first seen bound and already terminal (the kubelet rejected it at admission:
                # the binding and the rejection in one event, or coalesced by a relist) was never
                # counted here, but the shard that bound it committed it in the ledger and its table.
                old = old or node
                if old:
                    forget[uid] = old
                    if old in self.owners:
                        removes[self.owners[old]].append(uid)
                self.gated.pop(uid, None)
                t = self.pending.pop(uid, None)
                if t is not None:
                    unqueue[t.shard].append(t.pod.key)
                    self._unroute(t.shard)
                continue
            if node:
                new.pop(uid, None)
                self.gated.pop(uid, None)
                self._unnominate(uid)  # its assume gives way to the truth
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
                pod = PodInfo.from_object(obj)
            except InvalidObjectError as e:
                key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
                if key not in self.invalid:
                    self.invalid[key] = str(e)
                    self._fail_pod(obj, f"invalid pod spec: {e}")
                continue
            if self._pre_enqueue(pod, obj):
                new[uid] = pod
            else:
                new.pop(uid, None)
        for bound in observe:
            self._owed_observe[bound.uid] = bound
        for uid, node in forget.items():
            self._owed_observe.pop(uid, None)  # bound and gone while Redis was away: forget says it all
            self._owed_forget[uid] = node
        self._flush_ledger()
        for index, items in adds.items():
            self.shards[index].remote.call("apply_bound", items, [])
        for index, uids in removes.items():
            self.shards[index].remote.call("apply_bound", [], uids)
        for index, keys in unqueue.items():
            if 0 <= index < len(self.shards):  # not a removed shard's (LIMBO)
                self.shards[index].remote.call("remove_pods", keys)
        self.metrics.pending_pods.labels(GATED).set(len(self.gated))
        if new:
            self.route(list(new.values()))

    def _pre_enqueue(self, pod: PodInfo, obj: Mapping[str, Any]) -> bool:
        """Whether a pending pod may be queued: its profile's PreEnqueue plugins pass (upstream's
        PreEnqueue check as a pod enters the scheduling queue). A pod they reject waits in `gated`
        until an update lets it pass; no attempt is counted and no FailedScheduling Event is
        written. When it is first held and has no PodScheduled condition (an API server before
        kube 1.26, a simulated cluster), it gets the one kube's API server gives a pod created
        gated: PodScheduled=False, reason SchedulingGated; once, not at each of its updates."""
        sched = self.schedulers.get(pod.scheduler_name, self.default)
        status = sched.framework.run_pre_enqueue_plugins(pod)
        if status.is_success():
            self.gated.pop(pod.uid, None)
            return True
        if pod.uid not in self.gated:
            self.gated[pod.uid] = pod.key
            conditions = (obj.get("status") or {}).get("conditions") or []
            if not any(c.get("type") == "PodScheduled" for c in conditions):
                self.cluster.call("set_pod_condition", pod.namespace, pod.name, dict(SCHEDULING_GATED_CONDITION))
        return False

    # ------------------------------------------------------------------ routing
    def _unroute(self, shard: int) -> None:
        if 0 <= shard < len(self.routed) and self.routed[shard] > 0:
            self.routed[shard] -= 1

    def _shard_counts(self, pod: PodInfo) -> tuple["_Room", np.ndarray]:
        """(room, static): `_Room`, where the pod fits now in each shard and how free those nodes
        are; ``static``, per shard, its nodes passing the pod's static filters."""
        sched = self.schedulers.get(pod.scheduler_name, self.default)
        packing = sched.framework.packs  # a look at the profile's few Score plugins, once per signature
        static_ok, feasible = sched.feasible_mask(pod)
        n = len(feasible)
        owner = self.owner_slots[:n]
        k = len(self.shards)
        fit = feasible & (owner >= 0)
        t = self.table
        alloc = t.alloc[[t.res_index[CPU], t.res_index[MEMORY]], :n].astype(np.float64)
        used = t.nonzero_requested[:, :n].astype(np.float64)
        # kube's LeastAllocated: the mean over cpu and memory of the share still free (scoring usage,
        # NonZeroRequested), here clipped to [0.001, 1] so that a node where the pod fits counts
        share = np.divide(alloc - used, alloc, out=np.zeros_like(alloc), where=alloc > 0)
        share = np.clip(share.mean(axis=0), 0.001, 1.0)
        # what one such pod takes of a node, in the same units (on the feasible nodes' mean size)
        request = np.array([pod.nonzero_cpu_milli, pod.nonzero_memory_bytes], np.float64)
        size = alloc[:, fit].mean(axis=1) if fit.any() else np.zeros(2)
        cost = float(np.divide(request, size, out=np.zeros(2), where=size > 0).mean())
        holds = None
        if packing:  # how many such pods each node has room for (at least the one that fits now)
            room_for = np.full(n, np.iinfo(np.int64).max, np.int64)
            for name, value in pod.requests.items():
                row = t.res_index.get(name)
                if value > 0 and row is not None:
                    room_for = np.minimum(room_for, (t.alloc[row, :n] - t.requested[row, :n]) // value)
            room_for = np.maximum(room_for, 1)
            holds = [room_for[fit & (owner == s)] for s in range(k)]
        room = _Room([share[fit & (owner == s)] for s in range(k)], cost, holds)
        static = np.bincount(owner[static_ok & (owner >= 0)], minlength=k)[:k]
        return room, static

    def _choose(self, room: "_Room", static: np.ndarray, exclude: set[int] = frozenset()) -> int | None:
        alive = np.array([s.alive for s in self.shards], bool)
        ok = alive & (room.fits > 0)
        for i in exclude:
            if i < len(ok):  # a shard removed since
                ok[i] = False
        if not ok.any():
            return None
        # the shard whose emptiest nodes stay emptiest once the pods already routed to it are placed
        # (`_Room.level`): a burst spreads in proportion to the shards' free room, and pods arriving
        # one at a time go to the shard holding the emptiest node, so that they spread over all
        # nodes as kube-scheduler's LeastAllocated spreads them over its nodes; for a packing
        # profile, the shard holding the fullest node with room, as MostAllocated fills nodes
        levels = np.array([room.level(s, int(self.routed[s])) if ok[s] else -np.inf for s in range(len(ok))])
        return int(np.argmax(levels))

    def route(self, pods: list[PodInfo]) -> None:
        """Send pending pods to shards (grouped into one call per shard)."""
        by_shard: dict[int, list[PodInfo]] = defaultdict(list)
        counts_cache: dict[str, tuple[_Room, np.ndarray]] = {}
        for pod in pods:
            target, nominated = self._nominate(pod)
            if nominated is not None:
                pod = nominated
            else:
                counts = counts_cache.get(pod.signature)
                if counts is None:
                    counts = counts_cache[pod.signature] = self._shard_counts(pod)
                room, static = counts
                target = self._choose(room, static)
                if target is None:  # fits nowhere now: the shard with most matching nodes reports why
                    target = int(np.argmax(static)) if static.any() else 0
            slim = _slim(pod)  # kept and sent without the raw object: memory is per pending pod
            self.pending[pod.uid] = Tracked(slim, target)
            self.routed[target] += 1
            by_shard[target].append(slim)
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
                if self._needs_cluster_view(pod):
                    # its node is chosen here over the whole cluster, afresh after any failure
                    self._unroute(t.shard)
                    target, nominated = self._nominate(pod.nominated(""))
                    if nominated is not None:
                        t.pod, h.qpi.pod_info, t.shard = _slim(nominated), nominated, target
                        self.routed[target] += 1
                        retry[target].append(h.qpi)
                        continue
                    h.qpi.pod_info, t.pod = pod.nominated(""), t.pod.nominated("")
                    _, static = self._shard_counts(h.qpi.pod_info)
                    self._give_up_round(t, h.qpi, self._cluster_decision(h.qpi.pod_info), static, shard, park)
                    continue
                room, static = self._shard_counts(pod)
                target = self._choose(room, static, exclude=t.tried)
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
                self._give_up_round(t, h.qpi, result, static, shard, park)
        for index, qpis in retry.items():
            self.shards[index].remote.call("accept", qpis, False)
        for index, pods in forward.items():
            self.shards[index].remote.call("add_pods", pods)
        for index, qpis in park.items():
            self.shards[index].remote.call("accept", qpis, True)
        return True

    def _give_up_round(self, t: Tracked, qpi: QueuedPodInfo, failed: ScheduleResult, static: np.ndarray,
                       shard: int, park: dict[int, list]) -> None:
        """A round over the cluster found no node (``failed``: the decision over the whole
        cluster): one failed attempt (kube's FailureHandler); the pod waits among the
        unschedulable pods of the shard with most matching nodes."""
        t.rounds += 1
        t.unschedulable = True
        target = int(np.argmax(static)) if static.any() else min(shard, len(self.shards) - 1)
        if not self.shards[target].alive:
            target = next((s.index for s in self.shards if s.alive), shard)
        t.shard = target
        self.routed[target] += 1
        self._record_unschedulable(t, failed.status.message)
        park[target].append(qpi)

    # ------------------------------------------------------------------ nominated nodes
    def _needs_cluster_view(self, pod: PodInfo) -> bool:
        return self.schedulers.get(pod.scheduler_name, self.default).framework.needs_cluster_view(pod)

    def _cluster_decision(self, pod: PodInfo, assume: bool = False) -> ScheduleResult:
        """kube's decision for ``pod`` over the whole cluster (this table, every plugin of its
        profile over every node, the pods nominated so far included)."""
        sched = self.cluster_schedulers.get(pod.scheduler_name) or next(iter(self.cluster_schedulers.values()))
        return sched.schedule(pod, assume=assume)

    def _nominate(self, pod: PodInfo) -> tuple[int | None, PodInfo | None]:
        """For a pod whose constraints a shard cannot check alone (``Framework.needs_cluster_view``:
        required pod affinity, anti-affinity over a wider key than the hostname, DoNotSchedule
        spread): choose its node over the whole cluster, assume it there (so the pods nominated
        after it see it, as kube-scheduler's assume), and return (owner shard, the pod with
        ``nominated_node_name``). (None, None) for other pods, and when no node fits or the node
        has no live owner; the shard then refuses the pod and the rebalancer decides again.

        The assume is undone when the pod is bound or deleted, or handed back (`_unnominate`); it is
        never taken for a bound pod (the ledger's rebuild and the shards read `_bound_usages`).
        """
        if not self._needs_cluster_view(pod):
            return None, None
        self._unnominate(pod.uid)
        result = self._cluster_decision(pod.nominated(""), assume=True)
        owner = self.owners.get(result.node) if result.node is not None else None
        if owner is None or not self.shards[owner].alive:
            if result.node is not None:
                self.table.remove_pod(pod.uid)
            return None, None
        self.nominated[pod.uid] = result.node
        self.counters["nominated"] += 1
        return owner, pod.nominated(result.node)

    def _unnominate(self, uid: str) -> None:
        """Undo `_nominate`'s assume; safe to call for any pod."""
        if self.nominated.pop(uid, None) is not None and uid not in self.bound_on:
            self.table.remove_pod(uid)

    def _bound_usages(self, slot: int) -> list[PodUsage]:
        """The pods bound on a table slot, without the assumed nominated ones."""
        return [u for u in self.table.pods[slot].values() if u.uid not in self.nominated]

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
                              f"still unschedulable after {t.rounds} scheduling attempts (the pod is kept and "
                              f"retried on cluster events or after {self.config.pod_max_in_unschedulable_s:.0f} s): {message}")

    def _fail_pod(self, obj: dict, message: str) -> None:
        """A pod whose spec cannot be scheduled at all (it does not parse): FailedScheduling and
        PodScheduled=False with reason ``SchedulerError``, as kube-scheduler's handleSchedulingFailure
        reports a status that is an error rather than a rejection (``Unschedulable``)."""
        meta = obj.get("metadata") or {}
        ref = {"kind": "Pod", "namespace": meta.get("namespace") or "default", "name": meta.get("name"), "uid": meta.get("uid")}
        self.cluster.call("record_event", ref, "Warning", "FailedScheduling", message)
        self.cluster.call("set_pod_condition", ref["namespace"], ref["name"],
                          {"type": "PodScheduled", "status": "False", "reason": "SchedulerError", "message": message})
        self.counters["invalid"] += 1

    # ------------------------------------------------------------------ health
    def _flush_ledger(self) -> bool:
        """Write to the ledger what the watch showed (nodes added, changed or removed; pods bound;
        pods deleted or terminal), in that order. What Redis does not take now (it is away) stays
        owed and is written by a later call (every health period at least): these writes are
        idempotent, and a pod both bound and gone meanwhile is only forgotten, so the ledger ends
        equal to the cluster however long Redis was away. Call with the state lock held.

        Returns: True when nothing is owed any more."""
        try:
            if self._owed_nodes:
                upserts = [e for e in self._owed_nodes.values() if e is not None]
                if upserts:
                    self.ledger.upsert_nodes(upserts)
                gone = [n for n, e in self._owed_nodes.items() if e is None]
                if gone:
                    self.ledger.remove_nodes(gone)
                self._owed_nodes.clear()
            if self._owed_observe:
                self.ledger.observe(list(self._owed_observe.values()))
                self._owed_observe.clear()
            if self._owed_forget:
                self.ledger.forget(dict(self._owed_forget))
                self._owed_forget.clear()
        except TemporaryError as e:
            owed = len(self._owed_observe) + len(self._owed_forget)
            self.last_error = f"ledger unavailable: {e}; {len(self._owed_nodes)} nodes and {owed} pods owed to it"
            return False
        return True

    def check_ledger(self) -> None:
        """Write what is owed to the ledger (`_flush_ledger`), and rebuild it when Redis restarted
        (its run id changed): without persistence it came back empty (no nodes, no shard map, no
        leases), and with AOF it may have lost its last second of writes (reservations, commits,
        observed pods). See `rebuild_ledger`."""
        if self._owed_nodes or self._owed_observe or self._owed_forget:
            with self._lock:
                self._flush_ledger()
        try:
            instance = self.ledger.instance_id()
        except TemporaryError:
            return  # Redis away: shards pause; checked again next period
        if self._ledger_instance is None:
            self._ledger_instance = instance
            return
        if instance == self._ledger_instance:
            return
        try:
            with self._lock:
                self.rebuild_ledger()
        except TemporaryError as e:
            self.last_error = f"ledger rebuild interrupted: {e}"  # instance not recorded: retried
            return
        self._ledger_instance = instance

    def rebuild_ledger(self) -> None:
        """Rebuild the ledger from the cluster's truth, as this coordinator's table holds it at the
        watch position ``rv`` (bound pods seen later are observed as usual, idempotently): every
        node's allocatable and bound pods (`Ledger.reconcile`), then the shard map with a new epoch,
        then the shards' epoch. Until the map is published every reservation is refused (FENCED),
        so binding resumes only on a rebuilt ledger. Call with the state lock held.

        Raises:
            TemporaryError: Redis went away again; call again.
        """
        drift = 0
        for name, slot in list(self.table.index.items()):
            bound = {usage.uid: usage.requests for usage in self._bound_usages(slot)}
            drift += self.ledger.reconcile(name, self.table.allocatable_of(name), bound).drift
        self.epoch = max(self.epoch, self.ledger.epoch()) + 1
        self.ledger.set_owners({n: self.shards[o].member for n, o in self.owners.items()}, self.epoch)
        for s in self.shards:
            s.remote.call("set_epoch", self.epoch)
        self.ledger_rebuilds += 1
        log.warning("Redis restarted: ledger rebuilt from the cluster (%d nodes, %d drifted), epoch %d",
                    len(self.table.index), drift, self.epoch)

    def check_health(self) -> None:
        """Ping every shard (outside the state lock: a ping may take its whole timeout); replace a
        shard that failed `health_failures` checks in a row, or at once when its actor is dead
        (Ray saw its process end: it will not come back, and its pods are waiting)."""
        for s in list(self.shards):
            try:
                s.remote.ask("ping", timeout_s=2.0)
                s.failures = 0
            except RemoteUnavailable as e:
                s.failures = self.health_failures if isinstance(e, RemoteDead) else s.failures + 1
                log.warning("shard %s did not answer (%d/%d): %s", s.member, s.failures, self.health_failures, e)
                if s.failures >= self.health_failures:
                    with self._lock:
                        if s.index < len(self.shards) and self.shards[s.index] is s:  # not removed meanwhile
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
        remote.call("apply_namespaces", self.table.namespace_labels, [], True)
        remote.call("apply_nodes", nodes, [])
        bound = [(u, n) for n in mine if n in self.table.index for u in self._bound_usages(self.table.index[n])]
        remote.call("apply_bound", bound, [])
        pods = [_slim(t.pod) for t in self.pending.values() if t.shard == index]
        if pods:
            remote.call("add_pods", pods)
        self.replaced += 1
        log.warning("shard %d replaced by %s (epoch %d): %d nodes, %d pending pods", index, member, self.epoch, len(mine), len(pods))

    # ------------------------------------------------------------------ scaling
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
           are (`_Room`); pods known unschedulable wait among the unschedulable pods
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
        started_unix, t0 = time.time(), time.monotonic()
        before = len(self.shards)
        if n == before:
            return ScaleStep(before, n, trigger, self.epoch, started_unix, nodes=len(self.owners))
        added = []
        for i in range(before, n):
            incarnation = self._last_incarnation.get(i, 0) + 1
            member = f"shard-{i}@{incarnation}"
            added.append(ShardRef(i, member, self.shard_factory(i, member), incarnation))
        try:
            for ref in added:
                ref.remote.ask("ping", timeout_s=self.shard_start_timeout_s)
            t1 = time.monotonic()
            with self._lock:
                step, removed = self._handover(n, added, trigger, started_unix)
        except Exception:
            for ref in added:
                ref.remote.terminate()
            raise
        # Outside the state lock (the watch and the rebalancer go on): removed shards end their
        # batch in flight, all at once, then their actors are stopped.
        for ref in removed:
            ref.remote.call("stop")
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
        before = len(self.shards)
        kept, removed = self.shards[:n], self.shards[n:]
        shards = kept + added
        after = _assign(list(self.owners), range(n))
        moved = {name: index for name, index in after.items() if index != self.owners[name]}
        nodes = len(after)
        removed_share = sum(1 for index in self.owners.values() if index >= n) / nodes if nodes else 0.0
        fraction = moved_fraction(self.owners, after)
        epoch = max(self.epoch, self.ledger.epoch()) + 1
        self.ledger.set_owners({name: shards[index].member for name, index in moved.items()}, epoch)
        # From here on every stale owner is fenced off in the ledger.
        gained: dict[int, list[str]] = defaultdict(list)
        lost: dict[int, list[str]] = defaultdict(list)
        for name, index in moved.items():
            gained[index].append(name)
            if self.owners[name] < n:
                lost[self.owners[name]].append(name)
        self.epoch = epoch
        self.owners.update(moved)
        self.shards = shards
        self.routed = np.concatenate([self.routed[:n], np.zeros(n - min(n, len(self.routed)), np.int64)])
        self._owner_slots()
        for s in self.shards:
            self._tell(s, "set_epoch", epoch)
        for s in added:
            self._tell(s, "apply_namespaces", self.table.namespace_labels, [], True)
        for index, names in gained.items():
            slots = [self.table.index[name] for name in names if name in self.table.index]
            self._tell(self.shards[index], "apply_nodes", [self.table.nodes[slot].obj for slot in slots], [])
            bound = [(usage, self.table.names[slot]) for slot in slots for usage in self._bound_usages(slot)]
            if bound:
                self._tell(self.shards[index], "apply_bound", bound, [])
        for index, names in lost.items():
            self._tell(self.shards[index], "apply_nodes", [], names)

        # Queued pods: all of a removed shard's; the added shards' share of a kept one's (its tail).
        share = 1.0 - before / n if n > before else 0.0
        items = []
        for ref in removed + (kept if share else []):
            try:
                qpis = ref.remote.ask("drain", 1.0 if ref.index >= n else share, timeout_s=30.0)
            except RemoteUnavailable as e:
                log.warning("shard %s did not hand back its queue (%s)", ref.member, e)
                continue
            for q in qpis:
                t = self.pending.get(q.pod_info.uid)
                if t is not None and t.shard == ref.index:  # else bound, deleted or routed elsewhere since
                    items.append((t, q))
        self._reroute(items)
        # The removed shards' pods not drained are in their last batch (or bound, and not yet seen).
        in_flight = 0
        deadline = time.monotonic() + self.handover_grace_s
        for t in self.pending.values():
            if t.shard >= n:
                t.shard = LIMBO
                self._limbo[t.pod.uid] = deadline
                in_flight += 1
        step = ScaleStep(before, n, trigger, epoch, started_unix, nodes=nodes, nodes_moved=len(moved),
                         moved_fraction=fraction, ideal_fraction=ideal_moved_fraction(before, n, removed_share),
                         removed_share=removed_share, pods_rerouted=len(items), pods_in_flight=in_flight)
        return step, removed

    def _tell(self, ref: ShardRef, method: str, *args: Any) -> None:
        """Call a shard and wait, so that it has its nodes before pods are routed to it; a shard that
        does not answer is left to the health check (a new incarnation gets everything it owns)."""
        try:
            ref.remote.ask(method, *args, timeout_s=10.0)
        except RemoteUnavailable as e:
            log.warning("shard %s: %s during a scale step failed: %s", ref.member, method, e)

    def _retire(self, ref: ShardRef) -> None:
        """Stop a removed shard (fenced off, its queue drained): wait for its batch in flight to end,
        hand what that batch put back in its queue to the rebalancer, keep its counters, stop its
        actor."""
        try:
            leftovers = ref.remote.ask("retire", self.retire_timeout_s, timeout_s=self.retire_timeout_s + 10.0)
            if leftovers:
                self.handoff(ref.index, [Handoff(q, FENCED, f"shard {ref.member} was removed") for q in leftovers])
            self.retired_stats.append(ref.remote.ask("take_stats", timeout_s=10.0))
        except RemoteUnavailable as e:
            log.warning("shard %s did not retire cleanly (%s); its pods are routed again in %.0f s", ref.member, e,
                        self.handover_grace_s)
        ref.remote.terminate()
        self._last_incarnation[ref.index] = ref.incarnation

    def _reroute(self, items: list[tuple[Tracked, QueuedPodInfo | None]]) -> None:
        """Route tracked pods again (drained from a shard: with their queued pod; from limbo: None).
        Like `route` (`_Room`); a pod known unschedulable waits
        among the unschedulable pods of the shard with most matching nodes."""
        forward: dict[int, list[PodInfo]] = defaultdict(list)
        park: dict[int, list[QueuedPodInfo]] = defaultdict(list)
        counts_cache: dict[str, tuple[_Room, np.ndarray]] = {}
        for t, q in items:
            self._unroute(t.shard)
            target, nominated = (None, None) if t.unschedulable else self._nominate(t.pod)
            if nominated is not None:  # a node over the whole cluster, afresh: the shards changed
                t.pod, t.shard = _slim(nominated), target
                if q is not None:
                    q.pod_info = t.pod
                forward[target].append(t.pod)
                self.routed[target] += 1
                continue
            if t.pod.nominated_node_name:  # no node now: its shard refuses it, the rebalancer decides
                t.pod = t.pod.nominated("")
                if q is not None:
                    q.pod_info = t.pod
            counts = counts_cache.get(t.pod.signature)
            if counts is None:
                counts = counts_cache[t.pod.signature] = self._shard_counts(t.pod)
            room, static = counts
            parked = t.unschedulable and q is not None
            target = None if parked else self._choose(room, static)
            if target is None:
                target = int(np.argmax(static)) if static.any() else 0
            if parked:
                park[target].append(q)
            else:
                forward[target].append(q.pod_info if q is not None else _slim(t.pod))
            t.shard = target
            self.routed[target] += 1
        for index, pods in forward.items():
            self.shards[index].remote.call("add_pods", pods)
        for index, qpis in park.items():
            self.shards[index].remote.call("accept", qpis, True)

    def _sweep_limbo(self) -> None:
        """Route again the pods of removed shards whose fate did not arrive within the grace."""
        if not self._limbo:
            return
        now = time.monotonic()
        items = []
        for uid in [uid for uid, deadline in self._limbo.items() if deadline <= now]:
            del self._limbo[uid]
            t = self.pending.get(uid)
            if t is not None and t.shard == LIMBO:
                items.append((t, None))
        if items:
            log.warning("%d pods of removed shards routed again after %.0f s", len(items), self.handover_grace_s)
            self.counters["limbo_rerouted"] += len(items)
            self._reroute(items)

    def enable_autoscaler(self, options: AutoscalerOptions) -> None:
        """Let the control loop set the shard count every ``options.period_s`` (`Autoscaler`); a
        count outside the bounds is corrected at the first period."""
        self.autoscaler = Autoscaler(options)

    def autoscale(self) -> None:
        """One autoscaler period: read the shards' load (`Shard.snapshot`) and, when the policy asks
        for another count, start the step in a thread (the loop goes on; one step at a time)."""
        if self.autoscaler is None or not self._scale_lock.acquire(blocking=False):
            return
        try:
            snapshots = []
            for s in list(self.shards):
                try:
                    snapshots.append(s.remote.ask("snapshot", timeout_s=2.0))
                except RemoteUnavailable:
                    continue
            target = self.autoscaler.decide(Load.of(len(self.shards), snapshots))
        except Exception:
            self._scale_lock.release()
            raise
        if target is None or target == len(self.shards):
            self._scale_lock.release()
            return
        threading.Thread(target=self._autoscale_step, args=(target,), name="autoscale", daemon=True).start()

    def _autoscale_step(self, n: int) -> None:
        try:
            self._scale(n, "autoscaler")
        except Exception as e:  # noqa: BLE001 - logged; the next period decides again
            self.last_error = f"autoscaler: {type(e).__name__}: {e}"
            log.exception("autoscaler: scaling to %d shards failed", n)
        finally:
            self._scale_lock.release()

    def scale_history(self) -> list[dict[str, Any]]:
        """Every scale step so far (`ScaleStep.to_json`), oldest first."""
        return [step.to_json() for step in self.scale_steps]

    # ------------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        with self._lock:
            return self._status()

    def _status(self) -> dict[str, Any]:
        unsched = sum(1 for t in self.pending.values() if t.unschedulable)
        return {
            "nodes": self.table.num_nodes, "shards": len(self.shards), "epoch": self.epoch,
            "pending": len(self.pending), "unschedulable": unsched, "gated": len(self.gated),
            "gave_up": self.counters["gave_up"], "bound_seen": self.counters["bound"],
            "routed": self.counters["routed"], "requeues": self.counters["requeues"],
            "nominated": self.counters["nominated"], "nominated_pending": len(self.nominated),
            "invalid": len(self.invalid), "replaced_shards": self.replaced, "ledger_rebuilds": self.ledger_rebuilds,
            "last_error": self.last_error,
            "scale_steps": len(self.scale_steps), "autoscaler": self.autoscaler is not None,
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

    def kill_shard(self, index: int) -> None:
        """For chaos tests and demos: kill the shard's actor process (SIGKILL through Ray)."""
        import ray

        target = self.shards[index].remote
        if target.is_actor:
            ray.kill(target.target, no_restart=True)
