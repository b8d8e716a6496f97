"""The simulated cluster's PodDisruptionBudgets (``policy/v1``): validation as the API server does
it, and ``status`` as the disruption controller computes it (``pkg/controller/disruption``).

`SimCluster` keeps, per budget, which pods its selector selects and whether each is healthy, and
writes the budget's status again whenever that changes (`budget_status`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from shardsched.api.podaffinity import LabelSelector, parse_label_selector
from shardsched.api.validation import name_problem
from shardsched.errors import InvalidObjectError

#: the kind, API version and the condition the disruption controller writes
PDB_KIND, PDB_API_VERSION = "PodDisruptionBudget", "policy/v1"
DISRUPTION_ALLOWED = "DisruptionAllowed"

_PERCENT = re.compile(r"^(\d+)%$")


@dataclass(frozen=True, slots=True)
class Budget:
    """What the controller reads of a budget's spec.

    Attributes:
        key: ``namespace/name``.
        selector: ``spec.selector``; None (unset) selects no pod, the empty selector every pod of
            the namespace (policy/v1's rule; the scheduler's own reading, `api.disruption`,
            ignores both).
        min_available, max_unavailable: an int >= 0, a percent string ``"N%"``, or None (unset);
            at most one is set.
    """

    key: str
    selector: LabelSelector | None
    min_available: int | str | None
    max_unavailable: int | str | None

    @property
    def namespace(self) -> str:
        return self.key.split("/", 1)[0]

    def selects(self, labels: Mapping[str, str]) -> bool:
        """Whether a pod of the budget's namespace with ``labels`` is covered."""
        return self.selector is not None and self.selector.matches(labels)


def _int_or_percent(value: Any, path: str) -> int | str | None:
    """An IntOrString of a budget: an int >= 0 or ``"N%"`` with N in [0, 100]. Raises InvalidObjectError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InvalidObjectError(f"{value!r} must be an integer or a percentage", path)
    if isinstance(value, int):
        if value < 0:
            raise InvalidObjectError(f"{value} must be greater than or equal to 0", path)
        return value
    m = _PERCENT.match(value)
    if m is None:
        raise InvalidObjectError(f"{value!r} must be an integer or a percentage (e.g. '50%')", path)
    if int(m.group(1)) > 100:
        raise InvalidObjectError(f"{value!r} must not be greater than 100%", path)
    return value


def scaled(value: int | str, total: int) -> int:
    """``intstr.GetScaledValueFromIntOrPercent(value, total, roundUp=true)``: an int as is, a
    percent of ``total`` rounded up."""
    if isinstance(value, int):
        return value
    return math.ceil(int(value[:-1]) * total / 100)


def parse_budget(obj: Mapping[str, Any]) -> Budget:
    """A budget from a PodDisruptionBudget dict (namespace defaulted to ``default``), with the API
    server's validation.

    Raises:
        InvalidObjectError: no or a bad name, a malformed selector, a bad ``minAvailable`` or
            ``maxUnavailable``, or both set; the message names the field path.
    """
    meta = obj.get("metadata")
    spec = obj.get("spec") or {}
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise InvalidObjectError("Required value", "metadata.name")
    if (problem := name_problem(meta["name"])) is not None:
        raise InvalidObjectError(problem, "metadata.name")
    if not isinstance(spec, Mapping):
        raise InvalidObjectError("must be an object", "spec")
    selector = parse_label_selector(spec.get("selector"), "spec.selector")
    min_available = _int_or_percent(spec.get("minAvailable"), "spec.minAvailable")
    max_unavailable = _int_or_percent(spec.get("maxUnavailable"), "spec.maxUnavailable")
    if min_available is not None and max_unavailable is not None:
        raise InvalidObjectError("minAvailable and maxUnavailable cannot be both set", "spec")
    return Budget(f"{meta.get('namespace') or 'default'}/{meta['name']}", selector, min_available, max_unavailable)


def healthy(pod: Mapping[str, Any]) -> bool:
    """A pod the budget counts as available: bound, ``Running`` and not terminating."""
    return (bool(pod["spec"].get("nodeName")) and pod.get("status", {}).get("phase") == "Running"
            and not pod["metadata"].get("deletionTimestamp"))


def budget_status(budget: Budget, expected: int, current_healthy: int) -> dict[str, int]:
    """The counts of a budget's status, as the disruption controller's ``getExpectedPodCount`` and
    ``updatePdbStatus``: ``minAvailable`` N asks N healthy pods; ``minAvailable`` P% asks P% of
    the expected pods, rounded up; ``maxUnavailable`` M (or M%, rounded up) asks all expected
    pods but M; neither set asks none.

    Args:
        expected: pods the selector selects (the expected pod count).
        current_healthy: of them, those `healthy`.

    Returns:
        ``expectedPods``, ``currentHealthy``, ``desiredHealthy``, ``disruptionsAllowed``
        (``max(0, currentHealthy - desiredHealthy)``), camelCase as in the object's status.
    """
    if budget.max_unavailable is not None:
        desired = max(0, expected - scaled(budget.max_unavailable, expected))
    elif budget.min_available is not None:
        desired = scaled(budget.min_available, expected)
    else:
        desired = 0
    return {"expectedPods": expected, "currentHealthy": current_healthy, "desiredHealthy": desired,
            "disruptionsAllowed": max(0, current_healthy - desired)}
