"""``bench perf``: kube-scheduler's scheduler_perf workloads on the embedded simulated cluster.

The workloads are read from upstream's ``*/performance-config.yaml`` files and templates (a copy
ships in ``shardsched/bench/workloads/scheduler_perf``, with its source and licence in its README):
each test case is a list of ops
(``createNodes``, ``createPods``, ``churn``, ...) whose counts come from a workload's ``params``;
``threshold`` is the pods/s upstream expects of kube-scheduler on that workload. The op semantics
follow upstream's ``scheduler_perf.go``:

- ``createNodes``: nodes stamped from a template (``generateName`` + index; ``{{.Index}}`` replaced;
  ``node-default.yaml`` when none is named, as upstream's base node),
  ``status.allocatable`` defaulted to ``capacity`` as the API server's ``SetDefaults_NodeStatus``
  does, and ``labelNodePrepareStrategy`` (a label value drawn at random from the list);
- ``createPods`` (``pod-default.yaml`` when no template is named, as upstream's base pod) before
  the measured op (the *init pods*): placed here with the decision path
  (`GenericScheduler` over the workload's nodes, the same profile) and created already bound.
  Upstream has kube-scheduler schedule them without measuring; the cluster they leave is the same;
- the ``createPods`` op with ``collectMetrics``: the measured pods, all created in one call once
  the init pods exist; throughput = measured pods bound / (last bind - their creation), and the
  latencies are creation -> bound;
- ``churn``: started once the init pods exist, before the measured pods, and stopped when they are
  all bound (upstream stops it at the end of the workload): ``create`` makes one object per template every interval,
  ``recreate`` replaces the previous one (delete, then create);
- ``createAny`` of a Service, ReplicationController, ReplicaSet or StatefulSet: put into the
  simulated cluster with the nodes (PodTopologySpread's default constraints read its selector);
  of another kind: the workload is skipped;
- ``createAny`` of upstream's PodGroup (``scheduling.k8s.io``, the Workload API's, with a
  ``gang`` policy; ``podgroup/gangscheduling``): a scheduler-plugins PodGroup of that name with
  ``minMember`` = ``minCount``, put into the simulated cluster with the nodes, and each pod that
  names it in ``spec.schedulingGroup.podGroupName`` joins it by the
  ``scheduling.x-k8s.io/pod-group`` label instead: what a controller turning Workload API groups
  into PodGroups does (``docs/gangs.md``). These workloads run with a profile that adds
  Coscheduling to the defaults (`GANG_CONFIG`; with ``--config``, its first profile must enable
  Coscheduling), as upstream's ``GenericWorkload`` gate adds its gang plugin;
- ``createPods`` with ``persistentVolumeTemplatePath`` and ``persistentVolumeClaimTemplatePath``
  (``volumes/``): each pod with its own claim bound to its own PV, and ``createNodes`` with
  ``nodeAllocatableStrategy``: the nodes' attachable-volume allocatable and a CSINode per node,
  as `shardsched.bench.perf_volumes` says; the PVs, claims and CSINodes are created in the
  simulated cluster with the nodes, so the runtime's volume plugins decide with them;
- ``createNamespaces``, ``barrier`` and ``waitForPodGroups``: nothing to do here (the simulated
  cluster needs no namespace objects; ops already run in order; the PodGroups exist before any pod).

Templates are Go text/template files: ``{{.Index}}``, the op's ``templateParams`` (``$name`` read
from the workload's params) and upstream's integer functions (``DivideInt`` ...) are evaluated
(`_render`); a template with another action skips its workload with the reason. ``createPods``'
count is ``countParam`` times ``countMultiplierParam``.

What cannot be expressed is skipped with the reason (`plan`), which names the op or field and
the file: ops and op fields this runner does not know, pods with scheduling gates (init pods are
created bound here), pods that need plugins shardsched does not implement (DynamicResources), and
pod templates naming claims of their own (no op here creates those). A workload that runs but has
a part ignored is marked ``partial`` with a note (Services in churn, which upstream's default
spreading constraints would read). Workloads that differ from another one only by kube-scheduler
feature gates (same ops and params) are the same workload here and run once.

Preemption (``PreemptionBasic``, ``PreemptionAsync``, ``Unschedulable``) runs as in the sharded
runtime: the coordinator's DefaultPreemption over the whole cluster, victims deleted through the
simulated cluster's API. Each result counts the preemptions and their victims (the coordinator's).

Two workloads are not in the local copy: ``HostPortConflict`` from upstream's
``batching/performance-config.yaml`` (the only user of ``pod-hostport-80.yaml``; no threshold
upstream), and ``PreemptionBasic/5000Nodes``, which upstream keeps commented out because it never
finished in time there (kubernetes #108308; no threshold); both are defined below in upstream's
format and read by the same code.
"""

from __future__ import annotations

import fnmatch
import os
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from shardsched.api.objects import POD_GROUP_LABEL, NodeInfo, PodInfo
from shardsched.api.podgroup import API_VERSION as POD_GROUP_API_VERSION
from shardsched.api.workloads import SPREAD_SELECTOR_KINDS, workload_selector_of
from shardsched.bench import perf_volumes as vol
from shardsched.bench.harness import (Measurement, Progress, RaySession, ended_early, fmt_bytes, fmt_rate, fmt_s,
                                      markdown_table, run_embedded)
from shardsched.cache.node_table import NodeTable
from shardsched.config import SchedulerConfiguration, load_config
from shardsched.scheduler.algorithm import build_schedulers
from shardsched.sharding.calls import SimClusterClient
from shardsched.sharding.shard import ShardOptions
from shardsched.sim.workload import PAUSE_IMAGE

#: the copy of upstream's scheduler_perf workloads shipped in the package (package data)
DEFAULT_DATA_DIR = Path(__file__).resolve().parent / "workloads" / "scheduler_perf"
DATA_DIR_ENV = "SHARDSCHED_SCHEDULER_PERF_DIR"

#: upstream test/integration/scheduler_perf/batching/performance-config.yaml (commit d7ce957d),
#: HostPortConflict only (its other case, ResourceSaturation, needs pod-saturation.yaml at 20,000
#: nodes and adds nothing the basic workloads lack); not in the local copy, so written out here.
#: Its scheduler config (no topology plugins) changes nothing for shardsched, which has none.
BATCHING_CONFIG = """
- name: HostPortConflict
  defaultPodTemplatePath: ../templates/pod-hostport-80.yaml
  workloadTemplate:
  - opcode: createNodes
    countParam: $initNodes
    nodeTemplatePath: ../templates/node-default.yaml
  - opcode: createPods
    countParam: $measurePods
    collectMetrics: true
  workloads:
  - name: 10Nodes_10Pods
    labels: [integration-test, short]
    params:
      initNodes: 10
      measurePods: 10
  - name: 20000Nodes_20000Pods
    labels: [performance]
    params:
      initNodes: 20000
      measurePods: 20000
"""

#: upstream's PreemptionBasic (misc/performance-config.yaml) with its 5000Nodes workload, commented out
#: there ("This test case always seems to fail", kubernetes #108308); the ops as upstream's
PREEMPTION_5000_CONFIG = """
- name: PreemptionBasic
  workloadTemplate:
  - opcode: createNodes
    countParam: $initNodes
  - opcode: createPods
    countParam: $initPods
    podTemplatePath: ../templates/pod-low-priority.yaml
  - opcode: createPods
    countParam: $measurePods
    podTemplatePath: ../templates/pod-high-priority.yaml
    collectMetrics: true
  workloads:
  - name: 5000Nodes
    labels: [performance]
    params:
      initNodes: 5000
      initPods: 20000
      measurePods: 5000
"""

#: performance-size workloads of the tests shardsched's plugins express; ``bench perf`` runs these by default
DEFAULT_WORKLOADS = (
    "SchedulingBasic/5000Nodes_10000Pods",
    "SchedulingBasic/5000Nodes_50000Pods",
    "SchedulingNodeAffinity/5000Nodes_10000Pods",
    "SchedulingWithNodeInclusionPolicy/5000Nodes",
    "Unschedulable/5kNodes/100Init/10kPods",
    "Unschedulable/5kNodes/20kInit/10kPods",
    "SchedulingWithMixedChurn/5000Nodes_10000Pods",
    "SchedulingWithExtendedResource/5000pods_5000nodes",
    "HostPortConflict/20000Nodes_20000Pods",
    "PreemptionBasic/5000Nodes",
    "PreemptionAsync/5000Nodes",
    "GangScheduling/5000Nodes_*",
    "SchedulingSecrets/5000Nodes_10000Pods",
    "SchedulingInTreePVs/5000Nodes_2000Pods",
    "SchedulingMigratedInTreePVs/5000Nodes_5000Pods",
    "SchedulingCSIPVs/5000Nodes_5000Pods",
    "PreemptionPVs/1000Nodes",
)

RUN, PARTIAL, SKIP = "run", "partial", "skipped"
_OPS = {"createNodes", "createPods", "churn", "createNamespaces", "barrier", "createAny", "waitForPodGroups"}
_CREATE_ANY_KEYS = {"opcode", "templatePath", "namespace", "count", "countParam", "templateParams"}
_CREATE_NODES_KEYS = {"opcode", "count", "countParam", "nodeTemplatePath", "labelNodePrepareStrategy",
                      vol.NODE_ALLOCATABLE}
_CREATE_PODS_KEYS = {"opcode", "count", "countParam", "countMultiplierParam", "podTemplatePath", "collectMetrics",
                     "namespace", "skipWaitToCompletion", "signatureBatchSizeParam", "templateParams",
                     vol.PV_TEMPLATE, vol.PVC_TEMPLATE}
_CHURN_KEYS = {"opcode", "mode", "templatePaths", "intervalMilliseconds", "number", "namespace"}
#: a template's ``{{ ... }}`` actions (Go text/template): ``.Name`` or ``Function .A .B``
_ACTION = re.compile(r"{{\s*(.*?)\s*}}")
#: the integer functions of upstream's template provider that the shipped templates use
_TEMPLATE_FUNCTIONS = {"AddInt": lambda a, b: a + b, "SubtractInt": lambda a, b: a - b,
                       "MultiplyInt": lambda a, b: a * b, "DivideInt": lambda a, b: a // b}
#: the upstream Workload API's PodGroup (``scheduling.k8s.io``) that ``createAny`` stamps out
_WORKLOAD_API_GROUP = "scheduling.k8s.io/"
#: the profile of the gang workloads when no ``--config`` is given: the default plugins with
#: Coscheduling, as upstream's ``GenericWorkload`` feature gate adds its gang plugin to the default
#: profile (every profile sorts with Coscheduling: `docs/gangs.md`)
GANG_CONFIG = """
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
  plugins:
    multiPoint:
      enabled: [{name: Coscheduling}]
      disabled: [{name: PrioritySort}]
"""


# ------------------------------------------------------------------------------------ reading

@dataclass
class TestCase:
    name: str
    base: Path  # folder the template paths are relative to
    source: str
    default_pod_template: str | None
    ops: list[dict]
    workloads: list[dict]
    root: Path  # the scheduler_perf folder (upstream's base node and pod templates are in its templates/)


@dataclass
class Workload:
    case: TestCase
    name: str
    params: dict[str, Any]
    threshold: float | None
    labels: list[str]
    feature_gates: dict[str, Any]

    @property
    def full_name(self) -> str:
        return f"{self.case.name}/{self.name}"


def data_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The scheduler_perf folder: ``path``, else ``$SHARDSCHED_SCHEDULER_PERF_DIR``, else the copy
    shipped in the package (`DEFAULT_DATA_DIR`)."""
    return Path(path or os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR)


def _shown_path(path: Path) -> str:
    """``path`` as a saved report shows it: relative to the project's root (the shipped copy) or to
    the working directory where it lies under either, else as given, so that a result names no
    machine's absolute paths."""
    for root in (Path(__file__).resolve().parents[2], Path.cwd()):
        try:
            return str(path.resolve().relative_to(root))
        except ValueError:
            continue
    return str(path)


def load_workloads(directory: str | os.PathLike[str] | None = None) -> list[Workload]:
    """Every workload of every ``*/performance-config.yaml`` under the folder, plus `BATCHING_CONFIG`.

    Raises:
        FileNotFoundError: no performance-config.yaml under the folder.
    """
    root = data_dir(directory)
    files = sorted(root.glob("**/performance-config.yaml"))
    if not files:
        raise FileNotFoundError(f"no */performance-config.yaml under {root} (set --data-dir or ${DATA_DIR_ENV})")
    sources = [(f.parent, str(f.relative_to(root)), f.read_text(encoding="utf-8")) for f in files]
    sources.append((root / "batching", "batching/performance-config.yaml (upstream, built in)", BATCHING_CONFIG))
    sources.append((root / "misc", "misc/performance-config.yaml (upstream's commented-out 5000Nodes, built in)",
                    PREEMPTION_5000_CONFIG))
    out: list[Workload] = []
    for base, source, text in sources:
        for raw in yaml.load(text, Loader=_Loader) or []:
            case = TestCase(raw["name"], base, source, raw.get("defaultPodTemplatePath"),
                            list(raw.get("workloadTemplate") or []), list(raw.get("workloads") or []), root)
            gates = dict(raw.get("featureGates") or {})
            for w in case.workloads:
                out.append(Workload(case, w["name"], dict(w.get("params") or {}), w.get("threshold"),
                                    list(w.get("labels") or []), {**gates, **(w.get("featureGates") or {})}))
    return out


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def select(workloads: list[Workload], patterns: list[str] | None) -> list[Workload]:
    """Workloads whose full name matches one of the glob ``patterns`` (default: `DEFAULT_WORKLOADS`),
    in the order of the patterns. Raises ValueError when a pattern matches nothing."""
    patterns = list(patterns or DEFAULT_WORKLOADS)
    out: list[Workload] = []
    for pat in patterns:
        hits = [w for w in workloads if fnmatch.fnmatchcase(w.full_name, pat) and w not in out]
        if not hits and not any(fnmatch.fnmatchcase(w.full_name, pat) for w in workloads):
            raise ValueError(f"no scheduler_perf workload matches {pat!r} (see `shardsched bench perf --list`)")
        out.extend(hits)
    return out


# ---------------------------------------------------------------------------------- templates

class TemplateError(ValueError):
    """A template action this runner cannot evaluate (the workload is skipped with it)."""


def _render(text: str, values: dict[str, Any]) -> str:
    """``text`` with its ``{{ ... }}`` actions evaluated as upstream's text/template would for the
    forms the templates use: ``{{.Name}}`` (``Index`` or a template parameter) and ``{{Function .A
    .B}}`` with an integer function of `_TEMPLATE_FUNCTIONS`. Raises TemplateError for others."""
    def value(arg: str) -> Any:
        if arg.startswith("."):
            if arg[1:] not in values:
                raise TemplateError(f"template value {arg} is not set")
            return values[arg[1:]]
        try:
            return int(arg)
        except ValueError:
            raise TemplateError(f"template argument {arg!r} is not supported") from None

    def action(m: re.Match) -> str:
        words = m.group(1).split()
        if len(words) == 1:
            return str(value(words[0]))
        fn = _TEMPLATE_FUNCTIONS.get(words[0])
        if fn is None or len(words) != 3:
            raise TemplateError(f"template function {words[0]} is not supported")
        return str(fn(int(value(words[1])), int(value(words[2]))))

    return _ACTION.sub(action, text)


class _Templates:
    """Template files read once; objects stamped per index."""

    def __init__(self) -> None:
        self._text: dict[Path, str] = {}
        self._parsed: dict[Path, dict] = {}

    def path(self, base: Path, rel: str) -> Path:
        return Path(os.path.normpath(base / rel))

    def get(self, path: Path) -> dict:
        """The template parsed with its actions read as 0 (for its kind and fields)."""
        if path not in self._parsed:
            text = self._text[path] = path.read_text(encoding="utf-8")
            self._parsed[path] = yaml.load(_ACTION.sub("0", text), Loader=_Loader) or {}
        return self._parsed[path]

    def stamp(self, path: Path, index: int, values: dict[str, Any] | None = None) -> dict:
        """A fresh object from the template, its actions evaluated with ``Index`` = ``index`` and
        ``values`` (`_render`). Raises TemplateError."""
        self.get(path)
        text = self._text[path]
        if _ACTION.search(text):
            return yaml.load(_render(text, {**(values or {}), "Index": index}), Loader=_Loader)
        return _copy(self._parsed[path])


def _copy(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_copy(v) for v in obj]
    return obj


def _count(op: dict, params: dict, default: int = 0) -> int:
    """The op's count: ``countParam`` (times ``countMultiplierParam``) or ``count``."""
    if "countParam" in op:
        n = int(params[op["countParam"].lstrip("$")])
    else:
        n = int(op.get("count", default))
    if "countMultiplierParam" in op:
        n *= int(params[op["countMultiplierParam"].lstrip("$")])
    return n


def _template_values(op: dict, params: dict) -> dict[str, Any]:
    """The op's ``templateParams``, ``$name`` values read from the workload's params."""
    return {k: params[v[1:]] if isinstance(v, str) and v.startswith("$") else v
            for k, v in (op.get("templateParams") or {}).items()}


def pod_group_of(obj: dict, namespace: str) -> dict | None:
    """The scheduler-plugins PodGroup standing for an upstream Workload API PodGroup
    (``scheduling.k8s.io``, ``spec.schedulingPolicy.gang.minCount``), as the controller of
    ``docs/gangs.md`` ("How the upstream Workload API maps onto it") would make it: ``minMember``
    = ``minCount``. None for a group without a gang policy (``basic``: nothing to hold together)."""
    gang = ((obj.get("spec") or {}).get("schedulingPolicy") or {}).get("gang")
    if not isinstance(gang, dict):
        return None
    return {"apiVersion": POD_GROUP_API_VERSION, "kind": "PodGroup",
            "metadata": {"name": obj["metadata"]["name"], "namespace": namespace},
            "spec": {"minMember": gang.get("minCount")}}


def _join_pod_group(pod: dict) -> None:
    """A pod naming an upstream PodGroup (``spec.schedulingGroup.podGroupName``) joins the
    scheduler-plugins PodGroup of that name by its label instead (`pod_group_of`)."""
    spec = pod.get("spec") or {}
    group = (spec.pop("schedulingGroup", None) or {}).get("podGroupName")
    if group:
        pod["metadata"].setdefault("labels", {})[POD_GROUP_LABEL] = group


def _name(obj: dict, fallback: str, index: int) -> None:
    meta = obj.setdefault("metadata", {})
    if not meta.get("name"):
        meta["name"] = f"{meta.pop('generateName', fallback)}{index}"
    meta.pop("generateName", None)


def _node(obj: dict, index: int, prefix: str) -> dict:
    """A node of a template, named, with upstream's ``kubernetes.io/hostname`` label (scheduler_perf's
    node preparer sets it) and allocatable defaulted to capacity."""
    _name(obj, prefix, index)
    meta = obj.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), "kubernetes.io/hostname": meta["name"]}
    status = obj.setdefault("status", {})
    if not status.get("allocatable") and status.get("capacity"):
        status["allocatable"] = dict(status["capacity"])  # the API server's SetDefaults_NodeStatus
    return obj


# ---------------------------------------------------------------------------------- the plan

@dataclass
class Churn:
    """A churn op: ``templates`` of (kind, path); ``number`` = recreate slots (0 = unbounded create)."""

    mode: str
    interval_s: float
    number: int
    templates: list[tuple[str, Path]]
    namespace: str


@dataclass
class Plan:
    """A workload made concrete (objects not yet created)."""

    workload: Workload
    status: str = RUN
    reasons: list[str] = field(default_factory=list)
    nodes: list[dict] = field(default_factory=list)
    init_pods: list[dict] = field(default_factory=list)
    measured: list[dict] = field(default_factory=list)
    churn: list[Churn] = field(default_factory=list)
    #: Services, ReplicationControllers, ReplicaSets, StatefulSets of ``createAny`` ops
    spread_selectors: list[dict] = field(default_factory=list)
    #: scheduler-plugins PodGroups standing for the upstream PodGroups of ``createAny`` ops
    #: (`pod_group_of`)
    pod_groups: list[dict] = field(default_factory=list)
    #: CSINodes, PersistentVolumes and claims of the volume options (`shardsched.bench.perf_volumes`)
    storage: list[dict] = field(default_factory=list)


def _pod_problems(pod: dict, claims_made: bool = False) -> tuple[list[str], list[str]]:
    """(reasons to skip, reasons for partial) of a pod template; ``claims_made``: the op replaces
    the template's volumes with claims it creates (`perf_volumes.bind_claim`)."""
    spec = pod.get("spec") or {}
    skip, partial = [], []
    if spec.get("schedulingGates"):
        skip.append("gated pods: this runner creates init pods already bound and measured pods in one "
                    "burst, so pods waiting on scheduling gates cannot be expressed")
    if spec.get("resourceClaims"):
        skip.append("resource claims need DynamicResources (not implemented)")
    for v in [] if claims_made else spec.get("volumes") or []:
        if any(k in v for k in ("persistentVolumeClaim", "ephemeral")):
            skip.append("pod templates with their own claims: no op of this runner creates the claims they "
                        "name (the ops' persistentVolumeClaimTemplatePath does)")
            break
    return skip, partial


def plan(w: Workload, templates: _Templates, scheduler_name: str, seed: int = 0, build: bool = True) -> Plan:
    """Interpret the workload's ops (see module docstring). With ``build`` False only classify
    (no objects are made: `--list`). A template file that cannot be read skips the workload."""
    try:
        return _plan(w, templates, scheduler_name, seed, build)
    except OSError as e:
        return Plan(w, SKIP, [f"template not readable: {e.filename or e}"])
    except TemplateError as e:
        return Plan(w, SKIP, [str(e)])


def _plan(w: Workload, templates: _Templates, scheduler_name: str, seed: int, build: bool) -> Plan:
    p = Plan(w)
    rng = random.Random(seed)
    skip: list[str] = []
    partial: list[str] = []
    measured_seen = False
    for i, op in enumerate(w.case.ops):
        code = op.get("opcode")
        if code not in _OPS:
            skip.append(f"op {code} is not supported by this runner ({w.case.source})")
            continue
        if code in ("createNamespaces", "barrier", "waitForPodGroups"):
            continue  # the PodGroups are in the cluster before any pod (`run_embedded`)
        if code == "createAny":
            path = templates.path(w.case.base, op.get("templatePath") or "")
            template = templates.get(path)
            kind = template.get("kind")
            group = kind == "PodGroup" and str(template.get("apiVersion", "")).startswith(_WORKLOAD_API_GROUP)
            if set(op) - _CREATE_ANY_KEYS or not (kind in SPREAD_SELECTOR_KINDS or group):
                skip.append(f"createAny of a {kind} is not supported by this runner ({w.case.source})")
                continue
            if build:
                ns = op.get("namespace") or f"namespace-{i}"
                values = _template_values(op, w.params)
                for _ in range(_count(op, w.params, default=1)):
                    made = p.pod_groups if group else p.spread_selectors
                    obj = templates.stamp(path, len(made), values)
                    _name(obj, f"{kind.lower()}-", len(made))
                    obj["metadata"]["namespace"] = ns
                    if group:
                        obj = pod_group_of(obj, ns)
                        if obj is None:
                            continue
                    made.append(obj)
            continue
        if code == "createNodes":
            extra = set(op) - _CREATE_NODES_KEYS
            if extra:
                skip.append(f"createNodes option(s) {', '.join(sorted(extra))} not supported ({w.case.source})")
                continue
            strategy = op.get(vol.NODE_ALLOCATABLE)
            if strategy is not None:
                bad = vol.strategy_problems(strategy, w.case.source)
                if bad:
                    skip += bad
                    continue
            path = (templates.path(w.case.base, op["nodeTemplatePath"]) if op.get("nodeTemplatePath")
                    else w.case.root / "templates" / "node-default.yaml")
            label = op.get("labelNodePrepareStrategy")
            if build:
                start = len(p.nodes)
                for k in range(_count(op, w.params)):
                    node = _node(templates.stamp(path, k), start + k, "node-")
                    if label:  # upstream LabelNodePrepareStrategy: a random value of the list
                        node["metadata"]["labels"][label["labelKey"]] = rng.choice(label["labelValues"])
                    csi_node = vol.apply_strategy(node, strategy) if strategy is not None else None
                    if csi_node is not None:
                        p.storage.append(csi_node)
                    p.nodes.append(node)
            continue
        if code == "churn":
            extra = set(op) - _CHURN_KEYS
            if extra or op.get("mode") not in ("create", "recreate"):
                skip.append(f"churn mode {op.get('mode')} / option(s) {', '.join(sorted(extra))} not supported "
                            f"({w.case.source})")
                continue
            kinds = []
            for rel in op.get("templatePaths") or []:
                path = templates.path(w.case.base, rel)
                kind = templates.get(path).get("kind")
                if kind == "Pod":
                    s, pt = _pod_problems(templates.get(path))
                    skip += s
                    partial += pt
                elif kind != "Node":
                    partial.append(f"{kind} churn not modelled (it only matters to plugins shardsched does not have)")
                    continue
                kinds.append((kind, path))
            p.churn.append(Churn(op["mode"], float(op.get("intervalMilliseconds", 500)) / 1000,
                                 int(op.get("number", 0)), kinds, op.get("namespace") or f"namespace-{i}"))
            continue
        # createPods
        extra = set(op) - _CREATE_PODS_KEYS
        if extra:
            skip.append(f"createPods option(s) {', '.join(sorted(extra))} not supported ({w.case.source})")
            continue
        pv_path = pvc_path = None
        if vol.PV_TEMPLATE in op or vol.PVC_TEMPLATE in op:
            if not (op.get(vol.PV_TEMPLATE) and op.get(vol.PVC_TEMPLATE)):
                skip.append(f"createPods needs both {vol.PV_TEMPLATE} and {vol.PVC_TEMPLATE} ({w.case.source})")
                continue
            pv_path = templates.path(w.case.base, op[vol.PV_TEMPLATE])
            pvc_path = templates.path(w.case.base, op[vol.PVC_TEMPLATE])
            bad = vol.template_problems(templates.get(pv_path), templates.get(pvc_path), w.case.source)
            if bad:
                skip += bad
                continue
        # upstream falls back to makeBasePod(), which is pod-default.yaml
        rel = op.get("podTemplatePath") or w.case.default_pod_template
        path = templates.path(w.case.base, rel) if rel else w.case.root / "templates" / "pod-default.yaml"
        s, pt = _pod_problems(templates.get(path), claims_made=pv_path is not None)
        skip += s
        partial += pt
        if measured_seen:
            skip.append("pods created after the measured ones are not supported by this runner")
            continue
        measured = bool(op.get("collectMetrics"))
        measured_seen = measured
        if build and not skip:
            ns = op.get("namespace") or f"namespace-{i}"
            target = p.measured if measured else p.init_pods
            start = len(p.init_pods) + len(p.measured)
            values = _template_values(op, w.params)
            for k in range(_count(op, w.params)):
                pod = templates.stamp(path, k, values)
                _name(pod, "pod-", start + k)
                pod["metadata"]["namespace"] = ns
                pod.setdefault("spec", {}).setdefault("schedulerName", scheduler_name)
                _join_pod_group(pod)
                if pv_path is not None:
                    pv, pvc = templates.stamp(pv_path, k), templates.stamp(pvc_path, k)
                    vol.bind_claim(pod, pv, pvc, ns, k)
                    p.storage += [pvc, pv]  # the claim first, as upstream creates them
                target.append(pod)
    if not measured_seen and not skip:
        skip.append("no createPods op with collectMetrics")
    p.reasons = list(dict.fromkeys(skip or partial))
    p.status = SKIP if skip else PARTIAL if partial else RUN
    return p


def duplicates(workloads: list[Workload]) -> dict[str, str]:
    """full name -> the first workload of its test case with the same params (feature-gate variants)."""
    first: dict[tuple[str, str], str] = {}
    out = {}
    for w in workloads:
        key = (w.case.source + w.case.name, repr(sorted(w.params.items())))
        if key in first:
            out[w.full_name] = first[key]
        else:
            first[key] = w.full_name
    return out


def catalog(workloads: list[Workload], scheduler_name: str = "default-scheduler") -> list[dict[str, Any]]:
    """Status of every workload without building it (for ``--list`` and the skipped section)."""
    templates = _Templates()
    dup = duplicates(workloads)
    out = []
    for w in workloads:
        if w.full_name in dup:
            status, reasons = SKIP, [f"same ops and params as {dup[w.full_name]} (differs only in kube feature gates)"]
        else:
            p = plan(w, templates, scheduler_name, build=False)
            status, reasons = p.status, p.reasons
        out.append({"workload": w.full_name, "source": w.case.source, "threshold": w.threshold, "labels": w.labels,
                    "params": w.params, "status": status, "reasons": reasons})
    return out


# ---------------------------------------------------------------------------------- running

def place_init_pods(config: SchedulerConfiguration, nodes: list[dict], pods: list[dict], seed: int,
                    spread_selectors: list[dict] = (), storage: list[dict] = ()) -> int:
    """Bind the init pods in place (``spec.nodeName``) with the decision path over ``nodes`` (and the
    default spreading selectors of ``spread_selectors``); returns how many did not fit (left
    unbound: they would stay pending upstream too)."""
    table = NodeTable(len(nodes))
    table.add_nodes(NodeInfo.from_object(n) for n in nodes)
    table.set_spread_selectors([workload_selector_of(o) for o in spread_selectors])
    if storage:  # the volume plugins read them (without storage they hold pods with claims)
        table.volumes = vol.catalog_of(storage)
    schedulers = build_schedulers(config, table, seed)
    default = next(iter(schedulers.values()))
    missed = 0
    for pod in pods:
        info = PodInfo.from_object(pod)
        result = schedulers.get(info.scheduler_name, default).schedule(info)
        if result.node is None:
            missed += 1
        else:
            pod["spec"]["nodeName"] = result.node
    return missed


def _sentinel(node: str, scheduler_name: str) -> dict:
    """A pod without requests, created bound to ``node``: the feeder's harmless last step."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bench-feeder-end", "namespace": "default"},
            "spec": {"nodeName": node, "schedulerName": scheduler_name,
                     "containers": [{"name": "pause", "image": PAUSE_IMAGE}]}}


class _ChurnDriver:
    """Runs the churn ops from the embedded run's progress callback (about 4 calls a second) until
    the measured pods are all bound; talks to the simulated cluster actor.

    Calls are fired without waiting (the callback runs inside the runtime's follow loop, which it
    must not slow down); their answers are collected on later ticks and at `drain`, and errors
    (a delete of an object already gone) are ignored. A recreate deletes the object made one
    interval earlier in its slot, so the two calls of a slot never race."""

    def __init__(self, churns: list[Churn], templates: _Templates, scheduler_name: str, measured: int,
                 after_created: int = 0) -> None:
        self.churns = churns
        self.templates = templates
        self.scheduler_name = scheduler_name
        self.measured = measured
        #: the churn starts once the feeder has created this many pods (the init pods): upstream runs
        #: the ops in order, and a churn pod placed before the init pods exist would take their room
        #: (they are created bound, and the kubelet-like admission would reject them)
        self.after_created = after_created
        self.t0: float | None = None
        self.ticks = [0] * len(churns)
        self.slots: list[dict[int, tuple[str, str, str]]] = [{} for _ in churns]  # recreate: slot -> (kind, ns, name)
        self.created = 0
        self.stopped = False
        self._seq = 0
        self._inflight: list[Any] = []

    def tick(self, cluster: SimClusterClient, now: float, bound: int, created: int) -> None:
        """One call of the progress callback: ``bound`` measured pods so far, ``created`` pods made
        by the feeder; the churn's objects go to ``cluster`` (fire and forget, collected next time)."""
        self._collect(0.0)
        if self.stopped or not self.churns or created < self.after_created:
            return
        if bound >= self.measured:
            self.stopped = True
            return
        if self.t0 is None:
            self.t0 = now
        for ci, churn in enumerate(self.churns):
            # one round at once, then one per interval (upstream's churn op starts before the measured
            # pods are created, so its first tick comes before or with them)
            due = int((now - self.t0) / churn.interval_s) + 1
            if churn.mode == "create" and churn.number:
                due = min(due, churn.number)
            while self.ticks[ci] < due:
                for kind, path in churn.templates:
                    slot = (self.ticks[ci] % churn.number) if churn.mode == "recreate" and churn.number else None
                    old = self.slots[ci].pop(slot, None) if slot is not None else None
                    if old is not None:
                        self._inflight.append(cluster.delete_node(old[2]) if old[0] == "Node"
                                              else cluster.delete_pod(old[1], old[2], None, None))
                    obj = self._object(kind, path, churn.namespace)
                    meta = obj["metadata"]
                    self._inflight.append(cluster.create_nodes([obj]) if kind == "Node"
                                          else cluster.create_pods([obj]))
                    if slot is not None:
                        self.slots[ci][slot] = (kind, meta.get("namespace", ""), meta["name"])
                    self.created += 1
                self.ticks[ci] += 1

    def drain(self) -> None:
        """Collect the answers of the calls still in flight (at the end of the run)."""
        self._collect(10.0)

    def _collect(self, timeout_s: float) -> None:
        from shardsched.sharding.remote import settled

        if not self._inflight:
            return
        ready, self._inflight = settled(self._inflight, timeout_s)
        for reply in ready:
            try:
                reply.wait(None)
            except Exception:  # noqa: BLE001 - NotFound and friends: churn goes on
                pass
        self._inflight = [] if timeout_s else self._inflight

    def _object(self, kind: str, path: Path, namespace: str) -> dict:
        self._seq += 1
        obj = self.templates.stamp(path, self._seq)
        if kind == "Node":
            return _node(obj, self._seq, "node-churn-")
        _name(obj, "churn-pod-", self._seq)
        obj["metadata"]["namespace"] = namespace
        obj.setdefault("spec", {}).setdefault("schedulerName", self.scheduler_name)
        return obj


@dataclass
class PerfParams:
    workloads: list[str] | None = None  # glob patterns; None = DEFAULT_WORKLOADS
    data_dir: str | None = None
    shards: int = 2
    batch_size: int = 0
    max_batch_size: int = 1000
    seed: int = 0
    timeout_s: float = 900.0
    config_path: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"workloads": self.workloads or list(DEFAULT_WORKLOADS), "data_dir": _shown_path(data_dir(self.data_dir)),
                "shards": self.shards, "batch_size": self.batch_size, "max_batch_size": self.max_batch_size,
                "seed": self.seed, "config": self.config_path}


@dataclass
class PerfResult:
    """One selected workload: run (``measurement`` set) or skipped (``reasons``)."""

    workload: Workload
    status: str
    reasons: list[str]
    nodes: int = 0
    init_pods: int = 0
    init_unplaced: int = 0
    churn_objects: int = 0
    #: the coordinator's counts at the end: preemptions (nominations with their victims deleted)
    #: and the victims deleted
    preemptions: int = 0
    victims: int = 0
    #: PodGroups of the workload, and the coordinator's count of gangs held whole in the ledger in the ledger (PodGroups)
    pod_groups: int = 0
    gangs_placed: int = 0
    #: storage objects created with the nodes: PersistentVolumes, claims, CSINodes
    storage_objects: int = 0
    measurement: Measurement | None = None

    @property
    def preemptions_per_s(self) -> float:
        """Preemptions over the measured window."""
        m = self.measurement
        return self.preemptions / m.wall_s if m and m.wall_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        m = self.measurement
        thr = self.workload.threshold
        return {"workload": self.workload.full_name, "source": self.workload.case.source, "status": self.status,
                "reasons": self.reasons, "threshold_pods_per_s": thr, "nodes": self.nodes, "init_pods": self.init_pods,
                "init_pods_unplaced": self.init_unplaced, "churn_objects": self.churn_objects,
                "preemptions": self.preemptions, "victims": self.victims, "pod_groups": self.pod_groups,
                "gangs_placed": self.gangs_placed, "storage_objects": self.storage_objects,
                "preemptions_per_s": round(self.preemptions_per_s, 1),
                "victims_per_preemptor": round(self.victims / self.preemptions, 2) if self.preemptions else None,
                "vs_threshold": round(m.throughput_pods_per_s / thr, 3) if m and thr else None,
                "result": m.to_json() if m else None}


def run(params: PerfParams, progress: Progress | None = None) -> tuple[list[PerfResult], list[dict]]:
    """Run the selected workloads; returns their results and the catalog of every workload (status
    and reasons, for the skipped section).

    Raises:
        FileNotFoundError: no scheduler_perf data. ValueError: a pattern matches nothing.
        ConfigError: an invalid ``config_path``.
    """
    config = load_config(params.config_path)
    gang_config = (config if _has_coscheduling(config) else load_config(GANG_CONFIG) if params.config_path is None
                   else None)
    scheduler_name = config.profiles[0].scheduler_name
    everything = load_workloads(params.data_dir)
    chosen = select(everything, params.workloads)
    cat = catalog(everything, scheduler_name)
    status_of = {c["workload"]: c for c in cat}
    progress = progress or Progress("perf", quiet=True)
    templates = _Templates()
    results: list[PerfResult] = []
    with RaySession() as ray_session:
        for w in chosen:
            entry = status_of[w.full_name]
            if entry["status"] == SKIP:
                results.append(PerfResult(w, SKIP, entry["reasons"]))
                progress.note(f"{w.full_name}: skipped: {'; '.join(entry['reasons'])}")
                continue
            results.append(_run_one(w, config, gang_config, templates, params, ray_session, progress))
    return results, cat


def _has_coscheduling(config: SchedulerConfiguration) -> bool:
    """Whether the first profile (the measured pods') enables Coscheduling."""
    from shardsched.plugins.coscheduling.plugin import NAME

    return NAME in build_schedulers(config, NodeTable(), 0)[config.profiles[0].scheduler_name].framework.plugins


def _run_one(w: Workload, config: SchedulerConfiguration, gang_config: SchedulerConfiguration | None,
             templates: _Templates, params: PerfParams, ray_session: RaySession, progress: Progress) -> PerfResult:
    scheduler_name = config.profiles[0].scheduler_name
    p = plan(w, templates, scheduler_name, params.seed)
    if p.pod_groups:
        if gang_config is None:
            why = "PodGroups need a profile with Coscheduling: the --config given has none in its first profile"
            progress.note(f"{w.full_name}: skipped: {why}")
            return PerfResult(w, SKIP, [why])
        config = gang_config
    unplaced = place_init_pods(config, p.nodes, p.init_pods, params.seed, p.spread_selectors, p.storage)
    init = [pod for pod in p.init_pods if pod["spec"].get("nodeName")]
    # init pods at t=0, the measured ones in one later call (the runtime's timed feeder), so that
    # they share one creation time and the window is exactly creation -> last bind
    gap_s = 0.2 + 50e-6 * len(init)
    # then a harmless last step well after that call (see `harness.ended_early`): without it, the
    # measured pods' creation may be the feeder's last call and race the runtime's end-of-run check
    tail_s = gap_s + 1.0 + 200e-6 * len(p.measured)
    workload = [(0.0, None, pod) for pod in init] + [(gap_s, None, pod) for pod in p.measured]
    if p.nodes:
        workload.append((tail_s, None, _sentinel(p.nodes[0]["metadata"]["name"], scheduler_name)))
    churn = _ChurnDriver(p.churn, templates, scheduler_name, len(p.measured), after_created=len(init))
    options = ray_session.options(shards=params.shards, seed=params.seed, timeout_s=params.timeout_s,
                                  spread_selectors=p.spread_selectors, pod_groups=p.pod_groups, storage=p.storage,
                                  shard_options=ShardOptions(batch_size=params.batch_size,
                                                             max_batch_size=params.max_batch_size, seed=params.seed))

    last: dict[str, Any] = {}

    def on_progress(run, bound: int, total: int, status: dict) -> None:
        last.update(status)
        churn.tick(run.feeder.cluster, time.monotonic(), bound, run.feeder.created)
        progress.update(bound, f"pending {status['pending']}, unschedulable {status['unschedulable']}")

    progress.start(w.full_name, len(p.measured), f"{len(p.nodes)} nodes, {len(init)} init pods")
    try:
        report = run_embedded(config, p.nodes, workload, options, on_progress=on_progress)
    finally:
        churn.drain()
    lat = list(report.latencies_s)
    window = max(lat) if lat else 0.0
    data = report.to_json()
    pending = report.pods_pending
    m = Measurement(
        name=w.full_name, pods=len(p.measured), bound=len(lat), latencies_s=lat,
        throughput_pods_per_s=len(lat) / window if window > 0 else 0.0, cpu_cores=data["cpu_cores_used"],
        peak_rss_bytes=report.peak_rss_bytes, wall_s=window, cpu_s_by_process=dict(report.cpu_s_by_process),
        invariants_ok=not (data["overcommitted_nodes"] or data["admission_rejections"] or data["double_binds"]
                           or data["lost_pods"]),
        params={"nodes": len(p.nodes), "shards": params.shards, "batch_size": params.batch_size,
                "unschedulable_at_end": report.pods_unschedulable, "pending_at_end": pending},
        notes=list(p.reasons), errors=list(report.errors) + ended_early(report))
    progress.finish(w.full_name, m)
    return PerfResult(w, p.status, p.reasons, len(p.nodes), len(init), unplaced, churn.created,
                      int(last.get("preemptions", 0)), int(last.get("victims", 0)), len(p.pod_groups),
                      int(last.get("gangs_placed", 0)), len(p.storage), m)


# ------------------------------------------------------------------------------------ output

def to_json(results: list[PerfResult], cat: list[dict], params: PerfParams, machine: dict) -> dict[str, Any]:
    return {"benchmark": "perf", "machine": machine, "params": params.to_json(),
            "workloads": [r.to_json() for r in results],
            "not_run": [c for c in cat if c["status"] == SKIP]}


def markdown(results: list[PerfResult], cat: list[dict], params: PerfParams) -> str:
    body = []
    for r in results:
        m = r.measurement
        thr = r.workload.threshold
        if m is None:
            body.append([r.workload.full_name, "", "", "", "skipped", "—", f"{thr:g}" if thr else "—", "", "", "", "",
                         "; ".join(r.reasons)])
            continue
        unbound = [f"{m.pods - m.bound:,} measured pods not bound"] if m.bound < m.pods else []
        note = "; ".join(r.reasons + m.errors + unbound
                         + ([f"{r.init_unplaced} init pods did not fit"] if r.init_unplaced else [])
                         + ([f"{r.churn_objects} churn objects"] if r.churn_objects else [])
                         + ([f"{r.storage_objects:,} PVs, claims and CSINodes"] if r.storage_objects else [])
                         + ([f"{r.gangs_placed:,}/{r.pod_groups:,} gangs held whole"] if r.pod_groups else [])
                         + ([f"{r.preemptions:,} preemptions ({r.preemptions_per_s:,.1f}/s), "
                             f"{r.victims / r.preemptions:.2f} victims each"] if r.preemptions else []))
        body.append([r.workload.full_name, f"{r.nodes:,}", f"{r.init_pods:,}", f"{m.bound:,}/{m.pods:,}",
                     r.status, fmt_rate(m.throughput_pods_per_s), f"{thr:g}" if thr else "—",
                     f"{m.throughput_pods_per_s / thr:.1f}×" if thr else "—", fmt_s(m.avg_latency_s),
                     fmt_s(m.p99_latency_s), f"{m.cpu_cores:.2f} / {fmt_bytes(m.peak_rss_bytes)}",
                     ("ok" if m.invariants_ok else "INVARIANT VIOLATED") + (f"; {note}" if note else "")])
    table = markdown_table(["workload", "nodes", "init pods", "bound/measured", "status", "pods/s", "threshold",
                            "vs threshold", "avg latency", "P99 latency", "CPU cores / peak memory", "notes"], body)
    skipped_cases: dict[str, list[str]] = {}
    for c in cat:
        if c["status"] == SKIP and not c["reasons"][0].startswith("same ops and params"):
            case = c["workload"].split("/", 1)[0]
            skipped_cases.setdefault(f"{case}: {'; '.join(c['reasons'])}", []).append(c["workload"])
    lines = [f"- {k} ({len(v)} workload{'s' if len(v) > 1 else ''})" for k, v in skipped_cases.items()]
    variants = sum(1 for c in cat if c["status"] == SKIP and c["reasons"][0].startswith("same ops and params"))
    return (f"### scheduler_perf workloads ({params.shards} shards, batch "
            f"{params.batch_size or 'adaptive'}; threshold = upstream's minimum pods/s for kube-scheduler)\n\n{table}\n\n"
            "Not expressible here (test case: reason):\n\n" + "\n".join(lines)
            + f"\n\n{variants} further workloads differ from another only in kube-scheduler feature gates.\n")


def plot(results: list[PerfResult], directory: str) -> list[str]:
    from shardsched.bench.plots import bars

    ran = [r for r in results if r.measurement is not None]
    if not ran:
        return []
    return [bars(f"{directory}/perf-throughput.png", [r.workload.full_name for r in ran],
                 [r.measurement.throughput_pods_per_s for r in ran], "pods/s",
                 "scheduler_perf workloads: shardsched (bars) vs upstream threshold (ticks)",
                 reference=[r.workload.threshold for r in ran], reference_label="upstream threshold")]
