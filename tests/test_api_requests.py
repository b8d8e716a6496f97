"""A pod's effective request (upstream component-helpers ``PodRequests``), kube's non-zero scoring
defaults, and the field paths PodInfo / NodeInfo name when an object is malformed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import node, pod, term, expr
from shardsched.api.objects import NodeInfo, PodInfo
from shardsched.api.requests import nonzero_requests, pod_requests
from shardsched.errors import InvalidObjectError

GI = 2**30
MI = 2**20


# ---------------------------------------------------------------------------------- PodRequests
@pytest.mark.parametrize(
    "spec, expected",
    [
        (pod(cpu="500m", memory="1Gi"), {"cpu": 500, "memory": GI}),
        (pod(cpu="1", memory="1Gi").with_container(cpu="250m", memory="512Mi"), {"cpu": 1250, "memory": GI + 512 * MI}),
        (pod(), {}),
        # classic init container: per-resource max of (app containers, the init container)
        (pod(cpu="1", memory="1Gi").with_init(cpu="2", memory="512Mi"), {"cpu": 2000, "memory": GI}),
        (pod(cpu="1").with_init(cpu="500m").with_init(cpu="1500m"), {"cpu": 1500}),
        # a sidecar (restartable init container) runs beside the app containers: it is added
        (pod(cpu="1").with_init(cpu="500m", sidecar=True), {"cpu": 1500}),
        # sidecar declared after a classic init: the classic one ran alone -> max(1 + 0.5, 2)
        (pod(cpu="1").with_init(cpu="2").with_init(cpu="500m", sidecar=True), {"cpu": 2000}),
        # classic init after a sidecar runs beside it -> max(1 + 0.5, 2 + 0.5)
        (pod(cpu="1").with_init(cpu="500m", sidecar=True).with_init(cpu="2"), {"cpu": 2500}),
        # s1, i1, s2, i2: i2 runs with both sidecars -> max(1 + 1 + 1, 1 + 1, 2 + 1 + 1) = 4
        (pod(cpu="1").with_init(cpu="1", sidecar=True).with_init(cpu="1").with_init(cpu="1", sidecar=True)
         .with_init(cpu="2"), {"cpu": 4000}),
        # overhead is added after the max
        (pod(cpu="1").with_init(cpu="2").with_overhead(cpu="250m", memory="64Mi"), {"cpu": 2250, "memory": 64 * MI}),
        # pod-level requests replace cpu/memory from the containers; others stay; overhead still added
        (pod(cpu="1", memory="1Gi", requests={"example.com/gpu": "1"}).with_container(cpu="1")
         .with_pod_resources(cpu="3"), {"cpu": 3000, "memory": GI, "example.com/gpu": 1}),
        (pod(cpu="1", memory="1Gi").with_pod_resources(memory="2Gi").with_overhead(memory="1Gi"),
         {"cpu": 1000, "memory": 3 * GI}),
        # requests defaulted from limits (SetDefaults_Pod), an explicit request wins
        (pod(limits={"cpu": "2", "memory": "1Gi"}), {"cpu": 2000, "memory": GI}),
        (pod(cpu="1", limits={"cpu": "2"}), {"cpu": 1000}),
        (pod().with_init(limits={"cpu": "3"}), {"cpu": 3000}),
        # extended resources follow the same rule
        (pod(requests={"example.com/gpu": "1"}).with_container(requests={"example.com/gpu": "2"})
         .with_init(requests={"example.com/gpu": "4"}), {"example.com/gpu": 4}),
        # an explicit zero is kept as zero
        (pod(cpu="0"), {"cpu": 0}),
    ],
    ids=["one-container", "two-containers", "no-requests", "init-max-per-resource", "two-inits",
         "sidecar-added", "sidecar-after-classic-init", "classic-init-after-sidecar", "sidecars-interleaved",
         "overhead", "pod-level-cpu", "pod-level-memory-plus-overhead", "limits-default-requests",
         "request-wins-over-limit", "init-limit-defaults-request", "extended", "explicit-zero"],
)
def test_pod_requests(spec, expected):
    assert pod_requests(spec) == expected


@pytest.mark.parametrize(
    "spec, expected",
    [
        (pod(), (100, 200 * MI)),  # kube's DefaultMilliCPURequest / DefaultMemoryRequest
        (pod().with_container(), (200, 400 * MI)),  # per container
        (pod(cpu="0"), (0, 200 * MI)),  # an explicit zero stays zero
        (pod(cpu="0", memory="0"), (0, 0)),
        (pod(cpu="1"), (1000, 200 * MI)),
        (pod(limits={"cpu": "2"}), (2000, 200 * MI)),  # request defaulted from the limit is not missing
        (pod(cpu="1").with_init(), (1000, 200 * MI)),  # init containers get defaults too, then max
        (pod(cpu="50m").with_init(), (100, 200 * MI)),
        (pod(cpu="1").with_init(sidecar=True), (1100, 400 * MI)),  # sidecar defaults are added
        (pod().with_overhead(cpu="50m"), (150, 200 * MI)),
        (pod().with_pod_resources(cpu="2"), (2000, 200 * MI)),
    ],
    ids=["empty", "two-empty", "explicit-zero-cpu", "explicit-zeros", "memory-missing", "from-limit",
         "init-default", "init-default-wins", "sidecar-default", "overhead", "pod-level"],
)
def test_nonzero_requests_for_scoring(spec, expected):
    assert nonzero_requests(spec) == expected


def test_pod_info_requests_add_pod_count_and_drop_zeros():
    info = pod(cpu="0", memory="1Gi", requests={"example.com/gpu": "0"}).info()
    assert info.requests == {"memory": GI, "pods": 1}
    assert (info.nonzero_cpu_milli, info.nonzero_memory_bytes) == (0, GI)
    info = pod().info()
    assert info.requests == {"pods": 1}
    assert (info.nonzero_cpu_milli, info.nonzero_memory_bytes) == (100, 200 * MI)


def test_pod_info_from_client_model():
    from kubernetes.client import V1Container, V1ObjectMeta, V1Pod, V1PodSpec, V1ResourceRequirements

    model = V1Pod(metadata=V1ObjectMeta(name="m", namespace="ns", uid="u1"),
                  spec=V1PodSpec(containers=[V1Container(name="c", resources=V1ResourceRequirements(
                      requests={"cpu": "250m", "memory": "64Mi"}))]))
    info = PodInfo.from_object(model)
    assert info.key == "ns/m"
    assert info.requests == {"cpu": 250, "memory": 64 * MI, "pods": 1}


# ------------------------------------------------------------------- the formula as a property
RESOURCES = ("cpu", "memory", "example.com/gpu")
_amount = {"cpu": st.integers(0, 4000), "memory": st.integers(0, 2**34), "example.com/gpu": st.integers(0, 8)}


def _text(name: str, value: int) -> str:
    return f"{value}m" if name == "cpu" else str(value)


def _resource_map():
    return st.fixed_dictionaries({}, optional={r: _amount[r] for r in RESOURCES})


_container = st.fixed_dictionaries({"requests": _resource_map(), "limits": _resource_map()})
_init = st.fixed_dictionaries({"requests": _resource_map(), "limits": _resource_map(), "sidecar": st.booleans()})
_spec = st.fixed_dictionaries({
    "containers": st.lists(_container, min_size=1, max_size=3),
    "init": st.lists(_init, max_size=4),
    "overhead": _resource_map(),
    "pod_level": st.fixed_dictionaries({}, optional={r: _amount[r] for r in ("cpu", "memory")}),
})


def _to_pod(spec: dict) -> dict:
    def c(i: int, data: dict, kind: str) -> dict:
        out: dict = {"name": f"{kind}{i}", "resources": {
            "requests": {k: _text(k, v) for k, v in data["requests"].items()},
            "limits": {k: _text(k, v) for k, v in data["limits"].items()}}}
        if data.get("sidecar"):
            out["restartPolicy"] = "Always"
        return out

    body: dict = {"containers": [c(i, x, "app") for i, x in enumerate(spec["containers"])],
                  "initContainers": [c(i, x, "init") for i, x in enumerate(spec["init"])]}
    if spec["overhead"]:
        body["overhead"] = {k: _text(k, v) for k, v in spec["overhead"].items()}
    if spec["pod_level"]:
        body["resources"] = {"requests": {k: _text(k, v) for k, v in spec["pod_level"].items()}}
    return {"metadata": {"name": "p"}, "spec": body}


def _reference(spec: dict, defaults: dict | None = None) -> dict:
    """The rule as the sidecar KEP states it, written out plainly per resource."""
    def request(c: dict) -> dict:
        r = {**c["limits"], **c["requests"]}  # a missing request defaults to the limit
        for k, v in (defaults or {}).items():
            r.setdefault(k, v)
        return r

    apps = [request(c) for c in spec["containers"]]
    inits = [(request(c), c["sidecar"]) for c in spec["init"]]
    names = set().union(*apps, *(r for r, _ in inits), spec["pod_level"], spec["overhead"])
    out = {}
    for name in names:
        steady = sum(r.get(name, 0) for r in apps) + sum(r.get(name, 0) for r, sidecar in inits if sidecar)
        peak = 0
        for i, (r, sidecar) in enumerate(inits):
            earlier_sidecars = sum(s.get(name, 0) for s, is_sc in inits[:i] if is_sc)
            peak = max(peak, earlier_sidecars + r.get(name, 0))  # a sidecar's own use includes itself
        value = max(steady, peak)
        if name in spec["pod_level"]:
            value = spec["pod_level"][name]
        out[name] = value + spec["overhead"].get(name, 0)
    return out


@settings(max_examples=300, deadline=None)
@given(_spec)
def test_pod_requests_matches_the_rule(spec):
    obj = _to_pod(spec)
    assert pod_requests(obj) == _reference(spec)
    scoring = _reference(spec, {"cpu": 100, "memory": 200 * MI})
    assert nonzero_requests(obj) == (scoring.get("cpu", 0), scoring.get("memory", 0))


# --------------------------------------------------------------------------- malformed objects
AFF = "spec.affinity.nodeAffinity"
REQ = f"{AFF}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
PREF = f"{AFF}.preferredDuringSchedulingIgnoredDuringExecution"


def _edit(builder, fn):
    fn(builder)
    return builder


@pytest.mark.parametrize(
    "obj, path",
    [
        (_edit(pod(), lambda p: p["spec"].update(containers=[])), "spec.containers"),
        (_edit(pod(), lambda p: p["spec"].pop("containers")), "spec.containers"),
        (_edit(pod(), lambda p: p["metadata"].pop("name")), "metadata.name"),
        (pod().with_required(term(expr("zone", "In", "a"), expr("disk", "Like", "ssd"))),
         f"{REQ}[0].matchExpressions[1].operator"),
        (pod().with_required(term(expr("zone", "In", "a")), term(expr("zone", "In"))), f"{REQ}[1].matchExpressions[0].values"),
        (pod().with_required(term(expr("gen", "Gt", "abc"))), f"{REQ}[0].matchExpressions[0].values"),
        (pod().with_required(term(expr("gen", "Gt", "1_0"))), f"{REQ}[0].matchExpressions[0].values"),
        (pod().with_required(term(expr("gen", "Lt", "1", "2"))), f"{REQ}[0].matchExpressions[0].values"),
        (pod().with_required(term(expr("zone", "Exists", "a"))), f"{REQ}[0].matchExpressions[0].values"),
        (pod().with_required(term(fields=[expr("metadata.uid", "In", "x")])), f"{REQ}[0].matchFields[0].key"),
        (pod().with_preferred(10, term(expr("zone", "in", "a"))), f"{PREF}[0].preference.matchExpressions[0].operator"),
        (pod().with_preferred(0, term(expr("zone", "In", "a"))), f"{PREF}[0].weight"),
        (pod().with_preferred(5, term(expr("zone", "In", "a"))).with_preferred(101, term(expr("zone", "In", "b"))),
         f"{PREF}[1].weight"),
        (pod().with_preferred("5", term(expr("zone", "In", "a"))), f"{PREF}[0].weight"),
        (pod().with_toleration("k", "v", operator="Like"), "spec.tolerations[0].operator"),
        (pod().with_toleration("k", "v").with_toleration("k", "v", effect="NoWay"), "spec.tolerations[1].effect"),
        (pod().with_toleration("", "v", operator="Equal"), "spec.tolerations[0].operator"),
        (pod(cpu="1").with_init(cpu="1").with_init(limits={"memory": "lots"}),
         "spec.initContainers[1].resources.limits.memory"),
        (pod(cpu="-1"), "spec.containers[0].resources.requests.cpu"),
        (pod().with_overhead(cpu="1x"), "spec.overhead.cpu"),
        (pod().with_pod_resources(memory="1Q"), "spec.resources.requests.memory"),
        (pod().with_host_port(70000), "spec.containers[0].ports[0].hostPort"),
        (pod().with_host_port(80, protocol="HTTP"), "spec.containers[0].ports[0].protocol"),
        (pod().with_node_selector(zone=["a"]), "spec.nodeSelector.zone"),
        (_edit(pod(), lambda p: p["spec"].update(priorityClassName="high")), "spec.priorityClassName"),
    ],
    ids=["no-containers", "containers-missing", "no-name", "bad-operator", "in-without-values",
         "gt-not-integer", "gt-underscore", "gt-two-values", "exists-with-values", "bad-field",
         "bad-preferred-operator", "weight-0", "weight-101", "weight-string", "toleration-operator",
         "toleration-effect", "empty-key-equal", "init-limit-quantity", "negative-request",
         "overhead-quantity", "pod-level-quantity", "host-port-range", "protocol", "selector-value",
         "unknown-priority-class"],
)
def test_pod_errors_name_the_field(obj, path):
    with pytest.raises(InvalidObjectError) as exc:
        PodInfo.from_object(obj)
    assert exc.value.path == path


@pytest.mark.parametrize(
    "obj, path",
    [
        (node("n").with_taint("a", "1").with_taint("b", "2", effect="NoScheduleX"), "spec.taints[1].effect"),
        (_edit(node("n"), lambda n: n["spec"].update(taints=[{"value": "v", "effect": "NoSchedule"}])),
         "spec.taints[0].key"),
        (node("n", cpu="four"), "status.allocatable.cpu"),
        (node("n", alloc={"nvidia.com/gpu": "-1"}), "status.allocatable.nvidia.com/gpu"),
        (_edit(node("n"), lambda n: n.pop("metadata")), "metadata"),
        (_edit(node("n"), lambda n: n["metadata"].update(labels=["a"])), "metadata.labels"),
    ],
    ids=["taint-effect", "taint-key", "allocatable", "negative-extended", "no-metadata", "labels-not-map"],
)
def test_node_errors_name_the_field(obj, path):
    with pytest.raises(InvalidObjectError) as exc:
        NodeInfo.from_object(obj)
    assert exc.value.path == path


def test_node_without_allocatable_has_nothing():
    info = NodeInfo.from_object({"metadata": {"name": "bare"}})
    assert info.allocatable == {} and info.taints == () and not info.unschedulable
