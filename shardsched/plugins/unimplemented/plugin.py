"""Stand-ins for kube's default Filter plugins that shardsched does not implement.

DynamicResources is in kube-scheduler's default profile since v1.34 (Dynamic Resource Allocation is
on by default there); shardsched does not evaluate its constraints, and placing a pod that has one
would break it silently. (The volume plugins it stood in for are implemented: VolumeRestrictions,
NodeVolumeLimits, VolumeBinding and VolumeZone in `shardsched.plugins`.) While a profile leaves
such a plugin enabled (`shardsched.config.types.Profile.guarded_plugins`), its stand-in's
PreFilter rejects the pods that need it as UnschedulableAndUnresolvable with a message saying
what is not supported; the pod stays pending (for another scheduler, or an operator) and is
reported in the ``0/N nodes are available`` message.
Pods without such a constraint are not affected (Skip). The check is per pod: its result is cached
with the pod's signature, which includes every field read here.
"""

from __future__ import annotations

from typing import Callable

from shardsched.api.objects import PodInfo
from shardsched.cache.node_table import NodeTable
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import PreFilterPlugin
from shardsched.framework.status import Status

DYNAMIC_RESOURCES = "DynamicResources"


def _claims(pod: PodInfo) -> str | None:
    if not pod.resource_claims:
        return None
    return f"resource claims of Dynamic Resource Allocation ({', '.join(pod.resource_claims)})"


#: plugin name -> what of a pod needs it (None: nothing), in kube's default order
_NEEDS: dict[str, Callable[[PodInfo], str | None]] = {
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
