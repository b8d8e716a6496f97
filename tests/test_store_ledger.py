"""The Redis ledger on a real redis-server: every script and return code, expiry on server time,
idempotency, fencing (stale token, stale epoch), and racing callers."""

from __future__ import annotations

import itertools
import socket
import threading
import time
from dataclasses import dataclass, field

import pytest
import redis

from shardsched.errors import FencedOffError, PermanentError, TemporaryError
from shardsched.store import (
    BoundPod,
    Ledger,
    LedgerCode,
    NodeEntry,
    NodeUsage,
    ReservationRef,
    ReserveCode,
    ReserveItem,
    connect,
)

GI = 2**30
SHARD, OTHER = "shard-a", "shard-b"
ALLOC = {"cpu": 4000, "memory": 8 * GI, "pods": 10}
TTL_MS = 10_000
SHORT_TTL_MS = 80
AFTER_SHORT_TTL_S = 0.15

_uids = itertools.count()


def new_uid() -> str:
    return f"uid-{next(_uids)}"


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def with_pod(requests: dict[str, int]) -> dict[str, int]:
    """What a pod's reservation or usage adds to its node: its requests and one pod."""
    return {**{k: v for k, v in requests.items() if v}, "pods": 1}


def add_nodes(ledger: Ledger, *names: str, owner: str = SHARD, epoch: int = 1, **alloc: int) -> None:
    """Upsert nodes (allocatable ``alloc`` or ALLOC) owned by ``owner`` and publish ``epoch``."""
    ledger.upsert_nodes([NodeEntry(n, alloc or ALLOC) for n in names])
    ledger.set_owners({n: owner for n in names}, epoch)


def leased(ledger: Ledger, node: str, shard: str = SHARD, ttl_ms: int = TTL_MS, **requests: int) -> ReserveItem:
    """A fresh pod whose lease ``shard`` holds, as a ReserveItem for ``node``."""
    uid = new_uid()
    token = ledger.acquire_leases([uid], shard, ttl_ms)[uid]
    return ReserveItem(uid, node, token, requests)


def reserve_one(ledger: Ledger, item: ReserveItem, shard: str = SHARD, epoch: int = 1,
                ttl_ms: int = TTL_MS) -> ReserveCode:
    [result] = ledger.reserve(shard, epoch, [item], ttl_ms)
    return result.code


# Reserve: one case per return code and per check order.


@dataclass(frozen=True)
class ReserveCase:
    want: ReserveCode
    resource: str = ""
    requests: dict[str, int] = field(default_factory=lambda: {"cpu": 500, "memory": GI})
    bound: tuple[dict[str, int], ...] = ()  # pods already bound on the node
    lease: str = "mine"  # mine | none | other | stale-token
    owner: str = SHARD
    stale_epoch: bool = False
    upserted: bool = True


RESERVE_CASES = {
    "ok": ReserveCase(ReserveCode.OK),
    "ok-fills-node-exactly": ReserveCase(ReserveCode.OK, requests={"cpu": 3000, "memory": 7 * GI},
                                         bound=({"cpu": 1000, "memory": GI},)),
    "ok-zero-requests-count-one-pod": ReserveCase(ReserveCode.OK, requests={"cpu": 0}),
    "insufficient-cpu": ReserveCase(ReserveCode.INSUFFICIENT, "cpu", requests={"cpu": 4001}),
    "insufficient-memory-after-bound": ReserveCase(ReserveCode.INSUFFICIENT, "memory", requests={"memory": 5 * GI},
                                                   bound=({"memory": 4 * GI},)),
    "insufficient-extended-resource": ReserveCase(ReserveCode.INSUFFICIENT, "nvidia.com/gpu",
                                                  requests={"nvidia.com/gpu": 1}),
    "insufficient-pod-count-named-first": ReserveCase(ReserveCode.INSUFFICIENT, "pods", requests={"cpu": 99_999},
                                                      bound=({},) * 10),
    "insufficient-cpu-before-memory": ReserveCase(ReserveCode.INSUFFICIENT, "cpu",
                                                  requests={"memory": 99 * GI, "cpu": 99_999}),
    "lease-lost-no-lease": ReserveCase(ReserveCode.LEASE_LOST, lease="none"),
    "lease-lost-held-by-other-shard": ReserveCase(ReserveCode.LEASE_LOST, lease="other"),
    "lease-lost-stale-token": ReserveCase(ReserveCode.LEASE_LOST, lease="stale-token"),
    "lease-checked-before-owner": ReserveCase(ReserveCode.LEASE_LOST, lease="none", owner=OTHER),
    "fenced-other-owner": ReserveCase(ReserveCode.FENCED, owner=OTHER),
    "fenced-stale-epoch": ReserveCase(ReserveCode.FENCED, stale_epoch=True),
    "fenced-checked-before-node-unknown": ReserveCase(ReserveCode.FENCED, owner=OTHER, upserted=False),
    "node-unknown": ReserveCase(ReserveCode.NODE_UNKNOWN, upserted=False),
    "node-unknown-checked-before-capacity": ReserveCase(ReserveCode.NODE_UNKNOWN, requests={"cpu": 99_999},
                                                        upserted=False),
}


@pytest.mark.parametrize("case", RESERVE_CASES.values(), ids=RESERVE_CASES.keys())
def test_reserve_codes(ledger: Ledger, case: ReserveCase) -> None:
    if case.upserted:
        ledger.upsert_nodes([NodeEntry("n1", ALLOC)])
    ledger.set_owners({"n1": case.owner}, 2)
    ledger.observe([BoundPod(new_uid(), "n1", requests) for requests in case.bound])
    uid = new_uid()
    token = 42
    if case.lease in ("mine", "stale-token"):
        token = ledger.acquire_leases([uid], SHARD, TTL_MS)[uid]
    if case.lease == "stale-token":
        ledger.release_leases({uid: token}, SHARD)
        assert ledger.acquire_leases([uid], SHARD, TTL_MS)[uid] > token
    if case.lease == "other":
        token = ledger.acquire_leases([uid], OTHER, TTL_MS)[uid]
    before = ledger.node_usage("n1")

    [result] = ledger.reserve(SHARD, 1 if case.stale_epoch else 2, [ReserveItem(uid, "n1", token, case.requests)],
                              TTL_MS)

    assert (result.uid, result.node, result.code, result.resource) == (uid, "n1", case.want, case.resource)
    assert result.ok == (case.want is ReserveCode.OK)
    usage = ledger.node_usage("n1")
    assert usage.used == before.used
    assert usage.reserved == (with_pod(case.requests) if result.ok else {})


def test_reserve_batch_counts_earlier_pods_and_mixes_codes(ledger: Ledger) -> None:
    add_nodes(ledger, "n1", "n2", cpu=1000, pods=10)
    ledger.set_owners({"n3": SHARD}, 1)  # owned, never upserted
    items = [leased(ledger, "n1", cpu=300) for _ in range(4)]
    items += [leased(ledger, "n2", cpu=1000), leased(ledger, "n3", cpu=1),
              ReserveItem(new_uid(), "n2", 1, {"cpu": 1}), leased(ledger, "n2", cpu=1)]

    results = ledger.reserve(SHARD, 1, items, TTL_MS)

    assert [(r.uid, r.code, r.resource) for r in results] == [
        (items[0].uid, ReserveCode.OK, ""),
        (items[1].uid, ReserveCode.OK, ""),
        (items[2].uid, ReserveCode.OK, ""),
        (items[3].uid, ReserveCode.INSUFFICIENT, "cpu"),
        (items[4].uid, ReserveCode.OK, ""),
        (items[5].uid, ReserveCode.NODE_UNKNOWN, ""),
        (items[6].uid, ReserveCode.LEASE_LOST, ""),
        (items[7].uid, ReserveCode.INSUFFICIENT, "cpu"),
    ]
    assert ledger.node_usage("n1").reserved == {"cpu": 900, "pods": 3}
    assert ledger.node_usage("n2").reserved == {"cpu": 1000, "pods": 1}


def test_reserve_is_idempotent_for_the_same_shard_and_token(ledger: Ledger) -> None:
    add_nodes(ledger, "n1")
    items = [leased(ledger, "n1", cpu=1000) for _ in range(3)]

    first = ledger.reserve(SHARD, 1, items, TTL_MS)
    again = ledger.reserve(SHARD, 1, items, TTL_MS)

    assert [r.code for r in first + again] == [ReserveCode.OK] * 6
    assert ledger.node_usage("n1").reserved == {"cpu": 3000, "pods": 3}


def test_reserve_replaces_a_stale_reservation_of_the_pod(ledger: Ledger) -> None:
    add_nodes(ledger, "n1")
    old = leased(ledger, "n1", cpu=500)
    assert reserve_one(ledger, old) is ReserveCode.OK
    # Shard a gives the pod up and the node moves to shard b, which takes the pod over.
    ledger.release_leases({old.uid: old.token}, SHARD)
    ledger.set_owners({"n1": OTHER}, 2)
    token = ledger.acquire_leases([old.uid], OTHER, TTL_MS)[old.uid]
    new = ReserveItem(old.uid, "n1", token, {"cpu": 500})

    assert reserve_one(ledger, new, OTHER, epoch=2) is ReserveCode.OK
    assert ledger.node_usage("n1").reserved == {"cpu": 500, "pods": 1}
    # The stale holder can neither release nor commit the successor's reservation.
    assert ledger.release([old]) == {old.uid: LedgerCode.NOT_FOUND}
    assert ledger.commit([old]) == {old.uid: LedgerCode.NOT_FOUND}
    assert ledger.node_usage("n1").reserved == {"cpu": 500, "pods": 1}


def test_reservation_expires_on_server_time(ledger: Ledger, redis_client: redis.Redis) -> None:
    add_nodes(ledger, "n1", cpu=1000, pods=10)
    first = leased(ledger, "n1", cpu=1000)
    second = leased(ledger, "n1", cpu=1000)
    seconds, micros = redis_client.time()
    server_now_ms = seconds * 1000 + micros // 1000

    assert reserve_one(ledger, first, ttl_ms=SHORT_TTL_MS) is ReserveCode.OK
    expiry_ms = redis_client.zscore(f"{ledger.prefix}rexp:n1", first.uid)
    assert server_now_ms + SHORT_TTL_MS <= expiry_ms <= server_now_ms + SHORT_TTL_MS + 1000
    assert reserve_one(ledger, second) is ReserveCode.INSUFFICIENT

    time.sleep(AFTER_SHORT_TTL_S)
    assert reserve_one(ledger, second) is ReserveCode.OK  # reserve swept the expired one first
    assert ledger.node_usage("n1").reserved == {"cpu": 1000, "pods": 1}
    assert ledger.commit([first]) == {first.uid: LedgerCode.NOT_FOUND}


def test_sweep_drops_only_expired_reservations(ledger: Ledger) -> None:
    add_nodes(ledger, "n1", "n2")
    short = [leased(ledger, "n1", cpu=100), leased(ledger, "n2", cpu=100)]
    long = leased(ledger, "n1", cpu=200)
    assert [r.code for r in ledger.reserve(SHARD, 1, short, SHORT_TTL_MS)] == [ReserveCode.OK] * 2
    assert reserve_one(ledger, long) is ReserveCode.OK
    assert ledger.sweep(["n1", "n2"]) == 0

    time.sleep(AFTER_SHORT_TTL_S)
    assert ledger.node_usage("n2").reserved == {"cpu": 100, "pods": 1}  # expired, not swept yet
    assert ledger.sweep(["n1", "n2", "n3"]) == 2
    assert ledger.sweep(["n1", "n2"]) == 0
    assert ledger.node_usage("n1").reserved == {"cpu": 200, "pods": 1}
    assert ledger.node_usage("n2").reserved == {}


# Leases and fencing tokens.


LEASE_CASES = {
    "free": ("none", True),
    "held-by-other-shard": ("other-live", False),
    "expired-lease-of-other-shard": ("other-expired", True),
    "released-by-other-shard": ("other-released", True),
    "already-held-by-same-shard": ("mine-live", True),
}


@pytest.mark.parametrize(("prior", "granted"), LEASE_CASES.values(), ids=LEASE_CASES.keys())
def test_acquire_leases(ledger: Ledger, prior: str, granted: bool) -> None:
    uid = new_uid()
    previous = 0
    if prior.startswith("other"):
        ttl = SHORT_TTL_MS if prior == "other-expired" else TTL_MS
        previous = ledger.acquire_leases([uid], OTHER, ttl)[uid]
    if prior == "other-expired":
        time.sleep(AFTER_SHORT_TTL_S)
    if prior == "other-released":
        assert ledger.release_leases({uid: previous}, OTHER) == {uid}
    if prior == "mine-live":
        previous = ledger.acquire_leases([uid], SHARD, TTL_MS)[uid]

    tokens = ledger.acquire_leases([uid], SHARD, TTL_MS)

    assert (uid in tokens) == granted
    if prior == "mine-live":
        assert tokens[uid] == previous  # keeps its token: its own reservations stay valid
    elif granted:
        assert tokens[uid] > previous


def test_fencing_tokens_increase_across_all_pods(ledger: Ledger) -> None:
    first = ledger.acquire_leases(["a", "b", "c"], SHARD, TTL_MS)
    second = ledger.acquire_leases(["d", "e"], OTHER, TTL_MS)
    tokens = [first["a"], first["b"], first["c"], second["d"], second["e"]]
    assert tokens == sorted(set(tokens)) and tokens[0] > 0


RENEW_CASES = {
    "current-token": ("current", True),
    "wrong-token": ("wrong-token", False),
    "other-shard": ("other-shard", False),
    "expired": ("expired", False),
}


@pytest.mark.parametrize(("situation", "renewed"), RENEW_CASES.values(), ids=RENEW_CASES.keys())
def test_renew_leases(ledger: Ledger, situation: str, renewed: bool) -> None:
    uid = new_uid()
    token = ledger.acquire_leases([uid], SHARD, SHORT_TTL_MS if situation == "expired" else TTL_MS)[uid]
    if situation == "expired":
        time.sleep(AFTER_SHORT_TTL_S)
    shard = OTHER if situation == "other-shard" else SHARD
    presented = token + 1 if situation == "wrong-token" else token

    assert ledger.renew_leases({uid: presented}, shard, TTL_MS) == ({uid} if renewed else set())


def test_renew_extends_the_lease(ledger: Ledger) -> None:
    uid = new_uid()
    token = ledger.acquire_leases([uid], SHARD, SHORT_TTL_MS)[uid]
    assert ledger.renew_leases({uid: token}, SHARD, TTL_MS) == {uid}
    time.sleep(AFTER_SHORT_TTL_S)
    assert ledger.acquire_leases([uid], OTHER, TTL_MS) == {}


PERMIT_CASES = {
    "holder-and-owner": ("current", ReserveCode.OK),
    "wrong-token": ("wrong-token", ReserveCode.LEASE_LOST),
    "lease-taken": ("other-holder", ReserveCode.LEASE_LOST),
    "lease-expired": ("expired", ReserveCode.LEASE_LOST),
    "older-epoch": ("new-epoch", ReserveCode.FENCED),
    "node-handed-over": ("new-owner", ReserveCode.FENCED),
}


@pytest.mark.parametrize(("situation", "want"), PERMIT_CASES.values(), ids=PERMIT_CASES.keys())
def test_permit(ledger: Ledger, situation: str, want: ReserveCode) -> None:
    """The check right before a bind: the lease with the reservation's token, then the owner and
    the epoch (reserve.lua's codes and order); a permitted lease is extended."""
    add_nodes(ledger, "n1")
    item = leased(ledger, "n1", ttl_ms=SHORT_TTL_MS if situation == "expired" else TTL_MS)
    assert reserve_one(ledger, item) == ReserveCode.OK
    token = item.token + 1 if situation == "wrong-token" else item.token
    if situation == "expired":
        time.sleep(AFTER_SHORT_TTL_S)
    elif situation == "other-holder":
        ledger.release_leases({item.uid: item.token}, SHARD)
        assert ledger.acquire_leases([item.uid], OTHER, TTL_MS)
    elif situation == "new-epoch":
        ledger.set_owners({}, 2)
    elif situation == "new-owner":
        ledger.set_owners({"n1": OTHER}, 1)

    assert ledger.permit(SHARD, 1, [ReservationRef(item.uid, "n1", token)], TTL_MS) == {item.uid: want}


def test_permit_extends_the_lease(ledger: Ledger) -> None:
    add_nodes(ledger, "n1")
    item = leased(ledger, "n1", ttl_ms=SHORT_TTL_MS)
    assert ledger.permit(SHARD, 1, [item], TTL_MS) == {item.uid: ReserveCode.OK}
    time.sleep(AFTER_SHORT_TTL_S)
    assert ledger.acquire_leases([item.uid], OTHER, TTL_MS) == {}


def test_release_leases_needs_the_current_token(ledger: Ledger) -> None:
    uid = new_uid()
    token = ledger.acquire_leases([uid], SHARD, TTL_MS)[uid]
    assert ledger.release_leases({uid: token + 1}, SHARD) == set()
    assert ledger.release_leases({uid: token}, OTHER) == set()
    assert ledger.acquire_leases([uid], OTHER, TTL_MS) == {}

    assert ledger.release_leases({uid: token}, SHARD) == {uid}
    assert ledger.release_leases({uid: token}, SHARD) == set()  # idempotent
    assert ledger.acquire_leases([uid], OTHER, TTL_MS)[uid] > token


def test_expired_lease_holder_is_fenced_off(ledger: Ledger) -> None:
    add_nodes(ledger, "n1")
    stale = leased(ledger, "n1", ttl_ms=SHORT_TTL_MS, cpu=100)
    time.sleep(AFTER_SHORT_TTL_S)
    assert reserve_one(ledger, stale) is ReserveCode.LEASE_LOST
    assert ledger.renew_leases({stale.uid: stale.token}, SHARD, TTL_MS) == set()
    # The shard acquires again (or another one does): a new, larger token, the old one stays dead.
    token = ledger.acquire_leases([stale.uid], SHARD, TTL_MS)[stale.uid]
    assert token > stale.token
    assert reserve_one(ledger, stale) is ReserveCode.LEASE_LOST
    assert reserve_one(ledger, ReserveItem(stale.uid, "n1", token, {"cpu": 100})) is ReserveCode.OK


# The shard map and its epoch.


def test_set_owners_refuses_to_lower_the_epoch(ledger: Ledger) -> None:
    assert ledger.epoch() == 0
    ledger.set_owners({"n1": SHARD, "n2": SHARD}, 3)
    with pytest.raises(FencedOffError, match="older than the current epoch 3"):
        ledger.set_owners({"n1": OTHER}, 2)
    assert (ledger.epoch(), ledger.owners()) == (3, {"n1": SHARD, "n2": SHARD})

    ledger.set_owners({"n1": OTHER, "n2": None}, 3)  # an equal epoch re-applies
    assert (ledger.epoch(), ledger.owners()) == (3, {"n1": OTHER})


def test_handover_fences_the_old_owner(ledger: Ledger) -> None:
    add_nodes(ledger, "n1", epoch=1)
    assert reserve_one(ledger, leased(ledger, "n1", cpu=100), SHARD, epoch=1) is ReserveCode.OK

    ledger.set_owners({"n1": OTHER}, 2)

    assert reserve_one(ledger, leased(ledger, "n1", cpu=100), SHARD, epoch=1) is ReserveCode.FENCED
    assert reserve_one(ledger, leased(ledger, "n1", cpu=100), SHARD, epoch=2) is ReserveCode.FENCED
    assert reserve_one(ledger, leased(ledger, "n1", OTHER, cpu=100), OTHER, epoch=1) is ReserveCode.FENCED
    assert reserve_one(ledger, leased(ledger, "n1", OTHER, cpu=100), OTHER, epoch=2) is ReserveCode.OK
    assert ledger.node_usage("n1").reserved == {"cpu": 200, "pods": 2}


# Commit, release, observe, forget.


def _reserved(ledger: Ledger, cpu: int = 500) -> ReserveItem:
    item = leased(ledger, "n1", cpu=cpu)
    assert reserve_one(ledger, item) is ReserveCode.OK
    return item


COMMIT_CASES = {
    "reserved": ("reserved", LedgerCode.CONVERTED),
    "committed-twice": ("committed", LedgerCode.ALREADY),
    "observed-first": ("observed", LedgerCode.ALREADY),
    "never-reserved": ("never", LedgerCode.NOT_FOUND),
    "other-token": ("other-token", LedgerCode.NOT_FOUND),
    "released": ("released", LedgerCode.NOT_FOUND),
}


@pytest.mark.parametrize(("before", "want"), COMMIT_CASES.values(), ids=COMMIT_CASES.keys())
def test_commit(ledger: Ledger, before: str, want: LedgerCode) -> None:
    add_nodes(ledger, "n1")
    item = leased(ledger, "n1", cpu=500) if before == "never" else _reserved(ledger)
    if before == "committed":
        ledger.commit([item])
    if before == "observed":
        ledger.observe([BoundPod(item.uid, "n1", item.requests)])
    if before == "released":
        ledger.release([item])
    ref = ReservationRef(item.uid, "n1", item.token + 1 if before == "other-token" else item.token)

    assert ledger.commit([ref]) == {item.uid: want}

    counted = want in (LedgerCode.CONVERTED, LedgerCode.ALREADY)
    reserved_left = before == "other-token"
    assert ledger.node_usage("n1") == NodeUsage(ALLOC, {"cpu": 500, "pods": 1} if counted else {},
                                                {"cpu": 500, "pods": 1} if reserved_left else {})


RELEASE_CASES = {
    "reserved": ("reserved", LedgerCode.RELEASED, False),
    "released-twice": ("released", LedgerCode.NOT_FOUND, False),
    "never-reserved": ("never", LedgerCode.NOT_FOUND, False),
    "other-token-keeps-reservation": ("other-token", LedgerCode.NOT_FOUND, True),
    "after-commit-keeps-usage": ("committed", LedgerCode.NOT_FOUND, False),
}


@pytest.mark.parametrize(("before", "want", "still_reserved"), RELEASE_CASES.values(), ids=RELEASE_CASES.keys())
def test_release(ledger: Ledger, before: str, want: LedgerCode, still_reserved: bool) -> None:
    add_nodes(ledger, "n1")
    item = leased(ledger, "n1", cpu=500) if before == "never" else _reserved(ledger)
    if before == "released":
        ledger.release([item])
    if before == "committed":
        ledger.commit([item])
    ref = ReservationRef(item.uid, "n1", item.token + 1 if before == "other-token" else item.token)

    assert ledger.release([ref]) == {item.uid: want}

    usage = ledger.node_usage("n1")
    assert usage.reserved == ({"cpu": 500, "pods": 1} if still_reserved else {})
    assert usage.used == ({"cpu": 500, "pods": 1} if before == "committed" else {})


OBSERVE_CASES = {
    "not-reserved": ("never", LedgerCode.ADDED),
    "reserved-on-that-node": ("reserved-here", LedgerCode.CONVERTED),
    "reserved-on-another-node": ("reserved-elsewhere", LedgerCode.ADDED),
    "observed-twice": ("observed", LedgerCode.ALREADY),
    "committed-first": ("committed", LedgerCode.ALREADY),
}


@pytest.mark.parametrize(("before", "want"), OBSERVE_CASES.values(), ids=OBSERVE_CASES.keys())
def test_observe(ledger: Ledger, before: str, want: LedgerCode) -> None:
    add_nodes(ledger, "n1", "n2")
    item = leased(ledger, "n2" if before == "reserved-elsewhere" else "n1", cpu=500)
    if before != "never":
        assert reserve_one(ledger, item) is ReserveCode.OK
    if before == "observed":
        ledger.observe([BoundPod(item.uid, "n1", item.requests)])
    if before == "committed":
        ledger.commit([item])

    assert ledger.observe([BoundPod(item.uid, "n1", {"cpu": 500})]) == {item.uid: want}

    assert ledger.node_usage("n1") == NodeUsage(ALLOC, {"cpu": 500, "pods": 1}, {})
    assert ledger.node_usage("n2") == NodeUsage(ALLOC, {}, {})
    assert ledger.commit([item]) == {item.uid: LedgerCode.ALREADY if before != "reserved-elsewhere"
                                     else LedgerCode.NOT_FOUND}


def test_observe_counts_pods_on_nodes_not_known_yet(ledger: Ledger) -> None:
    uid = new_uid()
    assert ledger.observe([BoundPod(uid, "late", {"cpu": 100})]) == {uid: LedgerCode.ADDED}
    ledger.upsert_nodes([NodeEntry("late", ALLOC, SHARD)])
    assert ledger.node_usage("late").used == {"cpu": 100, "pods": 1}


FORGET_CASES = {
    "bound": ("bound", LedgerCode.REMOVED),
    "forgotten-twice": ("forgotten", LedgerCode.NOT_FOUND),
    "only-reserved": ("reserved", LedgerCode.REMOVED),
    "unknown-pod": ("never", LedgerCode.NOT_FOUND),
}


@pytest.mark.parametrize(("before", "want"), FORGET_CASES.values(), ids=FORGET_CASES.keys())
def test_forget(ledger: Ledger, before: str, want: LedgerCode) -> None:
    add_nodes(ledger, "n1")
    other = BoundPod(new_uid(), "n1", {"cpu": 100})
    ledger.observe([other])
    uid = new_uid()
    if before in ("bound", "forgotten"):
        ledger.observe([BoundPod(uid, "n1", {"cpu": 500})])
    if before == "forgotten":
        ledger.forget({uid: "n1"})
    if before == "reserved":
        uid = _reserved(ledger).uid

    assert ledger.forget({uid: "n1"}) == {uid: want}

    assert ledger.node_usage("n1") == NodeUsage(ALLOC, {"cpu": 100, "pods": 1}, {})


# Nodes and reconcile.


def test_upsert_replaces_allocatable_and_keeps_usage(ledger: Ledger) -> None:
    assert ledger.upsert_nodes([NodeEntry("n1", {"cpu": 1000, "nvidia.com/gpu": 2, "pods": 5}, SHARD)]) == 1
    ledger.observe([BoundPod(new_uid(), "n1", {"cpu": 800})])

    assert ledger.upsert_nodes([NodeEntry("n1", {"cpu": 500, "pods": 5})]) == 0  # shrank below usage

    assert ledger.node_usage("n1") == NodeUsage({"cpu": 500, "pods": 5}, {"cpu": 800, "pods": 1}, {})
    assert ledger.owners() == {"n1": SHARD}  # owner=None keeps the owner
    ledger.set_owners({}, 1)
    assert reserve_one(ledger, leased(ledger, "n1", cpu=1)) is ReserveCode.INSUFFICIENT


def test_remove_nodes_forgets_them_but_keeps_the_usage_of_pods_still_bound(ledger: Ledger,
                                                                           redis_client: redis.Redis) -> None:
    add_nodes(ledger, "n1", "n2", "n3")
    _reserved(ledger)
    still_bound = BoundPod(new_uid(), "n1", {"cpu": 100})
    ledger.observe([still_bound])

    assert ledger.remove_nodes(["n1", "n1", "n2", "gone"]) == 2
    assert ledger.remove_nodes(["n1"]) == 0

    # n2 had nothing bound: nothing is left of it; n1 keeps only the usage of its bound pod
    assert not any(":n2" in key for key in redis_client.scan_iter(match=f"{ledger.prefix}*"))
    assert ledger.node_usage("n1") == NodeUsage({}, {"cpu": 100, "pods": 1}, {})
    assert ledger.owners() == {"n3": SHARD}
    assert reserve_one(ledger, leased(ledger, "n1")) is ReserveCode.FENCED
    # pod GC deletes the pod: then nothing is counted on n1
    ledger.forget({still_bound.uid: "n1"})
    assert ledger.node_usage("n1") == NodeUsage({}, {}, {})


def test_a_node_created_again_under_its_name_still_counts_the_pods_bound_to_it(ledger: Ledger) -> None:
    add_nodes(ledger, "z", cpu=1000, pods=10)
    ledger.observe([BoundPod(new_uid(), "z", {"cpu": 700})])
    ledger.remove_nodes(["z"])
    add_nodes(ledger, "z", cpu=1000, pods=10)

    assert ledger.node_usage("z") == NodeUsage({"cpu": 1000, "pods": 10}, {"cpu": 700, "pods": 1}, {})
    assert reserve_one(ledger, leased(ledger, "z", cpu=400)) is ReserveCode.INSUFFICIENT
    assert reserve_one(ledger, leased(ledger, "z", cpu=300)) is ReserveCode.OK


def test_reconcile_rebuilds_usage_from_the_cluster(ledger: Ledger, redis_client: redis.Redis) -> None:
    add_nodes(ledger, "n1")
    gone, stays = BoundPod(new_uid(), "n1", {"cpu": 100}), BoundPod(new_uid(), "n1", {"cpu": 200})
    ledger.observe([gone, stays])
    pending = _reserved(ledger, cpu=300)  # reserved, not bound: kept
    bound_meanwhile = _reserved(ledger, cpu=400)  # bound, but neither committed nor observed
    expired = leased(ledger, "n1", cpu=50)
    assert reserve_one(ledger, expired, ttl_ms=SHORT_TTL_MS) is ReserveCode.OK
    redis_client.hset(f"{ledger.prefix}node:n1", "u:memory", 12345)  # corrupted counter
    time.sleep(AFTER_SHORT_TTL_S)
    truth = {stays.uid: stays.requests, bound_meanwhile.uid: bound_meanwhile.requests}
    alloc = {**ALLOC, "cpu": 3000}

    result = ledger.reconcile("n1", alloc, truth)

    assert (result.drift, result.bound_pods, result.reservations) == (True, 2, 1)
    assert ledger.node_usage("n1") == NodeUsage(alloc, {"cpu": 600, "pods": 2}, {"cpu": 300, "pods": 1})
    assert ledger.reconcile("n1", alloc, truth).drift is False
    assert ledger.forget({gone.uid: "n1"}) == {gone.uid: LedgerCode.NOT_FOUND}
    assert ledger.commit([pending]) == {pending.uid: LedgerCode.CONVERTED}


def test_reconcile_makes_an_unknown_node_known(ledger: Ledger) -> None:
    ledger.set_owners({"n1": SHARD}, 1)
    uid = new_uid()
    result = ledger.reconcile("n1", ALLOC, {uid: {"cpu": 1000}})
    assert (result.drift, result.bound_pods, result.reservations) == (True, 1, 0)
    assert reserve_one(ledger, leased(ledger, "n1", cpu=3000)) is ReserveCode.OK
    assert reserve_one(ledger, leased(ledger, "n1", cpu=1)) is ReserveCode.INSUFFICIENT


# Arguments, errors and cleanup.


BAD_REQUESTS = {
    "negative": {"cpu": -1},
    "float": {"cpu": 0.5},
    "bool": {"cpu": True},
    "beyond-2**53": {"memory": 2**53 + 1},
    "empty-name": {"": 1},
}


@pytest.mark.parametrize("requests", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_malformed_amounts_are_refused_before_redis(ledger: Ledger, requests: dict) -> None:
    with pytest.raises(ValueError):
        ledger.reserve(SHARD, 1, [ReserveItem("p", "n1", 1, requests)], TTL_MS)
    with pytest.raises(ValueError):
        ledger.upsert_nodes([NodeEntry("n1", requests)])


def test_batches_must_not_repeat_a_pod(ledger: Ledger) -> None:
    with pytest.raises(ValueError, match="more than once"):
        ledger.acquire_leases(["p", "p"], SHARD, TTL_MS)
    with pytest.raises(ValueError, match="more than once"):
        ledger.reserve(SHARD, 1, [ReserveItem("p", "n1", 1, {}), ReserveItem("p", "n2", 1, {})], TTL_MS)
    with pytest.raises(ValueError, match="ttl_ms"):
        ledger.acquire_leases(["p"], SHARD, 0)


def test_empty_batches_do_not_call_redis() -> None:
    offline = Ledger(connect(f"redis://:x@127.0.0.1:{unused_port()}/0", retries=0))
    assert offline.reserve(SHARD, 1, [], TTL_MS) == []
    assert offline.acquire_leases([], SHARD, TTL_MS) == {}
    assert offline.observe([]) == {}
    assert offline.commit([]) == offline.release([]) == offline.forget({}) == {}


def test_unreachable_redis_is_a_temporary_error() -> None:
    offline = Ledger(connect(f"redis://:x@127.0.0.1:{unused_port()}/0", connect_timeout_s=0.2, retries=0))
    for call in (offline.epoch, lambda: offline.acquire_leases(["p"], SHARD, TTL_MS),
                 lambda: offline.observe([BoundPod("p", "n1", {})])):
        with pytest.raises(TemporaryError, match="Redis unavailable") as info:
            call()
        assert isinstance(info.value.__cause__, redis.RedisError)


def test_wrong_password_is_a_permanent_error(redis_server) -> None:
    intruder = Ledger(connect(f"redis://:wrong@127.0.0.1:{redis_server.port}/0", retries=0))
    with pytest.raises(PermanentError):
        intruder.epoch()


def test_flush_deletes_only_its_prefix(redis_client: redis.Redis) -> None:
    tag = new_uid()
    mine, neighbour = Ledger(redis_client, f"{tag}*:"), Ledger(redis_client, f"{tag}x:")
    for ledger in (mine, neighbour):
        add_nodes(ledger, "n1")
        _reserved(ledger)

    assert mine.flush() > 0

    assert list(redis_client.scan_iter(match=f"{tag}[*]*")) == []
    assert neighbour.node_usage("n1").reserved == {"cpu": 500, "pods": 1}
    assert mine.flush() == 0


# Racing callers.


def _batches(seq: list, size: int) -> list[list]:
    return [seq[k:k + size] for k in range(0, len(seq), size)]


def _run_together(*workers) -> None:
    threads = [threading.Thread(target=w) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_race_for_the_last_unit_exactly_one_wins(ledger: Ledger) -> None:
    """Two concurrent batches of the owner shard (a scheduling loop and a retry, say) race for the
    last free unit of a node, round after round; exactly one wins each round."""
    rounds = 150
    add_nodes(ledger, "n1", cpu=1000, pods=100)
    items = {side: [leased(ledger, "n1", cpu=1000) for _ in range(rounds)] for side in "ab"}
    codes: dict[str, list[ReserveCode]] = {"a": [], "b": []}
    seen_reserved_cpu: list[int] = []
    barrier = threading.Barrier(2)

    def racer(side: str) -> None:
        for k in range(rounds):
            barrier.wait()
            codes[side].append(reserve_one(ledger, items[side][k]))
            seen_reserved_cpu.append(ledger.node_usage("n1").reserved.get("cpu", 0))
            barrier.wait()
            if codes[side][k] is ReserveCode.OK:  # hand the unit back for the next round
                ledger.release([items[side][k]])

    _run_together(lambda: racer("a"), lambda: racer("b"))

    for k in range(rounds):
        assert sorted([codes["a"][k], codes["b"][k]]) == [ReserveCode.OK, ReserveCode.INSUFFICIENT], k
    assert max(seen_reserved_cpu) == 1000
    assert ledger.node_usage("n1").reserved == {}


def test_race_for_many_units_never_overcommits(ledger: Ledger) -> None:
    units = 60
    add_nodes(ledger, "n1", cpu=100 * units, pods=1000)
    items = {side: [leased(ledger, "n1", cpu=100) for _ in range(units)] for side in "ab"}
    won = {"a": 0, "b": 0}

    def racer(side: str) -> None:
        for batch in _batches(items[side], 3):
            won[side] += sum(r.ok for r in ledger.reserve(SHARD, 1, batch, TTL_MS))

    _run_together(lambda: racer("a"), lambda: racer("b"))

    assert won["a"] + won["b"] == units
    assert ledger.node_usage("n1").reserved == {"cpu": 100 * units, "pods": units}


def test_race_two_shards_for_the_same_leases(ledger: Ledger) -> None:
    uids = [new_uid() for _ in range(200)]
    granted: dict[str, dict[str, int]] = {SHARD: {}, OTHER: {}}

    def racer(shard: str, order: list[str]) -> None:
        for batch in _batches(order, 10):
            granted[shard].update(ledger.acquire_leases(batch, shard, TTL_MS))

    _run_together(lambda: racer(SHARD, uids), lambda: racer(OTHER, uids[::-1]))

    assert set(granted[SHARD]).isdisjoint(granted[OTHER])
    assert set(granted[SHARD]) | set(granted[OTHER]) == set(uids)
    tokens = list(granted[SHARD].values()) + list(granted[OTHER].values())
    assert len(set(tokens)) == len(uids)


def test_race_during_handover_only_the_current_owner_wins(ledger: Ledger) -> None:
    """Shard a keeps reserving on its node while the coordinator hands the node to shard b: every
    reserve of a that starts after the new map is published is fenced off; b's succeed."""
    add_nodes(ledger, "n1", cpu=10**6, pods=10**6, epoch=1)
    a_started = threading.Event()
    published = threading.Event()
    after_handover: list[ReserveCode] = []
    b_codes: list[ReserveCode] = []

    def old_owner() -> None:
        calls = 0
        while len(after_handover) < 5:
            seen = published.is_set()
            code = reserve_one(ledger, leased(ledger, "n1", SHARD, cpu=1), SHARD, epoch=1)
            calls += 1
            if calls == 10:
                a_started.set()
            if seen:
                after_handover.append(code)

    def coordinator_then_new_owner() -> None:
        a_started.wait()
        ledger.set_owners({"n1": OTHER}, 2)
        published.set()
        b_codes.extend(reserve_one(ledger, leased(ledger, "n1", OTHER, cpu=1), OTHER, epoch=2) for _ in range(20))

    _run_together(old_owner, coordinator_then_new_owner)

    assert after_handover == [ReserveCode.FENCED] * 5
    assert b_codes == [ReserveCode.OK] * 20


def test_binding_marks_count_live_shards_and_expire(ledger: Ledger) -> None:
    """`mark_binding`: one mark per shard (marking again renews it), removed with TTL 0 or when it
    expires (server time), so that a shard that died while binding holds no writer back."""
    assert ledger.binding_count() == 0
    ledger.mark_binding("shard-0@1", 10_000)
    ledger.mark_binding("shard-0@1", 10_000)
    ledger.mark_binding("shard-1@1", 10_000)
    assert ledger.binding_count() == 2
    ledger.mark_binding("shard-0@1", 0)
    assert ledger.binding_count() == 1
    ledger.mark_binding("shard-2@1", 50)
    assert ledger.binding_count() == 2
    time.sleep(0.15)
    assert ledger.binding_count() == 1, "the 50-ms mark expired"
    ledger.mark_binding("shard-1@1", 0)
    assert ledger.binding_count() == 0
    with pytest.raises(ValueError, match="ttl_ms"):
        ledger.mark_binding("shard-0@1", -1)


def test_binding_marks_say_which_shards_bind_a_burst(ledger: Ledger) -> None:
    """`mark_binding(..., burst=True)`: the shard counts in both figures of `binding_marks`;
    marking it again without the burst (its last burst call ended, smaller ones still run) keeps
    it binding but not bursting; TTL 0 removes both marks, and a burst mark expires with its TTL."""
    assert ledger.binding_marks() == (0, 0)
    ledger.mark_binding("shard-0@1", 10_000, burst=True)
    ledger.mark_binding("shard-1@1", 10_000)
    assert ledger.binding_marks() == (2, 1)
    ledger.mark_binding("shard-0@1", 10_000, burst=False)
    assert ledger.binding_marks() == (2, 0)
    ledger.mark_binding("shard-1@1", 10_000, burst=True)
    ledger.mark_binding("shard-1@1", 0)
    assert ledger.binding_marks() == (1, 0)
    ledger.mark_binding("shard-2@1", 50, burst=True)
    assert ledger.binding_marks() == (2, 1)
    time.sleep(0.15)
    assert ledger.binding_marks() == (1, 0), "the 50-ms burst mark expired"
    ledger.mark_binding("shard-0@1", 0)
    assert ledger.binding_marks() == (0, 0) and ledger.binding_count() == 0


def test_every_ledger_call_says_redis_is_away_as_a_temporary_error() -> None:
    """Redis not listening: the binds-in-flight marks and `flush` raise TemporaryError (retry
    later), like every other ledger call, never redis-py's own exceptions."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    away = Ledger(redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.5, socket_timeout=0.5,
                              retry=Retry(NoBackoff(), 0)), "away:")
    for call in (lambda: away.mark_binding("shard-0@1", 1000), away.binding_count, away.flush):
        with pytest.raises(TemporaryError, match="Redis unavailable"):
            call()


def test_a_volume_is_reserved_for_one_pod_at_a_time(ledger):
    """reserve_volumes is all or none: a pod holding a PV refuses another pod every key of the
    call (nothing of it is taken), its own retry renews; release gives up only its own keys, and a
    reservation expires by its TTL (server time)."""
    assert ledger.reserve_volumes("pod-a", ["pv/pv-1", "pvc/default/a"], 10_000) is None
    assert ledger.reserve_volumes("pod-b", ["pvc/default/b", "pv/pv-1"], 10_000) == "pv/pv-1"
    assert ledger.reserve_volumes("pod-b", ["pvc/default/b"], 10_000) is None  # its claim was not taken before
    assert ledger.reserve_volumes("pod-a", ["pv/pv-1", "pvc/default/a"], 10_000) is None
    assert ledger.release_volumes("pod-b", ["pv/pv-1", "pvc/default/b"]) == 1
    assert ledger.release_volumes("pod-a", ["pv/pv-1", "pvc/default/a"]) == 2
    assert ledger.release_volumes("pod-a", ["pv/pv-1"]) == 0
    assert ledger.reserve_volumes("pod-c", ["pv/pv-2"], 50) is None
    time.sleep(0.1)
    assert ledger.reserve_volumes("pod-d", ["pv/pv-2"], 10_000) is None
    with pytest.raises(ValueError):
        ledger.reserve_volumes("pod-d", ["pv/pv-3"], 0)
