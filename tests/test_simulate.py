"""`shardsched simulate` end to end through the CLI, each command in a process of its own as users
run it: forked from a server that imported the CLI once (`forked_cli.run_cli`), but for the
terminal's progress bar, which runs ``python -m shardsched.cli.main`` in a pseudo-terminal."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from forked_cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
SHARED_CASES = ROOT.parent / "shared" / "simulate-cases"
CLI = [sys.executable, "-m", "shardsched.cli.main"]


def simulate(tmp_path: Path, manifests: str, *args: str, name: str = "in.yaml",
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    path = tmp_path / name
    path.write_text(textwrap.dedent(manifests))
    return run_cli(["simulate", "-f", str(path), *args], timeout=120, env=None if env is None else {**os.environ, **env})


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
                                    "reason": "Successfully assigned default/high to n1", "requests": {"cpu": 1000},
                                    "victims": [], "nominatedNode": None}
    assert pods["default/low"]["status"] == "Unschedulable"
    # kube's FitError with DefaultPreemption's part: nothing of lower priority to preempt on n1
    assert pods["default/low"]["reason"] == ("0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes "
                                             "are available: 1 No preemption victims found for incoming pod..")
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
    kind: ConfigMap
    metadata: {name: cm}
    """)
    run = simulate(tmp_path, manifests, "-o", "json")
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    assert "in.yaml#3: invalid Pod: spec.containers[0].resources.requests.cpu: invalid quantity 'abc'" in run.stderr
    assert "in.yaml#4: duplicate Pod 'default/ok'" in run.stderr
    assert "in.yaml#5: invalid Pod: spec.containers: a pod needs at least one container" in run.stderr
    assert "in.yaml#6: ignoring object of kind 'ConfigMap'" in run.stderr
    assert by_key(json.loads(run.stdout))["default/ok"]["node"] == "n1"


@pytest.mark.parametrize("content,expected", [
    ("foo: [\n", "line 2: invalid YAML"),
    ("- a\n- b\n", "expected a Kubernetes object, got list"),
], ids=["yaml-syntax", "not-an-object"])
def test_unreadable_files_exit_non_zero_with_a_message(tmp_path, content, expected):
    path = tmp_path / "x.yaml"
    path.write_text(content)
    run = run_cli(["simulate", "-f", str(path)], timeout=60)
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
    run = run_cli(["simulate", "-f", str(path)], timeout=60)
    assert run.returncode == 0, run.stderr
    assert "default/p" in run.stdout and "Scheduled" in run.stdout and "cpu=500m" in run.stdout


# ------------------------------------------------------------------ objects the API server would refuse

def raw_pod(meta: str, resources: str = "{}", spec_extra: str = "", kind: str = "Pod") -> str:
    """A Pod document with the given metadata and first-container resources (flow YAML)."""
    return f"""
    apiVersion: v1
    kind: {kind}
    metadata: {meta}
    spec:
      {spec_extra}
      containers: [{{name: c, image: registry.k8s.io/pause:3.10, resources: {resources}}}]
    ---"""


C0 = "spec.containers[0].resources"
#: (id, document, what stderr must say about it); each document is refused and left out.
INVALID = [
    ("unknown-priority-class", raw_pod("{name: pc}", spec_extra="priorityClassName: nope"),
     "invalid Pod: spec.priorityClassName: no PriorityClass with name 'nope' was found"),
    ("unqualified-resource", raw_pod("{name: foo}", "{requests: {foo: '1'}}"),
     f"invalid Pod: {C0}.requests.foo: 'foo' is not a resource a container can request"),
    ("request-above-limit", raw_pod("{name: over}", "{requests: {cpu: '2'}, limits: {cpu: '1'}}"),
     f"invalid Pod: {C0}.requests.cpu: 2 must be less than or equal to the cpu limit of 1"),
    ("extended-without-limit", raw_pod("{name: gpu-req}", "{requests: {example.com/gpu: '1'}}"),
     f"invalid Pod: {C0}.limits.example.com/gpu: a limit is required: example.com/gpu cannot be overcommitted"),
    ("extended-request-not-limit",
     raw_pod("{name: gpu-ne}", "{requests: {example.com/gpu: '1'}, limits: {example.com/gpu: '2'}}"),
     f"invalid Pod: {C0}.requests.example.com/gpu: 1 must equal the example.com/gpu limit of 2"),
    ("fractional-extended", raw_pod("{name: gpu-half}", "{limits: {example.com/gpu: 500m}}"),
     f"invalid Pod: {C0}.limits.example.com/gpu: 500m is not a whole number"),
    ("init-container",
     raw_pod("{name: init}", spec_extra="initContainers: [{name: i, image: x, resources: {requests: {bar: '1'}}}]"),
     "invalid Pod: spec.initContainers[0].resources.requests.bar: 'bar' is not a resource"),
    ("bad-pod-name", raw_pod("{name: Bad_Name}"),
     "invalid Pod: metadata.name: 'Bad_Name' is not a valid DNS-1123 subdomain"),
    ("bad-namespace", raw_pod("{name: ns, namespace: Team.A}"),
     "invalid Pod: metadata.namespace: 'Team.A' is not a valid DNS-1123 label"),
    ("pod-without-name", raw_pod("{namespace: default}"),
     "invalid Pod: metadata.name: name or generateName is required"),
    ("bad-generate-name", raw_pod("{generateName: Web_}"),
     "invalid Pod: metadata.generateName: names generated from it are invalid"),
    ("node-without-name", "\n    apiVersion: v1\n    kind: Node\n    metadata: {}\n    ---",
     "invalid Node: metadata.name: name or generateName is required"),
    ("bad-label-value", raw_pod("{name: lab, labels: {app: 'not valid!'}}"),
     "invalid Pod: metadata.labels.app: 'not valid!' is not a valid label value"),
    ("bad-label-key", raw_pod("{name: key, labels: {'bad key': x}}"),
     "invalid Pod: metadata.labels: key 'bad key': name part must be"),
    ("namespace-name-not-a-label", "\n    apiVersion: v1\n    kind: Namespace\n    metadata: {name: a.b}\n    ---",
     "invalid Namespace: metadata.name: 'a.b' is not a valid DNS-1123 label"),
    ("namespace-bad-label", "\n    apiVersion: v1\n    kind: Namespace\n    metadata: {name: ok, labels: {team: 'x y'}}\n    ---",
     "invalid Namespace: metadata.labels.team: 'x y' is not a valid label value"),
]


@pytest.fixture(scope="module")
def invalid_run(tmp_path_factory):
    """One run over a node, every INVALID document (documents 2, 3, ...) and a valid pod last (an
    extended resource given as a limit alone, which the API server accepts)."""
    gpu_node = node("n1").replace('pods: "110"', 'pods: "110", example.com/gpu: "1"')
    fine = raw_pod("{name: fine}", "{limits: {example.com/gpu: '1'}}")
    docs = gpu_node + "".join(doc for _, doc, _ in INVALID) + fine
    return simulate(tmp_path_factory.mktemp("invalid"), docs, "-o", "json")


@pytest.mark.parametrize("number, expected", [(i + 2, msg) for i, (_, _, msg) in enumerate(INVALID)],
                         ids=[case for case, _, _ in INVALID])
def test_refused_objects_are_named_and_left_out(invalid_run, number, expected):
    assert invalid_run.returncode == 2 and "Traceback" not in invalid_run.stderr
    lines = [line for line in invalid_run.stderr.splitlines() if f"in.yaml#{number}: " in line]
    assert any(expected in line for line in lines), invalid_run.stderr
    out = json.loads(invalid_run.stdout)
    assert [(p["name"], p["status"]) for p in out["pods"]] == [("fine", "Scheduled")]  # the rest still runs


def test_the_table_shows_names_and_reasons_as_written(tmp_path):
    """Text in square brackets (a gate list, a name) is printed as is, not read as table markup; a
    gate name that is not a qualified name is refused as the API server refuses it."""
    gated = pod("held", cpu="100m", spec_extra="schedulingGates: [{name: example.com/wait}, {name: bold}]")
    bad_gate = pod("odd", cpu="100m", spec_extra="schedulingGates: [{name: '[/x]'}]")
    run = simulate(tmp_path, node("n1") + gated + bad_gate, env={"COLUMNS": "250"})  # no wrapped cells
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "waiting for scheduling gates: [example.com/wait bold]" in run.stdout, run.stdout
    assert "spec.schedulingGates[0].name: '[/x]': " in run.stderr, run.stderr


def test_errors_come_in_document_order(invalid_run):
    numbers = [int(re.search(r"in\.yaml#(\d+)", line).group(1))
               for line in invalid_run.stderr.splitlines() if line.startswith("error:")]
    assert numbers == sorted(numbers) and numbers[0] == 2  # the priority error (found last) comes first


# ------------------------------------------------------------------ accepted as the API server would, with notes

PENDING_POD = pod("p", cpu="1")
#: (id, manifests, expected exit status, what stderr must say ("" for nothing), {pod: (status, node)}).
ACCEPTED = [
    ("generate-name", node("n1") + raw_pod("{generateName: web-}", "{requests: {cpu: '1'}}"), 0, "",
     {"web-*": ("Scheduled", "n1")}),
    ("bound-to-missing-node", node("n1") + pod("orphan", spec_extra="nodeName: ghost") + PENDING_POD, 0,
     "in.yaml#2: pod default/orphan is bound to node 'ghost', which is not in the input", {"p": ("Scheduled", "n1")}),
    ("bound-pod-overcommits", node("n1", cpu="2") + pod("big", cpu="3", spec_extra="nodeName: n1") + PENDING_POD, 0,
     "in.yaml#2: pod default/big is bound to node 'n1' but does not fit there: cpu requested 3, in use 0, "
     "allocatable 2; the kubelet would reject it (OutOfcpu)", {"p": ("Unschedulable", None)}),
    ("unknown-scheduler-name",
     node("n1") + pod("a", spec_extra="schedulerName: other") + pod("b", spec_extra="schedulerName: other"), 0,
     "2 pod(s) with schedulerName 'other', which no profile has: kube-scheduler would not schedule them",
     {"a": ("Scheduled", "n1"), "b": ("Scheduled", "n1")}),
    ("empty-file", "", 0, "in.yaml: the file holds no objects", {}),
]


@pytest.mark.parametrize("manifests, code, note, expected", [case[1:] for case in ACCEPTED],
                         ids=[case[0] for case in ACCEPTED])
def test_accepted_input_runs_and_says_what_a_cluster_would_do(tmp_path, manifests, code, note, expected):
    run = simulate(tmp_path, manifests, "-o", "json")
    assert run.returncode == code, run.stderr
    assert "Traceback" not in run.stderr and "error:" not in run.stderr
    assert ("warning: " in run.stderr and note in run.stderr) if note else run.stderr == ""
    got = {p["name"]: (p["status"], p["node"]) for p in json.loads(run.stdout)["pods"]}
    for name, want in expected.items():
        if name.endswith("*"):
            [name] = [n for n in got if re.fullmatch(rf"{name[:-1]}[bcdfghjklmnpqrstvwxz2456789]{{5}}", n)]
        assert got[name] == want, got
    assert len(got) == len(expected)


def test_generated_names_repeat_with_the_seed(tmp_path):
    manifests = node("n1") + raw_pod("{generateName: web-}") + raw_pod("{generateName: web-}")
    names = [[p["name"] for p in json.loads(simulate(tmp_path, manifests, "-o", "json", *seed).stdout)["pods"]]
             for seed in ([], [], ["--seed", "1"])]
    assert names[0] == names[1] and len(set(names[0])) == 2
    assert names[2] != names[0]


def test_node_allocatable_defaults_from_capacity_only_when_absent(tmp_path):
    nodes = ("\n    apiVersion: v1\n    kind: Node\n    metadata: {name: both}\n"
             "    status: {capacity: {cpu: '8', pods: '10'}, allocatable: {cpu: '2', pods: '10'}}\n    ---"
             "\n    apiVersion: v1\n    kind: Node\n    metadata: {name: cap}\n"
             "    status: {capacity: {cpu: '4', pods: '10'}}\n    ---")
    out = json.loads(simulate(tmp_path, nodes + pod("p", cpu="3"), "-o", "json").stdout)
    assert {n["name"]: n["allocatable"] for n in out["nodes"]} == {"both": {"cpu": 2000, "pods": 10},
                                                                   "cap": {"cpu": 4000, "pods": 10}}
    assert by_key(out)["default/p"]["node"] == "cap"


@pytest.mark.parametrize("content", ["", "# only a comment\n"], ids=["empty", "comment-only"])
def test_empty_config_file_is_an_error_naming_it(tmp_path, content):
    config = tmp_path / "c.yaml"
    config.write_text(content)
    run = simulate(tmp_path, node("n1") + pod("p"), "--config", str(config))
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert f"error: {config}: no KubeSchedulerConfiguration document" in run.stderr


# Claims that do not exist (the volume plugins), a constraint of a plugin shardsched does not
# implement (DynamicResources), scheduling gates, and pod
# (anti-)affinity and spread constraints: one run with kube's default profile, one with a profile
# that disables those plugins. (pod name, spec, outcome with the default profile; with the
# disabling profile every pod is placed.) Every pod is labelled app=w: hard-spread and w1 take the
# two nodes, so w2 and both find an app=w pod on each; w1's term also keeps later pods off its node
# (kube's symmetric rule), so soft-anti and empty-dir go to hard-spread's node.
ANTI_TERM = "{labelSelector: {matchLabels: {app: w}}, topologyKey: kubernetes.io/hostname}"
# a pod's own anti-affinity is checked before the existing pods' (upstream Filter's order)
ANTI = ("0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules. preemption: 0/2 nodes are "
        "available: 2 No preemption victims found for incoming pod..")
#: DefaultPreemption's part of the message of a pod that a PreFilter refused on every node
NOT_HELPFUL = " preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.."
CONSTRAINED = [
    ("pvc", "volumes: [{name: data, persistentVolumeClaim: {claimName: data}}, {name: tmp, emptyDir: {}}]",
     ("Unschedulable", '0/2 nodes are available: persistentvolumeclaim "data" not found.' + NOT_HELPFUL)),
    ("ephemeral", "volumes: [{name: scratch, ephemeral: {volumeClaimTemplate: {spec: {accessModes: [ReadWriteOnce], "
                  "resources: {requests: {storage: 1Gi}}}}}}]",
     ("Unschedulable", '0/2 nodes are available: persistentvolumeclaim "ephemeral-scratch" not found.'
      + NOT_HELPFUL)),
    ("dra", "resourceClaims: [{name: gpu, resourceClaimTemplateName: gpu-template}]",
     ("Unschedulable", "0/2 nodes are available: pod has resource claims of Dynamic Resource Allocation (gpu), "
                       "which shardsched does not implement (plugin DynamicResources)." + NOT_HELPFUL)),
    ("gated", "schedulingGates: [{name: example.com/quota}, {name: example.com/ready}]",
     ("Gated", "waiting for scheduling gates: [example.com/quota example.com/ready]")),
    ("hard-spread", "topologySpreadConstraints: [{maxSkew: 1, topologyKey: kubernetes.io/hostname, "
                    "whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: w}}}]", ("Scheduled", "")),
    ("w1", f"affinity: {{podAntiAffinity: {{requiredDuringSchedulingIgnoredDuringExecution: [{ANTI_TERM}]}}}}",
     ("Scheduled", "")),
    ("w2", f"affinity: {{podAntiAffinity: {{requiredDuringSchedulingIgnoredDuringExecution: [{ANTI_TERM}]}}}}",
     ("Unschedulable", ANTI)),
    ("both", f"affinity: {{podAffinity: {{requiredDuringSchedulingIgnoredDuringExecution: [{ANTI_TERM}]}}, "
             f"podAntiAffinity: {{requiredDuringSchedulingIgnoredDuringExecution: [{ANTI_TERM}]}}}}",
     ("Unschedulable", ANTI)),
    # w1's term keeps these off its node; hard-spread's node has no such term
    ("soft-anti", "affinity: {podAntiAffinity: {preferredDuringSchedulingIgnoredDuringExecution: "
                  f"[{{weight: 10, podAffinityTerm: {ANTI_TERM}}}]}}}}", ("Scheduled", "")),
    ("empty-dir", "volumes: [{name: tmp, emptyDir: {}}]", ("Scheduled", "")),
]
DISABLING_CONFIG = """\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- plugins:
    multiPoint:
      disabled: [{name: InterPodAffinity}, {name: VolumeBinding}, {name: DynamicResources}, {name: VolumeRestrictions},
                 {name: VolumeZone}, {name: NodeVolumeLimits}]
    filter:
      disabled: [{name: PodTopologySpread}]
    preEnqueue:
      disabled: [{name: SchedulingGates}]
"""


@pytest.fixture(scope="module")
def constrained_runs(tmp_path_factory) -> dict[str, dict]:
    """``simulate -o json`` of the CONSTRAINED pods on two nodes, by profile: kube's default, and
    one that disables the plugins; pod key -> outcome."""
    tmp = tmp_path_factory.mktemp("constrained")
    manifests = node("a1") + node("b1") + "".join(
        pod(name, cpu="100m", spec_extra=spec, meta_extra=", labels: {app: w}") for name, spec, _ in CONSTRAINED)
    config = tmp / "disabling.yaml"
    config.write_text(DISABLING_CONFIG)
    out = {}
    for profile, args in (("default", ()), ("disabling", ("--config", str(config)))):
        run = simulate(tmp, manifests, "-o", "json", *args)
        assert run.returncode == 0, run.stderr
        out[profile] = by_key(json.loads(run.stdout))
    return out


PLACED = ("Scheduled", "")
CONSTRAINED_CASES = [("default", name, outcome) for name, _, outcome in CONSTRAINED] + [
    ("disabling", name, PLACED) for name, _, _ in CONSTRAINED]  # as kube-scheduler: not looked at


@pytest.mark.parametrize("profile,name,outcome", CONSTRAINED_CASES,
                         ids=[f"{profile}-{name}" for profile, name, _ in CONSTRAINED_CASES])
def test_constraints_are_kept_or_refused_never_breached(constrained_runs, profile, name, outcome):
    """With kube's default profile, a pod needing what shardsched does not implement is refused
    (or gated), never placed in breach, and pod (anti-)affinity and spread constraints hold. A
    profile that disables those plugins places every pod, as kube-scheduler would with them
    disabled."""
    status, reason = outcome
    got = constrained_runs[profile][f"default/{name}"]
    assert got["status"] == status
    if status == "Scheduled":
        assert got["node"] in ("a1", "b1")
    else:
        assert (got["node"], got["reason"]) == (None, reason)


DRA_POD = """
    apiVersion: v1
    kind: Pod
    metadata: {name: %s}
    spec:
      resourceClaims: [{name: gpu, resourceClaimTemplateName: single-gpu}]
      containers:
      - {name: c, image: registry.k8s.io/pause:3.10, resources: {requests: {cpu: 100m}, claims: [{name: %s}]}}
    ---"""


def test_a_pod_with_resource_claims_is_held_with_the_plugins_name(tmp_path):
    """Dynamic Resource Allocation (on by default since kube 1.34): on a cluster without devices
    kube-scheduler keeps the pod pending; shardsched, which does not allocate claims, holds it
    with the plugin's name instead of placing it. A container claim naming no pod claim is refused
    as the API server refuses it (exit 2), the rest still simulated."""
    run = simulate(tmp_path, node("n1") + DRA_POD % ("trainer", "gpu") + DRA_POD % ("typo", "gpus") + pod("plain"),
                   "-o", "json")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert (f"{tmp_path / 'in.yaml'}#3: invalid Pod: spec.containers[0].resources.claims[0]: 'gpus' not found: "
            "must be one of the names in pod.spec.resourceClaims: gpu") in run.stderr
    out = by_key(json.loads(run.stdout))
    assert set(out) == {"default/trainer", "default/plain"}
    assert (out["default/trainer"]["status"], out["default/trainer"]["reason"]) == (
        "Unschedulable", "0/1 nodes are available: pod has resource claims of Dynamic Resource Allocation (gpu), "
                         "which shardsched does not implement (plugin DynamicResources). preemption: 0/1 nodes are "
                         "available: 1 Preemption is not helpful for scheduling..")
    assert out["default/plain"]["status"] == "Scheduled"


def test_a_document_nested_too_deeply_is_an_error_not_a_traceback(tmp_path):
    """YAML nested deeper than the parser's stack: the file is reported and left out (exit 2), the
    other files still run."""
    deep = tmp_path / "deep.yaml"
    deep.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: deep}\nspec:\n  containers: [{name: c, image: x}]\n"
                    "  affinity: " + "[" * 5000 + "]" * 5000 + "\n")
    run = simulate(tmp_path, node("n1") + pod("p", cpu="100m"), "-f", str(deep), "-o", "json")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert f"{deep}: nested too deeply to be read" in run.stderr
    assert [p["status"] for p in json.loads(run.stdout)["pods"]] == ["Scheduled"]


# ------------------------------------------------------------------ how files are read, as kubectl
def write_bytes(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


NODE_AND_POD = textwrap.dedent(node("n1") + pod("café-free", cpu="100m")).replace("café-free", "p")


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32", "utf-8-sig"],
                         ids=["utf16-le-bom", "utf16-be-bom", "utf32-bom", "utf8-bom"])
def test_a_manifest_with_a_byte_order_mark_is_read_in_its_encoding(tmp_path, encoding):
    """kubectl reads UTF-8, and UTF-16 (here also UTF-32) when a byte order mark says so."""
    data = NODE_AND_POD.encode(encoding)
    if encoding == "utf-16-be":
        data = b"\xfe\xff" + data
    path = write_bytes(tmp_path, "in.yaml", data)
    run = run_cli(["simulate", "-f", str(path), "-o", "json"], timeout=120)
    assert run.returncode == 0, run.stderr
    assert [(p["name"], p["status"]) for p in json.loads(run.stdout)["pods"]] == [("p", "Scheduled")]


@pytest.mark.parametrize("data, message", [
    (NODE_AND_POD.replace("name: p,", "name: p, labels: {owner: José},").encode("latin-1"),
     "not UTF-8 text (byte 0xe9 at offset "),
    (NODE_AND_POD.encode("utf-16-le"), "not text: it holds NUL bytes (UTF-16 or UTF-32 without a byte order mark?)"),
], ids=["latin1", "utf16-without-bom"])
def test_a_manifest_in_another_encoding_is_named_and_the_other_files_still_run(tmp_path, data, message):
    bad = write_bytes(tmp_path, "bad.yaml", data)
    run = simulate(tmp_path, node("n1") + pod("ok", cpu="100m"), "-f", str(bad), "-o", "json")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    [line] = [ln for ln in run.stderr.splitlines() if str(bad) in ln]
    assert line.startswith(f"error: {bad}: cannot read: {message}")
    assert "save it as UTF-8" in line
    assert [(p["name"], p["status"]) for p in json.loads(run.stdout)["pods"]] == [("ok", "Scheduled")]


def test_a_missing_file_is_fatal_in_kubectls_words(tmp_path):
    """As ``kubectl apply -f``: nothing is simulated (no empty tables), exit status 1."""
    missing = tmp_path / "nope.yaml"
    run = simulate(tmp_path, node("n1") + pod("p"), "-f", str(missing))
    assert (run.returncode, run.stdout) == (1, "")
    assert run.stderr == f'error: the path "{missing}" does not exist\n'


def test_an_object_without_kind_says_so(tmp_path):
    run = simulate(tmp_path, node("n1") + "\n    apiVersion: v1\n    metadata: {name: what}\n    ---" + pod("p"),
                   "-o", "json")
    assert run.returncode == 2
    assert (f"error: {tmp_path / 'in.yaml'}#2: object has no kind: every object needs apiVersion and kind "
            "(kind: Pod, Node, ...)") in run.stderr
    assert "None" not in run.stderr


def test_a_null_quantity_is_zero_as_the_api_server_reads_it(tmp_path):
    """``memory: null`` decodes to a zero Quantity in the API server: the pod is taken, with a
    warning, and no schema internals are shown."""
    spec = "containers: [{name: c, image: x, resources: {requests: {cpu: 500m, memory: null}}}]"
    manifest = node("n1") + f"""
    apiVersion: v1
    kind: Pod
    metadata: {{name: nullmem}}
    spec: {{{spec}}}
    ---"""
    run = simulate(tmp_path, manifest, "-o", "json")
    assert run.returncode == 0, run.stderr
    assert run.stderr == (f"warning: {tmp_path / 'in.yaml'}#2: spec.containers[0].resources.requests.memory: null "
                          "is read as 0, as the API server reads a null quantity\n")
    [p] = json.loads(run.stdout)["pods"]
    assert (p["status"], p["requests"]) == ("Scheduled", {"cpu": 500})


def test_libyaml_reads_what_the_python_loader_reads():
    """The fast loader (libyaml) gives the same objects as ``yaml.safe_load_all``: anchors, merge
    keys, YAML 1.1 scalars, several documents."""
    import yaml

    from shardsched.api.manifests import load_yaml_documents

    text = textwrap.dedent("""\
        base: &b {cpu: 1, on: yes, when: 2026-12-01, mode: 0755}
        pod: {<<: *b, cpu: 2, list: [*b, ~, 1e3, .inf]}
        ---
        - !!str 12
        - "esc\\u00e9"
        """)
    assert load_yaml_documents(text) == list(yaml.safe_load_all(text))


def test_without_a_terminal_the_table_does_not_wrap_at_80_columns(tmp_path):
    """Off a terminal (no $COLUMNS) the table is laid out on 160 columns, not rich's 80, so a
    row of a usual pod name stays on one line."""
    name = "checkout-api-7d9f8b6c5d-x2k4p"
    (tmp_path / "in.yaml").write_text(textwrap.dedent(node("n1") + pod(name, cpu="100m")))
    run = run_cli(["simulate", "-f", str(tmp_path / "in.yaml")], timeout=120,
                  env={k: v for k, v in os.environ.items() if k != "COLUMNS"})
    assert run.returncode == 0, run.stderr
    assert f"Successfully assigned default/{name} to n1" in run.stdout
    assert 80 < max(len(line) for line in run.stdout.splitlines()) <= 160


def test_progress_shows_on_a_terminal_only(tmp_path):
    """A progress bar on stderr when it is a terminal and the output a table; on a pipe, or with
    ``-o json``, stderr holds only what the input calls for."""
    import pty

    path = tmp_path / "in.yaml"
    path.write_text(textwrap.dedent(node("n1") + pod("p", cpu="100m")))
    out = {}
    for mode in ("table", "json"):
        leader, follower = pty.openpty()
        with os.fdopen(leader, "rb", buffering=0) as tty:
            run = subprocess.run(CLI + ["simulate", "-f", str(path), "-o", mode], stdout=subprocess.PIPE,
                                 stderr=follower, timeout=120, env={**os.environ, "TERM": "xterm"})
            os.close(follower)
            chunks = []
            try:
                while chunk := tty.read(4096):
                    chunks.append(chunk)
            except OSError:  # EIO: the writer's side is closed
                pass
        assert run.returncode == 0
        out[mode] = b"".join(chunks).decode(errors="replace")
    assert "placing pods" in out["table"]
    assert out["json"] == ""
    piped = simulate(tmp_path, node("n1") + pod("p", cpu="100m"))
    assert piped.returncode == 0 and piped.stderr == ""


def test_a_config_with_two_mistakes_names_both_with_the_closest_names(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(textwrap.dedent("""\
        apiVersion: kubescheduler.config.k8s.io/v1
        kind: KubeSchedulerConfiguration
        percentageOfNodesToScor: 50
        profiles:
        - plugins:
            filter:
              enabled: [{name: NodeAfinity}]
        """))
    run = simulate(tmp_path, node("n1") + pod("p"), "--config", str(config))
    assert (run.returncode, run.stdout) == (1, "")
    lines = run.stderr.splitlines()
    assert lines[0] == f"error: {config}: percentageOfNodesToScor: unknown field (did you mean percentageOfNodesToScore?)"
    assert lines[1].startswith(f"error: {config}: profiles[0].plugins.filter.enabled[0].name: unknown plugin "
                               "'NodeAfinity' (did you mean NodeAffinity?)")
    assert len(lines) == 2


def test_host_network_ports_are_host_ports_as_the_api_server_defaults_them(tmp_path):
    """With ``hostNetwork: true`` a container port is a host port (the API server sets hostPort
    to containerPort on create): two such pods on one node would both listen on 9100, so the
    second is refused by NodePorts, as kube-scheduler refuses it."""
    spec = ("hostNetwork: true\n      containers: [{name: c, image: x, ports: [{containerPort: 9100}], "
            "resources: {requests: {cpu: 100m}}}]")
    manifest = node("n1") + "".join(f"""
    apiVersion: v1
    kind: Pod
    metadata: {{name: exporter-{i}}}
    spec:
      {spec}
    ---""" for i in (1, 2))
    run = simulate(tmp_path, manifest, "-o", "json")
    assert run.returncode == 0, run.stderr
    out = by_key(json.loads(run.stdout))
    assert out["default/exporter-1"]["status"] == "Scheduled"
    assert out["default/exporter-2"]["status"] == "Unschedulable"
    # then DefaultPreemption's words: no victim frees the port
    assert out["default/exporter-2"]["reason"].startswith(
        "0/1 nodes are available: 1 node(s) didn't have free ports for the requested pod ports. preemption: ")


@pytest.mark.parametrize("existing, term, status", [
    ("{app: w, rev: '1'}", "labelSelector: {matchLabels: {app: w}}, matchLabelKeys: [rev]", "Scheduled"),
    ("{app: w, rev: '2'}", "labelSelector: {matchLabels: {app: w}}, matchLabelKeys: [rev]", "Unschedulable"),
    ("{app: w, tenant: b}", "labelSelector: {matchLabels: {app: w}}, mismatchLabelKeys: [tenant]", "Unschedulable"),
    ("{app: w, tenant: a}", "labelSelector: {matchLabels: {app: w}}, mismatchLabelKeys: [tenant]", "Scheduled"),
], ids=["match-other-revision", "match-same-revision", "mismatch-other-tenant", "mismatch-same-tenant"])
def test_pod_affinity_label_keys_narrow_the_selector(tmp_path, existing, term, status):
    """A term's matchLabelKeys / mismatchLabelKeys join its labelSelector with the pod's own
    values (key In / key NotIn), as the API server merges them on create: an anti-affinity to the
    pods of the same revision leaves a node holding another revision's pod free."""
    manifest = node("n1") + f"""
    apiVersion: v1
    kind: Pod
    metadata: {{name: old, labels: {existing}}}
    spec: {{nodeName: n1, containers: [{{name: c, image: x}}]}}
    ---
    apiVersion: v1
    kind: Pod
    metadata: {{name: new, labels: {{app: w, rev: '2', tenant: a}}}}
    spec:
      affinity: {{podAntiAffinity: {{requiredDuringSchedulingIgnoredDuringExecution: [{{topologyKey: kubernetes.io/hostname, {term}}}]}}}}
      containers: [{{name: c, image: x}}]
    ---"""
    run = simulate(tmp_path, manifest, "-o", "json")
    assert run.returncode == 0, run.stderr
    assert by_key(json.loads(run.stdout))["default/new"]["status"] == status
