"""Partitioning: which shard owns each node, by rendezvous hashing with bounded loads
(`shardsched.sharding.hashing`), and the shard map published in the ledger with an epoch (the
reserve script fences off a shard that no longer owns a node)."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Iterable, Mapping

from shardsched.api.objects import NodeInfo
from shardsched.sharding.coordinator.state import CoordinatorState
from shardsched.sharding.hashing import assign
from shardsched.store.ledger import NodeEntry


def assign_owners(names: list[str], indices: Iterable[int], owned: Mapping[int, int] | None = None) -> dict[str, int]:
    """`shardsched.sharding.hashing.assign` over the shard ids ``shard-<index>``: node -> shard
    index (``owned``: shard index -> nodes it keeps)."""
    ids = {f"shard-{i}": i for i in indices}
    kept = {f"shard-{i}": n for i, n in (owned or {}).items()}
    return {name: ids[sid] for name, sid in assign(names, list(ids), kept).items()}


def assign_new(state: CoordinatorState, names: list[str]) -> dict[str, int]:
    """Owners (shard index) for nodes joining, counting the nodes each shard already owns."""
    return assign_owners(names, [s.index for s in state.shards], Counter(state.owners.values()))


def repartition(state: CoordinatorState, infos: list[NodeInfo]) -> dict[int, list[str]]:
    """Owners of ``infos`` (the listed nodes), published in the ledger under a new epoch. At the
    first list the whole map is computed; at a relist (after 410 Gone) the nodes still there
    keep their owners, new ones are placed as the watch places them (`assign_new`), and nodes that
    are gone are returned per owner index (their shards must drop them)."""
    listed = {n.name for n in infos}
    gone: dict[int, list[str]] = defaultdict(list)
    for name, index in state.owners.items():
        if name not in listed:
            gone[index].append(name)
    state.owners = {name: index for name, index in state.owners.items() if name in listed}
    state.owners.update(assign_new(state, [n.name for n in infos if n.name not in state.owners]))
    owners = state.owners
    state.next_epoch()
    entries = [NodeEntry(n.name, n.allocatable, state.shards[owners[n.name]].member) for n in infos]
    state.ledger.upsert_nodes(entries)
    state.ledger.set_owners({n.name: state.shards[owners[n.name]].member for n in infos}, state.epoch)
    if gone:
        state.ledger.remove_nodes([name for names in gone.values() for name in names])
    state.refresh_owner_slots()
    return gone
