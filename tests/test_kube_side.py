"""``shardsched bench kube-vs-shardsched``: the report's arithmetic (plain unit tests), the command's
usage errors, and a short run against a real kube-apiserver with a real kube-scheduler
(``KUBEBUILDER_ASSETS`` holding kube-apiserver, etcd and kube-scheduler; skipped with the reason
otherwise)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from shardsched.bench import kube_side_report as rep
from shardsched.bench.kube_side import order
from shardsched.bench.kube_side_procs import kube_scheduler_config, shardsched_config
from shardsched.cli.main import cli
from shardsched.config import parse_config


@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 99, 100])
def test_percentile_is_numpys_linear_interpolation(q):
    xs = [5.0, 1.0, 9.0, 3.0, 7.5, 2.0, 8.0]
    assert rep.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_percentile_of_nothing_and_out_of_range():
    assert rep.percentile([], 50) is None
    assert rep.p50_p99_ms([]) == {"p50": None, "p99": None, "max": None, "n": 0}
    with pytest.raises(ValueError, match="101"):
        rep.percentile([1.0], 101)


def test_backlog_figures_from_launch_and_binds():
    fig = rep.backlog_figures(100.0, {"a": 102.0, "b": 103.0, "c": 104.0, "d": 106.0}, pods=5)
    assert fig["bound"] == 4 and fig["pods"] == 5
    assert fig["first_bind_s"] == 2.0 and fig["last_bind_s"] == 6.0
    assert fig["first_to_last_pods_per_s"] == 0.8  # 3 binds after the first over 4 s
    assert fig["launch_to_last_pods_per_s"] == pytest.approx(4 / 6, abs=0.05)
    one = rep.backlog_figures(100.0, {"a": 101.0}, pods=1)
    assert one["first_bind_s"] == one["last_bind_s"] == 1.0 and one["first_to_last_pods_per_s"] is None
    assert rep.backlog_figures(100.0, {}, pods=3)["first_bind_s"] is None


def test_paced_figures_latency_per_pod_and_the_creation_rate():
    created = {f"p{i}": 10.0 + i * 0.1 for i in range(11)}  # 10/s over 1 s
    bound = {f"p{i}": 10.0 + i * 0.1 + 0.002 * (i + 1) for i in range(10)}  # p10 never bound
    bound["p0"] = 9.999  # seen before the create call returned: counts 0
    fig = rep.paced_figures(10.0, 1.0, created, bound)
    assert fig["created"] == 11 and fig["bound"] == 10 and fig["created_per_s"] == 10.0
    lat = sorted([0.0] + [0.002 * (i + 1) for i in range(1, 10)])
    assert fig["latency_ms"]["p50"] == pytest.approx(np.percentile(lat, 50) * 1000, abs=0.01)
    assert fig["latency_ms"]["p99"] == pytest.approx(np.percentile(lat, 99) * 1000, abs=0.01)
    assert fig["latency_ms"]["n"] == 10


def test_event_figures_delay_and_missing():
    fig = rep.event_figures({"a": 1.0, "b": 2.0, "c": 3.0}, {"a": 1.5, "b": 1.9, "x": 9.0})
    assert fig["bound"] == 3 and fig["with_event"] == 2 and fig["missing"] == 1  # c has none; x is not ours
    assert fig["delay_ms"]["p50"] == 250.0 and fig["delay_ms"]["max"] == 500.0  # b's Event first: 0


def test_cores_and_ratio():
    assert rep.cores(10.0, 12.5, 5.0) == 0.5
    assert rep.cores(None, 1.0, 5.0) is None and rep.cores(1.0, 2.0, 0.0) is None
    assert rep.ratio(3.0, 2.0) == 1.5 and rep.ratio(1.0, 0.0) is None and rep.ratio(None, 1.0) is None


def _run(variant, first, p50):
    return {"variant": variant, "backlog": {"first_bind_s": first, "pods": 10, "bound": 10},
            "paced": {"50": {"latency_ms": {"p50": p50, "p99": p50 * 2}, "cores": 0.1}},
            "events": {"delay_ms": {"p50": 1.0, "p99": 2.0}, "missing": 0}, "memory": {"rss_peak_mib": 100.0}}


def test_summary_takes_medians_per_variant_and_the_ratio_to_kube():
    runs = [_run(rep.KUBE, 1.0, 6.0), _run(rep.KUBE, 3.0, 10.0), _run(rep.THREADS, 5.0, 20.0),
            _run(rep.THREADS, 7.0, 40.0), _run(rep.RAY, 40.0, 30.0)]
    rows = {r["measure"]: r for r in rep.summary(runs, [50.0])}
    first = rows["backlog: launch → first bind (s)"]
    assert first[rep.KUBE] == 2.0 and first[rep.THREADS] == 6.0 and first[rep.RAY] == 40.0
    assert first[f"ratio_{rep.THREADS}"] == 3.0 and first[f"ratio_{rep.RAY}"] == 20.0
    assert first["better"] == "lower" and first[f"{rep.KUBE}_runs"] == [1.0, 3.0]
    p99 = rows["paced 50/s: P99 creation → bound (ms)"]
    assert p99[rep.KUBE] == 16.0 and p99[rep.THREADS] == 60.0 and p99[f"ratio_{rep.THREADS}"] == 3.75
    # a measure no run has is unknown, not zero
    assert rows["backlog: first → last (pods/s)"][rep.KUBE] is None
    assert rows["backlog: first → last (pods/s)"][f"ratio_{rep.RAY}"] is None
    # a run that did not bind its whole backlog (its scheduler failed to start) is left out
    failed = {"variant": rep.RAY, "backlog": {"pods": 10, "bound": 0, "first_bind_s": None},
              "memory": {"rss_peak_mib": 9999.0}}
    ray_rss = {r["measure"]: r for r in rep.summary([*runs, failed], [50.0])}["resident memory, peak (MiB)"]
    assert ray_rss[rep.RAY] == 100.0 and ray_rss[f"{rep.RAY}_runs"] == [100.0]
    table = rep.markdown(rep.summary(runs, [50.0]), rep.VARIANTS).splitlines()
    assert table[0] == ("| measure | kube-scheduler | shardsched-threads | shardsched-ray | threads / kube "
                        "| ray / kube |")
    assert "| backlog: launch → first bind (s) | 2 | 6 | 40 | 3 | 20 |" in table


def test_the_order_rotates_between_repeats():
    v = ("a", "b", "c")
    assert [order(v, r) for r in range(4)] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]


def test_the_configuration_files_parse():
    text = kube_scheduler_config("/k/admin.kubeconfig", "kvs-kube", 5000, 5000)
    assert "kubescheduler.config.k8s.io/v1beta3" in text and "qps: 5000" in text and "leaderElect: false" in text
    assert [p.scheduler_name for p in parse_config(shardsched_config("kvs-ss"), "test").profiles] == ["kvs-ss"]


@pytest.mark.parametrize("args, message", [
    (["--rates", "50,x"], "a comma-separated list of pods/s"),
    (["--rates", "0"], "every rate must be > 0"),
    (["--schedulers", "kube,nope"], "a comma-separated list of kube, threads, ray"),
    (["--kube-scheduler", "/nonexistent/kube-scheduler"], "no kube-scheduler binary: /nonexistent/kube-scheduler"),
])
def test_usage_errors_name_the_option(args, message):
    res = CliRunner().invoke(cli, ["bench", "kube-vs-shardsched", *args])
    assert res.exit_code == 2 and message in res.output, res.output


def test_without_assets_or_a_kubeconfig_it_says_why(monkeypatch, tmp_path):
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    res = CliRunner().invoke(cli, ["bench", "kube-vs-shardsched", "--schedulers", "threads"])
    assert res.exit_code == 2 and "KUBEBUILDER_ASSETS is not set" in res.output, res.output


# ---------------------------------------------------------------------------------------- envtest
def _assets() -> tuple[str | None, str]:
    folder = os.environ.get("KUBEBUILDER_ASSETS")
    if not folder:
        return None, "KUBEBUILDER_ASSETS is not set (kube-apiserver, etcd and kube-scheduler binaries)"
    missing = [b for b in ("kube-apiserver", "etcd", "kube-scheduler") if not os.access(Path(folder) / b, os.X_OK)]
    if missing:
        return None, f"KUBEBUILDER_ASSETS={folder} lacks executable {', '.join(missing)}"
    return folder, ""


def test_envtest_a_short_side_by_side_run():
    """50 nodes, a 100-pod backlog and one paced rate for 4 s, kube-scheduler then serve (threads),
    against a real kube-apiserver the command starts."""
    folder, why = _assets()
    if folder is None:
        pytest.skip(why)
    proc = subprocess.run([sys.executable, "-m", "shardsched.cli.main", "bench", "kube-vs-shardsched", "--nodes", "50",
                           "--pods", "100", "--rates", "20", "--paced-seconds", "4", "--repeats", "1",
                           "--schedulers", "kube,threads", "--sigterm-wait", "15", "-o", "json"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert data["api_server_version"].startswith("v1.") and data["errors"] == [] and not data["interrupted"]
    assert data["kube_scheduler_version"].startswith("Kubernetes v1.")
    assert data["options"]["kube_scheduler"] == "kube-scheduler"  # the binary's name, not where it is
    assert "repeat 1/1: kube-scheduler" in proc.stderr and "paced 20/s" in proc.stderr  # the progress lines
    runs = {r["variant"]: r for r in data["runs"]}
    assert set(runs) == {rep.KUBE, rep.THREADS}
    for variant, run in runs.items():
        b = run["backlog"]
        assert b["bound"] == b["pods"] == 100, (variant, b)
        assert 0 < b["first_bind_s"] <= b["last_bind_s"] and b["first_to_last_pods_per_s"] > 0, (variant, b)
        paced = run["paced"]["20"]
        assert paced["created"] == paced["bound"] == 80 and 10 < paced["created_per_s"] < 30, (variant, paced)
        lat = paced["latency_ms"]
        assert 0 <= lat["p50"] <= lat["p99"] <= lat["max"] < 60_000, (variant, lat)
        # every pod bound once, and each by the scheduler it names: its Scheduled Event's reporter
        assert run["bound_total"] == 180 and run["events"]["reporters"].get(run["scheduler_name"], 0) == \
            run["events"]["with_event"] > 0, (variant, run["events"])
        assert 0 <= run["events"]["delay_ms"]["p50"] <= run["events"]["delay_ms"]["p99"], (variant, run["events"])
        assert run["memory"]["rss_peak_mib"] > 10 and run["memory"]["processes"] >= 1, (variant, run["memory"])
        assert b["cores"] is not None and b["cores"] >= 0 and paced["cores"] >= 0
    assert runs[rep.THREADS]["memory"]["processes"] >= 2  # serve and the Redis it started
    rows = {r["measure"]: r for r in data["summary"]}
    assert rows["backlog: launch → first bind (s)"][f"ratio_{rep.THREADS}"] > 0
