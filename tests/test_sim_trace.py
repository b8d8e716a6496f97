"""Alibaba GPU trace v2023 loader and replay, on a verbatim slice (tests/data/alibaba-slice) and on
small hand-written files for the row rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardsched.api import NodeInfo, PodInfo
from shardsched.sim import SimCluster, TraceError, TraceReplay, load_nodes, load_pods
from shardsched.sim.trace import (CREATE, DELETE, GPU_MILLI_RESOURCE, GPU_MODEL_LABEL, GPU_RESOURCE, MIN_REPLAY_LIFETIME_S,
                                  QOS_LABEL, REPLAY_BIND_WAIT_S, TracePod, replay_compression)

SLICE = Path(__file__).parent / "data" / "alibaba-slice"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"


def write(tmp_path: Path, header: str, *rows: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join((header, *rows)) + "\n")
    return path


def pod_row(name="p-1", cpu=1000, mem=1024, num_gpu=0, gpu_milli=0, spec="", qos="LS", created=10, deleted=20):
    return f"{name},{cpu},{mem},{num_gpu},{gpu_milli},{spec},{qos},Running,{created},{deleted},{created}"


# ------------------------------------------------------------------------------------------ nodes

def test_slice_nodes():
    nodes, report = load_nodes(SLICE / "openb_node_list_all_node.csv")
    assert (report.rows, report.loaded, report.skipped) == (140, 140, [])
    by_name = {n["metadata"]["name"]: n for n in nodes}
    cpu_node = by_name["openb-node-0000"]  # 32000,262144,0,
    assert cpu_node["status"]["allocatable"] == {"cpu": "32000m", "memory": "262144Mi", "pods": "110"}
    assert GPU_MODEL_LABEL not in cpu_node["metadata"]["labels"]
    gpu_nodes = [n for n in nodes if GPU_RESOURCE in n["status"]["allocatable"]]
    assert len(gpu_nodes) == 17
    info = NodeInfo.from_object(gpu_nodes[0])
    assert info.allocatable[GPU_RESOURCE] == 2 and info.allocatable[GPU_MILLI_RESOURCE] == 2000
    assert info.labels[GPU_MODEL_LABEL] == "P100"


# ------------------------------------------------------------------------------------------- pods

def test_slice_pods():
    pods, report = load_pods(SLICE / "openb_pod_list_default.csv")
    assert (report.rows, report.loaded, report.skipped) == (300, 300, [])
    first = pods[0]  # openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0
    assert (first.creation_time_s, first.deletion_time_s) == (0.0, 12537496.0)
    info = PodInfo.from_object(first.pod)
    assert info.requests == {"cpu": 12000, "memory": 16384 * 2**20, GPU_RESOURCE: 1, GPU_MILLI_RESOURCE: 1000, "pods": 1}
    assert info.labels == {QOS_LABEL: "LS"} and info.scheduler_name == "shardsched"
    assert all(p.deletion_time_s >= p.creation_time_s for p in pods)


def test_multigpu_file_without_times():
    pods, report = load_pods(SLICE / "openb_pod_list_multigpu50.csv")
    assert (report.loaded, report.skipped) == (50, [])
    assert {(p.creation_time_s, p.deletion_time_s) for p in pods} == {(0.0, None)}
    assert "labels" not in pods[0].pod["metadata"]


@pytest.mark.parametrize(
    "num_gpu, gpu_milli, expected",
    [
        (0, 0, {}),
        (1, 1000, {GPU_RESOURCE: 1, GPU_MILLI_RESOURCE: 1000}),
        (8, 1000, {GPU_RESOURCE: 8, GPU_MILLI_RESOURCE: 8000}),
        (1, 460, {GPU_MILLI_RESOURCE: 460}),
        (1, 1, {GPU_MILLI_RESOURCE: 1}),
    ],
    ids=["cpu-only", "one-gpu", "eight-gpus", "shared-gpu", "smallest-share"],
)
def test_gpu_rule(tmp_path, num_gpu, gpu_milli, expected):
    [tp], report = load_pods(write(tmp_path, POD_HEADER, pod_row(num_gpu=num_gpu, gpu_milli=gpu_milli)))
    assert report.skipped == []
    resources = tp.pod["spec"]["containers"][0]["resources"]
    assert {k: v for k, v in PodInfo.from_object(tp.pod).requests.items() if k not in ("cpu", "memory", "pods")} == expected
    assert resources.get("limits", {}) == {k: str(v) for k, v in expected.items()}, "extended resources: limits = requests"


def test_gpu_spec_and_qos(tmp_path):
    [tp], _ = load_pods(write(tmp_path, POD_HEADER, pod_row(num_gpu=1, gpu_milli=1000, spec="V100M32|T4", qos="BE")))
    info = PodInfo.from_object(tp.pod)
    [term] = info.required_terms
    assert term.match_expressions == ((GPU_MODEL_LABEL, "In", ("T4", "V100M32")),)
    assert info.labels == {QOS_LABEL: "BE"}


@pytest.mark.parametrize(
    "row, message",
    [
        (pod_row(cpu="x"), "cpu_milli 'x' is not an integer"),
        (pod_row(mem=-5), "memory_mib -5 is negative"),
        (pod_row(mem=2**50), f"memory_mib {2**50} is implausibly large"),
        (pod_row(num_gpu=0, gpu_milli=500), "gpu_milli 500 without num_gpu"),
        (pod_row(num_gpu=2, gpu_milli=500), "needs num_gpu 1, got 2"),
        (pod_row(num_gpu=1, gpu_milli=0), "gpu_milli 0 is not in 1..1000"),
        (pod_row(num_gpu=1, gpu_milli=1500), "gpu_milli 1500 is not in 1..1000"),
        (pod_row(created=30, deleted=20), "deletion_time 20 is before creation_time 30"),
        (pod_row(created=""), "creation_time '' is not a number"),
        (pod_row(created="nan"), "creation_time 'nan' is not a time >= 0"),
        (pod_row(spec="|"), "gpu_spec '|' names no GPU model"),
        (pod_row(spec="V100 M16"), "gpu_spec 'V100 M16' is not a valid label value"),
        (pod_row(name="Bad_Name"), "'Bad_Name' is not a valid DNS-1123 subdomain"),
        (pod_row() + ",extra", "expected 11 fields, got 12"),
        (pod_row(name="p-0"), "duplicate name 'p-0' (first at line 2)"),
    ],
    ids=["cpu-not-int", "negative-memory", "huge-memory", "milli-without-gpu", "shared-multi-gpu", "gpu-without-milli",
         "milli-above-1000", "deleted-before-created", "no-creation-time", "nan-time", "empty-gpu-spec",
         "bad-gpu-model", "bad-name", "extra-field", "duplicate"],
)
def test_malformed_pod_rows_are_skipped_with_a_message(tmp_path, row, message):
    path = write(tmp_path, POD_HEADER, pod_row(name="p-0"), row, pod_row(name="p-9"))
    pods, report = load_pods(path)
    assert [p.pod["metadata"]["name"] for p in pods] == ["p-0", "p-9"]
    assert (report.rows, report.loaded) == (3, 2)
    [skipped] = report.skipped
    assert skipped.startswith("trace.csv:3: ") and message in skipped


def test_empty_deletion_time_means_never(tmp_path):
    [tp], _ = load_pods(write(tmp_path, POD_HEADER, pod_row(deleted="")))
    assert (tp.creation_time_s, tp.deletion_time_s) == (10.0, None)


@pytest.mark.parametrize(
    "row, message",
    [
        ("n-1,8000,x,0,", "memory_mib 'x' is not an integer"),
        ("n-1,8000,1024,-1,", "gpu -1 is negative"),
        ("n-1,8000,1024", "expected 5 fields, got 3"),
        ("N 1,8000,1024,0,", "'N 1' is not a valid DNS-1123 subdomain"),
    ],
    ids=["memory-not-int", "negative-gpu", "short-row", "bad-name"],
)
def test_malformed_node_rows_are_skipped_with_a_message(tmp_path, row, message):
    nodes, report = load_nodes(write(tmp_path, NODE_HEADER, "n-0,8000,1024,2,T4", row))
    assert [n["metadata"]["name"] for n in nodes] == ["n-0"]
    [skipped] = report.skipped
    assert skipped.startswith("trace.csv:3: ") and message in skipped


@pytest.mark.parametrize(
    "loader, content, message",
    [
        (load_pods, None, "cannot read the trace: No such file or directory"),
        (load_pods, NODE_HEADER + "\n", "header lacks column(s) name, num_gpu, gpu_milli"),
        (load_pods, "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time\n", "header lacks column(s) deletion_time"),
        (load_nodes, POD_HEADER + "\n", "header lacks column(s) sn, gpu, model"),
        (load_nodes, "", "found an empty file"),
    ],
    ids=["missing-file", "node-file-as-pods", "half-the-times", "pod-file-as-nodes", "empty"],
)
def test_unreadable_files_raise_one_error(tmp_path, loader, content, message):
    path = tmp_path / "trace.csv"
    if content is not None:
        path.write_text(content)
    with pytest.raises(TraceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        loader(path)


# ----------------------------------------------------------------------------------------- replay

def _tp(name: str, created: float, deleted: float | None) -> TracePod:
    return TracePod(created, deleted, {"metadata": {"name": name}})


def test_replay_order_shift_and_scale():
    replay = TraceReplay([_tp("b", 300, 500), _tp("a", 100, 300), _tp("z", 200, 200), _tp("forever", 100, None)],
                         time_scale=100)
    steps = [(s.due_s, s.action, s.pod["metadata"]["name"]) for s in replay]
    assert steps == [
        (0.0, CREATE, "a"),
        (0.0, CREATE, "forever"),
        (1.0, CREATE, "z"),
        (1.0, DELETE, "z"),  # a zero-lifetime pod is created before it is deleted
        (2.0, DELETE, "a"),  # deletions before creations at the same time
        (2.0, CREATE, "b"),
        (4.0, DELETE, "b"),
    ]
    assert len(replay) == 7


def test_replay_shortens_pauses_and_keeps_the_order():
    """``max_pause_s``: each pause between consecutive steps (after dividing by the scale) is at
    most that; the steps' order is the uniform replay's."""
    pods = [_tp("b", 300, 500), _tp("a", 100, 300), _tp("z", 200, 200), _tp("late", 10_000, 10_050)]
    replay = TraceReplay(pods, time_scale=100, max_pause_s=1.5)
    steps = [(s.due_s, s.action, s.pod["metadata"]["name"]) for s in replay]
    assert steps == [
        (0.0, CREATE, "a"),
        (1.0, CREATE, "z"),
        (1.0, DELETE, "z"),
        (2.0, DELETE, "a"),
        (2.0, CREATE, "b"),
        (3.5, DELETE, "b"),  # 2 s after the previous step, shortened to 1.5
        (5.0, CREATE, "late"),  # 95 s, shortened to 1.5
        (5.5, DELETE, "late"),
    ]
    assert [s[1:] for s in steps] == [(s.action, s.pod["metadata"]["name"]) for s in TraceReplay(pods, time_scale=100)]


@pytest.mark.parametrize("kwargs", [{"time_scale": 0}, {"time_scale": -1}, {"max_pause_s": 0}],
                         ids=["zero-scale", "negative-scale", "zero-pause"])
def test_replay_rejects_bad_time_scale(kwargs):
    with pytest.raises(ValueError):
        TraceReplay([], **kwargs)


def test_the_default_compression_lets_every_pod_of_the_slice_live_long_enough_to_be_scheduled():
    """The slice spans 149 days with lifetimes from 5 s: the default divides time by 5 s over
    `MIN_REPLAY_LIFETIME_S` and shortens every pause to it, so each pod lives at least that long
    in the replay and the whole replay takes minutes (at most that per distinct step time); a
    given scale is uniform."""
    pods, _ = load_pods(SLICE / "openb_pod_list_default.csv")
    plan = replay_compression(pods)
    assert plan.shortest_lifetime_s == 5.0
    assert plan.time_scale == pytest.approx(5.0 / MIN_REPLAY_LIFETIME_S) and plan.max_pause_s == MIN_REPLAY_LIFETIME_S
    assert plan.bind_wait_s == REPLAY_BIND_WAIT_S
    times = {t for c, d, _ in pods for t in (c, d)}
    assert 60 < plan.duration_s <= (len(times) - 1) * MIN_REPLAY_LIFETIME_S
    created: dict[str, float] = {}
    lives = []
    replay = TraceReplay(pods, plan.time_scale, plan.max_pause_s)
    for step in replay:
        name = step.pod["metadata"]["name"]
        if step.action == CREATE:
            created[name] = step.due_s
        else:
            lives.append(step.due_s - created[name])
    assert len(lives) == 300 and min(lives) >= MIN_REPLAY_LIFETIME_S * (1 - 1e-9)
    assert replay.steps[-1].due_s == pytest.approx(plan.duration_s)

    uniform = replay_compression(pods, time_scale=1000.0)
    assert (uniform.time_scale, uniform.max_pause_s, uniform.bind_wait_s) == (1000.0, None, None)
    assert uniform.duration_s == pytest.approx(12_902_960 / 1000)


@pytest.mark.parametrize("pods, scale, pause", [
    ([_tp("a", 0, 30), _tp("b", 10, 12)], 2 / MIN_REPLAY_LIFETIME_S, MIN_REPLAY_LIFETIME_S),
    ([_tp("a", 0, None), _tp("b", 50, None)], 1.0, MIN_REPLAY_LIFETIME_S),
    ([_tp("a", 0, 0), _tp("b", 7, 7)], 1.0, MIN_REPLAY_LIFETIME_S),
], ids=["shortest-lifetime", "never-deleted", "zero-lifetimes"])
def test_the_default_compression_follows_the_shortest_positive_lifetime(pods, scale, pause):
    plan = replay_compression(pods)
    assert (plan.time_scale, plan.max_pause_s) == (pytest.approx(scale), pause)


@pytest.mark.parametrize("kwargs", [{"time_scale": 0}, {"min_lifetime_s": 0}], ids=["scale", "lifetime"])
def test_replay_compression_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        replay_compression([_tp("a", 0, 1)], **kwargs)


def test_slice_replays_into_the_sim_cluster():
    nodes, _ = load_nodes(SLICE / "openb_node_list_all_node.csv")
    pods, _ = load_pods(SLICE / "openb_pod_list_default.csv")
    c = SimCluster()
    c.create_nodes(nodes)
    for step in TraceReplay(pods[:40], time_scale=1000):
        if step.action == CREATE:
            c.create_pod(step.pod)
    assert len(c.list_pods()[0]) == 40
    cpu_node, gpu_node = "openb-node-0000", "openb-node-0123"  # 32 cores / no GPU; 64 cores / 2x P100
    requests = {p.pod["metadata"]["name"]: p.pod["spec"]["containers"][0]["resources"]["requests"] for p in pods[:40]}
    shared = [name for name, reqs in requests.items() if GPU_MILLI_RESOURCE in reqs and GPU_RESOURCE not in reqs]
    # A GPU pod on a node without GPUs: rejected on the first extended resource, by name.
    r = c.bind("default", shared[0], cpu_node)
    assert (r.phase, r.reason) == ("Failed", f"OutOf{GPU_MILLI_RESOURCE}")
    # Shared pods fill the node's 2000 gpu-milli in aggregate, without taking a whole nvidia.com/gpu.
    results = {name: c.bind("default", name, gpu_node) for name in shared[1:]}
    running = [name for name, r in results.items() if r.phase == "Running"]
    assert {r.reason for r in results.values() if r.phase == "Failed"} == {f"OutOf{GPU_MILLI_RESOURCE}"}
    milli = sum(int(requests[name][GPU_MILLI_RESOURCE]) for name in running)
    assert len(running) >= 4 and 1500 < milli <= 2000
    assert c.requested(gpu_node)[GPU_MILLI_RESOURCE] == milli and GPU_RESOURCE not in c.requested(gpu_node)
    assert c.invariants()["overcommitted_nodes"] == []
