"""PersistentVolumes, claims, StorageClasses, CSINodes and CSIStorageCapacities as the scheduler
takes them in: a backend's ``list_storage`` and its watch events of `STORAGE_KINDS`, parsed into
the `StorageChanges` a `shardsched.api.volumes.VolumeCatalog` applies (`VolumeCatalog.apply`), as
Services and workloads are (`shardsched.cluster.spread`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardsched.api.volumes import PV, object_key, parse_volume_object
from shardsched.cluster.watch import DELETED
from shardsched.errors import InvalidObjectError

log = logging.getLogger(__name__)


@dataclass
class StorageChanges:
    """Storage objects created or changed, deleted, and PVs that could not be parsed.

    Attributes:
        upserts: the views (`shardsched.api.volumes` dataclasses) of the objects created or changed.
        removed: (kind, key) of the objects deleted, and of those (not PVs) that could not be parsed:
            what they said is no longer known.
        invalid_pvs: PV name -> the parse error (a claim bound to one fits no node, as kube's node
            affinity check fails for it).
    """

    upserts: list[Any] = field(default_factory=list)
    removed: list[tuple[str, str]] = field(default_factory=list)
    invalid_pvs: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.upserts or self.removed or self.invalid_pvs)


def storage_changes(events: Iterable[tuple[str, str, Mapping[str, Any]]]) -> StorageChanges:
    """The `StorageChanges` of watch events of the storage kinds as (type, kind, object), in order
    (a list is its objects as ADDED events); only an object's last event counts. An
    object that cannot be parsed is logged with its kind, key and field, never raised; one without
    ``metadata.name`` is logged and skipped."""
    last: dict[tuple[str, str], tuple[str, Any]] = {}  # (kind, key) -> ("put" view | "gone" | "invalid" error)
    for typ, kind, obj in events:
        key = object_key(kind, obj) if isinstance(obj, Mapping) else None
        if key is None:
            log.error("%s without metadata.name ignored", kind or "storage object")
            continue
        last.pop((kind, key), None)  # keep the order of the last events
        if typ == DELETED:
            last[(kind, key)] = ("gone", None)
            continue
        try:
            last[(kind, key)] = ("put", parse_volume_object(kind, obj))
        except InvalidObjectError as e:
            log.error("%s %s ignored: %s", kind, key, e)
            last[(kind, key)] = ("invalid", str(e)) if kind == PV else ("gone", None)
        except KeyError:
            log.error("%s %s ignored: not a storage kind", kind, key)
    out = StorageChanges()
    for (kind, key), (what, value) in last.items():
        if what == "put":
            out.upserts.append(value)
        elif what == "invalid":
            out.invalid_pvs[key] = value
        else:
            out.removed.append((kind, key))
    return out
