"""``bench gpu-frag``: the fragmentation experiment of Weng et al. (USENIX ATC '23) on the openb files.

The cluster is the 1,213 GPU nodes of ``openb_node_list_gpu_node.csv`` (pods capacity `NODE_PODS`).
A pod list is sorted by name, shuffled with the seed, then inflated to `INFLATION` (130%) of the
cluster's GPU capacity by appending clones named ``<name>-tuned-<i>`` (``i`` from 0) drawn uniformly
from the list, or thinned by removing pods drawn uniformly while its GPU demand is above that. Each pod
gets one attempt, in that order, and nothing is deleted. A pod's GPU demand is ``num_gpu *
gpu_milli`` thousandths. After every pod the arrived and the allocated GPU thousandths are
recorded; the result is the unallocated share of the cluster's GPU capacity, ``(capacity -
allocated) / capacity``, when the arrived demand first reaches 100% (and 130%) of the capacity.

Each decision: the nodes with the CPU, memory, a pod slot and the devices (`scoring.device_fit`),
and a model the pod's ``gpu_spec`` accepts; then the policy's scores (`scoring.score`, the
GPUDevice plugin's strategies), the best node (ties broken uniformly at random), the policy's
device for a share (the lowest-indexed wholly free devices for whole GPUs). ``fgd`` decides as the
FGD simulator (the paper's artifact) does instead (`SIMULATOR_RULE`): its node scores are the
plugin's integers in [0, 100], ``int(100 * sigmoid(delta / 1000))``, and ties go to the node with
the smallest name, as its kube-scheduler fork's ``selectHost`` chooses them. Placements can be
written one JSON line per pod (`Placement`), from which the result can be recomputed alone.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from shardsched.cache.devices import MILLI
from shardsched.plugins.gpudevice import scoring
from shardsched.sim.trace import NodeRow, PodRow, TraceError, load_node_rows, load_pod_rows

WORKLOADS = Path(__file__).parent / "workloads" / "openb"
NODE_FILE = "openb_node_list_gpu_node.csv"
POD_LISTS = ("default", "gpushare40", "gpuspec33", "multigpu50", "cpu050")
#: policy name on the command line -> GPUDevice scoring strategy
POLICIES = {"random": scoring.RANDOM, "bestfit": scoring.BEST_FIT, "packing": scoring.PACKING,
            "dotprod": scoring.DOT_PROD, "fgd": scoring.FGD, "fgd-bestfit": scoring.FGD_BEST_FIT,
            "fgd-plus": scoring.FGD_PLUS}
DEFAULT_POLICY = "fgd-plus"
#: policies decided by the FGD simulator's rule (module docstring): integer scores, ties to the
#: smallest node name; the others compare raw scores and break ties uniformly at random
SIMULATOR_RULE = ("fgd", "packing", "dotprod")
NODE_PODS = 1001
INFLATION = 1.3
ARRIVAL_POINTS = (1.0, 1.3)
#: the paper's unallocated GPU % at 100% arrival (Fig. 7, default list) and FGD's on the others
PAPER = {
    "default": {"random": 13.70, "dotprod": 9.38, "clustering": 8.35, "packing": 8.22, "bestfit": 7.14, "fgd": 4.77},
    "gpushare40": {"fgd": 6.04}, "multigpu50": {"fgd": 2.91}, "cpu050": {"fgd": 5.00},
    "gpuspec33": {"fgd": 12.16},
}
PAPER_130 = {"gpuspec33": {"fgd": 5.45}}


def pod_list_path(name: str) -> Path:
    """The CSV of pod list ``name`` (one of `POD_LISTS`), or ``name`` itself if it is a file."""
    if name in POD_LISTS:
        return WORKLOADS / f"openb_pod_list_{name}.csv"
    return Path(name)


def gpu_demand(pod: PodRow) -> int:
    return pod.num_gpu * pod.gpu_milli


def inflate(pods: Sequence[PodRow], capacity_milli: int, seed: int, ratio: float = INFLATION) -> list[PodRow]:
    """The submission order (module docstring): sorted by name, shuffled with ``seed``, then
    clones ``<name>-tuned-<i>`` appended until the GPU demand reaches ``ratio * capacity_milli``,
    or pods removed at random while it is above. Deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    order = sorted(pods, key=lambda p: p.name)
    order = [order[i] for i in rng.permutation(len(order))]
    target = ratio * capacity_milli
    demand = sum(gpu_demand(p) for p in order)
    if demand < target:
        base, i = list(order), 0
        while demand < target and any(gpu_demand(p) for p in base):
            p = base[int(rng.integers(len(base)))]
            order.append(p._replace(name=f"{p.name}-tuned-{i}"))
            demand += gpu_demand(p)
            i += 1
    else:
        while order and demand > target:
            p = order.pop(int(rng.integers(len(order))))
            demand -= gpu_demand(p)
    return order


def typical_pods(pods: Iterable[PodRow]) -> scoring.TypicalPods:
    """FGD's workload: the shapes of the pod list (`scoring.TypicalPods.from_shapes`)."""
    return scoring.TypicalPods.from_shapes((p.cpu_milli, p.num_gpu, p.gpu_milli, frozenset(p.gpu_spec), p.memory_mib)
                                           for p in pods)


@dataclass
class Placement:
    """One line of ``--placements-out``: the pod, then its node (None: not placed) and devices."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: str
    node: str | None
    devices: list[int]


@dataclass
class RunResult:
    """One seed: unallocated GPU % at each arrival point, the curve, decision time."""

    pod_list: str
    policy: str
    seed: int
    pods: int
    placed: int
    capacity_milli: int
    unallocated_pct: dict[str, float]
    decision_ms_mean: float
    wall_s: float
    #: (arrived %, allocated %) of the capacity, one point per 1% of arrival
    curve: list[tuple[float, float]] = field(default_factory=list)
    #: 1: decided in this process; more: through the sharded runtime, in waves of ``wave`` pods
    shards: int = 1
    wave: int = 0
    #: through the runtime: pods deleted unplaced because they were neither bound nor found
    #: unschedulable in time (`gpufrag_shards.STALL_TIMEOUT_S`)
    stalled: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


class Cluster:
    """The bench's cluster as numpy arrays, one row per node (module docstring)."""

    def __init__(self, nodes: Sequence[NodeRow]) -> None:
        self.names = [n.name for n in nodes]
        self.models = sorted({n.model for n in nodes if n.model})
        code = {m: i for i, m in enumerate(self.models)}
        self.cpu_alloc = np.array([n.cpu_milli for n in nodes], np.int64)
        self.cpu_free = self.cpu_alloc.copy()
        self.mem_free = np.array([n.memory_mib for n in nodes], np.int64)
        self.pods_free = np.full(len(nodes), NODE_PODS, np.int64)
        self.count = np.array([n.gpu for n in nodes], np.int64)
        width = max(1, int(self.count.max(initial=0)))
        self.free = np.zeros((len(nodes), width), np.int32)
        for i, n in enumerate(nodes):
            self.free[i, : n.gpu] = MILLI
        self.model = np.array([code.get(n.model, -1) for n in nodes], np.int32)
        self.capacity_milli = int(self.count.sum()) * MILLI

    def model_mask(self, spec: Sequence[str]) -> np.ndarray | None:
        """bool (n,): nodes of a model in ``spec`` (None: no constraint)."""
        if not spec:
            return None
        codes = [self.models.index(m) for m in spec if m in self.models]
        return np.isin(self.model, codes)

    def check_pod(self, pod: PodRow) -> str | None:
        """Why no node of this cluster could ever take ``pod`` ("" when it is not that simple:
        None), the bad-input message of the issue's rules."""
        if pod.num_gpu > int(self.count.max(initial=0)):
            return f"{pod.name}: num_gpu {pod.num_gpu} is more than any node's GPUs ({int(self.count.max(initial=0))})"
        unknown = [m for m in pod.gpu_spec if m not in self.models]
        if pod.gpu_spec and len(unknown) == len(pod.gpu_spec):
            return f"{pod.name}: gpu_spec names no GPU model of the cluster ({', '.join(unknown)})"
        return None


class _Scorer:
    """The policy's scores of the feasible nodes, kept per pod shape for every node and recomputed
    only on the nodes that changed since (a node's score depends on its own state alone), as the
    scheduler's per-signature cache does."""

    def __init__(self, cluster: Cluster, strategy: str, typical, access, rng: np.random.Generator,
                 pressure: np.ndarray | None = None) -> None:
        self.cluster, self.strategy, self.typical, self.access, self.rng = cluster, strategy, typical, access, rng
        self.pressure = pressure
        self.log: list[int] = []
        self.entries: dict[scoring.PodShape, list] = {}
        self.cached = strategy != scoring.RANDOM

    def changed(self, node: int) -> None:
        self.log.append(node)

    def _compute(self, shape: scoring.PodShape, rows: np.ndarray | slice):
        c = self.cluster
        view = scoring.NodeView(c.cpu_free[rows], c.cpu_alloc[rows], c.free[rows], c.count[rows], c.model[rows],
                                c.mem_free[rows])
        return scoring.score(self.strategy, view, shape, self.typical, self.access, self.rng, self.pressure)

    def scores(self, shape: scoring.PodShape, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(scores, device) over the feasible nodes ``idx``."""
        if not self.cached:
            return self._compute(shape, idx)
        entry = self.entries.get(shape)
        n = len(self.cluster.names)
        if entry is None or len(self.log) - entry[2] > n // 2:
            sc, dev = self._compute(shape, slice(0, n))
            entry = self.entries[shape] = [sc.astype(np.float64), dev.astype(np.int64), len(self.log)]
        elif len(self.log) > entry[2]:
            dirty = np.unique(np.array(self.log[entry[2]:], np.int64))
            sc, dev = self._compute(shape, dirty)
            entry[0][dirty], entry[1][dirty], entry[2] = sc, dev, len(self.log)
        return entry[0][idx], entry[1][idx]


def run_one(nodes: Sequence[NodeRow], pods: Sequence[PodRow], pod_list: str, policy: str, seed: int,
            placements_out: str | None = None, problems: list[str] | None = None) -> RunResult:
    """One seed of the experiment (module docstring). ``problems`` collects the bad-input messages
    (pods that no node could take are still submitted, and stay unplaced)."""
    strategy = POLICIES[policy]
    cluster = Cluster(nodes)
    order = inflate(pods, cluster.capacity_milli, seed)
    typical = typical_pods(pods) if strategy in scoring.NEEDS_TYPICAL else None
    access = typical.access(cluster.models) if typical is not None else None
    rng = np.random.default_rng(seed)
    pressure = None
    if strategy == scoring.FGD_PLUS:
        capacity = np.array([cluster.count[cluster.model == i].sum() * MILLI for i in range(len(cluster.models))])
        pressure = scoring.model_pressure(typical, cluster.models, capacity)
    scorer = _Scorer(cluster, strategy, typical, access, rng, pressure)
    simulator_rule = policy in SIMULATOR_RULE
    name_rank = np.argsort(np.argsort(np.array(cluster.names)))
    cap = cluster.capacity_milli
    arrived = allocated = placed = 0
    points = {p: None for p in ARRIVAL_POINTS}
    curve: list[tuple[float, float]] = []
    next_pct = 0.0
    lines: list[str] = []
    masks: dict[tuple[str, ...], np.ndarray | None] = {}
    decide_s = 0.0
    t_start = time.perf_counter()
    for pod in order:
        shape = scoring.PodShape(pod.cpu_milli, pod.num_gpu, pod.gpu_milli, pod.memory_mib)
        t0 = time.perf_counter()
        ok = (cluster.cpu_free >= pod.cpu_milli) & (cluster.mem_free >= pod.memory_mib) & (cluster.pods_free > 0)
        if pod.num_gpu:
            ok &= scoring.device_fit(cluster.free, shape)
        if pod.gpu_spec:
            if pod.gpu_spec not in masks:
                masks[pod.gpu_spec] = cluster.model_mask(pod.gpu_spec)
            ok &= masks[pod.gpu_spec]
        idx = np.flatnonzero(ok)
        node = None
        devices: list[int] = []
        if len(idx):
            scores, device = scorer.scores(shape, idx)
            if simulator_rule:
                scores = scoring.to_node_score(strategy, scores)
            best = np.flatnonzero(scores >= scores.max() - 1e-9)
            if len(best) == 1:
                j = int(best[0])
            elif simulator_rule:
                j = int(best[np.argmin(name_rank[idx[best]])])
            else:
                j = int(best[rng.integers(len(best))])
            node = int(idx[j])
            if shape.share:
                devices = [int(device[j])]
            elif pod.num_gpu:
                devices = [int(d) for d in np.flatnonzero(cluster.free[node] >= MILLI)[: pod.num_gpu]]
            scorer.changed(node)
            cluster.cpu_free[node] -= pod.cpu_milli
            cluster.mem_free[node] -= pod.memory_mib
            cluster.pods_free[node] -= 1
            for d in devices:
                cluster.free[node, d] -= pod.gpu_milli
            allocated += gpu_demand(pod)
            placed += 1
        decide_s += time.perf_counter() - t0
        arrived += gpu_demand(pod)
        for p in ARRIVAL_POINTS:
            if points[p] is None and arrived >= p * cap:
                points[p] = 100.0 * (cap - allocated) / cap
        while arrived * 100.0 >= next_pct * cap:
            curve.append((round(next_pct, 2), round(100.0 * allocated / cap, 3)))
            next_pct += 1.0
        if placements_out is not None:
            lines.append(json.dumps(asdict(Placement(pod.name, pod.cpu_milli, pod.memory_mib, pod.num_gpu,
                                                     pod.gpu_milli, "|".join(pod.gpu_spec),
                                                     None if node is None else cluster.names[node], devices))))
    if placements_out is not None:
        Path(placements_out).parent.mkdir(parents=True, exist_ok=True)
        Path(placements_out).write_text("\n".join(lines) + "\n")
    if problems is not None:
        problems.extend(never_placeable(nodes, pods))
    unallocated = {f"{int(round(p * 100))}%": (v if v is not None else 100.0 * (cap - allocated) / cap)
                   for p, v in points.items()}
    return RunResult(pod_list, policy, seed, len(order), placed, cap, unallocated,
                     1000.0 * decide_s / max(1, len(order)), time.perf_counter() - t_start, curve)


def never_placeable(nodes: Sequence[NodeRow], pods: Iterable[PodRow]) -> list[str]:
    """The bad-input messages (`Cluster.check_pod`) of the pods no node of ``nodes`` could take, once each."""
    cluster = Cluster(nodes)
    out: list[str] = []
    for pod in pods:
        why = cluster.check_pod(pod)
        if why and why not in out:
            out.append(why)
    return out


def write_placements(path: str, placements: Iterable[dict]) -> None:
    """``--placements-out``: one JSON line per `Placement` (as a dict), in submission order."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(p) + "\n" for p in placements))


def tally(placements: Iterable[dict], nodes: Sequence[NodeRow]) -> tuple[dict[str, float], list[tuple[float, float]]]:
    """(unallocated GPU % at each arrival point, the allocation curve as `RunResult.curve`) from
    `Placement` dicts in submission order alone, after checking that no device holds more than
    1000 thousandths and no node more than its CPU.

    Raises:
        ValueError: a placement breaks a device's or a node's capacity, or names an unknown node.
    """
    cluster = Cluster(nodes)
    index = {n: i for i, n in enumerate(cluster.names)}
    cap = cluster.capacity_milli
    arrived = allocated = 0
    out: dict[str, float] = {}
    curve: list[tuple[float, float]] = []
    next_pct = 0.0
    for p in placements:
        demand = p["num_gpu"] * p["gpu_milli"]
        arrived += demand
        if p["node"] is not None:
            i = index.get(p["node"])
            if i is None:
                raise ValueError(f"{p['name']}: unknown node {p['node']!r}")
            if len(p["devices"]) != p["num_gpu"] or len(set(p["devices"])) != len(p["devices"]):
                raise ValueError(f"{p['name']}: {p['num_gpu']} GPUs asked, devices {p['devices']}")
            for d in p["devices"]:
                if d >= cluster.count[i]:
                    raise ValueError(f"{p['name']}: {p['node']} has no device {d}")
                cluster.free[i, d] -= p["gpu_milli"]
                if cluster.free[i, d] < 0:
                    raise ValueError(f"{p['name']}: device {d} of {p['node']} over 1000 thousandths")
            cluster.cpu_free[i] -= p["cpu_milli"]
            if cluster.cpu_free[i] < 0:
                raise ValueError(f"{p['name']}: {p['node']} over its CPU")
            allocated += demand
        for point in ARRIVAL_POINTS:
            key = f"{int(round(point * 100))}%"
            if key not in out and arrived >= point * cap:
                out[key] = 100.0 * (cap - allocated) / cap
        while arrived * 100.0 >= next_pct * cap:
            curve.append((round(next_pct, 2), round(100.0 * allocated / cap, 3)))
            next_pct += 1.0
    for point in ARRIVAL_POINTS:
        out.setdefault(f"{int(round(point * 100))}%", 100.0 * (cap - allocated) / cap)
    return out, curve


def recompute(placements: Iterable[dict], nodes: Sequence[NodeRow]) -> dict[str, float]:
    """The unallocated GPU % at each arrival point from ``--placements-out`` lines alone (`tally`).

    Raises:
        ValueError: as `tally`.
    """
    return tally(placements, nodes)[0]


def load(pod_list: str, node_file: str | None = None) -> tuple[list[NodeRow], list[PodRow], list[str]]:
    """Nodes and pods of the experiment, and the messages of the rows skipped.

    Raises:
        TraceError: a file cannot be read.
    """
    nodes, nrep = load_node_rows(node_file or WORKLOADS / NODE_FILE)
    pods, prep = load_pod_rows(pod_list_path(pod_list))
    if not nodes:
        raise TraceError(f"{nrep.path}: no node row could be read")
    return nodes, pods, nrep.skipped + prep.skipped


def summarize(results: Sequence[RunResult]) -> dict:
    """Mean and sample standard deviation over seeds of each arrival point, and the paper's value."""
    first = results[0]
    out = {"pod_list": first.pod_list, "policy": first.policy, "seeds": [r.seed for r in results],
           "shards": first.shards, "wave": first.wave, "stalled": sum(len(r.stalled) for r in results),
           "decision_ms_mean": statistics.fmean(r.decision_ms_mean for r in results),
           "wall_s_total": sum(r.wall_s for r in results)}
    for key in first.unallocated_pct:
        vals = [r.unallocated_pct[key] for r in results]
        out[f"unallocated_{key}_mean"] = statistics.fmean(vals)
        out[f"unallocated_{key}_sd"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
    out["paper_100%"] = PAPER.get(first.pod_list, {}).get(first.policy)
    out["paper_130%"] = PAPER_130.get(first.pod_list, {}).get(first.policy)
    out["paper_fgd_100%"] = PAPER.get(first.pod_list, {}).get("fgd")
    out["paper_fgd_130%"] = PAPER_130.get(first.pod_list, {}).get("fgd")
    return out


def plot(path: str, results: Sequence[RunResult]) -> str:
    """Allocated against arrived GPU (% of capacity), one curve per seed; the diagonal is "all
    placed". Returns ``path``."""
    from shardsched.bench.plots import _pyplot

    plt = _pyplot()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        xs, ys = zip(*r.curve) if r.curve else ((), ())
        ax.plot(xs, ys, lw=0.8, alpha=0.7, label=f"seed {r.seed}" if len(results) <= 3 else None)
    ax.plot([0, 100], [0, 100], color="grey", lw=0.6, ls=":")
    ax.axhline(100, color="grey", lw=0.6)
    ax.axvline(100, color="black", lw=0.6, ls="--")
    first = results[0]
    ax.set_xlabel("arrived GPU demand (% of cluster GPU capacity)")
    ax.set_ylabel("allocated GPU (% of capacity)")
    ax.set_title(f"openb {first.pod_list}, policy {first.policy}, {len(results)} seed(s)")
    if len(results) <= 3:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
