"""The resolved configuration the scheduler runs with: defaults filled, plugin lists merged."""

from __future__ import annotations

from dataclasses import dataclass, field

from shardsched.config.args import PluginArgs
from shardsched.config.registry import EXTENSION_POINTS, SCORE, PluginRef
from shardsched.config.schema import ClientConnection, LeaderElection

#: the plugins that read the cluster's storage objects (`SchedulerConfiguration.watches_storage`)
VOLUME_PLUGINS = ("VolumeRestrictions", "NodeVolumeLimits", "VolumeBinding", "VolumeZone")


@dataclass(frozen=True)
class Profile:
    """One scheduling profile (kube's ``KubeSchedulerProfile`` after defaulting and plugin expansion).

    Attributes:
        scheduler_name: pods whose ``spec.schedulerName`` equals it are scheduled with this profile.
        plugins: extension point (``queueSort``, ``preFilter``, ``filter``, ``preScore``, ``score``,
            ``bind``, ...) -> plugins in the order they run. Only points with at least one plugin are
            present; use `enabled` to read any point. Every profile has exactly one queueSort plugin
            and at least one bind plugin.
        plugin_args: args of the plugins that have an args type (NodeResourcesFit,
            NodeResourcesBalancedAllocation, NodeAffinity): the ``pluginConfig`` entry, defaulted
            and validated, or the defaults for an enabled plugin without one.
        percentage_of_nodes_to_score: this profile's value if it sets one, else the
            configuration's: None (unset) = every feasible node is scored (shardsched's default:
            vectorized scoring costs less than kube's search cut-off and places better); 0 = kube's
            adaptive rule (50% minus 1% per 125 nodes, at least 5%); 1..100 = that percentage.
        guarded_plugins: kube's default Filter plugins that shardsched does not implement and this
            profile leaves enabled (`shardsched.config.registry.GUARDED_PLUGIN_POINTS`, in kube's
            order): a pod that needs one is rejected as UnschedulableAndUnresolvable, never placed
            in breach of its constraint.
    """

    scheduler_name: str
    plugins: dict[str, list[PluginRef]]
    plugin_args: dict[str, PluginArgs]
    percentage_of_nodes_to_score: int | None
    guarded_plugins: tuple[str, ...]

    def enabled(self, point: str) -> list[PluginRef]:
        """The plugins at extension ``point``, in order (empty if none).

        Raises:
            KeyError: ``point`` is not an extension point name (YAML spelling: ``preFilter``).
        """
        if point not in EXTENSION_POINTS:
            raise KeyError(f"{point!r} is not an extension point ({', '.join(EXTENSION_POINTS)})")
        return self.plugins.get(point, [])

    def score_weight(self, name: str) -> int:
        """Score weight of plugin ``name`` in this profile (>= 1), or 0 if it is not a Score plugin here."""
        return next((p.weight for p in self.plugins.get(SCORE, ()) if p.name == name), 0)


@dataclass(frozen=True)
class SchedulerConfiguration:
    """A whole scheduler configuration (kube's ``KubeSchedulerConfiguration`` after defaulting).

    Built by `shardsched.config.load_config`; the defaults live in `shardsched.config.schema`.

    Attributes:
        profiles: at least one; scheduler names are unique.
        percentage_of_nodes_to_score: None (unset: score every feasible node), 0 (kube's adaptive
            rule) or 1..100; each profile carries the value that applies to it.
        pod_initial_backoff_s / pod_max_backoff_s: backoffQ backoff, doubling from the initial to
            the max (defaults 1 and 10, as kube).
        pod_max_in_unschedulable_s: longest stay among unschedulable pods before a retry (default
            300, kube's ``--pod-max-in-unschedulable-pods-duration``).
        max_scheduling_attempts: failed attempts before a pod is given up on (default 5).
        parallelism: kube's ``parallelism`` (default 16); accepted, workers are the shards' affair.
        client_connection / leader_election: accepted and exposed, not interpreted here.
        api_version: the file's ``apiVersion``.
        source: where the configuration came from (a file path, ``<string>``, ``<defaults>``).
    """

    profiles: list[Profile]
    percentage_of_nodes_to_score: int | None
    pod_initial_backoff_s: float
    pod_max_backoff_s: float
    pod_max_in_unschedulable_s: float
    max_scheduling_attempts: int
    parallelism: int
    client_connection: ClientConnection
    leader_election: LeaderElection
    api_version: str
    source: str = field(default="", compare=False)

    def enables(self, plugin: str) -> bool:
        """Whether some profile enables ``plugin`` at some extension point (``Coscheduling``: the
        PodGroups must be watched)."""
        return any(r.name == plugin for p in self.profiles for refs in p.plugins.values() for r in refs)

    def watches_storage(self) -> bool:
        """Whether some profile enables a volume plugin (`VOLUME_PLUGINS`): the cluster's storage
        objects must then be watched (`shardsched.kube.cluster.KubeCluster`'s ``watch_storage``)."""
        return any(self.enables(name) for name in VOLUME_PLUGINS)

    def profile_for(self, scheduler_name: str) -> Profile | None:
        """The profile of ``scheduler_name`` (a pod's ``spec.schedulerName``), or None: not our pod."""
        return next((p for p in self.profiles if p.scheduler_name == scheduler_name), None)
