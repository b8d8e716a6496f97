"""The chaos suite: scenario files and their validation, then the short version of every scenario
run on the session's Ray (and Redis, unless the scenario restarts Redis or wants AOF: then the
runner starts its own), judged by the verdict: every invariant of docs/design.md holds, a killed shard's
pods are bound within lease TTL + 5 s, and the faults really happened (``exercised``).

The long versions are run by hand (``python -m chaos run NAME``) and recorded in docs/chaos.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from chaos.runner import ChaosRun
from chaos.scenario import INVARIANTS, SCENARIO_DIR, ScenarioError, list_scenarios, load_scenario, parse_scenario
from chaos.verdict import _recovery

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))
REQUIRED = {"shard-kill", "coordinator-kill", "redis-restart", "redis-restart-aof", "redis-latency", "redis-partition",
            "stale-owner", "rival-scheduler", "bind-errors", "churn"}
VERDICT_KEYS = {"ok", "violations", "overcommitted_nodes", "double_binds", "stale_token_binds", "lost_pods",
                "recovery_s", "pods_per_s", "metrics", "faults", "shard_kills", "ledger", "exercised"}
MINIMAL = {"name": "t", "duration_s": 10, "cluster": {"nodes": 2}, "workload": {"pods": 1}}


# ------------------------------------------------------------------------------------- scenarios


def test_every_required_scenario_exists_and_loads_long_and_short():
    assert REQUIRED <= set(SCENARIOS)
    for name in SCENARIOS:
        long, short = load_scenario(name), load_scenario(name, short=True)
        assert long.name == short.name == name
        assert long.faults and short.faults and short.exercised, name
        assert short.cluster.nodes <= long.cluster.nodes and short.workload.pods <= long.workload.pods
    assert [s.name for s in list_scenarios()] == SCENARIOS


@pytest.mark.parametrize("change, path, message", [
    ({"faults": [{"at_s": 1, "action": "redis-latency", "args": {"for_s": 1}}], "redis": {"proxy": True}},
     "faults[0].args.latency_ms", "required"),
    ({"faults": [{"at_s": 1, "action": "kill-shard", "args": {"idx": 0}}]}, "faults[0].args.idx", "unknown field"),
    ({"faults": [{"at_s": 1, "action": "explode"}]}, "faults[0].action", "must be one of"),
    ({"faults": [{"at_s": -1, "action": "kill-shard"}]}, "faults[0].at_s", "greater than or equal to 0"),
    ({"faults": [{"at_s": 1, "action": "kill-shard", "count": 3}]}, "faults[0]", "count > 1 needs every_s"),
    ({"faults": [{"at_s": 1, "action": "partition-redis", "args": {"for_s": 1}}]}, "(document)", "needs redis.proxy"),
    ({"cluster": {"nodes": 0}}, "cluster.nodes", "greater than 0"),
    ({"binds": {"error_rate": 0.6, "timeout_rate": 0.6}}, "binds", "must be <= 1"),
    ({"invariants": ["no_overcommit", "no_free_lunch"]}, "invariants[1]", "must be one of"),
    ({"workload": {"pods": 1, "arrival_rate": 5}}, "workload.arrival_rate", "unknown field"),
    ({"workload": {"pods": 1, "zone_spread_max_skew": 1}}, "(document)", "needs cluster.zones"),
    ({"preemption": {"bound_within_s": 5}}, "(document)", "needs replica_sets"),
    ({"preemption": {"bound_within_s": 5}, "replica_sets": {"replicas": 2, "priority": 5},
      "workload": {"pods": 1, "priority": 5}}, "(document)", "workload.priority above"),
], ids=["missing-arg", "unknown-arg", "unknown-action", "negative-time", "repeat-without-period",
        "proxy-needed", "no-nodes", "rates-above-1", "unknown-invariant", "unknown-field", "spread-without-zones",
        "preemption-without-sets", "preemptors-not-higher"])
def test_validation_errors_name_the_field(change, path, message):
    with pytest.raises(ScenarioError) as e:
        parse_scenario({**MINIMAL, **change})
    assert f"{path}: " in str(e.value) and message in str(e.value)


@pytest.mark.parametrize("node, low, high, want", [
    (("4", "16Gi"), ("1", "1Gi"), ("2", "1Gi"), 2),   # 4 low pods fill the node's cpu: 2 must go
    (("4", "16Gi"), ("1", "4Gi"), ("1", "6Gi"), 2),   # memory decides: 4 x 4Gi, the preemptor needs 6Gi
    (("3500m", "16Gi"), ("1", "1Gi"), ("1", "1Gi"), 1),  # 500m left: one victim frees the rest
    (("4", "16Gi"), ("1", "1Gi"), ("100m", "1Gi"), 1),  # even the smallest pod needs room
], ids=["cpu", "memory", "partial-room", "small-preemptor"])
def test_minimum_victims_is_what_a_full_node_must_give_up(node, low, high, want):
    s = parse_scenario({**MINIMAL, "cluster": {"nodes": 2, "cpu": node[0], "memory": node[1]},
                        "replica_sets": {"replicas": 8, "cpu": low[0], "memory": low[1]},
                        "workload": {"pods": 1, "cpu": high[0], "memory": high[1], "priority": 10},
                        "preemption": {"bound_within_s": 5}})
    assert s.minimum_victims() == want


def test_short_merges_settings_key_by_key_and_replaces_the_rest():
    doc = {**MINIMAL, "cluster": {"nodes": 100, "cpu": "4"}, "exercised": {"a": 1, "b": 2},
           "faults": [{"at_s": 1, "action": "kill-shard"}, {"at_s": 2, "action": "kill-coordinator"}],
           "short": {"cluster": {"nodes": 10}, "exercised": {"a": 1}, "faults": [{"at_s": 0.5, "action": "kill-shard"}]}}
    s = parse_scenario(doc, short=True)
    assert (s.cluster.nodes, s.cluster.cpu) == (10, "4")
    assert s.exercised == {"a": 1} and [f.at_s for f in s.faults] == [0.5]
    assert set(parse_scenario(doc).invariants) == set(INVARIANTS)  # all by default
    with pytest.raises(ScenarioError, match="short: a mapping is required"):
        parse_scenario(MINIMAL, short=True)
    with pytest.raises(ScenarioError, match="no scenario 'nope'"):
        load_scenario("nope")


@pytest.mark.parametrize("gap, expected", [((5.0, 7.0), 2.0), ((5.0, 5.0), 0.0)], ids=["2-s-outage", "no-dent"])
def test_recovery_is_the_time_until_the_rate_stays_back(gap, expected):
    # 100 binds/s for 5 s, none from gap[0] to gap[1], then 100/s again until 12 s
    times = np.concatenate([np.arange(0, gap[0], 0.01), np.arange(gap[1], 12, 0.01)])
    before, rec = _recovery(times, 5.0, 0.0)
    assert before == pytest.approx(100, rel=0.02) and rec == pytest.approx(expected, abs=0.15)
    assert _recovery(times, 5.0, 4.5) == (None, None)  # less than a window of history
    assert _recovery(times[times < 6], 5.0, 0.0)[1] is None  # the work ran out: not measured


# ------------------------------------------------------------------------------------ short runs


#: scenarios run a second time with each shard binding in the background (binding_cycles=2, as
#: serve runs): kills mid-bind, 409/5xx storms, Redis restarted, a rival scheduler
BACKGROUND_BINDING = ["shard-kill", "bind-errors", "redis-restart", "rival-scheduler", "spread-shard-kill"]


@pytest.mark.parametrize("name, binding_cycles", [(n, 0) for n in SCENARIOS] + [(n, 2) for n in BACKGROUND_BINDING],
                         ids=SCENARIOS + [f"{n}-binding-cycles-2" for n in BACKGROUND_BINDING])
def test_short_scenario_verdict(name, binding_cycles, redis_server, ray_session):
    scenario = load_scenario(name, short=True)
    scenario = scenario.model_copy(update={"shards": scenario.shards.model_copy(update={"binding_cycles": binding_cycles})})
    verdict = ChaosRun(scenario, redis_url=redis_server.url, short=True).run_verdict()
    data = verdict.to_json()

    assert VERDICT_KEYS <= set(data)
    assert data["violations"] == [] and data["ok"], json.dumps(data, indent=1, default=str)[:6000]
    assert data["settled"]
    assert (data["overcommitted_nodes"], data["double_binds"], data["stale_token_binds"], data["lost_pods"]) == (0, 0, 0, 0)
    assert data["ledger"]["drift_nodes"] == 0
    for kill in data["shard_kills"]:
        assert kill["bound_within_s"] <= kill["limit_s"] == load_scenario(name, short=True).shards.lease_ttl_s + 5
    assert all(v["value"] >= v["min"] for v in data["exercised"].values())
    spread = data.get("zone_spread")
    if scenario.workload.zone_spread_max_skew is not None:
        assert spread["checked"] and spread["skew"] <= spread["max_skew"], spread
        assert sum(spread["bound_per_zone"].values()) == data["pods"]["bound"] == scenario.workload.pods
    assert ray_session.is_initialized()


def test_cli_help_names_the_design_notes_by_their_path():
    from click.testing import CliRunner

    from chaos.__main__ import cli

    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0 and "docs/design.md" in result.output and "DESIGN.md" not in result.output


def test_cli_lists_and_runs_a_scenario_with_a_json_verdict(tmp_path):
    # this checkout's chaos package, whatever is installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    chaos = [sys.executable, "-m", "chaos"]
    listed = subprocess.run(chaos + ["list"], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert listed.returncode == 0 and all(name in listed.stdout for name in SCENARIOS)
    bad = subprocess.run(chaos + ["run", "nope"], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert bad.returncode == 1 and "no scenario 'nope'" in bad.stderr

    proc = subprocess.run(chaos + ["run", "stale-owner", "--short", "-o", "json"],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert VERDICT_KEYS <= set(data) and data["ok"] and data["scenario"] == "stale-owner" and data["short"]
