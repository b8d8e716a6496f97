"""SimCluster: the embedded simulated cluster, with the Kubernetes API server's semantics.

Nodes and Pods are plain dicts (camelCase, as in YAML). Every write gets the next
``resourceVersion`` (an int here; a string in ``metadata.resourceVersion``, as kube) and one watch
event; `SimCluster.events_since` serves the watch from a bounded history and answers `Gone` (410)
once the history no longer reaches back, so callers list again (the list-then-watch protocol).

Binding follows the ``pods/binding`` subresource: 404 for a missing pod, 409 for a pod that already
has ``spec.nodeName``. A successful bind then runs a kubelet-like admission (kubelet's
``lifecycle.generalFilter`` resource check): if the node's non-terminal bound pods plus this pod
request more than ``status.allocatable`` of any resource (``pods`` included), the pod stays bound but
becomes ``Failed`` with reason ``OutOf<resource>`` and kubelet's message, which is how an overcommit
becomes visible and countable (`SimCluster.invariants`). Per-node request totals are kept
incrementally, so a bind costs O(resources of the pod), not O(pods).

Where the simulator differs from a real cluster (each on purpose, for a faster or clearer signal):

- A bind writes ``spec.nodeName``, ``PodScheduled=True`` and the kubelet's phase (``Running`` or
  ``Failed``) in one write, i.e. one MODIFIED event, instead of a bind then a kubelet status update.
- Binding to a node that does not exist answers 404 (a real API server accepts it and the pod GC
  controller deletes the pod later), and a uid that differs from the current pod's (the pod was
  deleted and re-created) answers 404 (a real server answers 409 for the failed uid precondition);
  either way the binding is for a pod or node that is gone.
- Graceful deletion runs on the cluster's own clock (``clock``), its grace periods multiplied by
  ``grace_period_scale``; the default scale 0 deletes every pod at once (no ``deletionTimestamp``
  phase), as a trace replay expects. With a scale above 0 a deleted bound pod is terminating: it
  gets ``metadata.deletionTimestamp`` (a MODIFIED event) and keeps its node's resources until its
  grace period ends, then goes (DELETED), which the kubelet and the API server do between them.
  The end is noticed by the next call of any method (each one first finishes the pods due).
- A PodDisruptionBudget's status is written in the same call as the pod change that alters it
  (the disruption controller's resync, at once); its expected pod count is the number of pods its
  selector selects (upstream asks the pods' controllers for their scale when the budget is a
  percentage or ``maxUnavailable``), and a pod is healthy when it is bound, ``Running`` and not
  terminating (upstream asks for the ``Ready`` condition, which the simulator does not write).
- ReplicaSet-like sets (`SimCluster.create_replica_set`) replace a pod that stops being active at
  once, inside the write that stopped it: an optional controller so that the victims of a
  preemption come back, as a Deployment's do. Each set is also a ReplicaSet object of the watch
  (``spec.selector`` its template's labels), so its pods get PodTopologySpread's default
  constraints as a Deployment's do.
- Services, ReplicationControllers, ReplicaSets and StatefulSets (`SimCluster.put_spread_selector`)
  are stored and watched for their selectors only: no controller creates their pods.
- Setting ``spec.unschedulable`` also adds or removes the ``node.kubernetes.io/unschedulable``
  NoSchedule taint in the same write (what the node lifecycle controller does right after).
- PersistentVolumes, claims, StorageClasses, CSINodes and CSIStorageCapacities are stored and
  watched, and the PV controller binds and provisions in the same call as the write that asks for
  it (`shardsched.sim.volumes`: a PV's ``claimRef`` binds its claim, an Immediate claim takes a
  matching PV or a provisioned one, a claim annotated ``volume.kubernetes.io/selected-node`` gets a
  PV reachable from that node); provisioning never fails and takes no time.
- Events (`record_event`) are kept per object until the object is deleted (a real cluster keeps
  them for an hour), at most the 32 newest distinct ones, de-duplicated by (type, reason,
  message) with a count as kube's event correlator does; they are not part of the watch and get
  no resourceVersion.

Returned objects are shared snapshots, as in a client-go informer cache: never modify them (copy
first). Each write stores new dicts, so a snapshot never changes after it was returned.

Thread-safe (one lock). Plain enough for ``ray.remote(SimCluster)``: constructor arguments and
return values are plain values and dataclasses; errors are the typed `shardsched.cluster.errors`.
It implements the cluster contract (`shardsched.cluster.ClusterBackend`), as one object (or one
Ray actor) every process calls: no per-process copies, no write gate.
"""

from __future__ import annotations

import heapq
import random
import threading
import time
import uuid
from collections import Counter, abc
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from shardsched.api.objects import (DEFAULT_GRACE_PERIOD_S, TERMINAL_PHASES, UNSCHEDULABLE_TAINT_KEY, NodeInfo, PodInfo,
                                    as_dict, disruption_target_condition)
from shardsched.api.quantity import CPU, EPHEMERAL_STORAGE, MEMORY, PODS
from shardsched.cache.devices import DEVICES_ANNOTATION, MILLI, device_request, parse_devices
from shardsched.api.podaffinity import namespace_labels_of
from shardsched.api.podgroup import API_VERSION as PODGROUP_API_VERSION, PodGroup, group_key_of, group_status
from shardsched.api.validation import labels_problems, name_problem, pod_problems, validate_name
from shardsched.errors import InvalidObjectError
from shardsched.api.requests import RESIZE_INFEASIBLE, RESIZE_PENDING_CONDITION, pod_requests
from shardsched.api.workloads import REPLICA_SET, SERVICE, workload_selector_of
from shardsched.cluster import (ADDED, BOUND, DELETED, MODIFIED, NAMESPACE, NODE, PDB, POD, PODGROUP, PV, PVC,
                                SPREAD_SELECTOR_KINDS, STORAGE_CLASS, CSI_NODE, CSI_STORAGE_CAPACITY, STORAGE_KINDS,
                                AlreadyExists, Binding,
                                BindResult, Capabilities, Conflict, Invalid, NotFound, ServerError, Timeout, WatchEvent,
                                read_event_log, wait_for_events)
from shardsched.cluster.preemption import Candidate, CandidateResult, prepare_candidates
from shardsched.sim.disruption import (DISRUPTION_ALLOWED, PDB_API_VERSION, Budget, budget_status, healthy,
                                       parse_budget)
from shardsched.sim.volumes import SimVolumes

#: PriorityClasses every cluster has (``scheduling.k8s.io``'s built-in system classes).
SYSTEM_PRIORITY_CLASSES = {"system-cluster-critical": 2_000_000_000, "system-node-critical": 2_000_001_000}

#: Order in which kubelet's admission checks resources (``noderesources.fitsRequest``: pod count,
#: cpu, memory, ephemeral-storage, then extended resources, here sorted by name); the first
#: insufficient one names the rejection.
_ADMISSION_ORDER = (PODS, CPU, MEMORY, EPHEMERAL_STORAGE)

_CONDITION_STATUSES = ("True", "False", "Unknown")
_EVENT_TYPES = ("Normal", "Warning")
#: Distinct events kept per object (the oldest goes first), so a pod that fails scheduling for
#: ever-changing reasons cannot grow memory without bound.
_EVENTS_PER_OBJECT = 32


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """Faults injected into binds (all off by default); drawn from the cluster's seeded RNG, so a
    given seed and call order give the same faults.

    Attributes:
        bind_latency_s / bind_jitter_s: each bind or bind_many call answers after
            ``latency + uniform(0, jitter)`` seconds (one round trip per call: a batch is pipelined).
            The wait happens after the write, outside the lock, so concurrent callers overlap.
        bind_error_rate: fraction of bind items answering 500 without being applied.
        bind_conflict_rate: fraction answering a spurious 409 without being applied.
        bind_timeout_rate: fraction answering 504 (`Timeout`).
        timeout_applied_fraction: of the timeouts, the fraction whose bind was nevertheless applied
            (when it would have succeeded), as happens when a real API server commits but the answer
            is lost. 0.5 by default: a caller must not assume either outcome.

    Raises:
        ValueError: a negative time, a rate outside [0, 1], or rates summing above 1.
    """

    bind_latency_s: float = 0.0
    bind_jitter_s: float = 0.0
    bind_error_rate: float = 0.0
    bind_conflict_rate: float = 0.0
    bind_timeout_rate: float = 0.0
    timeout_applied_fraction: float = 0.5

    def __post_init__(self) -> None:
        if self.bind_latency_s < 0 or self.bind_jitter_s < 0:
            raise ValueError("bind latency and jitter must be >= 0 seconds")
        rates = (self.bind_error_rate, self.bind_conflict_rate, self.bind_timeout_rate, self.timeout_applied_fraction)
        if any(not 0.0 <= r <= 1.0 for r in rates):
            raise ValueError("fault rates must be in [0, 1]")
        if self.bind_error_rate + self.bind_conflict_rate + self.bind_timeout_rate > 1.0:
            raise ValueError("bind_error_rate + bind_conflict_rate + bind_timeout_rate must be <= 1")

    @property
    def injects_errors(self) -> bool:
        return self.bind_error_rate + self.bind_conflict_rate + self.bind_timeout_rate > 0


def _now(after_s: float = 0.0) -> str:
    """RFC 3339 UTC timestamp (now, or ``after_s`` seconds from now) with second precision, as
    ``metav1.Time`` serializes."""
    return (datetime.now(timezone.utc) + timedelta(seconds=after_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _copy_tree(value: Any) -> Any:
    """Deep copy of plain YAML-like data (mappings, lists, scalars); mappings become dicts."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_copy_tree(v) for v in value]
    if isinstance(value, abc.Mapping):
        return {k: _copy_tree(v) for k, v in value.items()}
    return value


def _with_condition(conditions: list[dict], condition: Mapping[str, Any], now: str) -> list[dict] | None:
    """Upstream ``podutil.UpdatePodCondition``: replace the condition of the same type, keeping its
    ``lastTransitionTime`` unless the status changes. Returns the new list, or None if nothing
    changed."""
    new = {k: v for k, v in condition.items() if k != "lastTransitionTime"}
    for i, old in enumerate(conditions):
        if old.get("type") != new["type"]:
            continue
        if all(old.get(k) == v for k, v in new.items()):
            return None
        new["lastTransitionTime"] = now if old.get("status") != new["status"] else old.get("lastTransitionTime", now)
        return conditions[:i] + [new] + conditions[i + 1:]
    new["lastTransitionTime"] = now
    return conditions + [new]


def _admission_ordered(requests: Mapping[str, int]) -> dict[str, int]:
    """Requests with an entry > 0, in the order kubelet's admission checks them."""
    head = [(r, requests[r]) for r in _ADMISSION_ORDER if requests.get(r, 0) > 0]
    tail = sorted((r, v) for r, v in requests.items() if v > 0 and r not in _ADMISSION_ORDER)
    return dict(head + tail)


def _sync_unschedulable_taint(spec: dict) -> None:
    """Make ``spec.taints`` hold the unschedulable NoSchedule taint iff ``spec.unschedulable``
    (the node lifecycle controller's ``doNoScheduleTaintingPass``). Mutates ``spec`` (a fresh dict)."""
    taints = [t for t in spec.get("taints") or [] if t.get("key") != UNSCHEDULABLE_TAINT_KEY]
    if spec.get("unschedulable"):
        taints.append({"key": UNSCHEDULABLE_TAINT_KEY, "effect": "NoSchedule"})
    if taints:
        spec["taints"] = taints
    else:
        spec.pop("taints", None)


class SimCluster:
    """In-memory cluster with the API server's semantics (see the module docstring).

    Args:
        seed: seeds the fault RNG (``random.Random(seed)``) and the uid generator, so runs repeat.
        faults: bind latency and injected errors; None for none.
        history_limit: watch events kept for `events_since` (at least this many, at most 1/8 more);
            an older resourceVersion answers `Gone`.
        priority_classes: PriorityClass name -> value, besides the built-in system classes; a pod's
            ``priorityClassName`` is resolved into ``spec.priority`` on create (the Priority
            admission plugin).
        copy_inputs: deep-copy objects given to ``create_*`` (False only where the caller never
            reuses them, e.g. inside a Ray actor, whose arguments are private deserialized copies).
        clock: the cluster's clock, seconds (``time.monotonic``; a test may pass its own): when a
            terminating pod's grace period ends.
        grace_period_scale: factor applied to every grace period (1 waits as a kubelet would,
            0.01 makes 30 s last 0.3 s); 0, the default, deletes every pod at once.

    Raises:
        ValueError: ``history_limit`` < 1, or ``grace_period_scale`` < 0.
    """

    capabilities = Capabilities(kinds=frozenset({NODE, POD, NAMESPACE, PDB, PODGROUP, *SPREAD_SELECTOR_KINDS,
                                                 *STORAGE_KINDS}))
    #: Events and conditions are written at once, beside the binds: no `WriteGate`
    gate = None

    def __init__(self, seed: int = 0, faults: FaultConfig | None = None, history_limit: int = 100_000,
                 priority_classes: Mapping[str, int] | None = None, copy_inputs: bool = True,
                 clock: Callable[[], float] = time.monotonic, grace_period_scale: float = 0.0) -> None:
        if history_limit < 1:
            raise ValueError("history_limit must be >= 1")
        if grace_period_scale < 0:
            raise ValueError("grace_period_scale must be >= 0")
        self._lock = threading.Lock()
        #: notified at every change (`_commit`): what a long poll of `events_since` waits on
        self._changed = threading.Condition(self._lock)
        self._clock = clock
        self._grace_period_scale = grace_period_scale
        #: terminating pods: (end on the clock, sequence, pod key, uid), soonest first
        self._terminating: list[tuple[float, int, str, str]] = []
        self._terminating_seq = 0
        #: PodDisruptionBudgets by "namespace/name": the objects, their parsed spec, and per budget
        #: the pods its selector selects (pod key -> healthy); budget keys by namespace
        self._pdbs: dict[str, dict] = {}
        self._budgets: dict[str, Budget] = {}
        self._pdb_members: dict[str, dict[str, bool]] = {}
        self._budgets_in: dict[str, set[str]] = {}
        #: PodGroups by "namespace/name", their parsed spec, and per group the phases of its pods
        #: (pod key -> status.phase; and phase -> count): the pods whose group label names it
        self._pod_groups: dict[str, dict] = {}
        self._groups: dict[str, PodGroup] = {}
        self._group_members: dict[str, dict[str, str]] = {}
        self._group_phases: dict[str, Counter] = {}
        #: Services, ReplicationControllers, ReplicaSets and StatefulSets by (kind, namespace, name):
        #: objects only (no controller runs them), for their selectors (`put_spread_selector`)
        self._spread_objects: dict[tuple[str, str, str], dict] = {}
        #: ReplicaSet-like sets by "namespace/name" (`create_replica_set`), and the keys of each
        #: set's active pods (not terminating, not terminal)
        self._replica_sets: dict[str, dict] = {}
        self._rs_active: dict[str, set[str]] = {}
        #: PersistentVolumes, claims, StorageClasses, CSINodes, CSIStorageCapacities and the PV
        #: controller (`shardsched.sim.volumes`)
        self._storage = SimVolumes(self._commit, self._new_uid, _now,
                                   lambda name: (self._nodes.get(name) or {}).get("metadata", {}).get("labels"))
        #: copy objects passed to create_*; a Ray actor gets private deserialized copies already
        self._copy_inputs = copy_inputs
        self._faults = faults or FaultConfig()
        self._rng = random.Random(seed)
        self._uid_rng = random.Random(f"uid-{seed}")
        self._priority_classes = {**SYSTEM_PRIORITY_CLASSES, **(priority_classes or {})}
        self._history_limit = history_limit
        self._history_slack = max(1, history_limit // 8)
        self._history: list[WatchEvent] = []
        self._compacted_rv = 0  # rv of the newest event dropped from the history
        self._rv = 0
        self._nodes: dict[str, dict] = {}
        #: Namespace objects created; a pod may be created in any namespace without one (module
        #: docstring), which then has only its name label
        self._namespaces: dict[str, dict] = {}
        self._allocatable: dict[str, dict[str, int]] = {}
        self._pods: dict[str, dict] = {}  # "namespace/name" -> pod
        self._requests: dict[str, dict[str, int]] = {}  # pod key -> requests, admission order
        self._requested: dict[str, dict[str, int]] = {}  # node name -> sum over non-terminal bound pods
        self._on_node: dict[str, set[str]] = {}  # node name -> keys of pods bound to it
        self._bound_uids: set[str] = set()  # bind ledger of the pods that exist
        self._events: dict[tuple[str, str], list[dict]] = {}
        self._event_seq = 0
        self._stats = {"binds": 0, "admission_rejections": 0, "double_binds": 0, "bind_conflicts": 0}
        self._injected = {"server_errors": 0, "conflicts": 0, "timeouts": 0, "timeouts_applied": 0}

    # ----------------------------------------------------------------------------------- reads

    def list_nodes(self) -> tuple[list[dict], int]:
        """All nodes and the resourceVersion to watch from."""
        with self._locked():
            return list(self._nodes.values()), self._rv

    def list_pods(self) -> tuple[list[dict], int]:
        """All pods and the resourceVersion to watch from."""
        with self._locked():
            return list(self._pods.values()), self._rv

    def list_namespaces(self) -> tuple[list[dict], int]:
        """All Namespace objects and the resourceVersion to watch from."""
        with self._locked():
            return list(self._namespaces.values()), self._rv

    def list_pdbs(self) -> tuple[list[dict], int]:
        """All PodDisruptionBudget objects (``policy/v1``, with the status the simulated disruption
        controller wrote) and the resourceVersion to watch from."""
        with self._locked():
            return list(self._pdbs.values()), self._rv

    def list_spread_selectors(self) -> tuple[list[dict], int]:
        """All Services, ReplicationControllers, ReplicaSets (the sets' included) and StatefulSets
        and the resourceVersion to watch from."""
        with self._locked():
            return list(self._spread_objects.values()), self._rv

    def get_capabilities(self) -> Capabilities:
        """`capabilities`, as a call (`shardsched.cluster.ClusterBackend.get_capabilities`)."""
        return self.capabilities

    def list_storage(self, kind: str) -> tuple[list[dict], int]:
        """All objects of one storage kind (`shardsched.cluster.STORAGE_KINDS`) and the
        resourceVersion to watch from."""
        with self._locked():
            return list(self._storage.objects[kind].values()), self._rv

    def list_pvs(self) -> tuple[list[dict], int]:
        """All PersistentVolumes (with the status the simulated PV controller wrote) and the
        resourceVersion to watch from."""
        return self.list_storage(PV)

    def list_pvcs(self) -> tuple[list[dict], int]:
        """All PersistentVolumeClaims and the resourceVersion to watch from."""
        return self.list_storage(PVC)

    def list_storage_classes(self) -> tuple[list[dict], int]:
        """All StorageClasses and the resourceVersion to watch from."""
        return self.list_storage(STORAGE_CLASS)

    def list_csi_nodes(self) -> tuple[list[dict], int]:
        """All CSINodes and the resourceVersion to watch from."""
        return self.list_storage(CSI_NODE)

    def list_csi_storage_capacities(self) -> tuple[list[dict], int]:
        """All CSIStorageCapacities and the resourceVersion to watch from."""
        return self.list_storage(CSI_STORAGE_CAPACITY)

    def get_volume_object(self, kind: str, name: str, namespace: str | None = None) -> dict:
        """One storage object (a kind of `STORAGE_KINDS`). Raises: NotFound."""
        with self._locked():
            return self._storage.get(kind, name, namespace)

    def create_volume_object(self, obj: Any) -> dict:
        """Create a PersistentVolume, claim, StorageClass, CSINode or CSIStorageCapacity (by its
        ``kind``), then let the PV controller bind or provision (`shardsched.sim.volumes`).
        Raises: Invalid (the message names the field), AlreadyExists."""
        with self._locked():
            return self._storage.create(obj)

    def create_volume_objects(self, objs: Iterable[Any]) -> list[dict]:
        """Create storage objects in order, then let the PV controller work once
        (`SimVolumes.create_many`). Raises: Invalid, AlreadyExists (the objects before it created)."""
        with self._locked():
            return self._storage.create_many(objs)

    def update_volume_object(self, obj: Any) -> dict:
        """Replace a storage object (uid kept), then run the PV controller. Raises: NotFound, Invalid."""
        with self._locked():
            return self._storage.update(obj)

    def delete_volume_object(self, kind: str, name: str, namespace: str | None = None) -> dict:
        """Delete a storage object; a bound PV whose claim goes is reclaimed. Raises: NotFound."""
        with self._locked():
            return self._storage.delete(kind, name, namespace)

    def bind_volume(self, pv_name: str, namespace: str, claim: str, claim_uid: str) -> None:
        """VolumeBinding's PreBind write of a static binding (`shardsched.framework.interface.VolumeClient`):
        the PV's ``claimRef``; the PV controller binds the claim in the same call. Raises: NotFound."""
        with self._locked():
            self._storage.bind_volume(pv_name, namespace, claim, claim_uid)

    def set_selected_node(self, namespace: str, claim: str, node: str) -> None:
        """VolumeBinding's PreBind write for provisioning: the claim's ``volume.kubernetes.io/selected-node``;
        the PV controller provisions in the same call. Raises: NotFound."""
        with self._locked():
            self._storage.set_selected_node(namespace, claim, node)

    def claim_bound(self, namespace: str, claim: str) -> bool:
        """Whether the claim is bound (``volumeName`` and the bind-completed annotation). Raises: NotFound."""
        with self._locked():
            return self._storage.claim_bound(namespace, claim)

    def list_pod_groups(self) -> tuple[list[dict], int]:
        """All PodGroup objects (``scheduling.x-k8s.io/v1alpha1``, with the status the simulated
        PodGroup controller wrote) and the resourceVersion to watch from."""
        with self._locked():
            return list(self._pod_groups.values()), self._rv

    def get_pod_group(self, namespace: str, name: str) -> dict:
        """The PodGroup ``namespace/name``. Raises: NotFound."""
        with self._locked():
            pg = self._pod_groups.get(f"{namespace}/{name}")
        if pg is None:
            raise NotFound(f'podgroups.scheduling.x-k8s.io "{name}" not found')
        return pg

    def get_pdb(self, namespace: str, name: str) -> dict:
        """The PodDisruptionBudget ``namespace/name``. Raises: NotFound."""
        with self._locked():
            pdb = self._pdbs.get(f"{namespace}/{name}")
        if pdb is None:
            raise NotFound(f'poddisruptionbudgets.policy "{name}" not found')
        return pdb

    def get_namespace(self, name: str) -> dict:
        """The Namespace object ``name``. Raises: NotFound (never created: pods may still be in it)."""
        with self._locked():
            ns = self._namespaces.get(name)
        if ns is None:
            raise NotFound(f'namespaces "{name}" not found')
        return ns

    def get_node(self, name: str) -> dict:
        """The node named ``name``. Raises: NotFound."""
        with self._locked():
            node = self._nodes.get(name)
        if node is None:
            raise NotFound(f'nodes "{name}" not found')
        return node

    def get_pod(self, namespace: str, name: str) -> dict:
        """The pod ``namespace/name``. Raises: NotFound."""
        with self._locked():
            pod = self._pods.get(f"{namespace}/{name}")
        if pod is None:
            raise NotFound(f'pods "{name}" not found')
        return pod

    def events_since(self, rv: int | str, kinds: Iterable[str] | None = None,
                     limit: int | None = None, wait_s: float | None = None) -> tuple[list[WatchEvent], int]:
        """Watch events with resourceVersion > ``rv``, oldest first.

        Args:
            rv: from `list_nodes`/`list_pods` or a previous call (a string resourceVersion works).
            kinds: only these kinds (``Node``, ``Pod``, ``Namespace``, ``PodDisruptionBudget``);
                None for all.
            limit: at most this many events; None for all.
            wait_s: when nothing is new, wait up to this many seconds for the first change (a long
                poll, `shardsched.cluster.watch.wait_for_events`; the cluster's lock is free
                meanwhile, and a terminating pod whose grace period ends is deleted on time).

        Returns:
            (events, new_rv): pass ``new_rv`` to the next call. It is the current resourceVersion,
            or that of the last event returned when ``limit`` cut the answer short.

        Raises:
            Gone: events after ``rv`` were compacted away, or ``rv`` is newer than this cluster's
                (it came from another instance); list again.
            Invalid: ``rv`` is not an integer, or ``limit`` < 1.
        """
        with self._locked():
            return wait_for_events(
                self._changed, lambda: read_event_log(self._history, self._compacted_rv, self._rv, rv, kinds, limit,
                                                      "cluster"),
                wait_s, lambda: self._terminating[0][0] - self._clock() if self._terminating else None)

    def events_for(self, namespace: str, name: str) -> list[dict]:
        """Events recorded about an object, oldest first (``namespace`` "" for nodes)."""
        with self._locked():
            return list(self._events.get((namespace, name), ()))

    def requested(self, node_name: str) -> dict[str, int]:
        """Simulator introspection (no kube endpoint has it): the running request totals of the
        non-terminal pods bound to ``node_name``, canonical units, as the admission uses them."""
        with self._locked():
            return dict(self._requested.get(node_name, {}))

    def invariants(self) -> dict[str, Any]:
        """Counters for the invariants the chaos suite checks.

        Returns:
            overcommitted_nodes: sorted names of nodes whose non-terminal bound pods request more
                than allocatable of some resource (empty unless `update_node` shrank allocatable
                under its pods, or pods were created bound to a node before the node existed);
            admission_rejections: pods the kubelet-like admission failed (overcommit attempts);
            overcommitted_devices: sorted ``node/device`` of the GPU devices whose non-terminal
                bound pods take more than 1000 thousandths, by the devices of their
                `DEVICES_ANNOTATION` (pods without it are not counted here);
            double_binds: successful binds of a pod uid already bound (0 by the API's semantics;
                counted from the bind ledger as a self-check);
            bind_conflicts: 409s served on bind (real and injected);
            binds: successful binds;
            pods_bound: number of pods with ``spec.nodeName`` (admission-rejected ones included);
            pods_unbound: sorted ``namespace/name`` keys of pods without ``spec.nodeName``;
            injected_faults: {server_errors, conflicts, timeouts, timeouts_applied}.
        """
        with self._locked():
            over = sorted(
                name for name, alloc in self._allocatable.items()
                if any(v > alloc.get(r, 0) for r, v in self._requested.get(name, {}).items())
            )
            unbound = sorted(k for k, p in self._pods.items() if not p["spec"].get("nodeName"))
            devices = self._overcommitted_devices()
            return {
                "overcommitted_nodes": over,
                "overcommitted_devices": devices,
                **self._stats,
                "pods_bound": len(self._pods) - len(unbound),
                "pods_unbound": unbound,
                "injected_faults": dict(self._injected),
            }

    def _overcommitted_devices(self) -> list[str]:
        use: dict[tuple[str, int], int] = {}
        for key, pod in self._pods.items():
            node = pod["spec"].get("nodeName")
            annotations = pod["metadata"].get("annotations")
            if not node or not annotations or DEVICES_ANNOTATION not in annotations \
                    or pod.get("status", {}).get("phase") in TERMINAL_PHASES:
                continue
            try:
                req = device_request(self._requests[key])
            except ValueError:
                continue
            if req is None:
                continue
            for i in parse_devices(annotations[DEVICES_ANNOTATION]):
                use[node, i] = use.get((node, i), 0) + req.milli
        return sorted(f"{node}/{i}" for (node, i), milli in use.items() if milli > MILLI)

    # ---------------------------------------------------------------------------------- writes

    def create_pod(self, obj: Any) -> dict:
        """Create one pod; see `create_pods`."""
        return self.create_pods([obj])[0]

    def create_pods(self, objs: Iterable[Any]) -> list[dict]:
        """Create pods, all or none.

        Each object (dict or kubernetes client model) is copied, defaulted (namespace ``default``,
        ``spec.schedulerName`` ``default-scheduler``, ``spec.priority`` from its PriorityClass),
        validated with `PodInfo.from_object` and the API server's rules (`api.validation.pod_problems`:
        names, resource names, requests against limits), given a uid and ``creationTimestamp``, and its status
        reset to ``Pending`` (the API server's ``PrepareForCreate``). A pod created with
        ``spec.nodeName`` of an existing node goes through the kubelet-like admission at once.

        Returns:
            the stored pods, in order.

        Raises:
            Invalid: an object failed validation (message: ``namespace/name: field.path: what``).
            AlreadyExists: a name is taken, or repeated in ``objs``.
        """
        prepared = [self._prepare_pod(o) for o in objs]
        with self._locked():
            seen: set[str] = set()
            for key, _, _ in prepared:
                if key in self._pods or key in seen:
                    ns, name = key.split("/", 1)
                    raise AlreadyExists(f'pods "{name}" already exists in namespace "{ns}"')
                seen.add(key)
            now = _now()
            return [self._insert_pod(key, pod, requests, now) for key, pod, requests in prepared]

    def create_replica_set(self, obj: Any) -> dict:
        """Create a ReplicaSet-like set: ``spec.replicas`` pods from ``spec.template`` (its labels
        and spec), named ``<set>-<5 characters>``, each with a controller ``ownerReference`` to the
        set. As the ReplicaSet controller does, whenever one of its pods stops being active
        (terminating, terminal, or deleted) the set creates a replacement at once: same labels
        and template, a new name and uid, pending again (so a victim of preemption comes back and
        competes for the room it left). The set is also a ReplicaSet object of the watch, its
        ``spec.selector`` the template's labels (`list_spread_selectors`).

        Args:
            obj: ``{"metadata": {"name", "namespace"?}, "spec": {"replicas": int >= 0,
                "template": {"metadata": {"labels"}, "spec": {...}}}}``.

        Returns:
            ``{"namespace", "name", "uid", "replicas", "pods": [its pods' names]}``.

        Raises:
            Invalid: no name, ``replicas`` not an int >= 0, or a template that is not a valid pod
                (the message names the field). AlreadyExists: the set's name is taken.
        """
        meta = (obj.get("metadata") or {}) if isinstance(obj, abc.Mapping) else {}
        spec = (obj.get("spec") or {}) if isinstance(obj, abc.Mapping) else {}
        name, namespace = meta.get("name"), meta.get("namespace") or "default"
        replicas = spec.get("replicas", 1)
        if not isinstance(name, str) or not name:
            raise Invalid("ReplicaSet: metadata.name: Required value")
        if (problem := name_problem(name)) is not None:
            raise Invalid(f"ReplicaSet: metadata.name: {problem}")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise Invalid(f"ReplicaSet {namespace}/{name}: spec.replicas: {replicas!r} must be an integer >= 0")
        template = _copy_tree(spec.get("template") or {})
        self._prepare_pod(self._pod_of_set({"name": name, "namespace": namespace, "uid": ""}, template, name))
        key = f"{namespace}/{name}"
        with self._locked():
            if key in self._replica_sets:
                raise AlreadyExists(f'replicasets.apps "{name}" already exists')
            rs = {"name": name, "namespace": namespace, "uid": self._new_uid(), "replicas": replicas,
                  "template": template}
            self._replica_sets[key] = rs
            self._rs_active[key] = set()
            labels = dict((template.get("metadata") or {}).get("labels") or {})
            obj_key = (REPLICA_SET, namespace, name)
            self._spread_objects[obj_key] = self._commit(MODIFIED if obj_key in self._spread_objects else ADDED, REPLICA_SET, {
                "apiVersion": "apps/v1", "kind": REPLICA_SET,
                "metadata": {"name": name, "namespace": namespace, "uid": rs["uid"], "creationTimestamp": _now()},
                "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": template}})
            self._scale_up(key)
            return {**{k: rs[k] for k in ("namespace", "name", "uid", "replicas")},
                    "pods": sorted(k.split("/", 1)[1] for k in self._rs_active[key])}

    def delete_replica_set(self, namespace: str, name: str) -> None:
        """Stop a set's controller and delete its ReplicaSet object: its pods stay (orphaned, as with
        ``--cascade=orphan``) and are no longer replaced. Raises: NotFound."""
        with self._locked():
            if self._replica_sets.pop(f"{namespace}/{name}", None) is None:
                raise NotFound(f'replicasets.apps "{name}" not found')
            del self._rs_active[f"{namespace}/{name}"]
            old = self._spread_objects.pop((REPLICA_SET, namespace, name), None)
            if old is not None:
                self._commit(DELETED, REPLICA_SET, {**old, "metadata": {**old["metadata"]}})

    def resize_pod(self, namespace: str, name: str, requests: Mapping[str, Mapping[str, Any]]) -> dict:
        """An in-place resize of a bound, running pod (the ``pods/resize`` subresource), and the
        kubelet's answer in the same write, as its ``handlePodResourcesResize`` decides it:

        - the containers named in ``requests`` (container name -> resource list) get those
          ``resources.requests``, their other requests kept (the API server refuses a request
          above the container's limit);
        - the pod's new requests (`pod_requests` of the new spec) fit the node beside its other
          pods: the resize is actuated (every container status's ``allocatedResources`` and
          ``resources.requests`` are the new requests; no ``PodResizePending`` condition), and the
          node's totals move by the difference;
        - they exceed the node's allocatable: ``PodResizePending`` with reason ``Infeasible``;
          they fit the node but not now: reason ``Deferred`` (kubelet's messages). Either way the
          statuses keep what was allocated and the node's totals do not move.

        Returns: the pod. Raises: NotFound, Invalid (not bound, terminal, an unknown container, a
        malformed quantity or one above its limit: the message names the field).
        """
        key = f"{namespace}/{name}"
        with self._locked():
            pod = self._pods.get(key)
            if pod is None:
                raise NotFound(f'pods "{name}" not found')
            node_name = pod["spec"].get("nodeName")
            if not node_name or pod["status"].get("phase") in TERMINAL_PHASES:
                raise Invalid(f"pod {key}: only a bound pod that is not terminal can be resized")
            spec = _copy_tree(pod["spec"])
            names = [c.get("name") for c in spec.get("containers", []) + spec.get("initContainers", [])]
            try:
                for cname, reqs in requests.items():
                    if cname not in names:
                        raise InvalidObjectError(f"no container named {cname!r}", "spec.containers")
                    for c in spec.get("containers", []) + spec.get("initContainers", []):
                        if c.get("name") == cname:
                            res = c.setdefault("resources", {})
                            res["requests"] = {**(res.get("requests") or {}), **reqs}
                problems = pod_problems({**pod, "spec": spec})
                if problems:
                    raise InvalidObjectError("; ".join(f"{path}: {message}" for path, message in problems))
                desired = _admission_ordered({**pod_requests({"spec": spec}), PODS: 1})
            except InvalidObjectError as e:
                raise Invalid(f"pod {key}: {e}") from None
            old = self._requests[key]
            alloc, used = self._allocatable.get(node_name, {}), self._requested.get(node_name, {})
            status = dict(pod["status"])
            statuses = {cs.get("name"): cs for cs in status.get("containerStatuses") or []}
            too_big = next((r for r, v in desired.items() if v > alloc.get(r, 0)), None)
            no_room = next((r for r, v in desired.items() if used.get(r, 0) - old.get(r, 0) + v > alloc.get(r, 0)), None)
            now = _now()
            if too_big is None and no_room is None:
                self._add_usage(node_name, old, -1)
                self._add_usage(node_name, desired, 1)
                self._requests[key] = desired
                allocated = {c["name"]: (c.get("resources") or {}).get("requests") or {} for c in spec.get("containers", [])}
                status["conditions"] = [c for c in status.get("conditions") or [] if c.get("type") != RESIZE_PENDING_CONDITION]
            else:
                allocated = {c["name"]: statuses.get(c["name"], {}).get("allocatedResources")
                             or (c.get("resources") or {}).get("requests") or {}
                             for c in pod["spec"].get("containers", [])}
                r = too_big or no_room
                if too_big is not None:
                    reason, message = RESIZE_INFEASIBLE, (f"Node didn't have enough capacity: {r}, requested: "
                                                          f"{desired[r]}, capacity: {alloc.get(r, 0)}")
                else:
                    reason, message = "Deferred", (f"Node didn't have enough resource: {r}, requested: {desired[r]}, "
                                                   f"used: {used.get(r, 0) - old.get(r, 0)}, capacity: {alloc.get(r, 0)}")
                status["conditions"] = _with_condition(
                    status.get("conditions") or [], {"type": RESIZE_PENDING_CONDITION, "status": "True", "reason": reason,
                                                     "message": message}, now) or status.get("conditions") or []
            status["containerStatuses"] = [{**statuses.get(cname, {"name": cname}), "allocatedResources": dict(res),
                                            "resources": {"requests": dict(res)}} for cname, res in allocated.items()]
            new = {**pod, "metadata": {**pod["metadata"]}, "spec": spec, "status": status}
            self._pods[key] = self._commit(MODIFIED, POD, new)
            return self._pods[key]

    def delete_pod(self, namespace: str, name: str, uid: str | None = None,
                   grace_period_s: int | None = None) -> dict:
        """Delete a pod, gracefully as the API server's pod strategy (``CheckGracefulDelete``) does:
        the grace period is ``grace_period_s``, else the pod's ``terminationGracePeriodSeconds``
        (30 when unset); 0 for a pod not bound or already terminal; 1 when negative. A pod with a
        grace period (times ``grace_period_scale``) above 0 becomes terminating: it gets
        ``metadata.deletionTimestamp`` and ``deletionGracePeriodSeconds`` (a MODIFIED event) and
        keeps its node's resources until the period ends on the clock, then it goes (DELETED).
        Deleting a terminating pod again only shortens its grace period; 0 deletes it at once.

        Args:
            uid: a precondition (``DeleteOptions.preconditions.uid``): the pod must still be that one.

        Returns:
            the pod's state: terminating, or its last state when it is gone.

        Raises: NotFound; Conflict when ``uid`` differs (as the API server answers a failed
        precondition).
        """
        key = f"{namespace}/{name}"
        with self._locked():
            pod = self._pods.get(key)
            if pod is None:
                raise NotFound(f'pods "{name}" not found')
            meta = pod["metadata"]
            if uid is not None and meta.get("uid") != uid:
                raise Conflict(f'Precondition failed: UID in precondition: {uid}, UID in object meta: {meta.get("uid")}')
            grace = self._grace_period(pod, grace_period_s)
            if grace == 0 or self._grace_period_scale == 0:
                return self._delete_pod(key)
            if meta.get("deletionTimestamp") and grace >= meta.get("deletionGracePeriodSeconds", grace):
                return pod
            self._terminating_seq += 1
            heapq.heappush(self._terminating, (self._clock() + grace * self._grace_period_scale,
                                               self._terminating_seq, key, meta["uid"]))
            new_meta = {**meta, "deletionTimestamp": _now(grace), "deletionGracePeriodSeconds": grace}
            self._pods[key] = self._commit(MODIFIED, POD, {**pod, "metadata": new_meta})
            return self._pods[key]

    @staticmethod
    def _grace_period(pod: dict, grace_period_s: int | None) -> int:
        """The API server's grace period for deleting ``pod`` (see `delete_pod`), seconds."""
        if not pod["spec"].get("nodeName") or pod.get("status", {}).get("phase") in TERMINAL_PHASES:
            return 0
        if grace_period_s is None:
            grace_period_s = pod["spec"].get("terminationGracePeriodSeconds")
            if grace_period_s is None:
                grace_period_s = DEFAULT_GRACE_PERIOD_S
        return 1 if grace_period_s < 0 else int(grace_period_s)

    def terminating(self) -> list[tuple[str, float]]:
        """Simulator introspection: ``(namespace/name, seconds left on the clock)`` of each
        terminating pod, soonest end first."""
        with self._locked():
            now = self._clock()
            return [(key, end - now) for end, _, key, uid in sorted(self._terminating)
                    if key in self._pods and self._pods[key]["metadata"]["uid"] == uid]

    def create_pdb(self, obj: Any) -> dict:
        """Create a PodDisruptionBudget (``policy/v1``), validated as the API server does
        (`shardsched.sim.disruption.parse_budget`), with its status computed from the pods it
        selects at once (`shardsched.sim.disruption.budget_status`); the status is written again
        whenever one of its pods comes, goes, or changes health.

        Returns: the stored budget. Raises: Invalid (the message names the field), AlreadyExists.
        """
        budget, pdb = self._prepare_pdb(obj)
        with self._locked():
            if budget.key in self._pdbs:
                raise AlreadyExists(f'poddisruptionbudgets.policy "{pdb["metadata"]["name"]}" already exists')
            pdb["metadata"].update(uid=self._new_uid(), creationTimestamp=_now(), generation=1)
            self._pdbs[budget.key] = pdb
            self._set_budget(budget)
            self._pdbs[budget.key] = self._commit(ADDED, PDB, {**pdb, "status": self._pdb_status(budget.key, {})})
            return self._pdbs[budget.key]

    def update_pdb(self, obj: Any) -> dict:
        """Replace a PodDisruptionBudget's spec, labels and annotations (``generation`` + 1; uid and
        creationTimestamp kept), its status computed again. Raises: NotFound, Invalid."""
        budget, pdb = self._prepare_pdb(obj)
        with self._locked():
            old = self._pdbs.get(budget.key)
            if old is None:
                raise NotFound(f'poddisruptionbudgets.policy "{pdb["metadata"]["name"]}" not found')
            pdb["metadata"].update(uid=old["metadata"]["uid"], creationTimestamp=old["metadata"]["creationTimestamp"],
                                   generation=old["metadata"]["generation"] + 1)
            self._pdbs[budget.key] = pdb
            self._set_budget(budget)
            status = self._pdb_status(budget.key, old.get("status") or {})
            self._pdbs[budget.key] = self._commit(MODIFIED, PDB, {**pdb, "status": status})
            return self._pdbs[budget.key]

    def delete_pdb(self, namespace: str, name: str) -> dict:
        """Delete a PodDisruptionBudget. Returns: its last state. Raises: NotFound."""
        key = f"{namespace}/{name}"
        with self._locked():
            old = self._pdbs.pop(key, None)
            if old is None:
                raise NotFound(f'poddisruptionbudgets.policy "{name}" not found')
            del self._budgets[key], self._pdb_members[key]
            self._budgets_in[namespace].discard(key)
            return self._commit(DELETED, PDB, {**old, "metadata": {**old["metadata"]}})

    def create_pod_group(self, obj: Any) -> dict:
        """Create a PodGroup (``scheduling.x-k8s.io/v1alpha1``), validated as its CRD and
        `PodGroup.from_object` (``spec.minMember`` at least 1), with its status computed from the
        pods that name it at once; the status is written again whenever one of them comes, goes
        or changes phase (module docstring).

        Returns: the stored group. Raises: Invalid (the message names the field), AlreadyExists.
        """
        group, pg = self._prepare_pod_group(obj)
        with self._locked():
            if group.key in self._pod_groups:
                raise AlreadyExists(f'podgroups.scheduling.x-k8s.io "{group.name}" already exists')
            now = _now()
            pg["metadata"].update(uid=self._new_uid(), creationTimestamp=now, generation=1)
            self._set_group(group, pg)
            self._pod_groups[group.key] = self._commit(ADDED, PODGROUP, {**pg, "status": self._group_status(group.key, {})})
            return self._pod_groups[group.key]

    def update_pod_group(self, obj: Any) -> dict:
        """Replace a PodGroup's spec, labels and annotations (``generation`` + 1; uid,
        creationTimestamp and status kept, the status computed again). Raises: NotFound, Invalid."""
        group, pg = self._prepare_pod_group(obj)
        with self._locked():
            old = self._pod_groups.get(group.key)
            if old is None:
                raise NotFound(f'podgroups.scheduling.x-k8s.io "{group.name}" not found')
            pg["metadata"].update(uid=old["metadata"]["uid"], creationTimestamp=old["metadata"]["creationTimestamp"],
                                  generation=old["metadata"]["generation"] + 1)
            self._set_group(group, pg)
            status = self._group_status(group.key, old.get("status") or {})
            self._pod_groups[group.key] = self._commit(MODIFIED, PODGROUP, {**pg, "status": status})
            return self._pod_groups[group.key]

    def delete_pod_group(self, namespace: str, name: str) -> dict:
        """Delete a PodGroup (its pods stay, naming a group that no longer exists). Returns: its
        last state. Raises: NotFound."""
        key = f"{namespace}/{name}"
        with self._locked():
            old = self._pod_groups.pop(key, None)
            if old is None:
                raise NotFound(f'podgroups.scheduling.x-k8s.io "{name}" not found')
            del self._groups[key], self._group_members[key], self._group_phases[key]
            return self._commit(DELETED, PODGROUP, {**old, "metadata": {**old["metadata"]}})

    # ------------------------------------------------------------------ Services and workloads
    def put_spread_selector(self, obj: Any) -> dict:
        """Create or replace a Service, ReplicationController, ReplicaSet or StatefulSet (an ADDED
        or MODIFIED event); only its selector is read (`workload_selector_of`), no controller runs
        it. A ReplicaSet of `create_replica_set` is replaced as any other (its set keeps running).

        Returns: the stored object. Raises: Invalid (the message names the kind, the object and
        the field).
        """
        o = _copy_tree(as_dict(obj))
        meta = o.get("metadata") if isinstance(o.get("metadata"), dict) else {}
        meta = o["metadata"] = {k: v for k, v in meta.items() if k not in ("uid", "resourceVersion", "creationTimestamp")}
        meta["namespace"] = meta.get("namespace") or "default"
        try:
            w = workload_selector_of(o)
            problem = name_problem(w.name)
            if problem:
                raise InvalidObjectError(problem, "metadata.name")
        except InvalidObjectError as e:
            raise Invalid(f"{o.get('kind') or 'object'} {meta['namespace']}/{meta.get('name')}: {e}") from None
        o.setdefault("apiVersion", "v1" if w.kind in (SERVICE, "ReplicationController") else "apps/v1")
        with self._locked():
            old = self._spread_objects.get(w.key)
            meta["uid"] = old["metadata"]["uid"] if old else self._new_uid()
            meta["creationTimestamp"] = old["metadata"]["creationTimestamp"] if old else _now()
            self._spread_objects[w.key] = self._commit(MODIFIED if old else ADDED, w.kind, o)
            return self._spread_objects[w.key]

    def delete_spread_selector(self, kind: str, namespace: str, name: str) -> dict:
        """Delete a Service, ReplicationController, ReplicaSet or StatefulSet object (a set of
        `create_replica_set` keeps running). Returns: its last state. Raises: NotFound."""
        with self._locked():
            old = self._spread_objects.pop((kind, namespace, name), None)
            if old is None:
                raise NotFound(f'{kind.lower()}s "{name}" not found')
            return self._commit(DELETED, kind, {**old, "metadata": {**old["metadata"]}})

    def create_namespace(self, obj: Any) -> dict:
        """Create a Namespace: its name must be a DNS-1123 label and its labels valid; the API
        server's ``kubernetes.io/metadata.name`` label is set to its name (v1.21+).

        Raises: Invalid (message names the field), AlreadyExists.
        """
        name, ns = self._prepare_namespace(obj)
        with self._locked():
            if name in self._namespaces:
                raise AlreadyExists(f'namespaces "{name}" already exists')
            ns["metadata"]["uid"] = self._new_uid()
            ns["metadata"]["creationTimestamp"] = _now()
            self._namespaces[name] = self._commit(ADDED, NAMESPACE, ns)
            return self._namespaces[name]

    def update_namespace(self, obj: Any) -> dict:
        """Replace a Namespace's labels and annotations (uid and creationTimestamp are kept; the name
        label is set again). Raises: NotFound, Invalid."""
        name, ns = self._prepare_namespace(obj)
        with self._locked():
            old = self._namespaces.get(name)
            if old is None:
                raise NotFound(f'namespaces "{name}" not found')
            for k in ("uid", "creationTimestamp"):
                ns["metadata"][k] = old["metadata"][k]
            self._namespaces[name] = self._commit(MODIFIED, NAMESPACE, ns)
            return self._namespaces[name]

    def delete_namespace(self, name: str) -> dict:
        """Delete a Namespace and every pod, PodDisruptionBudget, PodGroup, Service and workload in it, pods first (what the
        namespace controller does before the object goes; here at once, without the ``Terminating``
        phase).

        Returns: the namespace's last state. Raises: NotFound.
        """
        with self._locked():
            if name not in self._namespaces:
                raise NotFound(f'namespaces "{name}" not found')
            for key in sorted(k for k in self._pods if k.split("/", 1)[0] == name):
                self._delete_pod(key)
            for key in sorted(k for k in self._pod_groups if k.split("/", 1)[0] == name):
                old = self._pod_groups.pop(key)
                del self._groups[key], self._group_members[key], self._group_phases[key]
                self._commit(DELETED, PODGROUP, {**old, "metadata": {**old["metadata"]}})
            for key in sorted(self._budgets_in.pop(name, ())):
                old = self._pdbs.pop(key)
                del self._budgets[key], self._pdb_members[key]
                self._commit(DELETED, PDB, {**old, "metadata": {**old["metadata"]}})
            for key in sorted(k for k in self._spread_objects if k[1] == name):
                old = self._spread_objects.pop(key)
                self._commit(DELETED, key[0], {**old, "metadata": {**old["metadata"]}})
            old = self._namespaces.pop(name)
            return self._commit(DELETED, NAMESPACE, {**old, "metadata": {**old["metadata"]}})

    def _prepare_namespace(self, obj: Any) -> tuple[str, dict]:
        """Copy and validate a Namespace outside the lock: (name, namespace)."""
        try:
            ns = _copy_tree(as_dict(obj))
        except InvalidObjectError as e:
            raise Invalid(str(e)) from None
        meta = ns.get("metadata")
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
            raise Invalid("Namespace: metadata.name: Required value")
        name = meta["name"]
        problems = ([("metadata.name", p)] if (p := name_problem(name, label=True)) else [])
        labels = meta.get("labels")
        if labels is not None and not (isinstance(labels, dict)
                                       and all(isinstance(x, str) for kv in labels.items() for x in kv)):
            problems.append(("metadata.labels", "must be a map of strings to strings"))
        problems += labels_problems(labels, "metadata.labels")
        if problems:
            raise Invalid(f"Namespace {name}: " + "; ".join(f"{path}: {what}" for path, what in problems))
        meta["labels"] = namespace_labels_of(ns)[1]
        ns["metadata"] = {k: v for k, v in meta.items() if k not in ("resourceVersion", "uid", "creationTimestamp")}
        ns.setdefault("apiVersion", "v1")
        ns["kind"] = NAMESPACE
        ns["status"] = {"phase": "Active"}
        return name, ns

    def create_node(self, obj: Any) -> dict:
        """Create one node; see `create_nodes`."""
        return self.create_nodes([obj])[0]

    def create_nodes(self, objs: Iterable[Any]) -> list[dict]:
        """Create nodes, all or none; each is copied, validated with `NodeInfo.from_object` and
        given a uid and ``creationTimestamp``.

        Raises:
            Invalid: an object failed validation. AlreadyExists: a name is taken or repeated.
        """
        prepared = [self._prepare_node(o) for o in objs]
        with self._locked():
            seen: set[str] = set()
            for name, _, _ in prepared:
                if name in self._nodes or name in seen:
                    raise AlreadyExists(f'nodes "{name}" already exists')
                seen.add(name)
            now = _now()
            out = []
            for name, node, allocatable in prepared:
                node["metadata"]["uid"] = self._new_uid()
                node["metadata"]["creationTimestamp"] = now
                self._allocatable[name] = allocatable
                self._nodes[name] = self._commit(ADDED, NODE, node)
                out.append(self._nodes[name])
            return out

    def update_node(self, obj: Any) -> dict:
        """Replace a node's labels, spec and status (uid and creationTimestamp are kept). Pods
        already bound stay; a smaller allocatable can leave the node overcommitted.

        Raises:
            NotFound: no node of that name. Invalid: the object failed validation.
        """
        name, node, allocatable = self._prepare_node(obj)
        with self._locked():
            old = self._nodes.get(name)
            if old is None:
                raise NotFound(f'nodes "{name}" not found')
            for k in ("uid", "creationTimestamp"):
                node["metadata"][k] = old["metadata"][k]
            self._allocatable[name] = allocatable
            self._nodes[name] = self._commit(MODIFIED, NODE, node)
            return self._nodes[name]

    def cordon(self, name: str, unschedulable: bool = True) -> dict:
        """Set ``spec.unschedulable`` (``kubectl cordon``/``uncordon``) and the matching taint; no
        write when it already has that value.

        Returns: the node. Raises: NotFound.
        """
        with self._locked():
            old = self._nodes.get(name)
            if old is None:
                raise NotFound(f'nodes "{name}" not found')
            if bool(old.get("spec", {}).get("unschedulable")) == unschedulable:
                return old
            spec = {**old.get("spec", {}), "unschedulable": unschedulable}
            if not unschedulable:
                del spec["unschedulable"]
            _sync_unschedulable_taint(spec)
            self._nodes[name] = self._commit(MODIFIED, NODE, {**old, "metadata": {**old["metadata"]}, "spec": spec})
            return self._nodes[name]

    def delete_node(self, name: str, delete_pods: bool = False) -> dict:
        """Delete a node. Its pods stay bound to the missing node (as with a real API server),
        unless ``delete_pods``, which also deletes them as the pod GC controller would.

        Returns: the node's last state. Raises: NotFound.
        """
        with self._locked():
            old = self._nodes.pop(name, None)
            if old is None:
                raise NotFound(f'nodes "{name}" not found')
            del self._allocatable[name]
            self._events.pop(("", name), None)
            last = self._commit(DELETED, NODE, {**old, "metadata": {**old["metadata"]}})
            if delete_pods:
                for key in sorted(self._on_node.get(name, ())):
                    self._delete_pod(key)
            return last

    def bind(self, namespace: str, name: str, node_name: str, uid: str | None = None,
             annotations: Mapping[str, str] | None = None) -> BindResult:
        """Bind one pod (the ``pods/binding`` subresource); see `bind_many` for the rules.

        Returns:
            the result (``ok``; ``phase`` Failed when the admission rejected the pod).

        Raises:
            NotFound, Conflict, ServerError, Timeout: the result's `BindResult.error`.
        """
        result = self.bind_many([Binding(namespace, name, node_name, uid, annotations)])[0]
        error = result.error()
        if error is not None:
            raise error
        return result

    def bind_many(self, bindings: Iterable[Binding | tuple]) -> list[BindResult]:
        """Bind a batch of pods in one call; one result per item, in order, never raising for an
        item.

        Per item, in this order: an injected 500 or 409 (not applied); 404 if the pod does not
        exist or ``uid`` is set and differs; 409 if the pod already has ``spec.nodeName``; 404 if
        the node does not exist; then (unless an injected timeout drops it) the bind is applied:
        ``spec.nodeName``, condition ``PodScheduled=True``, and the kubelet-like admission sets the
        phase ``Running``, or ``Failed`` with reason ``OutOf<resource>`` when the node's
        non-terminal pods plus this one would request more than allocatable of some resource.
        An injected timeout answers 504 whether or not it applied the bind.

        Cost: O(items x resources per pod), plus the configured latency once per call.
        """
        with self._locked():
            delay_s = self._draw_latency()
            results = [self._bind_one(*b) for b in bindings]
        if delay_s > 0:
            time.sleep(delay_s)
        return results

    def set_pod_condition(self, namespace: str, name: str, condition: Mapping[str, Any],
                          resource_version: str | None = None) -> bool:
        """Add or replace a pod condition by type (``podutil.UpdatePodCondition``), e.g.
        ``{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": ...}``.
        ``lastTransitionTime`` is set when the status changes.

        Args:
            resource_version: a precondition, as ``metadata.resourceVersion`` in a patch body is for
                the API server: the pod must still be at that version.

        Returns:
            True if the pod changed (a MODIFIED event), False if it already had that condition.

        Raises:
            NotFound: no such pod. Conflict: the pod is no longer at ``resource_version``.
            Invalid: no ``type``, or ``status`` not True/False/Unknown.
        """
        if not condition.get("type") or not isinstance(condition.get("type"), str):
            raise Invalid("condition.type: Required value")
        if condition.get("status") not in _CONDITION_STATUSES:
            raise Invalid(f"condition.status: {condition.get('status')!r} is not one of {', '.join(_CONDITION_STATUSES)}")
        key = f"{namespace}/{name}"
        with self._locked():
            pod = self._pods.get(key)
            if pod is None:
                raise NotFound(f'pods "{name}" not found')
            if resource_version is not None and str(pod["metadata"].get("resourceVersion")) != str(resource_version):
                raise Conflict(f'Operation cannot be fulfilled on pods "{name}": the object has been modified; '
                               "please apply your changes to the latest version and try again")
            status = pod.get("status", {})
            conditions = _with_condition(status.get("conditions", []), condition, _now())
            if conditions is None:
                return False
            new = {**pod, "metadata": {**pod["metadata"]}, "status": {**status, "conditions": conditions}}
            self._pods[key] = self._commit(MODIFIED, POD, new)
            return True

    def set_disruption_target(self, namespace: str, name: str, scheduler_name: str) -> bool:
        """Add the ``DisruptionTarget`` condition of a preemption's victim
        (`shardsched.api.objects.disruption_target_condition`); see `set_pod_condition`.

        Returns: True if the pod changed. Raises: NotFound.
        """
        return self.set_pod_condition(namespace, name, disruption_target_condition(scheduler_name))

    def set_nominated_node_name(self, namespace: str, name: str, node_name: str) -> bool:
        """Set ``status.nominatedNodeName`` (``""`` removes it), as a ``pods/status`` patch.

        Returns: True if the pod changed (a MODIFIED event). Raises: NotFound.
        """
        key = f"{namespace}/{name}"
        with self._locked():
            pod = self._pods.get(key)
            if pod is None:
                raise NotFound(f'pods "{name}" not found')
            status = pod.get("status", {})
            if (status.get("nominatedNodeName") or "") == node_name:
                return False
            status = {k: v for k, v in status.items() if k != "nominatedNodeName"}
            if node_name:
                status["nominatedNodeName"] = node_name
            self._pods[key] = self._commit(MODIFIED, POD, {**pod, "metadata": {**pod["metadata"]}, "status": status})
            return True

    def prepare_candidates(self, candidates: Sequence[Candidate]) -> list[CandidateResult]:
        """A rebalance pass's preemptions in one call (`ClusterBackend.prepare_candidates`): each
        candidate's victims' DisruptionTarget, deletes and Events, then the preemptor's
        FailedScheduling, PodScheduled and nominatedNodeName, candidate after candidate
        (`shardsched.cluster.preemption.prepare_candidate`). Never raises for one candidate."""
        return prepare_candidates(self, candidates)

    def remove_scheduling_gates(self, namespace: str, name: str, gates: Iterable[str] | None = None) -> dict:
        """Remove scheduling gates from a pod (all of them, or those named), as the controller
        that owns a gate updates the pod when it is done; the API server only lets gates be
        removed, never added, once a pod exists. An empty list is dropped from the spec.

        Returns:
            the stored pod (unchanged, and no event, when none of ``gates`` was there).

        Raises:
            NotFound: no such pod.
        """
        key = f"{namespace}/{name}"
        with self._locked():
            pod = self._pods.get(key)
            if pod is None:
                raise NotFound(f'pods "{name}" not found')
            old = pod["spec"].get("schedulingGates") or []
            kept = [] if gates is None else [g for g in old if g.get("name") not in set(gates)]
            if len(kept) == len(old):
                return pod
            spec = {k: v for k, v in pod["spec"].items() if k != "schedulingGates"}
            if kept:
                spec["schedulingGates"] = kept
            self._pods[key] = self._commit(MODIFIED, POD, {**pod, "metadata": {**pod["metadata"]}, "spec": spec})
            return self._pods[key]

    def record_event(self, obj_ref: Mapping[str, Any], type: str, reason: str, message: str) -> dict:
        """Record a core/v1 Event about an object (as an EventRecorder); a repeat of the same
        (type, reason, message) for the same object increments ``count`` instead.

        Args:
            obj_ref: an ObjectReference: ``{"kind", "name", "namespace" (omit for nodes), "uid"?}``.
            type: ``Normal`` or ``Warning``.
            reason: short CamelCase reason (``FailedScheduling``, ``Scheduled``).

        Returns: the stored Event. Raises: Invalid (no name, no reason, or a bad type).
        """
        if type not in _EVENT_TYPES:
            raise Invalid(f"type: {type!r} is not one of {', '.join(_EVENT_TYPES)}")
        if not reason:
            raise Invalid("reason: Required value")
        name = obj_ref.get("name")
        if not name:
            raise Invalid("involvedObject.name: Required value")
        namespace = obj_ref.get("namespace") or ""
        now = _now()
        with self._locked():
            events = self._events.setdefault((namespace, name), [])
            for i, ev in enumerate(events):
                if (ev["type"], ev["reason"], ev["message"]) == (type, reason, message):
                    events[i] = {**ev, "count": ev["count"] + 1, "lastTimestamp": now}
                    return events[i]
            self._event_seq += 1
            event = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{name}.{self._event_seq:x}", "namespace": namespace or "default"},
                "involvedObject": dict(obj_ref),
                "type": type,
                "reason": reason,
                "message": message,
                "count": 1,
                "firstTimestamp": now,
                "lastTimestamp": now,
            }
            events.append(event)
            if len(events) > _EVENTS_PER_OBJECT:
                del events[0]
            return event

    # -------------------------------------------------------------------------------- internals

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The lock, with the terminating pods whose grace period ended deleted first (what the
        kubelet and the API server do between them), so every call sees the cluster as of now."""
        with self._lock:
            if self._terminating and self._terminating[0][0] <= self._clock():
                self._finish_terminating()
            yield

    def _finish_terminating(self) -> None:
        now = self._clock()
        while self._terminating and self._terminating[0][0] <= now:
            _, _, key, uid = heapq.heappop(self._terminating)
            pod = self._pods.get(key)
            if pod is not None and pod["metadata"]["uid"] == uid:  # not deleted meanwhile (sooner, or re-created)
                self._delete_pod(key)

    def _insert_pod(self, key: str, pod: dict, requests: dict[str, int], now: str) -> dict:
        """Store a prepared pod (`_prepare_pod`) whose key is free: uid, creationTimestamp, the
        admission of a pod created bound, its ADDED event. Returns the stored pod."""
        pod["metadata"]["uid"] = self._new_uid()
        pod["metadata"]["creationTimestamp"] = now
        self._requests[key] = requests
        node_name = pod["spec"].get("nodeName")
        if node_name:
            self._on_node.setdefault(node_name, set()).add(key)
            self._bound_uids.add(pod["metadata"]["uid"])
            if node_name in self._nodes:
                pod["status"] = self._admit(node_name, requests, pod["status"], now)
            else:  # no kubelet yet; counts on the node once it exists
                self._add_usage(node_name, requests)
        self._pods[key] = self._commit(ADDED, POD, pod)
        return self._pods[key]

    @staticmethod
    def _pod_of_set(rs: Mapping[str, Any], template: Mapping[str, Any], name: str) -> dict:
        """A pod of set ``rs`` named ``name``, from its template, with the controller ownerReference."""
        owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs["name"], "uid": rs["uid"],
                 "controller": True, "blockOwnerDeletion": True}
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        return {"apiVersion": "v1", "kind": POD,
                "metadata": {"name": name, "namespace": rs["namespace"], "labels": labels, "ownerReferences": [owner]},
                "spec": _copy_tree(template.get("spec") or {})}

    def _scale_up(self, rs_key: str) -> None:
        """Create pods of set ``rs_key`` until it has ``replicas`` active ones (the ReplicaSet
        controller's ``manageReplicas``, at once)."""
        rs = self._replica_sets[rs_key]
        active = self._rs_active[rs_key]
        while len(active) < rs["replicas"]:
            name = f"{rs['name']}-{''.join(self._uid_rng.choice('bcdfghjklmnpqrstvwxz2456789') for _ in range(5))}"
            key = f"{rs['namespace']}/{name}"
            if key in self._pods:
                continue
            _, pod, requests = self._prepare_pod(self._pod_of_set(rs, rs["template"], name))
            self._insert_pod(key, pod, requests, _now())  # its ADDED joins `active` (`_pod_changed_for_sets`)

    def _pod_changed_for_sets(self, type_: str, pod: dict) -> None:
        """After a write of a pod a set controls: keep the set's active pods, and replace one that
        stopped being active."""
        meta = pod["metadata"]
        owner = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), None)
        rs_key = f"{meta['namespace']}/{owner['name']}" if owner else None
        if rs_key not in self._replica_sets or self._replica_sets[rs_key]["uid"] != owner.get("uid"):
            return
        key = f"{meta['namespace']}/{meta['name']}"
        active = self._rs_active[rs_key]
        phase = pod.get("status", {}).get("phase")
        if type_ != DELETED and not meta.get("deletionTimestamp") and phase not in TERMINAL_PHASES:
            active.add(key)
        elif key in active:
            active.discard(key)
            self._scale_up(rs_key)

    def _prepare_pdb(self, obj: Any) -> tuple[Budget, dict]:
        """Copy, default and validate a PodDisruptionBudget outside the lock: (budget, object)."""
        try:
            pdb = _copy_tree(as_dict(obj))
            meta = pdb.get("metadata")
            if isinstance(meta, dict):
                meta["namespace"] = meta.get("namespace") or "default"
            budget = parse_budget(pdb)
        except InvalidObjectError as e:
            meta = obj.get("metadata") if isinstance(obj, abc.Mapping) else None
            where = f"{meta.get('namespace') or 'default'}/{meta.get('name')}" if isinstance(meta, abc.Mapping) else ""
            raise Invalid(f"PodDisruptionBudget {where}: {e}" if where else f"PodDisruptionBudget: {e}") from None
        pdb["metadata"] = {k: v for k, v in pdb["metadata"].items()
                           if k not in ("uid", "resourceVersion", "creationTimestamp", "generation")}
        pdb["apiVersion"] = PDB_API_VERSION
        pdb["kind"] = PDB
        pdb.pop("status", None)
        return budget, pdb

    def _prepare_pod_group(self, obj: Any) -> tuple[PodGroup, dict]:
        """Copy, default and validate a PodGroup outside the lock: (group, object)."""
        try:
            pg = _copy_tree(as_dict(obj))
            meta = pg.get("metadata")
            if not isinstance(meta, dict):
                raise InvalidObjectError("metadata is missing", "metadata")
            meta["namespace"] = meta.get("namespace") or "default"
            problem = name_problem(str(meta["name"])) if meta.get("name") else None
            if problem:
                raise InvalidObjectError(problem, "metadata.name")
            group = PodGroup.from_object(pg)
        except InvalidObjectError as e:
            meta = obj.get("metadata") if isinstance(obj, abc.Mapping) else None
            where = f"{meta.get('namespace') or 'default'}/{meta.get('name')}" if isinstance(meta, abc.Mapping) else ""
            raise Invalid(f"PodGroup {where}: {e}" if where else f"PodGroup: {e}") from None
        pg["metadata"] = {k: v for k, v in pg["metadata"].items()
                          if k not in ("uid", "resourceVersion", "creationTimestamp", "generation")}
        pg["apiVersion"] = PODGROUP_API_VERSION
        pg["kind"] = PODGROUP
        pg.pop("status", None)
        return group, pg

    def _set_group(self, group: PodGroup, pg: dict) -> None:
        """Record a group's object and spec, and the pods that name it now."""
        self._pod_groups[group.key] = pg
        self._groups[group.key] = group
        self._group_members[group.key] = {
            key: pod.get("status", {}).get("phase", "Pending") for key, pod in self._pods.items()
            if group_key_of(pod["metadata"]["namespace"], pod["metadata"].get("labels")) == group.key}
        self._group_phases[group.key] = Counter(self._group_members[group.key].values())

    def _group_status(self, key: str, old: Mapping[str, Any]) -> dict:
        """The PodGroup controller's status for group ``key``, reconciled until it holds."""
        phases, min_member, now = self._group_phases[key], self._groups[key].min_member, _now()
        status = dict(old)
        for _ in range(4):  # "" -> Pending -> Scheduling -> counted: at most three steps
            new = group_status(min_member, phases, status, now)
            if new == status:
                break
            status = new
        return status

    def _pod_changed_for_groups(self, type_: str, pod: dict) -> None:
        """After a write of a pod that names a group: its phase among the group's members, and the
        group's status written when it changed."""
        meta = pod["metadata"]
        gkey = group_key_of(meta["namespace"], meta.get("labels"))
        if gkey not in self._groups:
            return
        members, counts = self._group_members[gkey], self._group_phases[gkey]
        pkey = f"{meta['namespace']}/{meta['name']}"
        phase = pod.get("status", {}).get("phase", "Pending")
        old_phase = members.get(pkey)
        if type_ == DELETED:
            if members.pop(pkey, None) is None:
                return
        elif old_phase == phase:
            return
        else:
            members[pkey] = phase
            counts[phase] += 1
        if old_phase is not None:
            counts[old_phase] -= 1
        old = self._pod_groups[gkey]
        status = self._group_status(gkey, old.get("status") or {})
        if status != old.get("status"):
            self._pod_groups[gkey] = self._commit(MODIFIED, PODGROUP,
                                                  {**old, "metadata": {**old["metadata"]}, "status": status})

    def _set_budget(self, budget: Budget) -> None:
        """Record a budget's spec and the pods it selects now."""
        namespace = budget.namespace
        self._budgets[budget.key] = budget
        self._budgets_in.setdefault(namespace, set()).add(budget.key)
        self._pdb_members[budget.key] = {
            key: healthy(pod) for key, pod in self._pods.items()
            if pod["metadata"]["namespace"] == namespace and budget.selects(pod["metadata"].get("labels") or {})}

    def _pdb_status(self, key: str, old: Mapping[str, Any]) -> dict:
        """A budget's status from its pods (`budget_status`) with the controller's
        ``DisruptionAllowed`` condition; ``old`` is the status it replaces."""
        members = self._pdb_members[key]
        counts = budget_status(self._budgets[key], len(members), sum(members.values()))
        allowed = counts["disruptionsAllowed"] > 0
        generation = self._pdbs[key]["metadata"]["generation"]
        condition = {"type": DISRUPTION_ALLOWED, "status": "True" if allowed else "False",
                     "reason": "SufficientPods" if allowed else "InsufficientPods", "message": "",
                     "observedGeneration": generation}
        conditions = _with_condition(old.get("conditions", []), condition, _now())
        return {"observedGeneration": generation, "disruptedPods": old.get("disruptedPods") or {}, **counts,
                "conditions": old.get("conditions", []) if conditions is None else conditions}

    def _pod_changed_for_budgets(self, type_: str, pod: dict) -> None:
        """After a pod's write: update the budgets of its namespace that select it (or did), and
        write the status of each whose counts changed."""
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        labels = meta.get("labels") or {}
        for bkey in sorted(self._budgets_in.get(meta["namespace"], ())):
            members = self._pdb_members[bkey]
            if type_ != DELETED and self._budgets[bkey].selects(labels):
                now_healthy = healthy(pod)
                if members.get(key) == now_healthy:
                    continue
                members[key] = now_healthy
            elif members.pop(key, None) is None:
                continue
            old = self._pdbs[bkey]
            status = self._pdb_status(bkey, old.get("status") or {})
            if status != old.get("status"):
                self._pdbs[bkey] = self._commit(MODIFIED, PDB, {**old, "metadata": {**old["metadata"]}, "status": status})

    def _prepare_pod(self, obj: Any) -> tuple[str, dict, dict[str, int]]:
        """Copy, default and validate a pod outside the lock: (key, pod, requests)."""
        meta = None
        try:
            pod = _copy_tree(as_dict(obj)) if self._copy_inputs else dict(as_dict(obj))
            meta, spec = pod.get("metadata"), pod.get("spec")
            if isinstance(meta, dict):
                meta["namespace"] = meta.get("namespace") or "default"
                for k in ("uid", "resourceVersion", "creationTimestamp"):
                    meta.pop(k, None)
            if isinstance(spec, dict):
                spec["schedulerName"] = spec.get("schedulerName") or "default-scheduler"
            info = PodInfo.from_object(pod, self._priority_classes)
            problems = pod_problems(pod)
            if problems:
                raise InvalidObjectError("; ".join(f"{path}: {message}" for path, message in problems))
        except InvalidObjectError as e:
            where = f"{meta.get('namespace')}/{meta.get('name')}" if isinstance(meta, dict) else ""
            raise Invalid(str(e.located(where) if where else e)) from None
        pod.setdefault("apiVersion", "v1")
        pod.setdefault("kind", POD)
        spec["priority"] = info.priority
        pod["status"] = {"phase": "Pending"}
        return info.key, pod, _admission_ordered(info.requests)

    def _prepare_node(self, obj: Any) -> tuple[str, dict, dict[str, int]]:
        """Copy and validate a node outside the lock: (name, node, allocatable)."""
        try:
            node = _copy_tree(as_dict(obj))
            info = NodeInfo.from_object(node)
            validate_name(info.name, "metadata.name")
        except InvalidObjectError as e:
            raise Invalid(str(e)) from None
        node.setdefault("apiVersion", "v1")
        node.setdefault("kind", NODE)
        for k in ("uid", "resourceVersion", "creationTimestamp"):
            node["metadata"].pop(k, None)
        node["spec"] = dict(node.get("spec") or {})
        _sync_unschedulable_taint(node["spec"])
        return info.name, node, info.allocatable

    def _new_uid(self) -> str:
        return str(uuid.UUID(int=self._uid_rng.getrandbits(128), version=4))

    def _commit(self, type_: str, kind: str, obj: dict) -> dict:
        """Give ``obj`` (whose metadata dict is fresh) the next resourceVersion and append its
        watch event; trim the history. Every write goes through here exactly once, which keeps the
        history contiguous in resourceVersion."""
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._history.append(WatchEvent(type_, kind, obj, self._rv))
        self._changed.notify_all()
        if len(self._history) > self._history_limit + self._history_slack:
            drop = len(self._history) - self._history_limit
            self._compacted_rv = self._history[drop - 1].rv
            del self._history[:drop]
        if kind == POD and self._budgets_in.get(obj["metadata"]["namespace"]):
            self._pod_changed_for_budgets(type_, obj)
        if kind == POD and self._groups and obj["metadata"].get("labels"):
            self._pod_changed_for_groups(type_, obj)
        if kind == POD and self._replica_sets and obj["metadata"].get("ownerReferences"):
            self._pod_changed_for_sets(type_, obj)
        return obj

    def _add_usage(self, node_name: str, requests: Mapping[str, int], sign: int = 1) -> None:
        used = self._requested.setdefault(node_name, {})
        for r, v in requests.items():
            used[r] = used.get(r, 0) + sign * v

    def _admit(self, node_name: str, requests: dict[str, int], status: dict, now: str) -> dict:
        """Kubelet-like admission of a pod bound to an existing node; returns its new status and,
        when admitted, adds its requests to the node's totals."""
        alloc = self._allocatable[node_name]
        used = self._requested.setdefault(node_name, {})
        conditions = _with_condition(status.get("conditions", []), {"type": "PodScheduled", "status": "True"}, now)
        status = {**status, "conditions": status.get("conditions", []) if conditions is None else conditions}
        for r, want in requests.items():
            have = used.get(r, 0)
            if have + want > alloc.get(r, 0):
                self._stats["admission_rejections"] += 1
                status.update(
                    phase="Failed",
                    reason=f"OutOf{r}",
                    message=(f"Pod was rejected: Node didn't have enough resource: {r}, requested: {want}, "
                             f"used: {have}, capacity: {alloc.get(r, 0)}"),
                )
                return status
        for r, want in requests.items():
            used[r] = used.get(r, 0) + want
        status["phase"] = "Running"
        status["startTime"] = now
        return status

    def _draw_latency(self) -> float:
        f = self._faults
        return f.bind_latency_s + (self._rng.uniform(0.0, f.bind_jitter_s) if f.bind_jitter_s else 0.0)

    def _draw_fault(self) -> int:
        """0 (no fault), 500, 409 or 504, drawn per bind item."""
        f = self._faults
        if not f.injects_errors:
            return 0
        x = self._rng.random()
        for code, rate in ((500, f.bind_error_rate), (409, f.bind_conflict_rate), (504, f.bind_timeout_rate)):
            if x < rate:
                return code
            x -= rate
        return 0

    def _bind_one(self, namespace: str, name: str, node_name: str, uid: str | None = None,
                  annotations: Mapping[str, str] | None = None) -> BindResult:
        fault = self._draw_fault()
        if fault == 500:
            self._injected["server_errors"] += 1
            return BindResult(namespace, name, node_name, 500, ServerError.reason, "injected: internal error")
        if fault == 409:
            self._injected["conflicts"] += 1
            self._stats["bind_conflicts"] += 1
            return BindResult(namespace, name, node_name, 409, Conflict.reason,
                              f'injected: Operation cannot be fulfilled on pods/binding "{name}"')
        key = f"{namespace}/{name}"
        pod = self._pods.get(key)
        error: tuple[int, str, str] | None = None
        if pod is None or (uid and pod["metadata"]["uid"] != uid):
            error = (404, NotFound.reason, f'pods "{name}" not found')
        elif pod["spec"].get("nodeName"):
            error = (409, Conflict.reason, f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} '
                                           f'is already assigned to node "{pod["spec"]["nodeName"]}"')
        elif node_name not in self._nodes:
            error = (404, NotFound.reason, f'nodes "{node_name}" not found')
        if fault == 504:
            self._injected["timeouts"] += 1
            if self._rng.random() < self._faults.timeout_applied_fraction and error is None:
                self._injected["timeouts_applied"] += 1
                self._apply_bind(key, pod, node_name, annotations)
            return BindResult(namespace, name, node_name, 504, Timeout.reason,
                              "the server was unable to return a response in the time allotted")
        if error is not None:
            if error[0] == 409:
                self._stats["bind_conflicts"] += 1
            return BindResult(namespace, name, node_name, *error)
        status = self._apply_bind(key, pod, node_name, annotations)
        return BindResult(namespace, name, node_name, BOUND, status.get("reason", ""), status.get("message", ""),
                          status["phase"])

    def _apply_bind(self, key: str, pod: dict, node_name: str, annotations: Mapping[str, str] | None = None) -> dict:
        """Write the binding, the binding's annotations (set on the pod, as the API server does)
        and the admission outcome; returns the pod's new status."""
        uid = pod["metadata"]["uid"]
        if uid in self._bound_uids:
            self._stats["double_binds"] += 1
        self._bound_uids.add(uid)
        self._stats["binds"] += 1
        status = self._admit(node_name, self._requests[key], pod.get("status", {}), _now())
        meta = {**pod["metadata"]}
        if annotations:
            meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
        new = {**pod, "metadata": meta, "spec": {**pod["spec"], "nodeName": node_name}, "status": status}
        self._pods[key] = self._commit(MODIFIED, POD, new)
        self._on_node.setdefault(node_name, set()).add(key)
        return status

    def _delete_pod(self, key: str) -> dict:
        pod = self._pods.pop(key, None)
        if pod is None:
            raise NotFound(f'pods "{key.split("/", 1)[1]}" not found')
        requests = self._requests.pop(key)
        node_name = pod["spec"].get("nodeName")
        if node_name:
            self._bound_uids.discard(pod["metadata"]["uid"])
            on_node = self._on_node[node_name]
            on_node.discard(key)
            if not on_node:
                del self._on_node[node_name]
            if pod["status"]["phase"] not in TERMINAL_PHASES:
                self._add_usage(node_name, requests, -1)
        self._events.pop((pod["metadata"]["namespace"], pod["metadata"]["name"]), None)
        return self._commit(DELETED, POD, {**pod, "metadata": {**pod["metadata"]}})
