"""PodGroups as the scheduler takes them in: a backend's ``list_pod_groups`` and its watch events of
kind `PODGROUP`, parsed into `PodGroup` views (what Coscheduling reads), as PodDisruptionBudgets are
(`shardsched.cluster.disruption`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from shardsched.api.podgroup import PodGroup
from shardsched.cluster.watch import DELETED
from shardsched.errors import InvalidObjectError

log = logging.getLogger(__name__)


def apply_pod_group_events(groups: dict[str, PodGroup], invalid: dict[str, str],
                           events: Iterable[tuple[str, Mapping[str, Any]]]) -> int:
    """Apply PodGroup changes to ``groups`` (``namespace/name`` -> view), in order: ADDED and
    MODIFIED parse the object (`PodGroup.from_object`), DELETED drops it. A list is its objects as
    ADDED events.

    A group that cannot be parsed (``spec.minMember`` 0, a malformed quantity, ...) is logged with
    its name and the field and kept in ``invalid`` (key -> why), not in ``groups``: its pods are
    held, with that reason, rather than placed without their gang. It never raises.

    Returns: how many events changed ``groups`` or ``invalid``.
    """
    changed = 0
    for typ, obj in events:
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        if not isinstance(meta, Mapping) or not meta.get("name"):
            log.error("PodGroup without metadata.name ignored")
            continue
        key = f"{meta.get('namespace') or 'default'}/{meta['name']}"
        if typ == DELETED:
            changed += (groups.pop(key, None) is not None) | (invalid.pop(key, None) is not None)
            continue
        try:
            view = PodGroup.from_object(obj)
        except InvalidObjectError as e:
            log.error("PodGroup %s is invalid: %s", key, e)
            changed += (groups.pop(key, None) is not None) | (invalid.get(key) != str(e))
            invalid[key] = str(e)
            continue
        invalid.pop(key, None)
        if groups.get(key) != view:
            groups[key] = view
            changed += 1
    return changed
