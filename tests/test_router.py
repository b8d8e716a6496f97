"""The coordinator's router: routing a chunk of pods of one signature at once (`choose_many`) gives
what routing them pod by pod (`choose`) gives."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from shardsched.sharding.coordinator.router import Room, choose, choose_many


def state_of(alive: list[bool], routed: list[int]) -> SimpleNamespace:
    return SimpleNamespace(shards=[SimpleNamespace(alive=a) for a in alive], routed=np.array(routed, np.int64))


def one_by_one(state, room: Room, static: np.ndarray, m: int) -> list[int]:
    out = []
    for _ in range(m):
        target = choose(state, room, static)
        if target is None:
            target = int(np.argmax(static)) if static.any() else 0
        state.routed[target] += 1
        out.append(target)
    return out


def random_room(rng: np.random.Generator, k: int, packing: bool) -> Room:
    sizes = rng.integers(0, 40, k)
    shares = [np.round(rng.uniform(0.001, 1.0, n), 2) for n in sizes]  # rounded: ties happen
    holds = [rng.integers(1, 6, n) for n in sizes] if packing else None
    return Room(shares, float(rng.choice([0.01, 0.05, 0.125])), holds)


@pytest.mark.parametrize("packing", [False, True], ids=["spreading", "packing"])
@pytest.mark.parametrize("seed", range(8))
def test_a_chunk_goes_where_pod_by_pod_routing_sends_it(seed, packing):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 6))
    room = random_room(rng, k, packing)
    static = rng.integers(0, 50, k)
    alive = [bool(a) for a in rng.random(k) > 0.2]
    routed = [int(r) for r in rng.integers(0, 30, k)]
    m = int(rng.integers(1, 400))

    a, b = state_of(alive, routed), state_of(alive, routed)
    assert choose_many(a, room, static, m).tolist() == one_by_one(b, room, static, m)
    assert a.routed.tolist() == b.routed.tolist()


def test_pods_that_fit_nowhere_go_to_the_shard_with_most_matching_nodes():
    room = Room([np.array([]), np.array([])], 0.1)
    state = state_of([True, True], [0, 0])
    assert choose_many(state, room, np.array([3, 7]), 4).tolist() == [1, 1, 1, 1]
    assert state.routed.tolist() == [0, 4]


def test_a_burst_spreads_over_the_shards_in_proportion_to_their_free_room():
    # shard 0: 100 empty nodes, shard 1: 100 half-full ones; 1,000 pods of a twentieth of a node
    room = Room([np.ones(100), np.full(100, 0.5)], 0.05)
    state = state_of([True, True], [0, 0])
    out = choose_many(state, room, np.array([100, 100]), 1000)
    # water filling: shard 0 first takes its nodes down to 0.5 (1,000 pods' worth) ...
    assert (out[:1000] == 0).all()
    out = choose_many(state, room, np.array([100, 100]), 200)
    # ... then both shards are at the same level and share the next pods equally
    assert abs(int((out == 0).sum()) - 100) <= 1
