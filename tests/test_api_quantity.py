"""Quantities in canonical integer units, rounded up like resource.Quantity's MilliValue()/Value(),
and rejected (with the field path) where the API server would reject them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity

from shardsched.api.quantity import _decimal, canonical_quantity, format_quantity, parse_resource_list
from shardsched.errors import InvalidObjectError

GI = 2**30


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("cpu", "0.5", 500),
        ("cpu", "1", 1000),
        ("cpu", "1m", 1),
        ("cpu", "0.1m", 1),  # MilliValue rounds up
        ("cpu", "1.0005", 1001),
        ("cpu", "1e-3", 1),
        ("cpu", ".5", 500),
        ("cpu", "+2", 2000),
        ("cpu", 2, 2000),  # YAML numbers
        ("cpu", 0.25, 250),
        ("cpu", "0", 0),
        ("memory", "100Ki", 102400),
        ("memory", "1G", 10**9),
        ("memory", "1Gi", GI),
        ("memory", "1e3", 1000),
        ("memory", "1E3", 1000),
        ("memory", "1e+3", 1000),
        ("memory", "1k", 1000),
        ("memory", "1M", 10**6),
        ("memory", "1Mi", 2**20),
        ("memory", "1Ei", 2**60),
        ("memory", "500m", 1),  # Value() rounds up: half a byte is one byte
        ("memory", "1.5", 2),
        ("memory", "1500m", 2),
        ("ephemeral-storage", "10Gi", 10 * GI),
        ("hugepages-2Mi", "4Mi", 4 * 2**20),
        ("pods", "110", 110),
        ("nvidia.com/gpu", "2", 2),
        ("example.com/foo", "500m", 1),  # counts round up too
    ],
    ids=lambda v: str(v),
)
def test_canonical_units(name, value, expected):
    assert canonical_quantity(name, value) == expected


@pytest.mark.parametrize(
    "value, why",
    [
        ("-1", "negative"),
        ("-100m", "negative"),
        ("abc", "invalid"),
        ("", "invalid"),
        ("1.5.5", "invalid"),
        ("1mi", "invalid"),  # binary suffixes are Ki, Mi, ...; "mi" is none
        ("12e", "invalid"),
        ("1K", "invalid"),  # decimal kilo is lower-case k
        ("1_000", "invalid"),  # Python's Decimal takes it, Kubernetes does not
        ("1 ", "invalid"),
        ("0x10", "invalid"),
        ("Infinity", "invalid"),
        ("NaN", "invalid"),
        ("1e100", "too large"),
        ("1E", "too large"),  # 10**18 cores is 10**21 millicores
        (None, "invalid"),
        (True, "invalid"),
    ],
    ids=lambda v: repr(v),
)
def test_rejects_malformed_negative_and_absurd(value, why):
    with pytest.raises(InvalidObjectError) as exc:
        canonical_quantity("cpu", value, "spec.containers[0].resources.requests.cpu")
    assert exc.value.path == "spec.containers[0].resources.requests.cpu"
    assert why in exc.value.message
    assert str(exc.value).startswith("spec.containers[0].resources.requests.cpu: ")


def test_resource_list_names_the_entry_path():
    assert parse_resource_list({"cpu": "250m", "memory": "1Gi", "nvidia.com/gpu": 1}, "status.allocatable") == {
        "cpu": 250, "memory": GI, "nvidia.com/gpu": 1}
    assert parse_resource_list(None) == {}
    with pytest.raises(InvalidObjectError) as exc:
        parse_resource_list({"cpu": "1", "memory": "lots"}, "spec.overhead")
    assert exc.value.path == "spec.overhead.memory"
    with pytest.raises(InvalidObjectError) as exc:
        parse_resource_list(["cpu"], "spec.overhead")
    assert exc.value.path == "spec.overhead"


@pytest.mark.parametrize(
    "name, value, text",
    [("cpu", 1500, "1500m"), ("cpu", 2000, "2"), ("memory", GI, "1Gi"), ("memory", 3 * 2**20, "3Mi"),
     ("memory", 1000, "1000"), ("pods", 110, "110")],
    ids=lambda v: str(v),
)
def test_format_round_trips(name, value, text):
    assert format_quantity(name, value) == text
    assert canonical_quantity(name, text) == value


#: quantities of apimachinery's grammar: sign, digits with an optional fraction, then a suffix
_quantities = st.builds(
    lambda sign, whole, frac, suffix: f"{sign}{whole}{frac}{suffix}",
    st.sampled_from(["", "+"]), st.from_regex(r"[0-9]{1,6}", fullmatch=True),
    st.sampled_from(["", ".", ".5", ".125", ".0001"]),
    st.sampled_from(["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E",
                     "e3", "E-2", "e+1", "e0"]))


@given(_quantities)
def test_exact_value_is_the_kubernetes_clients(text):
    """The core's own parse of a quantity of the grammar gives the kubernetes client's
    ``parse_quantity`` value (the core does not import the client)."""
    assert _decimal(text) == parse_quantity(text)
