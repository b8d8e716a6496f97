"""The Redis ledger (node reservations, pod leases, shard map) and the embedded redis-server.

Only this package imports ``redis``.
"""

from shardsched.store.ledger import (
    MAX_AMOUNT,
    BoundPod,
    GangCode,
    GangMember,
    GangResult,
    Ledger,
    LedgerCode,
    NodeEntry,
    NodeUsage,
    ReconcileResult,
    ReservationRef,
    ReserveCode,
    ReserveItem,
    ReserveResult,
)
from shardsched.store.server import EmbeddedRedis, RedisServerError, connect, find_redis_server

__all__ = [
    "MAX_AMOUNT",
    "BoundPod",
    "EmbeddedRedis",
    "GangCode",
    "GangMember",
    "GangResult",
    "Ledger",
    "LedgerCode",
    "NodeEntry",
    "NodeUsage",
    "ReconcileResult",
    "RedisServerError",
    "ReservationRef",
    "ReserveCode",
    "ReserveItem",
    "ReserveResult",
    "connect",
    "find_redis_server",
]
