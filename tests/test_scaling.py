"""Horizontal shard scaling: `Coordinator.scale` (add or remove shards during a run), the autoscaler
policy, ``shardsched run --scale-at`` and ``shardsched scale``.

Without Ray (plain coordinator and shards over a real Redis ledger and `SimCluster`, stepped by the
test, as in test_coordinator.py): the handover fences a stale owner off and loses no pod; with the
session's Ray: a run scaled 1 -> 4 -> 2 shards mid-burst keeps every invariant, the autoscaler
reacts to a burst and settles, and the CLI finds the running coordinator by its name.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter

import pytest

from shardsched.sharding.coordinator import LIMBO
from shardsched.sharding.hashing import assign, moved_fraction
from shardsched.sharding.embedded import EmbeddedRun
from shardsched.sharding.run_control import RunOptions
from shardsched.sharding.run_report import scale_phases
from shardsched.sharding.scaling import Autoscaler, AutoscalerOptions, Load, ideal_moved_fraction
from shardsched.sim import uniform_nodes, uniform_pods
from shardsched.store import ReserveCode, ReserveItem
from test_coordinator import World
from test_runtime import CONFIG, SCHEDULER, Deployment, assert_invariants

CLI = [sys.executable, "-m", "shardsched.cli.main"]
HEAVY = os.environ.get("SHARDSCHED_HEAVY") == "1"


# ------------------------------------------------------------------------------ the policy (pure)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def load(shards: int, pending: int, latency_s: float | None = None) -> Load:
    return Load(shards, pending, latency_s)


OPTS = AutoscalerOptions(min_shards=1, max_shards=6, target_pending_per_shard=1000, target_latency_s=5.0,
                         cooldown_s=10.0, scale_down_delay_s=30.0)


@pytest.mark.parametrize("current, pending, latency, expected", [
    (1, 0, None, 1),            # idle: the minimum
    (1, 999, None, 1),
    (1, 1001, None, 2),         # ceil(pending / target)
    (2, 4500, None, 5),
    (2, 50_000, None, 6),       # at most max_shards
    (2, 100, 6.0, 3),           # slow while pods wait: one more
    (6, 100, 6.0, 6),
    (2, 0, 6.0, 1),             # slow but nothing waits: latency alone does not hold shards
], ids=["idle", "under-target", "over-target", "ceil", "max", "latency", "latency-at-max", "latency-idle"])
def test_the_autoscaler_recommends_from_pending_pods_and_latency(current, pending, latency, expected):
    assert Autoscaler(OPTS, FakeClock()).recommend(load(current, pending, latency)) == expected


def test_the_autoscaler_scales_up_at_once_down_after_the_window_and_waits_out_its_cooldown():
    clock = FakeClock()
    a = Autoscaler(OPTS, clock)

    assert a.decide(load(1, 3500)) == 4  # up at once, even right after the start
    a.changed()
    clock.now = 5.0
    assert a.decide(load(4, 9000)) is None  # cool-down
    clock.now = 11.0
    assert a.decide(load(4, 9000)) == 6
    a.changed()
    for t in range(12, 42):  # the burst is gone: recommendations of 1
        clock.now = float(t)
        assert a.decide(load(6, 0)) is None, t  # 6 was recommended at t=11, within the last 30 s
    clock.now = 42.0
    assert a.decide(load(6, 0)) == 1
    a.changed()
    clock.now = 60.0
    assert a.decide(load(1, 0)) is None  # settled


def test_the_autoscaler_scales_down_only_to_the_highest_recommendation_of_the_window():
    clock = FakeClock()
    a = Autoscaler(OPTS, clock)
    assert a.decide(load(4, 2500)) is None  # recommends 3 at t=0, but the window is not observed yet
    clock.now = 20.0
    assert a.decide(load(4, 0)) is None  # recommends 1
    clock.now = 30.0
    assert a.decide(load(4, 0)) == 3  # the highest of the last 30 s, not 1


def test_the_autoscaler_corrects_a_count_outside_its_bounds_at_once():
    a = Autoscaler(OPTS, FakeClock())
    a.changed()
    assert a.decide(load(9, 0)) == 6
    assert Autoscaler(AutoscalerOptions(min_shards=2, max_shards=4), FakeClock()).decide(load(1, 0)) == 2


@pytest.mark.parametrize("kwargs", [dict(min_shards=0), dict(min_shards=3, max_shards=2), dict(target_pending_per_shard=0),
                                    dict(period_s=0), dict(cooldown_s=-1)],
                         ids=["min", "max<min", "target", "period", "cooldown"])
def test_autoscaler_options_are_validated(kwargs):
    with pytest.raises(ValueError):
        AutoscalerOptions(**kwargs)


def test_load_of_shard_snapshots_counts_waiting_pods_not_unschedulable_ones():
    snaps = [{"pending": {"active": 10, "backoff": 2, "unschedulable": 50}, "in_flight": 3, "latency_p90_s": 0.5},
             {"pending": {"active": 5, "backoff": 0, "unschedulable": 0}, "in_flight": 0, "latency_p90_s": 2.0},
             {"pending": {}, "in_flight": 0, "latency_p90_s": None}]
    assert Load.of(3, snaps) == Load(3, 20, 2.0)


@pytest.mark.parametrize("before, after, share, expected", [(1, 4, 0.0, 0.75), (2, 3, 0.0, 1 / 3), (4, 2, 0.52, 0.52)],
                         ids=["1-4", "2-3", "4-2"])
def test_ideal_moved_fraction(before, after, share, expected):
    assert ideal_moved_fraction(before, after, share) == pytest.approx(expected)


def test_rendezvous_hashing_moves_about_the_ideal_share_of_nodes():
    nodes = [f"node-{i:05d}" for i in range(2000)]
    one, four, two = (assign(nodes, [f"shard-{i}" for i in range(n)]) for n in (1, 4, 2))
    assert {four[n] for n in nodes if four[n] != one[n]} == {"shard-1", "shard-2", "shard-3"}
    # the kept shards keep theirs, but for the few the load bound moves between them (2 of 1,000 here)
    kept = [n for n in nodes if four[n] in ("shard-0", "shard-1")]
    assert sum(two[n] != four[n] for n in kept) <= 0.01 * len(kept)
    assert abs(sum(four[n] != one[n] for n in nodes) / len(nodes) - 0.75) < 0.01
    assert abs(moved_fraction(two, four) - 0.5) < 0.01


@pytest.mark.parametrize("count, shards", [(50, 2), (50, 8), (7, 3), (2000, 5)])
def test_rendezvous_hashing_with_bounded_loads_splits_the_nodes_evenly(count, shards):
    """Plain rendezvous hashing splits these 50 nodes 31/19 over 2 shards; no shard may own more
    than its share rounded up."""
    nodes = [f"node-{i:05d}" for i in range(count)]
    ids = [f"shard-{i}" for i in range(shards)]
    owners = assign(list(reversed(nodes)), ids)
    assert owners == assign(nodes, ids)  # independent of the order
    loads = Counter(owners.values())
    assert sorted(owners) == nodes and set(loads) == set(ids)
    assert max(loads.values()) == -(-count // shards)


def test_rendezvous_hashing_refuses_a_shard_id_given_twice():
    with pytest.raises(ValueError, match="distinct"):
        assign(["a", "b", "c"], ["shard-0", "shard-0"])


def test_nodes_joining_go_to_the_shards_below_their_share():
    ids = ["shard-0", "shard-1", "shard-2"]
    new = Counter(assign([f"node-{i}" for i in range(6)], ids, owned={"shard-0": 6, "shard-1": 2}).values())
    # 14 nodes: at most 5 each, so shard-0 (over its share already) gets none
    assert new["shard-0"] == 0 and new["shard-1"] <= 3 and new["shard-2"] <= 5 and new.total() == 6


def test_scale_phases_measure_throughput_around_each_step():
    t0 = 1000.0
    steps = [{"started_unix_s": t0 + 2.0, "start_s": 0.5, "handover_s": 0.5},
             {"started_unix_s": t0 + 6.0, "start_s": 0.0, "handover_s": 0.2}]
    timeline = [(t0 + i * 0.1, 10) for i in range(100)]  # 100 pods/s for 10 s

    a, b = scale_phases(steps, timeline, t0, t0 + 10.0)

    assert a["at_s"] == 2.0 and b["at_s"] == 6.0
    assert a["throughput_before_pods_per_s"] == a["throughput_during_pods_per_s"] == a["throughput_after_pods_per_s"] == 100.0
    assert b["throughput_before_pods_per_s"] == a["throughput_after_pods_per_s"]  # the same window
    assert b["throughput_after_pods_per_s"] == 100.0


@pytest.mark.parametrize("n, text", [(1, "already 1 shard: nothing to do"), (3, "already 3 shards: nothing to do")],
                         ids=["one", "three"])
def test_a_step_to_the_current_count_is_described_in_good_grammar(n, text):
    from shardsched.cli.scale import describe

    assert describe({"from_shards": n, "to_shards": n}) == text


def test_shardsched_scale_says_in_its_own_words_when_the_ray_address_does_not_answer():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run(CLI + ["scale", "--ray-address", f"127.0.0.1:{port}"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    assert proc.stderr == f"error: --ray-address 127.0.0.1:{port}: no Ray head answers there (Connection refused)\n"


# ----------------------------------------------------------------------- handover on plain objects


def test_a_stale_owner_is_fenced_off_and_its_batch_comes_back_through_the_rebalancer(ledger):
    """Shard 0 (the only one) has placed a batch and is about to reserve it when the coordinator
    scales to 4: the ledger already names the new owners under a new epoch, so the whole batch is
    refused FENCED and comes back through the rebalancer; a stale owner that has heard of the new
    epoch is still refused on the nodes it lost. Every pod then ends bound, once, nowhere overcommitted."""
    world = World(ledger, n_nodes=40, shards=1)
    world.create(60)
    world.coordinator.poll_watch()
    old = world.shards[0]
    real_reserve = ledger.reserve
    seen: dict = {}

    def reserve_after_the_handover(shard, epoch, items, ttl_ms):
        if not seen:
            seen["step"] = world.coordinator.scale(4)
            seen["results"] = real_reserve(shard, epoch, items, ttl_ms)
            return seen["results"]
        return real_reserve(shard, epoch, items, ttl_ms)

    ledger.reserve = reserve_after_the_handover
    old.step()
    step, results = seen["step"], seen["results"]

    owners = ledger.owners()
    moved = {n for n, m in owners.items() if m != old.member}
    assert step.from_shards == 1 and step.to_shards == 4 and step.epoch == ledger.epoch() == old.epoch
    assert step.nodes_moved == len(moved) and step.moved_fraction == len(moved) / 40
    assert step.ideal_fraction == 0.75 and abs(step.moved_fraction - 0.75) < 0.25
    assert results and all(r.code == ReserveCode.FENCED for r in results)  # planned under the old epoch
    assert any(r.node in moved for r in results)
    assert world.coordinator.state.counters["requeues"] == 0  # handed off, not yet rebalanced
    assert old.table.num_nodes == 40 - len(moved) and all(world.shards[i].table.num_nodes for i in (1, 2, 3))

    # A stale owner that knows the new epoch but not the new map: refused on a node it lost.
    uid = "stale-probe"
    token = ledger.acquire_leases([uid], old.member, 10_000)[uid]
    lost, kept = sorted(moved)[0], sorted(set(owners) - moved)[0]
    probe = [ReserveItem(uid, lost, token, {"cpu": 100})]
    assert ledger.reserve(old.member, ledger.epoch(), probe, 10_000)[0].code == ReserveCode.FENCED
    probe = [ReserveItem(uid, kept, token, {"cpu": 100})]
    assert ledger.reserve(old.member, ledger.epoch(), probe, 10_000)[0].code == ReserveCode.OK
    ledger.release(probe)
    ledger.release_leases({uid: token}, old.member)

    world.settle()
    inv = world.cluster.invariants()
    assert world.coordinator.state.counters["requeues"] >= len(results)
    assert inv["pods_bound"] == 60 and inv["double_binds"] == 0 and inv["admission_rejections"] == 0
    assert inv["overcommitted_nodes"] == [] and world.coordinator.status()["pending"] == 0
    assert {world.cluster.get_pod("default", f"pod-{i:05d}")["spec"]["nodeName"] for i in range(60)} & moved


def test_removing_shards_drains_their_queues_to_the_others(ledger):
    world = World(ledger, n_nodes=40, shards=4)
    world.create(80)
    world.coordinator.poll_watch()  # routed over 4 shards, none scheduled yet
    queued = {i: set(world.shards[i].pending_keys()) for i in range(4)}
    assert all(queued.values())
    removed = [world.shards[2], world.shards[3]]

    step = world.coordinator.scale(2)

    assert (step.from_shards, step.to_shards) == (2 + 2, 2)
    assert step.pods_rerouted == len(queued[2] | queued[3]) and step.pods_in_flight == 0
    assert step.removed_share == step.ideal_fraction == 0.5
    # the removed shards' nodes, and at most one more moved between the kept ones by the load bound
    assert step.nodes_moved in (20, 21) and step.moved_fraction == step.nodes_moved / 40
    assert not any(s.pending_keys() for s in removed) and all(s._stop.is_set() for s in removed)
    assert set(world.shards[0].pending_keys()) | set(world.shards[1].pending_keys()) == set().union(*queued.values())
    assert len(world.coordinator.state.shards) == 2 and set(ledger.owners().values()) == {
        world.shards[0].member, world.shards[1].member}
    world.settle()
    inv = world.cluster.invariants()
    assert inv["pods_bound"] == 80 and inv["double_binds"] == 0 and inv["overcommitted_nodes"] == []


def test_pods_of_a_removed_shard_whose_fate_never_arrives_are_routed_again_after_the_grace(ledger):
    """A removed shard's last batch (here: popped and then lost with the shard) is neither queued
    nor handed back: the coordinator keeps those pods in limbo and routes them again after
    `handover_grace_s`."""
    world = World(ledger, n_nodes=20, shards=2)
    world.create(30)
    world.coordinator.poll_watch()
    lost = world.shards[1].queue.pop_batch(1000)  # in flight when the shard goes away
    world.coordinator.scaler.handover_grace_s = 0.0

    step = world.coordinator.scale(1)

    assert step.pods_in_flight == len(lost) > 0 and step.pods_rerouted == 0
    assert all(world.coordinator.state.pending[q.pod_info.uid].shard == LIMBO for q in lost)
    del world.shards[1]  # gone, with its batch
    world.settle()
    assert world.coordinator.state.counters["limbo_rerouted"] == len(lost)
    assert world.cluster.invariants()["pods_bound"] == 30


def test_a_shard_index_removed_and_added_again_gets_a_new_member(ledger):
    world = World(ledger, n_nodes=10, shards=2)
    world.coordinator.scale(1)
    world.coordinator.scale(3)
    assert [s.member for s in world.coordinator.state.shards] == ["shard-0@1", "shard-1@2", "shard-2@1"]
    assert world.coordinator.scale(3).nodes_moved == 0 and len(world.coordinator.scaler.scale_steps) == 2


# -------------------------------------------------------------------------------------- with Ray


@pytest.fixture
def _ray(ray_session):
    yield
    assert ray_session.is_initialized()


@pytest.mark.heavy
def test_a_run_scaled_1_4_2_mid_burst_keeps_every_invariant(redis_server, _ray):
    """Pods arrive steadily (with SHARDSCHED_HEAVY=1 25,000 over 10 s, 2,500/s, about what one
    shard binds here; else 8,000 over 20 s, so that a loaded machine keeps up with the arrivals);
    at 2 s the run goes to 4 shards, at 7.5 s back to 2, both while pods still arrive (the second
    step waits for the first, whose three new shard actors can take 8 s to start on an idle
    machine and longer on a loaded one: the short form's arrivals outlast that). No pod is lost or bound twice, no
    node overcommitted; the nodes moved at each step are close to the ideal (growth: 1 - 1/4;
    shrinking: exactly the removed shards' share, about 1 - 2/4); the throughput before, during
    and after each step is reported."""
    n, span_s, nodes = (25_000, 10.0, 1200) if HEAVY else (8_000, 20.0, 1200)
    pods = uniform_pods(n, cpu="250m", memory="256Mi", scheduler_name=SCHEDULER)
    workload = [(span_s * i / n, None, p) for i, p in enumerate(pods)]
    options = RunOptions(shards=1, redis_url=redis_server.url, timeout_s=90.0, scale_at=[(2.0, 4), (7.5, 2)],
                         coordinator_name=None)
    report = EmbeddedRun(CONFIG, uniform_nodes(nodes), workload, options).run()
    data = report.to_json()
    print(json.dumps(data["scaling"], indent=1))

    assert_invariants(data)
    assert data["pods_bound"] == n and data["pods_pending"] == data["pods_unschedulable"] == 0
    grow, shrink = data["scaling"]
    assert (grow["from_shards"], grow["to_shards"], shrink["from_shards"], shrink["to_shards"]) == (1, 4, 4, 2)
    assert grow["nodes"] == shrink["nodes"] == nodes and shrink["epoch"] > grow["epoch"]
    assert (data["shards"], data["shards_at_end"]) == (1, 2)
    assert grow["ideal_fraction"] == 0.75 and abs(grow["moved_fraction"] - 0.75) < 0.05
    assert shrink["removed_share"] == shrink["ideal_fraction"]
    assert 0 <= shrink["moved_fraction"] - shrink["removed_share"] <= 0.02  # the load bound's few
    assert abs(shrink["moved_fraction"] - 0.5) < 0.1
    assert grow["at_s"] >= 2.0 and shrink["at_s"] >= 7.5
    assert grow["throughput_before_pods_per_s"] > 0
    for step in (grow, shrink):
        assert step["throughput_during_pods_per_s"] > 0
        assert {"throughput_before_pods_per_s", "throughput_after_pods_per_s"} <= set(step)
    assert len(report.latencies_s) == n  # the removed shards' numbers are in the report too
    assert {"shard-1", "shard-2", "shard-3"} <= set(data["cpu_s_by_process"])


def test_the_autoscaler_reacts_to_a_burst_and_settles(redis_server, _ray):
    """A burst of 6,000 pods on one shard: the autoscaler adds shards within a few periods, every
    pod is bound, then it goes back to the minimum after its scale-down window and stays there."""
    autoscaler = AutoscalerOptions(min_shards=1, max_shards=3, target_pending_per_shard=500, cooldown_s=1.0,
                                   scale_down_delay_s=3.0, period_s=0.25)
    with Deployment(redis_server.url, uniform_nodes(400), shards=1, autoscaler=autoscaler) as d:
        d.create(uniform_pods(6000, cpu="500m", scheduler_name=SCHEDULER))
        peak = 1
        deadline = time.monotonic() + 60
        while True:
            status = d.ask(d.coordinator.status)
            peak = max(peak, status["shards"])
            if status["pending"] == 0 and peak > 1 and status["shards"] == 1:
                break
            assert time.monotonic() < deadline, status
            time.sleep(0.1)
        time.sleep(2.0)  # settled: no more steps
        history = d.ask(d.coordinator.scale_history)
        final = d.ask(d.coordinator.status)
        inv = d.ask(d.cluster.invariants)

    assert peak > 1 and final["shards"] == 1 and final["scale_steps"] == len(history)
    assert history[0]["from_shards"] == 1 and history[0]["to_shards"] > 1
    assert history[-1]["to_shards"] == 1 and all(s["trigger"] == "autoscaler" for s in history)
    assert len(history) <= 4  # up (maybe twice), down: no flapping
    assert inv["pods_bound"] == 6000 and inv["double_binds"] == 0 and inv["overcommitted_nodes"] == []
    assert inv["admission_rejections"] == 0


def test_shardsched_scale_finds_the_named_coordinator_and_scales_it(redis_server, ray_session, _ray):
    """``shardsched scale`` in another process joins the session's Ray (by its address: ``auto``
    would pick the newest Ray on the machine, maybe another one's), finds the coordinator by its
    name in the ``shardsched`` namespace and asks it for 3 shards."""
    name = f"shardsched-test-{uuid.uuid4().hex[:6]}"
    join = ["--ray-address", ray_session.get_runtime_context().gcs_address]
    with Deployment(redis_server.url, uniform_nodes(30), shards=1, name=name) as d:
        proc = subprocess.run(CLI + ["scale", "--shards", "3", "--name", name, "-o", "json"] + join,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        step = json.loads(proc.stdout)
        status = d.ask(d.coordinator.status)
        shown = subprocess.run(CLI + ["scale", "--name", name] + join, capture_output=True, text=True, timeout=120)
        missing = subprocess.run(CLI + ["scale", "--shards", "2", "--name", name + "-nope"] + join,
                                 capture_output=True, text=True, timeout=120)

    assert (step["from_shards"], step["to_shards"], step["nodes"]) == (1, 3, 30)
    assert status["shards"] == 3 and status["scale_steps"] == 1
    assert shown.returncode == 0 and shown.stdout.startswith("3 shards (epoch ") and "shards 1 -> 3 (api" in shown.stdout
    assert missing.returncode == 1 and "no coordinator named" in missing.stderr
