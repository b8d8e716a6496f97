"""PodInfo and NodeInfo: the scheduling-relevant view of Pod and Node objects.

Both are built from plain dicts (YAML/JSON, camelCase keys) or from the kubernetes client's models
(converted with ``ApiClient.sanitize_for_serialization``). Every field is validated once here, so the
plugins never meet a malformed object: a bad field raises `InvalidObjectError` naming its path.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import re
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any

from shardsched.api.podaffinity import (PodAffinity, SpreadConstraint, parse_pod_affinity,
                                        parse_spread_constraints)
from shardsched.api.podvolumes import NO_VOLUMES, PodVolumes, parse_pod_volumes
from shardsched.api.quantity import PODS, parse_resource_list
from shardsched.api.requests import nonzero_requests, pod_requests
from shardsched.api.workloads import controller_of
from shardsched.errors import InvalidObjectError

TERMINAL_PHASES = ("Succeeded", "Failed")
#: the label a pod names its PodGroup by (scheduler-plugins' ``v1alpha1.PodGroupLabel``;
#: `shardsched.api.podgroup` has the groups)
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
PREEMPT_LOWER_PRIORITY, PREEMPT_NEVER = "PreemptLowerPriority", "Never"
PREEMPTION_POLICIES = (PREEMPT_LOWER_PRIORITY, PREEMPT_NEVER)
DEFAULT_GRACE_PERIOD_S = 30
#: the condition a preemption adds to its victims (kube's DisruptionTarget, reason PreemptionByScheduler)
DISRUPTION_TARGET, PREEMPTION_BY_SCHEDULER = "DisruptionTarget", "PreemptionByScheduler"


def disruption_target_condition(scheduler_name: str) -> dict[str, str]:
    """The condition a preemption adds to a victim before deleting it, as upstream's
    ``PrepareCandidate``: ``DisruptionTarget=True``, reason ``PreemptionByScheduler``, message
    ``"<the preemptor's schedulerName>: preempting to accommodate a higher priority pod"``."""
    return {"type": DISRUPTION_TARGET, "status": "True", "reason": PREEMPTION_BY_SCHEDULER,
            "message": f"{scheduler_name}: preempting to accommodate a higher priority pod"}

TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
#: The taint the node lifecycle controller puts on cordoned nodes; tolerating it lets a pod pass
#: NodeUnschedulable (as kube-scheduler's NodeUnschedulable plugin).
UNSCHEDULABLE_TAINT_KEY = "node.kubernetes.io/unschedulable"


_INT64_RE = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def parse_int64(value: str) -> int | None:
    """``value`` as Go's ``strconv.ParseInt(value, 10, 64)`` reads it, or None where Go fails.

    Stricter than Python's ``int``: no surrounding spaces, no ``_`` separators, no non-ASCII
    digits, and within int64. Labels compared by node selector ``Gt``/``Lt`` are read this way.
    """
    if not _INT64_RE.fullmatch(value):
        return None
    number = int(value)
    return number if _INT64_MIN <= number <= _INT64_MAX else None


def parse_time(value: Any, path: str) -> float | None:
    """An RFC 3339 time (``2026-01-01T00:00:01Z``, as the API server writes ``metav1.Time``) as Unix
    seconds; None for None or "".

    Raises:
        InvalidObjectError: not such a time.
    """
    if value is None or value == "":
        return None
    if isinstance(value, datetime.datetime):  # the kubernetes client's models
        moment = value
    else:
        try:
            moment = datetime.datetime.fromisoformat(str(value))
        except ValueError:
            raise InvalidObjectError(f"{value!r} is not an RFC 3339 time", path) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp()


def as_dict(obj: Any) -> dict:
    """A Kubernetes object as a plain dict with camelCase keys.

    Accepts a dict (returned as is) or a kubernetes client model (``V1Pod``, ``V1Node``, ...).

    Raises:
        InvalidObjectError: anything else.
    """
    if isinstance(obj, Mapping):
        return obj  # type: ignore[return-value]
    if hasattr(obj, "openapi_types") and hasattr(obj, "attribute_map"):
        from kubernetes.client import ApiClient  # only for client models

        return ApiClient().sanitize_for_serialization(obj)
    raise InvalidObjectError(f"expected a Kubernetes object, got {type(obj).__name__}")


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise InvalidObjectError("metadata is missing", "metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidObjectError("metadata.name is missing", "metadata.name")
    return meta


def _str_map(value: Any, path: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidObjectError("expected a map of strings", path)
    out = {}
    for k, v in value.items():
        if not isinstance(k, str):
            raise InvalidObjectError(f"key {k!r} is not a string", path)
        if isinstance(v, bool) or v is None or not isinstance(v, (str, int, float)):
            raise InvalidObjectError(f"value of {k!r} is not a string", f"{path}.{k}")
        out[k] = str(v)
    return out


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint: key, value, effect (NoSchedule, PreferNoSchedule or NoExecute)."""

    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod toleration. ``operator`` is Equal or Exists; empty key with Exists matches every key."""

    key: str
    operator: str
    value: str
    effect: str

    def tolerates(self, taint: Taint) -> bool:
        """Upstream ``Toleration.ToleratesTaint``: effect (when set) and key (when set) must match;
        Exists matches any value, Equal needs the same value."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.value == taint.value


@dataclass(frozen=True, slots=True)
class ContainerPort:
    """A host port a pod asks for: (hostIP, protocol, hostPort); empty IP is 0.0.0.0, empty protocol TCP."""

    host_ip: str
    protocol: str
    port: int

    def conflicts(self, other: "ContainerPort") -> bool:
        """Same protocol and port, and the IPs overlap (0.0.0.0 overlaps every IP), as kube's HostPortInfo."""
        if self.port != other.port or self.protocol != other.protocol:
            return False
        return self.host_ip == other.host_ip or "0.0.0.0" in (self.host_ip, other.host_ip)


# A node selector requirement, normalized: (key, operator, values) with values a sorted tuple.
Requirement = tuple[str, str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class SelectorTerm:
    """One NodeSelectorTerm: all expressions (labels) and fields (metadata.name) must match.
    An empty term matches no node (as upstream)."""

    match_expressions: tuple[Requirement, ...] = ()
    match_fields: tuple[Requirement, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.match_expressions and not self.match_fields


def _requirements(items: Any, path: str, fields: bool) -> tuple[Requirement, ...]:
    if items is None:
        return ()
    if not isinstance(items, list):
        raise InvalidObjectError("expected a list of requirements", path)
    out = []
    for i, r in enumerate(items):
        p = f"{path}[{i}]"
        if not isinstance(r, Mapping):
            raise InvalidObjectError("requirement must be an object", p)
        key, op = r.get("key"), r.get("operator")
        if not isinstance(key, str) or not key:
            raise InvalidObjectError("key is missing", f"{p}.key")
        if op not in SELECTOR_OPERATORS:
            raise InvalidObjectError(f"operator {op!r} is not one of {', '.join(SELECTOR_OPERATORS)}", f"{p}.operator")
        values = r.get("values") or []
        if not isinstance(values, list):
            raise InvalidObjectError("values must be a list", f"{p}.values")
        values = tuple(sorted(str(v) for v in values))
        if op in ("In", "NotIn") and not values:
            raise InvalidObjectError(f"{op} needs at least one value", f"{p}.values")
        if op in ("Exists", "DoesNotExist") and values:
            raise InvalidObjectError(f"{op} takes no values", f"{p}.values")
        if op in ("Gt", "Lt"):
            if len(values) != 1:
                raise InvalidObjectError(f"{op} needs exactly one value", f"{p}.values")
            if parse_int64(values[0]) is None:
                raise InvalidObjectError(f"{op} value {values[0]!r} is not a 64-bit integer", f"{p}.values")
        if fields:
            if key != "metadata.name":
                raise InvalidObjectError(f"field {key!r} is not supported (only metadata.name)", f"{p}.key")
            if op not in ("In", "NotIn"):
                raise InvalidObjectError(f"operator {op} is not allowed on fields (In, NotIn)", f"{p}.operator")
        out.append((key, op, values))
    return tuple(out)


def _term(obj: Any, path: str) -> SelectorTerm:
    if obj is None:
        obj = {}
    if not isinstance(obj, Mapping):
        raise InvalidObjectError("term must be an object", path)
    return SelectorTerm(
        _requirements(obj.get("matchExpressions"), f"{path}.matchExpressions", fields=False),
        _requirements(obj.get("matchFields"), f"{path}.matchFields", fields=True),
    )


def parse_node_affinity(na: Any, base: str) -> tuple[tuple[SelectorTerm, ...] | None, tuple[tuple[int, SelectorTerm], ...]]:
    """Parse a NodeAffinity object into (required terms or None, ((weight, term), ...)).

    Raises:
        InvalidObjectError: malformed terms or weights outside 1..100, with the field path under ``base``.
    """
    na = na or {}
    if not isinstance(na, Mapping):
        raise InvalidObjectError("nodeAffinity must be an object", base)
    required = None
    req = na.get("requiredDuringSchedulingIgnoredDuringExecution")
    if req is not None:
        rbase = f"{base}.requiredDuringSchedulingIgnoredDuringExecution"
        if not isinstance(req, Mapping):
            raise InvalidObjectError("must be an object", rbase)
        terms = req.get("nodeSelectorTerms") or []
        if not isinstance(terms, list):
            raise InvalidObjectError("nodeSelectorTerms must be a list", f"{rbase}.nodeSelectorTerms")
        required = tuple(_term(t, f"{rbase}.nodeSelectorTerms[{i}]") for i, t in enumerate(terms))
    pref = na.get("preferredDuringSchedulingIgnoredDuringExecution") or []
    pbase = f"{base}.preferredDuringSchedulingIgnoredDuringExecution"
    if not isinstance(pref, list):
        raise InvalidObjectError("must be a list", pbase)
    preferred = []
    for i, p in enumerate(pref):
        if not isinstance(p, Mapping):
            raise InvalidObjectError("must be an object", f"{pbase}[{i}]")
        w = p.get("weight")
        if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= 100:
            raise InvalidObjectError(f"weight {w!r} must be an integer in 1..100", f"{pbase}[{i}].weight")
        preferred.append((w, _term(p.get("preference"), f"{pbase}[{i}].preference")))
    return required, tuple(preferred)


def _ports(spec: Mapping[str, Any]) -> tuple[ContainerPort, ...]:
    """The host ports of the containers (NodePorts reads app containers). With ``hostNetwork`` a
    port without ``hostPort`` takes its ``containerPort``, as the API server defaults it on create
    (``defaultHostNetworkPorts``), so manifests read before that defaulting hold the same ports."""
    out = []
    host_network = spec.get("hostNetwork") is True
    for i, c in enumerate(spec.get("containers") or []):
        for j, p in enumerate((c or {}).get("ports") or []):
            path = f"spec.containers[{i}].ports[{j}]"
            if not isinstance(p, Mapping):
                raise InvalidObjectError("port must be an object", path)
            hp = p.get("hostPort") or (p.get("containerPort") if host_network else 0) or 0
            if isinstance(hp, bool) or not isinstance(hp, int) or not 0 <= hp <= 65535:
                raise InvalidObjectError(f"hostPort {hp!r} is not a port number", f"{path}.hostPort")
            if hp <= 0:
                continue
            proto = p.get("protocol") or "TCP"
            if proto not in ("TCP", "UDP", "SCTP"):
                raise InvalidObjectError(f"protocol {proto!r} is not TCP, UDP or SCTP", f"{path}.protocol")
            out.append(ContainerPort(str(p.get("hostIP") or "0.0.0.0"), proto, hp))
    return tuple(out)


def _tolerations(items: Any) -> tuple[Toleration, ...]:
    if items is None:
        return ()
    if not isinstance(items, list):
        raise InvalidObjectError("tolerations must be a list", "spec.tolerations")
    out = []
    for i, t in enumerate(items):
        p = f"spec.tolerations[{i}]"
        if not isinstance(t, Mapping):
            raise InvalidObjectError("toleration must be an object", p)
        op = t.get("operator") or "Equal"
        if op not in ("Equal", "Exists"):
            raise InvalidObjectError(f"operator {op!r} is not Equal or Exists", f"{p}.operator")
        key = str(t.get("key") or "")
        if not key and op != "Exists":
            raise InvalidObjectError("an empty key needs operator Exists", f"{p}.operator")
        effect = t.get("effect") or ""
        if effect and effect not in TAINT_EFFECTS:
            raise InvalidObjectError(f"effect {effect!r} is not one of {', '.join(TAINT_EFFECTS)}", f"{p}.effect")
        value = "" if t.get("value") is None else str(t.get("value"))
        out.append(Toleration(key, op, value, effect))
    return tuple(out)


def _scheduling_gates(items: Any) -> tuple[str, ...]:
    """Names of ``spec.schedulingGates``, in order."""
    if items is None:
        return ()
    if not isinstance(items, list):
        raise InvalidObjectError("schedulingGates must be a list", "spec.schedulingGates")
    out = []
    for i, gate in enumerate(items):
        name = gate.get("name") if isinstance(gate, Mapping) else None
        if not isinstance(name, str) or not name:
            raise InvalidObjectError("a scheduling gate needs a name", f"spec.schedulingGates[{i}].name")
        out.append(name)
    return tuple(out)


def _claim_volumes(items: Any) -> tuple[str, ...]:
    """Names of the volumes that need volume binding: ``persistentVolumeClaim`` and ``ephemeral``
    ones (upstream VolumeBinding's ``podHasPVCs``)."""
    if items is None:
        return ()
    if not isinstance(items, list):
        raise InvalidObjectError("volumes must be a list", "spec.volumes")
    out = []
    for i, v in enumerate(items):
        if not isinstance(v, Mapping):
            raise InvalidObjectError("volume must be an object", f"spec.volumes[{i}]")
        if v.get("persistentVolumeClaim") is not None or v.get("ephemeral") is not None:
            out.append(str(v.get("name") or f"volumes[{i}]"))
    return tuple(out)


#: Inline volume sources that kube's default volume plugins check against other pods or node limits:
#: VolumeRestrictions' conflicts (``needsRestrictionsCheck``) and NodeVolumeLimits' counts of in-tree
#: volumes migrated to CSI drivers; source key -> plugin, in kube's default order of the plugins.
DISK_VOLUME_SOURCES: dict[str, str] = {
    "gcePersistentDisk": "VolumeRestrictions", "awsElasticBlockStore": "VolumeRestrictions",
    "rbd": "VolumeRestrictions", "iscsi": "VolumeRestrictions",
    "azureDisk": "NodeVolumeLimits", "cinder": "NodeVolumeLimits", "vsphereVolume": "NodeVolumeLimits",
    "portworxVolume": "NodeVolumeLimits",
}


def _disk_volumes(items: Any) -> tuple[tuple[str, str], ...]:
    """(volume name, source key) of the volumes with a source of `DISK_VOLUME_SOURCES`, in order
    (``spec.volumes`` is checked to be a list of objects by `_claim_volumes`)."""
    out = []
    for i, v in enumerate(items or ()):
        for source in DISK_VOLUME_SOURCES:
            if v.get(source) is not None:
                out.append((str(v.get("name") or f"volumes[{i}]"), source))
    return tuple(out)


def _resource_claims(items: Any) -> tuple[str, ...]:
    """Names of ``spec.resourceClaims`` (Dynamic Resource Allocation; upstream DynamicResources'
    PreFilter skips a pod without any)."""
    if items is None:
        return ()
    if not isinstance(items, list):
        raise InvalidObjectError("resourceClaims must be a list", "spec.resourceClaims")
    out = []
    for i, claim in enumerate(items):
        name = claim.get("name") if isinstance(claim, Mapping) else None
        if not isinstance(name, str) or not name:
            raise InvalidObjectError("a resource claim needs a name", f"spec.resourceClaims[{i}].name")
        out.append(name)
    return tuple(out)


@dataclass(slots=True)
class PodInfo:
    """Scheduling view of a Pod (kube's ``PodInfo``), all units canonical.

    Attributes:
        requests: effective requests for filtering and accounting (`pod_requests`), including
            ``pods: 1``.
        nonzero_cpu_milli / nonzero_memory_bytes: requests for scoring (kube's non-zero defaults).
        scheduling_gates: names in ``spec.schedulingGates``; while there is one the pod is not
            queued (SchedulingGates' PreEnqueue).
        pod_affinity: its pod affinity and anti-affinity terms (`shardsched.api.podaffinity`).
        spread_constraints: its ``spec.topologySpreadConstraints``, ``matchLabelKeys`` merged.
        claim_volumes: names of its volumes that need volume binding (``persistentVolumeClaim``,
            ``ephemeral``).
        disk_volumes: (name, source) of its inline volumes that VolumeRestrictions or
            NodeVolumeLimits check (`DISK_VOLUME_SOURCES`).
        resource_claims: names of its ``spec.resourceClaims`` (Dynamic Resource Allocation).
        volumes: what its ``spec.volumes`` asks of the volume plugins (`PodVolumes`: claim names,
            in-tree disks, inline volumes counted against attach limits).
        preemption_policy: ``spec.preemptionPolicy`` (``PreemptLowerPriority`` or ``Never``), else
            its PriorityClass's, as the Priority admission plugin sets it.
        start_time_s: ``status.startTime`` as Unix seconds, None when unset (kube's GetPodStartTime
            then takes "now": such a pod is the least important of its priority for preemption).
        grace_period_s: ``spec.terminationGracePeriodSeconds`` (default 30): how long a victim keeps
            its room once deleted.
        preempted: the pod has the ``DisruptionTarget`` condition with reason
            ``PreemptionByScheduler``: deleted by a preemption (upstream podTerminatingByPreemption).
        nominated_node_name: the node the coordinator chose for this pod over the whole cluster,
            for a pod whose constraints a shard cannot check alone (``Framework.needs_cluster_view``):
            the shard places the pod there or hands it back. Not read from the object.
        nominated_devices: the GPU devices held for the pod on its nominated node (a preemptor's
            nomination, a gang member's hold: indices in the node's order, `DEVICES_ANNOTATION`'s
            numbering); the shards count the nomination on them and bind the pod on them when they
            fit. () for none. Not read from the object.
        controller: (kind, name) of its controller when it is a ReplicationController, ReplicaSet
            or StatefulSet (`shardsched.api.workloads.controller_of`): PodTopologySpread's default
            constraints read that object's selector.
        signature: hash of everything that decides where the pod can go and how nodes score for it,
            its nominated node included (`compute_signature`).
        spec_signature: the signature without the nominated node: what the Filter and Score
            plugins read, so pods with the same one share cached Filter/Score results.
    """

    uid: str
    namespace: str
    name: str
    priority: int
    scheduler_name: str
    node_name: str
    phase: str
    deleting: bool
    requests: dict[str, int]
    nonzero_cpu_milli: int
    nonzero_memory_bytes: int
    node_selector: dict[str, str]
    required_terms: tuple[SelectorTerm, ...] | None
    preferred_terms: tuple[tuple[int, SelectorTerm], ...]
    tolerations: tuple[Toleration, ...]
    host_ports: tuple[ContainerPort, ...]
    scheduling_gates: tuple[str, ...]
    pod_affinity: PodAffinity
    spread_constraints: tuple[SpreadConstraint, ...]
    claim_volumes: tuple[str, ...]
    disk_volumes: tuple[tuple[str, str], ...]
    resource_claims: tuple[str, ...]
    labels: dict[str, str]
    creation_timestamp: str
    preemption_policy: str = PREEMPT_LOWER_PRIORITY
    start_time_s: float | None = None
    grace_period_s: int = DEFAULT_GRACE_PERIOD_S
    preempted: bool = False
    nominated_node_name: str = ""
    nominated_devices: tuple[int, ...] = ()
    controller: tuple[str, str] | None = None
    volumes: PodVolumes = NO_VOLUMES
    signature: str = ""
    spec_signature: str = ""
    obj: dict = field(default_factory=dict, repr=False)

    @property
    def key(self) -> str:
        """``namespace/name``, the key kube uses in queues and caches."""
        return f"{self.namespace}/{self.name}"

    def nominated(self, node: str, devices: tuple[int, ...] = ()) -> "PodInfo":
        """A copy with ``nominated_node_name`` set to ``node`` ("" clears it) and
        ``nominated_devices`` to ``devices`` (() without a node), signature updated."""
        copy = dataclasses.replace(self, nominated_node_name=node,
                                   nominated_devices=tuple(int(i) for i in devices) if node else ())
        copy.signature = _with_nomination(self.spec_signature, node)
        return copy

    @property
    def required_pod_affinity(self) -> bool:
        """The pod has ``requiredDuringSchedulingIgnoredDuringExecution`` pod affinity terms."""
        return bool(self.pod_affinity.required_affinity)

    @property
    def required_pod_anti_affinity(self) -> bool:
        """The pod has ``requiredDuringSchedulingIgnoredDuringExecution`` pod anti-affinity terms."""
        return bool(self.pod_affinity.required_anti_affinity)

    @property
    def hard_topology_spread(self) -> bool:
        """The pod has a topology spread constraint with ``whenUnsatisfiable: DoNotSchedule``."""
        return any(c.when_unsatisfiable == "DoNotSchedule" for c in self.spread_constraints)

    @property
    def bound(self) -> bool:
        return bool(self.node_name)

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @classmethod
    def from_object(cls, obj: Any, priority_classes: Mapping[str, int] | None = None,
                    default_priority: int = 0, preemption_policies: Mapping[str, str] | None = None) -> "PodInfo":
        """Build from a Pod dict or client model.

        Args:
            priority_classes: PriorityClass name -> value, used when ``spec.priority`` is unset and
                ``spec.priorityClassName`` is set (as the Priority admission plugin does).
            default_priority: priority of a pod with neither (a globalDefault PriorityClass, or 0).
            preemption_policies: PriorityClass name -> its ``preemptionPolicy``, used when
                ``spec.preemptionPolicy`` is unset (as the Priority admission plugin does).

        Raises:
            InvalidObjectError: a field is malformed (with its path), the pod has no containers, or
                its priorityClassName names no known PriorityClass.
        """
        obj = as_dict(obj)
        meta = _meta(obj)
        spec = obj.get("spec")
        if not isinstance(spec, Mapping):
            raise InvalidObjectError("spec is missing", "spec")
        containers = spec.get("containers")
        if not isinstance(containers, list) or not containers:
            raise InvalidObjectError("a pod needs at least one container", "spec.containers")
        requests = pod_requests(obj)
        requests = {k: v for k, v in requests.items() if v > 0}
        requests[PODS] = 1
        nz_cpu, nz_mem = nonzero_requests(obj)

        prio = spec.get("priority")
        if prio is None:
            pcn = spec.get("priorityClassName")
            if pcn:
                if priority_classes is None or pcn not in priority_classes:
                    raise InvalidObjectError(f"no PriorityClass with name {pcn!r} was found", "spec.priorityClassName")
                prio = priority_classes[pcn]
            else:
                prio = default_priority
        if isinstance(prio, bool) or not isinstance(prio, int):
            raise InvalidObjectError(f"priority {prio!r} is not an integer", "spec.priority")

        node_selector = _str_map(spec.get("nodeSelector"), "spec.nodeSelector")
        affinity = spec.get("affinity") or {}
        if not isinstance(affinity, Mapping):
            raise InvalidObjectError("affinity must be an object", "spec.affinity")
        required, preferred = parse_node_affinity(affinity.get("nodeAffinity"), "spec.affinity.nodeAffinity")
        namespace = str(meta.get("namespace") or "default")
        labels = _str_map(meta.get("labels"), "metadata.labels")

        policy = spec.get("preemptionPolicy")
        if policy is None:
            policy = (preemption_policies or {}).get(str(spec.get("priorityClassName") or ""), PREEMPT_LOWER_PRIORITY)
        if policy not in PREEMPTION_POLICIES:
            raise InvalidObjectError(f"supported values: {', '.join(map(repr, PREEMPTION_POLICIES))}",
                                     "spec.preemptionPolicy")
        grace = spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_PERIOD_S)
        if grace is None:
            grace = DEFAULT_GRACE_PERIOD_S
        if isinstance(grace, bool) or not isinstance(grace, int) or grace < 0:
            raise InvalidObjectError(f"{grace!r} is not a non-negative integer", "spec.terminationGracePeriodSeconds")
        status = obj.get("status") or {}
        if not isinstance(status, Mapping):
            raise InvalidObjectError("status must be an object", "status")
        conditions = status.get("conditions") or ()
        preempted = isinstance(conditions, list) and any(
            isinstance(c, Mapping) and c.get("type") == DISRUPTION_TARGET and c.get("reason") == PREEMPTION_BY_SCHEDULER
            and str(c.get("status", "True")) == "True" for c in conditions)

        info = cls(
            uid=str(meta.get("uid") or f"{namespace}/{meta['name']}"),
            namespace=namespace,
            name=meta["name"],
            priority=prio,
            scheduler_name=str(spec.get("schedulerName") or "default-scheduler"),
            node_name=str(spec.get("nodeName") or ""),
            phase=str((obj.get("status") or {}).get("phase") or "Pending"),
            deleting=bool(meta.get("deletionTimestamp")),
            requests=requests,
            nonzero_cpu_milli=nz_cpu,
            nonzero_memory_bytes=nz_mem,
            node_selector=node_selector,
            required_terms=required,
            preferred_terms=preferred,
            tolerations=_tolerations(spec.get("tolerations")),
            host_ports=_ports(spec),
            scheduling_gates=_scheduling_gates(spec.get("schedulingGates")),
            pod_affinity=parse_pod_affinity(affinity, namespace, labels),
            spread_constraints=parse_spread_constraints(spec.get("topologySpreadConstraints"), labels),
            claim_volumes=_claim_volumes(spec.get("volumes")),
            disk_volumes=_disk_volumes(spec.get("volumes")),
            resource_claims=_resource_claims(spec.get("resourceClaims")),
            labels=labels,
            creation_timestamp=str(meta.get("creationTimestamp") or ""),
            preemption_policy=policy,
            start_time_s=parse_time(status.get("startTime"), "status.startTime"),
            grace_period_s=grace,
            preempted=preempted,
            controller=controller_of(meta),
            volumes=parse_pod_volumes(spec.get("volumes"), meta["name"], str(meta.get("uid") or "")),
            obj=obj,
        )
        info.spec_signature = info._spec_signature()
        info.signature = _with_nomination(info.spec_signature, info.nominated_node_name)
        return info

    def _signature_labels(self) -> dict[str, str]:
        """The labels the signature holds (`compute_signature`)."""
        labels = self.labels
        if POD_GROUP_LABEL not in labels or self.reads_own_label(POD_GROUP_LABEL):
            return labels
        return {k: v for k, v in labels.items() if k != POD_GROUP_LABEL}

    def reads_own_label(self, key: str) -> bool:
        """Whether the pod's own pod (anti-)affinity terms or spread constraints read its label ``key``
        (InterPodAffinity's and PodTopologySpread's self-match)."""
        return self.pod_affinity.reads_label(key) or any(
            c.selector is not None and c.selector.reads(key) for c in self.spread_constraints)

    def compute_signature(self) -> str:
        """Digest of the scheduling-relevant spec: requests, selectors, affinity, tolerations, ports,
        ``spec.nodeName`` (the NodeName filter depends on it), the scheduling gates, the volumes
        that need binding or a volume plugin's check, the resource claims, and what InterPodAffinity
        and PodTopologySpread read of the pod itself
        (namespace, labels, pod affinity terms, spread constraints), and the nominated node.

        The PodGroup label (`POD_GROUP_LABEL`) is left out unless the pod's own terms read it: it
        names the pod's gang, which no Filter or Score reads, so the members of many gangs share
        one signature. Other pods' terms and the spread selectors can still read it; the scheduler
        tells those cases apart (`GenericScheduler`, ``NodeTable.reads_pod_label``)."""
        return _with_nomination(self._spec_signature(), self.nominated_node_name)

    def _spec_signature(self) -> str:
        """`compute_signature` without the nominated node."""
        parts = (
            self.node_name,
            sorted(self.requests.items()),
            self.nonzero_cpu_milli,
            self.nonzero_memory_bytes,
            sorted(self.node_selector.items()),
            None if self.required_terms is None else [(t.match_expressions, t.match_fields) for t in self.required_terms],
            [(w, t.match_expressions, t.match_fields) for w, t in self.preferred_terms],
            sorted((t.key, t.operator, t.value, t.effect) for t in self.tolerations),
            sorted((p.host_ip, p.protocol, p.port) for p in self.host_ports),
            self.scheduler_name,
            self.scheduling_gates,
            self.claim_volumes,
            self.disk_volumes,
            repr(self.volumes) if not self.volumes.empty else None,
            self.resource_claims,
            # InterPodAffinity and PodTopologySpread read the pod's own namespace, labels and terms
            self.namespace,
            sorted(self._signature_labels().items()),
            None if self.pod_affinity.empty else self.pod_affinity.key,
            repr(self.spread_constraints) if self.spread_constraints else None,
            self.controller,  # PodTopologySpread's default constraints read its selector
        )
        return hashlib.blake2b(json.dumps(parts, default=list).encode(), digest_size=12).hexdigest()

def _with_nomination(spec_signature: str, node: str) -> str:
    """The signature of a pod with spec signature ``spec_signature`` nominated to ``node``."""
    if not node:
        return spec_signature
    return hashlib.blake2b(f"{spec_signature}/{node}".encode(), digest_size=12).hexdigest()


@dataclass(slots=True)
class NodeInfo:
    """Scheduling view of a Node (the static part of kube's ``NodeInfo``; usage lives in the NodeTable).

    Attributes:
        allocatable: ``status.allocatable`` in canonical units, or ``status.capacity`` when the
            node has no ``allocatable`` field (the API server's ``SetDefaults_NodeStatus``); a
            resource the node does not list counts as 0.
    """

    name: str
    uid: str
    labels: dict[str, str]
    taints: tuple[Taint, ...]
    unschedulable: bool
    allocatable: dict[str, int]
    obj: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_object(cls, obj: Any) -> "NodeInfo":
        """Build from a Node dict or client model.

        Raises:
            InvalidObjectError: a malformed field, with its path. A node with neither
                ``status.allocatable`` nor ``status.capacity`` is valid and has 0 of everything
                (no pod fits on it).
        """
        obj = as_dict(obj)
        meta = _meta(obj)
        spec = obj.get("spec") or {}
        if not isinstance(spec, Mapping):
            raise InvalidObjectError("spec must be an object", "spec")
        taints = []
        for i, t in enumerate(spec.get("taints") or []):
            p = f"spec.taints[{i}]"
            if not isinstance(t, Mapping) or not t.get("key"):
                raise InvalidObjectError("taint needs a key", f"{p}.key")
            if t.get("effect") not in TAINT_EFFECTS:
                raise InvalidObjectError(f"effect {t.get('effect')!r} is not one of {', '.join(TAINT_EFFECTS)}", f"{p}.effect")
            taints.append(Taint(str(t["key"]), "" if t.get("value") is None else str(t["value"]), t["effect"]))
        status = obj.get("status") or {}
        if not isinstance(status, Mapping):
            raise InvalidObjectError("status must be an object", "status")
        if status.get("allocatable") is None:
            allocatable = parse_resource_list(status.get("capacity"), "status.capacity")
        else:
            allocatable = parse_resource_list(status.get("allocatable"), "status.allocatable")
        return cls(
            name=meta["name"],
            uid=str(meta.get("uid") or meta["name"]),
            labels=_str_map(meta.get("labels"), "metadata.labels"),
            taints=tuple(taints),
            unschedulable=bool(spec.get("unschedulable")),
            allocatable=allocatable,
            obj=obj,
        )
