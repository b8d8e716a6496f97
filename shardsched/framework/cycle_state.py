"""CycleState: per-pod scratch data shared by a profile's plugins during one scheduling cycle.

As upstream, PreFilter/PreScore write derived data once (e.g. the pod's request vector) and
Filter/Score read it. Keys are plugin-defined strings.
"""

from __future__ import annotations

from typing import Any


class CycleState(dict[str, Any]):
    """A dict with kube's names: ``write(key, value)`` / ``read(key)`` (KeyError if absent)."""

    def write(self, key: str, value: Any) -> None:
        self[key] = value

    def read(self, key: str) -> Any:
        return self[key]


#: key of the nodes that passed every Filter (bool array over table slots), written by the scheduler
#: before PreScore, as upstream passes PreScore the filtered nodes
FEASIBLE_NODES_KEY = "feasibleNodes"

#: key of the set of pod uids whose Bind got no answer (the binding may have been applied), written
#: by Bind plugins; a Reserve plugin's Unreserve keeps what must stay counted for them until the
#: cluster tells (`shardsched.framework.interface.BindPlugin`)
BIND_OUTCOME_UNKNOWN_KEY = "bindOutcomeUnknown"

#: key of uid -> the GPU devices chosen for the pod on its node (indices in the node's order), for
#: the pods of the cycle that take any; written before Reserve by whoever assumed them (the shard),
#: read by DefaultBinder, which records them on the pod at bind
DEVICES_KEY = "gpuDevices"
