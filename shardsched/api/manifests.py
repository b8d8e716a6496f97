"""Reading Kubernetes manifests: YAML or JSON files, multi-document, ``kind: List`` allowed.

Files are decoded as kubectl decodes them (UTF-8, or UTF-16/UTF-32 by byte order mark) and YAML
is parsed with libyaml (`load_yaml_documents`). Each object is read as the API server would take
it on create (an object without ``kind`` is an error, a ``null`` quantity reads as 0):
schema-checked against the Kubernetes OpenAPI schema (strict: unknown fields are errors) with
the ``kubernetes-validate`` package; a ``metadata.generateName`` without a name gets a generated name; names and, for Pods,
resources are checked with the API server's rules (`shardsched.api.validation`); then the objects
are parsed into PodInfo / NodeInfo. Errors never stop the reading: each bad object becomes one
`ManifestError` per problem, naming the file, the document (``file.yaml#2`` is the second
document, counted from 1; ``file.yaml#1.items[3]`` an item of a ``kind: List``) and the field, and
the rest is still read.
"""

from __future__ import annotations

import codecs
import copy
import functools
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import kubernetes_validate
import kubernetes_validate.utils
import numpy as np
import yaml

from shardsched.api.disruption import PodDisruptionBudget
from shardsched.api.objects import NodeInfo, PodInfo
from shardsched.api.podaffinity import namespace_labels_of
from shardsched.api.podgroup import API_VERSION as POD_GROUP_API_VERSION, PodGroup
from shardsched.api.workloads import SPREAD_SELECTOR_KINDS, WorkloadSelector, workload_selector_of
from shardsched.api.volumes import API_VERSIONS as VOLUME_API_VERSIONS
from shardsched.api.volumes import KINDS as VOLUME_KINDS
from shardsched.api.volumes import NAMESPACED, PV, PVC, VolumeCatalog, parse_volume_object
from shardsched.api.validation import (generate_name, generate_name_problem, labels_problems, name_problem,
                                       pod_problems)
from shardsched.errors import InvalidObjectError

#: Kubernetes version whose OpenAPI schema objects are checked against.
SCHEMA_VERSION = "1.35"
SUPPORTED_KINDS = ("Node", "Pod", "PriorityClass", "Namespace", "PodDisruptionBudget", "PodGroup") \
    + SPREAD_SELECTOR_KINDS + VOLUME_KINDS
_DEFAULT_API_VERSION = {"Node": "v1", "Pod": "v1", "PriorityClass": "scheduling.k8s.io/v1", "Namespace": "v1",
                        "PodDisruptionBudget": "policy/v1", "PodGroup": POD_GROUP_API_VERSION, "Service": "v1",
                        "ReplicationController": "v1", "ReplicaSet": "apps/v1", "StatefulSet": "apps/v1",
                        **VOLUME_API_VERSIONS}
#: Names the API server tries for one generateName before it gives up (RetryGenerateName).
_GENERATE_NAME_ATTEMPTS = 8


@dataclass(frozen=True)
class ManifestError:
    """One problem in the input: where (file#document) and what (with the field path).

    ``seq`` is the object's position in the input (files in the order given, then documents), so
    problems found in later passes (priorities, parsing) can be reported in input order.
    """

    where: str
    message: str
    seq: int = field(default=0, compare=False)

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass
class Manifests:
    """Objects read from manifest files, in input order.

    Attributes:
        nodes: valid Node objects (raw dicts) with their location.
        pods: valid Pod objects (raw dicts) with their location.
        priority_classes: PriorityClass name -> value.
        preemption_policies: PriorityClass name -> its ``preemptionPolicy`` (default
            PreemptLowerPriority).
        default_priority: value of the globalDefault PriorityClass, else 0.
        pdbs: valid PodDisruptionBudget objects (raw dicts) with their location.
        spread_selectors: valid Services, ReplicationControllers, ReplicaSets and StatefulSets (raw
            dicts) with their location: their selectors are PodTopologySpread's default selectors.
        pod_groups: PodGroup objects (``scheduling.x-k8s.io/v1alpha1``, raw dicts) with their
            location; `parse_pod_groups` checks them.
        volumes: valid storage objects (`shardsched.api.volumes.KINDS`: PersistentVolumes, claims,
            StorageClasses, CSINodes, CSIStorageCapacities; raw dicts) with their location, in input order.
        namespace_labels: Namespace name -> its labels, with ``kubernetes.io/metadata.name`` set as
            the API server sets it (read by pod affinity's ``namespaceSelector``).
        errors: invalid documents (they are not in nodes/pods); `in_input_order` sorts them.
        warnings: ignored kinds, files without objects and the like.
        seq: location -> position in the input, for the `ManifestError.seq` of later problems.
    """

    nodes: list[tuple[str, dict]] = field(default_factory=list)
    pods: list[tuple[str, dict]] = field(default_factory=list)
    priority_classes: dict[str, int] = field(default_factory=dict)
    preemption_policies: dict[str, str] = field(default_factory=dict)
    default_priority: int = 0
    pdbs: list[tuple[str, dict]] = field(default_factory=list)
    spread_selectors: list[tuple[str, dict]] = field(default_factory=list)
    pod_groups: list[tuple[str, dict]] = field(default_factory=list)
    volumes: list[tuple[str, dict]] = field(default_factory=list)
    namespace_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    errors: list[ManifestError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seq: dict[str, int] = field(default_factory=dict)

    def error(self, where: str, message: str) -> None:
        """Record a problem of the object at ``where`` (a location `read_manifests` yielded)."""
        self.errors.append(ManifestError(where, message, self.seq.get(where, len(self.seq))))

    def in_input_order(self) -> list[ManifestError]:
        """``errors`` sorted by the position of their object in the input (stable: the problems of
        one object keep the order they were found in)."""
        return sorted(self.errors, key=lambda e: e.seq)


class UnreadableText(ValueError):
    """A manifest file whose bytes are not text in an encoding kubectl reads (`decode_manifest`)."""


#: byte order marks kubectl honours (UTF-8's is dropped; UTF-32's before UTF-16's, which they start with)
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def decode_manifest(data: bytes) -> str:
    """The text of a manifest file as kubectl reads it: UTF-8, or UTF-16/UTF-32 when the file
    starts with their byte order mark (kubectl's reader overrides the encoding by BOM).

    Raises:
        UnreadableText: invalid UTF-8 (say Latin-1), NUL bytes (UTF-16 without a BOM), or invalid
            text in the encoding its BOM names; the message gives the first bad byte's offset.
    """
    encoding = next((enc for bom, enc in _BOMS if data.startswith(bom)), "utf-8")
    hint = "; save it as UTF-8 (kubectl reads UTF-8, or UTF-16 with a byte order mark)"
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as e:
        bad = data[e.start:e.start + 1].hex()
        raise UnreadableText(f"not {encoding.upper().removesuffix('-SIG')} text (byte 0x{bad} at offset "
                             f"{e.start}){hint if encoding == 'utf-8' else ''}") from None
    if "\x00" in text:
        raise UnreadableText(f"not text: it holds NUL bytes (UTF-16 or UTF-32 without a byte order mark?){hint}")
    return text


#: Nesting of collections up to which libyaml's loader is used (it recurses in C, and a deep enough
#: document overflows the stack); past it the pure-Python loader reads the file and says when it
#: is nested too deeply. Kubernetes objects nest a few dozen levels.
_FAST_YAML_MAX_DEPTH = 1000
_BRACKETS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[{]}"))


def _shallow(text: str) -> bool:
    """Whether ``text`` surely nests at most `_FAST_YAML_MAX_DEPTH` collections: the deepest
    bracket nesting (brackets in strings and comments count too) plus two levels per character of
    the longest line prefix of indentation and block indicators."""
    brackets = text.encode("utf-8", "surrogatepass").translate(_BRACKETS, _NOT_BRACKETS)
    depth = int(np.cumsum(np.frombuffer(brackets, dtype=np.int8), dtype=np.int64).max()) if brackets else 0
    budget = (_FAST_YAML_MAX_DEPTH - depth) // 2
    return budget > 0 and re.search(r"(?m)^[ \t?:-]{%d}" % budget, text) is None


def load_yaml_documents(text: str) -> list[Any]:
    """Every document of a YAML stream, as ``yaml.safe_load_all`` gives them, read with libyaml's
    loader (``yaml.CSafeLoader``: the same safe constructors, about ten times faster) unless the
    text may nest deeper than it can take (`_shallow`).

    Raises:
        yaml.YAMLError: a syntax error (``problem_mark`` gives the line).
        RecursionError: nested deeper than the pure-Python loader's stack.
    """
    loader = yaml.CSafeLoader if _shallow(text) else yaml.SafeLoader
    return list(yaml.load_all(text, Loader=loader))


def _documents(path: Path) -> Iterator[tuple[str, Any]]:
    """Yield (location, object) for every object in the file, unfolding ``kind: List``; documents
    are numbered from 1 in the location."""
    text = decode_manifest(path.read_bytes())
    if path.suffix == ".json":
        loaded = json.loads(text)
        docs = loaded if isinstance(loaded, list) else [loaded]
    else:
        docs = load_yaml_documents(text)
    for i, doc in enumerate(docs, start=1):
        where = f"{path}#{i}"
        if doc is None:
            continue
        if isinstance(doc, dict) and doc.get("kind") == "List":
            items = doc.get("items") or []
            if not isinstance(items, list):
                yield where, ValueError("items: must be a list")
                continue
            for j, item in enumerate(items):
                yield f"{where}.items[{j}]", item
        else:
            yield where, doc


# kubernetes-validate reads and parses its schema files (the definitions are megabytes of JSON) on
# every call, 0.1-0.2 s per object; a manifest whose objects all differ (a StatefulSet's claims and
# pods, one PersistentVolume per disk) spent minutes there. The files never change: read each once.
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=64)(kubernetes_validate.utils.schema_contents)
kubernetes_validate.utils.all_versions = functools.lru_cache(maxsize=1)(kubernetes_validate.utils.all_versions)


class _SchemaCheck:
    """kubernetes-validate with a cache keyed by object content minus metadata identity, so many
    pods stamped from one template are checked once."""

    def __init__(self) -> None:
        self._seen: dict[str, str | None] = {}

    def __call__(self, obj: dict) -> str | None:
        meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in ("name", "uid", "creationTimestamp")}
        key = json.dumps({**obj, "metadata": meta}, sort_keys=True, default=str)
        if key not in self._seen:
            try:
                kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
                self._seen[key] = None
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in e.path).replace(".[", "[")
                self._seen[key] = f"{path}: {e.message}" if path else e.message
        return self._seen[key]


def _resource_lists(kind: str, obj: dict) -> Iterator[tuple[str, dict]]:
    """(field path, map) of every resource list of a Pod or Node that holds a value."""
    def maps(parent: Any, path: str, fields: tuple[str, ...]) -> Iterator[tuple[str, dict]]:
        for f in fields:
            value = parent.get(f) if isinstance(parent, dict) else None
            if isinstance(value, dict):
                yield f"{path}.{f}", value

    if kind == "Node":
        yield from maps(obj.get("status"), "status", ("capacity", "allocatable"))
        return
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    for containers_field in ("initContainers", "containers"):
        containers = spec.get(containers_field)
        for i, c in enumerate(containers if isinstance(containers, list) else ()):
            if isinstance(c, dict):
                yield from maps(c.get("resources"), f"spec.{containers_field}[{i}].resources", ("requests", "limits"))
    yield from maps(spec, "spec", ("overhead",))
    yield from maps(spec.get("resources"), "spec.resources", ("requests", "limits"))


def _null_quantities(kind: str, obj: dict) -> tuple[dict, list[str]]:
    """``obj`` with each ``null`` quantity of its resource lists set to ``"0"``, as the API server
    decodes one (a null Quantity is zero), and the paths of those values. ``obj`` itself is not
    changed (a copy is made when there is one)."""
    paths = [f"{path}.{name}" for path, items in _resource_lists(kind, obj) for name, v in items.items() if v is None]
    if not paths:
        return obj, paths
    obj = copy.deepcopy(obj)
    for _, items in _resource_lists(kind, obj):
        items.update({name: "0" for name, v in items.items() if v is None})
    return obj, paths


def _named(obj: dict, taken: dict[str, str], key_of, rng: random.Random) -> tuple[dict | None, str]:
    """``obj`` with a name, or None and why it cannot have one. An object with a
    ``metadata.generateName`` and no name gets a generated one (a key not in ``taken`` if one of
    a few tries finds it), as the API server's ``BeforeCreate``; the name itself is checked later."""
    meta = obj.get("metadata") or {}
    name, prefix = meta.get("name"), meta.get("generateName")
    if name:
        return obj, ""
    if not prefix:
        return None, "metadata.name: name or generateName is required"
    problem = generate_name_problem(prefix)
    if problem:
        return None, f"metadata.generateName: names generated from it are invalid: {problem}"
    for _ in range(_GENERATE_NAME_ATTEMPTS):
        name = generate_name(prefix, rng)
        if key_of({**meta, "name": name}) not in taken:
            break
    return {**obj, "metadata": {**meta, "name": name}}, ""


def _problems(kind: str, obj: dict) -> list[tuple[str, str]]:
    """What the API server would refuse in a named object: everything `pod_problems` checks for a
    Pod; the name for the other kinds."""
    if kind == "Pod":
        return pod_problems(obj)
    problem = name_problem(obj["metadata"]["name"], label=kind == "Namespace")  # a namespace's: a DNS label
    return ([("metadata.name", problem)] if problem else []) + labels_problems(obj["metadata"].get("labels"),
                                                                              "metadata.labels")


def read_manifests(paths: list[str | Path], seed: int | None = 0) -> Manifests:
    """Read Node, Pod, PriorityClass, Namespace and PodDisruptionBudget objects, the Services,
    ReplicationControllers, ReplicaSets and StatefulSets whose selectors default spreading reads,
    and storage objects (`shardsched.api.volumes.KINDS`) from files (other kinds are ignored with a
    warning).

    Args:
        paths: manifest files, read in this order.
        seed: seeds the names generated for ``metadata.generateName`` (``random.Random(seed)``,
            drawn in input order), so the same input gives the same names; None for fresh ones.

    Never raises for bad content: unreadable files (an encoding kubectl does not read
    included), YAML/JSON syntax errors, objects without a kind, schema violations,
    objects without a name or generateName, invalid names, resources the API server would refuse
    (`shardsched.api.validation.pod_problems`), invalid quantities and duplicate names become
    entries of ``errors``; a file without objects is a warning.
    """
    out = Manifests()
    check = _SchemaCheck()
    rng = random.Random(seed)
    seen: dict[str, dict[str, str]] = {kind: {} for kind in SUPPORTED_KINDS}
    namespaced = lambda meta: f"{meta.get('namespace') or 'default'}/{meta['name']}"  # noqa: E731
    keys = {"Pod": namespaced, "PodDisruptionBudget": namespaced, "PodGroup": namespaced,
            **{k: namespaced for k in (*SPREAD_SELECTOR_KINDS, *NAMESPACED)}}
    for raw_path in paths:
        path = Path(raw_path)
        out.seq.setdefault(str(path), len(out.seq))
        try:
            docs = list(_documents(path))
        except OSError as e:
            out.error(str(path), f"cannot read: {e.strerror or e}")
            continue
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{path}: line {mark.line + 1}" if mark else str(path)
            out.errors.append(ManifestError(where, f"invalid YAML: {getattr(e, 'problem', None) or e}", out.seq[str(path)]))
            continue
        except json.JSONDecodeError as e:
            out.errors.append(ManifestError(f"{path}: line {e.lineno}", f"invalid JSON: {e.msg}", out.seq[str(path)]))
            continue
        except RecursionError:  # nested deeper than the parser's stack (the API server refuses such bodies too)
            out.error(str(path), "nested too deeply to be read")
            continue
        except UnreadableText as e:
            out.error(str(path), f"cannot read: {e}")
            continue
        if not docs:
            out.warnings.append(f"{path}: the file holds no objects")
        for where, obj in docs:
            out.seq[where] = len(out.seq)
            if isinstance(obj, Exception):
                out.error(where, str(obj))
                continue
            if not isinstance(obj, dict):
                out.error(where, f"expected a Kubernetes object, got {type(obj).__name__}")
                continue
            kind = obj.get("kind")
            if kind is None or kind == "":  # the API server's decoder: "Object 'Kind' is missing"
                out.error(where, "object has no kind: every object needs apiVersion and kind (kind: Pod, Node, ...)")
                continue
            if kind not in SUPPORTED_KINDS:
                out.warnings.append(f"{where}: ignoring object of kind {kind!r} (only {', '.join(SUPPORTED_KINDS)} "
                                    "are used)")
                continue
            if not obj.get("apiVersion"):
                obj = {**obj, "apiVersion": _DEFAULT_API_VERSION[kind]}
            if kind in ("Pod", "Node"):
                obj, nulls = _null_quantities(kind, obj)
                out.warnings.extend(f"{where}: {path}: null is read as 0, as the API server reads a null quantity"
                                    for path in nulls)
            # a PodGroup is a custom resource: no built-in schema; `parse_pod_groups` checks it
            problem = None if kind == "PodGroup" else check(obj)
            if problem:
                out.error(where, f"invalid {kind}: {problem}")
                continue
            key_of = keys.get(kind, lambda meta: meta["name"])
            obj, unnamed = _named(obj, seen[kind], key_of, rng)
            if obj is None:
                out.error(where, f"invalid {kind}: {unnamed}")
                continue
            problems = _problems(kind, obj)
            if problems:
                for field_path, message in problems:
                    out.error(where, f"invalid {kind}: {field_path}: {message}")
                continue
            meta = obj["metadata"]
            key = key_of(meta)
            if key in seen[kind]:
                out.error(where, f"duplicate {kind} {key!r} (first at {seen[kind][key]}); this one is ignored")
                continue
            seen[kind][key] = where
            if kind == "PriorityClass":
                value = obj.get("value")
                out.priority_classes[key] = value
                out.preemption_policies[key] = obj.get("preemptionPolicy") or "PreemptLowerPriority"
                if obj.get("globalDefault"):
                    out.default_priority = value
            elif kind == "Namespace":
                out.namespace_labels[key] = namespace_labels_of(obj)[1]
            elif kind == "Node":
                out.nodes.append((where, obj))
            elif kind == "PodDisruptionBudget":
                out.pdbs.append((where, obj))
            elif kind in SPREAD_SELECTOR_KINDS:
                out.spread_selectors.append((where, obj))
            elif kind == "PodGroup":
                out.pod_groups.append((where, obj))
            elif kind in VOLUME_KINDS:
                out.volumes.append((where, obj))
            else:
                out.pods.append((where, obj))
    return out


def _parse(m: Manifests, objects: list[tuple[str, dict]], kind: str, from_object) -> list:
    """``from_object`` of each object; an invalid one is appended to ``m.errors`` as ``invalid <kind>``."""
    out = []
    for where, obj in objects:
        try:
            out.append(from_object(obj))
        except InvalidObjectError as e:
            m.error(where, f"invalid {kind}: {e}")
    return out


def parse_nodes(m: Manifests) -> list[NodeInfo]:
    """NodeInfo for each valid node; invalid ones are appended to ``m.errors``."""
    return _parse(m, m.nodes, "Node", NodeInfo.from_object)


def parse_pdbs(m: Manifests) -> list[PodDisruptionBudget]:
    """PodDisruptionBudget views of the valid PDBs; invalid ones (a malformed selector or status)
    are appended to ``m.errors``."""
    return _parse(m, m.pdbs, "PodDisruptionBudget", PodDisruptionBudget.from_object)


def parse_spread_selectors(m: Manifests) -> list[WorkloadSelector]:
    """The selectors of the valid Services, ReplicationControllers, ReplicaSets and StatefulSets;
    invalid ones (a malformed ``spec.selector``) are appended to ``m.errors``."""
    return [w for kind in SPREAD_SELECTOR_KINDS
            for w in _parse(m, [(where, o) for where, o in m.spread_selectors if o["kind"] == kind], kind,
                            workload_selector_of)]


def parse_pod_groups(m: Manifests) -> list[PodGroup]:
    """PodGroup views of the valid groups; an invalid one (``spec.minMember`` below 1, which its
    CRD refuses, a malformed quantity) is appended to ``m.errors``."""
    return _parse(m, [(w, {**o, "metadata": {"namespace": "default", **o["metadata"]}}) for w, o in m.pod_groups],
                  "PodGroup", PodGroup.from_object)


def parse_volumes(m: Manifests) -> VolumeCatalog:
    """The `VolumeCatalog` of the valid storage objects; an invalid one is appended to ``m.errors``
    (an invalid PersistentVolume is also kept in ``invalid_pvs``: a claim bound to it fits no node).
    Claims without ``storageClassName`` get the default StorageClass, as the DefaultStorageClass
    admission gives it on create."""
    catalog = VolumeCatalog()
    claims = []
    for where, obj in m.volumes:
        kind = obj["kind"]
        try:
            view = parse_volume_object(kind, obj)
        except InvalidObjectError as e:
            m.error(where, f"invalid {kind}: {e}")
            if kind == PV:
                catalog.put_invalid_pv(obj["metadata"]["name"], str(e))
            continue
        if kind == PVC:
            claims.append(view)
        else:
            catalog.put(view)
    default = catalog.default_class()
    for claim in claims:
        catalog.put(claim.with_default_class(default))
    return catalog


def parse_pods(m: Manifests) -> list[tuple[str, PodInfo]]:
    """(location, PodInfo) for each valid pod, priorities resolved; invalid ones go to ``m.errors``."""
    pods = []
    for where, obj in m.pods:
        try:
            pods.append((where, PodInfo.from_object(obj, m.priority_classes, m.default_priority, m.preemption_policies)))
        except InvalidObjectError as e:
            m.error(where, f"invalid Pod: {e}")
    return pods
