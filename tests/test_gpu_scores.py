"""GPUDevice's scores on hand-made nodes: Packing and DotProd as the FGD simulator's integers, and
FGDPlus's two terms (the contention of GPU models, the share leftovers no typical share fills)."""

from __future__ import annotations

import numpy as np
import pytest

from shardsched.plugins.gpudevice import scoring


def _view(cpu_free, free, model=None):
    free = np.array(free, np.int32)
    n = len(free)
    return scoring.NodeView(np.array(cpu_free, np.int64), np.array([64000] * n, np.int64), free,
                            np.array([int((r > 0).sum()) for r in free]), np.array(model or [0] * n, np.int32),
                            np.array([1 << 20] * n, np.int64))


# node 0: two devices, one half used; node 1: two wholly free devices; node 2: 8 wholly free devices
_NODES = _view([32000] * 3, [[500, 1000] + [0] * 6, [1000, 1000] + [0] * 6, [1000] * 8])


@pytest.mark.parametrize("shape,expected", [
    # a share on the partly used device: 100 - (500 * 100 // 1000) // 10; on a partly used node's
    # free device 50 - 1; an unused node max(33 - devices, devices)
    (scoring.PodShape(1000, 1, 400), [95, 31, 25]),
    (scoring.PodShape(1000, 1, 600), [49, 31, 25]),
    (scoring.PodShape(1000, 1, 1000), [49, 31, 25]),
    (scoring.PodShape(1000, 0, 0), [0, 0, 0]),  # no GPU: every node 0, the tie goes to the smallest name
], ids=["share-on-used-gpu", "share-on-free-gpu-of-used-node", "whole", "cpu-only"])
def test_packing_is_the_fgd_simulators_integer_score(shape, expected):
    scores, device = scoring.score(scoring.PACKING, _NODES, shape)
    assert scores.tolist() == expected
    assert list(scoring.to_node_score(scoring.PACKING, scores)) == expected
    if shape.share:  # the best-fit device (the simulator's default gpuSelMethod)
        assert device[0] == (0 if shape.gpu_milli <= 500 else 1)


def test_dotprod_is_the_fgd_simulators_integer_score():
    """merge / max: free (CPU, GPU summed) and request over the largest node's (128 cores, 8
    GPUs), the dot product halved, int(100 * (1 - dot)). Nodes 0 and 1 tie at 98."""
    scores, _ = scoring.score(scoring.DOT_PROD, _NODES, scoring.PodShape(1000, 1, 1000))
    cpu = 1000 / 128000 * 32000 / 128000
    expected = [int(100 * (1 - (cpu + 1000 / 8000 * g / 8000) / 2)) for g in (1500, 2000, 8000)]
    assert scores.tolist() == expected == [98, 98, 93]


def _typical(shapes):
    return scoring.TypicalPods.from_shapes(shapes, popularity=1.0)


def test_fgd_plus_sends_an_unconstrained_pod_away_from_the_contended_model():
    """Half the typical pods accept only T4; an unconstrained 1-GPU pod goes to the V100 node (the
    identical T4 node is what the T4 pods need), a T4 pod to the T4 node it must use."""
    typical = _typical([(1000, 1, 1000, frozenset({"T4"}))] * 5 + [(1000, 1, 1000, frozenset())] * 5)
    models = ["T4", "V100"]
    view = _view([32000, 32000], [[1000] * 4, [1000] * 4], model=[0, 1])
    pressure = scoring.model_pressure(typical, models, np.array([4000, 4000]))
    assert pressure[1] > pressure[2] == 0  # rows: code + 1
    access = typical.access(models)
    scores, _ = scoring.score(scoring.FGD_PLUS, view, scoring.PodShape(1000, 1, 1000), typical, access,
                              pressure=pressure)
    assert int(np.argmax(scores)) == 1
    # without the contention the two nodes differ only by the fragmentation the T4 pods see on V100
    plain, _ = scoring.score(scoring.FGD_BEST_FIT, view, scoring.PodShape(1000, 1, 1000), typical, access)
    assert scores[0] - scores[1] < plain[0] - plain[1]


def test_model_pressure_spreads_each_shape_over_its_models_capacity():
    typical = _typical([(1000, 1, 1000, frozenset({"T4", "V100"}))] * 2 + [(1000, 1, 1000, frozenset())] * 2)
    # half of the demand is constrained to T4 or V100, which hold a quarter of the capacity
    p = scoring.model_pressure(typical, ["A", "T4", "V100"], np.array([6000, 1000, 1000]))
    assert p.tolist() == pytest.approx([0.0, 0.0, 2.0, 2.0])


def test_waste_is_what_no_mix_of_typical_shares_fills():
    typical = _typical([(1000, 1, 300, frozenset()), (1000, 1, 500, frozenset()), (1000, 1, 1000, frozenset())])
    w = typical.waste
    assert (w[299], w[300], w[700], w[800], w[1000]) == (299, 0, 100, 0, 0)


def test_fgd_plus_share_takes_the_device_its_leftover_can_be_filled_on():
    """Typical shares of 300 and 350: a 350 share on the device with 900 free leaves 550 (at best
    a 350 and 200 nobody fills), on the one with 950 free it leaves 600 (two 300s fill it). FGD
    sees both leftovers usable (the same fragmentation) and keeps the first device; FGDPlus's
    leftover term takes the second."""
    typical = _typical([(1000, 1, 300, frozenset())] * 5 + [(1000, 1, 350, frozenset())] * 5)
    view = _view([32000], [[900, 950, 0, 0]])
    access = typical.access(["T4"])
    shape = scoring.PodShape(1000, 1, 350)
    assert int(scoring.score(scoring.FGD_BEST_FIT, view, shape, typical, access)[1][0]) == 0
    assert int(scoring.score(scoring.FGD_PLUS, view, shape, typical, access)[1][0]) == 1
