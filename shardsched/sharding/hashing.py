"""Rendezvous (highest-random-weight) hashing of nodes to shards.

Each (node, shard) pair gets a 64-bit weight from a keyed BLAKE2b hash; a node belongs to the shard
with the highest weight. Adding a shard to N moves only the nodes the new shard wins (about
1/(N+1) of them); removing one moves only that shard's nodes.
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Sequence

import numpy as np


def _weight(node: str, shard: str) -> int:
    digest = hashlib.blake2b(node.encode(), digest_size=8, key=shard.encode()[:64]).digest()
    return int.from_bytes(digest, "big")


def assign(nodes: Iterable[str], shards: Sequence[str]) -> dict[str, str]:
    """Owner shard of every node (node -> shard id). Deterministic; independent of input order.

    Raises:
        ValueError: no shards.
    """
    if not shards:
        raise ValueError("rendezvous hashing needs at least one shard")
    out = {}
    for node in nodes:
        out[node] = max(shards, key=lambda s: (_weight(node, s), s))
    return out


def moved_fraction(before: dict[str, str], after: dict[str, str]) -> float:
    """Fraction of the nodes present in both maps whose owner changed."""
    common = before.keys() & after.keys()
    if not common:
        return 0.0
    return sum(before[n] != after[n] for n in common) / len(common)


def owner_array(names: Sequence[str | None], owners: dict[str, str], shard_index: dict[str, int]) -> np.ndarray:
    """int32 array over table slots: index of the owning shard, -1 for free slots or unknown nodes."""
    out = np.full(len(names), -1, np.int32)
    for i, name in enumerate(names):
        if name is not None and name in owners:
            out[i] = shard_index.get(owners[name], -1)
    return out
