"""PodDisruptionBudget: what preemption reads of a ``policy/v1`` PodDisruptionBudget.

kube-scheduler's DefaultPreemption does not compute budgets: it reads ``status.disruptionsAllowed``
(written by the disruption controller) and ``status.disruptedPods`` (pods whose eviction the API
server has already counted), and matches the PDB's ``spec.selector`` against pods of its namespace.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardsched.api.podaffinity import LabelSelector, parse_label_selector
from shardsched.errors import InvalidObjectError


@dataclass(frozen=True, slots=True)
class PodDisruptionBudget:
    """A PDB as preemption reads it.

    Attributes:
        namespace, name: the object's.
        selector: ``spec.selector``; None (unset) selects nothing, as does the empty selector
            (upstream: "A PDB with a nil or empty selector matches nothing").
        disruptions_allowed: ``status.disruptionsAllowed`` (0 when the status is not written yet).
        disrupted_pods: names in ``status.disruptedPods``, not counted again.
    """

    namespace: str
    name: str
    selector: LabelSelector | None
    disruptions_allowed: int
    disrupted_pods: frozenset[str] = frozenset()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether the budget covers a pod (same namespace, a non-empty selector that matches)."""
        return (namespace == self.namespace and self.selector is not None and not self.selector.everything
                and bool(labels) and self.selector.matches(labels))

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> "PodDisruptionBudget":
        """From a PodDisruptionBudget dict (camelCase keys).

        Raises:
            InvalidObjectError: a malformed selector or status field, naming its path.
        """
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        if not isinstance(spec, Mapping) or not isinstance(status, Mapping):
            raise InvalidObjectError("spec and status must be objects", "spec")
        selector = parse_label_selector(spec.get("selector"), "spec.selector")
        allowed = status.get("disruptionsAllowed", 0) or 0
        if isinstance(allowed, bool) or not isinstance(allowed, int):
            raise InvalidObjectError(f"{allowed!r} is not an integer", "status.disruptionsAllowed")
        disrupted = status.get("disruptedPods") or {}
        if not isinstance(disrupted, Mapping):
            raise InvalidObjectError("must be a map of pod name to time", "status.disruptedPods")
        return cls(str(meta.get("namespace") or "default"), str(meta.get("name") or ""), selector, allowed,
                   frozenset(map(str, disrupted)))
