"""Plugin names, the extension points each implements, and the default plugin set.

Names are kube-scheduler's, exactly. The defaults are kube-scheduler v1.28's
(``getDefaultPlugins`` in pkg/scheduler/apis/config/v1/default_plugins.go) restricted to the plugins
shardsched implements: one ``multiPoint`` list, in upstream order and with upstream weights, that the
framework expands to every extension point each plugin implements (see `shardsched.config.merge`).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardsched.config.base import did_you_mean

API_GROUP = "kubescheduler.config.k8s.io"
API_VERSION = f"{API_GROUP}/v1"
#: Removed from kube-scheduler in v1.29; its schema is v1's for every field shardsched reads.
DEPRECATED_API_VERSIONS = (f"{API_GROUP}/v1beta3",)
KIND = "KubeSchedulerConfiguration"
DEFAULT_SCHEDULER_NAME = "default-scheduler"

MULTI_POINT = "multiPoint"
#: Extension points in the YAML spelling, in the order of a scheduling then a binding cycle.
EXTENSION_POINTS = (
    "preEnqueue", "queueSort", "preFilter", "filter", "postFilter", "preScore", "score",
    "reserve", "permit", "preBind", "bind", "postBind",
)
SCORE = "score"

#: Which extension points each supported plugin implements (as the Go types of kube v1.28 do).
PLUGIN_POINTS: dict[str, tuple[str, ...]] = {
    "SchedulingGates": ("preEnqueue",),
    "PrioritySort": ("queueSort",),
    "NodeUnschedulable": ("filter",),
    "NodeName": ("filter",),
    "TaintToleration": ("filter", "preScore", "score"),
    "NodeAffinity": ("preFilter", "filter", "preScore", "score"),
    "NodePorts": ("preFilter", "filter"),
    "NodeResourcesFit": ("preFilter", "filter", "preScore", "score"),
    "VolumeRestrictions": ("preFilter", "filter"),
    "NodeVolumeLimits": ("preFilter", "filter"),
    # upstream's type has preScore and score too; they score only behind a feature gate that is off
    # by default (VolumeCapacityPriority), and shardsched's VolumeBinding does not score
    "VolumeBinding": ("preFilter", "filter", "reserve", "preBind", "preScore", "score"),
    "VolumeZone": ("preFilter", "filter"),
    "PodTopologySpread": ("preFilter", "filter", "preScore", "score"),
    "InterPodAffinity": ("preFilter", "filter", "preScore", "score"),
    "DefaultPreemption": ("postFilter",),
    "NodeResourcesBalancedAllocation": ("preScore", "score"),
    "DefaultBinder": ("bind",),
    # kube v1.22's, removed upstream in v1.23: the worked example of docs/plugins.md, not in the defaults
    "NodeLabel": ("filter", "score"),
    # shardsched's own: per-device GPU fit and fragmentation-aware scores (docs/gpu.md), not in the defaults
    "GPUDevice": ("preFilter", "filter", "preScore", "score"),
    # scheduler-plugins' (v0.34), not in the defaults: gangs (docs/gangs.md); upstream's PostFilter is not
    # implemented
    "Coscheduling": ("queueSort", "preFilter", "reserve", "permit"),
}
SUPPORTED_PLUGINS = tuple(PLUGIN_POINTS)


#: kube-scheduler plugins shardsched does not implement: harmless in ``disabled`` lists (kube's
#: defaults enable them, so real configs disable them), an error anywhere else.
UNIMPLEMENTED_PLUGINS = frozenset({
    "ImageLocality", "EBSLimits", "GCEPDLimits", "AzureDiskLimits", "DynamicResources",
})

#: Plugins of kube's default set (v1.28's, and DynamicResources of v1.34's) that shardsched does not
#: implement but whose hard constraints it keeps, and the extension points of their Go types. While
#: a profile leaves one enabled at ``filter`` (kube's default does), a pod that needs it (an inline
#: disk, a volume to bind, a resource claim) is rejected as UnschedulableAndUnresolvable by a
#: stand-in PreFilter (`shardsched.plugins.unimplemented`) rather
#: than placed in breach. A profile that disables it (by name or ``"*"``, at ``multiPoint`` or
#: ``filter``) schedules such pods without the constraint, as kube-scheduler does then.
GUARDED_PLUGIN_POINTS: dict[str, tuple[str, ...]] = {
    # in kube's default set since v1.34 (Dynamic Resource Allocation on by default), appended last
    "DynamicResources": ("preEnqueue", "preFilter", "filter", "postFilter", "reserve", "preBind"),
}


@dataclass(frozen=True, slots=True)
class PluginRef:
    """One plugin at one extension point.

    Attributes:
        name: the plugin's kube name.
        weight: Score weight (>= 1) at the ``score`` point of a resolved profile; 0 elsewhere. In a
            not yet resolved plugin set, 0 means "not given" (a nil weight upstream).
    """

    name: str
    weight: int = 0


#: kube v1.28's default ``multiPoint`` list, restricted to the supported plugins.
DEFAULT_MULTI_POINT: tuple[PluginRef, ...] = (
    PluginRef("SchedulingGates"),
    PluginRef("PrioritySort"),
    PluginRef("NodeUnschedulable"),
    PluginRef("NodeName"),
    PluginRef("TaintToleration", 3),
    PluginRef("NodeAffinity", 2),
    PluginRef("NodePorts"),
    PluginRef("NodeResourcesFit", 1),
    PluginRef("VolumeRestrictions"),
    PluginRef("NodeVolumeLimits"),
    PluginRef("VolumeBinding"),
    PluginRef("VolumeZone"),
    PluginRef("PodTopologySpread", 2),
    PluginRef("InterPodAffinity", 2),
    PluginRef("DefaultPreemption"),
    PluginRef("NodeResourcesBalancedAllocation", 1),
    PluginRef("DefaultBinder"),
)


def unsupported_plugin_message(name: str) -> str:
    """Why ``name`` cannot be enabled or configured, with the supported names (and a near miss)."""
    supported = ", ".join(SUPPORTED_PLUGINS)
    if name in UNIMPLEMENTED_PLUGINS:
        return (f"shardsched does not implement kube-scheduler's {name} plugin (it may only be "
                f"disabled); supported plugins: {supported}")
    return f"unknown plugin {name!r}{did_you_mean(name, SUPPORTED_PLUGINS)}; supported plugins: {supported}"
