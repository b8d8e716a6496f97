"""Framework: the plugins of one profile, instantiated and ordered per extension point.

Built from a resolved profile (``shardsched.config.Profile``) and a `Registry` of plugin factories:
the profile's ``plugins`` map gives, per extension point, the enabled plugins in order with their
score weights, and ``plugin_args`` the validated args. One plugin instance is shared by all the
points it is enabled at, as upstream. The framework knows no concrete plugin: whoever builds it
passes the registry (the in-tree one is `shardsched.plugins.registry.IN_TREE`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardsched.api.objects import PodInfo
from shardsched.errors import ConfigError, InvalidObjectError
from shardsched.framework.interface import (BindPlugin, FilterPlugin, Handle, PermitPlugin, Plugin, PostBindPlugin,
                                            PostFilterPlugin, PreBindPlugin, PreEnqueuePlugin, PreFilterPlugin,
                                            QueueSortPlugin, ReservePlugin, ScorePlugin)
from shardsched.framework.status import Status


@dataclass(frozen=True)
class Registry:
    """The plugins a Framework can instantiate, by name (kube's ``frameworkruntime.Registry``).

    Attributes:
        factories: plugin name -> factory. A factory takes the plugin's validated args (from the
            profile's pluginConfig, or None for defaults) and returns the plugin; the factories of
            the ``cluster_wide`` plugins take ``(args, partial_view)``, those of the
            ``with_handle`` plugins ``(args, handle)``, those in both ``(args, partial_view, handle)``.
        cluster_wide: plugins that need every node of the cluster and its pods (see `Framework`'s
            ``partial_view``).
        with_handle: plugins whose factories take the framework's `Handle`, as upstream factories
            take ``framework.Handle``.
        stand_ins: plugin name -> factory of the PreFilter stand-in of a plugin that is not
            implemented, for the profile's ``guarded_plugins``.
    """

    factories: Mapping[str, Callable[..., Plugin]]
    cluster_wide: frozenset[str] = frozenset()
    with_handle: frozenset[str] = frozenset()
    stand_ins: Mapping[str, Callable[[], PreFilterPlugin]] = field(default_factory=dict)


@dataclass(frozen=True)
class WeightedScore:
    plugin: ScorePlugin
    weight: int


class Framework:
    """The plugins of one profile (kube's ``frameworkImpl``).

    Attributes:
        pre_enqueue_plugins: PreEnqueue plugins in profile order (`run_pre_enqueue_plugins`).
        filter_plugins: Filter plugins in profile order (their PreFilter runs when enabled at preFilter
            or, for plugins whose Filter needs it, always: shardsched's plugins compute per-pod data there).
        pre_filter_plugins: the PreFilter of every Filter plugin, then the stand-ins of the profile's
            ``guarded_plugins`` (``Registry.stand_ins``), in kube's order; the scheduler
            runs them in this order and stops at the first rejection.
        state_pre_filter_plugins: PreFilter plugins enabled at ``preFilter`` that have no Filter
            (Coscheduling): their answer depends on more than the pod's spec and the nodes (a
            gang's members), so the scheduler runs them at every attempt, before its cached
            decision, and a rejection rejects the pod on every node.
        post_filter_plugins: PostFilter plugins in profile order (DefaultPreemption).
        score_plugins: Score plugins with weights.
        reserve_plugins, permit_plugins, pre_bind_plugins, bind_plugins, post_bind_plugins: the
            binding-cycle plugins in profile order (`shardsched.framework.binding_cycle` runs them).
        percentage_of_nodes_to_score: None = score every feasible node; 0 = kube's adaptive rule;
            1..100 = that percentage (kube's ``percentageOfNodesToScore``).

    ``partial_view``: the table this framework schedules over holds only some of the cluster's
    nodes (a shard's); the plugins that need the whole cluster (``Registry.cluster_wide``) then
    refuse the pods they cannot decide from it (see their docstrings).

    ``handle``: what plugins reach of the framework (`Handle`: the cluster client, the pods waiting
    at Permit), given to the factories of the plugins that take it (``Registry.with_handle``); by
    default one without a client (nothing is bound: ``simulate``, the benchmarks of decisions).

    Raises:
        ConfigError: the profile enables a plugin the registry does not have, a factory rejects the
            plugin's args, or the profile has no queueSort plugin.
    """

    def __init__(self, profile: Any, registry: Registry, global_percentage: int | None = None,
                 partial_view: bool = False, handle: Handle | None = None) -> None:
        self.profile_name: str = profile.scheduler_name
        self.registry = registry
        self.handle = handle or Handle()
        instances: dict[str, Plugin] = {}

        def get(name: str) -> Plugin:
            if name not in instances:
                factory = registry.factories.get(name)
                if factory is None:
                    raise ConfigError(f"profile {self.profile_name!r}: plugin {name!r} is not supported; "
                                      f"supported plugins: {', '.join(sorted(registry.factories))}")
                try:
                    args = profile.plugin_args.get(name)
                    if name in registry.cluster_wide and name in registry.with_handle:
                        instances[name] = factory(args, partial_view, self.handle)
                    elif name in registry.cluster_wide:
                        instances[name] = factory(args, partial_view)
                    elif name in registry.with_handle:
                        instances[name] = factory(args, self.handle)
                    else:
                        instances[name] = factory(args)
                except InvalidObjectError as e:
                    raise ConfigError(f"profile {self.profile_name!r}: pluginConfig {name}: {e}") from None
            return instances[name]

        points = profile.plugins
        self.pre_enqueue_plugins: list[PreEnqueuePlugin] = [
            p for p in (get(r.name) for r in points.get("preEnqueue", ())) if isinstance(p, PreEnqueuePlugin)]
        queue_sort = next(
            (p for p in (get(r.name) for r in points.get("queueSort", ())) if isinstance(p, QueueSortPlugin)), None)
        if queue_sort is None:
            raise ConfigError(f"profile {self.profile_name!r}: exactly one queueSort plugin is required")
        #: the QueueSort plugin; its ``sort_key`` orders the scheduling queue's activeQ
        self.queue_sort: QueueSortPlugin = queue_sort
        self.filter_plugins: list[FilterPlugin] = [
            p for p in (get(r.name) for r in points.get("filter", ())) if isinstance(p, FilterPlugin)]
        self.pre_filter_plugins: list[PreFilterPlugin] = [
            *self.filter_plugins, *(registry.stand_ins[name]() for name in profile.guarded_plugins)]
        self.state_pre_filter_plugins: list[PreFilterPlugin] = [
            p for p in (get(r.name) for r in points.get("preFilter", ()))
            if isinstance(p, PreFilterPlugin) and not isinstance(p, FilterPlugin)]
        self.post_filter_plugins: list[PostFilterPlugin] = [
            p for p in (get(r.name) for r in points.get("postFilter", ())) if isinstance(p, PostFilterPlugin)]
        self.score_plugins: list[WeightedScore] = [
            WeightedScore(p, int(r.weight or 1)) for r, p in ((r, get(r.name)) for r in points.get("score", ()))
            if isinstance(p, ScorePlugin)]
        at = lambda point, kind: [p for p in (get(r.name) for r in points.get(point, ())) if isinstance(p, kind)]  # noqa: E731
        self.reserve_plugins: list[ReservePlugin] = at("reserve", ReservePlugin)
        self.permit_plugins: list[PermitPlugin] = at("permit", PermitPlugin)
        self.pre_bind_plugins: list[PreBindPlugin] = at("preBind", PreBindPlugin)
        self.bind_plugins: list[BindPlugin] = at("bind", BindPlugin)
        self.post_bind_plugins: list[PostBindPlugin] = at("postBind", PostBindPlugin)
        pct = getattr(profile, "percentage_of_nodes_to_score", None)
        self.percentage_of_nodes_to_score: int | None = pct if pct is not None else global_percentage
        self.plugins = instances

    def run_pre_enqueue_plugins(self, pod: PodInfo) -> Status:
        """Whether ``pod`` may enter the scheduling queue (upstream ``RunPreEnqueuePlugins``):
        Success, or the first plugin's rejection with that plugin's name in ``Status.plugin``."""
        for p in self.pre_enqueue_plugins:
            st = p.pre_enqueue(pod)
            if not st.is_success():
                return Status(st.code, st.reasons, p.name)
        return Status.success()

    def needs_cluster_view(self, pod: PodInfo) -> bool:
        """Whether an enabled Filter plugin needs the whole cluster to decide this pod (InterPodAffinity's
        required affinity and wide anti-affinity, PodTopologySpread's DoNotSchedule constraints):
        in the sharded runtime the coordinator then nominates its node (``PodInfo.nominated_node_name``)."""
        return any(bool(p.needs_cluster_view(pod)) for p in self.filter_plugins
                   if p.name in self.registry.cluster_wide)

    @property
    def packs(self) -> bool:
        """Whether the profile's scoring packs pods: a Score plugin of positive weight whose
        ``ScorePlugin.packs`` is true."""
        return any(w.weight > 0 and w.plugin.packs for w in self.score_plugins)
