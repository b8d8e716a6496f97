"""Small builders for scheduling tests: Pods and Nodes as plain Kubernetes dicts with fluent helpers.

    pod("web", cpu="500m").with_toleration("gpu", "true").with_node_selector(zone="a").info()
    node("n1", cpu="4", memory="8Gi").with_taint("dedicated", "db").with_labels(zone="a").info()
    table_of(node("n1"), node("n2"), pods=[pod("old", cpu="1").on("n1")])

A builder is the object itself (a dict, camelCase keys, as in YAML), so a test can also edit it
directly; ``info()`` parses it with `PodInfo.from_object` / `NodeInfo.from_object`.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any, Iterable

import numpy as np

from shardsched.api.objects import NodeInfo, PodInfo
from shardsched.cache.node_table import NodeTable, PodUsage
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import FilterPlugin
from shardsched.framework.runtime import Framework
from shardsched.plugins.registry import IN_TREE

_uids = itertools.count()


def _resources(cpu: Any = None, memory: Any = None, extra: dict | None = None) -> dict:
    out = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    out.update(extra or {})
    return out


def container(name: str = "c", cpu: Any = None, memory: Any = None, *, requests: dict | None = None,
              limits: dict | None = None, restart_policy: str | None = None, ports: list | None = None) -> dict:
    """A container dict; ``requests`` adds further resources (``{"example.com/gpu": "1"}``)."""
    c: dict = {"name": name}
    reqs = _resources(cpu, memory, requests)
    res: dict = {}
    if reqs:
        res["requests"] = reqs
    if limits:
        res["limits"] = dict(limits)
    if res:
        c["resources"] = res
    if restart_policy:
        c["restartPolicy"] = restart_policy
    if ports:
        c["ports"] = ports
    return c


def expr(key: str, operator: str, *values: Any) -> dict:
    """A NodeSelectorRequirement: ``expr("zone", "In", "a", "b")``."""
    out: dict = {"key": key, "operator": operator}
    if values:
        out["values"] = [str(v) for v in values]
    return out


def term(*expressions: dict, fields: Iterable[dict] = ()) -> dict:
    """A NodeSelectorTerm of label expressions (and ``fields``, e.g. ``expr("metadata.name", "In", "n1")``)."""
    out: dict = {}
    if expressions:
        out["matchExpressions"] = list(expressions)
    fields = list(fields)
    if fields:
        out["matchFields"] = fields
    return out


class Pod(dict):
    """A Pod dict with fluent helpers; each helper edits the pod and returns it."""

    @property
    def spec(self) -> dict:
        return self["spec"]

    def with_container(self, cpu: Any = None, memory: Any = None, **kw: Any) -> "Pod":
        cs = self.spec["containers"]
        cs.append(container(kw.pop("name", f"c{len(cs)}"), cpu, memory, **kw))
        return self

    def with_init(self, cpu: Any = None, memory: Any = None, *, sidecar: bool = False, **kw: Any) -> "Pod":
        """An init container; ``sidecar=True`` makes it restartable (``restartPolicy: Always``)."""
        inits = self.spec.setdefault("initContainers", [])
        inits.append(container(kw.pop("name", f"init{len(inits)}"), cpu, memory,
                               restart_policy="Always" if sidecar else None, **kw))
        return self

    def with_toleration(self, key: str = "", value: str | None = None, effect: str = "",
                        operator: str | None = None) -> "Pod":
        """A toleration; operator defaults to Equal when a value is given, Exists otherwise."""
        t: dict = {"key": key, "operator": operator or ("Equal" if value is not None else "Exists")}
        if value is not None:
            t["value"] = value
        if effect:
            t["effect"] = effect
        self.spec.setdefault("tolerations", []).append(t)
        return self

    def with_node_selector(self, labels: dict | None = None, **kw: str) -> "Pod":
        self.spec.setdefault("nodeSelector", {}).update(labels or {}, **kw)
        return self

    def _node_affinity(self) -> dict:
        return self.spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})

    def with_required(self, *terms: dict) -> "Pod":
        """requiredDuringSchedulingIgnoredDuringExecution with these nodeSelectorTerms."""
        req = self._node_affinity().setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
        req.setdefault("nodeSelectorTerms", []).extend(terms)
        return self

    def with_preferred(self, weight: int, preference: dict) -> "Pod":
        pref = self._node_affinity().setdefault("preferredDuringSchedulingIgnoredDuringExecution", [])
        pref.append({"weight": weight, "preference": preference})
        return self

    def with_host_port(self, port: int, protocol: str | None = None, host_ip: str | None = None) -> "Pod":
        p: dict = {"containerPort": port, "hostPort": port}
        if protocol is not None:
            p["protocol"] = protocol
        if host_ip is not None:
            p["hostIP"] = host_ip
        self.spec["containers"][0].setdefault("ports", []).append(p)
        return self

    def with_overhead(self, **resources: Any) -> "Pod":
        self.spec["overhead"] = dict(resources)
        return self

    def with_pod_resources(self, **requests: Any) -> "Pod":
        """Pod-level ``spec.resources.requests`` (the PodLevelResources feature)."""
        self.spec["resources"] = {"requests": dict(requests)}
        return self

    def with_pod_affinity_term(self, kind: str = "podAntiAffinity", required: bool = True, app: str = "w") -> "Pod":
        """A pod (anti-)affinity term (``kind``: podAffinity or podAntiAffinity) on pods labelled
        ``app``, per hostname; required, or preferred with weight 10."""
        t = {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": "kubernetes.io/hostname"}
        terms = self.spec.setdefault("affinity", {}).setdefault(kind, {})
        if required:
            terms.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(t)
        else:
            terms.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(
                {"weight": 10, "podAffinityTerm": t})
        return self

    def with_spread(self, when: str = "DoNotSchedule", app: str = "w") -> "Pod":
        """A topology spread constraint over hostnames, ``whenUnsatisfiable: when``."""
        self.spec.setdefault("topologySpreadConstraints", []).append(
            {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": when,
             "labelSelector": {"matchLabels": {"app": app}}})
        return self

    def with_volume(self, name: str, **source: Any) -> "Pod":
        """A volume: ``with_volume("data", persistentVolumeClaim={"claimName": "data"})``."""
        self.spec.setdefault("volumes", []).append({"name": name, **source})
        return self

    def with_resource_claim(self, name: str, template: str) -> "Pod":
        """A Dynamic Resource Allocation claim: ``spec.resourceClaims`` gets ``name`` (made from the
        ResourceClaimTemplate ``template``) and the first container uses it (``resources.claims``)."""
        self.spec.setdefault("resourceClaims", []).append({"name": name, "resourceClaimTemplateName": template})
        self.spec["containers"][0].setdefault("resources", {}).setdefault("claims", []).append({"name": name})
        return self

    def with_gates(self, *names: str) -> "Pod":
        """``spec.schedulingGates`` with these names."""
        self.spec.setdefault("schedulingGates", []).extend({"name": n} for n in names)
        return self

    def with_priority(self, value: int, policy: str | None = None) -> "Pod":
        """``spec.priority`` (and ``spec.preemptionPolicy``)."""
        self.spec["priority"] = value
        if policy:
            self.spec["preemptionPolicy"] = policy
        return self

    def with_labels(self, labels: dict | None = None, **kw: str) -> "Pod":
        self["metadata"].setdefault("labels", {}).update(labels or {}, **kw)
        return self

    def in_group(self, group: str) -> "Pod":
        """A member of the PodGroup ``group`` of its namespace (label ``scheduling.x-k8s.io/pod-group``)."""
        return self.with_labels({"scheduling.x-k8s.io/pod-group": group})

    def started(self, second: int) -> "Pod":
        """Running since ``second`` seconds after 2026-01-01T00:00:00Z (``status.startTime``)."""
        self.setdefault("status", {}).update(phase="Running", startTime=f"2026-01-01T00:{second // 60:02d}:{second % 60:02d}Z")
        return self

    def terminating_by_preemption(self) -> "Pod":
        """Deleted by a preemption and still terminating (deletionTimestamp, DisruptionTarget)."""
        self["metadata"]["deletionTimestamp"] = "2026-01-01T01:00:00Z"
        self.setdefault("status", {}).setdefault("conditions", []).append(
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"})
        return self

    def on(self, node_name: str) -> "Pod":
        """Bound to ``node_name`` (``spec.nodeName``)."""
        self.spec["nodeName"] = node_name
        return self

    def info(self) -> PodInfo:
        return PodInfo.from_object(self)


def pod(name: str = "p", cpu: Any = None, memory: Any = None, *, requests: dict | None = None,
        limits: dict | None = None, uid: str | None = None, namespace: str = "default") -> Pod:
    """A Pod with one container requesting ``cpu``/``memory`` (and ``requests``), unique uid."""
    return Pod({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}-{next(_uids)}"},
        "spec": {"containers": [container("c", cpu, memory, requests=requests, limits=limits)]},
    })


def pod_group(name: str, min_member: int | None = 2, *, namespace: str = "default", timeout_s: int | None = None,
              created: str = "2026-01-01T00:00:00Z", **min_resources: Any) -> dict:
    """A PodGroup (``scheduling.x-k8s.io/v1alpha1``) dict; ``min_member`` None leaves it out."""
    spec: dict = {}
    if min_member is not None:
        spec["minMember"] = min_member
    if timeout_s is not None:
        spec["scheduleTimeoutSeconds"] = timeout_s
    if min_resources:
        spec["minResources"] = {k: str(v) for k, v in min_resources.items()}
    return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-pg-{name}-{next(_uids)}",
                         "creationTimestamp": created}, "spec": spec}


class Node(dict):
    """A Node dict with fluent helpers; each helper edits the node and returns it."""

    def with_taint(self, key: str, value: str | None = None, effect: str = "NoSchedule") -> "Node":
        t: dict = {"key": key, "effect": effect}
        if value is not None:
            t["value"] = value
        self["spec"].setdefault("taints", []).append(t)
        return self

    def with_labels(self, labels: dict | None = None, **kw: str) -> "Node":
        self["metadata"].setdefault("labels", {}).update(labels or {}, **kw)
        return self

    def cordoned(self, value: bool = True) -> "Node":
        self["spec"]["unschedulable"] = value
        return self

    def info(self) -> NodeInfo:
        return NodeInfo.from_object(self)


def node(name: str, cpu: Any = "4", memory: Any = "8Gi", pods: Any = 110, *, alloc: dict | None = None) -> Node:
    """A Node with ``status.allocatable`` cpu/memory/pods (None leaves one out) plus ``alloc``."""
    allocatable = {k: str(v) for k, v in (("cpu", cpu), ("memory", memory), ("pods", pods)) if v is not None}
    allocatable.update(alloc or {})
    return Node({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {"allocatable": allocatable},
    })


def table_of(*nodes: Node | NodeInfo, pods: Iterable[Pod | PodInfo] = ()) -> NodeTable:
    """A NodeTable holding ``nodes`` and the bound ``pods`` (each counted on its ``spec.nodeName``)."""
    table = NodeTable()
    for n in nodes:
        table.add_node(n if isinstance(n, NodeInfo) else n.info())
    for p in pods:
        info = p if isinstance(p, PodInfo) else p.info()
        assert info.node_name, f"pod {info.key} is not bound: use .on(node)"
        assert table.add_pod(PodUsage.of(info), info.node_name), f"no node {info.node_name!r}"
    return table


def _fallback_profile() -> SimpleNamespace:
    """kube's default profile for the plugins shardsched has, while `shardsched.config` has no loader."""
    ref = lambda name, weight=0: SimpleNamespace(name=name, weight=weight)  # noqa: E731
    return SimpleNamespace(
        scheduler_name="default-scheduler",
        plugins={
            "queueSort": [ref("PrioritySort")],
            "filter": [ref(n) for n in ("NodeUnschedulable", "NodeName", "TaintToleration", "NodeAffinity",
                                        "NodePorts", "NodeResourcesFit")],
            "score": [ref("NodeResourcesFit", 1), ref("NodeResourcesBalancedAllocation", 1),
                      ref("TaintToleration", 3), ref("NodeAffinity", 2)],
            "bind": [ref("DefaultBinder")],
        },
        plugin_args={},
        percentage_of_nodes_to_score=None,
        guarded_plugins=(),
    )


def default_framework(percentage: int | None = None, partial_view: bool = False) -> Framework:
    """The default profile's Framework; ``percentage`` is the global percentageOfNodesToScore;
    ``partial_view`` as a shard's (`Framework`)."""
    try:
        from shardsched.config import load_config
    except ImportError:
        profile = _fallback_profile()
    else:
        profile = load_config(None).profiles[0]
    return Framework(profile, IN_TREE, percentage, partial_view)


def pod_info(p) -> PodInfo:
    """A builder's PodInfo, or a PodInfo as it is."""
    return p if isinstance(p, PodInfo) else p.info()


def run_filter(plugin, p, table: NodeTable) -> tuple[set[str], dict[str, int]]:
    """(names of the nodes that pass, failure reasons of the others) as the framework runs a Filter."""
    info, state = pod_info(p), CycleState()
    valid = table.valid_slots()
    if plugin.pre_filter(state, info, table).is_skip():
        return {table.names[s] for s in np.flatnonzero(valid)}, {}
    mask = plugin.filter(state, info, table, slice(0, table.n))
    failed = np.flatnonzero(valid & ~mask)
    reasons = plugin.failure_reasons(state, info, table, failed) if len(failed) else {}
    return {table.names[s] for s in np.flatnonzero(valid & mask)}, reasons


def run_score(plugin, p, table: NodeTable) -> dict[str, int] | None:
    """{node: score} over every node (normalized when the plugin normalizes); None when PreScore
    says Skip (every node scores the same)."""
    info, state = pod_info(p), CycleState()
    if isinstance(plugin, FilterPlugin):
        plugin.pre_filter(state, info, table)
    if plugin.pre_score(state, info, table).is_skip():
        return None
    slots = np.flatnonzero(table.valid_slots())
    raw = plugin.score(state, info, table, slots)
    if plugin.normalizes:
        raw = plugin.normalize_score(state, info, raw)
    return {table.names[s]: int(v) for s, v in zip(slots, raw)}
