"""Reading Kubernetes manifests: YAML or JSON files, multi-document, ``kind: List`` allowed.

Each object is schema-checked against the Kubernetes OpenAPI schema (strict: unknown fields are
errors) with the ``kubernetes-validate`` package, then parsed into PodInfo / NodeInfo. Errors never
stop the reading: each bad object becomes a `ManifestError` naming the file, the document index
(``file.yaml#2``, ``file.yaml#0.items[3]``) and the field, and the rest is still read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import kubernetes_validate
import yaml

from shardsched.api.objects import NodeInfo, PodInfo
from shardsched.errors import InvalidObjectError

#: Kubernetes version whose OpenAPI schema objects are checked against.
SCHEMA_VERSION = "1.35"
SUPPORTED_KINDS = ("Node", "Pod", "PriorityClass")
_DEFAULT_API_VERSION = {"Node": "v1", "Pod": "v1", "PriorityClass": "scheduling.k8s.io/v1"}


@dataclass(frozen=True)
class ManifestError:
    """One problem in the input: where (file#doc) and what (with the field path)."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass
class Manifests:
    """Objects read from manifest files, in input order.

    Attributes:
        nodes: valid Node objects (raw dicts) with their location.
        pods: valid Pod objects (raw dicts) with their location.
        priority_classes: PriorityClass name -> value.
        default_priority: value of the globalDefault PriorityClass, else 0.
        errors: invalid documents (they are not in nodes/pods).
        warnings: ignored kinds and the like.
    """

    nodes: list[tuple[str, dict]] = field(default_factory=list)
    pods: list[tuple[str, dict]] = field(default_factory=list)
    priority_classes: dict[str, int] = field(default_factory=dict)
    default_priority: int = 0
    errors: list[ManifestError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _documents(path: Path) -> Iterator[tuple[str, Any]]:
    """Yield (location, object) for every object in the file, unfolding ``kind: List``."""
    text = path.read_text()
    if path.suffix == ".json":
        loaded = json.loads(text)
        docs = loaded if isinstance(loaded, list) else [loaded]
    else:
        docs = list(yaml.safe_load_all(text))
    for i, doc in enumerate(docs):
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


def read_manifests(paths: list[str | Path]) -> Manifests:
    """Read Node, Pod and PriorityClass objects from files (other kinds are ignored with a warning).

    Never raises for bad content: unreadable files, YAML/JSON syntax errors, schema violations,
    invalid quantities and duplicate names become entries of ``errors``.
    """
    out = Manifests()
    check = _SchemaCheck()
    seen_pods: dict[str, str] = {}
    seen_nodes: dict[str, str] = {}
    for raw_path in paths:
        path = Path(raw_path)
        try:
            docs = list(_documents(path))
        except OSError as e:
            out.errors.append(ManifestError(str(path), f"cannot read: {e.strerror or e}"))
            continue
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{path}: line {mark.line + 1}" if mark else str(path)
            out.errors.append(ManifestError(where, f"invalid YAML: {getattr(e, 'problem', None) or e}"))
            continue
        except json.JSONDecodeError as e:
            out.errors.append(ManifestError(f"{path}: line {e.lineno}", f"invalid JSON: {e.msg}"))
            continue
        for where, obj in docs:
            if isinstance(obj, Exception):
                out.errors.append(ManifestError(where, str(obj)))
                continue
            if not isinstance(obj, dict):
                out.errors.append(ManifestError(where, f"expected a Kubernetes object, got {type(obj).__name__}"))
                continue
            kind = obj.get("kind")
            if kind not in SUPPORTED_KINDS:
                out.warnings.append(f"{where}: ignoring object of kind {kind!r} (only {', '.join(SUPPORTED_KINDS)} are used)")
                continue
            if not obj.get("apiVersion"):
                obj = {**obj, "apiVersion": _DEFAULT_API_VERSION[kind]}
            problem = check(obj)
            if problem:
                out.errors.append(ManifestError(where, f"invalid {kind}: {problem}"))
                continue
            meta = obj.get("metadata") or {}
            if kind == "PriorityClass":
                value = obj.get("value")
                out.priority_classes[meta["name"]] = value
                if obj.get("globalDefault"):
                    out.default_priority = value
            elif kind == "Node":
                name = meta["name"]
                if name in seen_nodes:
                    out.errors.append(ManifestError(where, f"duplicate Node {name!r} (first at {seen_nodes[name]}); this one is ignored"))
                    continue
                seen_nodes[name] = where
                out.nodes.append((where, obj))
            else:
                key = f"{meta.get('namespace') or 'default'}/{meta['name']}"
                if key in seen_pods:
                    out.errors.append(ManifestError(where, f"duplicate Pod {key!r} (first at {seen_pods[key]}); this one is ignored"))
                    continue
                seen_pods[key] = where
                out.pods.append((where, obj))
    return out


def parse_nodes(m: Manifests) -> list[NodeInfo]:
    """NodeInfo for each valid node; invalid ones are appended to ``m.errors``."""
    nodes = []
    for where, obj in m.nodes:
        try:
            nodes.append(NodeInfo.from_object(obj))
        except InvalidObjectError as e:
            m.errors.append(ManifestError(where, f"invalid Node: {e}"))
    return nodes


def parse_pods(m: Manifests) -> list[tuple[str, PodInfo]]:
    """(location, PodInfo) for each valid pod, priorities resolved; invalid ones go to ``m.errors``."""
    pods = []
    for where, obj in m.pods:
        try:
            pods.append((where, PodInfo.from_object(obj, m.priority_classes, m.default_priority)))
        except InvalidObjectError as e:
            m.errors.append(ManifestError(where, f"invalid Pod: {e}"))
    return pods
