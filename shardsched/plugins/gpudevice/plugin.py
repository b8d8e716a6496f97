"""GPUDevice: per-device GPU fit and fragmentation-aware GPU scores (docs/gpu.md).

kube-scheduler sees GPUs only as a count per node (an extended resource); GPU-share schedulers
(HAMi, Volcano's vGPU, KAI's gpu-fraction, Koordinator's device share, Alibaba's open-gpu-share)
look at each device. This plugin does that over the NodeTable's device columns
(`shardsched.cache.devices`):

- PreFilter: the pod's `DeviceRequest` (``nvidia.com/gpu``: whole devices; ``alibabacloud.com/gpu-milli``
  below 1000: a share of one device). A pod with no GPU request skips the Filter; a malformed one
  is rejected as UnschedulableAndUnresolvable, naming the field.
- Filter: a share needs ONE device with its thousandths free (never the sum of two half-free
  devices); N whole devices need N wholly free devices on the node. Reasons: ``node(s) had no GPU
  devices``, ``node(s) had too few GPU devices`` (both unresolvable: removing pods cannot add
  devices), ``node(s) had no GPU device with enough free`` (resolvable). The GPU model is a node
  label (``shardsched.io/gpu-model``), constrained per pod by node affinity (NodeAffinity's Filter).
- Score: one strategy of `shardsched.plugins.gpudevice.scoring` (``BestFit``, ``Packing``,
  ``DotProd``, ``FGD``, ``FGDBestFit``, ``FGDPlus``; ``Random`` scores all nodes the same), mapped to [0, 100]
  per node (`scoring.to_node_score`). FGD measures fragmentation against typical pods: those of the args, else the shapes of
  the pods this plugin has scored so far (rebuilt each time their number doubles).
- `choose_devices`: the devices the strategy takes on the chosen node; the scheduler records them
  with the placement (`PodUsage.devices`); a pod bound with the annotation
  ``shardsched.io/gpu-devices`` is counted on the devices it names (not written at bind yet).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from shardsched.api.objects import PodInfo
from shardsched.api.quantity import CPU, MEMORY
from shardsched.cache.devices import GPU_MODEL_LABELS, MILLI, DeviceRequest, device_request
from shardsched.cache.node_table import NodeTable
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import FilterPlugin, Index, ScorePlugin
from shardsched.framework.status import Status
from shardsched.plugins.gpudevice import scoring

NAME = "GPUDevice"
DEFAULT_STRATEGY = scoring.FGD
NO_DEVICES = "node(s) had no GPU devices"
TOO_FEW_DEVICES = "node(s) had too few GPU devices"
NO_FREE_DEVICE = "node(s) had no GPU device with enough free"
_KEY = NAME + "/request"
#: FGD learns its typical pods from the pods it scores after this many, then at each doubling
_LEARN_FIRST = 32


_MIB = 1 << 20


def _shape(pod: PodInfo, req: DeviceRequest | None) -> scoring.PodShape:
    return scoring.PodShape(pod.requests.get(CPU, 0), req.count if req else 0, req.milli if req else 0,
                            pod.requests.get(MEMORY, 0) // _MIB)


def _models(pod: PodInfo) -> frozenset[str]:
    """The GPU models a pod's required node affinity accepts (empty: any), for FGD's typical pods."""
    out: set[str] = set()
    for term in pod.required_terms or ():
        for e in getattr(term, "match_expressions", ()) or ():
            if getattr(e, "key", None) in GPU_MODEL_LABELS and getattr(e, "operator", "") == "In":
                out.update(e.values)
    return frozenset(out)


class GPUDevice(FilterPlugin, ScorePlugin):
    """The plugin (module docstring)."""

    name = NAME
    static = False
    unresolvable = False

    def __init__(self, strategy: str = DEFAULT_STRATEGY, typical: scoring.TypicalPods | None = None,
                 seed: int | None = None) -> None:
        if strategy not in scoring.STRATEGIES:
            raise ValueError(f"unknown GPU scoring strategy {strategy!r}; expected one of {', '.join(scoring.STRATEGIES)}")
        self.strategy = strategy
        self.typical = typical
        self._learn = typical is None
        self._seen: Counter = Counter()
        self._seen_uids: set[str] = set()
        self._next_learn = _LEARN_FIRST
        self._access: tuple[int, np.ndarray] | None = None
        self._pressure: tuple[tuple, np.ndarray] | None = None
        self.rng = np.random.default_rng(seed)

    @property
    def packs(self) -> bool:
        return self.strategy != scoring.RANDOM

    # ------------------------------------------------------------ PreFilter / Filter
    def pre_filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        try:
            req = device_request(pod.requests)
        except ValueError as e:
            return Status.unschedulable(str(e), plugin=NAME, resolvable=False)
        state.write(_KEY, req)
        return Status.skip() if req is None else Status.success()

    def _free(self, table: NodeTable, idx: Index) -> np.ndarray:
        return table.devices.free[: table.n][idx]

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        req: DeviceRequest = state.read(_KEY)
        return scoring.device_fit(self._free(table, idx), scoring.PodShape(0, req.count, req.milli))

    def filter_slot(self, state: CycleState, pod: PodInfo, table: NodeTable, slot: int) -> bool:
        req: DeviceRequest = state.read(_KEY)
        free = table.devices.free[slot]
        if req.share:
            return bool((free >= req.milli).any())
        return int((free >= MILLI).sum()) >= req.count

    def device_check(self, state: CycleState) -> DeviceRequest | None:
        """The pod's `DeviceRequest` (DefaultPreemption's vectorized search checks it per device)."""
        return state.read(_KEY)

    def failure_reasons(self, state, pod, table, slots):
        req: DeviceRequest = state.read(_KEY)
        count = table.devices.count[slots]
        out = {NO_DEVICES: int((count == 0).sum()), TOO_FEW_DEVICES: int(((count > 0) & (count < req.count)).sum())}
        out[NO_FREE_DEVICE] = len(slots) - out[NO_DEVICES] - out[TOO_FEW_DEVICES]
        return {k: v for k, v in out.items() if v}

    def unresolvable_mask(self, state, pod, table, slots):
        req: DeviceRequest = state.read(_KEY)
        return table.devices.count[slots] < req.count

    # ------------------------------------------------------------ Score
    def pre_score(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        try:
            req = device_request(pod.requests)
        except ValueError:
            return Status.skip()
        if self.strategy in scoring.NEEDS_TYPICAL:
            self._observe(pod, req)
            return Status.success() if self.typical is not None else Status.skip()
        return Status.skip() if req is None or self.strategy == scoring.RANDOM else Status.success()

    def _observe(self, pod: PodInfo, req: DeviceRequest | None) -> None:
        """Count the pod's shape for the learned typical pods (once per pod uid)."""
        if not self._learn or pod.uid in self._seen_uids:
            return
        self._seen_uids.add(pod.uid)
        shape = _shape(pod, req)
        self._seen[(shape.cpu_milli, shape.gpu_count, shape.gpu_milli, _models(pod), shape.memory_mib)] += 1
        if len(self._seen_uids) >= self._next_learn:
            self._next_learn *= 2
            self.typical = scoring.TypicalPods.from_shapes(self._seen.elements())
            self._access = None

    def _view(self, table: NodeTable, idx: Index) -> scoring.NodeView:
        n, row, mrow = table.n, table.resource_row(CPU), table.resource_row(MEMORY)
        alloc = table.alloc[row, :n][idx]
        mem_free = (table.alloc[mrow, :n][idx] - table.requested[mrow, :n][idx]) // _MIB
        dev = table.devices
        return scoring.NodeView(alloc - table.requested[row, :n][idx], alloc, dev.free[:n][idx],
                                dev.count[:n][idx], dev.model[:n][idx], mem_free)

    def _access_for(self, table: NodeTable) -> np.ndarray | None:
        models = table.devices.models
        if self.typical is None:
            return None
        if self._access is None or self._access[0] != len(models):
            self._access = (len(models), self.typical.access(models))
        return self._access[1]

    def _pressure_for(self, table: NodeTable) -> np.ndarray | None:
        """FGDPlus's contention per model (`scoring.model_pressure`) over the table's GPU capacity
        per model, kept until the typical pods, the models or the capacity change."""
        if self.strategy != scoring.FGD_PLUS or self.typical is None:
            return None
        dev, n = table.devices, table.n
        known = dev.model[:n] >= 0
        capacity = np.bincount(dev.model[:n][known], weights=dev.count[:n][known].astype(np.float64),
                               minlength=len(dev.models)) * MILLI
        key = (id(self.typical), tuple(dev.models), capacity.tobytes())
        if self._pressure is None or self._pressure[0] != key:
            self._pressure = (key, scoring.model_pressure(self.typical, dev.models, capacity))
        return self._pressure[1]

    def _raw(self, pod: PodInfo, table: NodeTable, idx: Index) -> tuple[np.ndarray, np.ndarray]:
        req = device_request(pod.requests)
        return scoring.score(self.strategy, self._view(table, idx), _shape(pod, req), self.typical,
                             self._access_for(table), self.rng, self._pressure_for(table))

    def score(self, state: CycleState, pod: PodInfo, table: NodeTable, idx: Index) -> np.ndarray:
        """int64 over idx in [0, 100]: the strategy's score mapped by `scoring.to_node_score` (a
        node's score depends on that node alone, so the scheduler may cache it per node)."""
        raw, _ = self._raw(pod, table, idx)
        return scoring.to_node_score(self.strategy, raw)

    # ------------------------------------------------------------ devices of a placement
    def choose_devices(self, pod: PodInfo, table: NodeTable, slot: int) -> tuple[int, ...]:
        """The devices this strategy takes for ``pod`` on ``slot`` (() for no GPU or when they do
        not fit): a share's device as scored; the lowest-indexed wholly free devices otherwise."""
        try:
            req = device_request(pod.requests)
        except ValueError:
            return ()
        if req is None:
            return ()
        if not req.share or (self.strategy in scoring.NEEDS_TYPICAL and self.typical is None):
            return table.devices.pick(slot, req)
        _, device = self._raw(pod, table, np.array([slot]))
        d = int(device[0])
        return (d,) if d >= 0 and table.devices.free[slot, d] >= req.milli else table.devices.pick(slot, req)


def new(args: Any = None) -> GPUDevice:
    """Factory from a validated `GPUDeviceArgs` (None: FGD with learned typical pods)."""
    if args is None:
        return GPUDevice()
    typical = None
    if args.typical_pods:
        typical = scoring.TypicalPods.from_shapes(
            [(t.cpu_milli, t.gpu_count, t.gpu_milli, frozenset(t.gpu_models), t.memory_mib) for t in args.typical_pods
             for _ in range(t.weight)], popularity=1.0)
    return GPUDevice(args.scoring_strategy, typical)
