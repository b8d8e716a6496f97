"""The in-tree plugin registry: name -> factory, and the extension points each plugin implements.

Mirrors kube-scheduler's ``frameworkplugins.NewInTreeRegistry`` for the plugins shardsched has.
A factory takes the plugin's validated args (from the profile's pluginConfig, or None for
defaults) and returns a plugin instance. `IN_TREE` is the `Registry` that the scheduler gives
each Framework it builds.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from shardsched.framework.interface import Plugin
from shardsched.framework.runtime import Registry
from shardsched.plugins.coscheduling import plugin as coscheduling
from shardsched.plugins.defaultbinder import plugin as defaultbinder
from shardsched.plugins.defaultpreemption import plugin as defaultpreemption
from shardsched.plugins.gpudevice import plugin as gpudevice
from shardsched.plugins.interpodaffinity import plugin as interpodaffinity
from shardsched.plugins.nodeaffinity import plugin as nodeaffinity
from shardsched.plugins.nodelabel import plugin as nodelabel
from shardsched.plugins.nodename import plugin as nodename
from shardsched.plugins.nodeports import plugin as nodeports
from shardsched.plugins.noderesources import balanced_allocation, fit
from shardsched.plugins.nodeunschedulable import plugin as nodeunschedulable
from shardsched.plugins.podtopologyspread import plugin as podtopologyspread
from shardsched.plugins.queuesort import plugin as queuesort
from shardsched.plugins.schedulinggates import plugin as schedulinggates
from shardsched.plugins.tainttoleration import plugin as tainttoleration
from shardsched.plugins.nodevolumelimits import plugin as nodevolumelimits
from shardsched.plugins.unimplemented import plugin as unimplemented
from shardsched.plugins.volumebinding import plugin as volumebinding
from shardsched.plugins.volumerestrictions import plugin as volumerestrictions
from shardsched.plugins.volumezone import plugin as volumezone

Factory = Callable[[Any], Plugin]

REGISTRY: dict[str, Factory] = {
    schedulinggates.NAME: schedulinggates.new,
    queuesort.NAME: queuesort.new,
    nodeunschedulable.NAME: nodeunschedulable.new,
    nodename.NAME: nodename.new,
    tainttoleration.NAME: tainttoleration.new,
    nodeaffinity.NAME: nodeaffinity.new,
    nodeports.NAME: nodeports.new,
    fit.NAME: fit.new,
    volumerestrictions.NAME: volumerestrictions.new,
    nodevolumelimits.NAME: nodevolumelimits.new,
    volumebinding.NAME: volumebinding.new,
    volumezone.NAME: volumezone.new,
    podtopologyspread.NAME: podtopologyspread.new,
    interpodaffinity.NAME: interpodaffinity.new,
    defaultpreemption.NAME: defaultpreemption.new,
    balanced_allocation.NAME: balanced_allocation.new,
    defaultbinder.NAME: defaultbinder.new,
    nodelabel.NAME: nodelabel.new,
    gpudevice.NAME: gpudevice.new,
    coscheduling.NAME: coscheduling.new,
}

#: plugins whose Filter needs every node of the cluster and its pods (VolumeRestrictions: for a
#: ReadWriteOncePod claim); their factories also take
#: ``partial_view`` (a shard's table holds only its own nodes; see each plugin's docstring)
CLUSTER_WIDE = frozenset({podtopologyspread.NAME, interpodaffinity.NAME, coscheduling.NAME, volumerestrictions.NAME})

#: plugins whose factories also take the framework's `Handle` (the cluster client, the pods waiting
#: at Permit), as upstream factories take ``framework.Handle``
WITH_HANDLE = frozenset({defaultbinder.NAME, coscheduling.NAME, volumebinding.NAME, volumerestrictions.NAME})

#: the in-tree plugins, the stand-ins of the unimplemented ones (`shardsched.plugins.unimplemented`)
IN_TREE = Registry(REGISTRY, CLUSTER_WIDE, WITH_HANDLE,
                   {name: functools.partial(unimplemented.new, name) for name in unimplemented.NAMES})

#: extension points implemented by each plugin (kube's names)
EXTENSION_POINTS: dict[str, tuple[str, ...]] = {
    schedulinggates.NAME: ("preEnqueue",),
    queuesort.NAME: ("queueSort",),
    nodeunschedulable.NAME: ("filter",),
    nodename.NAME: ("filter",),
    tainttoleration.NAME: ("filter", "preScore", "score"),
    nodeaffinity.NAME: ("preFilter", "filter", "preScore", "score"),
    nodeports.NAME: ("preFilter", "filter"),
    fit.NAME: ("preFilter", "filter", "preScore", "score"),
    volumerestrictions.NAME: ("preFilter", "filter"),
    nodevolumelimits.NAME: ("preFilter", "filter"),
    volumebinding.NAME: ("preFilter", "filter", "reserve", "preBind"),
    volumezone.NAME: ("preFilter", "filter"),
    podtopologyspread.NAME: ("preFilter", "filter", "preScore", "score"),
    interpodaffinity.NAME: ("preFilter", "filter", "preScore", "score"),
    defaultpreemption.NAME: ("postFilter",),
    balanced_allocation.NAME: ("preScore", "score"),
    defaultbinder.NAME: ("bind",),
    nodelabel.NAME: ("filter", "score"),
    gpudevice.NAME: ("preFilter", "filter", "preScore", "score"),
    coscheduling.NAME: ("queueSort", "preFilter", "reserve", "permit"),
}
