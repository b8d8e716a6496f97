"""Services, ReplicationControllers, ReplicaSets and StatefulSets as the scheduler takes them in: a
backend's ``list_spread_selectors`` and its watch events of those kinds, parsed into the
`WorkloadSelector` changes a `NodeTable` applies (`NodeTable.set_spread_selectors`), as
PodDisruptionBudgets are (`shardsched.cluster.disruption`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from shardsched.api.workloads import WorkloadKey, WorkloadSelector, workload_selector_of
from shardsched.cluster.watch import DELETED
from shardsched.errors import InvalidObjectError

log = logging.getLogger(__name__)


def spread_selector_changes(events: Iterable[tuple[str, Mapping[str, Any]]]
                            ) -> tuple[list[WorkloadSelector], list[WorkloadKey]]:
    """(objects created or changed, keys deleted) from watch events in order (a list is its
    objects as ADDED events); only an object's last event counts. An object whose selector cannot
    be parsed is logged with its kind, name and field and dropped (as if deleted: what it
    selected is no longer known), never raised.
    """
    last: dict[WorkloadKey, WorkloadSelector | None] = {}
    for typ, obj in events:
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        if not isinstance(meta, Mapping) or not meta.get("name"):
            log.error("%s without metadata.name ignored", obj.get("kind") if isinstance(obj, Mapping) else "object")
            continue
        key = (str(obj.get("kind")), str(meta.get("namespace") or "default"), str(meta["name"]))
        if typ == DELETED:
            last[key] = None
            continue
        try:
            last[key] = workload_selector_of(obj)
        except InvalidObjectError as e:
            log.error("%s %s/%s ignored: %s", key[0], key[1], key[2], e)
            last[key] = None
    return [w for w in last.values() if w is not None], [k for k, w in last.items() if w is None]
