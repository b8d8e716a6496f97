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

In-place pod resize (``UseStatusResources``, as kube-scheduler counts a pod in its NodeInfo): the
container part is the per-resource max of that sum taken three ways, over the spec's requests,
over what the kubelet allocated (a container status's ``allocatedResources``, else the spec) and
over what it actuated (the status's ``resources.requests``, else ``allocatedResources``, else the
spec); while the resize is ``Infeasible`` (the ``PodResizePending`` condition's reason, or the
older ``status.resize``) the spec is left out, and a container without a status adds nothing. A
pod without container statuses (every pending pod) counts its spec, as before. Pod-level
``spec.resources`` is read from the spec only (InPlacePodLevelResourcesVerticalScaling, alpha, is
not followed).
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


#: the reason of the ``PodResizePending`` condition when the node can never fit the resize
RESIZE_INFEASIBLE = "Infeasible"
RESIZE_PENDING_CONDITION = "PodResizePending"


def resize_infeasible(status: Mapping[str, Any]) -> bool:
    """Whether a pod's resize is Infeasible: the first ``PodResizePending`` condition's reason
    (upstream ``IsPodResizeInfeasible``), or ``status.resize`` before v1.33."""
    for c in status.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == RESIZE_PENDING_CONDITION:
            return c.get("reason") == RESIZE_INFEASIBLE
    return status.get("resize") == RESIZE_INFEASIBLE


def _statuses(status: Mapping[str, Any]) -> dict[str, tuple[Mapping[str, Any], str]]:
    """Container name -> (its status, the status's path): ``containerStatuses`` first, then
    ``initContainerStatuses`` (upstream findContainerStatus)."""
    out: dict[str, tuple[Mapping[str, Any], str]] = {}
    for field in ("initContainerStatuses", "containerStatuses"):
        items = status.get(field) or []
        if not isinstance(items, list):
            raise InvalidObjectError(f"{field} must be a list", f"status.{field}")
        for i, cs in enumerate(items):
            if isinstance(cs, Mapping) and isinstance(cs.get("name"), str):
                out[cs["name"]] = (cs, f"status.{field}[{i}]")
    return out


def _status_requests(c: Mapping[str, Any], statuses: Mapping[str, tuple[Mapping[str, Any], str]],
                     path: str, infeasible: bool) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """(spec, allocated, actuated) requests of one container (module docstring)."""
    spec = _container_requests(c, path)
    cs, cs_path = statuses.get(c.get("name") if isinstance(c, Mapping) else None, (None, ""))
    fallback = {} if infeasible else spec
    if cs is None:
        return spec, fallback, fallback
    raw_alloc = cs.get("allocatedResources")
    allocated = (parse_resource_list(raw_alloc, f"{cs_path}.allocatedResources") if raw_alloc is not None
                 else fallback)
    res = cs.get("resources")
    if res is not None and not isinstance(res, Mapping):
        raise InvalidObjectError("resources must be an object", f"{cs_path}.resources")
    raw_actual = (res or {}).get("requests")
    actuated = (parse_resource_list(raw_actual, f"{cs_path}.resources.requests") if raw_actual is not None
                else allocated if raw_alloc is not None else fallback)
    return spec, allocated, actuated


def _aggregate(spec: Mapping[str, Any], requests_of, non_missing: Mapping[str, int] | None) -> dict[str, int]:
    """The containers' part of upstream ``PodRequests`` (module docstring), each container's
    requests taken by ``requests_of(container, path)``."""
    reqs: dict[str, int] = {}
    for i, c in enumerate(_containers(spec, "containers")):
        _add(reqs, _with_defaults(requests_of(c, f"spec.containers[{i}]"), non_missing))

    sidecars: dict[str, int] = {}
    init_max: dict[str, int] = {}
    for i, c in enumerate(_containers(spec, "initContainers")):
        creqs = _with_defaults(requests_of(c, f"spec.initContainers[{i}]"), non_missing)
        if isinstance(c, Mapping) and c.get("restartPolicy") == "Always":
            _add(reqs, creqs)
            _add(sidecars, creqs)
            use = dict(sidecars)
        else:
            use = dict(creqs)
            _add(use, sidecars)
        _max(init_max, use)
    _max(reqs, init_max)
    return reqs


def pod_requests(pod: Mapping[str, Any], non_missing: Mapping[str, int] | None = None) -> dict[str, int]:
    """Effective requests of a pod in canonical units (see module docstring for the rule).

    Args:
        pod: a Pod object as a plain dict (camelCase keys, as in YAML/JSON); its container statuses
            count as an in-place resize's (module docstring).
        non_missing: per-container defaults for requests a container does not set (kube's
            ``NonMissingContainerRequests``; pass `SCORING_DEFAULTS` for scoring), or None.

    Returns:
        {resource: int}; resources requested by no container are absent; zero-valued entries kept
        only if a container set them explicitly.

    Raises:
        InvalidObjectError: a malformed quantity or container (of the spec or of a container
            status), with the field path.
    """
    spec = pod.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise InvalidObjectError("spec must be an object", "spec")
    status = pod.get("status") or {}
    if not isinstance(status, Mapping):
        raise InvalidObjectError("status must be an object", "status")
    statuses = _statuses(status)
    if not statuses:
        reqs = _aggregate(spec, lambda c, path: _container_requests(c, path), non_missing)
    else:  # in-place resize: UseStatusResources (module docstring)
        infeasible = resize_infeasible(status)
        per = {}
        for field in ("containers", "initContainers"):
            for i, c in enumerate(_containers(spec, field)):
                per[id(c)] = _status_requests(c, statuses, f"spec.{field}[{i}]", infeasible)
        ways = [_aggregate(spec, lambda c, path, k=k: per[id(c)][k], non_missing) for k in (0, 1, 2)]
        reqs = {}
        for way in ways[1:] if infeasible else ways:
            _max(reqs, way)

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
