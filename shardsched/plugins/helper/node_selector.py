"""Vectorized NodeSelector matching over a NodeTable (upstream component-helpers nodeaffinity).

Rules: terms of a NodeSelector are ORed; the requirements inside a term are ANDed; an empty term
matches no node; ``In``/``NotIn`` compare the label value with a set (``NotIn`` and
``DoesNotExist`` match nodes without the label); ``Gt``/``Lt`` compare integers and never match a
node whose label is missing or not an integer (read as Go's ``strconv.ParseInt(v, 10, 64)``:
no ``_``, no spaces, within int64); ``matchFields`` supports ``metadata.name``.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from shardsched.api.objects import Requirement, SelectorTerm, parse_int64
from shardsched.cache.node_table import NodeTable
from shardsched.framework.interface import Index, index_len


def _label_in(table: NodeTable, key: str, values: Iterable[str], idx: Index) -> np.ndarray:
    col = table.label_codes.get(key)
    size = index_len(idx, table.n)
    if col is None:
        return np.zeros(size, bool)
    codes = [table.label_code(key, v) for v in values]
    codes = [c for c in codes if c >= 0]
    sub = col[: table.n][idx]
    if not codes:
        return np.zeros(size, bool)
    if len(codes) == 1:
        return sub == codes[0]
    return np.isin(sub, codes)


def _label_numeric(table: NodeTable, key: str, idx: Index) -> tuple[np.ndarray, np.ndarray]:
    """(value, ok) arrays over idx: the label parsed as an integer, ok False if missing/not an int."""
    col = table.label_codes.get(key)
    size = index_len(idx, table.n)
    if col is None:
        return np.zeros(size, np.int64), np.zeros(size, bool)
    vocab = table.label_vocab[key]
    lookup = np.zeros(len(vocab) + 1, np.int64)
    valid = np.zeros(len(vocab) + 1, bool)
    for value, code in vocab.items():
        number = parse_int64(value)  # as Go's strconv.ParseInt(value, 10, 64)
        if number is not None:
            lookup[code] = number
            valid[code] = True
    sub = col[: table.n][idx]
    safe = np.where(sub >= 0, sub, len(vocab))
    return lookup[safe], valid[safe]


def requirement_mask(table: NodeTable, req: Requirement, idx: Index) -> np.ndarray:
    """bool array over idx: nodes whose labels satisfy one label requirement."""
    key, op, values = req
    if op == "In":
        return _label_in(table, key, values, idx)
    if op == "NotIn":
        return ~_label_in(table, key, values, idx)
    col = table.label_codes.get(key)
    size = index_len(idx, table.n)
    if op in ("Exists", "DoesNotExist"):
        present = np.zeros(size, bool) if col is None else col[: table.n][idx] >= 0
        return present if op == "Exists" else ~present
    number, ok = _label_numeric(table, key, idx)
    bound = parse_int64(values[0])
    return ok & (number > bound if op == "Gt" else number < bound)


def field_mask(table: NodeTable, req: Requirement, idx: Index) -> np.ndarray:
    """bool array over idx for a ``metadata.name`` field requirement (In / NotIn)."""
    _, op, values = req
    hit = np.zeros(table.n, bool)
    for name in values:
        slot = table.index.get(name)
        if slot is not None:
            hit[slot] = True
    sub = hit[idx]
    return sub if op == "In" else ~sub


def term_mask(table: NodeTable, term: SelectorTerm, idx: Index) -> np.ndarray:
    """bool array over idx: nodes matching every requirement of the term (an empty term: none)."""
    size = index_len(idx, table.n)
    if term.empty:
        return np.zeros(size, bool)
    mask = np.ones(size, bool)
    for req in term.match_expressions:
        mask &= requirement_mask(table, req, idx)
    for req in term.match_fields:
        mask &= field_mask(table, req, idx)
    return mask


def terms_mask(table: NodeTable, terms: Iterable[SelectorTerm], idx: Index) -> np.ndarray:
    """bool array over idx: nodes matching at least one term (no terms: no node)."""
    mask = np.zeros(index_len(idx, table.n), bool)
    for term in terms:
        mask |= term_mask(table, term, idx)
    return mask


def selector_mask(table: NodeTable, selector: Mapping[str, str], idx: Index) -> np.ndarray:
    """bool array over idx: nodes carrying every label of a ``nodeSelector`` map."""
    mask = np.ones(index_len(idx, table.n), bool)
    for key, value in selector.items():
        mask &= _label_in(table, key, (value,), idx)
    return mask
