"""The shard's own plugins and handles in its binding cycle (`shardsched.sharding.binding_cycle`
says how the cycle runs): the Redis ledger as the shard's Reserve, Permit and PostBind plugin
(`LedgerPlugin`), the shard's cluster as DefaultBinder's client with its binds marked in the ledger
(`MarkedBinds`), and VolumeBinding's client and reservations (`ShardVolumes`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Sequence

from shardsched.api.objects import PodInfo
from shardsched.cluster import WriteGate
from shardsched.errors import TemporaryError
from shardsched.framework.cycle_state import BIND_OUTCOME_UNKNOWN_KEY, DEVICES_KEY, CycleState
from shardsched.framework.interface import ALLOW, PermitPlugin, PostBindPlugin, ReservePlugin
from shardsched.framework.status import Status
from shardsched.store.ledger import Ledger, LedgerCode, ReservationRef, ReserveCode, ReserveItem

if TYPE_CHECKING:
    from shardsched.sharding.shard import Shard

log = logging.getLogger(__name__)

#: life of a shard's "binds in flight" mark in the ledger (`Ledger.mark_binding`), ms; renewed
#: while its binding cycles run (`Shard.step`), removed when the last ends
BINDING_MARK_TTL_MS = 5000

LEDGER = "ShardLedger"
#: CycleState keys of `LedgerPlugin`: uid -> lease token (written by the shard before Reserve);
#: uid -> `ReserveCode` of the pods the ledger refused (Reserve or Permit); uids reserved
LEASES_KEY, CODES_KEY, RESERVED_KEY = LEDGER + "/leases", LEDGER + "/codes", LEDGER + "/reserved"



def yield_writes_to_binds(cluster: Any, ledger: Ledger) -> None:
    """Let the Event and condition writers of ``cluster`` (a `shardsched.cluster.ClusterBackend`
    or a `BindTarget`: its ``gate``, a `shardsched.cluster.WriteGate`) yield to the binds of
    every shard of this scheduler, as the shards mark them in ``ledger``, not only to those of
    their own process. Does nothing for a cluster without a gate (the simulated cluster) or whose
    gate already asks someone."""
    gate = cluster.gate
    if gate is not None and gate.peers is None:
        def peers() -> int:
            binding, bursting = ledger.binding_marks()
            return gate.BURST if bursting else gate.BINDING if binding else gate.IDLE
        gate.peers = peers


class LedgerPlugin(ReservePlugin, PermitPlugin, PostBindPlugin):
    """The Redis ledger as the shard's Reserve, Permit and PostBind plugin (module docstring). Reads
    the shard's ``ledger``, ``member``, ``epoch`` and TTLs at each call. Raises `TemporaryError`
    from `reserve` and `permit` when Redis is away; Unreserve and PostBind log it (what they could
    not write expires, or the watch reconciles)."""

    name = LEDGER

    def __init__(self, shard: "Shard") -> None:
        self.shard = shard

    def reserve(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str]) -> list[Status]:
        s = self.shard
        tokens = state.read(LEASES_KEY)
        # the devices the scheduling cycle assumed: reserved per device here, recorded at bind
        devices = state.setdefault(DEVICES_KEY, {})
        items = []
        for p, n in zip(pods, nodes):
            held = s.table.devices_of(p.uid)
            if held:
                devices[p.uid] = held
            items.append(ReserveItem(p.uid, n, tokens[p.uid], p.requests, p.priority, held))
        t0 = time.perf_counter()
        results = s.ledger.reserve(s.member, s.epoch, items, s.options.reservation_ttl_ms)
        s.metrics.ledger_calls.labels("reserve").observe(time.perf_counter() - t0)
        codes, reserved = state.setdefault(CODES_KEY, {}), state.setdefault(RESERVED_KEY, set())
        ok, out, counts = Status.success(), [], Counter()
        for res in results:
            counts[res.code] += 1
            if res.ok:
                reserved.add(res.uid)
                out.append(ok)
                continue
            codes[res.uid] = res.code
            if res.code == ReserveCode.INSUFFICIENT:
                out.append(Status.unschedulable(f"node {res.node} had insufficient {res.resource} in the ledger (second check)"))
            elif res.code == ReserveCode.LEASE_LOST:
                # The lease expired before the Reserve (a stall longer than the lease TTL, or Redis
                # lost it). The next attempt takes it again, or waits while another shard holds it.
                out.append(Status.error("pod lease expired before the reservation"))
            elif res.code == ReserveCode.FENCED:
                out.append(Status.unschedulable(f"shard {s.member} no longer owns node {res.node}"))
            else:
                out.append(Status.error(f"node {res.node} unknown to the ledger"))
        for code, n in counts.items():
            s.metrics.ledger_reserve.labels(code.name).inc(n)
        return out

    def unreserve(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str]) -> None:
        """Release the reservations this plugin made for these pods, except those whose bind's
        outcome is unknown (kept until ``observe`` or their TTL). Idempotent."""
        reserved = state.get(RESERVED_KEY)
        if not reserved:
            return
        unknown = state.get(BIND_OUTCOME_UNKNOWN_KEY, ())
        tokens = state.read(LEASES_KEY)
        refs = [ReservationRef(p.uid, n, tokens[p.uid]) for p, n in zip(pods, nodes)
                if p.uid in reserved and p.uid not in unknown]
        reserved.difference_update(p.uid for p in pods)
        if refs:
            try:
                self.shard.ledger.release(refs)
            except TemporaryError as e:  # they expire on their own (TTL)
                log.warning("shard %s: rollback could not reach Redis (%s); TTLs will expire them", self.shard.member, e)

    def permit(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str]) -> list[tuple[Status, float]]:
        s = self.shard
        tokens = state.read(LEASES_KEY)
        refs = [ReservationRef(p.uid, n, tokens[p.uid]) for p, n in zip(pods, nodes)]
        answer = s.ledger.permit(s.member, s.epoch, refs, s.options.lease_ttl_ms)
        codes, out, counts = state.setdefault(CODES_KEY, {}), [], Counter()
        for ref in refs:
            code = answer[ref.uid]
            counts[code] += 1
            if code == ReserveCode.OK:
                out.append(ALLOW)
                continue
            codes[ref.uid] = code
            if code == ReserveCode.FENCED:
                out.append((Status.unschedulable(f"shard {s.member} no longer owns node {ref.node} (at Permit)"), 0.0))
            else:
                out.append((Status.error("pod lease lost before binding"), 0.0))
        for code, n in counts.items():
            s.metrics.ledger_permit.labels(code.name).inc(n)
        return out

    def post_bind(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str]) -> None:
        """Bound: the reservations become usage and the leases are released (one call each); the
        coordinator hears which pods the ledger now counts, with the epoch the shard knew before
        the commit (`Rebalancer.committed`), so that it does not observe them a second time
        when the watch shows them bound."""
        s = self.shard
        tokens = state.read(LEASES_KEY)
        epoch = s.epoch  # read first: a report never names an epoch newer than the ledger it committed to
        try:
            codes = s.ledger.commit([ReservationRef(p.uid, n, tokens[p.uid]) for p, n in zip(pods, nodes)])
        except TemporaryError as e:
            # Bound in the cluster: the truth. The watch's observe converts the reservation.
            log.warning("shard %s: commit after bind failed (%s); the watch will reconcile", s.member, e)
        else:  # a reservation gone before the commit (NOT_FOUND) is left to the watch's observe
            counted = [p.uid for p in pods if codes.get(p.uid) in (LedgerCode.CONVERTED, LedgerCode.ALREADY)]
            if counted:
                s.rebalancer.committed(s.index, epoch, counted)
        try:
            s.ledger.release_leases({p.uid: tokens[p.uid] for p in pods}, s.member)
        except TemporaryError as e:
            log.warning("shard %s: leases not released after bind (%s); they expire", s.member, e)


class MarkedBinds:
    """The shard's cluster (its ``cluster``, a `BindTarget`) as DefaultBinder's client: marks its
    bind calls in the ledger so that the Event and condition writers of every process yield to them
    (`yield_writes_to_binds`), for a cluster with a gate (which also says which calls are bursts,
    for which the writers hold back longer). A Redis error only costs the ordering of the writes
    (logged at debug level)."""

    def __init__(self, shard: "Shard") -> None:
        self.shard = shard
        self.gate: WriteGate | None = shard.cluster.gate
        self._lock = threading.Lock()
        self._in_flight = 0
        self._bursts = 0
        self._marked = float("-inf")
        yield_writes_to_binds(shard.cluster, shard.ledger)

    def bind_many(self, bindings: Sequence[tuple[str, str, str, str]]) -> list[Any]:
        burst = self.gate is not None and self.gate.is_burst(len(bindings))
        self._started(1, burst)
        try:
            return self.shard.cluster.bind_many(bindings)
        finally:
            self._started(-1, burst)

    def renew(self) -> None:
        """Renew the mark while bind calls run (from the loop: a call can outlast the TTL)."""
        if self.gate is not None and self._in_flight > 0 and time.monotonic() - self._marked > BINDING_MARK_TTL_MS / 2000:
            with self._lock:
                if self._in_flight > 0:
                    self._mark(BINDING_MARK_TTL_MS)

    def _started(self, delta: int, burst: bool) -> None:
        """A bind call starts (+1) or ends (-1): the mark is set when a call starts, set again
        without the burst when the last burst call ends, removed when the last call ends."""
        if self.gate is None:
            return
        with self._lock:
            self._in_flight += delta
            self._bursts += delta if burst else 0
            ttl = BINDING_MARK_TTL_MS if self._in_flight > 0 else 0
            if delta > 0 or ttl == 0 or (burst and self._bursts == 0):
                self._mark(ttl)

    def _mark(self, ttl_ms: int) -> None:
        try:
            self.shard.ledger.mark_binding(self.shard.member, ttl_ms, burst=self._bursts > 0)
            self._marked = time.monotonic() if ttl_ms else float("-inf")
        except Exception as e:  # noqa: BLE001 - see the class docstring
            log.debug("shard %s: binds-in-flight mark not written: %s", self.shard.member, e)


class ShardVolumes:
    """VolumeBinding's `VolumeClient` and `VolumeReservations` in a shard: the PreBind writes go
    to the shard's cluster; whether a claim is bound is read from the shard's catalog (the
    coordinator forwards the watch's storage events to it: a backend copy in the shard's process
    watches nothing), or asked of the cluster; the volumes chosen at Reserve are reserved in the ledger for
    ``ShardOptions.reservation_ttl_ms`` (`shardsched.store.Ledger.reserve_volumes`)."""

    def __init__(self, shard: "Shard") -> None:
        self.shard = shard

    def bind_volume(self, pv_name: str, namespace: str, claim: str, claim_uid: str) -> None:
        self.shard.cluster.bind_volume(pv_name, namespace, claim, claim_uid)

    def set_selected_node(self, namespace: str, claim: str, node: str) -> None:
        self.shard.cluster.set_selected_node(namespace, claim, node)

    def claim_bound(self, namespace: str, claim: str) -> bool:
        """The claim as the shard's catalog has it from the watch (``volumeName`` set and the PV
        controller's bind-completed annotation; an assumption has no annotation), else as the
        cluster answers (the simulated cluster knows at once; a backend copy that watches
        nothing answers False)."""
        catalog = self.shard.table.volumes
        view = catalog.claim(namespace, claim) if catalog is not None else None
        if view is not None and view.volume_name and view.bind_completed:
            return True
        return self.shard.cluster.claim_bound(namespace, claim)

    def reserve_volumes(self, uid: str, volumes: Sequence[str]) -> str | None:
        return self.shard.ledger.reserve_volumes(uid, volumes, self.shard.options.reservation_ttl_ms)

    def release_volumes(self, uid: str, volumes: Sequence[str]) -> None:
        try:
            self.shard.ledger.release_volumes(uid, volumes)
        except TemporaryError as e:  # they expire on their own (TTL)
            log.warning("shard %s: volume reservations of %s not released (%s); they expire", self.shard.member, uid, e)
