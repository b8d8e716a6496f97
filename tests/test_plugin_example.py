"""The worked example of docs/plugins.md: NodeLabel's Filter and Score as tables, its args'
validation, and the example profile (deploy/config/node-label.yaml) scheduling through
`shardsched simulate` as a user runs it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from builders import node, pod, run_filter, run_score, table_of
from forked_cli import run_cli
from shardsched.config import parse_config, parse_plugin_args
from shardsched.errors import ConfigError
from shardsched.plugins.nodelabel import plugin as nodelabel

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "deploy" / "config" / "node-label.yaml"


def plugin(**args):
    """NodeLabel built as the Framework builds it: args validated, then the factory."""
    return nodelabel.new(parse_plugin_args(nodelabel.NAME, args))


def cluster():
    return table_of(node("spot-ssd").with_labels({"example.com/spot": "true", "example.com/ssd": "true"}),
                    node("ssd").with_labels({"example.com/ssd": ""}),
                    node("plain"))


@pytest.mark.parametrize("args, passing", [
    ({}, {"spot-ssd", "ssd", "plain"}),
    ({"presentLabels": ["example.com/ssd"]}, {"spot-ssd", "ssd"}),
    ({"absentLabels": ["example.com/spot"]}, {"ssd", "plain"}),
    ({"presentLabels": ["example.com/ssd"], "absentLabels": ["example.com/spot"]}, {"ssd"}),
    ({"presentLabels": ["example.com/gpu"]}, set()),
], ids=["no-args", "present", "absent", "both", "nobody-has-it"])
def test_filter_keeps_nodes_with_the_present_and_without_the_absent_labels(args, passing):
    ok, reasons = run_filter(plugin(**args), pod(), cluster())
    assert ok == passing
    failed = 3 - len(passing)
    assert reasons == ({nodelabel.ERR_REASON: failed} if failed else {})


@pytest.mark.parametrize("args, scores", [
    ({}, None),
    ({"presentLabelsPreference": ["example.com/ssd"]}, {"spot-ssd": 100, "ssd": 100, "plain": 0}),
    ({"absentLabelsPreference": ["example.com/spot"]}, {"spot-ssd": 0, "ssd": 100, "plain": 100}),
    ({"presentLabelsPreference": ["example.com/ssd"], "absentLabelsPreference": ["example.com/spot"]},
     {"spot-ssd": 50, "ssd": 100, "plain": 50}),
    ({"presentLabelsPreference": ["example.com/ssd", "example.com/gpu", "example.com/spot"]},
     {"spot-ssd": 66, "ssd": 33, "plain": 0}),
], ids=["no-preferences-skips", "present", "absent", "averaged", "integer-division"])
def test_score_averages_the_preferences_met(args, scores):
    assert run_score(plugin(**args), pod(), cluster()) == scores


@pytest.mark.parametrize("args, message", [
    ({"presentLabels": ["example.com/a"], "absentLabels": ["example.com/b", "example.com/a"]},
     "profiles[0].pluginConfig[0].args.absentLabels[1]: label 'example.com/a' is also in the present list"),
    ({"absentLabelsPreference": ["a"], "presentLabelsPreference": ["a"]},
     "profiles[0].pluginConfig[0].args.absentLabelsPreference[0]: label 'a' is also in the present list"),
    ({"presentLabels": ["bad key"]}, "profiles[0].pluginConfig[0].args.presentLabels[0]: name part must be"),
    ({"presentLabel": ["a"]}, "profiles[0].pluginConfig[0].args.presentLabel"),
], ids=["present-and-absent", "both-preferences", "invalid-key", "unknown-field"])
def test_bad_args_are_an_error_naming_the_field(args, message):
    doc = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
           "profiles": [{"schedulerName": "s", "plugins": {"multiPoint": {"enabled": [{"name": "NodeLabel"}]}},
                         "pluginConfig": [{"name": "NodeLabel", "args": args}]}]}
    with pytest.raises(ConfigError) as err:
        parse_config(json.dumps(doc), "cfg.yaml")
    assert message in str(err.value)


def manifest(kind: str, name: str, labels: dict | None = None, scheduler: str | None = None) -> dict:
    if kind == "Node":
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}},
                "status": {"allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"}}}
    spec = {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": {"cpu": "1"}}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def simulate(tmp_path: Path, objects: list[dict]) -> dict:
    path = tmp_path / "in.yaml"
    path.write_text("\n---\n".join(json.dumps(o) for o in objects))
    run = run_cli(["simulate", "-f", str(path), "--config", str(PROFILE), "-o", "json"], timeout=120)
    assert run.returncode == 0, run.stderr
    return {p["name"]: p for p in json.loads(run.stdout)["pods"]}


def test_example_profile_keeps_its_pods_off_spot_nodes_and_prefers_ssd(tmp_path):
    """Two cores on each node, one per pod: the profile's pods fill the SSD node first, then the
    plain one, and never the spot node, which has an SSD and the most room; the fifth finds no node.
    A pod of the default profile may use the spot node."""
    nodes = [manifest("Node", "spot", {"example.com/spot": "true", "example.com/ssd": "true"}),
             manifest("Node", "ssd", {"example.com/ssd": "true"}),
             manifest("Node", "plain")]
    ours = [manifest("Pod", f"p{i}", scheduler="node-label-scheduler") for i in range(5)]
    out = simulate(tmp_path, nodes + ours + [manifest("Pod", "default-pod")])
    assert [out[f"p{i}"]["node"] for i in range(4)] == ["ssd", "ssd", "plain", "plain"]
    assert out["p4"]["status"] == "Unschedulable"
    # NodeLabel's rejection is UnschedulableAndUnresolvable: preemption does not look at that node
    assert out["p4"]["reason"] == ("0/3 nodes are available: 1 node(s) didn't have the requested labels, "
                                   "2 Insufficient cpu. preemption: 0/3 nodes are available: "
                                   "1 Preemption is not helpful for scheduling, "
                                   "2 No preemption victims found for incoming pod..")
    assert out["default-pod"]["node"] == "spot"


def test_example_profile_is_in_the_documentation():
    """docs/plugins.md shows the profile as it is in deploy/config."""
    text = (ROOT / "docs" / "plugins.md").read_text()
    body = PROFILE.read_text().split("apiVersion:", 1)[1]
    assert textwrap.dedent("apiVersion:" + body).strip() in text
