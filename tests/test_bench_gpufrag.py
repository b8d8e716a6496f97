"""``bench gpu-frag``: the workload's inflation and clone names, a short run whose placements
recompute its result, the CLI, and the trace's bad rows."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from shardsched.bench import gpufrag
from shardsched.cli.main import cli
from shardsched.sim import trace
from shardsched.sim.trace import NodeRow, PodRow

NODES = [NodeRow(f"n{i}", 32000, 131072, g, m) for i, (g, m) in enumerate([(2, "T4"), (4, "T4"), (8, "V100"), (1, "T4")])]
HEAVY = os.environ.get("SHARDSCHED_HEAVY") == "1"
POD_CSV = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec
p0,4000,8192,1,1000,
p1,2000,4096,1,500,
p2,1000,2048,1,300,T4
p3,8000,8192,2,1000,
p4,1000,1024,0,0,
p5,2000,2048,1,250,V100
"""


def _pods(tmp_path):
    path = tmp_path / "pods.csv"
    path.write_text(POD_CSV)
    pods, report = trace.load_pod_rows(path)
    assert not report.skipped
    return pods


def test_inflation_appends_named_clones_up_to_130_percent(tmp_path):
    pods = _pods(tmp_path)
    capacity = 15 * 1000
    order = gpufrag.inflate(pods, capacity, seed=42)
    demand = [gpufrag.gpu_demand(p) for p in order]
    assert sum(demand) >= 1.3 * capacity and sum(demand[:-1]) < 1.3 * capacity  # stops at the first crossing
    originals, clones = order[: len(pods)], order[len(pods):]
    assert sorted(p.name for p in originals) == sorted(p.name for p in pods)
    assert [c.name.split("-tuned-")[1] for c in clones] == [str(i) for i in range(len(clones))]
    by_name = {p.name: p for p in pods}
    for c in clones:
        assert c._replace(name=c.name.split("-tuned-")[0]) == by_name[c.name.split("-tuned-")[0]]
    assert gpufrag.inflate(pods, capacity, seed=42) == order and gpufrag.inflate(pods, capacity, seed=43) != order


def test_thinning_when_the_list_asks_for_more(tmp_path):
    pods = _pods(tmp_path)
    order = gpufrag.inflate(pods, 2000, seed=1)  # 130% of 2 GPUs = 2,600 thousandths
    assert sum(gpufrag.gpu_demand(p) for p in order) <= 2600 and len(order) < len(pods)
    assert not any("-tuned-" in p.name for p in order)


@pytest.mark.parametrize("policy", sorted(gpufrag.POLICIES))
def test_placements_recompute_the_result(tmp_path, policy):
    """Every policy's placements respect devices and CPU and give back the reported figures."""
    pods = _pods(tmp_path)
    out = tmp_path / "placements.jsonl"
    result = gpufrag.run_one(NODES, pods, "small", policy, 7, placements_out=str(out))
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == result.pods and sum(p["node"] is not None for p in lines) == result.placed
    assert gpufrag.recompute(lines, NODES) == result.unallocated_pct
    for p in lines:
        if p["node"] is not None and p["gpu_spec"]:
            model = next(n.model for n in NODES if n.name == p["node"])
            assert model in p["gpu_spec"].split("|")


@pytest.mark.parametrize("policy", ["fgd", "packing", "dotprod"])
def test_simulator_policies_break_ties_to_the_smallest_node_name(tmp_path, policy):
    """The nodes tie for a CPU pod (fgd: no fragmentation changes; packing: 0 for a pod without
    GPU; dotprod: the same free everywhere): the FGD simulator's fork of kube-scheduler takes the
    smallest name, whatever the seed; random ties (bestfit's) spread over seeds."""
    nodes = [NodeRow(name, 32000, 131072, 2, "T4") for name in ("n-c", "n-a", "n-b")]
    path = tmp_path / "pods.csv"
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\nq0,1000,1024,0,0,\n")
    pods, _ = trace.load_pod_rows(path)

    def node_of(policy, seed):
        out = tmp_path / f"{policy}-{seed}.jsonl"
        gpufrag.run_one(nodes, pods, "t", policy, seed, placements_out=str(out))
        return json.loads(out.read_text().splitlines()[0])["node"]

    assert {node_of(policy, s) for s in range(8)} == {"n-a"}
    assert len({node_of("bestfit", s) for s in range(8)}) > 1


def test_recompute_rejects_an_overfull_device():
    lines = [{"name": f"s{i}", "cpu_milli": 1, "memory_mib": 1, "num_gpu": 1, "gpu_milli": 600, "gpu_spec": "",
              "node": "n0", "devices": [0]} for i in range(2)]
    with pytest.raises(ValueError, match="device 0 of n0 over 1000"):
        gpufrag.recompute(lines, NODES)


@pytest.mark.heavy
def test_random_policy_is_near_the_papers_random_on_one_seed():
    """The method's calibration (docs/benchmarks.md has all seeds): one seed of the default list;
    the short form takes every fourth node and pod (the same shapes, a quarter of the decisions)."""
    nodes, pods, skipped = gpufrag.load("default")
    assert len(nodes) == 1213 and len(pods) == 8152 and not skipped
    step, tolerance = (1, 1.0) if HEAVY else (4, 2.0)
    r = gpufrag.run_one(nodes[::step], pods[::step], "default", "random", 42)
    assert abs(r.unallocated_pct["100%"] - gpufrag.PAPER["default"]["random"]) < tolerance


def test_cli_one_seed_json(tmp_path):
    path = tmp_path / "pods.csv"
    path.write_text(POD_CSV + "p6,1000,1024,16,1000,\np7,1000,1024,1,300,A100\n")
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
        f"{n.name},{n.cpu_milli},{n.memory_mib},{n.gpu},{n.model}\n" for n in NODES) + "bad,1000,1000,0,T4\n")
    out = tmp_path / "pl.jsonl"
    res = CliRunner().invoke(cli, ["bench", "gpu-frag", "--pod-list", str(path), "--nodes-file", str(nodes),
                                   "--policy", "bestfit", "--seed", "3", "--placements-out", str(out), "-o", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["summary"]["seeds"] == [3] and out.exists()
    assert any("model 'T4' on a node without GPUs" in s for s in data["skipped_rows"])
    assert data["never_placeable"] == ["p6: num_gpu 16 is more than any node's GPUs (8)",
                                       "p7: gpu_spec names no GPU model of the cluster (A100)"]


def test_runtime_profile_has_gpudevice_as_the_only_score(tmp_path):
    from shardsched.bench import gpufrag_shards
    from shardsched.config import parse_config

    pods = _pods(tmp_path)
    specs = gpufrag_shards.typical_pod_specs(pods)
    assert sorted(s["weight"] for s in specs) == [1] * 6  # six shapes, one pod each
    assert {"cpuMilli": 1000, "gpuCount": 1, "gpuMilli": 300, "gpuModels": ["T4"], "memoryMib": 2048,
            "weight": 1} in specs
    profile = parse_config(gpufrag_shards.profile_yaml("fgd-bestfit", pods)).profiles[0]
    assert [p.name for p in profile.enabled("score")] == ["GPUDevice"]
    assert "GPUDevice" in [p.name for p in profile.enabled("filter")]
    assert profile.plugin_args["GPUDevice"].scoring_strategy == "FGDBestFit"
    assert len(profile.plugin_args["GPUDevice"].typical_pods) == 6


def test_sharded_run_counts_what_the_cluster_bound(ray_session, tmp_path):
    """Two shards, waves of 4: every pod once, in submission order; the unplaced ones were found
    unschedulable and deleted; the result is the tally of the bound pods' nodes and devices."""
    from shardsched.bench import gpufrag_shards

    pods = _pods(tmp_path)
    out = tmp_path / "placements.jsonl"
    r = gpufrag_shards.run_one(NODES, pods, "small", "fgd-bestfit", 7, shards=2, ray_address=None, wave=4,
                               placements_out=str(out))
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    order = gpufrag.inflate(pods, 15 * 1000, 7)
    assert [p["name"] for p in lines] == [p.name for p in order] and r.pods == len(order)
    placed = [p for p in lines if p["node"] is not None]
    assert r.placed == len(placed) and 0 < len(placed) < len(lines)  # 130% of the GPUs cannot all fit
    for p in placed:
        assert len(p["devices"]) == p["num_gpu"]
    assert gpufrag.recompute(lines, NODES) == r.unallocated_pct
    assert r.shards == 2 and r.wave == 4


def test_cli_placements_need_one_seed():
    res = CliRunner().invoke(cli, ["bench", "gpu-frag", "--placements-out", "x.jsonl"])
    assert res.exit_code == 2 and "--placements-out needs --seed" in res.output


@pytest.mark.parametrize("row,words", [
    ("q,1000,1024,1,1001,", "gpu_milli 1001 is not in 1..1000"),
    ("q,1000,1024,1,-5,", "gpu_milli -5 is negative"),
], ids=["above-1000", "negative"])
def test_trace_rejects_bad_gpu_milli_naming_the_row(tmp_path, row, words):
    path = tmp_path / "pods.csv"
    path.write_text(POD_CSV + row + "\n")
    pods, report = trace.load_pod_rows(path)
    assert len(pods) == 6 and report.skipped == [f"pods.csv:8: {words}"]


def test_check_pods_names_pods_no_node_can_take(tmp_path):
    path = tmp_path / "pods.csv"
    path.write_text(POD_CSV.replace("p5,2000,2048,1,250,V100", "p5,2000,2048,1,250,A100") + "p6,1000,1024,16,1000,\n")
    nodes_csv = tmp_path / "nodes.csv"
    nodes_csv.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,65536,8,T4\n")
    pods, _ = trace.load_pods(path)
    nodes, _ = trace.load_nodes(nodes_csv)
    assert trace.check_pods(pods, nodes) == ["p5: gpu_spec A100 names no GPU model of the nodes",
                                             "p6: num_gpu 16 is more than any node's GPUs (8)"]


def test_run_trace_profile_checks_devices_and_aggregate_is_an_explicit_relaxation():
    from shardsched.cli.run import TRACE_PROFILE
    from shardsched.config import load_config

    profile = load_config(TRACE_PROFILE).profiles[0]
    assert "GPUDevice" in [p.name for p in profile.enabled("filter")]
    assert profile.plugin_args["GPUDevice"].scoring_strategy == "FGDPlus"
    res = CliRunner().invoke(cli, ["run", "--gpu-aggregate"])
    assert res.exit_code == 2 and "--gpu-aggregate goes with --trace and without --config" in res.output
