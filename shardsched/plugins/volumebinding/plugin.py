"""VolumeBinding: a pod's PersistentVolumeClaims decide where it may go (kube v1.28's VolumeBinding,
``pkg/scheduler/framework/plugins/volumebinding``).

PreFilter (Skip for a pod without claims): every claim must exist (``persistentvolumeclaim "data"
not found``), not be being deleted, and an ephemeral volume's claim must be the pod's; a claim that
is not bound and whose class is not ``WaitForFirstConsumer`` (no class, a class that does not exist,
or ``Immediate``: the PV controller binds those without the scheduler) rejects the pod as ``pod has
unbound immediate PersistentVolumeClaims``. All UnschedulableAndUnresolvable.

Filter, per node, vectorized over the table (`_decide`):

- a bound claim's PV must admit the node by its node affinity (``node(s) had volume node affinity
  conflict``; a PV that cannot be parsed admits none), and must exist (``node(s) unavailable due to
  one or more pvc(s) bound to non-existent pv(s)``);
- the unbound ``WaitForFirstConsumer`` claims, smallest request first, each take the smallest PV
  that `VolumeCatalog.candidates` offers, that admits the node and that no earlier claim of the pod
  took on that node (upstream ``findMatchingVolumes``); a claim left without one must be
  provisionable there: its class has a provisioner (not ``kubernetes.io/no-provisioner``) and its
  ``allowedTopologies`` admit the node (else ``node(s) didn't find available persistent volumes to
  bind``), and a CSIStorageCapacity of the class whose ``nodeTopology`` selects the node has room
  for the request (else ``node(s) did not have enough free storage``). A claim annotated
  ``volume.kubernetes.io/selected-node`` (provisioning under way) fits that node only.

  Where upstream reads the CSIDriver's ``storageCapacity`` to decide whether capacity is checked,
  shardsched checks it whenever the cluster has CSIStorageCapacity objects for the class (it does
  not read CSIDrivers). Every rejection is UnschedulableAndUnresolvable, as upstream.

Score: none. Upstream scores only behind the VolumeCapacityPriority feature gate (alpha, off by
default), so kube's default profile gives every node the same VolumeBinding score.

Reserve assumes the node's choice in the catalog (`VolumeCatalog.assume_binding`: the PV's claimRef
and the claim's volumeName; `VolumeCatalog.assume_provisioning`: the claim's selected node), so the
next pod does not take the same PV; Unreserve restores them. PreBind writes them through the
handle's `VolumeClient` (the PV's claimRef, the claim's annotation) and waits, polling once a
second, until every claim is bound or ``bindTimeoutSeconds`` pass (``binding volumes: timed out
waiting for the condition``); without a volume client (``simulate``) the assumption stands for the
write.

In the sharded runtime the handle's `VolumeReservations` (the Redis ledger) arbitrates between the
shards, which each assume in their own catalog: Reserve also reserves there every PV it chose and
every claim it binds (``pv/<name>``, ``pvc/<namespace>/<name>``), all or none, so that two shards
never bind one PV for two claims (nor one claim twice); a choice another pod holds is refused
(Unschedulable: ``PersistentVolume "<name>" was chosen for another pod (the ledger's check)``, the
pod retried after a backoff, by when its shard's catalog shows the PV bound), and Unreserve releases
them. After PreBind the reservations are left to expire, covering the time the watch takes to show
the PV bound to every shard.

Without a `VolumeCatalog` in the table (a shard whose cluster does not serve the storage kinds), a
pod with claims is held (UnschedulableAndUnresolvable) rather than placed without the check.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from shardsched.api.objects import PodInfo
from shardsched.api.volumes import PV, PVC, WAIT_FOR_FIRST_CONSUMER, PersistentVolume, PersistentVolumeClaim, VolumeCatalog
from shardsched.cache.node_table import NodeTable
from shardsched.cluster.errors import ApiError
from shardsched.errors import TemporaryError
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import FilterPlugin, Handle, Index, PreBindPlugin, ReservePlugin, index_len
from shardsched.framework.status import Status
from shardsched.plugins.helper.node_selector import terms_mask
from shardsched.plugins.helper.volumes import label_selector_mask, no_catalog, pod_claims, pv_node_mask

NAME = "VolumeBinding"
ERR_NODE_CONFLICT = "node(s) had volume node affinity conflict"
ERR_BIND_CONFLICT = "node(s) didn't find available persistent volumes to bind"
ERR_NOT_ENOUGH_SPACE = "node(s) did not have enough free storage"
ERR_PV_NOT_EXIST = "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"
UNBOUND_IMMEDIATE = "pod has unbound immediate PersistentVolumeClaims"
_STATE = f"{NAME}/claims"
_POLL_S = 1.0


@dataclass(slots=True)
class _Claims:
    """A pod's claims sorted for Filter: bound ones, and the unbound WaitForFirstConsumer ones by
    increasing request (upstream ``byPVCSize``)."""

    bound: list[PersistentVolumeClaim]
    delayed: list[PersistentVolumeClaim]


@dataclass(slots=True)
class _Decision:
    """`_decide` over idx: one bool array per reason (True: the node fails for it), and per delayed
    claim its candidates and the index of the candidate each node takes (-1: provisioned)."""

    node_conflict: np.ndarray
    pv_missing: np.ndarray
    bind_conflict: np.ndarray
    no_space: np.ndarray
    picks: list[tuple[list[PersistentVolume], np.ndarray]] = field(default_factory=list)

    def reasons(self) -> dict[str, np.ndarray]:
        return {ERR_NODE_CONFLICT: self.node_conflict, ERR_BIND_CONFLICT: self.bind_conflict,
                ERR_NOT_ENOUGH_SPACE: self.no_space, ERR_PV_NOT_EXIST: self.pv_missing}

    def failed(self) -> np.ndarray:
        return self.node_conflict | self.pv_missing | self.bind_conflict | self.no_space


def classify(pod: PodInfo, catalog: VolumeCatalog) -> _Claims | Status:
    """The pod's claims as `_Claims`, or its PreFilter rejection (module docstring)."""
    claims = pod_claims(pod, catalog, NAME)
    if isinstance(claims, Status):
        return claims
    bound, delayed = [], []
    for claim in claims:
        if catalog.is_bound(claim):
            bound.append(claim)
        elif catalog.binding_mode(claim) == WAIT_FOR_FIRST_CONSUMER and not claim.volume_name:
            delayed.append(claim)
        else:
            return Status.unschedulable(UNBOUND_IMMEDIATE, plugin=NAME, resolvable=False)
    delayed.sort(key=lambda c: c.request_bytes)
    return _Claims(bound, delayed)


def _provisionable(table: NodeTable, catalog: VolumeCatalog, claim: PersistentVolumeClaim,
                   idx: Index) -> tuple[np.ndarray, np.ndarray]:
    """(topology_ok, capacity_ok) over idx for provisioning ``claim`` (upstream ``checkVolumeProvisions``
    and ``hasEnoughCapacity``, capacity as the module docstring says)."""
    size = index_len(idx, table.n)
    klass = catalog.classes.get(claim.class_name)
    if klass is None or not klass.provisions:
        return np.zeros(size, bool), np.ones(size, bool)
    topology = terms_mask(table, klass.allowed_topologies, idx) if klass.allowed_topologies else np.ones(size, bool)
    capacities = [c for c in catalog.capacities.values() if c.storage_class == klass.name]
    if not capacities or claim.request_bytes == 0:
        return topology, np.ones(size, bool)
    room = np.zeros(size, bool)
    for c in capacities:
        if c.limit_bytes is not None and c.limit_bytes >= claim.request_bytes:
            room |= label_selector_mask(table, c.node_topology, idx)
    return topology, room


def _decide(table: NodeTable, catalog: VolumeCatalog, claims: _Claims, idx: Index) -> _Decision:
    """Where the pod's claims fit, over idx (module docstring)."""
    size = index_len(idx, table.n)
    d = _Decision(*(np.zeros(size, bool) for _ in range(4)))
    masks: dict[object, np.ndarray] = {}  # per distinct node affinity, within this call

    def admits(pv: PersistentVolume) -> np.ndarray:
        key = pv.node_affinity
        if key not in masks:
            masks[key] = pv_node_mask(table, pv, idx)
        return masks[key]

    for claim in claims.bound:
        if claim.volume_name in catalog.invalid_pvs:
            d.node_conflict[:] = True
            continue
        pv = catalog.pvs.get(claim.volume_name)
        if pv is None:
            d.pv_missing[:] = True
        else:
            d.node_conflict |= ~admits(pv)
    taken: dict[str, np.ndarray] = {}  # PV name -> nodes where an earlier claim of the pod took it
    names = np.array([table.names[s] or "" for s in range(table.n)], dtype=object)[idx]
    for claim in claims.delayed:
        pick = np.full(size, -1, np.int64)
        candidates: list[PersistentVolume] = []
        if claim.selected_node:
            d.bind_conflict |= names != claim.selected_node
        else:
            candidates = catalog.candidates(claim)
            for j, pv in enumerate(candidates):
                free = admits(pv) & (pick < 0)
                if pv.name in taken:
                    free &= ~taken[pv.name]
                if free.any():
                    pick[free] = j
                    taken[pv.name] = taken[pv.name] | free if pv.name in taken else free
                    if (pick >= 0).all():
                        break
        d.picks.append((candidates, pick))
        need = pick < 0
        if need.any():
            topology, room = _provisionable(table, catalog, claim, idx)
            d.bind_conflict |= need & ~topology
            d.no_space |= need & topology & ~room
    return d


def _volume_key(kind: str, key: str) -> str:
    """The name `VolumeReservations` arbitrates a PV (``pv/<name>``) or claim (``pvc/<ns>/<name>``) by."""
    return f"{'pv' if kind == PV else 'pvc'}/{key}"


class VolumeBinding(FilterPlugin, ReservePlugin, PreBindPlugin):
    """See the module docstring. ``clock`` and ``sleep`` are injectable for PreBind's wait."""

    name = NAME
    static = True  # node labels and the catalog (NodeTable.volume_generation drops cached results)
    unresolvable = True

    def __init__(self, bind_timeout_s: float = 600.0, handle: Handle | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.bind_timeout_s = bind_timeout_s
        self.handle = handle or Handle()
        self._clock, self._sleep = clock, sleep
        #: pod uid -> (catalog keys assumed, writes for PreBind), from Reserve until Unreserve or a
        #: successful PreBind; upstream keeps them in the cycle state, kept here so that whoever
        #: undoes a placement later (a gang that fails whole in simulate) needs no cycle state
        self._assumed: dict[str, tuple[list, list]] = {}

    # ------------------------------------------------------------------ scheduling cycle
    def pre_filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        if not pod.volumes.claims:
            return Status.skip()
        if table.volumes is None:
            return no_catalog(NAME, f"volumes that need volume binding ({', '.join(pod.claim_volumes)})")
        claims = classify(pod, table.volumes)
        if isinstance(claims, Status):
            return claims
        state.write(_STATE, claims)
        return Status.success()

    def _decision(self, state: CycleState, table: NodeTable, idx: Index) -> _Decision:
        assert table.volumes is not None
        return _decide(table, table.volumes, state.read(_STATE), idx)

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        return ~self._decision(state, table, idx).failed()

    def failure_reasons(self, state, pod, table, slots):
        d = self._decision(state, table, slots)
        return {reason: int(mask.sum()) for reason, mask in d.reasons().items() if mask.any()}

    # ------------------------------------------------------------------ binding cycle
    def reserve(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str]) -> list[Status]:
        """Assume each pod's volume choice on its node in the table's catalog (`_decide` on that
        node); Unschedulable with the node's reason when the choice no longer holds there."""
        return [self._reserve_one(state, pod, node) for pod, node in zip(pods, nodes)]

    def _reserve_one(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        table = self.handle.table
        if not pod.volumes.claims or table is None or table.volumes is None:
            return Status.success()
        catalog = table.volumes
        claims = classify(pod, catalog)
        if isinstance(claims, Status):
            return claims
        slot = table.index.get(node)
        if slot is None:
            return Status.unschedulable(f"node {node} is not among these nodes", plugin=NAME)
        d = _decide(table, catalog, claims, np.array([slot]))
        if d.failed()[0]:
            return Status.unschedulable(*(r for r, m in d.reasons().items() if m[0]), plugin=NAME, resolvable=False)
        keys, writes = [], []
        for claim, (candidates, pick) in zip(claims.delayed, d.picks):
            if pick[0] >= 0:
                pv = candidates[int(pick[0])]
                keys += [(PV, pv.name), (PVC, claim.key)]
                writes.append(("bind", pv.name, claim))
            else:
                keys.append((PVC, claim.key))
                writes.append(("provision", node, claim))
        held = self._arbitrate(pod, keys)
        if held is not None:
            kind, name = held
            what = f'PersistentVolume "{name}"' if kind == PV else f'PersistentVolumeClaim "{name}"'
            return Status.unschedulable(f"{what} was chosen for another pod (the ledger's check)", plugin=NAME)
        for what, target, claim in writes:
            if what == "bind":
                catalog.assume_binding(target, claim)
            else:
                catalog.assume_provisioning(claim, target)
        self._assumed[pod.uid] = (keys, writes)
        return Status.success()

    def _arbitrate(self, pod: PodInfo, keys: list[tuple[str, str]]) -> tuple[str, str] | None:
        """Reserve the chosen (kind, key) pairs with the handle's `VolumeReservations`; the pair
        another pod holds, or None (reserved, or nothing to arbitrate). Raises `TemporaryError`
        when the arbiter is away (the shard pauses binding)."""
        arbiter = self.handle.volume_reservations
        if arbiter is None or not keys:
            return None
        held = arbiter.reserve_volumes(pod.uid, [_volume_key(kind, key) for kind, key in keys])
        if held is None:
            return None
        return next((kind, key) for kind, key in keys if _volume_key(kind, key) == held)

    def unreserve(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str]) -> None:
        table = self.handle.table
        if table is None or table.volumes is None:
            return
        arbiter = self.handle.volume_reservations
        for pod in pods:
            keys, _ = self._assumed.pop(pod.uid, ((), ()))
            table.volumes.restore(keys)
            if arbiter is not None and keys:
                arbiter.release_volumes(pod.uid, [_volume_key(kind, key) for kind, key in keys])

    def pre_bind(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str]) -> list[Status]:
        out = [self._pre_bind_one(state, pod) for pod in pods]
        for pod, st in zip(pods, out):
            if st.is_success():  # written: the cluster's objects replace the assumption
                self._assumed.pop(pod.uid, None)
        return out

    def _pre_bind_one(self, state: CycleState, pod: PodInfo) -> Status:
        _, writes = self._assumed.get(pod.uid, ((), ()))
        client = self.handle.volume_client
        if not writes or client is None:
            return Status.success()
        try:
            for what, target, claim in writes:
                if what == "bind":
                    client.bind_volume(target, claim.namespace, claim.name, claim.uid)
                else:
                    client.set_selected_node(claim.namespace, claim.name, target)
            deadline = self._clock() + self.bind_timeout_s
            while not all(client.claim_bound(c.namespace, c.name) for _, _, c in writes):
                if self._clock() >= deadline:
                    return Status.error("binding volumes: timed out waiting for the condition", plugin=NAME)
                self._sleep(_POLL_S)
        except (ApiError, TemporaryError) as e:
            return Status.error(f"binding volumes: {e}", plugin=NAME)
        return Status.success()


def new(args=None, handle: Handle | None = None) -> VolumeBinding:
    timeout = 600 if args is None else args.bind_timeout_seconds
    return VolumeBinding(float(timeout), handle)
