"""The objects whose selectors PodTopologySpread's default constraints read: Services,
ReplicationControllers, ReplicaSets and StatefulSets (upstream ``helper.DefaultSelector``).

A pod without constraints of its own is spread by the profile's default constraints over the pods
that one selector selects, built as upstream builds it:

- the ``spec.selector`` labels of every Service of the pod's namespace that selects the pod (a
  Service without a selector selects nothing), merged;
- the pod's controller (its ``ownerReferences`` entry with ``controller: true``) when it is a
  ``v1`` ReplicationController (its ``spec.selector`` labels merged in too) or an ``apps/v1``
  ReplicaSet or StatefulSet (its ``spec.selector`` requirements ANDed), looked up by name in the
  pod's namespace; another kind of controller, or one not known, adds nothing.

An empty result means the pod gets no default constraints (``selector.Empty()`` upstream).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardsched.api.podaffinity import LabelRequirement, LabelSelector, parse_label_selector
from shardsched.errors import InvalidObjectError

SERVICE, REPLICATION_CONTROLLER, REPLICA_SET, STATEFUL_SET = "Service", "ReplicationController", "ReplicaSet", "StatefulSet"
#: the kinds, in upstream's order, and the apiVersion a pod's controller reference must name
SPREAD_SELECTOR_KINDS = (SERVICE, REPLICATION_CONTROLLER, REPLICA_SET, STATEFUL_SET)
CONTROLLER_API_VERSIONS = {REPLICATION_CONTROLLER: "v1", REPLICA_SET: "apps/v1", STATEFUL_SET: "apps/v1"}

#: (kind, namespace, name) of one object
WorkloadKey = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class WorkloadSelector:
    """One Service, ReplicationController, ReplicaSet or StatefulSet as default spreading reads it.

    Attributes:
        kind: one of `SPREAD_SELECTOR_KINDS`.
        selector: ``spec.selector`` (a Service's and a ReplicationController's label map as
            ``match_labels``); None for a Service without one (it selects nothing).
    """

    kind: str
    namespace: str
    name: str
    selector: LabelSelector | None

    @property
    def key(self) -> WorkloadKey:
        return (self.kind, self.namespace, self.name)


def _label_map(value: Any, path: str) -> LabelSelector | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidObjectError("selector must be a map of label keys to values", path)
    return parse_label_selector({"matchLabels": dict(value)}, path)


def workload_selector_of(obj: Any) -> WorkloadSelector:
    """The `WorkloadSelector` of a Service, ReplicationController, ReplicaSet or StatefulSet dict.

    Raises:
        InvalidObjectError: another kind, no ``metadata.name``, or a malformed ``spec.selector``
            (with its path).
    """
    if not isinstance(obj, Mapping):
        raise InvalidObjectError("expected an object")
    kind = obj.get("kind")
    if kind not in SPREAD_SELECTOR_KINDS:
        raise InvalidObjectError(f"kind {kind!r} is not one of {', '.join(SPREAD_SELECTOR_KINDS)}", "kind")
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise InvalidObjectError("metadata.name is required", "metadata.name")
    namespace = str(meta.get("namespace") or "default")
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise InvalidObjectError("spec must be an object", "spec")
    raw = spec.get("selector")
    if kind in (SERVICE, REPLICATION_CONTROLLER):
        selector = _label_map(raw, "spec.selector")
    else:
        selector = parse_label_selector(raw, "spec.selector")
    return WorkloadSelector(kind, namespace, name, selector)


def controller_of(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of a pod's controller when default spreading reads it: the first
    ``ownerReferences`` entry with ``controller: true`` (``metav1.GetControllerOf``), if it is a
    ReplicationController, ReplicaSet or StatefulSet of the apiVersion upstream matches; else None."""
    refs = meta.get("ownerReferences")
    if not isinstance(refs, list):
        return None
    for ref in refs:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            kind, name = ref.get("kind"), ref.get("name")
            if CONTROLLER_API_VERSIONS.get(kind) == ref.get("apiVersion") and isinstance(name, str) and name:
                return (kind, name)
            return None
    return None


def _requirements(selector: LabelSelector) -> tuple[LabelRequirement, ...]:
    """A selector's requirements, its matchLabels as ``key In (value)``."""
    return tuple((k, "In", (v,)) for k, v in selector.match_labels) + selector.match_expressions


@dataclass
class SpreadSelectors:
    """The cluster's Services, ReplicationControllers, ReplicaSets and StatefulSets (module
    docstring), kept for `default_selector`. Plain data (picklable)."""

    #: namespace -> Service name -> its selector (Services without one are not kept)
    services: dict[str, dict[str, LabelSelector]] = field(default_factory=dict)
    #: (kind, namespace, name) -> selector of a ReplicationController, ReplicaSet or StatefulSet
    controllers: dict[WorkloadKey, LabelSelector] = field(default_factory=dict)

    def __len__(self) -> int:
        return sum(map(len, self.services.values())) + len(self.controllers)

    def objects(self) -> list[WorkloadSelector]:
        """Every object kept, as `WorkloadSelector` (what a relist gives to `apply` with ``replace``)."""
        out = [WorkloadSelector(SERVICE, ns, name, sel) for ns, by in self.services.items() for name, sel in by.items()]
        out += [WorkloadSelector(kind, ns, name, sel) for (kind, ns, name), sel in self.controllers.items()]
        return out

    def _get(self, key: WorkloadKey) -> LabelSelector | None:
        kind, ns, name = key
        return self.services.get(ns, {}).get(name) if kind == SERVICE else self.controllers.get(key)

    def _put(self, w: WorkloadSelector) -> bool:
        if w.selector is None:  # a Service without a selector selects nothing: as if absent
            return self._drop(w.key)
        if self._get(w.key) == w.selector:
            return False
        if w.kind == SERVICE:
            self.services.setdefault(w.namespace, {})[w.name] = w.selector
        else:
            self.controllers[w.key] = w.selector
        return True

    def _drop(self, key: WorkloadKey) -> bool:
        kind, ns, name = key
        if kind != SERVICE:
            return self.controllers.pop(key, None) is not None
        by = self.services.get(ns)
        if by is None or by.pop(name, None) is None:
            return False
        if not by:
            del self.services[ns]
        return True

    def apply(self, upserts: Iterable[WorkloadSelector] = (), removed: Iterable[WorkloadKey] = (),
              replace: bool = False) -> bool:
        """Objects created or changed and keys deleted; ``replace``: ``upserts`` is the whole set.
        Returns True if any selector changed (cached spread results are then stale)."""
        if replace:
            fresh = SpreadSelectors()
            for w in upserts:
                fresh._put(w)
            changed = fresh.services != self.services or fresh.controllers != self.controllers
            self.services, self.controllers = fresh.services, fresh.controllers
            return changed
        changed = False
        for w in upserts:
            changed |= self._put(w)
        for key in removed:
            changed |= self._drop(tuple(key))
        return changed

    def default_selector(self, namespace: str, labels: Mapping[str, str],
                         controller: tuple[str, str] | None) -> LabelSelector | None:
        """The selector of a pod's default constraints (module docstring), None when empty."""
        merged: dict[str, str] = {}
        for sel in self.services.get(namespace, {}).values():
            if sel.matches(labels):
                merged.update(sel.match_labels)
        extra: tuple[LabelRequirement, ...] = ()
        if controller is not None:
            owner = self.controllers.get((controller[0], namespace, controller[1]))
            if owner is not None:
                if controller[0] == REPLICATION_CONTROLLER:
                    merged.update(owner.match_labels)
                else:
                    extra = _requirements(owner)
        selector = LabelSelector(tuple(sorted(merged.items())), extra)
        return None if selector.everything else selector
