"""A pod's effective resource request, as upstream ``PodRequests`` (k8s.io/component-helpers).

    requests = max_per_resource( sum(app containers) + sum(sidecars),
                                 max over init containers i of InitContainerUse(i) )
               (pod-level spec.resources.requests replace cpu/memory/hugepages when set)
               + spec.overhead

where a sidecar is an init container with ``restartPolicy: Always`` and InitContainerUse(i) is the
request of a classic init container plus every sidecar declared before it (a sidecar's own use is
the sum of the sidecars up to and including it).

Container requests are defaulted from limits first, as the API server does on create
(``SetDefaults_Pod``: a resource with a limit and no request gets request = limit).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardsched.api.quantity import CPU, MEMORY, parse_resource_list
from shardsched.errors import InvalidObjectError

#: kube-scheduler's defaults for containers that do not set a request, used for scoring only
#: (``schedutil.DefaultMilliCPURequest`` = 100m, ``DefaultMemoryRequest`` = 200 MiB).
DEFAULT_MILLI_CPU_REQUEST = 100
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024

#: Resources that pod-level ``spec.resources`` may set (the PodLevelResources feature).
POD_LEVEL_RESOURCES = (CPU, MEMORY)


def _container_requests(container: Mapping[str, Any], path: str) -> dict[str, int]:
    """Requests of one container, defaulted from its limits like the API server does."""
    if not isinstance(container, Mapping):
        raise InvalidObjectError("container must be an object", path)
    res = container.get("resources") or {}
    if not isinstance(res, Mapping):
        raise InvalidObjectError("resources must be an object", f"{path}.resources")
    reqs = parse_resource_list(res.get("requests"), f"{path}.resources.requests")
    limits = parse_resource_list(res.get("limits"), f"{path}.resources.limits")
    for name, value in limits.items():
        reqs.setdefault(name, value)
    return reqs


def _with_defaults(reqs: dict[str, int], non_missing: Mapping[str, int] | None) -> dict[str, int]:
    if not non_missing:
        return reqs
    out = dict(reqs)
    for name, value in non_missing.items():
        out.setdefault(name, value)
    return out


def _add(into: dict[str, int], other: Mapping[str, int]) -> None:
    for k, v in other.items():
        into[k] = into.get(k, 0) + v


def _max(into: dict[str, int], other: Mapping[str, int]) -> None:
    for k, v in other.items():
        into[k] = max(into.get(k, 0), v)


def _containers(spec: Mapping[str, Any], field: str) -> list[Mapping[str, Any]]:
    items = spec.get(field) or []
    if not isinstance(items, list):
        raise InvalidObjectError(f"{field} must be a list", f"spec.{field}")
    return items


def pod_requests(pod: Mapping[str, Any], non_missing: Mapping[str, int] | None = None) -> dict[str, int]:
    """Effective requests of a pod in canonical units (see module docstring for the rule).

    Args:
        pod: a Pod object as a plain dict (camelCase keys, as in YAML/JSON).
        non_missing: per-container defaults for requests a container does not set (kube's
            ``NonMissingContainerRequests``; pass `SCORING_DEFAULTS` for scoring), or None.

    Returns:
        {resource: int}; resources requested by no container are absent; zero-valued entries kept
        only if a container set them explicitly.

    Raises:
        InvalidObjectError: a malformed quantity or container, with the field path.
    """
    spec = pod.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise InvalidObjectError("spec must be an object", "spec")
    reqs: dict[str, int] = {}
    for i, c in enumerate(_containers(spec, "containers")):
        _add(reqs, _with_defaults(_container_requests(c, f"spec.containers[{i}]"), non_missing))

    sidecars: dict[str, int] = {}
    init_max: dict[str, int] = {}
    for i, c in enumerate(_containers(spec, "initContainers")):
        creqs = _with_defaults(_container_requests(c, f"spec.initContainers[{i}]"), non_missing)
        if c.get("restartPolicy") == "Always":
            _add(reqs, creqs)
            _add(sidecars, creqs)
            use = dict(sidecars)
        else:
            use = dict(creqs)
            _add(use, sidecars)
        _max(init_max, use)
    _max(reqs, init_max)

    pod_level = spec.get("resources")
    if pod_level:
        if not isinstance(pod_level, Mapping):
            raise InvalidObjectError("resources must be an object", "spec.resources")
        level = parse_resource_list(pod_level.get("requests"), "spec.resources.requests")
        for name, value in level.items():
            if name in POD_LEVEL_RESOURCES or name.startswith("hugepages-"):
                reqs[name] = value

    _add(reqs, parse_resource_list(spec.get("overhead"), "spec.overhead"))
    return reqs


SCORING_DEFAULTS = {CPU: DEFAULT_MILLI_CPU_REQUEST, MEMORY: DEFAULT_MEMORY_REQUEST}


def nonzero_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """(cpu millicores, memory bytes) a pod counts for scoring: kube's non-zero request rule.

    Each container (app and init) that does not set a cpu / memory request counts 100m / 200 MiB
    (an explicit zero stays zero), as kube-scheduler's NodeResourcesFit scoring does.
    """
    reqs = pod_requests(pod, SCORING_DEFAULTS)
    return reqs.get(CPU, 0), reqs.get(MEMORY, 0)
