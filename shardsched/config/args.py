"""Plugin args: the ``pluginConfig[].args`` of a profile, defaulted and validated like upstream.

Each type mirrors kube-scheduler's ``kubescheduler.config.k8s.io/v1`` ``<Plugin>Args``: defaults as
the ``SetDefaults_<Plugin>Args`` functions (pkg/scheduler/apis/config/v1/defaults.go), checks as
pkg/scheduler/apis/config/validation/validation_pluginargs.go. ``apiVersion`` and ``kind`` inside
args are accepted (kube writes them) and checked by `validate_plugin_args`; they are not kept.
Plugins without an args type take `NoArgs` (no field besides ``apiVersion``/``kind``).
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional

from pydantic import Field, ValidationError, field_validator, model_validator

from shardsched.api.objects import parse_node_affinity
from shardsched.api.validation import qualified_name_problem
from shardsched.config.base import ConfigModel, Loc, error_lines, fail, fail_from, render_path
from shardsched.config.registry import (
    API_VERSION, DEPRECATED_API_VERSIONS, SUPPORTED_PLUGINS, unsupported_plugin_message,
)
from shardsched.errors import ConfigError, InvalidObjectError

LEAST_ALLOCATED = "LeastAllocated"
REQUESTED_TO_CAPACITY_RATIO = "RequestedToCapacityRatio"
#: kube's MaxCustomPriorityScore: the highest score of a RequestedToCapacityRatio shape point
MAX_CUSTOM_PRIORITY_SCORE = 10
#: kube's resource weight range for NodeResourcesFit scoring, (0, 100]
MAX_RESOURCE_WEIGHT = 100

class PluginArgs(ConfigModel):
    """Base of the args types; drops ``apiVersion``/``kind`` (type metadata, checked by the loader)."""

    @model_validator(mode="before")
    @classmethod
    def _drop_type_meta(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if k not in ("apiVersion", "kind")}
        return data


class NoArgs(PluginArgs):
    """Args of a plugin that takes none (PrioritySort, NodeUnschedulable, NodeName, ...)."""


class ResourceSpec(ConfigModel):
    """One resource and its weight; a weight of 0 (or none) means 1, as upstream defaulting."""

    name: str = Field(min_length=1)
    weight: int = 1

    @field_validator("weight")
    @classmethod
    def _default_weight(cls, weight: int) -> int:
        return weight or 1


def _default_resources() -> list[ResourceSpec]:
    """kube's ``defaultResourceSpec``: cpu and memory, weight 1 each."""
    return [ResourceSpec(name="cpu", weight=1), ResourceSpec(name="memory", weight=1)]


class UtilizationShapePoint(ConfigModel):
    """A point of the RequestedToCapacityRatio function: utilization in [0, 100] -> score in [0, 10]."""

    utilization: int = Field(0, ge=0, le=100)
    score: int = Field(0, ge=0, le=MAX_CUSTOM_PRIORITY_SCORE)


class RequestedToCapacityRatioParam(ConfigModel):
    """The shape of the RequestedToCapacityRatio strategy: at least one point, utilization increasing."""

    shape: list[UtilizationShapePoint] = Field(default_factory=list)

    @field_validator("shape")
    @classmethod
    def _check_shape(cls, shape: list[UtilizationShapePoint]) -> list[UtilizationShapePoint]:
        if not shape:
            fail("at least one point must be specified")
        for i in range(1, len(shape)):
            if shape[i - 1].utilization >= shape[i].utilization:
                fail("values must be sorted in increasing order", i, "utilization")
        return shape


class ScoringStrategy(ConfigModel):
    """How NodeResourcesFit scores nodes (upstream ``ScoringStrategy``).

    Attributes:
        type: LeastAllocated, MostAllocated or RequestedToCapacityRatio; required.
        resources: resources scored and their weights in [1, 100]; empty = cpu 1, memory 1.
        requested_to_capacity_ratio: the shape, required for (and only allowed with)
            RequestedToCapacityRatio.
    """

    type: Literal["LeastAllocated", "MostAllocated", "RequestedToCapacityRatio"]
    resources: list[ResourceSpec] = Field(default_factory=_default_resources)
    requested_to_capacity_ratio: Optional[RequestedToCapacityRatioParam] = None

    @field_validator("resources")
    @classmethod
    def _check_resources(cls, resources: list[ResourceSpec]) -> list[ResourceSpec]:
        for i, res in enumerate(resources):
            if not 0 < res.weight <= MAX_RESOURCE_WEIGHT:
                fail(f"resource weight of {res.name} not in valid range (0, {MAX_RESOURCE_WEIGHT}]", i, "weight")
        return resources or _default_resources()

    @model_validator(mode="after")
    def _check_shape_given(self) -> "ScoringStrategy":
        if self.type == REQUESTED_TO_CAPACITY_RATIO and self.requested_to_capacity_ratio is None:
            fail("must be specified when type is RequestedToCapacityRatio", "requestedToCapacityRatio")
        if self.type != REQUESTED_TO_CAPACITY_RATIO and self.requested_to_capacity_ratio is not None:
            fail("must not be set when type is not RequestedToCapacityRatio", "requestedToCapacityRatio")
        return self


class NodeResourcesFitArgs(PluginArgs):
    """Args of NodeResourcesFit (upstream ``NodeResourcesFitArgs``).

    Attributes:
        ignored_resources: resource names (label-name syntax) the Filter does not check.
        ignored_resource_groups: resource domain prefixes (no '/') the Filter does not check.
        scoring_strategy: default LeastAllocated on cpu 1, memory 1.
    """

    ignored_resources: list[str] = Field(default_factory=list)
    ignored_resource_groups: list[str] = Field(default_factory=list)
    scoring_strategy: ScoringStrategy = Field(
        default_factory=lambda: ScoringStrategy(type=LEAST_ALLOCATED))

    @field_validator("ignored_resources")
    @classmethod
    def _check_ignored_resources(cls, names: list[str]) -> list[str]:
        for i, name in enumerate(names):
            problem = qualified_name_problem(name)
            if problem:
                fail(problem, i)
        return names

    @field_validator("ignored_resource_groups")
    @classmethod
    def _check_ignored_groups(cls, groups: list[str]) -> list[str]:
        for i, group in enumerate(groups):
            problem = "resource group name can't contain '/'" if "/" in group else qualified_name_problem(group)
            if problem:
                fail(problem, i)
        return groups


class NodeResourcesBalancedAllocationArgs(PluginArgs):
    """Args of NodeResourcesBalancedAllocation: resources (no duplicates, weight 1); default cpu, memory."""

    resources: list[ResourceSpec] = Field(default_factory=_default_resources)

    @field_validator("resources")
    @classmethod
    def _check_resources(cls, resources: list[ResourceSpec]) -> list[ResourceSpec]:
        seen: set[str] = set()
        for i, res in enumerate(resources):
            if res.name in seen:
                fail(f"duplicate resource {res.name!r}", i, "name")
            seen.add(res.name)
            if res.weight != 1:
                fail("must be 1", i, "weight")
        return resources or _default_resources()


class _NodeSelectorRequirement(ConfigModel):
    key: str
    operator: str
    values: list[str] = Field(default_factory=list)


class _NodeSelectorTerm(ConfigModel):
    match_expressions: list[_NodeSelectorRequirement] = Field(default_factory=list)
    match_fields: list[_NodeSelectorRequirement] = Field(default_factory=list)


class _NodeSelector(ConfigModel):
    node_selector_terms: list[_NodeSelectorTerm] = Field(default_factory=list)


class _PreferredSchedulingTerm(ConfigModel):
    weight: int
    preference: _NodeSelectorTerm


class _NodeAffinity(ConfigModel):
    """The fields of a core/v1 NodeAffinity, to reject unknown or mistyped ones."""

    required_during_scheduling_ignored_during_execution: Optional[_NodeSelector] = None
    preferred_during_scheduling_ignored_during_execution: list[_PreferredSchedulingTerm] = Field(default_factory=list)


class NodeAffinityArgs(PluginArgs):
    """Args of NodeAffinity: ``addedAffinity``, a core/v1 NodeAffinity applied to every pod.

    Kept as the dict it was written as (camelCase keys); checked field by field (unknown fields are
    errors) and then as a pod's node affinity is (`shardsched.api.objects.parse_node_affinity`),
    as upstream ``ValidateNodeAffinityArgs``.
    """

    added_affinity: Optional[dict[str, Any]] = None

    @field_validator("added_affinity")
    @classmethod
    def _check_added_affinity(cls, added: dict[str, Any]) -> dict[str, Any]:
        try:
            _NodeAffinity.model_validate(added, by_name=False)
            parse_node_affinity(added, "")
        except ValidationError as exc:
            fail_from(exc)
        except InvalidObjectError as exc:
            fail(exc.message, exc.path)
        return added


class InterPodAffinityArgs(PluginArgs):
    """Args of InterPodAffinity (upstream ``InterPodAffinityArgs``).

    Attributes:
        hard_pod_affinity_weight: score weight, in [0, 100], of an existing pod's required affinity
            term that the incoming pod matches; default 1.
        ignore_preferred_terms_of_existing_pods: skip existing pods' terms when scoring a pod that
            has no preferred terms of its own; default false.
    """

    hard_pod_affinity_weight: int = Field(1, ge=0, le=100)
    ignore_preferred_terms_of_existing_pods: bool = False


class _TopologySpreadConstraint(ConfigModel):
    """A core/v1 TopologySpreadConstraint of ``defaultConstraints`` (no labelSelector allowed)."""

    max_skew: int = Field(ge=1)
    topology_key: str = Field(min_length=1)
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"]
    min_domains: Optional[int] = Field(None, ge=1)
    node_affinity_policy: Optional[Literal["Honor", "Ignore"]] = None
    node_taints_policy: Optional[Literal["Honor", "Ignore"]] = None
    match_label_keys: list[str] = Field(default_factory=list)


class PodTopologySpreadArgs(PluginArgs):
    """Args of PodTopologySpread (upstream ``PodTopologySpreadArgs``): the cluster-level default
    constraints, for pods without constraints of their own, with the selector of the Services and
    workloads selecting the pod (`shardsched.plugins.podtopologyspread`). Validated as upstream.

    Attributes:
        default_constraints: constraints for pods that have none (``List`` only).
        defaulting_type: ``System`` (kube's built-in defaults) or ``List``; unset, ``List`` when
            constraints are given, else ``System``.
    """

    default_constraints: list[_TopologySpreadConstraint] = Field(default_factory=list)
    defaulting_type: Literal["System", "List"] = "System"

    @model_validator(mode="before")
    @classmethod
    def _default_type(cls, data: Any) -> Any:
        # upstream SetDefaults_PodTopologySpreadArgs: List when constraints are given, else System
        if isinstance(data, dict) and data.get("defaultingType") is None and data.get("defaultConstraints"):
            return {**data, "defaultingType": "List"}
        return data

    @model_validator(mode="after")
    def _check_defaulting(self) -> "PodTopologySpreadArgs":
        if self.defaulting_type == "System" and self.default_constraints:
            fail("when .defaultingType=System, defaultConstraints must be empty", "defaultConstraints")
        return self


class NodeLabelArgs(PluginArgs):
    """Args of NodeLabel (upstream ``NodeLabelArgs`` of v1.22; `shardsched.plugins.nodelabel`).

    Attributes:
        present_labels: label keys a node must have to pass the Filter.
        absent_labels: label keys a node must not have to pass the Filter.
        present_labels_preference: label keys that each score a node 100 when it has them.
        absent_labels_preference: label keys that each score a node 100 when it lacks them.

    Keys are qualified names (label-key syntax). A key may not be in both lists of a pair
    (``presentLabels``/``absentLabels``, or the two preferences), as upstream ``ValidateNodeLabelArgs``.
    """

    present_labels: list[str] = Field(default_factory=list)
    absent_labels: list[str] = Field(default_factory=list)
    present_labels_preference: list[str] = Field(default_factory=list)
    absent_labels_preference: list[str] = Field(default_factory=list)

    @field_validator("present_labels", "absent_labels", "present_labels_preference", "absent_labels_preference")
    @classmethod
    def _check_keys(cls, keys: list[str]) -> list[str]:
        for i, key in enumerate(keys):
            problem = qualified_name_problem(key)
            if problem:
                fail(problem, i)
        return keys

    @model_validator(mode="after")
    def _check_conflicts(self) -> "NodeLabelArgs":
        for present, absent, field in ((self.present_labels, self.absent_labels, "absentLabels"),
                                       (self.present_labels_preference, self.absent_labels_preference,
                                        "absentLabelsPreference")):
            for i, key in enumerate(absent):
                if key in present:
                    fail(f"label {key!r} is also in the present list; a label cannot be both present and absent",
                         field, i)
        return self


class DefaultPreemptionArgs(PluginArgs):
    """Args of DefaultPreemption (upstream ``DefaultPreemptionArgs``, validated as
    ``ValidateDefaultPreemptionArgs``).

    Attributes:
        min_candidate_nodes_percentage: in [0, 100]; default 10.
        min_candidate_nodes_absolute: >= 0; default 100. Not both 0.
    """

    min_candidate_nodes_percentage: int = Field(10, ge=0, le=100)
    min_candidate_nodes_absolute: int = Field(100, ge=0)

    @model_validator(mode="after")
    def _check_positive(self) -> "DefaultPreemptionArgs":
        if self.min_candidate_nodes_percentage == 0 and self.min_candidate_nodes_absolute == 0:
            fail("cannot be zero at the same time as minCandidateNodesAbsolute", "minCandidateNodesPercentage")
        return self


class TypicalPodSpec(ConfigModel):
    """One typical pod shape of GPUDevice's FGD strategies: CPU, memory (MiB), devices, weight (a count)."""

    cpu_milli: int = Field(0, ge=0)
    memory_mib: int = Field(0, ge=0)
    gpu_count: int = Field(0, ge=0)
    gpu_milli: int = Field(0, ge=0, le=1000)
    gpu_models: list[str] = Field(default_factory=list)
    weight: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _check_shape(self) -> "TypicalPodSpec":
        if (self.gpu_count == 0) != (self.gpu_milli == 0):
            fail("gpuCount and gpuMilli are both 0 (no GPU) or both set", "gpuMilli")
        if self.gpu_count > 1 and self.gpu_milli != 1000:
            fail("more than one device is whole devices: gpuMilli 1000", "gpuMilli")
        return self


class GPUDeviceArgs(PluginArgs):
    """Args of GPUDevice (`shardsched.plugins.gpudevice`, docs/gpu.md).

    Attributes:
        scoring_strategy: ``FGD`` (default), ``FGDBestFit``, ``FGDPlus`` (the one recommended),
            ``BestFit``, ``Packing``, ``DotProd`` or ``Random``.
        typical_pods: the workload the FGD strategies measure fragmentation against; empty: the
            shapes of the pods the plugin scores, learned as they come.
    """

    scoring_strategy: Literal["FGD", "FGDBestFit", "FGDPlus", "BestFit", "Packing", "DotProd", "Random"] = "FGD"
    typical_pods: list[TypicalPodSpec] = Field(default_factory=list)


class CoschedulingArgs(PluginArgs):
    """Args of Coscheduling (scheduler-plugins' ``CoschedulingArgs``, v0.34; `shardsched.plugins.coscheduling`).

    Attributes:
        permit_waiting_time_seconds: how long a member of a PodGroup without
            ``scheduleTimeoutSeconds`` waits at Permit for its siblings, >= 0; default 60.
        pod_group_backoff_seconds: how long a group that could not be placed whole (with at least
            ``minMember`` pods) is left alone before it is tried again, >= 0; default 0 (no such
            backoff: the queue's backoff alone), as upstream's.
    """

    permit_waiting_time_seconds: int = Field(60, ge=0)
    pod_group_backoff_seconds: int = Field(0, ge=0)


class VolumeBindingArgs(PluginArgs):
    """Args of VolumeBinding (upstream ``VolumeBindingArgs``, validated as ``ValidateVolumeBindingArgs``).

    Attributes:
        bind_timeout_seconds: how long PreBind waits for the claims to be bound, seconds, >= 0;
            default 600.
        shape: the score function's points (utilization in [0, 100], increasing -> score in [0, 10]);
            read by upstream's Score only behind the VolumeCapacityPriority feature gate (off by
            default), so validated and kept, not scored with.
    """

    bind_timeout_seconds: int = Field(600, ge=0)
    shape: list[UtilizationShapePoint] = Field(default_factory=list)

    @field_validator("shape")
    @classmethod
    def _check_shape(cls, shape: list[UtilizationShapePoint]) -> list[UtilizationShapePoint]:
        for i in range(1, len(shape)):
            if shape[i - 1].utilization >= shape[i].utilization:
                fail("values must be sorted in increasing order", i, "utilization")
        return shape


#: Plugins that have an args type; every other supported plugin takes `NoArgs`.
ARGS_TYPES: dict[str, type[PluginArgs]] = {
    "InterPodAffinity": InterPodAffinityArgs,
    "PodTopologySpread": PodTopologySpreadArgs,
    "NodeResourcesFit": NodeResourcesFitArgs,
    "NodeResourcesBalancedAllocation": NodeResourcesBalancedAllocationArgs,
    "NodeAffinity": NodeAffinityArgs,
    "NodeLabel": NodeLabelArgs,
    "DefaultPreemption": DefaultPreemptionArgs,
    "GPUDevice": GPUDeviceArgs,
    "Coscheduling": CoschedulingArgs,
    "VolumeBinding": VolumeBindingArgs,
}


def validate_plugin_args(name: str, args: Any, loc: Loc = ("args",)) -> tuple[PluginArgs | None, list[tuple[str, str]]]:
    """Default and validate the args of plugin ``name`` (one of `SUPPORTED_PLUGINS`).

    Args:
        args: the ``args`` mapping as written (camelCase keys), or None for the defaults.
        loc: where the args are, for error paths.

    Returns:
        (args or None, errors as (field path, message) pairs); args is None when errors is not empty.
    """
    args_type = ARGS_TYPES.get(name, NoArgs)
    if args is None:
        return args_type(), []
    if not isinstance(args, Mapping):
        return None, [(render_path(loc), f"must be an object ({name}Args), got {type(args).__name__}")]
    errors = []
    kind = args.get("kind")
    if kind is not None and kind != f"{name}Args":
        errors.append((render_path(loc + ("kind",)), f"must be {name}Args (args of plugin {name}), got {kind!r}"))
    version = args.get("apiVersion")
    if version is not None and version not in (API_VERSION, *DEPRECATED_API_VERSIONS):
        errors.append((render_path(loc + ("apiVersion",)), f"must be {API_VERSION}, got {version!r}"))
    try:
        parsed = args_type.model_validate(dict(args), by_name=False)
    except ValidationError as exc:
        return None, errors + error_lines(exc, loc, args_type)
    return (None, errors) if errors else (parsed, [])


def parse_plugin_args(name: str, args: Any = None) -> PluginArgs:
    """`validate_plugin_args` for callers outside a config file (plugin factories, tests).

    Raises:
        ConfigError: ``name`` is not a supported plugin, or the args are invalid (the message names
            each field path under ``args``).
    """
    if name not in SUPPORTED_PLUGINS:
        raise ConfigError(unsupported_plugin_message(name))
    parsed, errors = validate_plugin_args(name, args)
    if errors:
        raise ConfigError("\n".join(f"{path}: {message}" for path, message in errors))
    assert parsed is not None
    return parsed
