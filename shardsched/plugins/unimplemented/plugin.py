"""Stand-ins for kube's default Filter plugins that shardsched does not implement.

VolumeRestrictions, NodeVolumeLimits, VolumeBinding (with VolumeZone, which reads the same
claims) and DynamicResources are in kube-scheduler's default profile (DynamicResources since
v1.34, where Dynamic Resource Allocation is on by default); shardsched does not evaluate their
constraints, and placing a pod that has one would break it silently. While a profile leaves
such a plugin enabled (`shardsched.config.types.Profile.guarded_plugins`), its stand-in's
PreFilter rejects the pods that need it as UnschedulableAndUnresolvable with a message saying
what is not supported; the pod stays pending (for another scheduler, or an operator) and is
reported in the ``0/N nodes are available`` message.
Pods without such a constraint are not affected (Skip). The check is per pod: its result is cached
with the pod's signature, which includes every field read here.
"""

from __future__ import annotations

from typing import Callable

from shardsched.api.objects import DISK_VOLUME_SOURCES, PodInfo
from shardsched.cache.node_table import NodeTable
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import PreFilterPlugin
from shardsched.framework.status import Status

VOLUME_RESTRICTIONS = "VolumeRestrictions"
NODE_VOLUME_LIMITS = "NodeVolumeLimits"
VOLUME_BINDING = "VolumeBinding"
DYNAMIC_RESOURCES = "DynamicResources"


def _disk_volumes(plugin: str) -> Callable[[PodInfo], str | None]:
    """What needs ``plugin`` among the pod's inline volumes (`DISK_VOLUME_SOURCES`)."""
    def needs(pod: PodInfo) -> str | None:
        names = [f"{name}: {source}" for name, source in pod.disk_volumes if DISK_VOLUME_SOURCES[source] == plugin]
        if not names:
            return None
        check = "conflict checks" if plugin == VOLUME_RESTRICTIONS else "attach limits"
        return f"volumes that need {check} ({', '.join(names)})"
    return needs


def _volumes(pod: PodInfo) -> str | None:
    if not pod.claim_volumes:
        return None
    return f"volumes that need volume binding ({', '.join(pod.claim_volumes)})"


def _claims(pod: PodInfo) -> str | None:
    if not pod.resource_claims:
        return None
    return f"resource claims of Dynamic Resource Allocation ({', '.join(pod.resource_claims)})"


#: plugin name -> what of a pod needs it (None: nothing), in kube's default order
_NEEDS: dict[str, Callable[[PodInfo], str | None]] = {
    VOLUME_RESTRICTIONS: _disk_volumes(VOLUME_RESTRICTIONS),
    NODE_VOLUME_LIMITS: _disk_volumes(NODE_VOLUME_LIMITS),
    VOLUME_BINDING: _volumes,
    DYNAMIC_RESOURCES: _claims,
}
NAMES = tuple(_NEEDS)


def message(plugin: str, what: str) -> str:
    """The rejection reason: ``pod has <what>, which shardsched does not implement (plugin <plugin>)``."""
    return f"pod has {what}, which shardsched does not implement (plugin {plugin})"


class Unimplemented(PreFilterPlugin):
    """The stand-in of one plugin of `NAMES` (module docstring); PreFilter only."""

    def __init__(self, name: str) -> None:
        self.name = name  # type: ignore[misc]  # per instance: one class stands in for several plugins
        self._needs = _NEEDS[name]

    def pre_filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        what = self._needs(pod)
        if what is None:
            return Status.skip()
        return Status.unschedulable(message(self.name, what), plugin=self.name, resolvable=False)


def new(name: str) -> Unimplemented:
    """The stand-in of plugin ``name``.

    Raises:
        KeyError: ``name`` is not one of `NAMES`.
    """
    return Unimplemented(name)
