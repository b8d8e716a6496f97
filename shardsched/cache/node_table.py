"""NodeTable: kube's scheduler cache (NodeInfo per node) as numpy columns, one slot per node.

Resource usage is kept as int64 matrices of shape (n_resources, capacity) in canonical units, so a
Filter or Score plugin looks at one contiguous row per resource for all nodes at once. Static node
attributes (labels, taints, cordon) are indexed for vectorized matching: one int32 code column per
label key, one taint-set id per node.

Two counters let callers cache per-signature results:
- ``static_generation`` changes whenever labels, taints, cordon or the set of nodes change;
- ``change_log`` lists the slots whose usage changed (pod added/removed); a cache that remembers
  ``log_position()`` can recompute just those slots. ``log_base`` moves when the log is trimmed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np

from shardsched.api.objects import ContainerPort, NodeInfo, PodInfo, Taint
from shardsched.api.podvolumes import NO_VOLUMES, PodVolumes
from shardsched.api.volumes import VolumeCatalog
from shardsched.api.podaffinity import NAMESPACE_NAME_LABEL, NO_POD_AFFINITY, AffinityTerm, LabelSelector, PodAffinity
from shardsched.api.quantity import CPU, EPHEMERAL_STORAGE, MEMORY, PODS
from shardsched.api.workloads import SpreadSelectors, WorkloadKey, WorkloadSelector
from shardsched.cache.devices import DeviceColumns, DeviceRequest, device_request, devices_of_object, node_devices
from shardsched.cache.pod_columns import PodColumns

_INITIAL_RESOURCES = (CPU, MEMORY, PODS, EPHEMERAL_STORAGE)
_LOG_LIMIT = 1 << 16


@dataclass(frozen=True, slots=True)
class PodUsage:
    """What one pod takes from its node: requests (canonical units, incl. ``pods: 1``), the
    scoring requests for cpu/memory, and host ports; and what InterPodAffinity and
    PodTopologySpread read of a pod on a node: namespace, labels, whether it is being deleted, its
    pod (anti-)affinity terms."""

    uid: str
    key: str
    requests: Mapping[str, int]
    nonzero_cpu_milli: int
    nonzero_memory_bytes: int
    host_ports: tuple[ContainerPort, ...] = ()
    namespace: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    deleting: bool = False
    affinity: PodAffinity = NO_POD_AFFINITY
    #: what DefaultPreemption reads of a pod on a node: priority, ``status.startTime`` (Unix
    #: seconds, None = unset), being deleted by a preemption (`PodInfo.preempted`)
    priority: int = 0
    start_time_s: float | None = None
    preempted: bool = False
    #: the GPU devices it asks for (`shardsched.cache.devices.device_request`; None: no GPU) and the
    #: indices of the devices it holds on its node (() before the table picks them)
    gpu: DeviceRequest | None = None
    devices: tuple[int, ...] = ()
    #: counted on ``devices`` even where they do not fit now (`NodeTable._place_devices`): a
    #: preemptor's nomination or a gang member's hold, whose devices were chosen with the victims gone
    pinned: bool = False
    #: what the volume plugins read of a pod on a node: its claims, in-tree disks, inline volumes
    volumes: PodVolumes = NO_VOLUMES

    @classmethod
    def of(cls, pod: PodInfo, devices: tuple[int, ...] | None = None) -> "PodUsage":
        """A pod's usage; ``devices``: the devices chosen for it (None: those of its
        `DEVICES_ANNOTATION`, if any; the table picks them when there are none).

        A pod with ``nominated_devices`` on its ``nominated_node_name`` and no ``devices`` given
        is counted on those, `pinned` (the nomination's or gang hold's devices)."""
        try:
            gpu = device_request(pod.requests)
        except ValueError:
            gpu = None  # the GPUDevice plugin's PreFilter rejects such a pod; counted by its sums only
        pinned = False
        if devices is None:
            if gpu is not None and pod.nominated_devices and pod.nominated_node_name:
                devices, pinned = pod.nominated_devices, True
            else:
                devices = devices_of_object(pod.obj) if gpu is not None else ()
        return cls(pod.uid, pod.key, pod.requests, pod.nonzero_cpu_milli, pod.nonzero_memory_bytes, pod.host_ports,
                   pod.namespace, pod.labels, pod.deleting, pod.pod_affinity, pod.priority, pod.start_time_s,
                   pod.preempted, gpu, tuple(devices), pinned, pod.volumes)


#: kinds of the terms of counted pods in `NodeTable.term_slots`
REQUIRED_AFFINITY, REQUIRED_ANTI_AFFINITY = "required_affinity", "required_anti_affinity"
PREFERRED_AFFINITY, PREFERRED_ANTI_AFFINITY = "preferred_affinity", "preferred_anti_affinity"


def _weighted_terms(a: PodAffinity) -> Iterable[tuple[str, int, AffinityTerm]]:
    for t in a.required_affinity:
        yield REQUIRED_AFFINITY, 1, t
    for t in a.required_anti_affinity:
        yield REQUIRED_ANTI_AFFINITY, 1, t
    for w, t in a.preferred_affinity:
        yield PREFERRED_AFFINITY, w, t
    for w, t in a.preferred_anti_affinity:
        yield PREFERRED_ANTI_AFFINITY, w, t


class NodeTable:
    """Column store of nodes and their usage (see module docstring).

    Slots of removed nodes are kept with ``valid[slot] = False`` and reused by later adds.
    Not thread-safe: one owner (a shard, or the simulate command) mutates it.
    """

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = max(8, capacity)
        self.n = 0  # high-water mark of used slots
        self.names: list[str | None] = []
        self.index: dict[str, int] = {}
        self.nodes: list[NodeInfo | None] = []
        self._free_slots: list[int] = []
        self.resources: list[str] = list(_INITIAL_RESOURCES)
        self.res_index: dict[str, int] = {r: i for i, r in enumerate(self.resources)}
        self.alloc = np.zeros((len(self.resources), self.capacity), np.int64)
        self.requested = np.zeros((len(self.resources), self.capacity), np.int64)
        #: scoring usage: row 0 cpu millicores, row 1 memory bytes (kube's NonZeroRequested)
        self.nonzero_requested = np.zeros((2, self.capacity), np.int64)
        self.valid = np.zeros(self.capacity, bool)
        self.unschedulable = np.zeros(self.capacity, bool)
        #: the GPU devices of each slot (`shardsched.cache.devices`)
        self.devices = DeviceColumns(self.capacity)
        self.label_codes: dict[str, np.ndarray] = {}
        self.label_vocab: dict[str, dict[str, int]] = {}
        self.taint_set_id = np.zeros(self.capacity, np.int32)
        self.taint_sets: list[tuple[Taint, ...]] = [()]
        self._taint_set_index: dict[tuple[Taint, ...], int] = {(): 0}
        #: slot -> host ports in use by the pods on that node (only nodes with any)
        self.used_ports: dict[int, list[ContainerPort]] = {}
        self.pods: list[dict[str, PodUsage]] = []
        self.pod_slot: dict[str, int] = {}
        self._pod_columns: PodColumns | None = None
        #: pods bound to a node the table has not seen yet: node name -> {uid: usage}
        self.orphans: dict[str, dict[str, PodUsage]] = {}
        #: namespace -> labels, for namespaceSelector (a namespace not listed has only its name label)
        self.namespace_labels: dict[str, dict[str, str]] = {}
        #: the Services and workloads whose selectors PodTopologySpread's default constraints read
        self.spread_selectors = SpreadSelectors()
        # pods counted on nodes, by namespace and by (namespace, label key, value): uids
        self._ns_pods: dict[str, set[str]] = {}
        self._label_pods: dict[tuple[str, str, str], set[str]] = {}
        #: (namespace, label key, value) -> pods per slot (int16, shape (capacity,)), kept up to date
        #: for the labels a one-label selector asked for (`count_matching`)
        self._label_counts: dict[tuple[str, str, str], np.ndarray] = {}
        self._deleting: set[str] = set()  # counted pods with a deletionTimestamp
        #: (kind, weight, term) -> counted pods with that term per slot (int16, shape (capacity,): a node
        #: holds far fewer than 32,767 pods; 10 kB per term at 5,000 nodes);
        #: kinds are REQUIRED_AFFINITY, ... (weight 1 for required terms). kube's PodsWithAffinity,
        #: grouped by term: pods stamped from one template share one entry.
        self.term_slots: dict[tuple[str, int, AffinityTerm], np.ndarray] = {}
        self._term_pods: dict[tuple[str, int, AffinityTerm], int] = {}  # pods per entry of term_slots
        #: changes whenever a counted pod with pod (anti-)affinity terms is added or removed, a
        #: namespace's labels change (`set_namespaces`) or a spread selector does (`set_spread_selectors`)
        self.affinity_generation = 0
        self._reads_label: tuple[int, dict[str, bool]] = (-1, {})  # `reads_pod_label`'s, per generation
        #: the cluster's storage objects the volume plugins read (`VolumeCatalog`), None where the
        #: owner keeps none (the volume plugins then hold the pods that need them)
        self.volumes: VolumeCatalog | None = None
        #: "namespace/claim" -> uids of the counted pods that use the claim (VolumeRestrictions'
        #: ReadWriteOncePod check), and slot -> uids of its counted pods with volumes
        self.claim_users: dict[str, set[str]] = {}
        self.volume_pods: dict[int, set[str]] = {}
        self._claims_generation = 0
        self.static_generation = 0
        self._all_have: dict[tuple[int, int], bool] = {}
        self.change_log: list[int] = []
        self.log_base = 0

    # ------------------------------------------------------------------ sizing
    def _grow(self, need: int) -> None:
        if need <= self.capacity:
            return
        cap = max(need, self.capacity * 2)

        def grow2(a: np.ndarray) -> np.ndarray:
            out = np.zeros((a.shape[0], cap), a.dtype)
            out[:, : a.shape[1]] = a
            return out

        def grow1(a: np.ndarray, fill=0) -> np.ndarray:
            out = np.full(cap, fill, a.dtype)
            out[: a.shape[0]] = a
            return out

        self.alloc, self.requested = grow2(self.alloc), grow2(self.requested)
        self.nonzero_requested = grow2(self.nonzero_requested)
        self.valid, self.unschedulable = grow1(self.valid), grow1(self.unschedulable)
        self.taint_set_id = grow1(self.taint_set_id)
        self.devices.grow(cap)
        for k, col in self.label_codes.items():
            self.label_codes[k] = grow1(col, -1)
        for k, counts in self._label_counts.items():
            self._label_counts[k] = grow1(counts)
        for k, counts in self.term_slots.items():
            self.term_slots[k] = grow1(counts)
        self.capacity = cap

    def resource_row(self, name: str) -> int:
        """Row of resource ``name`` in alloc/requested, adding a zero row for a new resource
        (a node that does not advertise a resource has 0 of it)."""
        row = self.res_index.get(name)
        if row is None:
            row = len(self.resources)
            self.resources.append(name)
            self.res_index[name] = row
            self.alloc = np.vstack([self.alloc, np.zeros((1, self.capacity), np.int64)])
            self.requested = np.vstack([self.requested, np.zeros((1, self.capacity), np.int64)])
        return row

    # ------------------------------------------------------------------ nodes
    @property
    def num_nodes(self) -> int:
        """Number of nodes in the table (valid slots)."""
        return len(self.index)

    def log_position(self) -> int:
        return self.log_base + len(self.change_log)

    def changed_since(self, position: int) -> np.ndarray | None:
        """Slots whose usage changed since ``position`` (int array, unique), or None if the log
        was trimmed past it (the caller must recompute everything)."""
        if position < self.log_base:
            return None
        tail = self.change_log[position - self.log_base:]
        if len(tail) <= 16:
            return np.array(sorted(set(tail)), np.int64)
        return np.unique(np.fromiter(tail, np.int64, len(tail)))

    def _touch(self, slot: int) -> None:
        if len(self.change_log) >= _LOG_LIMIT:
            self.log_base += len(self.change_log)
            self.change_log.clear()
        self.change_log.append(slot)

    def _label_column(self, key: str) -> np.ndarray:
        col = self.label_codes.get(key)
        if col is None:
            col = np.full(self.capacity, -1, np.int32)
            self.label_codes[key] = col
            self.label_vocab[key] = {}
        return col

    def label_code(self, key: str, value: str) -> int:
        """Code of ``value`` in the column of label ``key`` (-2 if no node has that value: matches none)."""
        return self.label_vocab.get(key, {}).get(value, -2)

    def _set_static(self, slot: int, node: NodeInfo) -> None:
        for key, col in self.label_codes.items():
            col[slot] = -1
        for key, value in node.labels.items():
            col = self._label_column(key)
            vocab = self.label_vocab[key]
            code = vocab.get(value)
            if code is None:
                code = len(vocab)
                vocab[value] = code
            col[slot] = code
        # declaration order kept: kube reports the first untolerated taint in spec.taints order
        ts = tuple(node.taints)
        tid = self._taint_set_index.get(ts)
        if tid is None:
            tid = len(self.taint_sets)
            self.taint_sets.append(ts)
            self._taint_set_index[ts] = tid
        self.taint_set_id[slot] = tid
        self.unschedulable[slot] = node.unschedulable
        for r in range(len(self.resources)):
            self.alloc[r, slot] = 0
        for name, value in node.allocatable.items():
            row = self.resource_row(name)  # may grow self.alloc: index it afterwards
            self.alloc[row, slot] = value
        count, model, memory = node_devices(node.allocatable, node.labels)
        used: dict[int, int] = {}
        for u in self.pods[slot].values() if slot < len(self.pods) else ():
            if u.gpu is not None:
                for i in u.devices:
                    used[i] = used.get(i, 0) + u.gpu.milli
        self.devices.set_node(slot, count, model, memory, used)
        self.static_generation += 1

    def add_node(self, node: NodeInfo) -> int:
        """Add a node, or update it if a node of that name exists. Returns its slot.

        Pods already recorded as bound to this name (seen before the node) are counted on it.
        """
        slot = self.index.get(node.name)
        if slot is not None:
            self.nodes[slot] = node
            self._set_static(slot, node)
            self._touch(slot)
            return slot
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            slot = self.n
            self._grow(slot + 1)
            self.n += 1
            self.names.append(None)
            self.nodes.append(None)
            self.pods.append({})
        self.names[slot] = node.name
        self.nodes[slot] = node
        self.index[node.name] = slot
        self.valid[slot] = True
        self.requested[:, slot] = 0
        self.nonzero_requested[:, slot] = 0
        self.pods[slot] = {}
        self.used_ports.pop(slot, None)
        self._set_static(slot, node)
        self._touch(slot)
        for usage in self.orphans.pop(node.name, {}).values():
            self._add_usage(slot, usage)
        return slot

    def add_nodes(self, nodes: Iterable[NodeInfo]) -> None:
        """Add many nodes (same as calling `add_node` for each)."""
        nodes = list(nodes)
        self._grow(self.n + len(nodes))
        for node in nodes:
            self.add_node(node)

    def remove_node(self, name: str, keep_pods: bool = False) -> list[PodUsage]:
        """Remove a node; returns the pods that were counted on it. No-op if absent.

        ``keep_pods``: the node was deleted from the cluster but its pods may still be bound to
        its name (pod GC has not run yet): keep them as orphans, counted again if a node of that
        name comes back, as kube-scheduler's cache keeps a deleted node's NodeInfo while pods
        remain on it. Otherwise (the node moved to another shard) they are forgotten here.
        """
        slot = self.index.pop(name, None)
        if slot is None:
            return []
        usages = list(self.pods[slot].values())
        for u in usages:
            self.pod_slot.pop(u.uid, None)
            self._index(slot, u, -1)
        if keep_pods and usages:
            self.orphans.setdefault(name, {}).update({u.uid: u for u in usages})
        self.pods[slot] = {}
        self.names[slot] = None
        self.nodes[slot] = None
        self.valid[slot] = False
        self.requested[:, slot] = 0
        self.nonzero_requested[:, slot] = 0
        self.used_ports.pop(slot, None)
        self.devices.clear(slot)
        self._free_slots.append(slot)
        self.static_generation += 1
        self._touch(slot)
        return usages

    def set_unschedulable(self, name: str, value: bool) -> None:
        """Cordon (True) or uncordon a node. Raises KeyError if absent."""
        slot = self.index[name]
        node = self.nodes[slot]
        if node is not None:
            node.unschedulable = value
        self.unschedulable[slot] = value
        self.static_generation += 1

    # ------------------------------------------------------------------ pods
    def _add_usage(self, slot: int, u: PodUsage) -> PodUsage:
        if u.gpu is not None:
            u = self._place_devices(slot, u)
        for name, value in u.requests.items():
            row = self.resource_row(name)  # may grow self.requested: index it afterwards
            self.requested[row, slot] += value
        self.nonzero_requested[0, slot] += u.nonzero_cpu_milli
        self.nonzero_requested[1, slot] += u.nonzero_memory_bytes
        if u.host_ports:
            self.used_ports.setdefault(slot, []).extend(u.host_ports)
        self.pods[slot][u.uid] = u
        self.pod_slot[u.uid] = slot
        self._index(slot, u, 1)
        self._touch(slot)
        return u

    def _place_devices(self, slot: int, u: PodUsage) -> PodUsage:
        """Take the devices of a GPU pod: its own if they fit, else the table's best fit, else (a
        pod bound by someone else that does not fit: the cluster's truth is counted anyway) the
        devices with the most free. A pod whose own devices do not fit now but are ``pinned`` (a
        nomination or gang hold, whose room its victims are still leaving) keeps them, over 1000
        until the victims are gone. Returns the usage with the devices it holds."""
        dev, req = self.devices, u.gpu
        if u.pinned and dev.valid(slot, u.devices, req):
            devices = u.devices
        else:
            devices = u.devices if dev.fits(slot, u.devices, req) else dev.pick(slot, req)
        if not devices:
            n = int(dev.count[slot])
            order = np.argsort(-dev.free[slot, :n], kind="stable")
            devices = tuple(int(i) for i in order[: req.count])
        dev.take(slot, devices, req.milli)
        return u if devices == u.devices else dataclasses.replace(u, devices=tuple(devices))

    def _index(self, slot: int, u: PodUsage, delta: int) -> None:
        """Add (delta 1) or remove (-1) a counted pod in the label, term and volume indexes."""
        ns = u.namespace
        if not u.volumes.empty:
            self._index_volumes(slot, u, delta)
        keys = [(ns, k, v) for k, v in u.labels.items()]
        for k in keys:
            counts = self._label_counts.get(k)
            if counts is not None:
                counts[slot] += delta
        if u.deleting:
            (self._deleting.add if delta > 0 else self._deleting.discard)(u.uid)
        if delta > 0:
            self._ns_pods.setdefault(ns, set()).add(u.uid)
            for k in keys:
                self._label_pods.setdefault(k, set()).add(u.uid)
        else:
            for index, k in ((self._ns_pods, ns), *((self._label_pods, k) for k in keys)):
                uids = index.get(k)
                if uids is not None:
                    uids.discard(u.uid)
                    if not uids:
                        del index[k]
        if u.affinity.empty:
            return
        for term in _weighted_terms(u.affinity):
            counts = self.term_slots.get(term)
            if counts is None:
                counts = self.term_slots[term] = np.zeros(self.capacity, np.int16)
            counts[slot] += delta
            left = self._term_pods[term] = self._term_pods.get(term, 0) + delta
            if left <= 0:
                del self.term_slots[term], self._term_pods[term]
        self.affinity_generation += 1

    def _index_volumes(self, slot: int, u: PodUsage, delta: int) -> None:
        on_slot = self.volume_pods.setdefault(slot, set())
        (on_slot.add if delta > 0 else on_slot.discard)(u.uid)
        if not on_slot:
            del self.volume_pods[slot]
        for claim in u.volumes.claims:
            key = f"{u.namespace}/{claim}"
            users = self.claim_users.setdefault(key, set())
            (users.add if delta > 0 else users.discard)(u.uid)
            if not users:
                del self.claim_users[key]
        if u.volumes.claims:
            self._claims_generation += 1

    @property
    def volume_generation(self) -> int:
        """Moves whenever the storage objects (`volumes`) or the counted pods' claims change: what
        VolumeBinding, VolumeRestrictions' claim check and NodeVolumeLimits read beyond one node."""
        return self._claims_generation + (self.volumes.generation if self.volumes is not None else 0)

    def add_pod(self, usage: PodUsage, node_name: str) -> bool:
        """Count a pod on a node (kube's AssumePod / AddPod). Idempotent by pod uid; a pod counted
        on that node already with other requests (an in-place resize) is counted again with these
        (kube's UpdatePod).

        Returns:
            True if the pod is now counted on ``node_name``; False if the node is unknown (the pod
            is kept as an orphan and counted when the node is added).
        """
        if usage.uid in self.pod_slot:
            slot = self.pod_slot[usage.uid]
            if self.names[slot] == node_name:
                old = self.pods[slot][usage.uid]
                if (old.requests == usage.requests and old.nonzero_cpu_milli == usage.nonzero_cpu_milli
                        and old.nonzero_memory_bytes == usage.nonzero_memory_bytes):
                    return True
            self.remove_pod(usage.uid)
        slot = self.index.get(node_name)
        if slot is None:
            self.orphans.setdefault(node_name, {})[usage.uid] = usage
            return False
        self._add_usage(slot, usage)
        return True

    def remove_pod(self, uid: str) -> PodUsage | None:
        """Stop counting a pod (kube's ForgetPod / RemovePod). Safe to call for unknown pods."""
        slot = self.pod_slot.pop(uid, None)
        if slot is None:
            for pods in self.orphans.values():
                if uid in pods:
                    return pods.pop(uid)
            return None
        u = self.pods[slot].pop(uid)
        self._index(slot, u, -1)
        if u.gpu is not None:
            self.devices.take(slot, u.devices, -u.gpu.milli)
        for name, value in u.requests.items():
            self.requested[self.res_index[name], slot] -= value
        self.nonzero_requested[0, slot] -= u.nonzero_cpu_milli
        self.nonzero_requested[1, slot] -= u.nonzero_memory_bytes
        if u.host_ports:
            ports = self.used_ports.get(slot, [])
            for p in u.host_ports:
                ports.remove(p)
            if not ports:
                self.used_ports.pop(slot, None)
        self._touch(slot)
        return u

    def devices_of(self, uid: str) -> tuple[int, ...]:
        """Indices of the GPU devices a counted pod holds on its node (() for none)."""
        slot = self.pod_slot.get(uid)
        return () if slot is None else self.pods[slot][uid].devices

    def pod_columns(self) -> PodColumns:
        """The counted pods as rows of arrays (`PodColumns`, what DefaultPreemption's vectorized
        search reads), brought up to date with the nodes whose pods changed since the last call."""
        if self._pod_columns is None:
            self._pod_columns = PodColumns(self)
        self._pod_columns.sync()
        return self._pod_columns

    def node_of(self, uid: str) -> str | None:
        """Name of the node a pod is counted on, or None."""
        slot = self.pod_slot.get(uid)
        return None if slot is None else self.names[slot]

    # ------------------------------------------------------------------ namespaces
    def set_namespaces(self, labels: Mapping[str, Mapping[str, str]], removed: Iterable[str] = (),
                       replace: bool = False) -> bool:
        """Namespaces' labels (namespace name -> labels, as `namespace_labels_of` gives them) and
        the namespaces deleted; ``replace``: ``labels`` is the whole set (a relist).

        Returns True if any namespace's labels changed; then ``affinity_generation`` moves, since a
        namespaceSelector may now select other namespaces (every cached affinity result is stale).
        """
        new = {name: dict(v) for name, v in labels.items()}
        if replace:
            changed = new != self.namespace_labels
            if changed:
                self.namespace_labels = new
        else:
            changed = False
            for name, v in new.items():
                if self.namespace_labels.get(name) != v:
                    self.namespace_labels[name] = v
                    changed = True
            for name in removed:
                if self.namespace_labels.pop(name, None) is not None:
                    changed = True
        if changed:
            self.affinity_generation += 1
        return changed

    def set_spread_selectors(self, upserts: Iterable[WorkloadSelector] = (), removed: Iterable[WorkloadKey] = (),
                             replace: bool = False) -> bool:
        """Services, ReplicationControllers, ReplicaSets and StatefulSets created or changed, and the
        keys of those deleted; ``replace``: ``upserts`` is the whole set (a relist)
        (`SpreadSelectors.apply`).

        Returns True if a selector changed; then ``affinity_generation`` moves, since the pods a
        pod's default spread constraints count may be others now.
        """
        changed = self.spread_selectors.apply(upserts, removed, replace)
        if changed:
            self.affinity_generation += 1
        return changed

    def reads_pod_label(self, key: str) -> bool:
        """Whether a counted pod's pod (anti-)affinity term or a spread selector (a Service's or a
        workload's, read by PodTopologySpread's default constraints) reads the pod label ``key``:
        then two pods that differ only by that label may fit or score differently here. Cached
        until ``affinity_generation`` moves."""
        generation, memo = self._reads_label
        if generation != self.affinity_generation:
            memo = {}
            self._reads_label = (self.affinity_generation, memo)
        hit = memo.get(key)
        if hit is None:
            sel = self.spread_selectors
            selectors = [term.selector for _, _, term in self.term_slots]
            selectors += [x for by in sel.services.values() for x in by.values()] + list(sel.controllers.values())
            hit = memo[key] = any(x is not None and x.reads(key) for x in selectors)
        return hit

    # ------------------------------------------------------------------ pods by labels
    def labels_of_namespace(self, namespace: str) -> Mapping[str, str]:
        """A namespace's labels (`namespace_labels`, else only ``kubernetes.io/metadata.name``)."""
        labels = self.namespace_labels.get(namespace)
        return labels if labels is not None else {NAMESPACE_NAME_LABEL: namespace}

    def matching_pods(self, namespaces: Iterable[str], namespace_selector: LabelSelector | None,
                      selector: LabelSelector | None, skip_deleting: bool = False) -> set[str]:
        """Uids of the pods counted on nodes that are in one of ``namespaces`` or in a namespace
        ``namespace_selector`` matches, and whose labels ``selector`` matches (None: no pod).

        Cost: the pods of those namespaces that carry the selector's ``matchLabels`` (an index
        lookup), not every pod. ``skip_deleting`` leaves out pods with a deletionTimestamp.
        """
        if selector is None:
            return set()
        chosen = {ns for ns in namespaces if ns in self._ns_pods}
        if namespace_selector is not None:
            chosen.update(ns for ns in self._ns_pods if namespace_selector.matches(self.labels_of_namespace(ns)))
        out: set[str] = set()
        for ns in chosen:
            if selector.match_labels:
                sets = sorted((self._label_pods.get((ns, k, v), set()) for k, v in selector.match_labels), key=len)
                found = sets[0].intersection(*sets[1:])
            else:
                found = self._ns_pods[ns]
            if skip_deleting and self._deleting:
                found = found - self._deleting
            if selector.match_expressions:
                found = {uid for uid in found if selector.matches(self.pods[self.pod_slot[uid]][uid].labels)}
            out |= found
        return out

    def count_matching(self, namespaces: Iterable[str], namespace_selector: LabelSelector | None,
                       selector: LabelSelector | None, skip_deleting: bool = False) -> np.ndarray:
        """int64 array of shape (n,): per slot, the pods `matching_pods` would return.

        A selector of one ``matchLabels`` pair (the usual ``app: x``) is answered from a per-slot
        count kept up to date as pods come and go (made at its first use, at most 1,024 kept), so
        its cost does not grow with the matching pods; other selectors cost what
        `matching_pods` costs.
        """
        if selector is None or selector.match_expressions or len(selector.match_labels) != 1:
            return self.pods_per_slot(self.matching_pods(namespaces, namespace_selector, selector, skip_deleting))
        key, value = selector.match_labels[0]
        chosen = {ns for ns in namespaces if ns in self._ns_pods}
        if namespace_selector is not None:
            chosen.update(ns for ns in self._ns_pods if namespace_selector.matches(self.labels_of_namespace(ns)))
        total = np.zeros(self.n, np.int64)
        for ns in chosen:
            counts = self._label_counts.get((ns, key, value))
            if counts is None:
                if len(self._label_counts) >= 1024:
                    self._label_counts.pop(next(iter(self._label_counts)))
                counts = np.zeros(self.capacity, np.int16)
                uids = self._label_pods.get((ns, key, value), ())
                np.add.at(counts, np.fromiter((self.pod_slot[u] for u in uids), np.int64, len(uids)), 1)
                self._label_counts[(ns, key, value)] = counts
            total += counts[: self.n]
        if skip_deleting and self._deleting:
            gone = [u for u in self._deleting if self.pods[self.pod_slot[u]][u].namespace in chosen
                    and self.pods[self.pod_slot[u]][u].labels.get(key) == value]
            if gone:
                total -= self.pods_per_slot(gone)
        return total

    def pods_per_slot(self, uids: Iterable[str]) -> np.ndarray:
        """int64 array of shape (n,): how many of the pods ``uids`` (counted pods) are on each slot."""
        slots = np.fromiter((self.pod_slot[u] for u in uids), np.int64)
        return np.bincount(slots, minlength=self.n)[: self.n].astype(np.int64)

    def topology_codes(self, key: str) -> np.ndarray:
        """int32 array of shape (n,): each slot's code of node label ``key`` (-1: no such label;
        `label_vocab` maps values to codes)."""
        col = self.label_codes.get(key)
        return np.full(self.n, -1, np.int32) if col is None else col[: self.n]

    # ------------------------------------------------------------------ reads
    def allocatable_of(self, name: str) -> dict[str, int]:
        """Allocatable of a node in canonical units (only resources it advertises or that are set)."""
        slot = self.index[name]
        return {r: int(self.alloc[i, slot]) for i, r in enumerate(self.resources) if self.alloc[i, slot]}

    def requested_of(self, name: str) -> dict[str, int]:
        """Sum of the requests of the pods counted on a node, canonical units (zeros omitted)."""
        slot = self.index[name]
        return {r: int(self.requested[i, slot]) for i, r in enumerate(self.resources) if self.requested[i, slot]}

    def free(self, resource: str) -> np.ndarray:
        """alloc - requested for one resource, int64 array of shape (n,) over slots [0, n)."""
        row = self.resource_row(resource)
        return self.alloc[row, : self.n] - self.requested[row, : self.n]

    def all_have(self, row: int) -> bool:
        """True if every node in the table has a positive allocatable of resource ``row`` and no
        slot is free (cached until the next static change); lets scorers skip per-node guards."""
        key = (row, self.static_generation)
        hit = self._all_have.get(key)
        if hit is None:
            n = self.n
            hit = bool(self.valid[:n].all() and (self.alloc[row, :n] > 0).all())
            if len(self._all_have) > 256:
                self._all_have.clear()
            self._all_have[key] = hit
        return hit

    def valid_slots(self) -> np.ndarray:
        """Bool array of shape (n,): slots holding a node."""
        return self.valid[: self.n]
