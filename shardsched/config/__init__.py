"""Scheduler configuration: kube-scheduler's ``KubeSchedulerConfiguration`` (``kubescheduler.config.k8s.io/v1``).

`load_config` reads a file (or nothing: kube's defaults) into a `SchedulerConfiguration` whose
profiles have their plugin lists fully resolved (defaults merged, ``disabled`` applied,
``multiPoint`` expanded, score weights set) and their plugin args defaulted and validated. Every
problem raises `shardsched.errors.ConfigError` naming the file and the YAML field path.

Modules: `registry` (plugin names, points, defaults), `merge` (upstream's merge and expansion
rules), `args` (plugin args types), `schema` (the file's fields), `types` (the result),
`loader` (reading and checking).
"""

from shardsched.config.args import (
    ARGS_TYPES, NoArgs, NodeAffinityArgs, NodeResourcesBalancedAllocationArgs, NodeResourcesFitArgs,
    PluginArgs, RequestedToCapacityRatioParam, ResourceSpec, ScoringStrategy, UtilizationShapePoint,
    parse_plugin_args,
)
from shardsched.config.loader import load_config, parse_config
from shardsched.config.registry import (
    API_VERSION, DEFAULT_SCHEDULER_NAME, EXTENSION_POINTS, PLUGIN_POINTS, SUPPORTED_PLUGINS,
    UNIMPLEMENTED_PLUGINS, PluginRef,
)
from shardsched.config.schema import ClientConnection, LeaderElection
from shardsched.config.types import Profile, SchedulerConfiguration

__all__ = [
    "API_VERSION", "ARGS_TYPES", "DEFAULT_SCHEDULER_NAME", "EXTENSION_POINTS", "PLUGIN_POINTS",
    "SUPPORTED_PLUGINS", "UNIMPLEMENTED_PLUGINS",
    "ClientConnection", "LeaderElection", "NoArgs", "NodeAffinityArgs",
    "NodeResourcesBalancedAllocationArgs", "NodeResourcesFitArgs", "PluginArgs", "PluginRef",
    "Profile", "RequestedToCapacityRatioParam", "ResourceSpec", "SchedulerConfiguration",
    "ScoringStrategy", "UtilizationShapePoint",
    "load_config", "parse_config", "parse_plugin_args",
]
