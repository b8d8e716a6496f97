"""How a profile's ``plugins`` section turns into the plugin list of every extension point.

Three upstream rules, applied in this order:

1. ``mergePluginSet`` (pkg/scheduler/apis/config/v1/default_plugins.go): a custom set is merged
   into the default set of the same point. Defaults named in ``disabled`` are dropped (all of them
   for ``"*"``); a default that is also in the custom ``enabled`` list is replaced in place (order
   kept, custom weight); the other custom plugins are appended. In v1 every default is in
   ``multiPoint``, so at the other points the merge result is the custom set itself.
2. ``expandMultiPointPlugins`` (pkg/scheduler/framework/runtime/framework.go): each ``multiPoint``
   plugin joins every point it implements, unless that point disables it or ``"*"``. A plugin also
   listed at the point itself is an explicit override. Order at a point: overrides (in the point's
   order), then the other ``multiPoint`` plugins, then the point's remaining plugins.
3. ``getScoreWeights`` (same file): a score weight comes from the ``score`` list if the plugin is
   there, else from ``multiPoint``; a weight of 0 (not given) counts as 1.

Callers validate names first (`shardsched.config.loader`): every enabled name is supported, an
enabled plugin implements the point it is listed at, and no list enables a plugin twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from shardsched.config.registry import (
    DEFAULT_MULTI_POINT, EXTENSION_POINTS, GUARDED_PLUGIN_POINTS, MULTI_POINT, PLUGIN_POINTS, SCORE, PluginRef,
)

FILTER = "filter"


@dataclass(frozen=True, slots=True)
class PluginSet:
    """The ``enabled`` and ``disabled`` lists of one extension point (weight 0 = not given)."""

    enabled: tuple[PluginRef, ...] = ()
    disabled: tuple[str, ...] = ()


def merge_plugin_set(default: PluginSet, custom: PluginSet) -> PluginSet:
    """Merge ``custom`` into ``default``, as upstream ``mergePluginSet``.

    Returns the merged set; its ``disabled`` list keeps the custom names, which the ``multiPoint``
    expansion reads.
    """
    disabled = custom.disabled + default.disabled
    custom_at = {p.name: i for i, p in enumerate(custom.enabled)}
    replaced: set[int] = set()
    enabled: list[PluginRef] = []
    if "*" not in disabled:
        for plugin in default.enabled:
            if plugin.name in disabled:
                continue
            i = custom_at.get(plugin.name)
            if i is not None:
                plugin = custom.enabled[i]
                replaced.add(i)
            enabled.append(plugin)
    enabled += [p for i, p in enumerate(custom.enabled) if i not in replaced]
    return PluginSet(tuple(enabled), disabled)


def expand_point(point: str, point_set: PluginSet, multi_point: tuple[PluginRef, ...],
                 plugin_points: Mapping[str, tuple[str, ...]] = PLUGIN_POINTS) -> list[str]:
    """Plugin names at ``point``, in order, as upstream ``expandMultiPointPlugins``;
    ``plugin_points`` gives the points each ``multi_point`` plugin implements."""
    explicit = [p.name for p in point_set.enabled]
    if "*" in point_set.disabled:
        return explicit
    overrides: set[str] = set()
    from_multi: list[str] = []
    for plugin in multi_point:
        if point not in plugin_points[plugin.name] or plugin.name in point_set.disabled:
            continue
        if plugin.name in explicit:
            overrides.add(plugin.name)
        else:
            from_multi.append(plugin.name)
    return ([n for n in explicit if n in overrides] + from_multi
            + [n for n in explicit if n not in overrides])


def score_weights(score: tuple[PluginRef, ...], multi_point: tuple[PluginRef, ...]) -> dict[str, int]:
    """Weight of every Score plugin named in ``score`` or ``multiPoint``, as upstream ``getScoreWeights``."""
    weights: dict[str, int] = {}
    for plugin in score + multi_point:
        if SCORE in PLUGIN_POINTS[plugin.name] and plugin.name not in weights:
            weights[plugin.name] = plugin.weight or 1
    return weights


def resolve_plugins(custom: Mapping[str, PluginSet]) -> dict[str, list[PluginRef]]:
    """The plugins of every extension point of a profile, defaults merged and ``multiPoint`` expanded.

    Args:
        custom: the profile's sets by point name (``multiPoint`` included); a missing point is empty.

    Returns:
        point -> plugins in the order they run; only points with at least one plugin are present.
        Score plugins carry their weight, the others weight 0.
    """
    empty = PluginSet()
    multi_point = merge_plugin_set(PluginSet(DEFAULT_MULTI_POINT), custom.get(MULTI_POINT, empty)).enabled
    out: dict[str, list[PluginRef]] = {}
    for point in EXTENSION_POINTS:
        point_set = custom.get(point, empty)
        names = expand_point(point, point_set, multi_point)
        if names:
            weights = score_weights(point_set.enabled, multi_point) if point == SCORE else {}
            out[point] = [PluginRef(n, weights.get(n, 0)) for n in names]
    return out


def guarded_plugins(custom: Mapping[str, PluginSet]) -> tuple[str, ...]:
    """The plugins of `GUARDED_PLUGIN_POINTS` that a profile leaves enabled at ``filter``, in
    kube's default order: the same merge and expansion as `resolve_plugins`, over kube's defaults
    that shardsched does not implement (so ``disabled`` by name or ``"*"`` at ``multiPoint`` or
    ``filter`` turns one off).

    Args:
        custom: the profile's sets by point name, as for `resolve_plugins`.
    """
    empty = PluginSet()
    defaults = PluginSet(tuple(PluginRef(name) for name in GUARDED_PLUGIN_POINTS))
    multi_point = merge_plugin_set(defaults, custom.get(MULTI_POINT, empty)).enabled
    at_filter = expand_point(FILTER, custom.get(FILTER, empty), multi_point,
                             {**PLUGIN_POINTS, **GUARDED_PLUGIN_POINTS})
    return tuple(name for name in at_filter if name in GUARDED_PLUGIN_POINTS)
