"""The cluster contract: what the coordinator and the shards need of a cluster, and what a backend
declares it offers (`Capabilities`) instead of callers probing for optional methods.

Two backends implement `ClusterBackend`: the simulated cluster (`shardsched.sim.SimCluster`, the
embedded default, one object or one Ray actor that every process calls) and the Kubernetes backend
(`shardsched.kube.cluster.KubeCluster`, a plain picklable object of which each process holds its
own copy, with its own API connections). Neither imports the other; both import this package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Mapping, Protocol, Sequence

from shardsched.cluster.binding import Binding, BindResult
from shardsched.cluster.preemption import Candidate, CandidateResult
from shardsched.cluster.watch import NAMESPACE, NODE, POD, WatchEvent


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend offers beyond the methods every `ClusterBackend` has.

    Attributes:
        kinds: the kinds it lists and watches (`shardsched.cluster.watch` constants): its
            ``events_since`` serves events of these kinds only.
        per_process: each process holds its own copy (a shard actor binds through its copy, not
            through a call to another process), and a copy is a `PerProcessBackend`: it has
            counters of its own (``metric_samples``), opens its connections ahead of a shard's binds
            (``open_connections``), stops sending binds on a whole-scheduler stop
            (``drain_binds``) and writes what it still queues on ``stop``.

    Whether its Events and condition writes yield to the binds is its ``gate`` (a `WriteGate`, or
    None), which the shards feed with their binds.
    """

    kinds: frozenset[str] = frozenset({NODE, POD, NAMESPACE})
    per_process: bool = False


class WriteGate(Protocol):
    """A backend's gate that holds its Event and condition writes back while binds are in flight
    (`shardsched.kube.gate.BindsFirst`). ``peers``, when set, says how busy the binds of the other
    processes are: one of ``IDLE``, ``BINDING``, ``BURST``."""

    IDLE: ClassVar[int]
    BINDING: ClassVar[int]
    BURST: ClassVar[int]
    peers: Any

    def is_burst(self, pods: int) -> bool:
        """True when a bind call of ``pods`` pods is a burst (it fills every request slot)."""
        ...


class ClusterBackend(Protocol):
    """A cluster as the scheduler sees it, with the API server's semantics.

    Objects are camelCase dicts as the API server sends them; returned objects are shared
    snapshots (never modify them). Errors are the typed `shardsched.cluster.errors` (their type
    decides retries, never their message).
    """

    capabilities: ClassVar[Capabilities]
    #: holds the Events and condition writes back while binds are in flight; None when they go out
    #: beside the binds
    gate: WriteGate | None

    def list_nodes(self) -> tuple[list[dict], int]:
        """Every node, and the resourceVersion to pass to `events_since`."""
        ...

    def list_pods(self) -> tuple[list[dict], int]:
        """The pods the scheduler sees (pending pods of its schedulerNames and every non-terminal
        bound pod, at least), and the resourceVersion."""
        ...

    def list_namespaces(self) -> tuple[list[dict], int]:
        """Every Namespace object, and the resourceVersion."""
        ...

    def list_pdbs(self) -> tuple[list[dict], int]:
        """Every PodDisruptionBudget (``policy/v1``) with the status its disruption controller
        wrote, and the resourceVersion; a backend whose ``capabilities.kinds`` has `PDB`."""
        ...

    def list_pod_groups(self) -> tuple[list[dict], int]:
        """Every PodGroup (``scheduling.x-k8s.io/v1alpha1``) with its status, and the
        resourceVersion; a backend whose ``capabilities.kinds`` has `PODGROUP`."""
        ...

    def list_spread_selectors(self) -> tuple[list[dict], int]:
        """Every Service, ReplicationController, ReplicaSet and StatefulSet (`SPREAD_SELECTOR_KINDS`:
        PodTopologySpread's default constraints read their selectors), and the resourceVersion; a
        backend whose ``capabilities.kinds`` has them."""
        ...

    def list_storage(self, kind: str) -> tuple[list[dict], int]:
        """Every object of one storage kind (`shardsched.cluster.STORAGE_KINDS`: PersistentVolume,
        PersistentVolumeClaim, StorageClass, CSINode, CSIStorageCapacity), and the resourceVersion;
        a backend whose ``capabilities.kinds`` has them (``list_pvs``, ``list_pvcs``,
        ``list_storage_classes``, ``list_csi_nodes`` and ``list_csi_storage_capacities`` are the
        same per kind). VolumeBinding's PreBind writes through the same backend
        (`shardsched.framework.interface.VolumeClient`: ``bind_volume``, ``set_selected_node``,
        ``claim_bound``)."""
        ...

    def get_capabilities(self) -> Capabilities:
        """The backend's `capabilities`, as a call: what a caller in another process (a Ray
        actor's client) reads to know, e.g., whether the storage kinds are served."""
        ...

    def bind_volume(self, pv_name: str, namespace: str, claim: str, claim_uid: str) -> None:
        """VolumeBinding's PreBind write of a static binding: the PV's ``spec.claimRef``
        (`shardsched.framework.interface.VolumeClient`); a backend serving `STORAGE_KINDS`."""
        ...

    def set_selected_node(self, namespace: str, claim: str, node: str) -> None:
        """VolumeBinding's PreBind write for provisioning: the claim's
        ``volume.kubernetes.io/selected-node``; a backend serving `STORAGE_KINDS`."""
        ...

    def claim_bound(self, namespace: str, claim: str) -> bool:
        """Whether the claim is bound (``volumeName`` and the PV controller's bind-completed
        annotation), as this backend knows it; a backend serving `STORAGE_KINDS`."""
        ...

    def events_since(self, rv: int | str, kinds: Iterable[str] | None = None,
                     limit: int | None = None, wait_s: float | None = None) -> tuple[list[WatchEvent], int]:
        """Changes after ``rv``, oldest first, of ``kinds`` (None: all of ``capabilities.kinds``), at
        most ``limit``; and the rv to pass next (`shardsched.cluster.watch.read_event_log`). With
        ``wait_s`` (seconds, at most `shardsched.cluster.watch.MAX_WATCH_WAIT_S`), a call that
        finds nothing waits that long for the first change and answers as soon as it comes (a long
        poll, `shardsched.cluster.watch.wait_for_events`); the wait holds no lock a writer needs.

        Raises: `Gone` (list again), `Invalid` (a bad rv, limit or wait).
        """
        ...

    def bind_many(self, bindings: Sequence[Binding | tuple]) -> list[BindResult]:
        """Bind pods through ``pods/binding``: one `BindResult` per item, in order; never raises
        for one item."""
        ...

    def delete_pod(self, namespace: str, name: str, uid: str | None = None,
                   grace_period_s: int | None = None) -> Any:
        """Delete a pod (a preemption's eviction), synchronously. ``uid``, when set, is a
        precondition (the pod must still be that one); ``grace_period_s`` None means the pod's own
        ``terminationGracePeriodSeconds``. A bound pod with a grace period is terminating
        (``metadata.deletionTimestamp``, a MODIFIED event) until it goes (DELETED).

        Raises: `NotFound` (already gone: nothing to do), `Conflict` (the uid differs: the pod was
        re-created, leave it), `Forbidden` (RBAC), `TemporaryError` (retry).
        """
        ...

    def set_disruption_target(self, namespace: str, name: str, scheduler_name: str) -> bool:
        """Add the ``DisruptionTarget`` condition a preemption writes on a victim before deleting
        it (`shardsched.api.objects.disruption_target_condition` with the preemptor's
        ``scheduler_name``) through ``pods/status``, synchronously, as upstream's
        ``PrepareCandidate``.

        Returns: True when written, False when the pod already had it.
        Raises: `NotFound`, `Forbidden`, `TemporaryError`.
        """
        ...

    def set_nominated_node_name(self, namespace: str, name: str, node_name: str) -> bool:
        """Set a preemptor's ``status.nominatedNodeName`` (``""`` clears it) through ``pods/status``,
        synchronously, as upstream's ``updatePod`` and ``ClearNominatedNodeName`` patch it.

        Returns: True when changed, False when the pod already had that value.
        Raises: `NotFound`, `Forbidden`, `TemporaryError`.
        """
        ...

    def prepare_candidates(self, candidates: Sequence[Candidate]) -> list[CandidateResult]:
        """The API writes of many preemptions at once, one `CandidateResult` per `Candidate`, in
        order (`shardsched.cluster.preemption.prepare_candidate`'s writes and outcomes for each:
        the victims' DisruptionTarget, uid-preconditioned deletes and Preempted Events, then the
        preemptor's FailedScheduling Event, PodScheduled condition and nominatedNodeName). A
        backend may write different candidates concurrently; one candidate's writes stay in that
        order. Never raises for one candidate."""
        ...

    def set_pod_condition(self, namespace: str, name: str, condition: Mapping[str, Any]) -> Any:
        """Patch one pod condition by type through ``pods/status`` (``util.PatchPodStatus``), e.g.
        ``PodScheduled=False, reason=Unschedulable``; ``lastTransitionTime`` changes only when
        the status does."""
        ...

    def record_event(self, obj_ref: Mapping[str, Any], type: str, reason: str,  # noqa: A002
                     message: str) -> Any:
        """Record an Event about ``obj_ref`` (an ObjectReference: kind, namespace, name, uid);
        ``type`` Normal or Warning; repeats are counted, as kube's event correlator does."""
        ...


class PerProcessBackend(ClusterBackend, Protocol):
    """A backend with ``capabilities.per_process``: each process holds a copy (see `Capabilities`)."""

    def open_connections(self, binding_cycles: int) -> int:
        """Open the connections ``binding_cycles`` concurrent ``bind_many`` calls use; returns how
        many opened; never raises."""
        ...

    def metric_samples(self) -> list[tuple[str, str, str, list[tuple[str, dict, float]]]]:
        """This copy's counters, in `shardsched.metrics` samples form."""
        ...

    def drain_binds(self) -> None:
        """Send no more binds (a whole-scheduler stop): those not yet sent answer 500."""
        ...

    def stop(self) -> None:
        """Write what is still queued (Events, conditions) for a short while, then close."""
        ...
