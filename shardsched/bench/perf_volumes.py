"""scheduler_perf's volume options for ``bench perf`` (`shardsched.bench.perf`), with upstream's
semantics (``scheduler_perf.go`` and ``test/utils``' runners):

- ``createPods`` with ``persistentVolumeTemplatePath`` and ``persistentVolumeClaimTemplatePath``
  (upstream's ``CreatePodWithPersistentVolume`` with ``bindVolume``): pod ``i`` of the op gets the
  claim ``pvc-<i>`` of the op's namespace (the claim template, ``volumeName`` set, phase Bound) and
  the PersistentVolume ``<namespace>-vol-<i>`` (the PV template; a CSI PV's ``volumeHandle`` is its
  name, an AWS EBS PV's ``volumeID`` is ``vol-<i>``; ``claimRef`` to the claim, phase Bound); the
  pod's volumes are replaced by one volume ``vol`` using the claim. The claims are bound before the
  pods exist, so VolumeBinding checks the PVs' node affinity, NodeVolumeLimits counts them and
  nothing is reserved in the ledger for them;
- ``createNodes`` with ``nodeAllocatableStrategy`` (upstream's ``NodeAllocatableStrategy``): its
  ``nodeAllocatable`` quantities set in each node's capacity and allocatable, and a CSINode named
  after each node with ``csiNodeAllocatable``'s drivers (``nodeID`` the node's name, the
  ``allocatable.count``) and ``migratedPlugins`` in ``storage.alpha.kubernetes.io/migrated-plugins``.

The storage objects are created in the simulated cluster with the nodes, before any pod
(`RunOptions.storage`), and the init pods are placed with them (`catalog_of`).
"""

from __future__ import annotations

from typing import Any, Iterable

from shardsched.api.volumes import (BOUND_PHASE, CSI_NODE, MIGRATED_PLUGINS_ANNOTATION, PV, PVC, VolumeCatalog,
                                    parse_volume_object)
from shardsched.errors import InvalidObjectError

PV_TEMPLATE = "persistentVolumeTemplatePath"
PVC_TEMPLATE = "persistentVolumeClaimTemplatePath"
NODE_ALLOCATABLE = "nodeAllocatableStrategy"
_STRATEGY_KEYS = {"nodeAllocatable", "csiNodeAllocatable", "migratedPlugins"}
_DRIVER_KEYS = {"count"}


def strategy_problems(strategy: Any, where: str) -> list[str]:
    """Why a ``nodeAllocatableStrategy`` cannot be used (each names the field and ``where``, the
    file); empty when it can."""
    if not isinstance(strategy, dict):
        return [f"createNodes {NODE_ALLOCATABLE} must be a mapping ({where})"]
    out = [f"createNodes {NODE_ALLOCATABLE}.{k} is not supported by this runner ({where})"
           for k in sorted(set(strategy) - _STRATEGY_KEYS)]
    alloc = strategy.get("nodeAllocatable") or {}
    if not isinstance(alloc, dict):
        out.append(f"createNodes {NODE_ALLOCATABLE}.nodeAllocatable must be a mapping ({where})")
    drivers = strategy.get("csiNodeAllocatable") or {}
    if not isinstance(drivers, dict):
        out.append(f"createNodes {NODE_ALLOCATABLE}.csiNodeAllocatable must be a mapping ({where})")
        drivers = {}
    for name, res in drivers.items():
        field = f"{NODE_ALLOCATABLE}.csiNodeAllocatable.{name}"
        if not isinstance(res, dict):
            out.append(f"createNodes {field} must be a mapping ({where})")
            continue
        out += [f"createNodes {field}.{k} is not supported by this runner ({where})" for k in sorted(set(res) - _DRIVER_KEYS)]
        if "count" in res and (not isinstance(res["count"], int) or isinstance(res["count"], bool)):
            out.append(f"createNodes {field}.count must be an integer ({where})")
    plugins = strategy.get("migratedPlugins") or []
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        out.append(f"createNodes {NODE_ALLOCATABLE}.migratedPlugins must be a list of plugin names ({where})")
    return out


def apply_strategy(node: dict, strategy: dict) -> dict | None:
    """Set the strategy's ``nodeAllocatable`` on the node (capacity and allocatable); returns the
    node's CSINode, or None when the strategy names no driver and no migrated plugin (upstream
    creates none then)."""
    status = node.setdefault("status", {})
    for key in ("capacity", "allocatable"):
        status[key] = {**(status.get(key) or {}), **{k: str(v) for k, v in (strategy.get("nodeAllocatable") or {}).items()}}
    drivers = strategy.get("csiNodeAllocatable") or {}
    plugins = strategy.get("migratedPlugins") or []
    if not drivers and not plugins:
        return None
    name = node["metadata"]["name"]
    meta: dict[str, Any] = {"name": name}
    if plugins:
        meta["annotations"] = {MIGRATED_PLUGINS_ANNOTATION: ",".join(plugins)}
    specs = []
    for driver, res in drivers.items():
        entry: dict[str, Any] = {"name": driver, "nodeID": name}
        if isinstance(res, dict) and "count" in res:
            entry["allocatable"] = {"count": res["count"]}
        specs.append(entry)
    return {"apiVersion": "storage.k8s.io/v1", "kind": CSI_NODE, "metadata": meta, "spec": {"drivers": specs}}


def template_problems(pv: dict, pvc: dict, where: str) -> list[str]:
    """Why a PV and a claim template cannot be used (the wrong kind), naming ``where``."""
    out = []
    if pv.get("kind") != PV:
        out.append(f"createPods {PV_TEMPLATE} is a {pv.get('kind')}, not a {PV} ({where})")
    if pvc.get("kind") != PVC:
        out.append(f"createPods {PVC_TEMPLATE} is a {pvc.get('kind')}, not a {PVC} ({where})")
    return out


def bind_claim(pod: dict, pv: dict, pvc: dict, namespace: str, index: int) -> None:
    """Make ``pv`` and ``pvc`` (fresh copies of the templates) pod ``index``'s bound pair and give
    the pod the claim (module docstring)."""
    claim = f"pvc-{index}"
    volume_id = f"vol-{index}"
    name = f"{namespace}-{volume_id}"
    pv.setdefault("metadata", {})["name"] = name
    pv["metadata"].pop("generateName", None)
    spec = pv.setdefault("spec", {})
    if isinstance(spec.get("csi"), dict):
        spec["csi"]["volumeHandle"] = name
    elif isinstance(spec.get("awsElasticBlockStore"), dict):
        spec["awsElasticBlockStore"]["volumeID"] = volume_id
    spec["claimRef"] = {"kind": PVC, "apiVersion": "v1", "namespace": namespace, "name": claim}
    pv["status"] = {"phase": BOUND_PHASE}
    meta = pvc.setdefault("metadata", {})
    meta.pop("generateName", None)
    meta.update(name=claim, namespace=namespace)
    pvc.setdefault("spec", {})["volumeName"] = name
    pvc["status"] = {"phase": BOUND_PHASE}
    pod.setdefault("spec", {})["volumes"] = [{"name": "vol", "persistentVolumeClaim": {"claimName": claim}}]


def catalog_of(objs: Iterable[dict]) -> VolumeCatalog:
    """The storage objects as the decision path's `VolumeCatalog`.

    Raises:
        InvalidObjectError: an object that does not parse (the message names the field).
    """
    cat = VolumeCatalog()
    for obj in objs:
        try:
            cat.put(parse_volume_object(obj["kind"], obj))
        except InvalidObjectError as e:
            raise InvalidObjectError(f'{obj["kind"]} "{obj["metadata"].get("name")}": {e}') from None
    return cat
