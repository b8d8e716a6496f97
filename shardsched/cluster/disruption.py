"""PodDisruptionBudgets as the coordinator takes them in: a backend's ``list_pdbs`` and its watch
events of kind `PDB`, parsed into `PodDisruptionBudget` views (what DefaultPreemption reads), as
nodes, pods and namespaces are parsed at the coordinator's intake."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from shardsched.api.disruption import PodDisruptionBudget
from shardsched.cluster.watch import DELETED
from shardsched.errors import InvalidObjectError

log = logging.getLogger(__name__)


def apply_pdb_events(pdbs: dict[str, PodDisruptionBudget], events: Iterable[tuple[str, Mapping[str, Any]]]) -> int:
    """Apply PDB changes to ``pdbs`` (``namespace/name`` -> view), in order: ADDED and MODIFIED
    parse the object (`PodDisruptionBudget.from_object`), DELETED drops it. A list is its objects
    as ADDED events.

    A budget that cannot be parsed (a malformed selector or status) is logged with its name and
    the field, and dropped (a budget nobody can read protects no pod, as upstream skips a PDB
    whose selector fails to convert); it never raises.

    Returns: how many events changed ``pdbs``.
    """
    changed = 0
    for typ, obj in events:
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        if not isinstance(meta, Mapping) or not meta.get("name"):
            log.error("PodDisruptionBudget without metadata.name ignored")
            continue
        key = f"{meta.get('namespace') or 'default'}/{meta['name']}"
        if typ == DELETED:
            changed += pdbs.pop(key, None) is not None
            continue
        try:
            view = PodDisruptionBudget.from_object(obj)
        except InvalidObjectError as e:
            log.error("PodDisruptionBudget %s ignored: %s", key, e)
            changed += pdbs.pop(key, None) is not None
            continue
        if pdbs.get(key) != view:
            pdbs[key] = view
            changed += 1
    return changed
