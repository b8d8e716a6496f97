"""GPU devices per node as numpy columns, and what a pod asks of them (see docs/gpu.md).

A node's GPUs are devices ``0 .. count-1`` in the node's order. Each device has a free capacity in
thousandths of one GPU (1000 = wholly free); all devices of a node are of one model. The columns
(`DeviceColumns`) are kept by the `NodeTable` beside its resource rows:

- ``free``: int32 array, shape (capacity, width): free thousandths per device; 0 past ``count``;
- ``count``: int16 array, shape (capacity,): devices on the node (0: not a GPU node);
- ``model``: int32 array, shape (capacity,): code of the model in ``models`` (-1: unknown);
- ``memory_mib``: int64 array, shape (capacity,): memory of one device in MiB (0: unknown).

Where they come from (`node_devices`): the device count is the node's allocatable
``nvidia.com/gpu`` (else ``alibabacloud.com/gpu-milli`` / 1000); the model the label
``shardsched.io/gpu-model`` (the trace) or ``nvidia.com/gpu.product`` (GPU feature discovery); the
memory the label ``nvidia.com/gpu.memory`` (MiB). A later Dynamic Resource Allocation feed fills the
same columns from ResourceSlices through `DeviceColumns.set_node` (one entry per device).

What a pod asks (`device_request`), from its effective requests:

- ``nvidia.com/gpu: N``: N whole devices (each wholly free) on one node;
- otherwise ``alibabacloud.com/gpu-milli: m``: m < 1000 is a share of ONE device (that device
  needs ``m`` free: a share never straddles devices); m a multiple of 1000 is m / 1000 whole devices.

The aggregate resources stay true sums (a pod's ``gpu-milli`` is its total over its devices), so
NodeResourcesFit keeps checking them per node as a necessary condition; the devices are checked by
the GPUDevice plugin and recorded in `DEVICES_ANNOTATION` at bind. The Redis ledger checks both:
each device is one more resource of the node, `device_resource` (``shardsched.io/gpu-device-3``,
1000 allocatable per device, `ledger_allocatable`), and a pod's reservation and usage carry the
thousandths it takes of each of its devices (`ledger_requests`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

GPU_RESOURCE = "nvidia.com/gpu"
GPU_MILLI_RESOURCE = "alibabacloud.com/gpu-milli"
#: node labels naming the GPU model, in the order they are read
GPU_MODEL_LABELS = ("shardsched.io/gpu-model", "nvidia.com/gpu.product")
#: node label with the memory of one GPU in MiB (GPU feature discovery's)
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
#: pod annotation written at bind: the indices of the devices taken on the node, comma-separated
#: (``"3"``, ``"0,1"``), counted from 0 in the node's order, as GPU-share device plugins read theirs
DEVICES_ANNOTATION = "shardsched.io/gpu-devices"
#: one whole device, in thousandths
MILLI = 1000
#: the ledger's name of device ``i`` of a node is this prefix and ``i`` (`device_resource`)
DEVICE_RESOURCE_PREFIX = "shardsched.io/gpu-device-"
_INITIAL_WIDTH = 8


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """``count`` devices with ``milli`` free thousandths each (``count > 1`` only with 1000)."""

    count: int
    milli: int

    @property
    def share(self) -> bool:
        """A fraction of one device (``milli < 1000``)."""
        return self.milli < MILLI

    @property
    def total_milli(self) -> int:
        return self.count * self.milli

    def fits_free(self, free: np.ndarray) -> np.ndarray:
        """bool per row of ``free`` (rows of free thousandths per device, shape (k, width)): a
        share fits when one device has ``milli`` free, whole devices when ``count`` are wholly free."""
        if self.share:
            return (free >= self.milli).any(axis=1)
        return (free >= MILLI).sum(axis=1) >= self.count


def device_request(requests: Mapping[str, int]) -> DeviceRequest | None:
    """The devices a pod asks for (module docstring), or None when it asks for no GPU.

    Raises:
        ValueError: ``gpu-milli`` not in 1..1000 and not a multiple of 1000, or ``nvidia.com/gpu``
            together with a ``gpu-milli`` that is not 1000 per device; the message names the field.
    """
    whole = int(requests.get(GPU_RESOURCE, 0))
    milli = int(requests.get(GPU_MILLI_RESOURCE, 0))
    if whole > 0:
        if milli and milli != whole * MILLI:
            raise ValueError(f"{GPU_MILLI_RESOURCE} {milli} with {GPU_RESOURCE} {whole}: whole devices "
                             f"take {whole * MILLI} thousandths")
        return DeviceRequest(whole, MILLI)
    if milli <= 0:
        return None
    if milli < MILLI:
        return DeviceRequest(1, milli)
    if milli % MILLI:
        raise ValueError(f"{GPU_MILLI_RESOURCE} {milli}: a share of one device is below {MILLI}; "
                         f"more is whole devices (a multiple of {MILLI})")
    return DeviceRequest(milli // MILLI, MILLI)


def node_devices(allocatable: Mapping[str, int], labels: Mapping[str, str]) -> tuple[int, str, int]:
    """(device count, model or "", memory of one device in MiB or 0) of a node (module docstring)."""
    count = int(allocatable.get(GPU_RESOURCE, 0)) or int(allocatable.get(GPU_MILLI_RESOURCE, 0)) // MILLI
    model = next((labels[k] for k in GPU_MODEL_LABELS if labels.get(k)), "")
    try:
        memory = int(labels.get(GPU_MEMORY_LABEL, 0) or 0)
    except ValueError:
        memory = 0
    return count, model, max(memory, 0)


def device_resource(index: int) -> str:
    """The ledger's resource name of a node's device ``index``."""
    return f"{DEVICE_RESOURCE_PREFIX}{int(index)}"


def is_device_resource(name: str) -> bool:
    return name.startswith(DEVICE_RESOURCE_PREFIX)


def ledger_allocatable(allocatable: Mapping[str, int]) -> Mapping[str, int]:
    """A node's allocatable as the ledger counts it: plus 1000 thousandths of each of its devices
    (`device_resource`); the same mapping when the node has no GPU."""
    count = int(allocatable.get(GPU_RESOURCE, 0)) or int(allocatable.get(GPU_MILLI_RESOURCE, 0)) // MILLI
    if count <= 0:
        return allocatable
    return {**allocatable, **{device_resource(i): MILLI for i in range(count)}}


def ledger_requests(requests: Mapping[str, int], devices: Sequence[int]) -> Mapping[str, int]:
    """A pod's requests as the ledger counts them on its node: plus the thousandths it takes of
    each of ``devices`` (its share, or 1000 per whole device); the same mapping without devices
    or for a request that is not a valid device request."""
    if not devices:
        return requests
    try:
        req = device_request(requests)
    except ValueError:
        return requests
    if req is None:
        return requests
    return {**requests, **{device_resource(i): req.milli for i in devices}}


def parse_devices(value: str | None) -> tuple[int, ...]:
    """Device indices from `DEVICES_ANNOTATION` (``"0,3"``); () when absent or malformed."""
    if not value:
        return ()
    try:
        out = tuple(int(v) for v in value.split(","))
    except ValueError:
        return ()
    return out if all(i >= 0 for i in out) else ()


def devices_of_object(obj: Any) -> tuple[int, ...]:
    """The device indices of a pod object's `DEVICES_ANNOTATION` (`parse_devices`); () for an
    object without it, or that is not a dict."""
    if not isinstance(obj, dict):
        return ()
    return parse_devices(((obj.get("metadata") or {}).get("annotations") or {}).get(DEVICES_ANNOTATION))


def format_devices(devices: Sequence[int]) -> str:
    """`DEVICES_ANNOTATION`'s value for ``devices``."""
    return ",".join(str(int(i)) for i in devices)


class DeviceColumns:
    """The device columns of a NodeTable (module docstring); slots as the table's."""

    def __init__(self, capacity: int) -> None:
        self.width = _INITIAL_WIDTH
        self.free = np.zeros((capacity, self.width), np.int32)
        self.count = np.zeros(capacity, np.int16)
        self.model = np.full(capacity, -1, np.int32)
        self.memory_mib = np.zeros(capacity, np.int64)
        self.models: list[str] = []
        self.model_index: dict[str, int] = {}
        #: changes whenever a device's free capacity changes (scores caching per-node state read it)
        self.generation = 0

    def grow(self, capacity: int) -> None:
        free = np.zeros((capacity, self.width), np.int32)
        free[: len(self.free)] = self.free
        self.free = free
        for name, fill in (("count", 0), ("model", -1), ("memory_mib", 0)):
            old = getattr(self, name)
            new = np.full(capacity, fill, old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def _widen(self, width: int) -> None:
        free = np.zeros((len(self.free), width), np.int32)
        free[:, : self.width] = self.free
        self.free, self.width = free, width

    def model_code(self, model: str) -> int:
        """Code of ``model`` in ``models`` (-2 if no node has it: matches none)."""
        return self.model_index.get(model, -2)

    def set_node(self, slot: int, count: int, model: str, memory_mib: int,
                 used: Mapping[int, int] | None = None) -> None:
        """Declare the devices of a slot: ``count`` devices of ``model`` ("" unknown) with
        ``memory_mib`` each, all free but ``used`` (device index -> thousandths taken)."""
        if count > self.width:
            self._widen(count)
        code = -1
        if model:
            code = self.model_index.setdefault(model, len(self.models))
            if code == len(self.models):
                self.models.append(model)
        self.count[slot], self.model[slot], self.memory_mib[slot] = count, code, memory_mib
        self.free[slot] = 0
        self.free[slot, :count] = MILLI
        for i, milli in (used or {}).items():
            if 0 <= i < count:
                self.free[slot, i] -= milli
        self.generation += 1

    def clear(self, slot: int) -> None:
        self.set_node(slot, 0, "", 0)

    def valid(self, slot: int, devices: Sequence[int], req: DeviceRequest) -> bool:
        """True if ``devices`` are ``req.count`` distinct devices of the slot (free or not)."""
        n = int(self.count[slot])
        return len(devices) == req.count and len(set(devices)) == len(devices) and all(0 <= i < n for i in devices)

    def fits(self, slot: int, devices: Sequence[int], req: DeviceRequest) -> bool:
        """True if ``devices`` (distinct, on the slot) each have ``req.milli`` free."""
        n = int(self.count[slot])
        return (len(devices) == req.count and len(set(devices)) == len(devices)
                and all(0 <= i < n and self.free[slot, i] >= req.milli for i in devices))

    def pick(self, slot: int, req: DeviceRequest) -> tuple[int, ...]:
        """Devices for ``req`` on a slot, best fit: a share takes the fitting device with the least
        free (ties: the lowest index); whole devices take the lowest-indexed wholly free ones.
        () when they do not fit."""
        n = int(self.count[slot])
        free = self.free[slot, :n]
        ok = np.flatnonzero(free >= req.milli)
        if len(ok) < req.count:
            return ()
        if req.share:
            return (int(ok[np.argmin(free[ok])]),)
        return tuple(int(i) for i in ok[: req.count])

    def take(self, slot: int, devices: Sequence[int], milli: int) -> None:
        """Count ``milli`` thousandths on each of ``devices`` (negative: give them back)."""
        n = int(self.count[slot])
        for i in devices:
            if 0 <= i < n:
                self.free[slot, i] -= milli
        self.generation += 1
