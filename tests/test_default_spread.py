"""PodTopologySpread's default constraints, table-driven against upstream's rules
(podtopologyspread.buildDefaultConstraints, helper.DefaultSelector, the scoring's
requireAllTopologies): the default selector from Services and controllers, the system defaults'
and ``List`` defaults' scores and filters worked out by hand, a Deployment's replicas through the
scheduler with kube's default profile, the partial view of a shard, and ``simulate`` end to end."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import yaml

from builders import default_framework, node, pod, run_filter, run_score, table_of
from forked_cli import run_cli
from shardsched.api.podaffinity import LabelSelector
from shardsched.api.workloads import SpreadSelectors, controller_of, workload_selector_of
from shardsched.cache.node_table import NodeTable
from shardsched.config import load_config, parse_plugin_args
from shardsched.errors import InvalidObjectError
from shardsched.framework.cycle_state import CycleState
from shardsched.plugins.registry import REGISTRY
from shardsched.scheduler.algorithm import GenericScheduler, build_schedulers

ZONE = "topology.kubernetes.io/zone"
RS_REF = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-h1", "controller": True, "uid": "rs-uid"}


def make(args: dict | None = None, partial_view: bool = False):
    """PodTopologySpread built as a profile builds it (args validated, then the registry's factory)."""
    return REGISTRY["PodTopologySpread"](None if args is None else parse_plugin_args("PodTopologySpread", args),
                                         partial_view)


def zoned(name: str, zone: str | None, cpu: str = "4", memory: str = "8Gi"):
    n = node(name, cpu=cpu, memory=memory)
    return n.with_labels({ZONE: zone}) if zone is not None else n


def replica(name: str, node_name: str | None = None, owner: dict | None = RS_REF, cpu: str | None = None, **labels):
    """A pod of the ReplicaSet web-h1 (labels app=web unless given), bound to ``node_name`` if set."""
    p = pod(name, cpu=cpu).with_labels(labels or {"app": "web"})
    if owner is not None:
        p["metadata"]["ownerReferences"] = [owner]
    return p.on(node_name) if node_name else p


def obj(kind: str, name: str, selector, namespace: str = "default") -> dict:
    return {"apiVersion": "apps/v1" if kind in ("ReplicaSet", "StatefulSet") else "v1", "kind": kind,
            "metadata": {"name": name, "namespace": namespace}, "spec": {"selector": selector}}


RS = obj("ReplicaSet", "web-h1", {"matchLabels": {"app": "web"}})


def with_objects(table: NodeTable, *objects: dict) -> NodeTable:
    table.set_spread_selectors([workload_selector_of(o) for o in objects])
    return table


# ------------------------------------------------------------------------- the default selector
@pytest.mark.parametrize(
    "objects, labels, owner, expected",
    [
        ([], {"app": "web"}, RS_REF, None),  # nothing selects the pod: no default constraints
        ([RS], {"app": "web"}, RS_REF, LabelSelector((), (("app", "In", ("web",)),))),
        # a Service's selector labels; another namespace's and a non-matching one's are left out
        ([obj("Service", "s", {"app": "web"}), obj("Service", "o", {"app": "web"}, "other"),
          obj("Service", "x", {"app": "db"})], {"app": "web"}, None, LabelSelector((("app", "web"),))),
        # two Services merge their labels; the ReplicaSet's requirements are ANDed
        ([obj("Service", "s1", {"app": "web"}), obj("Service", "s2", {"tier": "fe"}),
          obj("ReplicaSet", "web-h1", {"matchExpressions": [{"key": "rev", "operator": "Exists"}]})],
         {"app": "web", "tier": "fe", "rev": "1"}, RS_REF,
         LabelSelector((("app", "web"), ("tier", "fe")), (("rev", "Exists", ()),))),
        # a ReplicationController's selector labels merge into the Services'
        ([obj("ReplicationController", "rc", {"app": "web"})], {"app": "web"},
         {**RS_REF, "apiVersion": "v1", "kind": "ReplicationController", "name": "rc"}, LabelSelector((("app", "web"),))),
        ([obj("StatefulSet", "db", {"matchLabels": {"app": "db"}})], {"app": "db"},
         {**RS_REF, "kind": "StatefulSet", "name": "db"}, LabelSelector((), (("app", "In", ("db",)),))),
        # a Service without a selector selects nothing; a ReplicaSet named by no controller reference,
        # or referenced with another apiVersion, or without controller: true, adds nothing
        ([obj("Service", "s", None)], {"app": "web"}, None, None),
        ([RS], {"app": "web"}, {**RS_REF, "apiVersion": "extensions/v1beta1"}, None),
        ([RS], {"app": "web"}, {**RS_REF, "controller": False}, None),
        ([RS], {"app": "web"}, {**RS_REF, "name": "other"}, None),
    ],
    ids=["none", "replicaset", "service", "services-and-replicaset", "replicationcontroller", "statefulset",
         "service-without-selector", "other-api-version", "not-controller", "other-replicaset"],
)
def test_default_selector(objects, labels, owner, expected):
    sel = SpreadSelectors()
    sel.apply([workload_selector_of(o) for o in objects])
    controller = controller_of({"ownerReferences": [owner]} if owner else {})
    assert sel.default_selector("default", labels, controller) == expected


def test_spread_selectors_replace_update_and_delete_report_changes():
    sel = SpreadSelectors()
    svc = workload_selector_of(obj("Service", "s", {"app": "web"}))
    assert sel.apply([svc]) and not sel.apply([svc])  # the same selector again changes nothing
    assert sel.apply([workload_selector_of(obj("Service", "s", {"app": "db"}))])
    assert sel.default_selector("default", {"app": "web"}, None) is None
    assert sel.apply([], [("Service", "default", "s")]) and len(sel) == 0
    assert not sel.apply([], [("Service", "default", "s")])
    assert sel.apply([workload_selector_of(RS)], replace=True) and sel.objects() == [workload_selector_of(RS)]
    assert not sel.apply(sel.objects(), replace=True)


@pytest.mark.parametrize(
    "o, path",
    [
        (obj("Service", "s", ["app"]), "spec.selector"),
        (obj("ReplicaSet", "r", {"matchExpressions": [{"key": "a", "operator": "Near"}]}),
         "spec.selector.matchExpressions[0].operator"),
        ({"kind": "StatefulSet", "metadata": {}}, "metadata.name"),
        (obj("Deployment", "d", {}), "kind"),
    ],
    ids=["service-selector-not-a-map", "bad-operator", "no-name", "other-kind"],
)
def test_a_malformed_object_is_refused_naming_the_field(o, path):
    with pytest.raises(InvalidObjectError) as e:
        workload_selector_of(o)
    assert e.value.path == path


# ------------------------------------------------------------------------------- system defaults
@pytest.mark.parametrize(
    "counts, expected",
    [
        # a1 2, b1 1 replicas. Scored: all 4 nodes (the system defaults do not require the zone
        # label). Weights: hostname ln(4 + 2); zone ln(3 + 2): a, b and nz's domain "".
        # raw = count_node * ln6 + (3 - 1) + count_zone * ln5 + (5 - 1) (zone part only with the label):
        # a1 2*1.792+2 + 2*1.609+4 = 12.80 -> 13; a2 2 + 7.22 -> 9; b1 3.79 + 5.61 -> 9; nz 2.
        # normalized 100 * (13 + 2 - s) / 13: 15, 46, 46, 100
        ({"a1": 2, "b1": 1}, {"a1": 15, "a2": 46, "b1": 46, "nz": 100}),
        ({}, {"a1": 33, "a2": 33, "b1": 33, "nz": 100}),  # raw 6, 6, 6, 2: 100 * (6 + 2 - 6) / 6
    ],
    ids=["replicas-on-a1-b1", "no-replicas"],
)
def test_system_default_score(counts, expected):
    table = table_of(zoned("a1", "a"), zoned("a2", "a"), zoned("b1", "b"), zoned("nz", None),
                     pods=[replica(f"w-{n}-{i}", n) for n, c in counts.items() for i in range(c)])
    with_objects(table, RS)
    assert run_score(make(), replica("new"), table) == expected
    # args with defaultingType System are the same plugin
    assert run_score(make({"defaultingType": "System"}), replica("new"), table) == expected


def test_system_defaults_need_an_object_that_selects_the_pod():
    table = table_of(zoned("a1", "a"), zoned("b1", "b"), pods=[replica("w", "a1")])
    assert run_score(make(), replica("new"), table) is None  # no ReplicaSet known: Skip
    with_objects(table, RS)
    assert run_score(make(), replica("new", owner=None), table) is None  # not owned, no Service
    assert run_score(make(), replica("new"), table) is not None


def test_pods_with_their_own_constraints_get_no_default_ones():
    """Own ScheduleAnyway constraint over zones (count a 2, b 0, ln(2 + 2)): a1 round(2*1.386) = 3,
    b1 0, normalized 0 and 100; the default hostname constraint would have scored differently."""
    table = with_objects(table_of(zoned("a1", "a"), zoned("b1", "b"), pods=[replica("w1", "a1"), replica("w2", "a1")]),
                         RS)
    own = replica("new")
    own.spec["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "ScheduleAnyway",
                                              "labelSelector": {"matchLabels": {"app": "other"}}}]
    assert run_score(make(), own, table) == {"a1": 100, "b1": 100}  # counts app=other: none anywhere
    own.spec["topologySpreadConstraints"][0]["labelSelector"] = {"matchLabels": {"app": "web"}}
    assert run_score(make(), own, table) == {"a1": 0, "b1": 100}


# ---------------------------------------------------------------------------------- List defaults
LIST_HARD = {"defaultConstraints": [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule"}]}


def test_list_defaults_filter_with_the_default_selector():
    """A DoNotSchedule default over zones: a (2 replicas) vs b (0): a fails the skew, nz lacks the key."""
    table = with_objects(table_of(zoned("a1", "a"), zoned("b1", "b"), zoned("nz", None),
                                  pods=[replica("w1", "a1"), replica("w2", "a1"), replica("o", "b1", app="other")]), RS)
    passed, reasons = run_filter(make(LIST_HARD), replica("new"), table)
    assert passed == {"b1"}
    assert reasons == {"node(s) didn't match pod topology spread constraints": 1,
                       "node(s) didn't match pod topology spread constraints (missing required label)": 1}
    # a pod nothing selects has no default constraints: every node passes
    assert run_filter(make(LIST_HARD), replica("new", owner=None), table)[0] == {"a1", "b1", "nz"}


def test_list_defaults_require_every_key_when_scoring():
    """``List`` defaults are not the system's: a node without the zone key is ignored (score 0)."""
    soft = {"defaultConstraints": [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "ScheduleAnyway"}]}
    table = with_objects(table_of(zoned("a1", "a"), zoned("b1", "b"), zoned("nz", None), pods=[replica("w1", "a1")]),
                         RS)
    # a: 1 replica, b 0, ln(2 + 2): raw a1 1, b1 0 -> 0 and 100; nz ignored
    assert run_score(make(soft), replica("new"), table) == {"a1": 0, "b1": 100, "nz": 0}


def test_list_defaults_with_do_not_schedule_need_the_cluster_view_in_a_shard():
    shard = make(LIST_HARD, partial_view=True)
    assert shard.needs_cluster_view(replica("new").info())
    own = replica("new")
    own.spec["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "ScheduleAnyway",
                                              "labelSelector": {"matchLabels": {"app": "web"}}}]
    assert not shard.needs_cluster_view(own.info())  # its own (soft) constraints replace the defaults
    assert not make(partial_view=True).needs_cluster_view(replica("new").info())  # system defaults only score
    table = with_objects(table_of(zoned("a1", "a")), RS)
    st = shard.pre_filter(CycleState(), replica("new").info(), table)
    assert not st.is_success() and "no node was nominated" in st.message


# --------------------------------------------------------------------- a Deployment's replicas
def _replicas_placed(known: bool, n: int = 8) -> list[str]:
    nodes = [zoned("a1", "a", cpu="32", memory="64Gi"), zoned("b1", "b"), zoned("b2", "b"), zoned("c1", "c")]
    table = table_of(*nodes)
    if known:
        with_objects(table, RS)
    sched = GenericScheduler(default_framework(), table, seed=1)
    return [sched.schedule(replica(f"web-{i}", cpu="500m").info()).node for i in range(n)]


def test_a_deployments_replicas_spread_over_zones_as_kube_spreads_them():
    """kubernetes #102136: a big node a1 (32 cpus, 64 GiB) beside three 4-cpu 8 GiB nodes in zones b, b, c.
    Without default spreading LeastAllocated keeps a1 the emptiest and the replicas pile up there.
    With the ReplicaSet known, the system defaults (PodTopologySpread, weight 2) outweigh it: after
    one replica on a1, a1 scores 2 * 100 * (9 + 6 - 9) / 9 = 132 (raw 1*ln6 + 2 + 1*ln5 + 4 = 9)
    and every other node 200 (raw 6), far more than LeastAllocated's few points for a1; so the
    first three replicas take one zone each, and no node gets a third replica before each has one."""
    unknown = Counter(_replicas_placed(False))
    assert unknown["a1"] >= 7, unknown
    placed = _replicas_placed(True)
    assert {p[0] for p in placed[:3]} == {"a", "b", "c"}, placed
    assert set(placed[:4]) == {"a1", "b1", "b2", "c1"}, placed
    counts = Counter(placed)
    assert max(counts.values()) - min(counts.values()) <= 2, counts


def test_a_new_replica_set_changes_the_next_decision_of_a_cached_signature():
    """The per-signature cache is dropped when a selector changes (affinity_generation moves)."""
    table = table_of(zoned("a1", "a", cpu="32"), zoned("b1", "b"), pods=[replica(f"w{i}", "a1") for i in range(3)])
    sched = GenericScheduler(default_framework(), table, seed=0)
    p = replica("new", cpu="500m").info()
    assert sched.schedule(p, assume=False).node == "a1"
    generation = table.affinity_generation
    with_objects(table, RS)
    assert table.affinity_generation == generation + 1
    assert sched.schedule(p, assume=False).node == "b1"


# ----------------------------------------------------------------------------------- simulate
def _simulate(tmp_path, docs: list[dict], config: dict | None = None) -> tuple[dict, str]:
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    args = ["simulate", "-f", str(path), "-o", "json"]
    if config is not None:
        cfg = tmp_path / "config.yaml"
        cfg.write_text(yaml.safe_dump(config))
        args += ["--config", str(cfg)]
    run = run_cli(args, timeout=120)
    assert run.returncode == 0, run.stderr
    return {p["name"]: p for p in json.loads(run.stdout)["pods"]}, run.stderr


def _node_doc(name: str, zone: str, cpu: str = "4") -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                                                       ZONE: zone}},
            "status": {"allocatable": {"cpu": cpu, "memory": "64Gi", "pods": "110"}}}


def _pod_doc(name: str, owner: dict | None = None) -> dict:
    meta = {"name": name, "namespace": "default", "labels": {"app": "web"}}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "500m"}}}]}}


NODES = [_node_doc("a1", "a", "32"), _node_doc("b1", "b"), _node_doc("b2", "b"), _node_doc("c1", "c")]


def test_cli_a_service_spreads_its_pods(tmp_path):
    """The same cluster through ``simulate``: a Service selecting app=web spreads four pods over the
    four nodes; without it they all go to a1 (LeastAllocated)."""
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}}}
    pods = [_pod_doc(f"w{i}") for i in range(4)]
    out, stderr = _simulate(tmp_path, NODES + [service] + pods)
    assert "ignoring" not in stderr
    assert sorted(p["node"] for p in out.values()) == ["a1", "b1", "b2", "c1"]
    out, _ = _simulate(tmp_path, NODES + pods)
    assert {p["node"] for p in out.values()} == {"a1"}


def test_cli_list_defaults_with_a_statefulset(tmp_path):
    """``defaultConstraints`` (List) with DoNotSchedule over zones: a StatefulSet's 6 pods end 2 per
    zone; a pod it does not own is not constrained."""
    sts = obj("StatefulSet", "db", {"matchLabels": {"app": "web"}})
    sts["spec"].update({"serviceName": "db", "template": {"metadata": {"labels": {"app": "web"}},
                                                         "spec": {"containers": [{"name": "c", "image": "x"}]}}})
    owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "u", "controller": True}
    config = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
              "profiles": [{"schedulerName": "default-scheduler", "pluginConfig": [
                  {"name": "PodTopologySpread", "args": {**LIST_HARD, "defaultingType": "List"}}]}]}
    pods = [_pod_doc(f"db-{i}", owner) for i in range(6)] + [_pod_doc(f"free-{i}") for i in range(3)]
    out, _ = _simulate(tmp_path, NODES + [sts] + pods, config)
    assert Counter(out[f"db-{i}"]["node"][0] for i in range(6)) == {"a": 2, "b": 2, "c": 2}
    assert all(out[f"free-{i}"]["node"] == "a1" for i in range(3))  # LeastAllocated, no constraint


def test_cli_a_malformed_service_is_named_and_the_rest_runs(tmp_path):
    bad = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "r"},
           "spec": {"selector": {"matchExpressions": [{"key": "app", "operator": "In"}]},
                    "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}}
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump_all(NODES + [bad, _pod_doc("w")]))
    run = run_cli(["simulate", "-f", str(path), "-o", "json"], timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "in.yaml#5: invalid ReplicaSet: spec.selector.matchExpressions[0].values: In needs at least one value" \
        in run.stderr
    assert [p["status"] for p in json.loads(run.stdout)["pods"]] == ["Scheduled"]


def test_default_profile_builds_with_the_system_defaults():
    sched = build_schedulers(load_config(None), NodeTable(), 0)["default-scheduler"]
    plugin = next(p for p in sched.framework.filter_plugins if p.name == "PodTopologySpread")
    assert plugin.system_defaulted and [(c.topology_key, c.max_skew, c.when_unsatisfiable)
                                        for c in plugin.default_constraints] == [
        ("kubernetes.io/hostname", 3, "ScheduleAnyway"), (ZONE, 5, "ScheduleAnyway")]
