"""Shard health: every shard is pinged each period; one that does not answer `failures` times in a
row (or whose actor is dead) is replaced by a new incarnation: new member id, epoch bumped so the old
one is fenced off; the pods routed to it are sent to the new one, and those it had leased wait for
their leases to expire."""

from __future__ import annotations

import logging
from typing import Callable

from shardsched.sharding.coordinator.router import slim
from shardsched.sharding.coordinator.state import CoordinatorState, ShardRef
from shardsched.sharding.calls import RemoteDead, RemoteUnavailable, ShardClient

log = logging.getLogger(__name__)


class Health:
    """Pings the shards (`check`) and replaces the ones that failed (`replace_shard`).

    Args:
        shard_factory: (index, member) -> `ShardClient` of a new shard.
        period_s: seconds between two checks (the coordinator's loop reads it).
        failures: consecutive failed pings that replace a shard.
    """

    def __init__(self, state: CoordinatorState, shard_factory: Callable[[int, str], ShardClient], period_s: float,
                 failures: int) -> None:
        self.state = state
        self.shard_factory = shard_factory
        self.period_s = period_s
        self.failures = failures
        self.replaced = 0

    def check(self) -> None:
        """Ping every shard (outside the state lock: a ping may take its whole timeout); replace a
        shard that failed `failures` checks in a row, or at once when its actor is dead (Ray saw its
        process end: it will not come back, and its pods are waiting)."""
        state = self.state
        for s in list(state.shards):
            try:
                s.client.ping().wait(2.0)
                s.failures = 0
            except RemoteUnavailable as e:
                s.failures = self.failures if isinstance(e, RemoteDead) else s.failures + 1
                log.warning("shard %s did not answer (%d/%d): %s", s.member, s.failures, self.failures, e)
                if s.failures >= self.failures:
                    with state.lock:
                        if s.index < len(state.shards) and state.shards[s.index] is s:  # not removed meanwhile
                            self.replace_shard(s.index)

    def replace_shard(self, index: int) -> None:
        """Start a new incarnation of shard ``index``: it gets a new member id, the epoch is bumped
        (the old incarnation is fenced off), its nodes, the bound pods on them and its pending pods.
        Call with the state lock held."""
        state = self.state
        old = state.shards[index]
        member = f"shard-{index}@{old.incarnation + 1}"
        client = self.shard_factory(index, member)
        ref = ShardRef(index, member, client, old.incarnation + 1)
        state.shards[index] = ref
        mine = [n for n, o in state.owners.items() if o == index]
        state.next_epoch()
        state.ledger.set_owners({n: member for n in mine}, state.epoch)
        for s in state.shards:
            s.client.set_epoch(state.epoch)
        table = state.table
        nodes = [table.nodes[table.index[n]].obj for n in mine if n in table.index]
        client.apply_namespaces(table.namespace_labels, [], True)
        client.apply_spread_selectors(table.spread_selectors.objects(), [], True)
        storage = state.storage_snapshot()
        if storage is not None:
            client.apply_storage(*storage)
        client.apply_nodes(nodes, [])
        bound = [(u, n) for n in mine if n in table.index for u in state.bound_usages(table.index[n])]
        client.apply_bound(bound, [])
        pods = [slim(t.pod) for t in state.pending.values() if t.shard == index]
        if pods:
            client.add_pods(pods)
        self.replaced += 1
        log.warning("shard %d replaced by %s (epoch %d): %d nodes, %d pending pods", index, member, state.epoch,
                    len(mine), len(pods))
