"""PodGroup: the scheduler-plugins ``scheduling.x-k8s.io/v1alpha1`` PodGroup, as Coscheduling reads
it, and its status as the PodGroup controller writes it.

A pod joins the group named by its label ``scheduling.x-k8s.io/pod-group`` in its own namespace.
The group is all or nothing: no member binds until ``spec.minMember`` members can be placed
(``docs/gangs.md``). The CRD is ``deploy/crds/scheduling.x-k8s.io_podgroups.yaml``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shardsched.api.objects import POD_GROUP_LABEL, parse_time
from shardsched.api.quantity import PODS, parse_resource_list
from shardsched.errors import InvalidObjectError

GROUP = "scheduling.x-k8s.io"
API_VERSION = f"{GROUP}/v1alpha1"
KIND = "PodGroup"

#: ``status.phase`` values of the PodGroup controller (scheduler-plugins v0.34's ``PodGroupPhase``)
PENDING, SCHEDULING, RUNNING, FINISHED, FAILED = "Pending", "Scheduling", "Running", "Finished", "Failed"


def group_key_of(namespace: str, labels: Mapping[str, str] | None) -> str | None:
    """``namespace/name`` of the group a pod with these labels belongs to, or None (no label, or
    an empty one: upstream's "pod group not specified")."""
    name = (labels or {}).get(POD_GROUP_LABEL)
    return f"{namespace}/{name}" if name else None


@dataclass(frozen=True, slots=True)
class PodGroup:
    """A PodGroup as the scheduler reads it.

    Attributes:
        namespace, name, uid: the object's.
        created_s: ``metadata.creationTimestamp`` as Unix seconds (0.0 when unset); Coscheduling's
            QueueSort orders gangs of equal priority by it.
        min_member: ``spec.minMember``, >= 1: members that must be placed together.
        min_resources: ``spec.minResources`` in canonical units (cpu in millicores, bytes, counts);
            PreFilter checks it against the cluster's free capacity, with ``pods: min_member``.
        schedule_timeout_s: ``spec.scheduleTimeoutSeconds``, or None (the plugin's
            ``permitWaitingTimeSeconds`` then): how long a member waits at Permit for its siblings.
    """

    namespace: str
    name: str
    min_member: int
    uid: str = ""
    created_s: float = 0.0
    min_resources: dict[str, int] = field(default_factory=dict)
    schedule_timeout_s: int | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> "PodGroup":
        """From a PodGroup dict (camelCase keys).

        Raises:
            InvalidObjectError: naming the field: no ``metadata.name``; ``spec.minMember`` missing,
                not an integer, or below 1 (a group of 0 gangs nothing; the CRD's minimum is 1);
                a malformed ``spec.minResources`` quantity; a negative or non-integer
                ``spec.scheduleTimeoutSeconds``.
        """
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        if not isinstance(meta, Mapping) or not meta.get("name"):
            raise InvalidObjectError("metadata.name is missing", "metadata.name")
        spec = obj.get("spec") or {}
        if not isinstance(spec, Mapping):
            raise InvalidObjectError("must be an object", "spec")
        min_member = spec.get("minMember")
        if min_member is None:
            raise InvalidObjectError("is required: the number of members to place together (at least 1)",
                                     "spec.minMember")
        if isinstance(min_member, bool) or not isinstance(min_member, int):
            raise InvalidObjectError(f"{min_member!r} is not an integer", "spec.minMember")
        if min_member < 1:
            raise InvalidObjectError(f"{min_member} is below the minimum of 1", "spec.minMember")
        timeout = spec.get("scheduleTimeoutSeconds")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0):
            raise InvalidObjectError(f"{timeout!r} is not a non-negative integer", "spec.scheduleTimeoutSeconds")
        resources = parse_resource_list(spec.get("minResources"), "spec.minResources")
        return cls(str(meta.get("namespace") or "default"), str(meta["name"]), min_member, str(meta.get("uid") or ""),
                   parse_time(meta.get("creationTimestamp"), "metadata.creationTimestamp") or 0.0,
                   resources, timeout)

    def min_resources_with_pods(self) -> dict[str, int]:
        """``min_resources`` plus ``pods: min_member``, what upstream's PreFilter checks."""
        return {**self.min_resources, PODS: self.min_member} if self.min_resources else {}


def group_status(min_member: int, phases: Mapping[str, int], old: Mapping[str, Any], now: str) -> dict:
    """The status the PodGroup controller writes (scheduler-plugins v0.34 ``Reconcile``), from the
    phases of the group's pods (``status.phase`` -> number of the group's pods in it).

    Phase: a new group is Pending; Pending turns Scheduling once the group has ``min_member`` pods;
    after that, with fewer pods it is Pending again, Scheduling while fewer than ``min_member``
    run or succeeded, Running from then, Failed when some pod failed and failed + running +
    succeeded reach ``min_member``, Finished when ``min_member`` succeeded. Finished and Failed are
    final. ``running``, ``succeeded`` and ``failed`` count pods by phase; ``scheduleStartTime`` is
    set (to ``now``, RFC 3339) when the group first enters Scheduling, as the Coscheduling plugin
    of earlier releases stamped the first scheduling attempt.
    """
    phase = old.get("phase") or ""
    if phase in (FINISHED, FAILED):
        return dict(old)
    pods = sum(phases.values())
    out = dict(old)
    if phase == "":
        out["phase"] = PENDING
    elif phase == PENDING:
        if pods >= min_member:
            out["phase"] = SCHEDULING
    else:
        running, succeeded, failed = (phases.get(want, 0) for want in ("Running", "Succeeded", "Failed"))
        out.update(running=running, succeeded=succeeded, failed=failed)
        if pods < min_member:
            out["phase"] = PENDING
        else:
            out["phase"] = RUNNING if succeeded + running >= min_member else SCHEDULING
            if failed and failed + running + succeeded >= min_member:
                out["phase"] = FAILED
            if succeeded >= min_member:
                out["phase"] = FINISHED
    if out["phase"] != PENDING and not out.get("scheduleStartTime"):
        out["scheduleStartTime"] = now
    return out
