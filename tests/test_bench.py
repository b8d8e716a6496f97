"""Smoke tests of ``shardsched bench decision|field|perf|scaling`` at tiny sizes: every row runs, every pod is
bound, the invariants hold, and the JSON is well formed. No timing assertions: the figures are the
benchmark's business (docs/benchmarks.md), not the tests'."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from shardsched.bench import field, kubelike, perf, scaling
from shardsched.bench.harness import machine, parse_int_list
from shardsched.cli.main import cli
from shardsched.config import load_config



def _roundtrip(data: dict) -> dict:
    return json.loads(json.dumps(data))


# ------------------------------------------------------------------------------------ no Ray

@pytest.mark.parametrize("text, expected", [
    ("1k,5k,20k,50k", [1000, 5000, 20000, 50000]),
    ("1, 2 ,4", [1, 2, 4]),
    ("0", [0]),
    ("1.5k", [1500]),
], ids=["thousands", "spaces", "zero", "fraction"])
def test_int_lists(text, expected):
    assert parse_int_list(text) == expected


def test_bench_decision_says_why_pods_were_not_scheduled():
    """The distinct workload's unschedulable pods are counted by the plugins that rejected them,
    with the reason they exist (the workload's construction), in the table and in the JSON."""
    args = ["bench", "decision", "--nodes", "100", "--pods", "50", "--distinct", "400", "--repeat", "1"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    data = json.loads(CliRunner().invoke(cli, args + ["-o", "json"]).output)
    distinct = {r["workload"]: r for r in data["results"]}["distinct"]
    not_scheduled = distinct["pods"] - distinct["scheduled"]
    assert not_scheduled > 0 and distinct["unscheduled_by"] == {"TaintToleration, NodeAffinity": not_scheduled}
    assert f"distinct: {not_scheduled} of 400 pods not scheduled; every node was rejected for them" in result.output
    assert (f"  {not_scheduled} by TaintToleration, NodeAffinity (zones z0 and z5 hold only tainted nodes, and these "
            "pods select one of them without its toleration)") in result.output
    assert "one-signature:" not in result.output  # every one of those pods was scheduled


@pytest.mark.parametrize("text", ["", "a,b", ","], ids=["empty", "letters", "only-comma"])
def test_int_lists_reject_garbage(text):
    with pytest.raises(ValueError):
        parse_int_list(text)


CONFIG_WITH_PERCENTAGE = """
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
percentageOfNodesToScore: 70
profiles:
- schedulerName: a
- schedulerName: b
  percentageOfNodesToScore: 30
"""


@pytest.mark.parametrize("source", [None, CONFIG_WITH_PERCENTAGE], ids=["defaults", "percentages-set"])
def test_kube_like_always_uses_the_adaptive_percentage(source):
    config = kubelike.kube_like_config(load_config(source))
    assert config.percentage_of_nodes_to_score == 0
    assert {p.percentage_of_nodes_to_score for p in config.profiles} == {0}


@pytest.mark.parametrize("workload, status, reason", [
    ("SchedulingBasic/5000Nodes_10000Pods", perf.RUN, None),
    ("SchedulingWithNodeInclusionPolicy/5000Nodes", perf.RUN, None),
    ("SchedulingWithMixedChurn/5000Nodes_10000Pods", perf.PARTIAL, "Service churn"),
    ("SchedulingPodAffinity/5000Nodes_5000Pods", perf.RUN, None),
    ("PreemptionBasic/1000Nodes", perf.RUN, None),
    ("PreemptionBasic/5000Nodes", perf.RUN, None),
    ("SchedulingDeletedPodsWithFinalizers/5000Node_5000DeletingPods", perf.SKIP, "deletePods"),
    ("SchedulingBasic/5000Nodes_50000Pods_AsyncAPICallsEnabled", perf.SKIP, "feature gates"),
    ("DefaultTopologySpreading/5000Nodes_50000Pods", perf.RUN, None),
], ids=["basic", "inclusion-policy", "mixed-churn", "pod-affinity", "preemption", "preemption-5000-built-in",
        "delete-op", "gate-variant", "default-spreading"])
def test_perf_catalog_says_what_runs_and_why_not(workload, status, reason):
    entry = next(c for c in perf.catalog(perf.load_workloads()) if c["workload"] == workload)
    assert entry["status"] == status
    if reason:
        assert reason in "; ".join(entry["reasons"])


def test_perf_plan_stamps_templates_and_defaults_allocatable():
    w = next(w for w in perf.load_workloads() if w.full_name == "SchedulingWithExtendedResource/fast")
    p = perf.plan(w, perf._Templates(), "default-scheduler")
    assert len(p.nodes) == 11 and len(p.measured) == 10 and not p.init_pods
    assert len({n["metadata"]["name"] for n in p.nodes}) == 11
    extended = [n for n in p.nodes if "node-with-extended-resource" in n["metadata"].get("labels", {})]
    assert extended[3]["status"]["allocatable"]["foo.com/bar-3"] == 1
    assert p.measured[3]["spec"]["containers"][0]["resources"]["requests"] == {"foo.com/bar-3": 1}


def test_perf_plan_puts_create_any_services_beside_the_nodes_and_spreads_init_pods_by_them():
    """DefaultTopologySpreading's createAny: a Service in service-ns selecting app=scheduler-perf,
    the measured pods' label; the init pods (another namespace) are placed without it."""
    w = next(w for w in perf.load_workloads() if w.full_name == "DefaultTopologySpreading/5Nodes")
    p = perf.plan(w, perf._Templates(), "default-scheduler")
    [svc] = p.spread_selectors
    assert (svc["kind"], svc["metadata"]["namespace"], svc["spec"]["selector"]) == (
        "Service", "service-ns", {"app": "scheduler-perf"})
    assert svc["metadata"]["name"] and "generateName" not in svc["metadata"]
    assert {m["metadata"]["namespace"] for m in p.measured} == {"service-ns"}
    assert perf.place_init_pods(load_config(None), p.nodes, p.init_pods, 0, p.spread_selectors) == 0


def test_perf_plan_turns_upstream_pod_groups_into_pod_groups_and_labels():
    """GangScheduling (podgroup/gangscheduling): the createAny of upstream's PodGroups
    (scheduling.k8s.io, gang minCount) becomes scheduler-plugins PodGroups with minMember, and each
    measured pod (spec.schedulingGroup, the group index = pod index / podsPerGroup) joins its group
    by the label."""
    w = next(w for w in perf.load_workloads() if w.full_name == "GangScheduling/10Nodes_3Gangs")
    p = perf.plan(w, perf._Templates(), "default-scheduler")
    assert p.status == perf.RUN and len(p.nodes) == 10 and not p.init_pods
    assert [(g["apiVersion"], g["metadata"]["name"], g["metadata"]["namespace"], g["spec"]["minMember"])
            for g in p.pod_groups] == [("scheduling.x-k8s.io/v1alpha1", f"gang-{i}", "gang-0", 3) for i in range(3)]
    labels = [m["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] for m in p.measured]
    assert labels == ["gang-0"] * 3 + ["gang-1"] * 3 + ["gang-2"] * 3
    assert all("schedulingGroup" not in m["spec"] for m in p.measured)
    assert [m["metadata"]["name"] for m in p.measured[:2]] == ["test-gang-scheduling-0", "test-gang-scheduling-1"]


@pytest.mark.parametrize("text, values, expected", [
    ("gang-{{DivideInt .Index .size}}", {"Index": 7, "size": 3}, "gang-2"),
    ("minCount: {{ .size }}", {"size": 3}, "minCount: 3"),
    ("{{MultiplyInt .Index 2}}", {"Index": 4}, "8"),
], ids=["divide", "spaces", "constant"])
def test_perf_template_actions(text, values, expected):
    assert perf._render(text, values) == expected


@pytest.mark.parametrize("text", ["{{RandInt 1 2}}", "{{.missing}}", "{{IfThenElse .a 1 2}}"],
                         ids=["unknown-function", "unknown-value", "wrong-arity"])
def test_perf_template_actions_it_cannot_evaluate_are_errors(text):
    with pytest.raises(perf.TemplateError):
        perf._render(text, {"a": 1})


# ------------------------------------------------------------------------------------ with Ray

def test_field_every_row_runs(ray_session, tmp_path):
    # 120 nodes: enough for kube's adaptive rule to sample (100 of 120 nodes), so kube-like takes
    # the sampled path as it does at 5,000 nodes
    params = field.FieldParams(nodes=120, pods=40, timeout_s=120)
    rows = field.run(params)
    assert [r.name for r in rows] == ["kube-like", "single", "batch-10", "batch-auto", "shards-1", "shards-2", "shards-4"]
    for r in rows:
        assert r.bound == r.pods == 40, r.name
        assert r.invariants_ok and not r.errors, (r.name, r.errors)
        assert len(r.latencies_s) == 40
    kube = rows[0]
    assert kube.params["sampled_path"] and kube.params["signature_cache_entries"] == 0
    data = _roundtrip(field.to_json(rows, params, machine()))
    assert data["benchmark"] == "field" and len(data["rows"]) == 7
    for row in data["rows"]:
        assert {"avg_latency_s", "p99_latency_s", "throughput_pods_per_s", "cpu_cores", "peak_rss_bytes",
                "vs_kube_like"} <= set(row)
    assert data["rows"][0]["field_report"]["throughput_pods_per_s"] == 8
    text = field.markdown(rows, params)
    assert all(f"**{r.name}**" in text for r in rows)
    paths = field.plot(rows, params, str(tmp_path))
    assert paths == [str(tmp_path / "field-throughput.png"), str(tmp_path / "field-p99.png")]
    assert all((tmp_path / name).stat().st_size > 0 for name in ("field-throughput.png", "field-p99.png"))


def test_field_paced_load_creates_the_pods_at_the_rate(ray_session):
    # 60 pods at 40/s: the creations span 1.5 s, so the rows' windows do too; each pod waits for
    # no burst, so its latency is far below the span
    params = field.FieldParams(nodes=50, pods=60, rows=["kube-like", "shards-2"], rate_pods_per_s=40, timeout_s=120)
    rows = field.run(params)
    for r in rows:
        assert r.bound == r.pods == 60 and r.invariants_ok and not r.errors, (r.name, r.errors)
        assert r.wall_s >= 1.4, r.name
        assert 0 < r.p50_latency_s <= r.p99_latency_s < 1.0, r.name
    text = field.markdown(rows, params)
    assert "pods created at 40/s" in text and "P50 latency" in text
    assert field.to_json(rows, params, machine())["params"]["rate_pods_per_s"] == 40


def test_perf_runs_workloads_and_lists_the_skipped(ray_session, tmp_path):
    params = perf.PerfParams(workloads=["SchedulingBasic/5Nodes", "Unschedulable/5Nodes/1Init/10Pods",
                                        "PreemptionBasic/5Nodes", "PreemptionAsync/5Nodes",
                                        "SchedulingDeletedPodsWithFinalizers/10Node_100DeletingPods",
                                        "DefaultTopologySpreading/5Nodes", "GangScheduling/10Nodes_3Gangs"],
                             timeout_s=120)
    results, cat = perf.run(params)
    basic, unsched, preempt, preempt_async, skipped, spread, gangs = results
    m = gangs.measurement  # the default profile has no Coscheduling: the gangs' profile adds it
    assert m.bound == m.pods == 9 and m.invariants_ok and (gangs.pod_groups, gangs.gangs_placed) == (3, 3)
    for r, init in ((basic, 5), (unsched, 1), (spread, 10)):  # spread: its Service put into the cluster
        m = r.measurement
        assert r.status == perf.RUN and r.init_pods == init and r.nodes == 5
        assert m.bound == m.pods == 10 and m.invariants_ok and not m.errors
    # 4 pods of 900m on each 4-CPU node; each 3-CPU preemptor takes one node and 3 of its pods
    m = preempt.measurement
    assert preempt.status == perf.RUN and preempt.init_pods == 20 and m.bound == m.pods == 5, m.errors
    assert (preempt.preemptions, preempt.victims) == (5, 15) and m.invariants_ok
    m = preempt_async.measurement
    assert m.bound == m.pods == 5 and m.invariants_ok and preempt_async.churn_objects >= 1
    assert skipped.status == perf.SKIP and skipped.measurement is None
    data = _roundtrip(perf.to_json(results, cat, params, machine()))
    assert [w["status"] for w in data["workloads"]] == ["run", "run", "run", "run", "skipped", "run", "run"]
    assert data["workloads"][2]["victims_per_preemptor"] == 3.0
    assert any(c["workload"].startswith("SchedulingPodAffinity/") for c in data["not_run"])
    assert "PreemptionBasic" in perf.markdown(results, cat, params)
    assert perf.plot(results, str(tmp_path)) == [str(tmp_path / "perf-throughput.png")]


def test_scaling_runs_one_point_per_sweep(ray_session, tmp_path):
    params = scaling.ScalingParams(nodes=[30], shards=[2], batch_sizes=[10], pods=30, batch_pods=20, base_nodes=30,
                                   timeout_s=120)
    points = scaling.run(params)
    assert [(p.sweep, p.x) for p in points] == [("nodes", 30), ("shards", 2), ("batch", 10)]
    for p in points:
        assert p.measurement.bound == p.measurement.pods and p.measurement.invariants_ok
    data = _roundtrip(scaling.to_json(points, params, machine()))
    assert len(data["points"]) == 3 and data["points"][2]["params"]["batch_size"] == 10
    assert len(scaling.plot(points, str(tmp_path))) == 3


def test_cli_perf_help_says_which_workloads_run_and_where_the_data_comes_from():
    result = CliRunner().invoke(cli, ["bench", "perf", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "issue" not in text and "default: the performance-size workloads of SchedulingBasic" in text
    assert "kubernetes repository's test/integration/scheduler_perf" in text and "not the working directory" in text


def test_cli_perf_list_is_json():
    result = CliRunner().invoke(cli, ["bench", "perf", "--list", "-o", "json"])
    assert result.exit_code == 0, result.output
    entries = json.loads(result.output)
    assert {e["status"] for e in entries} == {"run", "partial", "skipped"}


def test_bench_gangs_holds_and_binds_every_gang():
    result = CliRunner().invoke(cli, ["bench", "gangs", "--nodes", "20", "--workloads", "2x6,5x2", "-o", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["results"]
    assert [(r["gangs"], r["size"], r["held"]) for r in rows] == [(2, 6, 2), (5, 2, 5)]
    assert all(0 < r["decide_hold_s"] <= r["to_bound_s"] for r in rows)


def test_bench_gangs_refuses_a_bad_workload():
    result = CliRunner().invoke(cli, ["bench", "gangs", "--workloads", "3x"])
    assert result.exit_code == 1 and "--workloads: expected GANGSxPODS" in result.output
