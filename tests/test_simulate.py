"""`shardsched simulate` end to end through the CLI (a subprocess, as users run it)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_CASES = ROOT.parent / "shared" / "simulate-cases"
CLI = [sys.executable, "-m", "shardsched.cli.main"]


def simulate(tmp_path: Path, manifests: str, *args: str, name: str = "in.yaml") -> subprocess.CompletedProcess:
    path = tmp_path / name
    path.write_text(textwrap.dedent(manifests))
    return subprocess.run(CLI + ["simulate", "-f", str(path), *args], capture_output=True, text=True, timeout=120)


def node(name: str, cpu: str = "4", extra: str = "") -> str:
    return f"""
    apiVersion: v1
    kind: Node
    metadata: {{name: {name}, labels: {{kubernetes.io/hostname: {name}}}}}
    {extra or 'spec: {}'}
    status: {{allocatable: {{cpu: "{cpu}", memory: 8Gi, pods: "110"}}}}
    ---"""


def pod(name: str, cpu: str = "1", spec_extra: str = "", meta_extra: str = "") -> str:
    return f"""
    apiVersion: v1
    kind: Pod
    metadata: {{name: {name}, namespace: default{meta_extra}}}
    spec:
      {spec_extra}
      containers: [{{name: c, image: registry.k8s.io/pause:3.10, resources: {{requests: {{cpu: "{cpu}"}}}}}}]
    ---"""


def by_key(out: dict) -> dict:
    return {f"{p['namespace']}/{p['name']}": p for p in out["pods"]}


@pytest.mark.skipif(not SHARED_CASES.is_dir(), reason=f"acceptance cases not found at {SHARED_CASES}")
def test_shared_acceptance_cases_pass():
    checker = SHARED_CASES / "check_simulate.py"
    run = subprocess.run([sys.executable, str(checker), "--bin", " ".join(CLI)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert " 0 failed" in run.stdout


def test_json_contract_and_priority_order(tmp_path):
    manifests = node("n1", cpu="1") + """
    apiVersion: scheduling.k8s.io/v1
    kind: PriorityClass
    metadata: {name: high}
    value: 1000
    ---""" + pod("low") + pod("high", spec_extra="priorityClassName: high")
    run = simulate(tmp_path, manifests, "-o", "json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert [p["name"] for p in out["pods"]] == ["high", "low"]  # queue order: priority first
    pods = by_key(out)
    assert pods["default/high"] == {"namespace": "default", "name": "high", "node": "n1", "status": "Scheduled",
                                    "reason": "Successfully assigned default/high to n1", "requests": {"cpu": 1000}}
    assert pods["default/low"]["status"] == "Unschedulable"
    assert pods["default/low"]["reason"] == "0/1 nodes are available: 1 Insufficient cpu."
    assert out["nodes"] == [{"name": "n1", "allocatable": {"cpu": 1000, "memory": 8 * 2**30, "pods": 110},
                             "requested": {"cpu": 1000, "pods": 1}}]


def test_deleting_pod_is_skipped_and_bound_pod_counts(tmp_path):
    manifests = (node("n1", cpu="2")
                 + pod("running", spec_extra="nodeName: n1").replace("---", "status: {phase: Running}\n    ---")
                 + pod("done", spec_extra="nodeName: n1").replace("---", "status: {phase: Succeeded}\n    ---")
                 + pod("gone", meta_extra=", deletionTimestamp: '2026-01-01T00:00:00Z'")
                 + pod("fits") + pod("no-room"))
    out = json.loads(simulate(tmp_path, manifests, "-o", "json").stdout)
    pods = by_key(out)
    assert set(pods) == {"default/gone", "default/fits", "default/no-room"}  # only unbound pods are listed
    assert pods["default/gone"]["status"] == "Skipped" and pods["default/gone"]["node"] is None
    assert pods["default/fits"]["node"] == "n1"  # the Succeeded pod frees its cpu
    assert pods["default/no-room"]["status"] == "Unschedulable"


def test_profile_chosen_by_scheduler_name(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(textwrap.dedent("""
        apiVersion: kubescheduler.config.k8s.io/v1
        kind: KubeSchedulerConfiguration
        profiles:
        - schedulerName: default-scheduler
        - schedulerName: packer
          pluginConfig:
          - name: NodeResourcesFit
            args:
              scoringStrategy: {type: MostAllocated}
    """))
    seed = pod("seed", spec_extra="nodeName: a").replace("---", "status: {phase: Running}\n    ---")
    manifests = node("a", cpu="4") + node("b", cpu="4") + seed + pod("spread")
    assert by_key(json.loads(simulate(tmp_path, manifests, "-o", "json", "--config", str(config)).stdout))[
        "default/spread"]["node"] == "b"  # default profile, LeastAllocated: the emptier node
    manifests2 = node("a", cpu="4") + node("b", cpu="4") + seed + pod("packed", spec_extra="schedulerName: packer")
    out2 = json.loads(simulate(tmp_path, manifests2, "-o", "json", "--config", str(config), name="in2.yaml").stdout)
    assert by_key(out2)["default/packed"]["node"] == "a"


def test_bad_input_is_named_and_the_rest_still_runs(tmp_path):
    manifests = (node("n1") + pod("ok")
                 + pod("bad-qty", cpu="abc")
                 + pod("ok")  # duplicate name
                 + """
    apiVersion: v1
    kind: Pod
    metadata: {name: empty}
    spec: {containers: []}
    ---
    apiVersion: v1
    kind: Service
    metadata: {name: svc}
    """)
    run = simulate(tmp_path, manifests, "-o", "json")
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    assert "in.yaml#2: invalid Pod: spec.containers[0].resources.requests.cpu: invalid quantity 'abc'" in run.stderr
    assert "in.yaml#3: duplicate Pod 'default/ok'" in run.stderr
    assert "in.yaml#4: invalid Pod: spec.containers: a pod needs at least one container" in run.stderr
    assert "in.yaml#5: ignoring object of kind 'Service'" in run.stderr
    assert by_key(json.loads(run.stdout))["default/ok"]["node"] == "n1"


@pytest.mark.parametrize("content,expected", [
    ("foo: [\n", "line 2: invalid YAML"),
    ("- a\n- b\n", "expected a Kubernetes object, got list"),
], ids=["yaml-syntax", "not-an-object"])
def test_unreadable_files_exit_non_zero_with_a_message(tmp_path, content, expected):
    path = tmp_path / "x.yaml"
    path.write_text(content)
    run = subprocess.run(CLI + ["simulate", "-f", str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and expected in run.stderr and "Traceback" not in run.stderr


def test_invalid_config_exits_1_naming_the_field(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
                      "profiles:\n- schedulerName: x\n  plugins:\n    filter:\n      enabled:\n      - name: FastMatch\n")
    run = simulate(tmp_path, node("n1") + pod("p"), "--config", str(config))
    assert run.returncode == 1
    assert "profiles[0].plugins.filter.enabled[0].name: unknown plugin 'FastMatch'" in run.stderr


def test_table_output_and_json_file_input(tmp_path):
    doc = {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
         "status": {"allocatable": {"cpu": "2", "memory": "1Gi", "pods": "10"}}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
         "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "500m"}}}]}}]}
    path = tmp_path / "in.json"
    path.write_text(json.dumps(doc))
    run = subprocess.run(CLI + ["simulate", "-f", str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "default/p" in run.stdout and "Scheduled" in run.stdout and "cpu=500m" in run.stdout
