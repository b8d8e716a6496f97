"""Ledger sync: what the watch shows is written to the Redis ledger (nodes, pods bound by anyone,
pods gone), kept owed while Redis is away, and the whole ledger rebuilt from the cluster's truth
when Redis restarted."""

from __future__ import annotations

import logging
from typing import Iterable, Mapping

from shardsched.errors import TemporaryError
from shardsched.sharding.coordinator.state import CoordinatorState
from shardsched.store.ledger import BoundPod, NodeEntry

log = logging.getLogger(__name__)


class LedgerSync:
    """What the watch showed and the ledger has not taken yet, and the Redis instance it went to.

    Attributes:
        rebuilds: how many times the ledger was rebuilt (`rebuild`).
        instance: the run id of the Redis the ledger was written to (None before the first list).
    """

    def __init__(self, state: CoordinatorState) -> None:
        self.state = state
        self.rebuilds = 0
        self.instance: str | None = None
        # node upserts (None: removal), pods bound (observe), pods gone (forget); written by `flush`
        self._owed_nodes: dict[str, NodeEntry | None] = {}
        self._owed_observe: dict[str, BoundPod] = {}
        self._owed_forget: dict[str, str] = {}

    def owe_nodes(self, entries: Iterable[NodeEntry], removed: Iterable[str]) -> None:
        """Nodes added or changed (an entry without owner keeps the owner of one still owed) and
        removed, to be written by `flush`."""
        for entry in entries:
            queued = self._owed_nodes.get(entry.name)
            keep_owner = entry.owner is None and queued is not None and queued.owner is not None
            self._owed_nodes[entry.name] = NodeEntry(entry.name, entry.allocatable, queued.owner) if keep_owner else entry
        for name in removed:
            self._owed_nodes[name] = None

    def owe_pods(self, observe: Iterable[BoundPod], forget: Mapping[str, str]) -> None:
        """Pods seen bound, and pods gone (uid -> node), to be written by `flush`."""
        for bound in observe:
            self._owed_observe[bound.uid] = bound
        for uid, node in forget.items():
            self._owed_observe.pop(uid, None)  # bound and gone while Redis was away: forget says it all
            self._owed_forget[uid] = node

    def flush(self) -> bool:
        """Write to the ledger what the watch showed (nodes added, changed or removed; pods bound;
        pods deleted or terminal), in that order. What Redis does not take now (it is away) stays
        owed and is written by a later call (every health period at least): these writes are
        idempotent, and a pod both bound and gone meanwhile is only forgotten, so the ledger ends
        equal to the cluster however long Redis was away. Call with the state lock held.

        Returns: True when nothing is owed any more."""
        ledger = self.state.ledger
        try:
            if self._owed_nodes:
                upserts = [e for e in self._owed_nodes.values() if e is not None]
                if upserts:
                    ledger.upsert_nodes(upserts)
                gone = [n for n, e in self._owed_nodes.items() if e is None]
                if gone:
                    ledger.remove_nodes(gone)
                self._owed_nodes.clear()
            if self._owed_observe:
                ledger.observe(list(self._owed_observe.values()))
                self._owed_observe.clear()
            if self._owed_forget:
                ledger.forget(dict(self._owed_forget))
                self._owed_forget.clear()
        except TemporaryError as e:
            owed = len(self._owed_observe) + len(self._owed_forget)
            self.state.last_error = f"ledger unavailable: {e}; {len(self._owed_nodes)} nodes and {owed} pods owed to it"
            return False
        return True

    def check(self) -> None:
        """Write what is owed to the ledger (`flush`), and rebuild it when Redis restarted (its run
        id changed): without persistence it came back empty (no nodes, no shard map, no leases),
        and with AOF it may have lost its last second of writes (reservations, commits, observed
        pods). See `rebuild`."""
        state = self.state
        if self._owed_nodes or self._owed_observe or self._owed_forget:
            with state.lock:
                self.flush()
        try:
            instance = state.ledger.instance_id()
        except TemporaryError:
            return  # Redis away: shards pause; checked again next period
        if self.instance is None:
            self.instance = instance
            return
        if instance == self.instance:
            return
        try:
            with state.lock:
                self.rebuild()
        except TemporaryError as e:
            state.last_error = f"ledger rebuild interrupted: {e}"  # instance not recorded: retried
            return
        self.instance = instance

    def rebuild(self) -> None:
        """Rebuild the ledger from the cluster's truth, as the coordinator's table holds it at the
        watch position ``rv`` (bound pods seen later are observed as usual, idempotently): every
        node's allocatable and bound pods (`Ledger.reconcile`), then the shard map with a new epoch,
        then the shards' epoch. Until the map is published every reservation is refused (FENCED),
        so binding resumes only on a rebuilt ledger. Call with the state lock held.

        Raises:
            TemporaryError: Redis went away again; call again.
        """
        state = self.state
        drift = 0
        for name, slot in list(state.table.index.items()):
            usages = list(state.bound_usages(slot))
            bound = {usage.uid: usage.requests for usage in usages}
            devices = {usage.uid: usage.devices for usage in usages if usage.devices}
            drift += state.ledger.reconcile(name, state.table.allocatable_of(name), bound, devices).drift
        state.next_epoch()
        state.ledger.set_owners({n: state.shards[o].member for n, o in state.owners.items()}, state.epoch)
        for s in state.shards:
            s.client.set_epoch(state.epoch)
        self.rebuilds += 1
        log.warning("Redis restarted: ledger rebuilt from the cluster (%d nodes, %d drifted), epoch %d",
                    len(state.table.index), drift, state.epoch)
