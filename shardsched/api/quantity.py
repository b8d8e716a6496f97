"""Kubernetes quantities in canonical integer units.

A quantity is checked against apimachinery's grammar and its exact value computed as the kubernetes
client's ``parse_quantity`` does (number × 1000 or 1024 to the suffix's power; ``e``/``E`` exponents
as decimal notation), without importing the client into the scheduling core. This module decides
the unit of each resource and rounds up the way ``resource.Quantity.MilliValue()`` / ``Value()`` do:

- ``cpu``: millicores (``"0.5"`` -> 500, ``"1m"`` -> 1, ``"0.1m"`` -> 1);
- ``memory``, ``ephemeral-storage``, ``hugepages-*``: bytes (``"500m"`` memory -> 1, rounded up);
- everything else (``pods``, ``nvidia.com/gpu``, ...): a count (rounded up).
"""

from __future__ import annotations

import functools
import math
import re
from decimal import Decimal
from collections.abc import Mapping
from typing import Any

from shardsched.errors import InvalidObjectError

CPU = "cpu"
MEMORY = "memory"
EPHEMERAL_STORAGE = "ephemeral-storage"
PODS = "pods"

#: resource.Quantity's grammar (apimachinery quantity.go): <sign?><number><suffix>, suffix one of the
#: binary SI (Ki..Ei), decimal SI (n, u, m, "", k, M, G, T, P, E) or an exponent (e3, E-2).
#: The client's ``parse_quantity`` is laxer (it takes "1_000", "1 ", "1K"): the API server does not.
_QUANTITY_RE = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?")

#: suffix letter -> power of the base (1000, or 1024 for the binary ``..i`` suffixes)
_SUFFIX_POWERS = {"n": -3, "u": -2, "m": -1, "k": 1, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}

#: Largest canonical value accepted (2**62): beyond it a quantity is certainly a mistake, and int64
#: columns in the NodeTable and Redis counters must never overflow when a few are added up.
MAX_CANONICAL = 2**62


def is_byte_resource(name: str) -> bool:
    """True for resources counted in bytes: memory, ephemeral-storage and hugepages-<size>."""
    return name in (MEMORY, EPHEMERAL_STORAGE) or name.startswith("hugepages-")


def is_prefixed_native(name: str) -> bool:
    """Names in a ``*kubernetes.io/`` domain (upstream IsPrefixedNativeResource: contains, not prefix)."""
    return "kubernetes.io/" in name


def is_extended(name: str) -> bool:
    """Extended resources are domain-prefixed names outside ``*kubernetes.io/`` (upstream
    IsExtendedResourceName; for a name that passed `shardsched.api.validation`)."""
    return "/" in name and not is_prefixed_native(name) and not name.startswith("requests.")


def canonical_quantity(name: str, value: Any, path: str = "") -> int:
    """Parse one quantity of resource ``name`` into its canonical integer unit.

    Args:
        name: resource name (``cpu``, ``memory``, ``nvidia.com/gpu``, ...).
        value: a Kubernetes quantity string (``"500m"``, ``"1Gi"``, ``"1e3"``) or a number.
        path: field path used in error messages.

    Returns:
        millicores for ``cpu``; bytes for memory-like resources; a count otherwise; always rounded
        up (as kube's ``MilliValue``/``Value``).

    Raises:
        InvalidObjectError: the quantity is malformed, negative, or larger than 2**62 units.
    """
    if isinstance(value, bool) or value is None:
        raise InvalidObjectError(f"invalid quantity {value!r} for {name}", path)
    text = value if isinstance(value, str) else str(value)
    result = _canonical(CPU if name == CPU else "", text)
    if isinstance(result, str):
        raise InvalidObjectError(result.format(value=value, name=name), path)
    return result


def exact_quantity(name: str, value: Any, path: str = "") -> Decimal:
    """The exact value of a quantity of resource ``name`` in its base unit (cores for ``cpu``,
    bytes, counts), not rounded: for comparing two quantities and telling whole numbers from
    fractions as ``resource.Quantity.Cmp`` does (``"500m"`` -> 0.5, ``"1Ki"`` -> 1024).

    Raises:
        InvalidObjectError: as `canonical_quantity` (the same checks and messages).
    """
    canonical_quantity(name, value, path)
    return _decimal(value if isinstance(value, str) else str(value))


@functools.lru_cache(maxsize=8192)
def _decimal(text: str) -> Decimal:
    """The exact value of a quantity that matches `_QUANTITY_RE`, as the client's ``parse_quantity``."""
    suffix = _QUANTITY_RE.fullmatch(text).group(3)  # type: ignore[union-attr]
    if suffix is None or (len(suffix) > 1 and not suffix.endswith("i")):  # none, or an exponent (1e3)
        return Decimal(text)
    base = 1024 if suffix.endswith("i") else 1000
    return Decimal(text[:-len(suffix)]) * (base ** Decimal(_SUFFIX_POWERS[suffix[0]]))


@functools.lru_cache(maxsize=8192)
def _canonical(unit: str, text: str) -> int | str:
    """Cached core of `canonical_quantity`: the canonical value, or an error message template
    (``{value}``/``{name}`` placeholders) - errors are values here so that they cache too."""
    if not _QUANTITY_RE.fullmatch(text):
        return ("invalid quantity {value!r} for {name}: quantities must match "
                "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
    try:
        q = _decimal(text)
    except ArithmeticError as e:
        return "invalid quantity {value!r} for {name}: " + str(e).replace("{", "{{").replace("}", "}}")
    if q.is_nan() or q.is_infinite():
        return "invalid quantity {value!r} for {name}"
    if q < 0:
        return "negative quantity {value!r} for {name}"
    result = math.ceil(q * 1000 if unit == CPU else q)
    if result > MAX_CANONICAL:
        return "quantity {value!r} for {name} is too large"
    return int(result)


def parse_resource_list(obj: Mapping[str, Any] | None, path: str = "") -> dict[str, int]:
    """Parse a ResourceList (``{"cpu": "500m", "memory": "1Gi"}``) into canonical integers.

    Raises:
        InvalidObjectError: the list is not a mapping, or one of its quantities is invalid; the path
            names the entry (``<path>.cpu``).
    """
    if obj is None:
        return {}
    if not isinstance(obj, Mapping):
        raise InvalidObjectError(f"expected a map of resource quantities, got {type(obj).__name__}", path)
    out: dict[str, int] = {}
    for key, value in obj.items():
        if not isinstance(key, str) or not key:
            raise InvalidObjectError(f"invalid resource name {key!r}", path)
        out[key] = canonical_quantity(key, value, f"{path}.{key}" if path else key)
    return out


def format_quantity(name: str, value: int) -> str:
    """Inverse of `canonical_quantity` for display: ``cpu`` 1500 -> ``"1500m"``, memory -> ``"1Gi"``."""
    if name == CPU:
        return f"{value // 1000}" if value % 1000 == 0 else f"{value}m"
    if is_byte_resource(name):
        for suffix, factor in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if value >= factor and value % factor == 0:
                return f"{value // factor}{suffix}"
    return str(value)
