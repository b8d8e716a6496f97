"""The GPU placement rules of the GPUDevice plugin as numpy functions over a set of nodes.

Everything here takes a `NodeView` (one row per node: free CPU, capacities, per-device free
thousandths, GPU model code) and a pod's `PodShape`, and answers for all rows at once; the plugin
(`shardsched.plugins.gpudevice.plugin`) builds the view from a NodeTable, ``bench gpu-frag`` from its
own arrays. Scores are float64, higher is better; each strategy also names the device a share
would take on each node (-1 where the pod takes whole devices or none).

Strategies, after the baselines of Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing
Workloads with Fragmentation Gradient Descent" (USENIX ATC '23), whose rules this follows
(our own code and words):

- ``Random``: every feasible node scores the same; a random fitting device.
- ``BestFit``: the least left over after placement, ``-(0.5 * cpu_left / MAX_SPEC_CPU_MILLI +
  0.5 * gpu_left / MAX_SPEC_GPU_MILLI)``; a share takes the fitting device with the least free.
- ``Packing``: the FGD simulator's ``GpuPackingScore`` (an integer): a share that fits a partly used
  device first (the less that device has free, the better), then a partly used node (the fewer
  wholly free devices taken, the better), then an unused node (the fewer devices, the better).
- ``DotProd``: the FGD simulator's ``DotProductScore`` as its experiment configures it (merge,
  max): the smallest dot product of the pod's request and the node's free (CPU, GPU summed over
  devices), each divided by the largest node's, as an integer (Tetris' alignment).
- ``FGD``: fragmentation gradient descent. A node's fragmentation for a workload of typical pods
  (`TypicalPods`: shapes and their frequencies) is ``F = sum_k p_k * f_k``, where ``f_k`` is the
  node's free GPU thousandths that typical pod ``k`` could not use: all of them when ``k`` asks for
  no GPU, cannot use the node's model, lacks CPU, or finds too few devices with ``milli_k`` free;
  otherwise those of its devices with less than ``milli_k`` free. FGD places the pod where
  ``F_after - F_before`` is smallest (the score is its negation); a share takes, as the FGD
  simulator's plugin, the lowest-indexed device whose integer score (`to_node_score`) is the best.
- ``FGDBestFit`` (ours): FGD's score plus `FGD_BEST_FIT_WEIGHT` times BestFit's. FGD alone is
  indifferent between nodes whose fragmentation a pod does not change (a CPU-only pod on any node
  with CPU to spare, a whole GPU on any of many half-used nodes) and picks one at random, which
  spreads CPU thinly until big GPU pods find no node with the CPU they need; the BestFit term packs
  within those ties and costs FGD little elsewhere (docs/benchmarks.md, ``bench gpu-frag``).
- ``FGDPlus`` (ours, the recommended one): FGDBestFit and two terms. *Model contention*: a pod's
  GPU thousandths cost `CONTENTION_WEIGHT` times its node's model's `model_pressure`, the typical
  demand constrained to sets of models that include it per share of the capacity, so that a pod
  that may run anywhere leaves the models that constrained pods need (FGD counts a node's GPUs as
  fragment for a pod that cannot use its model, but that does not say which models are short).
  *Share leftovers* (a look-ahead on the device): a share's device also pays `LEFTOVER_WEIGHT`
  per thousandth it adds to what no mix of typical shares can fill on that device
  (`TypicalPods.waste`), so that a share goes where what it leaves can still be used up.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Sequence

import numpy as np

from shardsched.cache.devices import MILLI

RANDOM, BEST_FIT, PACKING, DOT_PROD, FGD = "Random", "BestFit", "Packing", "DotProd", "FGD"
FGD_BEST_FIT = "FGDBestFit"
FGD_PLUS = "FGDPlus"
STRATEGIES = (RANDOM, BEST_FIT, PACKING, DOT_PROD, FGD, FGD_BEST_FIT, FGD_PLUS)
#: the strategies that measure fragmentation against typical pods
NEEDS_TYPICAL = (FGD, FGD_BEST_FIT, FGD_PLUS)
#: FGDPlus: thousandths of fragmentation that one thousandth of GPU placed on a model of
#: contention 1 (`model_pressure`) costs
CONTENTION_WEIGHT = 0.2
#: FGDPlus: thousandths of fragmentation that one thousandth of a device's free left where no
#: mix of typical shares fills it (`TypicalPods.waste`) costs
LEFTOVER_WEIGHT = 1.0
#: FGDBestFit: thousandths of fragmentation one unit of BestFit's leftover is worth (its weight)
FGD_BEST_FIT_WEIGHT = 100.0
#: BestFit's normalisation: the largest CPU and GPU shapes of a node in the openb trace
MAX_SPEC_CPU_MILLI = 128_000
MAX_SPEC_GPU_MILLI = 8 * MILLI
#: the share of pods (by count, most frequent shapes first) kept as typical pods, as the FGD
#: simulator's default popularity threshold
TYPICAL_POPULARITY = 0.95


class NodeView(NamedTuple):
    """Rows of nodes. ``cpu_free``, ``cpu_alloc``: int64 (n,) millicores; ``free``: int32 (n, D)
    free thousandths per device (0 past a node's devices); ``count``: int (n,) devices per node;
    ``model``: int32 (n,) GPU model code (-1 unknown); ``mem_free``: int64 (n,) free memory in MiB
    (read by FGDBestFit only; None: not checked)."""

    cpu_free: np.ndarray
    cpu_alloc: np.ndarray
    free: np.ndarray
    count: np.ndarray
    model: np.ndarray
    mem_free: np.ndarray | None = None


class PodShape(NamedTuple):
    """What a pod asks: ``cpu_milli``; ``gpu_count`` devices of ``gpu_milli`` thousandths each
    (0, 0: no GPU; ``gpu_milli < 1000`` only with ``gpu_count == 1``); ``memory_mib``."""

    cpu_milli: int
    gpu_count: int
    gpu_milli: int
    memory_mib: int = 0

    @property
    def share(self) -> bool:
        return self.gpu_count == 1 and 0 < self.gpu_milli < MILLI


@dataclass(frozen=True)
class TypicalPods:
    """The workload FGD measures fragmentation against: K pod shapes and their frequencies.

    Attributes:
        cpu_milli, count, milli: int64 (K,) each shape's CPU, device count and thousandths per device.
        models: per shape, the GPU models it accepts (empty: any), as names.
        weight: float64 (K,), summing to 1.
        memory_mib: int64 (K,) each shape's memory (0 when not given).
    """

    cpu_milli: np.ndarray
    count: np.ndarray
    milli: np.ndarray
    models: tuple[frozenset[str], ...]
    weight: np.ndarray
    memory_mib: np.ndarray

    @classmethod
    def from_shapes(cls, shapes: Iterable[tuple], popularity: float = TYPICAL_POPULARITY) -> "TypicalPods":
        """From the pods of a workload, one (cpu_milli, gpu_count, gpu_milli, models[, memory_mib])
        each: the most frequent shapes (memory left out of the grouping) covering ``popularity`` of
        the pods, frequencies renormalised over them; a shape's memory is the mean of its pods'.

        Raises:
            ValueError: no shapes, or ``popularity`` not in (0, 1].
        """
        if not 0 < popularity <= 1:
            raise ValueError(f"popularity must be in (0, 1], got {popularity}")
        counts: Counter = Counter()
        memory: Counter = Counter()
        for shape in shapes:
            key = tuple(shape[:4])
            counts[key] += 1
            memory[key] += shape[4] if len(shape) > 4 else 0
        total = sum(counts.values())
        if not total:
            raise ValueError("typical pods need at least one pod shape")
        kept, covered = [], 0
        for shape, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0][:3], sorted(kv[0][3]))):
            if covered >= popularity * total:
                break
            kept.append((shape, n))
            covered += n
        w = np.array([n for _, n in kept], np.float64)
        return cls(np.array([s[0] for s, _ in kept], np.int64), np.array([s[1] for s, _ in kept], np.int64),
                   np.array([s[2] for s, _ in kept], np.int64), tuple(frozenset(s[3]) for s, _ in kept), w / w.sum(),
                   np.array([memory[s] // n for s, n in kept], np.int64))

    @property
    def waste(self) -> np.ndarray:
        """float64 (1001,): ``waste[L]``, the least of ``L`` free thousandths of a device that the
        typical shares cannot fill, in any number and mix (an unbounded knapsack); 0 for 1000."""
        cached = self.__dict__.get("_waste")
        if cached is not None:
            return cached
        sizes = sorted({int(m) for c, m in zip(self.count, self.milli) if c == 1 and 0 < m < MILLI})
        out = np.arange(MILLI + 1, dtype=np.float64)
        for L in range(1, MILLI + 1):
            for sz in sizes:
                if sz > L:
                    break
                if out[L - sz] < out[L]:
                    out[L] = out[L - sz]
        out[MILLI] = 0.0
        object.__setattr__(self, "_waste", out)
        return out

    def access(self, models: Sequence[str]) -> np.ndarray:
        """bool (M + 1, K): row ``code + 1`` says which shapes may use a node of model ``models[code]``
        (row 0: a node of unknown model, which only unconstrained shapes may use)."""
        out = np.ones((len(models) + 1, len(self.weight)), bool)
        for k, allowed in enumerate(self.models):
            if allowed:
                out[0, k] = False
                out[1:, k] = [m in allowed for m in models]
        return out


def device_fit(free: np.ndarray, shape: PodShape) -> np.ndarray:
    """bool (n,): the node has ``gpu_count`` devices with ``gpu_milli`` free each (True for no GPU)."""
    if shape.gpu_count == 0:
        return np.ones(len(free), bool)
    if shape.share:
        return (free >= shape.gpu_milli).any(axis=1)
    return (free >= MILLI).sum(axis=1) >= shape.gpu_count


def _best_fit_device(free: np.ndarray, milli: int) -> np.ndarray:
    """int (n,): the fitting device with the least free per row (-1: none fits)."""
    masked = np.where(free >= milli, free, np.iinfo(np.int32).max)
    dev = masked.argmin(axis=1)
    return np.where(masked[np.arange(len(free)), dev] < np.iinfo(np.int32).max, dev, -1)


def score(strategy: str, view: NodeView, shape: PodShape, typical: TypicalPods | None = None,
          access: np.ndarray | None = None, rng: np.random.Generator | None = None,
          pressure: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(scores float64 (n,), device int (n,)) of ``strategy`` for the rows of ``view``, which must
    all fit the pod (`device_fit` and CPU); higher is better. ``device``: the device a share takes
    on each node (-1 otherwise). FGD needs ``typical`` and its ``access`` (`TypicalPods.access`);
    Random draws its devices from ``rng``.

    Raises:
        ValueError: an unknown strategy, or FGD without typical pods.
    """
    n = len(view.cpu_free)
    share = shape.share
    if strategy in NEEDS_TYPICAL:
        if typical is None or access is None:
            raise ValueError(f"{strategy} needs typical pods")
        plus = strategy == FGD_PLUS
        frag, device = _fgd(view, shape, typical, access, strategy != FGD, typical.waste if plus else None)
        if plus and pressure is not None and shape.gpu_count:
            frag = frag - CONTENTION_WEIGHT * shape.gpu_count * shape.gpu_milli * pressure[view.model + 1]
        if strategy != FGD:
            frag = frag + FGD_BEST_FIT_WEIGHT * _best_fit(view, shape)
        return frag, device
    if strategy == RANDOM:
        device = np.full(n, -1, np.int64)
        if share and n:
            ok = view.free >= shape.gpu_milli
            r = (rng or np.random.default_rng()).random(view.free.shape)
            device = np.where(ok, r, -1.0).argmax(axis=1)
        return np.zeros(n), device
    device = _best_fit_device(view.free, shape.gpu_milli) if share else np.full(n, -1, np.int64)
    if strategy == BEST_FIT:
        return _best_fit(view, shape), device
    if strategy == DOT_PROD:
        return _dot_prod(view, shape), device
    if strategy == PACKING:
        return _packing(view, shape, device), device
    raise ValueError(f"unknown GPU scoring strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")


def _dot_prod(view: NodeView, shape: PodShape) -> np.ndarray:
    """DotProd's score as the FGD simulator's ``DotProductScore`` with its experiment's
    ``dimExtMethod: merge``, ``normMethod: max``: the node's free (CPU, GPU summed over devices)
    and the pod's request, each divided by the largest node's (`MAX_SPEC_CPU_MILLI`,
    `MAX_SPEC_GPU_MILLI`), their dot product halved, ``int(100 * (1 - dot))``; a float holding an
    integer in [0, 100]."""
    gpu_free = view.free.sum(axis=1).astype(np.float64)
    dot = (shape.cpu_milli / MAX_SPEC_CPU_MILLI) * (view.cpu_free / MAX_SPEC_CPU_MILLI) \
        + (shape.gpu_count * shape.gpu_milli / MAX_SPEC_GPU_MILLI) * (gpu_free / MAX_SPEC_GPU_MILLI)
    return np.floor(100.0 * (1.0 - dot / 2.0))


def _packing(view: NodeView, shape: PodShape, device: np.ndarray) -> np.ndarray:
    """Packing's score as the FGD simulator's ``GpuPackingScore``, an integer in [0, 100] (as
    float): 0 for a pod without GPU; on a node whose devices are all free, ``max(33 - devices,
    devices)``; a share whose best-fit device is partly used, ``max(100 - (left * 100 // 1000) //
    10, 50)`` (``left``: that device's free before); otherwise (wholly free devices of a partly
    used node) ``max(50 - devices taken, 33)``."""
    n = len(view.cpu_free)
    if not shape.gpu_count:
        return np.zeros(n)
    whole_free = (view.free >= MILLI).sum(axis=1)
    unused = whole_free == view.count
    s = np.where(unused, np.maximum(33 - view.count, view.count), np.maximum(50 - shape.gpu_count, 33)).astype(np.float64)
    if shape.share:
        left = view.free[np.arange(n), np.maximum(device, 0)].astype(np.int64)
        on_used = (left < MILLI) & ~unused
        s = np.where(on_used, np.maximum(100 - (left * 100 // MILLI) // 10, 50), s)
    return s


def _best_fit(view: NodeView, shape: PodShape) -> np.ndarray:
    """BestFit's score: minus the weighted leftover after placement, in [-1, 0] on trace nodes."""
    left_gpu = view.free.sum(axis=1) - shape.gpu_count * shape.gpu_milli
    return -(0.5 * (view.cpu_free - shape.cpu_milli) / MAX_SPEC_CPU_MILLI + 0.5 * left_gpu / MAX_SPEC_GPU_MILLI)


def to_node_score(strategy: str, raw: np.ndarray) -> np.ndarray:
    """int64 in [0, 100] from `score`'s raw values, node by node, for the framework's Score (whose
    scores are integers in [0, 100]; the bench compares the raw floats): FGD's as the FGD
    simulator's, ``100 * sigmoid(delta / 1000)``; BestFit's ``100 * (1 + raw)``; DotProd's
    ``100 - 50 * dot``; Packing's ``raw / 3``; Random 0. Non-finite raws (a node that does not
    fit) give 0."""
    raw = np.where(np.isfinite(raw), raw, -np.inf)
    if strategy in NEEDS_TYPICAL:
        out = 100.0 / (1.0 + np.exp(-np.clip(raw, -50_000, 50_000) / 1000.0))
    elif strategy == BEST_FIT:
        out = 100.0 * (1.0 + raw)
    elif strategy in (DOT_PROD, PACKING):
        out = np.floor(raw)
    else:
        out = np.zeros(len(raw))
    return np.clip(np.nan_to_num(out, nan=0.0, neginf=0.0), 0, 100).astype(np.int64)


def fragmentation(view: NodeView, typical: TypicalPods, access: np.ndarray) -> np.ndarray:
    """float64 (n,): each node's fragmentation ``F`` for the typical pods (module docstring), in
    GPU thousandths."""
    ge = view.free[:, :, None] >= typical.milli[None, None, :]
    c = ge.sum(axis=1)
    s = (view.free[:, :, None] * ge).sum(axis=1)
    return _frag(view.free.sum(axis=1), c, s, view.cpu_free[:, None], view.model, typical, access)


def _frag(total, c, s, cpu_free, model, typical: TypicalPods, access: np.ndarray, mem_free=None) -> np.ndarray:
    """F from the per-shape counts ``c`` and sums ``s`` of devices with ``milli_k`` free
    (shape (..., K)), the free total (...,) and the free CPU (broadcastable to (..., K)); with
    ``mem_free`` (same shape as ``cpu_free``) a shape also needs its memory."""
    acc = access[model + 1]
    if c.ndim == 3:
        acc = acc[:, None, :]
    usable = (c >= typical.count) & (cpu_free >= typical.cpu_milli) & acc & (typical.milli > 0)
    if mem_free is not None:
        usable &= mem_free >= typical.memory_mib
    return total * typical.weight.sum() - (np.where(usable, s, 0) * typical.weight).sum(axis=-1)


def _fgd(view: NodeView, shape: PodShape, typical: TypicalPods, access: np.ndarray,
         memory: bool = False, waste: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """FGD's score and device per row; ``memory``: typical pods also need their memory (FGDBestFit,
    FGDPlus); ``waste`` (`TypicalPods.waste`): a share's device also pays `LEFTOVER_WEIGHT` per
    thousandth its placement adds to the device's unfillable free (FGDPlus)."""
    n = len(view.cpu_free)
    mem = view.mem_free if memory else None
    free = view.free
    g = typical.milli
    ge = free[:, :, None] >= g[None, None, :]
    c = ge.sum(axis=1)
    s = (free[:, :, None] * ge).sum(axis=1)
    total = free.sum(axis=1)
    before = _frag(total, c, s, view.cpu_free[:, None], view.model, typical, access,
                   None if mem is None else mem[:, None])
    cpu_after = (view.cpu_free - shape.cpu_milli)[:, None]
    mem_after = None if mem is None else (mem - shape.memory_mib)[:, None]
    if shape.share:
        m = shape.gpu_milli
        after_dev = free - m
        ge_a = after_dev[:, :, None] >= g[None, None, :]
        c2 = c[:, None, :] - ge + ge_a
        s2 = s[:, None, :] - free[:, :, None] * ge + after_dev[:, :, None] * ge_a
        after = _frag((total - m)[:, None], c2, s2, cpu_after[:, None, :], view.model, typical, access,
                      None if mem_after is None else mem_after[:, None, :])
        if waste is not None:
            after = after + LEFTOVER_WEIGHT * (waste[np.clip(after_dev, 0, MILLI)] - waste[np.clip(free, 0, MILLI)])
        after = np.where(free >= m, after, np.inf)
        if memory:
            device = after.argmin(axis=1)
        else:  # FGD: as the FGD simulator, the first device of the best integer score
            device = to_node_score(FGD, before[:, None] - after).argmax(axis=1)
        return before - after[np.arange(n), device], device
    if shape.gpu_count:
        k = shape.gpu_count
        after = _frag(total - k * MILLI, c - k, s - k * MILLI, cpu_after, view.model, typical, access, mem_after)
    else:
        after = _frag(total, c, s, cpu_after, view.model, typical, access, mem_after)
    return before - after, np.full(n, -1, np.int64)


def model_pressure(typical: TypicalPods, models: Sequence[str], capacity: np.ndarray) -> np.ndarray:
    """float64 (M + 1,): each model's contention (row ``code + 1``; row 0: unknown model): the
    typical GPU demand constrained to a set of models that includes it, each shape's share of the
    demand spread over its models' capacity, per share of the cluster's capacity.
    ``capacity``: GPU thousandths per model code (M,)."""
    demand = typical.weight * typical.count * typical.milli
    total_demand = demand.sum()
    out = np.zeros(len(models) + 1)
    total_cap = capacity.sum()
    if not total_demand or not total_cap:
        return out
    for k, allowed in enumerate(typical.models):
        if not allowed or not demand[k]:
            continue
        codes = [i for i, m in enumerate(models) if m in allowed]
        cap = capacity[codes].sum() if codes else 0
        if cap:
            out[np.array(codes) + 1] += (demand[k] / total_demand) / (cap / total_cap)
    return out
