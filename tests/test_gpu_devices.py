"""GPU devices per node: the NodeTable's device columns, the GPUDevice plugin's Filter and scores,
and the scheduler recording the devices of a placement."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsched.cache.devices import (
    GPU_MILLI_RESOURCE, GPU_RESOURCE, MILLI, DeviceRequest, device_request, format_devices, parse_devices,
)
from shardsched.cache.node_table import PodUsage
from shardsched.config.args import parse_plugin_args
from shardsched.framework.runtime import Framework
from shardsched.plugins.gpudevice import plugin as gpudevice
from shardsched.plugins.gpudevice import scoring
from shardsched.plugins.gpudevice.plugin import NO_DEVICES, NO_FREE_DEVICE, TOO_FEW_DEVICES, GPUDevice
from shardsched.plugins.registry import IN_TREE
from shardsched.scheduler.algorithm import GenericScheduler
from shardsched.config import load_config
from tests.builders import node, pod, run_filter, table_of


def gpu_node(name: str, gpus: int, model: str = "T4", cpu: str = "32") -> object:
    return node(name, cpu=cpu, memory="64Gi", alloc={GPU_RESOURCE: str(gpus), GPU_MILLI_RESOURCE: str(gpus * MILLI)}) \
        .with_labels({"shardsched.io/gpu-model": model})


def share(name: str, milli: int, cpu: str = "1") -> object:
    gpu = {GPU_MILLI_RESOURCE: str(milli)}
    return pod(name, cpu=cpu, memory="1Gi", requests=gpu, limits=dict(gpu))


def whole(name: str, n: int, cpu: str = "1") -> object:
    gpu = {GPU_RESOURCE: str(n), GPU_MILLI_RESOURCE: str(n * MILLI)}
    return pod(name, cpu=cpu, memory="1Gi", requests=gpu, limits=dict(gpu))


@pytest.mark.parametrize("requests,expected", [
    ({}, None),
    ({GPU_RESOURCE: 2}, DeviceRequest(2, 1000)),
    ({GPU_RESOURCE: 2, GPU_MILLI_RESOURCE: 2000}, DeviceRequest(2, 1000)),
    ({GPU_MILLI_RESOURCE: 460}, DeviceRequest(1, 460)),
    ({GPU_MILLI_RESOURCE: 3000}, DeviceRequest(3, 1000)),
], ids=["none", "nvidia-whole", "whole-with-milli", "share", "milli-multiple"])
def test_device_request(requests, expected):
    assert device_request(requests) == expected


@pytest.mark.parametrize("requests,words", [
    ({GPU_MILLI_RESOURCE: 1500}, "multiple of 1000"),
    ({GPU_RESOURCE: 1, GPU_MILLI_RESOURCE: 500}, "whole devices take 1000"),
], ids=["share-above-one-device", "whole-with-share"])
def test_device_request_rejects(requests, words):
    with pytest.raises(ValueError, match=words):
        device_request(requests)


def test_annotation_round_trip():
    assert parse_devices(format_devices((0, 3))) == (0, 3)
    assert parse_devices("x,1") == () and parse_devices("-1") == () and parse_devices(None) == ()


def test_table_counts_shares_per_device_not_in_aggregate():
    """Two 600-thousandth shares take one device each; the node then has 800 free in sum but no
    device with 600, so a third share does not fit (the aggregate model would take it)."""
    table = table_of(gpu_node("n", 2), pods=[share("a", 600).on("n"), share("b", 600).on("n")])
    slot = table.index["n"]
    assert sorted(table.devices.free[slot, :2].tolist()) == [400, 400]
    assert sorted(table.devices_of(u) for u in table.pods[slot]) == [(0,), (1,)]
    fits, reasons = run_filter(GPUDevice(), share("c", 600), table)
    assert fits == set() and reasons == {NO_FREE_DEVICE: 1}
    assert run_filter(GPUDevice(), share("d", 400), table)[0] == {"n"}
    # removing a pod gives its device back
    uid = next(u for u, usage in table.pods[slot].items() if usage.devices == (0,))
    table.remove_pod(uid)
    assert table.devices.free[slot, 0] == 1000


def test_annotated_devices_are_kept_and_node_update_keeps_usage():
    p = share("a", 300).on("n")
    p["metadata"]["annotations"] = {"shardsched.io/gpu-devices": "1"}
    table = table_of(gpu_node("n", 2), pods=[p])
    slot = table.index["n"]
    assert table.devices.free[slot, :2].tolist() == [1000, 700]
    table.add_node(gpu_node("n", 2).with_labels(extra="x").info())  # a node update keeps the pods' devices
    assert table.devices.free[slot, :2].tolist() == [1000, 700]


@pytest.mark.parametrize("p,fits,reasons", [
    (share("s", 600), {"half", "free1", "free8"}, {NO_DEVICES: 1}),
    (whole("w1", 1), {"free1", "free8"}, {NO_DEVICES: 1, NO_FREE_DEVICE: 1}),
    (whole("w2", 2), {"free8"}, {NO_DEVICES: 1, TOO_FEW_DEVICES: 1, NO_FREE_DEVICE: 1}),
    (pod("cpu", cpu="1"), {"half", "free1", "free8", "cpu"}, {}),
], ids=["share", "one-whole", "two-whole", "no-gpu"])
def test_filter(p, fits, reasons):
    table = table_of(gpu_node("half", 2), gpu_node("free1", 1), gpu_node("free8", 8), node("cpu"),
                     pods=[share("x", 400).on("half"), share("y", 700).on("half")])
    # "half": best fit leaves its devices at 600 and 300 free: no wholly free device
    assert table.devices.free[table.index["half"], :2].tolist() == [600, 300]
    assert run_filter(GPUDevice(), p, table) == (fits, reasons)


def test_bad_request_is_rejected_by_prefilter():
    from shardsched.framework.cycle_state import CycleState
    st_ = GPUDevice().pre_filter(CycleState(), share("bad", 1500).info(), table_of(gpu_node("n", 2)))
    assert st_.is_rejected() and "multiple of 1000" in st_.message


def _view(cpu_free, free, count=None, model=None, cpu_alloc=None):
    free = np.array(free, np.int32)
    n = len(free)
    return scoring.NodeView(np.array(cpu_free, np.int64), np.array(cpu_alloc or [64000] * n, np.int64), free,
                            np.array(count or [int((r > 0).sum()) for r in free]), np.array(model or [0] * n, np.int32))


def _best(strategy, view, shape, typical=None):
    access = typical.access(["T4"]) if typical is not None else None
    scores, device = scoring.score(strategy, view, shape, typical, access, np.random.default_rng(0))
    j = int(np.argmax(scores))
    return j, int(device[j])


# node 0: two devices, one half used; node 1: two wholly free devices; node 2: 8 wholly free devices
_NODES = dict(cpu_free=[32000, 32000, 32000], free=[[500, 1000] + [0] * 6, [1000, 1000] + [0] * 6, [1000] * 8])


@pytest.mark.parametrize("strategy,shape,expected", [
    (scoring.BEST_FIT, scoring.PodShape(1000, 1, 500), (0, 0)),
    (scoring.PACKING, scoring.PodShape(1000, 1, 500), (0, 0)),
    (scoring.PACKING, scoring.PodShape(1000, 1, 1000), (0, -1)),
    (scoring.BEST_FIT, scoring.PodShape(1000, 1, 1000), (0, -1)),
    # over the largest node's capacity (the FGD simulator's normMethod max), the node with the
    # least GPU free aligns least with the pod (nodes 0 and 1 tie at 98: the first)
    (scoring.DOT_PROD, scoring.PodShape(1000, 1, 1000), (0, -1)),
    (scoring.FGD, scoring.PodShape(1000, 1, 500), (0, 0)),
], ids=["bestfit-share", "packing-share-on-used-gpu", "packing-whole-on-used-node", "bestfit-whole",
        "dotprod-whole", "fgd-share-fills-the-half"])
def test_score_orderings(strategy, shape, expected):
    typical = scoring.TypicalPods.from_shapes([(1000, 1, 500, frozenset())] * 5 + [(1000, 1, 1000, frozenset())] * 5)
    assert _best(strategy, _view(**_NODES), shape, typical) == expected


def test_fgd_keeps_the_eight_gpu_node_whole_for_eight_gpu_pods():
    """With 8-GPU pods in the workload, a 1-GPU pod goes to the 2-GPU node, not the 8-GPU one."""
    typical = scoring.TypicalPods.from_shapes([(1000, 8, 1000, frozenset())] * 5 + [(1000, 1, 1000, frozenset())] * 5)
    view = _view(cpu_free=[32000, 32000], free=[[1000, 1000] + [0] * 6, [1000] * 8])
    assert _best(scoring.FGD, view, scoring.PodShape(1000, 1, 1000), typical)[0] == 0


def test_fgd_model_access():
    """A typical pod that accepts only V100 does not count a T4 node's GPUs as usable."""
    typical = scoring.TypicalPods.from_shapes([(1000, 1, 1000, frozenset({"V100"}))])
    view = _view(cpu_free=[32000], free=[[1000, 1000] + [0] * 6], model=[0])
    assert scoring.fragmentation(view, typical, typical.access(["T4"]))[0] == 2000
    assert scoring.fragmentation(view, typical, typical.access(["V100"]))[0] == 0


def test_fgd_share_takes_the_first_device_of_the_best_integer_score():
    """As the FGD simulator's plugin: a share's device is the lowest-indexed one whose integer
    score (100 * sigmoid(delta / 1000), truncated) is the best. Here device 1 adds a little less
    fragmentation (delta 50.0 against 43.0 thousandths), but both score 51: device 0."""
    typical = scoring.TypicalPods.from_shapes([(1000, 1, 1000, frozenset())] * 99 + [(1000, 1, 680, frozenset())],
                                              popularity=1.0)
    access = typical.access(["T4"])
    view = _view(cpu_free=[32000], free=[[700, 650, 1000, 0]], count=[3])
    shape = scoring.PodShape(1000, 1, 50)
    before = scoring.fragmentation(view, typical, access)[0]
    deltas = []
    for d in range(2):
        after = view.free.copy()
        after[0, d] -= 50
        deltas.append(before - scoring.fragmentation(view._replace(cpu_free=view.cpu_free - 1000, free=after),
                                                     typical, access)[0])
    assert deltas == pytest.approx([43.0, 50.0])
    assert list(scoring.to_node_score(scoring.FGD, np.array(deltas))) == [51, 51]
    raw, device = scoring.score(scoring.FGD, view, shape, typical, access)
    assert int(device[0]) == 0 and raw[0] == pytest.approx(43.0)


def _scheduler(strategy: str, seed: int = 0) -> GenericScheduler:
    profile = load_config(None).profiles[0]
    fw = Framework(profile, IN_TREE, None, False)
    plugin = gpudevice.new(parse_plugin_args("GPUDevice", {"scoringStrategy": strategy}))
    fw.filter_plugins.append(plugin)
    fw.pre_filter_plugins.append(plugin)
    from shardsched.framework.runtime import WeightedScore
    fw.score_plugins.append(WeightedScore(plugin, 10))
    return GenericScheduler(fw, table_of(gpu_node("a", 2), gpu_node("b", 4)), seed=seed)


def test_scheduler_records_devices_and_never_straddles():
    s = _scheduler("BestFit")
    results = [s.schedule(share(f"p{i}", 600).info()) for i in range(7)]
    placed = [r for r in results if r.scheduled]
    assert len(placed) == 6  # one 600 share per device: 2 + 4 devices
    for r in placed:
        assert len(r.devices) == 1 and s.table.devices_of(r.pod.uid) == r.devices
    assert "no GPU device with enough free" in results[-1].status.message


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 1000)), min_size=1, max_size=40),
       st.sampled_from(scoring.STRATEGIES))
def test_no_device_ever_exceeds_1000(requests, strategy):
    """Whatever the pods and the strategy, no device holds more than 1000 thousandths."""
    s = _scheduler(strategy)
    for i, (count, milli) in enumerate(requests):
        p = share(f"s{i}", milli) if count <= 1 and milli < MILLI else whole(f"w{i}", max(1, count))
        s.schedule(p.info())
    free = s.table.devices.free[: s.table.n]
    assert (free >= 0).all() and (free <= MILLI).all()
    for slot, pods in enumerate(s.table.pods):
        used = np.zeros(free.shape[1], np.int64)
        for u in pods.values():
            if u.gpu is not None:
                assert len(set(u.devices)) == u.gpu.count
                used[list(u.devices)] += u.gpu.milli
        assert (used <= MILLI).all() and (used + free[slot] == np.where(np.arange(free.shape[1]) < s.table.devices.count[slot], MILLI, 0)).all()


def test_simulate_reports_the_devices_of_each_pod(tmp_path):
    """Two 600-thousandth shares on a 2-GPU node take one device each; the third fits no device
    (800 free in sum); whole GPUs take wholly free devices."""
    import yaml

    from shardsched.scheduler.simulate import simulate

    docs = [gpu_node("g", 2)] + [share(f"s{i}", 600) for i in range(3)] + [whole("w", 1)]
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump_all([dict(d) for d in docs]))
    report = simulate([path], "deploy/config/gpu-share.yaml")
    assert not report.errors
    by_name = {p.name: p for p in report.pods}
    assert sorted(by_name[f"s{i}"].to_json().get("devices", [None])[0] for i in range(2)) == [0, 1]
    assert by_name["s2"].status == "Unschedulable" and "no GPU device with enough free" in by_name["s2"].reason
    assert by_name["w"].status == "Unschedulable" and "devices" not in by_name["w"].to_json()
