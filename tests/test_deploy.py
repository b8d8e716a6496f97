"""deploy/: the kustomizations render, every manifest validates offline, and they refer to each other
consistently (names, labels, ports, ServiceAccount, Secret and ConfigMap keys, the serve command,
the dashboard's metric names, the RBAC against docs/operations.md).

Rendering is done here, in Python, by `render`, which implements the subset of kustomize that
deploy/ uses (its docstring lists it). When ``kubectl`` is on PATH, `test_loader_matches_kubectl`
checks that the loader's output equals ``kubectl kustomize``; otherwise that one test is skipped.

Validation: built-in kinds with kubernetes-validate (Kubernetes 1.35, strict: unknown fields fail);
the RayCluster and the ServiceMonitor against the openAPIV3Schema of the CRDs kept in deploy/crds
(made strict the same way); the RayCluster's pod templates also as v1 PodTemplates.
"""

from __future__ import annotations

import ast
import base64
import copy
import dataclasses
import functools
import json
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import jsonschema
import kubernetes_validate
import pytest
import yaml

from shardsched.api.quantity import canonical_quantity
from shardsched.config import load_config

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUBERNETES_VERSION = "1.35"
NAMESPACE = "shardsched"
OVERLAYS = {"base": DEPLOY / "base", "small": DEPLOY / "overlays/small", "large": DEPLOY / "overlays/large"}
#: deploy/base/redis-password.env is git-ignored (operators create it); tests render with this one.
TEST_FILES = {DEPLOY / "base/redis-password.env": "password=" + "0f" * 32 + "\n"}
_PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: the project's version (the image tag) and its Ray pin (the image's base and rayVersion)
PROJECT = {"version": _PYPROJECT["version"],
           "ray": next(d.split("==")[1] for d in _PYPROJECT["dependencies"] if d.startswith("ray=="))}

# ---------------------------------------------------------------- kustomize subset

#: Kinds the namespace transformer leaves alone (cluster-scoped). Unknown kinds are namespaced, as
#: kustomize assumes for custom resources.
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "PersistentVolume", "StorageClass", "PriorityClass"}
KUSTOMIZATION_FIELDS = {"apiVersion", "kind", "resources", "namespace", "generatorOptions",
                        "configMapGenerator", "secretGenerator", "patches"}


def render(folder: Path, files: Mapping[Path, str] = TEST_FILES) -> list[dict]:
    """Build the kustomization in ``folder`` like ``kustomize build``, for this subset only:

    - ``resources``: YAML files (multi-document) and folders holding a kustomization (built first);
    - ``configMapGenerator`` / ``secretGenerator``: ``files`` (``key=path`` or ``path``), ``envs``
      (``KEY=VALUE`` lines, ``#`` comments), ``type`` (secrets), ``options.labels``; only with
      ``generatorOptions.disableNameSuffixHash: true`` (no hash suffix, so no reference rewriting);
    - ``patches``: JSON 6902 operations ``add``, ``replace``, ``remove``, with a ``target`` of kind
      and name (and optionally group and version); a target matching nothing is an error (kustomize
      would ignore it silently);
    - ``namespace``: set on every object whose kind is not cluster-scoped (subjects of role
      bindings are left as written).

    Patches run before the namespace, as in kustomize. ``files`` overrides file contents by path
    (used for the git-ignored password file).

    Raises:
        ValueError: a field outside the subset, or a patch that does not apply.
    """
    folder = folder.resolve()
    kustomization = yaml.safe_load(_read(folder / "kustomization.yaml", files))
    unknown = set(kustomization) - KUSTOMIZATION_FIELDS
    if unknown:
        raise ValueError(f"{folder}: kustomization fields {sorted(unknown)} are outside the loader's subset")
    objects: list[dict] = []
    for entry in kustomization.get("resources", []):
        path = folder / entry
        if path.is_dir():
            objects += render(path, files)
        else:
            objects += [doc for doc in yaml.safe_load_all(_read(path, files)) if doc]
    options = kustomization.get("generatorOptions", {})
    for kind, key in (("ConfigMap", "configMapGenerator"), ("Secret", "secretGenerator")):
        for generator in kustomization.get(key, []):
            if not options.get("disableNameSuffixHash"):
                raise ValueError(f"{folder}: name suffix hashes are outside the loader's subset")
            objects.append(_generate(kind, generator, folder, files))
    for patch in kustomization.get("patches", []):
        _apply_patch(objects, patch, folder)
    if "namespace" in kustomization:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = kustomization["namespace"]
    return objects


def _read(path: Path, files: Mapping[Path, str]) -> str:
    return files[path] if path in files else path.read_text(encoding="utf-8")


def _generate(kind: str, generator: dict, folder: Path, files: Mapping[Path, str]) -> dict:
    unknown = set(generator) - {"name", "files", "envs", "type", "options"}
    if unknown or set(generator.get("options", {})) - {"labels"}:
        raise ValueError(f"{folder}: generator {generator['name']}: fields outside the loader's subset")
    data: dict[str, str] = {}
    for entry in generator.get("files", []):
        key, _, path = entry.rpartition("=")
        data[key or Path(path).name] = _read(folder / path, files)
    for path in generator.get("envs", []):
        for line in _read(folder / path, files).splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                key, _, value = line.partition("=")
                data[key.strip()] = value
    metadata: dict[str, Any] = {"name": generator["name"]}
    if generator.get("options", {}).get("labels"):
        metadata["labels"] = dict(generator["options"]["labels"])
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": kind, "metadata": metadata}
    if kind == "Secret":
        obj["type"] = generator.get("type", "Opaque")
        obj["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    else:
        obj["data"] = data
    return obj


def _apply_patch(objects: list[dict], patch: dict, folder: Path) -> None:
    target = patch.get("target", {})
    if set(patch) != {"target", "patch"} or set(target) - {"group", "version", "kind", "name"}:
        raise ValueError(f"{folder}: only JSON 6902 patches with a target by kind and name are supported")
    matches = [o for o in objects if _matches(o, target)]
    if not matches:
        raise ValueError(f"{folder}: patch target {target} matches nothing")
    for obj in matches:
        for op in yaml.safe_load(patch["patch"]):
            _json6902(obj, op)


def _matches(obj: dict, target: dict) -> bool:
    group, _, version = obj["apiVersion"].rpartition("/")
    return (obj["kind"] == target["kind"] and obj["metadata"]["name"] == target["name"]
            and target.get("group", group) == group and target.get("version", version) == version)


def _json6902(obj: dict, op: dict) -> None:
    *parents, last = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]]
    node: Any = obj
    for token in parents:
        node = node[int(token)] if isinstance(node, list) else node[token]
    kind = op["op"]
    if isinstance(node, list):
        index = len(node) if last == "-" else int(last)
        if kind == "add":
            node.insert(index, op["value"])
        elif kind in ("replace", "remove"):
            node[index]  # IndexError when missing, as JSON patch requires
            if kind == "replace":
                node[index] = op["value"]
            else:
                del node[index]
        else:
            raise ValueError(f"JSON patch op {kind!r} is outside the loader's subset")
    elif kind == "add":
        node[last] = op["value"]
    elif kind in ("replace", "remove"):
        if last not in node:
            raise ValueError(f"JSON patch {kind} of missing path {op['path']}")
        if kind == "replace":
            node[last] = op["value"]
        else:
            del node[last]
    else:
        raise ValueError(f"JSON patch op {kind!r} is outside the loader's subset")


RENDERED = {name: render(path) for name, path in OVERLAYS.items()}

# ---------------------------------------------------------------- object helpers


def ref(obj: dict) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def find(objects: Iterable[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: Iterable[dict], kind: str, name: str | None = None) -> dict:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind}/{name or '*'}, found {len(found)}"
    return found[0]


@dataclasses.dataclass(frozen=True)
class PodTemplate:
    """A pod template of the deployment: where it lives (``owner``), its labels and spec."""

    owner: str
    namespace: str
    labels: dict
    spec: dict


def pod_templates(objects: Iterable[dict]) -> list[PodTemplate]:
    out = []
    for obj in objects:
        ns = obj["metadata"].get("namespace", "")
        if obj["kind"] in ("StatefulSet", "Deployment", "DaemonSet"):
            templates = [(ref(obj), obj["spec"]["template"])]
        elif obj["kind"] == "RayCluster":
            templates = [(f"{ref(obj)} head", obj["spec"]["headGroupSpec"]["template"])]
            templates += [(f"{ref(obj)} {g['groupName']}", g["template"]) for g in obj["spec"]["workerGroupSpecs"]]
        else:
            continue
        out += [PodTemplate(owner, ns, t["metadata"].get("labels", {}), t["spec"]) for owner, t in templates]
    return out


def selects(selector: dict, labels: Mapping[str, str]) -> bool:
    """A LabelSelector (matchLabels, matchExpressions) or a plain map (Service) against labels."""
    if "matchLabels" not in selector and "matchExpressions" not in selector:
        selector = {"matchLabels": selector}
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def containers(spec: dict) -> list[dict]:
    return spec.get("initContainers", []) + spec["containers"]


def env_value(container: dict, name: str) -> str:
    return next(e["value"] for e in container.get("env", []) if e["name"] == name)


def head_container(objects: list[dict]) -> dict:
    return one(objects, "RayCluster")["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]


def serve_command(objects: list[dict]) -> list[str]:
    """The ``shardsched serve ...`` line of the head's entrypoint script, split like the shell."""
    script = head_container(objects)["args"][0]
    lines = [line for line in script.splitlines() if line.strip().startswith("shardsched serve")]
    assert len(lines) == 1, "the head's script must run `shardsched serve` on one line"
    return shlex.split(lines[0].rstrip("& "))


def option(command: list[str], name: str) -> str:
    assert name in command, f"{name} missing from {' '.join(command)}"
    return command[command.index(name) + 1]


def by_overlay(make) -> list:
    """``pytest.param`` per (overlay, case) for the cases ``make(objects)`` yields as (id, value)."""
    return [pytest.param(name, value, id=f"{name}-{case_id}")
            for name, objects in RENDERED.items() for case_id, value in make(objects)]


# ---------------------------------------------------------------- loader


def test_overlays_render_what_they_promise() -> None:
    for name, objects in RENDERED.items():
        kinds = sorted(ref(o) for o in objects)
        assert kinds == sorted(ref(o) for o in RENDERED["base"]), name
        assert len(set(kinds)) == len(kinds), f"{name}: duplicate objects"
    small, large = (one(RENDERED[n], "RayCluster")["spec"]["workerGroupSpecs"][0] for n in ("small", "large"))
    assert (small["minReplicas"], small["maxReplicas"]) == (1, 2)
    assert (large["minReplicas"], large["maxReplicas"]) == (4, 8)


@pytest.mark.parametrize("op, expected", [
    ({"op": "replace", "path": "/a/b/0", "value": 9}, {"a": {"b": [9, 2]}}),
    ({"op": "add", "path": "/a/b/-", "value": 3}, {"a": {"b": [1, 2, 3]}}),
    ({"op": "add", "path": "/a/c~1d", "value": 1}, {"a": {"b": [1, 2], "c/d": 1}}),
    ({"op": "remove", "path": "/a/b/1"}, {"a": {"b": [1]}}),
], ids=["replace-list-item", "append", "escaped-key", "remove"])
def test_json6902_subset(op: dict, expected: dict) -> None:
    obj = {"a": {"b": [1, 2]}}
    _json6902(obj, op)
    assert obj == expected


@pytest.mark.parametrize("op", [
    {"op": "replace", "path": "/a/missing", "value": 1},
    {"op": "replace", "path": "/a/b/5", "value": 1},
    {"op": "move", "from": "/a/b", "path": "/c"},
], ids=["replace-missing-key", "replace-missing-index", "unsupported-op"])
def test_json6902_refuses(op: dict) -> None:
    with pytest.raises((ValueError, IndexError)):
        _json6902({"a": {"b": [1, 2]}}, op)


def test_loader_refuses_fields_outside_its_subset(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\ncommonLabels: {a: b}\n")
    with pytest.raises(ValueError, match="commonLabels"):
        render(tmp_path)


def _canonical(objects: Iterable[dict]) -> dict[tuple, dict]:
    """Objects by identity; Secret data decoded (kustomize wraps long base64 lines)."""
    out = {}
    for obj in objects:
        if obj["kind"] == "Secret":
            obj = {**obj, "data": {k: base64.b64decode(v) for k, v in obj.get("data", {}).items()}}
        out[(obj["apiVersion"], obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])] = obj
    return out


@pytest.mark.parametrize("name", list(OVERLAYS))
def test_loader_matches_kubectl(name: str, tmp_path: Path) -> None:
    """The Python loader gives exactly what ``kubectl kustomize`` (kustomize v5) gives."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on PATH; the Python loader alone renders the kustomizations")
    copy_root = tmp_path / "deploy"
    for folder in ("base", "overlays"):
        shutil.copytree(DEPLOY / folder, copy_root / folder)
    for path, text in TEST_FILES.items():
        (copy_root / path.relative_to(DEPLOY)).write_text(text)
    folder = copy_root / OVERLAYS[name].relative_to(DEPLOY)
    result = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    expected = _canonical(d for d in yaml.safe_load_all(result.stdout) if d)
    assert _canonical(RENDERED[name]) == expected


# ---------------------------------------------------------------- schema validation

CUSTOM_KINDS = {("ray.io/v1", "RayCluster"): "ray.io_rayclusters.yaml",
                ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml",
                ("scheduling.x-k8s.io/v1alpha1", "PodGroup"): "scheduling.x-k8s.io_podgroups.yaml"}


def _validate_builtin(obj: dict) -> None:
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("name, obj", by_overlay(
    lambda objs: [(ref(o), o) for o in objs if (o["apiVersion"], o["kind"]) not in CUSTOM_KINDS]))
def test_builtin_kind_validates(name: str, obj: dict) -> None:
    _validate_builtin(obj)


@pytest.mark.parametrize("name, template", by_overlay(
    lambda objs: [(t.owner.replace(" ", "-"), t) for t in pod_templates(objs) if t.owner.startswith("RayCluster")]))
def test_ray_pod_template_validates_as_podtemplate(name: str, template: PodTemplate) -> None:
    """The CRD embeds a PodTemplateSpec schema of its own build; check against Kubernetes' too."""
    _validate_builtin({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t", "namespace": NAMESPACE},
                       "template": {"metadata": {"labels": template.labels}, "spec": template.spec}})


def _strict(schema: Any) -> Any:
    """A copy of an openAPIV3Schema where objects listing their properties refuse unknown fields
    (as ``kubectl apply --validate=strict``), except where the schema preserves unknown fields."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if ("properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd(file: str) -> dict:
    return yaml.load((DEPLOY / "crds" / file).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@functools.cache
def crd_validator(api_version: str, kind: str) -> jsonschema.Draft4Validator:
    definition = crd(CUSTOM_KINDS[(api_version, kind)])
    assert definition["spec"]["names"]["kind"] == kind
    group, version = api_version.split("/")
    assert definition["spec"]["group"] == group
    served = next(v for v in definition["spec"]["versions"] if v["name"] == version)
    assert served["served"] and not served.get("deprecated")
    return jsonschema.Draft4Validator(_strict(served["schema"]["openAPIV3Schema"]))


def _cel_paths(schema: dict, path: str = "") -> Iterator[str]:
    """Field paths (dotted, ``[]`` for list items) that carry CEL rules, which jsonschema cannot run."""
    if "x-kubernetes-validations" in schema:
        yield path
    for key, sub in schema.get("properties", {}).items():
        yield from _cel_paths(sub, f"{path}.{key}" if path else key)
    if "items" in schema:
        yield from _cel_paths(schema["items"], f"{path}[]")


def _has_path(obj: Any, path: list[str]) -> bool:
    if not path:
        return True
    head, rest = path[0], path[1:]
    if head.endswith("[]"):
        items = obj.get(head[:-2], []) if isinstance(obj, dict) else []
        return any(_has_path(item, rest) for item in items)
    return isinstance(obj, dict) and head in obj and _has_path(obj[head], rest)


@pytest.mark.parametrize("name, obj", by_overlay(
    lambda objs: [(ref(o), o) for o in objs if (o["apiVersion"], o["kind"]) in CUSTOM_KINDS]))
def test_custom_resource_validates_against_crd(name: str, obj: dict) -> None:
    validator = crd_validator(obj["apiVersion"], obj["kind"])
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
    assert not errors, "\n".join(errors)
    unchecked = [p for p in _cel_paths(validator.schema) if _has_path(obj, p.split("."))]
    assert not unchecked, f"fields with CEL rules that are not checked offline: {unchecked}"


EXAMPLES = sorted((DEPLOY / "examples").glob("*.yaml"))


def _example_objects() -> list[tuple[str, dict]]:
    return [(f"{path.name}:{o['kind']}/{o['metadata']['name']}", o) for path in EXAMPLES
            for o in yaml.safe_load_all(path.read_text()) if o]


@pytest.mark.parametrize("name, obj", _example_objects())
def test_example_validates(name: str, obj: dict) -> None:
    """deploy/examples/: custom resources against their CRD, the rest as built-in kinds; and each
    PodGroup is one shardsched reads, with as many pods naming it as its minMember."""
    from shardsched.api.podgroup import POD_GROUP_LABEL, PodGroup

    if (obj["apiVersion"], obj["kind"]) not in CUSTOM_KINDS:
        _validate_builtin(obj)
        return
    validator = crd_validator(obj["apiVersion"], obj["kind"])
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
    assert not errors, "\n".join(errors)
    if obj["kind"] == "PodGroup":
        group = PodGroup.from_object(obj)
        members = [o for _, o in _example_objects() if o["kind"] == "Pod"
                   and o["metadata"].get("labels", {}).get(POD_GROUP_LABEL) == group.name]
        assert len(members) == group.min_member


def test_podgroup_crd_validation_has_teeth() -> None:
    obj = next(o for _, o in _example_objects() if o["kind"] == "PodGroup")
    validator = crd_validator(obj["apiVersion"], obj["kind"])
    for mutate in (lambda o: o["spec"].update(minMember=0), lambda o: o["spec"].update(minMembers=3),
                   lambda o: o["spec"].update(minResources={"cpu": "lots"})):
        bad = copy.deepcopy(obj)
        mutate(bad)
        assert list(validator.iter_errors(bad))


@pytest.mark.parametrize("mutate", [
    lambda o: o["spec"]["workerGroupSpecs"][0].update(minReplica=1),
    lambda o: o["spec"].update(enableInTreeAutoscaling="yes"),
    lambda o: o["spec"]["autoscalerOptions"].update(upscalingMode="Fast"),
    lambda o: o["spec"]["workerGroupSpecs"][0].pop("groupName"),
], ids=["misspelled-field", "wrong-type", "bad-enum", "missing-required"])
def test_crd_validation_has_teeth(mutate) -> None:
    obj = copy.deepcopy(one(RENDERED["base"], "RayCluster"))
    mutate(obj)
    assert list(crd_validator(obj["apiVersion"], obj["kind"]).iter_errors(obj))


def test_builtin_validation_has_teeth() -> None:
    obj = copy.deepcopy(one(RENDERED["base"], "StatefulSet"))
    obj["spec"]["template"]["spec"]["containers"][0]["memoryLimit"] = "1Gi"
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate_builtin(obj)


@pytest.mark.parametrize("name", list(OVERLAYS))
def test_raycluster_passes_kuberay_controller_checks(name: str) -> None:
    """What KubeRay v1.7's controller checks beyond the schema (utils/validation.go), for the fields
    used here, and the command contract of ray.io/overwrite-container-cmd."""
    cluster = one(RENDERED[name], "RayCluster")
    cluster_name = cluster["metadata"]["name"]
    assert len(cluster_name) <= 53 and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", cluster_name)
    spec = cluster["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["upgradeStrategy"] == {"type": "Recreate"}
    groups = [spec["headGroupSpec"]] + spec["workerGroupSpecs"]
    for group in groups:
        ray_resources = set(group.get("rayStartParams", {})) & {"num-cpus", "num-gpus", "memory", "resources"}
        assert not (group.get("resources") and ray_resources)
        assert "labels" not in group.get("rayStartParams", {})
    for worker in spec["workerGroupSpecs"]:
        assert 0 <= worker["minReplicas"] <= worker["replicas"] <= worker["maxReplicas"], worker["groupName"]
    assert cluster["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    for group in groups:
        ray_container = group["template"]["spec"]["containers"][0]  # KubeRay's RayContainerIndex
        assert ray_container["command"] == ["/bin/bash", "-lc", "--"]
        assert "$KUBERAY_GEN_RAY_START_CMD" in ray_container["args"][0]
        assert "ulimit -n 65536" in ray_container["args"][0]
    assert spec["rayVersion"] == PROJECT["ray"]


# ---------------------------------------------------------------- cross-references

COMPONENTS = {"coordinator", "shard", "ledger", "rbac", "ray"}


@pytest.mark.parametrize("name, obj", by_overlay(lambda objs: [(ref(o), o) for o in objs]))
def test_labels_are_consistent(name: str, obj: dict) -> None:
    labels = obj["metadata"].get("labels", {})
    assert labels.get("app.kubernetes.io/name") == "shardsched"
    if obj["kind"] != "Namespace":
        assert labels.get("app.kubernetes.io/component") in COMPONENTS
        assert obj["metadata"].get("namespace", NAMESPACE) == NAMESPACE
    for template in pod_templates([obj]):
        assert template.labels.get("app.kubernetes.io/name") == "shardsched"
        assert template.labels.get("app.kubernetes.io/component") in COMPONENTS


@pytest.mark.parametrize("name, template", by_overlay(
    lambda objs: [(t.owner.replace(" ", "-"), t) for t in pod_templates(objs)]))
def test_pod_template_references_resolve(name: str, template: PodTemplate) -> None:
    """ServiceAccount, ConfigMap and Secret references (with their keys), volume mounts, and
    ``$(VAR)`` references to variables defined earlier in the container (kubelet's rule)."""
    objects = RENDERED[name]

    def in_ns(kind: str, obj_name: str) -> dict:
        return one([o for o in objects if o["metadata"].get("namespace") == template.namespace], kind, obj_name)

    if "serviceAccountName" in template.spec:
        in_ns("ServiceAccount", template.spec["serviceAccountName"])
    volumes = {v["name"]: v for v in template.spec.get("volumes", [])}
    for volume in volumes.values():
        if "configMap" in volume:
            in_ns("ConfigMap", volume["configMap"]["name"])
        if "secret" in volume:
            in_ns("Secret", volume["secret"]["secretName"])
    for container in containers(template.spec):
        claims = {c["metadata"]["name"] for o in find(objects, "StatefulSet")
                  for c in o["spec"].get("volumeClaimTemplates", [])}
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in volumes or mount["name"] in claims, mount
        defined: list[str] = []
        for env in container.get("env", []):
            source = env.get("valueFrom", {})
            if "secretKeyRef" in source:
                assert source["secretKeyRef"]["key"] in in_ns("Secret", source["secretKeyRef"]["name"])["data"]
            if "configMapKeyRef" in source:
                assert source["configMapKeyRef"]["key"] in in_ns("ConfigMap", source["configMapKeyRef"]["name"])["data"]
            for var in re.findall(r"\$\((\w+)\)", env.get("value", "")):
                assert var in defined, f"{env['name']} uses $({var}) before it is defined"
            defined.append(env["name"])
        for arg in container.get("command", []) + container.get("args", []):
            for var in re.findall(r"\$\((\w+)\)", arg):
                assert var in defined, f"{container['name']}: $({var}) is not an env variable"


def test_every_template_has_a_service_account_or_needs_none() -> None:
    for template in pod_templates(RENDERED["base"]):
        if template.owner.startswith("RayCluster"):
            assert template.spec["serviceAccountName"] == "shardsched", template.owner
        else:  # Redis talks to no API server
            assert template.spec.get("automountServiceAccountToken") is False, template.owner


@pytest.mark.parametrize("name", list(OVERLAYS))
def test_cluster_role_binding(name: str) -> None:
    objects = RENDERED[name]
    binding = one(objects, "ClusterRoleBinding", "shardsched")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "shardsched"}
    one(objects, "ClusterRole", binding["roleRef"]["name"])
    (subject,) = binding["subjects"]
    account = one(objects, "ServiceAccount", subject["name"])
    assert subject["kind"] == "ServiceAccount" and subject["namespace"] == account["metadata"]["namespace"]


def _service_cases(objects: list[dict]) -> list[tuple[str, dict]]:
    return [(ref(s), s) for s in find(objects, "Service")]


@pytest.mark.parametrize("name, service", by_overlay(_service_cases))
def test_service_selects_pods_and_ports(name: str, service: dict) -> None:
    templates = [t for t in pod_templates(RENDERED[name])
                 if t.namespace == service["metadata"]["namespace"] and selects(service["spec"]["selector"], t.labels)]
    assert len(templates) == 1, f"{ref(service)} selects {[t.owner for t in templates]}"
    ports = {p["name"]: p["containerPort"] for c in templates[0].spec["containers"] for p in c.get("ports", [])}
    for port in service["spec"]["ports"]:
        target = port["targetPort"]
        assert target in ports if isinstance(target, str) else target in ports.values()


@pytest.mark.parametrize("name", list(OVERLAYS))
def test_service_monitor_scrapes_the_metrics_service(name: str) -> None:
    objects = RENDERED[name]
    monitor = one(objects, "ServiceMonitor")
    namespaces = monitor["spec"]["namespaceSelector"]["matchNames"]
    services = [s for s in find(objects, "Service") if s["metadata"]["namespace"] in namespaces
                and selects(monitor["spec"]["selector"], s["metadata"]["labels"])]
    assert [s["metadata"]["name"] for s in services] == ["shardsched-metrics"]
    (endpoint,) = monitor["spec"]["endpoints"]
    (port,) = [p for p in services[0]["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert port["port"] == int(option(serve_command(objects), "--metrics-port"))
    # KubeRay v1.7 creates a head Service with these labels (common/service.go HeadServiceLabels,
    # app.kubernetes.io/name copied from the head template) exposing the head's named ports; the
    # ServiceMonitor must not select it, or each target is scraped twice.
    head_labels = one(objects, "RayCluster")["spec"]["headGroupSpec"]["template"]["metadata"]["labels"]
    kuberay_head_service = {"ray.io/cluster": "shardsched", "ray.io/node-type": "head",
                            "ray.io/identifier": "shardsched-head",
                            "app.kubernetes.io/name": head_labels["app.kubernetes.io/name"],
                            "app.kubernetes.io/created-by": "kuberay-operator"}
    assert not selects(monitor["spec"]["selector"], kuberay_head_service)


@pytest.mark.parametrize("name", list(OVERLAYS))
def test_network_policy_admits_only_shardsched_pods_to_redis(name: str) -> None:
    objects = RENDERED[name]
    policy = one(objects, "NetworkPolicy")
    templates = pod_templates(objects)
    guarded = [t.owner for t in templates if selects(policy["spec"]["podSelector"], t.labels)]
    assert guarded == ["StatefulSet/shardsched-redis"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}, "same-namespace pods only"
    admitted = {t.owner for t in templates if selects(peer["podSelector"], t.labels)}
    assert admitted == {"RayCluster/shardsched head", "RayCluster/shardsched shards"}
    assert not selects(peer["podSelector"], {"app.kubernetes.io/name": "shardsched"})
    redis_port = one(objects, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert rule["ports"] == [{"protocol": "TCP", "port": redis_port}]


@pytest.mark.parametrize("name", list(OVERLAYS))
def test_disruption_budgets_cover_head_and_redis(name: str) -> None:
    objects = RENDERED[name]
    covered = {}
    for budget in find(objects, "PodDisruptionBudget"):
        owners = [t.owner for t in pod_templates(objects) if selects(budget["spec"]["selector"], t.labels)]
        assert len(owners) == 1, f"{ref(budget)} selects {owners}"
        covered[owners[0]] = budget["spec"]
    assert set(covered) == {"RayCluster/shardsched head", "StatefulSet/shardsched-redis"}
    assert all(s["minAvailable"] == 1 and s["unhealthyPodEvictionPolicy"] == "AlwaysAllow" for s in covered.values())


@pytest.mark.parametrize("name", list(OVERLAYS))
def test_serve_command_uses_mounted_config_redis_and_ports(name: str) -> None:
    objects = RENDERED[name]
    command = serve_command(objects)
    container = head_container(objects)
    head_spec = one(objects, "RayCluster")["spec"]["headGroupSpec"]["template"]["spec"]
    assert option(command, "--ray-address") == "auto"
    # --config: a file of the shardsched-config ConfigMap, through a mounted volume
    config_path = Path(option(command, "--config"))
    volumes = {v["name"]: v for v in head_spec["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if config_path.is_relative_to(m["mountPath"])]
    config_map = one(objects, "ConfigMap", volumes[mount["name"]]["configMap"]["name"])
    assert str(config_path.relative_to(mount["mountPath"])) in config_map["data"]
    # --redis-url: the env variable, naming the Redis Service and port in this namespace
    assert option(command, "--redis-url") == "$SHARDSCHED_REDIS_URL"
    match = re.fullmatch(r"redis://:\$\((\w+)\)@([a-z0-9-]+):(\d+)/0", env_value(container, "SHARDSCHED_REDIS_URL"))
    assert match, "redis://:$(PASSWORD_VAR)@service:port/0"
    service = one(objects, "Service", match[2])
    assert int(match[3]) in [p["port"] for p in service["spec"]["ports"]]
    assert selects(service["spec"]["selector"], one(objects, "StatefulSet")["spec"]["template"]["metadata"]["labels"])
    # --metrics-port: the container port named metrics, which the probes use
    metrics_port = int(option(command, "--metrics-port"))
    assert {"name": "metrics", "containerPort": metrics_port} in container["ports"]
    assert option(command, "--metrics-address") == "0.0.0.0"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


@pytest.mark.parametrize("name", list(OVERLAYS))
def test_initial_shards_fit_the_ray_autoscaler_bounds(name: str) -> None:
    """Each shard declares ``--shard-cpus`` CPUs; the head offers none (num-cpus 0), so the initial
    shards must fit on maxReplicas workers, and a worker must hold at least one shard."""
    objects = RENDERED[name]
    command = serve_command(objects)
    assert option(command, "--shards") == "$SHARDSCHED_SHARDS"
    shards = int(env_value(head_container(objects), "SHARDSCHED_SHARDS"))
    shard_millicpu = canonical_quantity("cpu", option(command, "--shard-cpus"))
    spec = one(objects, "RayCluster")["spec"]
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    (workers,) = spec["workerGroupSpecs"]
    worker_limits = workers["template"]["spec"]["containers"][0]["resources"]["limits"]
    worker_millicpu = canonical_quantity("cpu", worker_limits["cpu"])
    per_worker = worker_millicpu // shard_millicpu
    assert per_worker >= 1
    assert shards <= workers["maxReplicas"] * per_worker
    assert shards >= 1


def test_serve_flags_exist_when_serve_is_implemented() -> None:
    """Every flag of the head's serve command is an option of `shardsched serve`."""
    try:
        from shardsched.cli.serve import serve
    except ModuleNotFoundError as e:
        if e.name != "shardsched.cli.serve":
            raise
        pytest.skip("shardsched serve is not implemented yet; docs/operations.md lists the flags deploy/ relies on")
    known = {opt for param in serve.params for opt in param.opts}
    for overlay, objects in RENDERED.items():
        flags = {arg for arg in serve_command(objects)[2:] if arg.startswith("--")}
        assert flags <= known, f"{overlay}: unknown serve flags {sorted(flags - known)}"


def test_images_match_the_project() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert re.search(rf"^FROM rayproject/ray:{re.escape(PROJECT['ray'])}-py311$", dockerfile, re.M)
    images = {c["image"] for t in pod_templates(RENDERED["base"]) if t.owner.startswith("RayCluster")
              for c in containers(t.spec)}
    assert images == {f"shardsched:{PROJECT['version']}"}


# ---------------------------------------------------------------- scheduler configuration and Redis

DEPLOY_PROFILE = "shardsched"


@pytest.mark.parametrize("name", list(OVERLAYS))
def test_scheduler_config_is_default_yaml_with_own_profile_and_lease(name: str) -> None:
    objects = RENDERED[name]
    deployed = load_config(one(objects, "ConfigMap", "shardsched-config")["data"]["config.yaml"])
    default = load_config(DEPLOY / "config" / "default.yaml")
    (profile,) = deployed.profiles
    assert profile.scheduler_name == DEPLOY_PROFILE != "default-scheduler"
    # same plugins, weights and args as default.yaml; only the name, the lease and the client's
    # rate limit differ
    same = dataclasses.replace(deployed, profiles=[dataclasses.replace(profile, scheduler_name="default-scheduler")],
                               leader_election=default.leader_election, client_connection=default.client_connection)
    assert same == default
    lease = deployed.leader_election
    assert lease.leader_elect and lease.resource_lock == "leases"
    assert lease.resource_namespace == NAMESPACE
    rules = one(objects, "ClusterRole")["rules"]
    named = [r for r in rules if r["resources"] == ["leases"] and r.get("resourceNames")]
    assert [r["resourceNames"] for r in named] == [[lease.resource_name]]
    assert deployed.client_connection.qps > default.client_connection.qps


def _redis_bytes(text: str) -> int:
    """Redis memory units: k/m/g are powers of 1000, kb/mb/gb of 1024 (redis.conf)."""
    match = re.fullmatch(r"(\d+)(k|kb|m|mb|g|gb)?", text.lower())
    assert match, text
    scale = {None: 1, "k": 10**3, "kb": 2**10, "m": 10**6, "mb": 2**20, "g": 10**9, "gb": 2**30}
    return int(match[1]) * scale[match[2]]


@pytest.mark.parametrize("name", list(OVERLAYS))
def test_redis_persists_and_fits_its_limit(name: str) -> None:
    objects = RENDERED[name]
    conf_text = one(objects, "ConfigMap", "shardsched-redis-config")["data"]["redis.conf"]
    conf = dict(line.split(None, 1) for line in conf_text.splitlines() if line.strip() and not line.startswith("#"))
    assert conf["appendonly"] == "yes" and conf["appendfsync"] == "everysec"
    assert conf["maxmemory-policy"] == "noeviction"
    statefulset = one(objects, "StatefulSet", "shardsched-redis")
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    (data_mount,) = [m for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"]]
    assert data_mount["mountPath"] == conf["dir"]
    args = container["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    maxmemory = _redis_bytes(env_value(container, "REDIS_MAXMEMORY"))
    limit = canonical_quantity("memory", container["resources"]["limits"]["memory"])
    assert maxmemory <= 0.6 * limit, "leave room for the AOF rewrite's copy-on-write pages"
    one(objects, "Service", statefulset["spec"]["serviceName"])


# ---------------------------------------------------------------- Grafana dashboard

METRICS_MODULE = ROOT / "shardsched" / "metrics" / "__init__.py"
#: labels Prometheus adds to every scraped series (prometheus-operator's ServiceMonitor targets),
#: plus the shard label of AggregateCollector
TARGET_LABELS = {"job", "instance", "namespace", "service", "pod", "container", "endpoint", "shard"}
#: series Prometheus makes itself for every target
SYNTHETIC_SERIES = {"up": set()}


def exposed_series(path: Path = METRICS_MODULE) -> dict[str, set[str]]:
    """Series names -> label names, read from the metric constructors in the metrics module (a
    Counter ``x_total`` exposes ``x_total``; a Histogram ``x`` exposes ``x_bucket`` (with ``le``),
    ``x_sum`` and ``x_count``; a Gauge its name)."""
    tree = ast.parse(path.read_text())
    constants = {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                 for t in node.targets if isinstance(t, ast.Name) and isinstance(node.value, ast.Constant)}

    def text(node: ast.expr) -> str:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return constants[node.id]
        assert isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add), ast.dump(node)
        return text(node.left) + text(node.right)

    series: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("Counter", "Gauge", "Histogram", "Summary")):
            continue
        name = text(node.args[0])
        labels_node = (node.args[2] if len(node.args) > 2
                       else next((k.value for k in node.keywords if k.arg == "labelnames"), None))
        labels = {text(e) for e in labels_node.elts} if labels_node is not None else set()
        if node.func.id == "Counter":
            series[name if name.endswith("_total") else name + "_total"] = labels
        elif node.func.id == "Gauge":
            series[name] = labels
        else:
            series.update({name + "_sum": labels, name + "_count": labels})
            if node.func.id == "Histogram":
                series[name + "_bucket"] = labels | {"le"}
            else:
                series[name] = labels | {"quantile"}
    return series


_PROMQL_TOKEN = re.compile(r'\s+|(?P<str>"(?:\\.|[^"\\])*")|(?P<var>\$\{?\w+\}?)|(?P<num>\d+(\.\d+)?[smhdwy]?)'
                           r"|(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)|(?P<op>=~|!~|!=|==|>=|<=|[{}()\[\],=<>+\-*/^%])")
_PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
                    "and", "or", "unless"}
#: aggregation operators, which may be followed by a by/without clause instead of "("
_PROMQL_AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                        "bottomk", "topk", "quantile", "limitk", "limit_ratio"}


def promql_selectors(expr: str) -> tuple[list[tuple[str, set[str]]], set[str]]:
    """The series a PromQL expression reads, with the label names each matcher uses, and the label
    names of its ``by``/``without``/``on``/``ignoring`` clauses. Enough PromQL for dashboards:
    functions, aggregations, matchers, ranges and Grafana variables.

    Raises:
        ValueError: text that is none of those tokens.
    """
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        match = _PROMQL_TOKEN.match(expr, pos)
        if not match:
            raise ValueError(f"cannot read PromQL at {expr[pos:]!r}")
        if match.lastgroup:
            tokens.append((match.lastgroup, match.group()))
        pos = match.end()
    selectors: list[tuple[str, set[str]]] = []
    grouping: set[str] = set()
    i = 0
    while i < len(tokens):
        kind, value = tokens[i]
        following = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if kind == "ident" and value in _PROMQL_KEYWORDS:
            if following == "(":
                end = next(j for j in range(i, len(tokens)) if tokens[j][1] == ")")
                grouping |= {v for k, v in tokens[i + 2:end] if k == "ident"}
                i = end
        elif kind == "ident" and following != "(" and value not in _PROMQL_AGGREGATIONS:
            labels: set[str] = set()
            if following == "{":
                end = next(j for j in range(i, len(tokens)) if tokens[j][1] == "}")
                labels = {v for k, v in tokens[i + 2:end] if k == "ident"}
                i = end
            selectors.append((value, labels))
        elif value == "[":
            i = next(j for j in range(i, len(tokens)) if tokens[j][1] == "]")
        i += 1
    return selectors, grouping


@pytest.mark.parametrize("expr, selectors, grouping", [
    ('sum(rate(a_total{result="x"}[1m]))', [("a_total", {"result"})], set()),
    ("histogram_quantile(0.9, sum by (le, op) (rate(b_bucket[$__rate_interval])))",
     [("b_bucket", set())], {"le", "op"}),
    ("sum without (shard) (c) + count(d)", [("c", set()), ("d", set())], {"shard"}),
    ('max(up{job="j"}) or vector(0)', [("up", {"job"})], set()),
    ('sum(x{code!="OK", a=~"b.*"}) / ignoring (code) sum(y)', [("x", {"code", "a"}), ("y", set())], {"code"}),
], ids=["rate", "quantile-by", "aggregation-without", "function-arg", "binary-ignoring"])
def test_promql_selectors(expr: str, selectors: list, grouping: set) -> None:
    assert promql_selectors(expr) == (selectors, grouping)


def dashboard() -> dict:
    return json.loads((DEPLOY / "grafana" / "shardsched.json").read_text())


def _panels(dash: dict) -> list[dict]:
    return [p for p in dash["panels"] if p["type"] != "row"]


def test_dashboard_structure() -> None:
    dash = dashboard()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert dash["uid"] == "shardsched"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for panel in _panels(dash):
        assert panel["targets"], panel["title"]
        for target in [panel] + panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24


@pytest.mark.parametrize("expr", [pytest.param(t["expr"], id=f"{p['id']}{t['refId']}-{p['title']}")
                                  for p in _panels(dashboard()) for t in p["targets"]])
def test_dashboard_query_names_real_series(expr: str) -> None:
    series = {**exposed_series(), **SYNTHETIC_SERIES}
    selectors, grouping = promql_selectors(expr)
    assert selectors, "a query that reads no series"
    known_labels = set(TARGET_LABELS)
    for name, labels in selectors:
        assert name in series, f"{name} is not a metric of shardsched/metrics/__init__.py"
        assert labels <= series[name] | TARGET_LABELS, f"{name} has no labels {labels - series[name] - TARGET_LABELS}"
        known_labels |= series[name]
    assert grouping <= known_labels, f"grouping by unknown labels {grouping - known_labels}"


def test_dashboard_job_label_is_the_metrics_service() -> None:
    """ServiceMonitor targets get job=<Service name> (no jobLabel set): the `up` panels use it."""
    monitor = one(RENDERED["base"], "ServiceMonitor")
    assert "jobLabel" not in monitor["spec"]
    exprs = [t["expr"] for p in _panels(dashboard()) for t in p["targets"]]
    jobs = {job for e in exprs for job in re.findall(r'up\{job="([^"]+)"\}', e)}
    assert jobs == {"shardsched-metrics"}
    one(RENDERED["base"], "Service", "shardsched-metrics")


@pytest.mark.parametrize("wanted", [
    'rate(shardsched_scheduler_schedule_attempts_total{result="scheduled"}[1m])',
    "shardsched_scheduler_pod_scheduling_sli_duration_seconds_bucket",
    "shardsched_scheduler_scheduling_attempt_duration_seconds_bucket",
    "sum by (queue) (shardsched_scheduler_pending_pods)",
    'shardsched_bind_total{result="conflict"}',
    'shardsched_ledger_reserve_total{code!="OK"}',
    "shardsched_rebalancer_requeues_total",
    "shardsched_shard_nodes",
    'up{job="shardsched-metrics"}',
    "shardsched_unschedulable_pods_total",
], ids=["throughput", "sli-latency", "attempt-latency", "pending-by-queue", "bind-conflicts",
        "reserve-refusals", "requeues", "shard-nodes", "up", "alerts"])
def test_dashboard_shows(wanted: str) -> None:
    exprs = [t["expr"] for p in _panels(dashboard()) for t in p["targets"]]
    assert any(wanted in e for e in exprs)
    if wanted.endswith("_bucket"):
        assert any(wanted in e and e.startswith("histogram_quantile(") for e in exprs)


# ---------------------------------------------------------------- RBAC

#: kube-scheduler's ClusterRole system:kube-scheduler, from the bootstrap policy's golden file
#: (kubernetes/kubernetes plugin/pkg/auth/authorizer/rbac/bootstrappolicy/testdata/cluster-roles.yaml),
#: as (API group, resource, verbs, resource names or None).
SYSTEM_KUBE_SCHEDULER = [
    (("", "events.k8s.io"), ("events",), ("create", "patch", "update"), None),
    (("coordination.k8s.io",), ("leases",), ("create",), None),
    (("coordination.k8s.io",), ("leases",), ("get", "update"), ("kube-scheduler",)),
    (("",), ("nodes",), ("get", "list", "watch"), None),
    (("",), ("pods",), ("delete", "get", "list", "watch"), None),
    (("",), ("bindings", "pods/binding"), ("create",), None),
    (("",), ("pods/status",), ("patch", "update"), None),
    (("",), ("replicationcontrollers", "services"), ("get", "list", "watch"), None),
    (("apps", "extensions"), ("replicasets",), ("get", "list", "watch"), None),
    (("apps",), ("statefulsets",), ("get", "list", "watch"), None),
    (("policy",), ("poddisruptionbudgets",), ("get", "list", "watch"), None),
    (("",), ("persistentvolumeclaims", "persistentvolumes"), ("get", "list", "watch"), None),
    (("authentication.k8s.io",), ("tokenreviews",), ("create",), None),
    (("authorization.k8s.io",), ("subjectaccessreviews",), ("create",), None),
    (("storage.k8s.io",), ("csinodes",), ("get", "list", "watch"), None),
    (("",), ("namespaces",), ("get", "list", "watch"), None),
    (("storage.k8s.io",), ("csidrivers",), ("get", "list", "watch"), None),
    (("storage.k8s.io",), ("csistoragecapacities",), ("get", "list", "watch"), None),
]

#: system:volume-scheduler (bound to kube-scheduler's user too), the same form
SYSTEM_VOLUME_SCHEDULER = [
    (("",), ("persistentvolumes", "persistentvolumeclaims"), ("get", "list", "patch", "update", "watch"), None),
    (("storage.k8s.io",), ("storageclasses",), ("get", "list", "watch"), None),
]

Permission = tuple[str, str, str, str]  # group ("" = core), resource, verb, resource name ("" = any)


Rule = tuple[Iterable[str], Iterable[str], Iterable[str], Iterable[str] | None]  # groups, resources, verbs, names


def permissions(rules: Iterable[Rule]) -> set[Permission]:
    return {(g, r, v, n) for groups, resources, verbs, names in rules
            for g in groups for r in resources for v in verbs for n in (names or ("",))}


def cluster_role_permissions(role: dict) -> set[Permission]:
    return permissions((r["apiGroups"], r["resources"], r["verbs"], r.get("resourceNames")) for r in role["rules"])


def documented_permissions() -> set[Permission]:
    """The table under "### The ClusterRole" in docs/operations.md: group | resource | verbs | names."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("### The ClusterRole", 1)[1].split("\n#", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in section.splitlines() if line.startswith("| ")]
    header, *body = rows
    assert [c.strip() for c in header[:4]] == ["API group", "resource", "verbs", "resource names"]
    out = set()
    for cells in body:
        group, resource, verbs, names = (c.strip().strip("`") for c in cells[:4])
        split = lambda s: [x.strip().strip("`") for x in s.split(",") if x.strip()]  # noqa: E731
        out |= permissions([(["" if group == "core" else group], [resource], split(verbs), split(names) or None)])
    return out


def test_cluster_role_is_exactly_the_documented_list() -> None:
    role = one(RENDERED["base"], "ClusterRole", "shardsched")
    assert "aggregationRule" not in role
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
        assert "nonResourceURLs" not in rule
    assert cluster_role_permissions(role) == documented_permissions()


def test_cluster_role_against_system_kube_scheduler() -> None:
    """Everything shardsched may do, kube-scheduler may do too, except one thing: get and update
    its leader-election Lease, which has its own name."""
    ours = cluster_role_permissions(one(RENDERED["base"], "ClusterRole", "shardsched"))
    kube = permissions(SYSTEM_KUBE_SCHEDULER + SYSTEM_VOLUME_SCHEDULER)
    assert ours - kube == {("coordination.k8s.io", "leases", "get", "shardsched"),
                           ("coordination.k8s.io", "leases", "update", "shardsched"),
                           # gangs: scheduler-plugins' PodGroups, a CRD kube-scheduler does not read
                           ("scheduling.x-k8s.io", "podgroups", "list", ""),
                           ("scheduling.x-k8s.io", "podgroups", "watch", "")}
    # what we leave out (docs/operations.md lists why): get on pods, legacy bindings,
    # Events update, CSIDrivers, the spreading and authn/authz reads
    dropped = {(g, r) for g, r, _, _ in kube - ours}
    assert ("", "pods") in dropped and ("", "bindings") in dropped and ("storage.k8s.io", "csidrivers") in dropped


def test_cluster_role_grants_what_the_kubernetes_backend_declares() -> None:
    """`shardsched.kube.cluster` lists the (verb, group, resource) it uses; all must be granted
    (the Lease verbs on the Lease of the deployed configuration)."""
    try:
        from shardsched.kube.permissions import GANG_PERMISSIONS, LEADER_PERMISSIONS, PERMISSIONS, STORAGE_PERMISSIONS
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("shardsched.kube"):
            raise
        pytest.skip("the Kubernetes backend (shardsched.kube) is not there yet")
    objects = RENDERED["base"]
    granted = cluster_role_permissions(one(objects, "ClusterRole", "shardsched"))
    config = load_config(one(objects, "ConfigMap", "shardsched-config")["data"]["config.yaml"])
    lease = config.leader_election.resource_name
    for verb, group, resource in PERMISSIONS + GANG_PERMISSIONS + LEADER_PERMISSIONS + STORAGE_PERMISSIONS:
        assert {(group, resource, verb, ""), (group, resource, verb, lease)} & granted, (verb, group, resource)


def test_standalone_rbac_grants_exactly_what_the_kustomize_base_grants():
    """deploy/rbac/ (kubectl apply -f, for serve outside KubeRay) and deploy/base/rbac.yaml must
    not drift apart: the same rules, as sets of (group, resource, verb, name)."""
    import yaml

    def grants(docs):
        role = next(d for d in docs if d and d.get("kind") == "ClusterRole")
        return {(g, r, v, n) for rule in role["rules"] for g in rule.get("apiGroups", [])
                for r in rule["resources"] for v in rule["verbs"] for n in rule.get("resourceNames") or [None]}

    base = list(yaml.safe_load_all((ROOT / "deploy/base/rbac.yaml").read_text()))
    standalone = list(yaml.safe_load_all((ROOT / "deploy/rbac/02-clusterrole.yaml").read_text()))
    assert grants(base) == grants(standalone)
