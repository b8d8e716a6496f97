"""Load the Alibaba GPU cluster trace v2023 ("openb") into Node and Pod dicts, and replay it.

Data: https://github.com/alibaba/clusterdata, ``cluster-trace-gpu-v2023/csv/``; cite Weng et al.,
"Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent",
USENIX ATC '23. Column meanings are in ``../shared/data/alibaba-gpu-v2023/README.md``.

Nodes (``sn,cpu_milli,memory_mib,gpu,model``) become Nodes with allocatable ``cpu: <m>m``,
``memory: <Mi>Mi``, ``pods: 110`` and, on GPU nodes, ``nvidia.com/gpu: <gpu>`` and
``alibabacloud.com/gpu-milli: <gpu * 1000>``; a non-empty ``model`` becomes the label
``shardsched.io/gpu-model=<model>``.

Pods become one-container Pods requesting ``cpu: <m>m`` and ``memory: <Mi>Mi``, plus GPUs:

- whole GPUs (``gpu_milli == 1000``): ``nvidia.com/gpu: num_gpu`` and
  ``alibabacloud.com/gpu-milli: num_gpu * 1000``;
- a share of one GPU (``num_gpu == 1, gpu_milli < 1000``): ``alibabacloud.com/gpu-milli:
  gpu_milli`` only.

Extended resources are set as limits equal to requests, as the API server requires. Asking a shared
pod for a whole ``nvidia.com/gpu`` would waste the GPU it shares, and asking for none would let it
land on GPU-less nodes, so GPU capacity is also counted in thousandths (``gpu-milli``), which every
GPU pod consumes. These sums are checked per node (NodeResourcesFit, the ledger); the devices are
checked one by one by the GPUDevice plugin (`shardsched.cache.devices`, docs/gpu.md): a share
needs one device with room for it, whole GPUs wholly free devices. ``run --trace`` enables it by
default; without it (``--gpu-aggregate``, or a profile without GPUDevice) a node with two GPUs each
60% used has 800 gpu-milli free and accepts a 700-milli pod that no single device could hold: a
relaxation, and the fragmentation the paper studies becomes invisible.

``gpu_spec`` (``A|B``, any of the models) becomes a required node affinity
``shardsched.io/gpu-model In [A, B]``; ``qos`` becomes the label ``shardsched.io/qos``.
``pod_phase`` and ``scheduled_time`` are production outcomes, not inputs, and are not used.
Files without time columns (the 5-column ``multigpu`` lists) load with every pod created at 0 and
never deleted.

Malformed rows are skipped, each with a ``file:line: what`` message in the `LoadReport` (a
``gpu_milli`` outside 1..1000 for a GPU pod, a node row with a ``model`` but no GPUs, ...); a file
that is missing or whose header lacks a required column raises one `TraceError`. `check_pods`
names the pods no node can take (more GPUs than any node, an unknown GPU model).
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, NamedTuple

from shardsched.api.validation import validate_name
from shardsched.errors import InvalidObjectError, ShardschedError
from shardsched.sim.workload import PAUSE_IMAGE, SCHEDULER_NAME

GPU_RESOURCE = "nvidia.com/gpu"
GPU_MILLI_RESOURCE = "alibabacloud.com/gpu-milli"
GPU_MODEL_LABEL = "shardsched.io/gpu-model"
QOS_LABEL = "shardsched.io/qos"
#: Allocatable pods of every trace node (the kubelet's default maxPods; the trace has no limit).
NODE_MAX_PODS = 110

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
#: Optional pod columns; ``creation_time`` and ``deletion_time`` are read when present.
POD_TIME_COLUMNS = ("creation_time", "deletion_time")

#: Largest count accepted in a numeric column: keeps ``memory_mib`` in bytes far below the 2**62
#: that `shardsched.api.quantity` accepts.
_MAX_COUNT = 2**40
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


class TraceError(ShardschedError):
    """A trace file cannot be read at all: it is missing, unreadable, or its header lacks
    required columns. (Malformed rows are skipped and reported instead, see the module docstring.)"""


class _RowError(Exception):
    """One malformed field; becomes a ``file:line: what`` line of the report."""


@dataclass(slots=True)
class LoadReport:
    """What a load did: ``rows`` data rows read, ``loaded`` objects built, and one
    ``file:line: what`` message per skipped row."""

    path: str
    rows: int = 0
    loaded: int = 0
    skipped: list[str] = field(default_factory=list)


class TracePod(NamedTuple):
    """A trace pod: seconds from trace start when it was created and deleted (None: never)."""

    creation_time_s: float
    deletion_time_s: float | None
    pod: dict


def _count(row: dict[str, str], column: str) -> int:
    value = row[column].strip()
    try:
        n = int(value)
    except ValueError:
        raise _RowError(f"{column} {value!r} is not an integer") from None
    if n < 0:
        raise _RowError(f"{column} {n} is negative")
    if n > _MAX_COUNT:
        raise _RowError(f"{column} {n} is implausibly large (> 2**40)")
    return n


def _seconds(row: dict[str, str], column: str) -> float:
    value = row[column].strip()
    try:
        t = float(value)
    except ValueError:
        raise _RowError(f"{column} {value!r} is not a number of seconds") from None
    if not math.isfinite(t) or t < 0:
        raise _RowError(f"{column} {value!r} is not a time >= 0")
    return t


def _label_value(value: str, column: str) -> str:
    if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
        raise _RowError(f"{column} {value!r} is not a valid label value")
    return value


def _object_name(row: dict[str, str], column: str) -> str:
    name = row[column].strip()
    try:
        validate_name(name, column)
    except InvalidObjectError as e:
        raise _RowError(str(e)) from None
    return name


_Build = Callable[[dict[str, str]], tuple[str, object]]


def _read(path: str | Path, prepare: Callable[[list[str]], tuple[tuple[str, ...], _Build]]) -> tuple[list, LoadReport]:
    """Read a CSV file: ``prepare(header) -> (required columns, build)``, then
    ``build(row) -> (name, item)`` per row. Rows that raise `_RowError`, have the wrong number of
    fields, or repeat a name are skipped and reported."""
    report = LoadReport(str(path))
    label = Path(path).name
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = [h.strip() for h in next(reader, [])]
            required, build = prepare(header)
            missing = [c for c in required if c not in header]
            if missing:
                raise TraceError(f"{label}:1: header lacks column(s) {', '.join(missing)}; expected "
                                 f"{','.join(required)}..., found {','.join(header) or 'an empty file'}")
            items = []
            first_line: dict[str, int] = {}
            for fields in reader:
                if not fields:
                    continue
                report.rows += 1
                where = f"{label}:{reader.line_num}"
                if len(fields) != len(header):
                    report.skipped.append(f"{where}: expected {len(header)} fields, got {len(fields)}")
                    continue
                try:
                    name, item = build(dict(zip(header, fields)))
                except _RowError as e:
                    report.skipped.append(f"{where}: {e}")
                    continue
                if name in first_line:
                    report.skipped.append(f"{where}: duplicate name {name!r} (first at line {first_line[name]})")
                    continue
                first_line[name] = reader.line_num
                items.append(item)
    except OSError as e:
        raise TraceError(f"{path}: cannot read the trace: {e.strerror or e}") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise TraceError(f"{path}: not a CSV text file: {e}") from None
    report.loaded = len(items)
    return items, report


def _node(row: dict[str, str]) -> tuple[str, dict]:
    name, node = _node_row(row)
    return name, node_object(node)


def node_object(node: "NodeRow", max_pods: int = NODE_MAX_PODS) -> dict:
    """The Node dict of a trace node (module docstring), with allocatable ``pods: max_pods``."""
    resources = {"cpu": f"{node.cpu_milli}m", "memory": f"{node.memory_mib}Mi", "pods": str(max_pods)}
    if node.gpu:
        resources[GPU_RESOURCE] = str(node.gpu)
        resources[GPU_MILLI_RESOURCE] = str(node.gpu * 1000)
    labels = {"kubernetes.io/hostname": node.name}
    if node.model:
        labels[GPU_MODEL_LABEL] = node.model
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": labels},
        "spec": {},
        "status": {"capacity": dict(resources), "allocatable": resources,
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }


class NodeRow(NamedTuple):
    """A trace node as numbers: name, CPU (millicores), memory (MiB), GPUs, GPU model ("" none)."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpu: int
    model: str


class PodRow(NamedTuple):
    """A trace pod as numbers: CPU (millicores), memory (MiB), ``num_gpu`` devices of ``gpu_milli``
    thousandths each (0, 0: no GPU), and the GPU models ``gpu_spec`` accepts (empty: any)."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...]


def _gpu_model(row: dict[str, str], gpu: int) -> str:
    model = _label_value(row["model"].strip(), "model")
    if model and not gpu:
        raise _RowError(f"model {model!r} on a node without GPUs (gpu 0)")
    return model


def _node_row(row: dict[str, str]) -> tuple[str, NodeRow]:
    name = _object_name(row, "sn")
    gpu = _count(row, "gpu")
    return name, NodeRow(name, _count(row, "cpu_milli"), _count(row, "memory_mib"), gpu, _gpu_model(row, gpu))


def _gpu_spec(row: dict[str, str]) -> tuple[str, ...]:
    raw = row.get("gpu_spec", "").strip()
    if not raw:
        return ()
    models = tuple(sorted({_label_value(m.strip(), "gpu_spec") for m in raw.split("|") if m.strip()}))
    if not models:
        raise _RowError(f"gpu_spec {raw!r} names no GPU model")
    return models


def _pod_row(row: dict[str, str]) -> tuple[str, PodRow]:
    name = _object_name(row, "name")
    num_gpu, gpu_milli = _count(row, "num_gpu"), _count(row, "gpu_milli")
    _gpu_resources(num_gpu, gpu_milli)
    if num_gpu == 0:
        gpu_milli = 0
    return name, PodRow(name, _count(row, "cpu_milli"), _count(row, "memory_mib"), num_gpu, gpu_milli, _gpu_spec(row))


def load_node_rows(path: str | Path) -> tuple[list[NodeRow], LoadReport]:
    """`NodeRow` per row of an ``openb_node_list_*.csv`` file, in file order; malformed rows are
    skipped and reported as `load_nodes` does.

    Raises:
        TraceError: as `load_nodes`.
    """
    return _read(path, lambda header: (NODE_COLUMNS, _node_row))


def load_pod_rows(path: str | Path) -> tuple[list[PodRow], LoadReport]:
    """`PodRow` per row of an ``openb_pod_list_*.csv`` file, in file order (time columns ignored);
    malformed rows are skipped and reported as `load_pods` does.

    Raises:
        TraceError: the file cannot be read or its header lacks a column of `POD_COLUMNS`.
    """
    return _read(path, lambda header: (POD_COLUMNS, _pod_row))


def load_nodes(path: str | Path) -> tuple[list[dict], LoadReport]:
    """Node dicts from an ``openb_node_list_*.csv`` file, in file order (see the module docstring).

    Raises:
        TraceError: the file cannot be read or its header lacks a column of `NODE_COLUMNS`.
    """
    return _read(path, lambda header: (NODE_COLUMNS, _node))


def _gpu_resources(num_gpu: int, gpu_milli: int) -> dict[str, str]:
    """Extended resources of a pod under the trace's GPU rule (module docstring)."""
    if num_gpu == 0:
        if gpu_milli:
            raise _RowError(f"gpu_milli {gpu_milli} without num_gpu")
        return {}
    if not 1 <= gpu_milli <= 1000:
        raise _RowError(f"gpu_milli {gpu_milli} is not in 1..1000")
    if gpu_milli == 1000:
        return {GPU_RESOURCE: str(num_gpu), GPU_MILLI_RESOURCE: str(num_gpu * 1000)}
    if num_gpu != 1:
        raise _RowError(f"a GPU share (gpu_milli {gpu_milli}) needs num_gpu 1, got {num_gpu}")
    return {GPU_MILLI_RESOURCE: str(gpu_milli)}


def _pod_builder(namespace: str, scheduler_name: str, timed: bool) -> _Build:
    def build(row: dict[str, str]) -> tuple[str, TracePod]:
        name, pod_row = _pod_row(row)
        created, deleted = 0.0, None
        if timed:
            created = _seconds(row, "creation_time")
            if row["deletion_time"].strip():
                deleted = _seconds(row, "deletion_time")
                if deleted < created:
                    raise _RowError(f"deletion_time {deleted:g} is before creation_time {created:g}")
        pod = pod_object(pod_row, namespace, scheduler_name)
        qos = row.get("qos", "").strip()
        if qos:
            pod["metadata"]["labels"] = {QOS_LABEL: _label_value(qos, "qos")}
        return name, TracePod(created, deleted, pod)

    return build


def pod_object(pod: PodRow, namespace: str = "default", scheduler_name: str = SCHEDULER_NAME) -> dict:
    """The Pod dict of a trace pod (module docstring): one container requesting its CPU, memory
    and GPUs (`_gpu_resources`), its ``gpu_spec`` as required node affinity on the model label."""
    gpus = _gpu_resources(pod.num_gpu, pod.gpu_milli)
    resources: dict = {"requests": {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi", **gpus}}
    if gpus:
        resources["limits"] = dict(gpus)
    spec: dict = {
        "schedulerName": scheduler_name,
        "containers": [{"name": "main", "image": PAUSE_IMAGE, "resources": resources}],
    }
    if pod.gpu_spec:
        term = {"matchExpressions": [{"key": GPU_MODEL_LABEL, "operator": "In", "values": list(pod.gpu_spec)}]}
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod.name, "namespace": namespace}, "spec": spec}


def load_pods(path: str | Path, namespace: str = "default",
              scheduler_name: str = SCHEDULER_NAME) -> tuple[list[TracePod], LoadReport]:
    """Pods from an ``openb_pod_list_*.csv`` file, in file order (see the module docstring).

    Args:
        namespace, scheduler_name: set on every pod.

    Returns:
        ([(creation_time_s, deletion_time_s or None, pod dict)], report). Without a
        ``creation_time`` column every pod is created at 0 and never deleted.

    Raises:
        TraceError: the file cannot be read or its header lacks a column of `POD_COLUMNS` (or has
            only one of ``creation_time``/``deletion_time``).
    """
    def prepare(header: list[str]) -> tuple[tuple[str, ...], _Build]:
        timed = any(c in header for c in POD_TIME_COLUMNS)
        return POD_COLUMNS + (POD_TIME_COLUMNS if timed else ()), _pod_builder(namespace, scheduler_name, timed)

    return _read(path, prepare)


def check_pods(pods: Iterable[TracePod], nodes: Iterable[dict]) -> list[str]:
    """Messages for the trace pods that no node of ``nodes`` can ever take, one per pod, naming it:
    more GPUs than any node has, a ``gpu_spec`` that names no model of the nodes, GPUs asked of a
    cluster without GPU nodes. Such pods are still replayed (they stay unschedulable, with the
    scheduler's reasons); the message tells the trace's problem from the scheduler's."""
    most, models = 0, set()
    for n in nodes:
        alloc = n["status"]["allocatable"]
        most = max(most, int(alloc.get(GPU_RESOURCE, 0)), int(alloc.get(GPU_MILLI_RESOURCE, 0)) // 1000)
        model = n["metadata"].get("labels", {}).get(GPU_MODEL_LABEL)
        if model:
            models.add(model)
    out = []
    for _, _, pod in pods:
        name = pod["metadata"]["name"]
        req = pod["spec"]["containers"][0]["resources"]["requests"]
        count = int(req.get(GPU_RESOURCE, 0)) or (1 if GPU_MILLI_RESOURCE in req else 0)
        if count and not most:
            out.append(f"{name}: asks for GPUs, and no node has any")
        elif count > most:
            out.append(f"{name}: num_gpu {count} is more than any node's GPUs ({most})")
        terms = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}) \
            .get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])
        for t in terms:
            for e in t.get("matchExpressions", []):
                if e["key"] == GPU_MODEL_LABEL and not models.intersection(e["values"]):
                    out.append(f"{name}: gpu_spec {'|'.join(e['values'])} names no GPU model of the nodes")
    return out


CREATE, DELETE = "create", "delete"


class ReplayStep(NamedTuple):
    """One replay action: at ``due_s`` (seconds after the first creation, scaled), ``action``
    `CREATE` or `DELETE` the ``pod``."""

    due_s: float
    action: str
    pod: dict


#: the default replay (`replay_compression`) keeps every pod that lives in the trace alive at
#: least this long: well above the time a pod takes from creation to bound in an embedded run
#: with arrivals spread over time (tens of milliseconds on 2 busy cores)
MIN_REPLAY_LIFETIME_S = 0.25
#: the default replay holds its clock, at a pod's deletion, until the pod is bound or found
#: unschedulable, for at most this long: a pod cannot end before it ran, and a scheduler slowed
#: down (a busy machine) then shifts the rest of the replay instead of losing its pods
REPLAY_BIND_WAIT_S = 10.0


class ReplayCompression(NamedTuple):
    """How a trace's time becomes replay time (`TraceReplay`): divided by ``time_scale``, then every
    pause between consecutive steps longer than ``max_pause_s`` (replay seconds; None: none) is
    shortened to it. ``duration_s``: the replay's length; ``shortest_lifetime_s``: the shortest
    positive pod lifetime in the trace (trace seconds; None when no pod is deleted after it is
    created); ``bind_wait_s``: how long the replay holds its clock at a pod's deletion until the
    pod is bound or unschedulable (None: it does not; the embedded run does the holding)."""

    time_scale: float
    max_pause_s: float | None
    duration_s: float
    shortest_lifetime_s: float | None
    bind_wait_s: float | None


def _due_times(pods: list[TracePod], time_scale: float, max_pause_s: float | None) -> dict[float, float]:
    """Trace time -> replay time of every creation and deletion of ``pods`` (module docstring of
    `TraceReplay`): shifted to the first creation, divided by ``time_scale``, pauses capped."""
    t0 = min((p[0] for p in pods), default=0.0)
    times = sorted({t for c, d, _ in pods for t in (c, d) if t is not None})
    out: dict[float, float] = {}
    due = 0.0
    previous = t0
    for t in times:
        gap = (t - previous) / time_scale
        due += gap if max_pause_s is None else min(gap, max_pause_s)
        out[t] = due
        previous = t
    return out


def replay_compression(pods: Iterable[TracePod], time_scale: float | None = None,
                       min_lifetime_s: float = MIN_REPLAY_LIFETIME_S) -> ReplayCompression:
    """The replay's time compression: the given ``time_scale`` applied uniformly, or (None) the
    default derived from the trace, under which every pod that lives in the trace lives at least
    ``min_lifetime_s`` in the replay, so that it can be scheduled before it is deleted, and whose
    clock waits (`REPLAY_BIND_WAIT_S`) for a pod due for deletion before it was bound.

    The default divides time by the shortest positive lifetime over ``min_lifetime_s`` and shortens
    every pause between steps to at most ``min_lifetime_s``: a pod's replay lifetime is then either
    its trace lifetime divided (at least ``min_lifetime_s`` for the shortest) or contains a
    shortened pause (``min_lifetime_s``). The order of creations and deletions is the trace's, so
    the cluster goes through the same states; only idle time goes. A trace spanning months with
    lifetimes of seconds (the Alibaba GPU trace) replays in minutes, at most ``min_lifetime_s`` per
    distinct time of a step. Pods deleted when created (lifetime 0) stay so. Without any positive
    lifetime, time is not divided, only pauses shortened.

    Raises:
        ValueError: ``time_scale`` or ``min_lifetime_s`` <= 0.
    """
    if time_scale is not None and not time_scale > 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    if not min_lifetime_s > 0:
        raise ValueError(f"min_lifetime_s must be > 0, got {min_lifetime_s}")
    pods = list(pods)
    lifetimes = [d - c for c, d, _ in pods if d is not None and d > c]
    shortest = min(lifetimes) if lifetimes else None
    if time_scale is None:
        scale, pause, wait = (shortest / min_lifetime_s if shortest else 1.0), min_lifetime_s, REPLAY_BIND_WAIT_S
    else:
        scale, pause, wait = time_scale, None, None
    due = _due_times(pods, scale, pause)
    return ReplayCompression(scale, pause, max(due.values(), default=0.0), shortest, wait)


class TraceReplay:
    """Trace pods as a time-ordered list of create and delete steps.

    Times are shifted so the first creation is at 0 and divided by ``time_scale`` (100 replays a
    day in under 15 minutes); with ``max_pause_s``, every pause between consecutive steps longer
    than that (after the division) is shortened to it, which keeps the order of the steps
    (`replay_compression` chooses both). Among steps due at the same time, deletions come first
    (they free room), then creations, then deletions of pods created at that same instant (a pod
    is never deleted before it is created); ties otherwise keep the input order. Pods never
    deleted get no delete step.

    Args:
        pods: (creation_time_s, deletion_time_s or None, pod) items, e.g. from `load_pods`.
        time_scale: > 0.
        max_pause_s: > 0 replay seconds, or None for no limit.

    Raises:
        ValueError: ``time_scale`` or ``max_pause_s`` <= 0.
    """

    def __init__(self, pods: Iterable[TracePod], time_scale: float = 1.0, max_pause_s: float | None = None) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        if max_pause_s is not None and not max_pause_s > 0:
            raise ValueError(f"max_pause_s must be > 0, got {max_pause_s}")
        pods = list(pods)
        due = _due_times(pods, time_scale, max_pause_s)
        keyed: list[tuple[float, int, int, ReplayStep]] = []
        for seq, (created, deleted, pod) in enumerate(pods):
            keyed.append((due[created], 1, seq, ReplayStep(due[created], CREATE, pod)))
            if deleted is not None:
                keyed.append((due[deleted], 2 if deleted == created else 0, seq, ReplayStep(due[deleted], DELETE, pod)))
        keyed.sort(key=lambda k: k[:3])
        self.steps: list[ReplayStep] = [k[3] for k in keyed]

    def __iter__(self) -> Iterator[ReplayStep]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)
