"""gang_reserve.lua (`Ledger.reserve_gang`): a gang held on its nodes across shards all or nothing,
one case per return code and per check order, on a real Redis; and how the held room keeps other
pods out (`Ledger.reserve` counts it) until the members are released."""

from __future__ import annotations

import itertools

import pytest

from shardsched.store import GangCode, GangMember, Ledger, NodeEntry, ReserveCode, ReserveItem

A, B = "shard-a@1", "shard-b@1"
ALLOC = {"cpu": 4000, "memory": 8 * 2**30, "pods": 10}
TTL_MS = 10_000
_uids = itertools.count()


def uid() -> str:
    return f"gang-{next(_uids)}"


@pytest.fixture
def two_shards(ledger: Ledger) -> Ledger:
    """n1 owned by shard a, n2 by shard b, epoch 1."""
    ledger.upsert_nodes([NodeEntry("n1", ALLOC), NodeEntry("n2", ALLOC)])
    ledger.set_owners({"n1": A, "n2": B}, 1)
    return ledger


def member(node: str, shard: str, cpu: int = 1000, priority: int = 0) -> GangMember:
    return GangMember(uid(), node, shard, {"cpu": cpu}, priority)


def test_a_gang_across_two_shards_is_held_whole(two_shards: Ledger) -> None:
    gang = [member("n1", A, 2000), member("n1", A, 2000), member("n2", B, 3000)]
    res = two_shards.reserve_gang(1, gang, TTL_MS)
    assert res.ok and (res.uid, res.detail) == ("", "")
    assert set(two_shards.nominations("n1")) == {gang[0].uid, gang[1].uid}
    assert set(two_shards.nominations("n2")) == {gang[2].uid}


def refused(ledger: Ledger, gang: list[GangMember], epoch: int = 1) -> tuple[GangCode, str, str]:
    before = (ledger.nominations("n1"), ledger.nominations("n2"))
    res = ledger.reserve_gang(epoch, gang, TTL_MS)
    assert (ledger.nominations("n1"), ledger.nominations("n2")) == before, "a refused gang writes nothing"
    return res.code, gang.index(next(m for m in gang if m.uid == res.uid)), res.detail


def test_insufficient_counts_the_members_before_it_on_the_node(two_shards: Ledger) -> None:
    gang = [member("n2", B, 1000), member("n1", A, 3000), member("n1", A, 2000)]
    assert refused(two_shards, gang) == (GangCode.INSUFFICIENT, 2, "cpu")


def test_stale_epoch_or_wrong_owner_is_fenced(two_shards: Ledger) -> None:
    assert refused(two_shards, [member("n1", A)], epoch=0)[:2] == (GangCode.FENCED, 0)
    assert refused(two_shards, [member("n1", A), member("n2", A)])[:2] == (GangCode.FENCED, 1)


def test_a_member_a_shard_is_scheduling_is_refused(two_shards: Ledger) -> None:
    gang = [member("n1", A), member("n2", B)]
    two_shards.acquire_leases([gang[1].uid], B, TTL_MS)
    assert refused(two_shards, gang) == (GangCode.LEASE_HELD, 1, B)


def test_an_unknown_node_is_refused(two_shards: Ledger) -> None:
    two_shards.set_owners({"n3": B}, 1)
    assert refused(two_shards, [member("n1", A), member("n3", B)])[:2] == (GangCode.NODE_UNKNOWN, 1)


def test_check_order_fenced_before_lease_before_room(two_shards: Ledger) -> None:
    m = member("n1", A, 9000)
    two_shards.acquire_leases([m.uid], A, TTL_MS)
    assert refused(two_shards, [m], epoch=2)[0] == GangCode.FENCED
    assert refused(two_shards, [m])[0] == GangCode.LEASE_HELD


def test_held_room_keeps_other_pods_out_until_released(two_shards: Ledger) -> None:
    gang = [member("n1", A, 3000), member("n2", B, 3000)]
    assert two_shards.reserve_gang(1, gang, TTL_MS).ok
    other = uid()
    token = two_shards.acquire_leases([other], A, TTL_MS)[other]
    [res] = two_shards.reserve(A, 1, [ReserveItem(other, "n1", token, {"cpu": 2000})], TTL_MS)
    assert res.code == ReserveCode.INSUFFICIENT  # 3000 held + 2000 > 4000
    # the member itself reserves through its own hold
    mine = gang[0]
    token = two_shards.acquire_leases([mine.uid], A, TTL_MS)[mine.uid]
    [res] = two_shards.reserve(A, 1, [ReserveItem(mine.uid, "n1", token, mine.requests)], TTL_MS)
    assert res.code == ReserveCode.OK
    two_shards.unnominate({m.uid: m.node for m in gang})
    assert not two_shards.nominations("n1")


def test_other_gangs_holds_count_by_priority(two_shards: Ledger) -> None:
    assert two_shards.reserve_gang(1, [member("n1", A, 3000, priority=10)], TTL_MS).ok
    assert refused(two_shards, [member("n1", A, 2000, priority=10)])[0] == GangCode.INSUFFICIENT
    # a higher-priority gang does not yield to a lower one's hold (upstream: lower nominations
    # do not count against a pod)
    assert two_shards.reserve_gang(1, [member("n1", A, 2000, priority=20)], TTL_MS).ok


def test_an_empty_gang_is_a_caller_bug(two_shards: Ledger) -> None:
    with pytest.raises(ValueError):
        two_shards.reserve_gang(1, [], TTL_MS)


def test_gangs_in_one_call_are_each_all_or_nothing_and_count_the_ones_held_before(two_shards: Ledger) -> None:
    """One call, three gangs: the first is held, the second does not fit beside the first (its
    hold counts, as a nomination of equal priority would) and writes nothing, the third fits in
    what the second left and is held: one refusal does not stop the gangs after it."""
    first = [member("n1", A, 2000), member("n2", B, 2000)]
    second = [member("n2", B, 1000), member("n1", A, 3000)]
    third = [member("n1", A, 2000), member("n2", B, 2000)]
    results = two_shards.reserve_gangs(1, [first, second, third], TTL_MS)
    assert [r.code for r in results] == [GangCode.OK, GangCode.INSUFFICIENT, GangCode.OK]
    assert (results[1].uid, results[1].detail) == (second[1].uid, "cpu")
    assert set(two_shards.nominations("n1")) == {first[0].uid, third[0].uid}
    assert set(two_shards.nominations("n2")) == {first[1].uid, third[1].uid}
    # every code comes back per gang, in order
    fenced, held = [member("n1", B)], [member("n2", B, 0)]
    assert [r.code for r in two_shards.reserve_gangs(1, [fenced, held], TTL_MS)] == [GangCode.FENCED, GangCode.OK]


def test_a_gang_held_again_in_one_call_replaces_its_own_holds(two_shards: Ledger) -> None:
    """A gang held again (moved within a node) does not count its own earlier holds, and the gang
    after it counts only the new ones."""
    gang = [member("n1", A, 3000)]
    assert two_shards.reserve_gang(1, gang, TTL_MS).ok
    again = [GangMember(gang[0].uid, "n1", A, {"cpu": 3000})]
    other = [member("n1", A, 1000)]
    assert [r.code for r in two_shards.reserve_gangs(1, [again, other], TTL_MS)] == [GangCode.OK, GangCode.OK]
    assert set(two_shards.nominations("n1")) == {gang[0].uid, other[0].uid}
    assert [r.code for r in two_shards.reserve_gangs(1, [[member("n1", A, 1)]], TTL_MS)] == [GangCode.INSUFFICIENT]


def test_a_uid_in_two_gangs_or_no_gang_is_a_caller_bug(two_shards: Ledger) -> None:
    m = member("n1", A)
    with pytest.raises(ValueError):
        two_shards.reserve_gangs(1, [[m], [m]], TTL_MS)
    with pytest.raises(ValueError):
        two_shards.reserve_gangs(1, [], TTL_MS)
    with pytest.raises(ValueError):
        two_shards.reserve_gangs(1, [[m], []], TTL_MS)
