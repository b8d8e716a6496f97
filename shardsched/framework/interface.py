"""The vectorized plugin interfaces of shardsched's scheduling framework.

These follow kube-scheduler's extension points (PreEnqueue, QueueSort, PreFilter, Filter, PostFilter,
PreScore, Score, NormalizeScore, Reserve, Permit, PreBind, Bind, PostBind) with one difference: a Filter or
Score call covers many nodes at once, and a binding-cycle call (Reserve to PostBind) many pods. ``idx`` selects NodeTable slots: a ``slice`` (usually all slots
``slice(0, table.n)``) or an int array of slots (to recompute only the nodes that changed since a
cached result).

- Filter returns a bool array, True where the node passes, shape = len(idx).
- Score returns an int64 array in [0, 100], shape = len(idx).
- NormalizeScore maps the raw scores of the feasible nodes to [0, 100].

A plugin that is ``static`` depends only on static node attributes (labels, taints, cordon, names),
so its result for a pod signature stays valid until ``NodeTable.static_generation`` changes.

The binding-cycle points take a batch: ``pods`` and ``nodes`` of the same length, pod ``i`` placed on
node ``nodes[i]`` (a node name), and answer one entry per pod, in order, with kube's single-pod
semantics per entry (`shardsched.framework.binding_cycle` runs them). ``state`` is the batch's
`CycleState`, shared by the points of one binding cycle; plugins key per-pod data by pod uid.

A plugin that is ``topology`` (InterPodAffinity, PodTopologySpread) depends on the pods of other
nodes too: a pod placed on one node changes its result on every node of the same topology domain.
Its results are recomputed over all nodes whenever any node changes, and its scores are normalized
over the feasible nodes of each decision; what it reads of the pods already placed is tracked by
``NodeTable.affinity_generation``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Protocol, Sequence

import numpy as np

from shardsched.api.disruption import PodDisruptionBudget
from shardsched.api.objects import PodInfo
from shardsched.cache.devices import DeviceRequest
from shardsched.cache.node_table import NodeTable, PodUsage
from shardsched.cache.pod_groups import PodGroupCache
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.diagnosis import Diagnosis
from shardsched.framework.status import Status

Index = slice | np.ndarray

MAX_NODE_SCORE = 100
MIN_NODE_SCORE = 0


def index_len(idx: Index, n: int) -> int:
    """Number of slots selected by idx (a slice over [0, n) or an int array)."""
    if isinstance(idx, slice):
        return len(range(*idx.indices(n)))
    return len(idx)


class Plugin:
    """Base of every plugin: a kube-style ``name`` class constant."""

    name: ClassVar[str] = ""
    #: True if results depend on the pods of other nodes (module docstring)
    topology: ClassVar[bool] = False


class PreEnqueuePlugin(Plugin):
    def pre_enqueue(self, pod: PodInfo) -> Status:
        """Success if the pod may enter the scheduling queue now; otherwise it waits (gated) until
        an update of the pod lets every PreEnqueue plugin pass (upstream ``PreEnqueue``)."""
        raise NotImplementedError


class PreFilterPlugin(Plugin):
    def pre_filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        """Compute per-pod data once. Return Skip when Filter has nothing to check for this pod; a
        rejection (Unschedulable, UnschedulableAndUnresolvable) rejects the pod on every node."""
        return Status.success()


class QueueSortPlugin(Plugin):
    def sort_key(self, pod: PodInfo, timestamp: float, seq: int) -> tuple:
        """Ordering key; smaller pops first."""
        raise NotImplementedError


class FilterPlugin(PreFilterPlugin):
    #: True if the result depends only on static node attributes (see module docstring)
    static: ClassVar[bool] = True
    #: the code of this plugin's rejections: True = UnschedulableAndUnresolvable (removing pods from
    #: the node cannot help, so preemption skips it), False = Unschedulable; `unresolvable_mask`
    #: refines it per node for plugins whose reasons differ
    unresolvable: ClassVar[bool] = False

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        """bool array over idx: True where the node passes."""
        raise NotImplementedError

    def filter_slot(self, state: CycleState, pod: PodInfo, table: NodeTable, slot: int) -> bool:
        """Filter for one slot. Dynamic plugins override it with a scalar version (the cached path
        recomputes one node per placed pod, where numpy's per-call cost dominates); the tests check
        that it agrees with `filter`."""
        return bool(self.filter(state, pod, table, np.array([slot]))[0])

    def failure_reasons(self, state: CycleState, pod: PodInfo, table: NodeTable, slots: np.ndarray) -> dict[str, int]:
        """For nodes (``slots``) that this plugin rejected: reason -> number of nodes.

        Only called on the failure path, to build the ``0/N nodes are available`` message; a node
        may count under several reasons (e.g. Insufficient cpu and Insufficient memory).
        """
        raise NotImplementedError

    def unresolvable_mask(self, state: CycleState, pod: PodInfo, table: NodeTable, slots: np.ndarray) -> np.ndarray:
        """For nodes (``slots``) that this plugin rejected: bool array, shape (len(slots),), True where
        the rejection is UnschedulableAndUnresolvable (upstream's per-reason codes). Only called on
        the failure path."""
        return np.full(len(slots), self.unresolvable)

    def resource_check(self, state: CycleState) -> "ResourceCheck | None":
        """For a Filter that checks nothing but ``allocatable - requested >= request`` on some
        resources (NodeResourcesFit): what it checks for this pod, read from ``state`` after its
        PreFilter; None for every other Filter. DefaultPreemption's vectorized search checks
        these itself, over all nodes at once."""
        return None

    def device_check(self, state: CycleState) -> DeviceRequest | None:
        """For a Filter that checks nothing but a pod's GPU devices against the NodeTable's device
        columns (GPUDevice: one device with the share free, or enough wholly free devices): the
        pod's request, read from ``state`` after its PreFilter; None for every other Filter.
        DefaultPreemption's vectorized search then checks the devices itself, each victim freeing
        its own devices (docs/gpu.md)."""
        return None

    def passes_without_pods(self, pod: PodInfo) -> bool:
        """True when removing pods from a node can never make this Filter reject ``pod`` there if
        it passes there now (a static plugin; host ports; pod anti-affinity; the topology spread
        skew). DefaultPreemption's vectorized search then needs this Filter's result only as it is
        now; for a plugin that says False it runs the Filters node by node. Default: ``static``."""
        return self.static


@dataclass(frozen=True, slots=True)
class ResourceCheck:
    """What a resource Filter checks for a pod (`FilterPlugin.resource_check`): for each ``i``,
    ``allocatable[rows[i]] - requested[rows[i]] >= requests[i]`` (NodeTable rows, canonical
    units), failing with ``reasons[i]`` (``Insufficient cpu``, ``Too many pods``)."""

    rows: tuple[int, ...]
    requests: tuple[int, ...]
    reasons: tuple[str, ...]


class ScorePlugin(Plugin):
    static: ClassVar[bool] = False
    #: whether `normalize_score` must be applied to the raw scores of the feasible nodes
    normalizes: ClassVar[bool] = False

    def pre_score(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        """Compute per-pod data once. Return Skip when this plugin scores every node the same."""
        return Status.success()

    def score(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        """int64 array over idx (raw score; in [0, 100] unless the plugin normalizes)."""
        raise NotImplementedError

    def score_slot(self, state: CycleState, pod: PodInfo, table: NodeTable, slot: int) -> int:
        """Score of one slot; dynamic plugins override it with a scalar version (see
        `FilterPlugin.filter_slot`)."""
        return int(self.score(state, pod, table, np.array([slot]))[0])

    def normalize_score(self, state: CycleState, pod: PodInfo, raw: np.ndarray) -> np.ndarray:
        """Map raw scores of the feasible nodes (int64 array) to [0, 100]."""
        return raw

    @property
    def packs(self) -> bool:
        """Whether this plugin's scores prefer fuller nodes (bin packing, as NodeResourcesFit's
        MostAllocated); the sharded runtime then routes pods to fill shards, not to spread over them."""
        return False


class ReservePlugin(Plugin):
    """Reserve / Unreserve (upstream ``ReservePlugin``): hold what a placement needs before binding."""

    def reserve(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str]) -> list[Status]:
        """Reserve pod ``i`` on ``nodes[i]``: one Status per pod, Success, or a rejection
        (Unschedulable: this node no longer fits it; Error) that rolls the pod back."""
        raise NotImplementedError

    def unreserve(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str]) -> None:
        """Undo `reserve` for these pods (a later point rejected them). Idempotent, and safe to call
        for a pod whose reserve never ran or failed: the binding cycle calls every Reserve plugin's
        Unreserve, in reverse order, whichever plugin rejected the pod. Never raises for an
        infrastructure fault: what cannot be undone now must expire on its own."""
        raise NotImplementedError


#: a Permit answer that lets the pod through: (Success, no timeout); shared, so Allow costs nothing
ALLOW: tuple[Status, float] = (Status.success(), 0.0)


class PermitPlugin(Plugin):
    """Permit (upstream ``PermitPlugin``): the last gate before binding."""

    def permit(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str]) -> list[tuple[Status, float]]:
        """One (Status, timeout in seconds) per pod: `ALLOW`; a rejection (Unschedulable, Error),
        timeout ignored; or ``(Status(Code.WAIT), timeout_s)``: the pod waits, its binding cycle
        blocked, until this plugin allows it through `Handle.get_waiting_pod` (e.g. when its
        siblings are reserved), rejects it, or ``timeout_s`` passes (then it is rejected as
        Unschedulable, as upstream)."""
        raise NotImplementedError


class PreBindPlugin(Plugin):
    """PreBind (upstream ``PreBindPlugin``): work the bind depends on (e.g. volume binding's PVC
    annotations), after Permit."""

    def pre_bind(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str]) -> list[Status]:
        """One Status per pod: Success, or a failure (Error, Unschedulable) that rolls the pod back."""
        raise NotImplementedError


@dataclass(slots=True)
class PostFilterResult:
    """What a PostFilter plugin decided (kube's ``PostFilterResult`` plus the victims).

    Attributes:
        status: Success when a node was nominated; otherwise Unschedulable (or Error) with the
            plugin's message (``preemption: ...``), which the FitError message appends.
        nominated_node: the node the pod is nominated to; "" = clear the pod's nomination; None =
            leave it as it is.
        victims: the pods to delete on ``nominated_node`` before the pod fits there, in the order
            the plugin chose them.
        num_pdb_violations: how many of the victims break a PodDisruptionBudget.
    """

    status: Status
    nominated_node: str | None = None
    victims: tuple[PodUsage, ...] = ()
    num_pdb_violations: int = 0


class PostFilterHandle(Protocol):
    """What a PostFilter plugin may use of the scheduler that called it (a slice of kube's
    ``framework.Handle``): the node view, the PodDisruptionBudgets, a random source, and a Filter
    run on one node over the table as it is at the call."""

    table: NodeTable
    pdbs: Sequence[PodDisruptionBudget]
    rng: np.random.Generator

    def filter_node(self, pod: PodInfo, slot: int) -> Status:
        """PreFilter then Filter of the profile for ``pod`` on the node at ``slot`` (kube's
        ``RunFilterPluginsWithNominatedPods`` over the table's pods): Success, or the first
        rejection with its reasons, its code and the plugin's name."""
        ...

    def node_local(self, pod: PodInfo) -> bool:
        """Whether the Filter results of ``pod`` on a node depend on that node alone (its pods, its
        attributes), not on other nodes' pods (no pod affinity or topology spread in play): a
        search may then reuse a node's result while the node does not change."""
        ...

    def pre_filter(self, pod: PodInfo) -> tuple[CycleState, list[FilterPlugin], Status]:
        """The profile's PreFilter plugins for ``pod`` over the table as it is now: the cycle
        state, the Filter plugins that take part (not skipped, in the order `filter_node` runs
        them) and Success, or the first rejection with the plugin's name."""
        ...


class PostFilterPlugin(Plugin):
    def post_filter(self, state: CycleState, pod: PodInfo, diagnosis: Diagnosis,
                    handle: PostFilterHandle) -> PostFilterResult:
        """Called for a pod that fits no node (``diagnosis`` says why, per node); may nominate a
        node where the pod would fit once some pods are gone (kube's ``PostFilter``). Must leave
        the table as it found it."""
        raise NotImplementedError


class BindPlugin(Plugin):
    """Bind (upstream ``BindPlugin``): write the binding to the cluster."""

    def bind(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str]) -> list[Status]:
        """One Status per pod: Success (bound), Skip (not this binder's pod: the next Bind plugin
        gets it), or a failure that rolls the pod back. A binder that got no answer for a pod (the
        binding may have been applied) adds its uid to ``state[BIND_OUTCOME_UNKNOWN_KEY]``."""
        raise NotImplementedError


class PostBindPlugin(Plugin):
    """PostBind (upstream ``PostBindPlugin``): informational, after a successful bind."""

    def post_bind(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str]) -> None:
        """The pods are bound on their nodes; cannot fail them (errors are the plugin's to log)."""
        raise NotImplementedError


class BindClient(Protocol):
    """The cluster as a binder sees it: batched binds (the API server's ``pods/binding``)."""

    def bind_many(self, bindings: Sequence[tuple[str, str, str, str]]) -> list[Any]:
        """(namespace, name, node, uid) per pod -> one result per pod with ``.code`` (201 bound, 404,
        409, 500, 504) and ``.message``; never raises for one item."""
        ...


class VolumeClient(Protocol):
    """The cluster as VolumeBinding's PreBind writes to it (upstream ``bindAPIUpdate`` and
    ``checkBindings``): a PV's ``claimRef``, a claim's provisioning annotation, and whether a claim
    is bound yet. Each call raises the typed `shardsched.cluster` errors (`NotFound`, `Conflict`, ...)."""

    def bind_volume(self, pv_name: str, namespace: str, claim: str, claim_uid: str) -> None:
        """Set the PV's ``spec.claimRef`` to the claim (the PV controller then binds the claim)."""
        ...

    def set_selected_node(self, namespace: str, claim: str, node: str) -> None:
        """Annotate the claim with ``volume.kubernetes.io/selected-node: <node>`` (the provisioner
        then provisions a volume reachable from the node)."""
        ...

    def claim_bound(self, namespace: str, claim: str) -> bool:
        """Whether the claim is bound now (``spec.volumeName`` set and the PV controller's binding
        completed)."""
        ...


class VolumeReservations(Protocol):
    """Where the sharded runtime arbitrates the volumes VolumeBinding's Reserve chose between
    shards (the Redis ledger, `shardsched.store.Ledger.reserve_volumes`): a PersistentVolume, or a
    claim, reserved for one pod at a time."""

    def reserve_volumes(self, uid: str, volumes: Sequence[str]) -> str | None:
        """Reserve ``volumes`` (``pv/<name>``, ``pvc/<namespace>/<name>``) for pod ``uid``, all or
        none: None when reserved, else the first one another pod holds. Raises `TemporaryError`
        when the arbiter is away."""
        ...

    def release_volumes(self, uid: str, volumes: Sequence[str]) -> None:
        """Give up the pod's reservations (idempotent); never raises for an infrastructure fault
        (they expire)."""
        ...


class WaitingPod:
    """A pod held at Permit (upstream ``framework.WaitingPod``): it binds when every plugin that
    answered Wait allows it, and is rejected by the first rejection or timeout.

    Attributes:
        pod: the pod; node: the node it is reserved on.
    """

    def __init__(self, pod: PodInfo, node: str, timeouts_s: dict[str, float], now: float) -> None:
        self.pod = pod
        self.node = node
        self._deadlines = {plugin: now + t for plugin, t in timeouts_s.items()}
        self._timeouts_s = dict(timeouts_s)
        self._verdict: Status | None = None
        self._cond = threading.Condition()

    def get_pending_plugins(self) -> list[str]:
        """Names of the plugins that have not allowed the pod yet."""
        with self._cond:
            return list(self._deadlines)

    def allow(self, plugin: str) -> None:
        """``plugin`` lets the pod through; it binds once no plugin is pending. No effect after a
        rejection or for a plugin that is not pending."""
        with self._cond:
            self._deadlines.pop(plugin, None)
            if not self._deadlines and self._verdict is None:
                self._verdict = Status.success()
            self._cond.notify_all()

    def reject(self, plugin: str, message: str) -> None:
        """``plugin`` rejects the pod (Unschedulable, with ``message``); the first verdict stands."""
        with self._cond:
            if self._verdict is None:
                self._verdict = Status.unschedulable(message, plugin=plugin)
            self._cond.notify_all()

    def wait(self, clock: Callable[[], float]) -> Status:
        """Block until a verdict: Success, the rejection, or (the earliest pending plugin's
        timeout passed) Unschedulable ``rejected due to timeout after waiting <t>s at plugin <p>``,
        as upstream's ``WaitOnPermit``. ``clock`` gives the time in seconds (``time.monotonic``)."""
        with self._cond:
            while self._verdict is None:
                plugin, deadline = min(self._deadlines.items(), key=lambda kv: kv[1])
                left = deadline - clock()
                if left <= 0:
                    self._verdict = Status.unschedulable(
                        f"rejected due to timeout after waiting {self._timeouts_s[plugin]:g}s at plugin {plugin}",
                        plugin=plugin)
                    break
                self._cond.wait(left)
            return self._verdict


class Handle:
    """What plugins reach of the framework (upstream ``framework.Handle``): the cluster client,
    the pods waiting at Permit and the PodGroups. Plugins that need it get it from their factory.

    Attributes:
        client: where binds go (`BindClient`), or None where nothing is bound (``simulate``).
        pod_groups: the PodGroups and their members (`PodGroupCache`, upstream's PodGroup and pod
            listers), kept current by whoever holds the cluster's view.
        volume_client: where VolumeBinding's PreBind writes (`VolumeClient`), or None where
            nothing is written (``simulate``: the assumed bindings stand for the writes).
        volume_reservations: where VolumeBinding's Reserve has its volume choices arbitrated
            between shards (`VolumeReservations`), or None where one scheduler decides alone.
        table: the node view the scheduling cycles decide over (kube's snapshot lister), for the
            binding-cycle points that read it (VolumeBinding's Reserve); set by whoever builds the
            schedulers over it.
    """

    def __init__(self, client: BindClient | None = None, pod_groups: PodGroupCache | None = None,
                 volume_client: VolumeClient | None = None,
                 volume_reservations: VolumeReservations | None = None) -> None:
        self.client = client
        self.pod_groups = pod_groups if pod_groups is not None else PodGroupCache()
        self.volume_client = volume_client
        self.volume_reservations = volume_reservations
        self.table: NodeTable | None = None
        self._waiting: dict[str, WaitingPod] = {}
        self._lock = threading.Lock()

    def get_waiting_pod(self, uid: str) -> WaitingPod | None:
        """The pod with this uid waiting at Permit, or None (upstream ``GetWaitingPod``)."""
        with self._lock:
            return self._waiting.get(uid)

    def iterate_over_waiting_pods(self, callback: Callable[[WaitingPod], None]) -> None:
        """Call ``callback`` on every pod waiting at Permit (upstream ``IterateOverWaitingPods``);
        the callback may allow or reject them."""
        with self._lock:
            pods = list(self._waiting.values())
        for wp in pods:
            callback(wp)

    def reject_waiting_pod(self, uid: str, plugin: str, message: str) -> bool:
        """Reject the waiting pod with this uid; False if none waits (upstream ``RejectWaitingPod``)."""
        wp = self.get_waiting_pod(uid)
        if wp is not None:
            wp.reject(plugin, message)
        return wp is not None

    def add_waiting_pod(self, wp: WaitingPod) -> None:
        """Register a pod that waits at Permit (by the binding cycle)."""
        with self._lock:
            self._waiting[wp.pod.uid] = wp

    def remove_waiting_pod(self, uid: str) -> None:
        """Forget a waiting pod once it has its verdict (by the binding cycle); idempotent."""
        with self._lock:
            self._waiting.pop(uid, None)


def default_normalize_score(raw: np.ndarray, reverse: bool) -> np.ndarray:
    """kube's ``helper.DefaultNormalizeScore``: scale to [0, 100] by the maximum; reverse = 100 - s.

    int64 array in, int64 array out (same shape). With a maximum of 0: all 0, or all 100 if reverse.
    """
    if raw.size == 0:
        return raw
    top = int(raw.max())
    if top == 0:
        return np.full_like(raw, MAX_NODE_SCORE if reverse else 0)
    out = raw * MAX_NODE_SCORE // top
    return MAX_NODE_SCORE - out if reverse else out
