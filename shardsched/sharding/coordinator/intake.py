"""Watch intake: the cluster's list and watch applied to the coordinator's state.

List, then events from the list's resourceVersion; relist on 410 Gone. PodDisruptionBudgets are
kept for preemption (`CoordinatorState.pdbs`; one that does not parse is logged and left out).
Namespaces, the objects whose selectors default spreading reads (Services, ReplicationControllers,
ReplicaSets, StatefulSets), the storage objects the volume plugins read (PersistentVolumes, claims,
StorageClasses, CSINodes, CSIStorageCapacities: listed and watched when the cluster serves them,
`CoordinatorState.storage`), nodes and pods change the table, the shard map and the tracked pods, and go to the shards that need them; pods
bound by anyone are observed into the ledger (idempotent by uid; not those their shard reported
committed under the current epoch, `Intake.committed`) and forwarded to the shard that owns their
node; deleted or terminal pods are forgotten. Pending pods whose ``schedulerName`` is one
of the profiles pass their profile's PreEnqueue plugins first: a pod with ``spec.schedulingGates``
waits, gated (not routed, no attempt, no FailedScheduling Event), until an update removes its last
gate. What the intake returns (`Changes`) says which pending pods are new, for the router.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from shardsched.api.objects import NodeInfo, PodInfo
from shardsched.api.podaffinity import namespace_labels_of
from shardsched.api.quantity import PODS
from shardsched.api.requests import pod_requests
from shardsched.cache.devices import devices_of_object
from shardsched.cache.node_table import PodUsage
from shardsched.api.volumes import VolumeCatalog
from shardsched.cluster import (ADDED, PDB, PODGROUP, SPREAD_SELECTOR_KINDS, STORAGE_KINDS, apply_pdb_events,
                                spread_selector_changes, storage_changes)
from shardsched.errors import InvalidObjectError
from shardsched.queue import GATED
from shardsched.sharding.coordinator.events import fail_pod, mark_gated
from shardsched.sharding.coordinator.ledger_sync import LedgerSync
from shardsched.sharding.coordinator.nominator import unnominate
from shardsched.sharding.coordinator.preemption import Preemption
from shardsched.sharding.coordinator.partition import assign_new, repartition
from shardsched.sharding.coordinator.state import CoordinatorState, Nomination
from shardsched.sharding.coordinator.watch_pump import WATCH_BATCH, WatchAnswer, fetch
from shardsched.sharding.calls import RemoteUnavailable
from shardsched.store.ledger import MAX_AMOUNT, BoundPod, NodeEntry

log = logging.getLogger(__name__)

#: commit reports kept at most (`Intake.committed`): one whose pod's bound event never comes (the pod
#: was deleted before the report arrived) would stay; past this many they are all dropped, and
#: their pods observed as any bound pod
MAX_COMMIT_REPORTS = 100_000



@dataclass
class Changes:
    """What one poll (or a relist) changed.

    Attributes:
        events: watch events applied (0: the watch had nothing new, or the cluster did not answer).
        relisted: the cluster was listed again (start, 410 Gone).
        new_pods: pending pods first seen, that may be queued, in watch order: to be routed.
    """

    events: int = 0
    relisted: bool = False
    new_pods: list[PodInfo] = field(default_factory=list)

    @property
    def any(self) -> bool:
        return bool(self.events or self.relisted)


def parse_namespace(obj: dict) -> tuple[str, dict[str, str]] | None:
    """(name, labels) of a Namespace object (`namespace_labels_of`); one without a name is logged
    and gives None."""
    try:
        return namespace_labels_of(obj)
    except InvalidObjectError as e:
        log.error("namespace ignored: %s", e)
        return None


def namespace_labels(objs: Iterable[dict]) -> dict[str, dict[str, str]]:
    """Namespace name -> labels of listed Namespace objects (`parse_namespace`)."""
    return dict(filter(None, map(parse_namespace, objs)))


def _ledger_amounts(requests: Mapping[str, int], obj: Mapping[str, Any]) -> dict[str, int]:
    """A resized pod's requests as the ledger counts them: an amount above what it can hold
    (`MAX_AMOUNT`, far above any node) is counted as that much, with a log line naming the pod."""
    over = {k: v for k, v in requests.items() if v > MAX_AMOUNT}
    if over:
        meta = obj.get("metadata") or {}
        log.error("pod %s/%s is resized to %s, more than the ledger counts; counted as %d of each",
                  meta.get("namespace"), meta.get("name"), over, MAX_AMOUNT)
    return {k: min(v, MAX_AMOUNT) for k, v in requests.items()}


class Intake:
    """Applies the cluster's list and watch to ``state``; writes to the ledger through ``ledger_sync``."""

    def __init__(self, state: CoordinatorState, ledger_sync: LedgerSync, preemption: Preemption) -> None:
        self.state = state
        self.ledger_sync = ledger_sync
        self.preemption = preemption
        #: the gangs (`Gangs`), told of the pods and PodGroups the watch brings; None: no gangs
        self.gangs = None
        #: whether the cluster serves the storage kinds (None until the first relist asks it)
        self.serves_storage: bool | None = None
        # (epoch, uids) of the shards' commit reports not yet applied (`committed`), oldest first
        self._reports: list[tuple[int, list[str]]] = []
        self._reports_lock = threading.Lock()

    def relist(self) -> Changes:
        """List nodes and pods and rebuild everything from them (start, and after 410 Gone)."""
        state = self.state
        nodes, _ = state.cluster.list_nodes().wait()
        pods, rv = state.cluster.list_pods().wait()
        state.reset_table()
        state.nominated.clear()
        state.bound_on.clear()
        state.commits.clear()  # every bound pod listed is observed
        state.gated.clear()  # the list shows every gated pod again
        infos = []
        for obj in nodes:
            try:
                infos.append(NodeInfo.from_object(obj))
            except InvalidObjectError as e:
                log.error("node %s ignored: %s", (obj.get("metadata") or {}).get("name"), e)
        state.table.add_nodes(infos)
        namespaces, _ = state.cluster.list_namespaces().wait()
        state.table.set_namespaces(namespace_labels(namespaces), replace=True)
        pdbs, _ = state.cluster.list_pdbs().wait()
        state.pdbs.clear()
        apply_pdb_events(state.pdbs, [(ADDED, obj) for obj in pdbs])
        selectors, _ = state.cluster.list_spread_selectors().wait()
        state.table.set_spread_selectors(spread_selector_changes((ADDED, o) for o in selectors)[0], replace=True)
        self._list_storage()
        self.ledger_sync.instance = state.ledger.instance_id()  # the Redis the map is written to
        gone = repartition(state, infos)
        storage = state.storage_snapshot()
        for s in state.shards:
            mine = [n.obj for n in infos if state.owners.get(n.name) == s.index]
            s.client.set_epoch(state.epoch)
            s.client.apply_namespaces(state.table.namespace_labels, [], True)
            s.client.apply_spread_selectors(state.table.spread_selectors.objects(), [], True)
            if storage is not None:
                s.client.apply_storage(*storage)
            s.client.apply_nodes(mine, gone.get(s.index, []))
        new = self._apply_pods([("ADDED", obj) for obj in pods])
        if self.gangs is not None:
            self.gangs.relist(pods)
        state.rv = rv
        return Changes(events=len(pods), relisted=True, new_pods=new)

    def poll(self, answer: WatchAnswer | None = None) -> Changes:
        """Apply the watch events since `CoordinatorState.rv` (at most `WATCH_BATCH`): ``answer``,
        the watch pump's (`shardsched.sharding.coordinator.watch_pump`), or asked now; relist on
        410 Gone. An answer asked from another rv (a relist or a poll came between) is dropped. A
        cluster that does not answer changes nothing (`last_error` says why)."""
        from shardsched.cluster import Gone

        state = self.state
        if answer is None:
            answer = fetch(state)
        elif answer.rv_from != state.rv:
            return Changes()
        try:
            events, rv = answer.result()
        except Gone:
            log.warning("watch history compacted; relisting")
            return self.relist()
        except RemoteUnavailable as e:
            state.last_error = f"cluster unavailable: {e}"
            return Changes()
        if not events:
            state.rv = rv
            return Changes()
        node_events = [(e.type, e.object) for e in events if e.kind == "Node"]
        pod_events = [(e.type, e.object) for e in events if e.kind == "Pod"]
        namespace_events = [(e.type, e.object) for e in events if e.kind == "Namespace"]
        pdb_events = [(e.type, e.object) for e in events if e.kind == PDB]
        if pdb_events:
            apply_pdb_events(state.pdbs, pdb_events)
        if namespace_events:
            self._apply_namespaces(namespace_events)
        selector_events = [(e.type, e.object) for e in events if e.kind in SPREAD_SELECTOR_KINDS]
        if selector_events:
            self._apply_spread_selectors(selector_events)
        storage_events = [(e.type, e.kind, e.object) for e in events if e.kind in STORAGE_KINDS]
        if storage_events:
            self._apply_storage(storage_events)
        if node_events:
            self._apply_nodes(node_events)
        new = self._apply_pods(pod_events) if pod_events else []
        if self.gangs is not None:
            self.gangs.caught_up = len(events) < WATCH_BATCH
            group_events = [(e.type, e.object) for e in events if e.kind == PODGROUP]
            if group_events:
                self.gangs.apply_group_events(group_events)
            if pod_events:
                self.gangs.observe(pod_events)
            if node_events:
                self.gangs.nodes_changed()
        state.rv = rv
        return Changes(events=len(events), new_pods=new)

    def _apply_namespaces(self, events: list[tuple[str, dict]]) -> None:
        """Namespaces created, relabelled or deleted: their labels decide which namespaces a pod
        affinity term's ``namespaceSelector`` selects, here and in every shard (`Shard.apply_namespaces`)."""
        state = self.state
        last: dict[str, tuple[str, dict[str, str]]] = {}  # only a namespace's last event of the poll counts
        for typ, obj in events:
            parsed = parse_namespace(obj)
            if parsed is not None:
                last[parsed[0]] = (typ, parsed[1])
        upserts = {name: labels for name, (typ, labels) in last.items() if typ != "DELETED"}
        removed = [name for name, (typ, _) in last.items() if typ == "DELETED"]
        if not state.table.set_namespaces(upserts, removed):
            return
        for s in state.shards:
            s.client.apply_namespaces(upserts, removed, False)

    def _apply_spread_selectors(self, events: list[tuple[str, dict]]) -> None:
        """Services, ReplicationControllers, ReplicaSets and StatefulSets created, changed or
        deleted: their selectors are PodTopologySpread's default selectors, here and in every shard
        (`Shard.apply_spread_selectors`)."""
        upserts, removed = spread_selector_changes(events)
        if not self.state.table.set_spread_selectors(upserts, removed):
            return
        for s in self.state.shards:
            s.client.apply_spread_selectors(upserts, removed, False)

    def _list_storage(self) -> None:
        """At a relist: the storage objects, when the cluster serves every storage kind (its
        `shardsched.cluster.Capabilities`, asked once), into `CoordinatorState.storage` and the
        table; else None."""
        state = self.state
        if self.serves_storage is None:
            self.serves_storage = set(STORAGE_KINDS) <= set(state.cluster.get_capabilities().wait().kinds)
        if not self.serves_storage:
            state.storage = state.table.volumes = None
            return
        listed = []
        for kind in STORAGE_KINDS:
            objs, _ = state.cluster.list_storage(kind).wait()
            listed += [(ADDED, kind, o) for o in objs]
        changes = storage_changes(listed)
        state.storage = VolumeCatalog()
        state.storage.apply(changes.upserts, [], changes.invalid_pvs, replace=True)
        state.table.volumes = state.storage

    def _apply_storage(self, events: list[tuple[str, str, dict]]) -> None:
        """Storage objects created, changed or deleted: into `CoordinatorState.storage` and, when
        that changed, to every shard (`Shard.apply_storage`)."""
        state = self.state
        if state.storage is None:
            return
        changes = storage_changes(events)
        if not state.storage.apply(changes.upserts, changes.removed, changes.invalid_pvs):
            return
        for s in state.shards:
            s.client.apply_storage(changes.upserts, changes.removed, changes.invalid_pvs, False)

    def _apply_nodes(self, events: list[tuple[str, dict]]) -> None:
        state = self.state
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
                state.table.remove_node(name, keep_pods=True)  # its pods count again if it comes back
                owner = state.owners.pop(name, None)
                if owner is not None:
                    removals[owner].append(name)
                continue
            try:
                info = NodeInfo.from_object(obj)
            except InvalidObjectError as e:
                log.error("node %s ignored: %s", name, e)
                continue
            state.table.add_node(info)
            if name not in state.owners:
                new_infos.append(info)
            else:
                entries.append(NodeEntry(name, info.allocatable, None))
                upserts[state.owners[name]].append(obj)
        if new_infos:
            state.owners.update(assign_new(state, [n.name for n in new_infos]))
            for info in new_infos:
                owner = state.owners[info.name]
                entries.append(NodeEntry(info.name, info.allocatable, state.shards[owner].member))
                upserts[owner].append(info.obj)
        self.ledger_sync.owe_nodes(entries, (n for ns in removals.values() for n in ns))
        self.ledger_sync.flush()
        state.refresh_owner_slots()
        for index in set(upserts) | set(removals):
            state.shards[index].client.apply_nodes(upserts.get(index, []), removals.get(index, []))
        # A node deleted and created again under the same name while pods were still bound to it:
        # the table counted them again (orphans); its owner shard must count them too.
        for info in new_infos:
            slot = state.table.index.get(info.name)
            back = [(usage, info.name) for usage in state.bound_usages(slot)] if slot is not None else []
            if back:
                state.shards[state.owners[info.name]].client.apply_bound(back, [])
        for s in state.shards:
            s.client.move_all_to_active_or_backoff_queue("NodeUpdate")

    def committed(self, shard: int, epoch: int, uids: list[str]) -> None:
        """A shard's report (fire and forget, on the thread that takes its call): it bound these
        pods and committed them in the ledger, under the shard map's ``epoch`` as it knew it
        before the commit. When the watch then shows such a pod bound, the intake counts it as
        any bound pod but does not observe it into the ledger a second time, if the epoch is
        still the coordinator's. A new epoch (`CoordinatorState.next_epoch`: a ledger rebuilt
        after Redis restarted, a new shard map) drops the reports made before it, so the pods
        they name are observed: a commit that a restarted Redis lost is counted again. A pod the
        watch shows bound before its report arrives is observed at once (the intake cannot tell
        that bind from another scheduler's), and the report is then dropped."""
        with self._reports_lock:
            self._reports.append((epoch, uids))

    def _take_reports(self) -> None:
        """The reports of the current epoch into `CoordinatorState.commits`, except for pods the
        intake counts already (their bound event came first)."""
        with self._reports_lock:
            reports, self._reports = self._reports, []
        state = self.state
        for epoch, uids in reports:
            if epoch == state.epoch:
                for uid in uids:
                    if uid not in state.bound_on:
                        state.commits[uid] = epoch
        if len(state.commits) > MAX_COMMIT_REPORTS:
            state.commits.clear()

    def _apply_pods(self, events: list[tuple[str, dict]]) -> list[PodInfo]:
        """Apply pod events; returns the pending pods first seen, to be routed."""
        state = self.state
        self._take_reports()
        # pending pods first seen in this batch, routed after it: a later event of the same batch
        # (deleted, bound by someone else, updated) replaces or cancels the entry
        new: dict[str, PodInfo] = {}
        observe: list[BoundPod] = []
        forget: dict[str, str] = {}
        preemptors_done: list[str] = []  # bound or gone: their nominations leave the ledger
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
                unnominate(state, uid)
                state.commits.pop(uid, None)
                if uid in state.preempting:
                    preemptors_done.append(uid)
                if typ == "DELETED":
                    state.invalid.pop(f"{meta.get('namespace') or 'default'}/{meta.get('name')}", None)
                old = state.bound_on.pop(uid, None)
                if old is not None:
                    state.table.remove_pod(uid)
                # A pod first seen bound and already terminal (the kubelet rejected it at admission:
                # the binding and the rejection in one event, or coalesced by a relist) was never
                # counted here, but the shard that bound it committed it in the ledger and its table.
                old = old or node
                if old:
                    forget[uid] = old
                    if old in state.owners:
                        removes[state.owners[old]].append(uid)
                state.gated.pop(uid, None)
                t = state.pending.pop(uid, None)
                if t is not None:
                    unqueue[t.shard].append(t.pod.key)
                    state.unroute(t.shard)
                continue
            if node:
                new.pop(uid, None)
                state.gated.pop(uid, None)
                unnominate(state, uid)  # its assume gives way to the truth
                if uid in state.preempting:
                    preemptors_done.append(uid)
                if state.bound_on.get(uid) == node:
                    resized = self._resized(uid, node, obj) if typ == "MODIFIED" else None
                    if resized is not None:
                        observe.append(BoundPod(uid, node, _ledger_amounts(resized.requests, obj), state.table.devices_of(uid)))
                        if node in state.owners:
                            adds[state.owners[node]].append((resized, node))
                    continue
                t = state.pending.pop(uid, None)
                if t is not None:
                    pod = t.pod  # parsed when it was routed; the spec cannot change once bound
                else:
                    try:
                        pod = PodInfo.from_object(obj)
                    except InvalidObjectError as e:
                        log.error("bound pod %s/%s has an invalid spec (%s); not counted",
                                  meta.get("namespace"), meta.get("name"), e)
                        continue
                state.bound_on[uid] = node
                # the devices its binder chose are on the bound pod (`devices_of_object`), not on
                # the pod as it was routed: without them the table would pick its own best fit,
                # which need not be the device the shard took
                usage = PodUsage.of(pod, devices_of_object(obj) or None)
                state.table.add_pod(usage, node)
                # the devices of its annotation, else the table's best fit (as the shards count it);
                # not for a pod its shard reported committed under this map
                if state.commits.pop(uid, None) != state.epoch:
                    observe.append(BoundPod(uid, node, pod.requests, state.table.devices_of(uid)))
                if node in state.owners:
                    adds[state.owners[node]].append((usage, node))
                if t is not None:
                    state.unroute(t.shard)
                    state.counters["bound"] += 1
                    if t.shard != state.owners.get(node):
                        unqueue[t.shard].append(t.pod.key)
                continue
            if uid in state.pending or meta.get("deletionTimestamp") or terminal:
                continue
            if (spec.get("schedulerName") or "default-scheduler") not in state.profiles:
                continue
            try:
                pod = PodInfo.from_object(obj)
            except InvalidObjectError as e:
                key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
                if key not in state.invalid:
                    state.invalid[key] = str(e)
                    fail_pod(state, obj, f"invalid pod spec: {e}")
                continue
            if self._pre_enqueue(pod, obj):
                new[uid] = pod
            else:
                new.pop(uid, None)
            nominated = (obj.get("status") or {}).get("nominatedNodeName")
            if nominated and isinstance(nominated, str) and uid not in state.preempting:
                # written before this coordinator (a restart, a failover): kept, as upstream's
                # nominator is rebuilt from the pods, and assumed on its node so that the pods
                # decided after it see it; the ledger gets it at the next renewal
                state.preempting[uid] = Nomination(nominated)
                if nominated in state.table.index and uid not in state.nominated:
                    state.table.add_pod(PodUsage.of(pod), nominated)
                    state.nominated[uid] = nominated
                    # its GPU devices: the table's best fit there (the ledger holds those at renewal)
                    state.preempting[uid].devices = state.table.devices_of(uid)
        self.ledger_sync.owe_pods(observe, forget)
        self.ledger_sync.flush()
        self.preemption.forget(preemptors_done)
        for index, items in adds.items():
            state.shards[index].client.apply_bound(items, [])
        for index, uids in removes.items():
            state.shards[index].client.apply_bound([], uids)
        for index, keys in unqueue.items():
            if 0 <= index < len(state.shards):  # not a removed shard's (LIMBO)
                state.shards[index].client.remove_pods(keys)
        state.metrics.pending_pods.labels(GATED).set(len(state.gated))
        return list(new.values())

    def _resized(self, uid: str, node: str, obj: dict) -> PodUsage | None:
        """A counted pod's update that changes its requests (an in-place resize: upstream's
        ``PodRequests`` with ``UseStatusResources``, `shardsched.api.requests`): the new usage,
        counted in the table at once; None when its requests did not change. A pod whose new
        spec or status cannot be parsed is logged and keeps the usage it had."""
        table = self.state.table
        slot = table.pod_slot.get(uid)
        counted = table.pods[slot].get(uid) if slot is not None else None
        if counted is None:
            return None
        try:
            requests = {k: v for k, v in pod_requests(obj).items() if v > 0}
            if {**requests, PODS: 1} == dict(counted.requests):
                return None
            usage = PodUsage.of(PodInfo.from_object(obj))
        except InvalidObjectError as e:
            meta = obj.get("metadata") or {}
            log.error("pod %s/%s on %s: its resize cannot be read (%s); it keeps counting %s",
                      meta.get("namespace"), meta.get("name"), node, e, dict(counted.requests))
            return None
        table.add_pod(usage, node)
        return usage

    def _pre_enqueue(self, pod: PodInfo, obj: Mapping[str, Any]) -> bool:
        """Whether a pending pod may be queued: its profile's PreEnqueue plugins pass (upstream's
        PreEnqueue check as a pod enters the scheduling queue). A pod they reject waits in `gated`
        until an update lets it pass; no attempt is counted and no FailedScheduling Event is
        written. When it is first held and has no PodScheduled condition (an API server before
        kube 1.26, a simulated cluster), it gets the one kube's API server gives a pod created
        gated: PodScheduled=False, reason SchedulingGated; once, not at each of its updates."""
        state = self.state
        status = state.scheduler_for(pod).framework.run_pre_enqueue_plugins(pod)
        if status.is_success():
            state.gated.pop(pod.uid, None)
            return True
        if pod.uid not in state.gated:
            state.gated[pod.uid] = pod.key
            mark_gated(state, pod, obj)
        return False
