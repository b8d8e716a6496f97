"""The API server's create-time rules for the fields shardsched reads, and its name generation.

What an API server would refuse must not be scheduled: a what-if over manifests that kube-apiserver
rejects answers a question nobody can ask a cluster. The rules are those of k8s.io/kubernetes
``pkg/apis/core/validation`` and apimachinery's name checks, for what decides scheduling:

- object names: DNS-1123 subdomains (Pods, Nodes, PriorityClasses), namespaces DNS-1123 labels
  (``ValidatePodName``, ``ValidateNodeName``, ``ValidateNamespaceName``);
- container resources (``ValidateContainerResourceRequirements``): a resource name without a
  domain must be one containers can use (cpu, memory, ephemeral-storage, hugepages-<size>), any
  other name must be fully qualified and, outside ``*kubernetes.io/``, an extended resource name
  (``validateContainerResourceName``, ``IsExtendedResourceName``); a request may not exceed its
  limit; extended resources and hugepages cannot be overcommitted, so a request needs a limit and
  must equal it; extended resources are whole numbers (``ValidateResourceQuantityValue``);
- pod-level resources (``spec.resources``): cpu, memory and hugepages only, requests within limits;
- scheduling gates: each name a qualified name (``validateSchedulingGates``);
- a container's resource claims name claims of the pod's ``spec.resourceClaims``
  (``validateResourceClaimNames``).

Problems are ``(field path, message)`` pairs, every problem of an object at once, as the API server
answers a create with all of its field errors.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from shardsched.api.quantity import CPU, EPHEMERAL_STORAGE, MEMORY, exact_quantity, is_extended, is_prefixed_native
from shardsched.errors import InvalidObjectError

Problems = list[tuple[str, str]]

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")

#: apiserver's ``names.SimpleNameGenerator``: the prefix is cut to 58 characters and 5 random
#: characters are appended from apimachinery's ``rand.String`` alphabet (no vowels, no 0, 1, 3).
GENERATED_SUFFIX_LENGTH = 5
MAX_GENERATE_NAME_PREFIX = 63 - GENERATED_SUFFIX_LENGTH
GENERATED_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

#: Resource names without a domain that a container may request or limit
#: (upstream IsStandardContainerResourceName; hugepages-<size> besides).
CONTAINER_RESOURCES = (CPU, MEMORY, EPHEMERAL_STORAGE)
#: Resources pod-level ``spec.resources`` may set (hugepages-<size> besides).
POD_LEVEL_RESOURCES = (CPU, MEMORY)


def name_problem(value: str, label: bool = False) -> str | None:
    """Why ``value`` is not a DNS-1123 subdomain (a DNS-1123 label when ``label``), or None."""
    pattern, limit = (_DNS_LABEL, 63) if label else (_DNS_SUBDOMAIN, 253)
    if len(value) > limit or not pattern.fullmatch(value):
        kind = "DNS-1123 label" if label else "DNS-1123 subdomain"
        dots = "" if label else ", '.'"
        return (f"{value!r} is not a valid {kind} (at most {limit} characters: lowercase alphanumerics, "
                f"'-'{dots}, starting and ending with an alphanumeric)")
    return None


def validate_name(value: str, path: str, label: bool = False) -> None:
    """Raise `InvalidObjectError` at ``path`` unless ``value`` is a DNS-1123 subdomain (label when
    ``label``), as the API server validates object names and namespaces."""
    problem = name_problem(value, label)
    if problem:
        raise InvalidObjectError(problem, path)


def qualified_name_problem(value: str) -> str | None:
    """Why ``value`` is not a qualified name (``[prefix/]name``, as label keys and resource names),
    or None; as apimachinery's IsQualifiedName."""
    prefix, _, name = value.rpartition("/")
    if "/" in prefix:
        return "must be a name with at most one '/' (an optional DNS subdomain prefix, '/', then a name)"
    if "/" in value and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return "prefix must be a lowercase DNS subdomain of at most 253 characters"
    if not name or len(name) > 63 or not _NAME_PART.fullmatch(name):
        return ("name part must be at most 63 characters: alphanumerics, '-', '_' or '.', "
                "starting and ending with an alphanumeric")
    return None


def label_value_problem(value: str) -> str | None:
    """Why ``value`` is not a valid label value (empty, or at most 63 characters: alphanumerics,
    '-', '_' or '.', starting and ending with an alphanumeric), or None; as IsValidLabelValue."""
    if value and (len(value) > 63 or not _NAME_PART.fullmatch(value)):
        return (f"{value!r} is not a valid label value (at most 63 characters: alphanumerics, '-', '_' or "
                "'.', starting and ending with an alphanumeric; or empty)")
    return None


def labels_problems(labels: Any, path: str) -> Problems:
    """What the API server refuses in a label map (``metadata.labels``, ``matchLabels``): keys
    that are not qualified names, values that are not label values; [] for a valid map or a
    malformed shape (left to the parsers, which name it)."""
    if not isinstance(labels, Mapping):
        return []
    problems: Problems = []
    for key, value in labels.items():
        problem = qualified_name_problem(key) if isinstance(key, str) else None
        if problem:
            problems.append((path, f"key {key!r}: {problem}"))
        problem = label_value_problem(value) if isinstance(value, str) else None
        if problem:
            problems.append((f"{path}.{key}", problem))
    return problems


def generate_name(prefix: str, rng: random.Random) -> str:
    """A name for an object created with ``metadata.generateName: prefix``, as the API server makes
    it: the prefix cut to 58 characters, then 5 characters of ``GENERATED_NAME_ALPHABET`` drawn
    from ``rng`` (seed it for names that repeat from run to run)."""
    suffix = "".join(rng.choice(GENERATED_NAME_ALPHABET) for _ in range(GENERATED_SUFFIX_LENGTH))
    return prefix[:MAX_GENERATE_NAME_PREFIX] + suffix


def generate_name_problem(prefix: str) -> str | None:
    """Why names generated from ``prefix`` cannot be valid object names, or None (upstream checks
    the prefix as a DNS-1123 subdomain with a trailing '-' allowed)."""
    masked = prefix[:-1] + "a" if prefix.endswith("-") else prefix
    return name_problem(masked)


@functools.lru_cache(maxsize=1024)
def _container_resource_name_problem(name: str) -> str | None:
    """Upstream ``validateContainerResourceName``, in one message."""
    problem = qualified_name_problem(name)
    if problem:
        return f"{name!r} is not a valid resource name: {problem}"
    if "/" not in name:
        if name in CONTAINER_RESOURCES or name.startswith("hugepages-"):
            return None
        return (f"{name!r} is not a resource a container can request: a name without a domain must be one "
                f"of {', '.join(CONTAINER_RESOURCES)} or hugepages-<size>; other resources are fully "
                f"qualified (example.com/{name})")
    if is_prefixed_native(name):
        return None
    if is_extended(name) and qualified_name_problem(f"requests.{name}") is None:
        return None
    return (f"{name!r} does not follow the extended resource name standard (<domain>/<name>, the domain "
            "outside kubernetes.io, not starting with 'requests.')")


def _overcommit_allowed(name: str) -> bool:
    """Upstream IsOvercommitAllowed: native resources other than hugepages."""
    return ("/" not in name or is_prefixed_native(name)) and not name.startswith("hugepages-")


def _resource_list(resources: Mapping[str, Any], field: str) -> Mapping[str, Any]:
    items = resources.get(field)
    return items if isinstance(items, Mapping) else {}


def _exact(name: str, value: Any, path: str, problems: Problems) -> Decimal | None:
    """The exact quantity, or None after recording why it is malformed."""
    try:
        return exact_quantity(name, value, path)
    except InvalidObjectError as e:
        problems.append((e.path, e.message))
        return None


def container_resources_problems(resources: Any, path: str) -> Problems:
    """Problems of one container's ``resources`` (``path`` is its field path), as upstream
    ``ValidateContainerResourceRequirements``; see the module docstring. Quantities are parsed
    only where a rule needs their value (extended resources, a request with a limit)."""
    if not isinstance(resources, Mapping):
        return []
    problems: Problems = []
    requests, limits = _resource_list(resources, "requests"), _resource_list(resources, "limits")
    valid: dict[str, list[str]] = {"requests": [], "limits": []}  # names that pass, in input order
    for field, items in (("limits", limits), ("requests", requests)):
        for name, value in items.items():
            problem = _container_resource_name_problem(str(name))
            if problem:
                problems.append((f"{path}.{field}.{name}", problem))
                continue
            valid[field].append(name)
            if "/" in name and is_extended(name):
                where = f"{path}.{field}.{name}"
                exact = _exact(name, value, where, problems)
                if exact is not None and exact != exact.to_integral_value():
                    problems.append((where, f"{value} is not a whole number; extended resources such as "
                                            f"{name} are counted in whole units"))
    for name in valid["requests"]:
        if name not in limits:
            if not _overcommit_allowed(name):
                problems.append((f"{path}.limits.{name}",
                                 f"a limit is required: {name} cannot be overcommitted (extended resources "
                                 "and hugepages), so its request must equal its limit; set the limit alone and "
                                 "the request defaults to it"))
            continue
        if name not in valid["limits"]:
            continue
        where = f"{path}.requests.{name}"
        request = _exact(name, requests[name], where, [])
        limit = _exact(name, limits[name], f"{path}.limits.{name}", [])
        if request is None or limit is None:
            continue  # malformed: said above for extended resources, by PodInfo.from_object otherwise
        if not _overcommit_allowed(name) and request != limit:
            problems.append((where, f"{requests[name]} must equal the {name} limit of {limits[name]} "
                                    "(extended resources and hugepages cannot be overcommitted)"))
        elif request > limit:
            problems.append((where, f"{requests[name]} must be less than or equal to the {name} limit of "
                                    f"{limits[name]}"))
    return problems


def pod_level_resources_problems(resources: Any, path: str = "spec.resources") -> Problems:
    """Problems of pod-level ``spec.resources``: only cpu, memory and hugepages-<size>, each
    request within its limit (upstream ``validatePodResourceRequirements``)."""
    if not isinstance(resources, Mapping):
        return []
    problems: Problems = []
    requests, limits = _resource_list(resources, "requests"), _resource_list(resources, "limits")
    for field, items in (("limits", limits), ("requests", requests)):
        for name in items:
            if name not in POD_LEVEL_RESOURCES and not str(name).startswith("hugepages-"):
                problems.append((f"{path}.{field}.{name}",
                                 f"{name!r} is not supported at pod level (only {', '.join(POD_LEVEL_RESOURCES)} "
                                 "and hugepages-<size>)"))
    for name, value in requests.items():
        if name in limits:
            request = _exact(str(name), value, f"{path}.requests.{name}", [])
            limit = _exact(str(name), limits[name], f"{path}.limits.{name}", [])
            if request is not None and limit is not None and request > limit:
                problems.append((f"{path}.requests.{name}", f"{value} must be less than or equal to the "
                                                            f"pod-level {name} limit of {limits[name]}"))
    return problems


def container_claims_problems(resources: Any, pod_claims: list[str], path: str) -> Problems:
    """Problems of one container's ``resources.claims``: each names one of the pod's
    ``spec.resourceClaims`` (``pod_claims``, sorted), as upstream ``validateResourceClaimNames``."""
    claims = resources.get("claims") if isinstance(resources, Mapping) else None
    problems: Problems = []
    for i, claim in enumerate(claims if isinstance(claims, list) else ()):
        name = claim.get("name") if isinstance(claim, Mapping) else None
        if isinstance(name, str) and name and name not in pod_claims:
            names = f": {', '.join(pod_claims)}" if pod_claims else " which is empty"
            problems.append((f"{path}.claims[{i}]", f"{name!r} not found: must be one of the names in "
                                                    f"pod.spec.resourceClaims{names}"))
    return problems


def pod_problems(pod: Mapping[str, Any]) -> Problems:
    """Everything the API server would refuse in a Pod's name, namespace and resources (see the
    module docstring); [] for a valid pod. Malformed shapes (a spec that is not an object, ...) are
    left to `shardsched.api.objects.PodInfo.from_object`, which names them."""
    problems: Problems = []
    meta = pod.get("metadata")
    if isinstance(meta, Mapping):
        for field, label in (("name", False), ("namespace", True)):
            value = meta.get(field)
            problem = name_problem(value, label) if isinstance(value, str) and value else None
            if problem:
                problems.append((f"metadata.{field}", problem))
        problems += labels_problems(meta.get("labels"), "metadata.labels")
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return problems
    claims = spec.get("resourceClaims")
    claim_names = sorted({c.get("name") for c in claims if isinstance(c, Mapping) and isinstance(c.get("name"), str)}
                         if isinstance(claims, list) else ())
    for field in ("initContainers", "containers"):
        containers = spec.get(field)
        if not isinstance(containers, list):
            continue
        for i, container in enumerate(containers):
            if isinstance(container, Mapping):
                path = f"spec.{field}[{i}].resources"
                problems += container_resources_problems(container.get("resources"), path)
                problems += container_claims_problems(container.get("resources"), claim_names, path)
    problems += pod_level_resources_problems(spec.get("resources"))
    gates = spec.get("schedulingGates")
    for i, gate in enumerate(gates if isinstance(gates, list) else ()):
        name = gate.get("name") if isinstance(gate, Mapping) else None
        problem = qualified_name_problem(name) if isinstance(name, str) and name else None
        if problem:  # as ValidateSchedulingGates: each gate's name is a qualified name
            problems.append((f"spec.schedulingGates[{i}].name", f"{name!r}: {problem}"))
    return problems
