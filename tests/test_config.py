"""shardsched.config: loading, kube's defaulting and plugin merge rules, validation errors and paths."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsched.config import (
    API_VERSION, EXTENSION_POINTS, PLUGIN_POINTS, SUPPORTED_PLUGINS, UNIMPLEMENTED_PLUGINS,
    NodeResourcesFitArgs, PluginRef, load_config, parse_config, parse_plugin_args,
)
from shardsched.config.merge import PluginSet, merge_plugin_set
from shardsched.errors import ConfigError

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "config"
KIND = "KubeSchedulerConfiguration"

# ---------------------------------------------------------------- builders


def plugin_set(enabled=(), disabled=()) -> dict:
    """``{enabled: [...], disabled: [...]}``; an enabled item is a name or (name, weight)."""
    out: dict = {}
    if enabled:
        out["enabled"] = [{"name": e} if isinstance(e, str) else {"name": e[0], "weight": e[1]} for e in enabled]
    if disabled:
        out["disabled"] = [{"name": d} for d in disabled]
    return out


def profile(name: str | None = None, plugins: dict | None = None, plugin_config=None, **fields) -> dict:
    out: dict = dict(fields)
    if name is not None:
        out["schedulerName"] = name
    if plugins is not None:
        out["plugins"] = plugins
    if plugin_config is not None:
        out["pluginConfig"] = [{"name": n, "args": a} for n, a in plugin_config]
    return out


def doc(*profiles: dict, **top) -> dict:
    out = {"apiVersion": API_VERSION, "kind": KIND, **top}
    if profiles:
        out["profiles"] = list(profiles)
    return out


def parse(data: dict):
    return parse_config(yaml.safe_dump(data, sort_keys=False), "config.yaml")


def names(prof) -> dict[str, list[str]]:
    return {point: [r.name for r in refs] for point, refs in prof.plugins.items()}


def score(prof) -> list[tuple[str, int]]:
    return [(r.name, r.weight) for r in prof.enabled("score")]


#: kube's volume plugins, between NodeResourcesFit and PodTopologySpread in its default order
VOLUME_FILTERS = ["VolumeRestrictions", "NodeVolumeLimits", "VolumeBinding", "VolumeZone"]
DEFAULT_NAMES = {
    "preEnqueue": ["SchedulingGates"],
    "queueSort": ["PrioritySort"],
    "preFilter": ["NodeAffinity", "NodePorts", "NodeResourcesFit", *VOLUME_FILTERS, "PodTopologySpread",
                  "InterPodAffinity"],
    "filter": ["NodeUnschedulable", "NodeName", "TaintToleration", "NodeAffinity", "NodePorts", "NodeResourcesFit",
               *VOLUME_FILTERS, "PodTopologySpread", "InterPodAffinity"],
    "postFilter": ["DefaultPreemption"],
    "preScore": ["TaintToleration", "NodeAffinity", "NodeResourcesFit", "VolumeBinding", "PodTopologySpread",
                 "InterPodAffinity", "NodeResourcesBalancedAllocation"],
    "score": ["TaintToleration", "NodeAffinity", "NodeResourcesFit", "VolumeBinding", "PodTopologySpread",
              "InterPodAffinity", "NodeResourcesBalancedAllocation"],
    "reserve": ["VolumeBinding"],
    "preBind": ["VolumeBinding"],
    "bind": ["DefaultBinder"],
}
# VolumeBinding is at score as in kube's resolved profile (weight 1); like upstream without the
# VolumeCapacityPriority gate it gives every node the same score (it is no Score plugin here)
DEFAULT_SCORE = [("TaintToleration", 3), ("NodeAffinity", 2), ("NodeResourcesFit", 1), ("VolumeBinding", 1),
                 ("PodTopologySpread", 2), ("InterPodAffinity", 2), ("NodeResourcesBalancedAllocation", 1)]
VB_PTS_IPA = [("VolumeBinding", 1), ("PodTopologySpread", 2), ("InterPodAffinity", 2)]

# The field report's file (section 5.4), indentation restored, comments and trailing "---" kept.
REPORT_FILE = """\
# scheduler-config.yaml
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: /etc/kubernetes/scheduler.conf
profiles:
- schedulerName: fast-scheduler
  plugins:
    filter:
      enabled:
      - name: FastMatch # 只保留自己
      disabled:
      - name: "*" # 禁用所有默认
    score:
      enabled:
      - name: FastScore
      disabled:
      - name: "*"
    preFilter:
      disabled:
      - name: "*"
    postFilter:
      disabled:
      - name: "*"
    reserve:
      disabled:
      - name: "*"
    preBind:
      disabled:
      - name: "*"
    bind:
      enabled:
      - name: DefaultBinder # 必须保留默认绑定器
---
"""

# ---------------------------------------------------------------- loading and defaults


@pytest.mark.parametrize("source", [None, "", "# nothing but a comment\n", "---\n"],
                         ids=["none", "empty-string", "comment-only", "empty-document"])
def test_no_configuration_gives_kube_defaults(source):
    config = load_config(source)
    assert [p.scheduler_name for p in config.profiles] == ["default-scheduler"]
    prof = config.profiles[0]
    assert names(prof) == DEFAULT_NAMES
    assert score(prof) == DEFAULT_SCORE
    assert sorted(prof.plugin_args) == ["DefaultPreemption", "InterPodAffinity", "NodeAffinity",
                                        "NodeResourcesBalancedAllocation", "NodeResourcesFit", "PodTopologySpread",
                                        "VolumeBinding"]
    preemption = prof.plugin_args["DefaultPreemption"]
    assert (preemption.min_candidate_nodes_percentage, preemption.min_candidate_nodes_absolute) == (10, 100)
    fit = prof.plugin_args["NodeResourcesFit"]
    assert fit.scoring_strategy.type == "LeastAllocated"
    assert [(r.name, r.weight) for r in fit.scoring_strategy.resources] == [("cpu", 1), ("memory", 1)]
    assert prof.plugin_args["NodeAffinity"].added_affinity is None
    assert (config.pod_initial_backoff_s, config.pod_max_backoff_s, config.pod_max_in_unschedulable_s) == (1, 10, 300)
    assert (config.max_scheduling_attempts, config.parallelism, config.percentage_of_nodes_to_score) == (5, 16, None)
    assert prof.percentage_of_nodes_to_score is None
    assert config.client_connection.qps == 50 and config.client_connection.burst == 100
    assert config.leader_election.lease_duration_s == 15 and config.leader_election.resource_lock == "leases"


def test_top_level_fields_are_read():
    config = parse(doc(
        profile("a"), profile("b", percentageOfNodesToScore=0),
        percentageOfNodesToScore=30, podInitialBackoffSeconds=2, podMaxBackoffSeconds=20,
        podMaxInUnschedulablePodsDurationSeconds=60, parallelism=8,
        shardsched={"maxSchedulingAttempts": 3},
        clientConnection={"kubeconfig": "/etc/kubernetes/scheduler.conf", "qps": 0},
        leaderElection={"leaderElect": False, "leaseDuration": "1m30s"},
    ))
    assert (config.pod_initial_backoff_s, config.pod_max_backoff_s, config.pod_max_in_unschedulable_s) == (2, 20, 60)
    assert (config.max_scheduling_attempts, config.parallelism, config.percentage_of_nodes_to_score) == (3, 8, 30)
    assert [p.percentage_of_nodes_to_score for p in config.profiles] == [30, 0]
    assert config.client_connection.kubeconfig == "/etc/kubernetes/scheduler.conf"
    assert config.client_connection.qps == 50  # 0 means kube's default
    assert config.leader_election.leader_elect is False and config.leader_election.lease_duration_s == 90


def test_profile_for_and_score_weight():
    config = parse(doc(profile("a"), profile("b", plugins={"score": plugin_set(disabled=["*"])})))
    assert config.profile_for("b").scheduler_name == "b"
    assert config.profile_for("default-scheduler") is None
    a, b = config.profiles
    assert a.score_weight("TaintToleration") == 3
    assert a.score_weight("NodePorts") == 0
    assert b.score_weight("TaintToleration") == 0
    assert b.enabled("score") == [] and b.enabled("permit") == []
    with pytest.raises(KeyError):
        a.enabled("Filter")


def test_load_from_path_names_the_file(tmp_path):
    path = tmp_path / "sched.yaml"
    path.write_text(yaml.safe_dump(doc(profile("x"))))
    assert load_config(path).profiles[0].scheduler_name == "x"
    assert load_config(str(path)).source == str(path)
    path.write_text(yaml.safe_dump(doc(parallelism=0)))
    with pytest.raises(ConfigError, match=rf"^{path}: parallelism: must be greater than 0$"):
        load_config(path)


@pytest.mark.parametrize("content", ["", "# nothing but a comment\n", "---\n"],
                         ids=["empty", "comment-only", "empty-document"])
def test_config_file_without_a_document_is_an_error(tmp_path, content):
    path = tmp_path / "sched.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=rf"^{path}: no KubeSchedulerConfiguration document \(the file is empty"):
        load_config(path)


def test_v1beta3_is_accepted_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="shardsched.config"):
        config = parse({**doc(), "apiVersion": "kubescheduler.config.k8s.io/v1beta3"})
    assert names(config.profiles[0]) == DEFAULT_NAMES
    assert "deprecated" in caplog.text


@pytest.mark.parametrize("path", sorted(DEPLOY.glob("*.yaml")), ids=lambda p: p.name)
def test_deploy_examples_load(path):
    config = load_config(path)
    sort = "Coscheduling" if path.name == "coscheduling.yaml" else "PrioritySort"
    for prof in config.profiles:
        assert [r.name for r in prof.enabled("queueSort")] == [sort]
        assert prof.enabled("bind")


def test_every_profile_has_the_same_queue_sort():
    """upstream's validateCommonQueueSort: one queue orders the pods of every profile."""
    with pytest.raises(ConfigError, match=r"profiles\[1\]\.plugins\.queueSort: queueSort must be the same for all "
                                          r"profiles \(profiles\[0\]'s: PrioritySort\)"):
        parse({**doc(), "profiles": [
            {"schedulerName": "a"},
            {"schedulerName": "b", "plugins": {"queueSort": {"enabled": [{"name": "Coscheduling"}],
                                                             "disabled": [{"name": "PrioritySort"}]}}}]})


def test_default_example_is_exactly_the_defaults(caplog):
    with caplog.at_level(logging.WARNING, logger="shardsched.config"):
        assert load_config(DEPLOY / "default.yaml") == load_config(None)
    assert caplog.text == ""


def test_most_allocated_example_packs():
    config = load_config(DEPLOY / "most-allocated.yaml")
    packing = config.profile_for("bin-packing-scheduler")
    strategy = packing.plugin_args["NodeResourcesFit"].scoring_strategy
    assert strategy.type == "MostAllocated"
    assert packing.score_weight("NodeResourcesFit") == 5
    assert config.profile_for("default-scheduler").plugin_args["NodeResourcesFit"].scoring_strategy.type == "LeastAllocated"


# ---------------------------------------------------------------- the field report's file


def test_report_file_names_its_unknown_plugins():
    with pytest.raises(ConfigError) as err:
        parse_config(REPORT_FILE, "scheduler-config.yaml")
    lines = str(err.value).splitlines()
    assert lines[0].startswith("scheduler-config.yaml: profiles[0].plugins.filter.enabled[0].name: unknown plugin 'FastMatch'")
    assert lines[1].startswith("scheduler-config.yaml: profiles[0].plugins.score.enabled[0].name: unknown plugin 'FastScore'")
    for line in lines:
        assert "supported plugins: " + ", ".join(SUPPORTED_PLUGINS) in line


def test_report_file_adapted_keeps_default_prescore_like_kube():
    """Word for word with NodeResourcesFit, preScore is not disabled, so kube's multiPoint
    expansion still puts the four default PreScore plugins there."""
    text = REPORT_FILE.replace("FastMatch", "NodeResourcesFit").replace("FastScore", "NodeResourcesFit")
    prof = parse_config(text).profiles[0]
    assert names(prof) == {
        "preEnqueue": ["SchedulingGates"], "queueSort": ["PrioritySort"], "filter": ["NodeResourcesFit"],
        "preScore": DEFAULT_NAMES["preScore"], "score": ["NodeResourcesFit"], "bind": ["DefaultBinder"],
    }


def test_fast_scheduler_example_resolves_to_only_its_plugins():
    config = load_config(DEPLOY / "fast-scheduler.yaml")
    prof = config.profile_for("fast-scheduler")
    assert names(prof) == {"preEnqueue": ["SchedulingGates"], "preFilter": ["NodeResourcesFit"],
                           "filter": ["NodeResourcesFit"], "score": ["NodeResourcesFit"], "bind": ["DefaultBinder"],
                           "queueSort": ["PrioritySort"]}
    assert score(prof) == [("NodeResourcesFit", 1)]
    assert list(prof.plugin_args) == ["NodeResourcesFit"]
    assert config.client_connection.kubeconfig == "/etc/kubernetes/scheduler.conf"


# ---------------------------------------------------------------- merge rules

MERGE_CASES = [
    # (id, plugins section, expected names for the listed points, expected score list or None)
    ("disable-star-then-enable-one",
     {"filter": plugin_set(["NodeName"], ["*"])},
     {"filter": ["NodeName"], "preFilter": DEFAULT_NAMES["preFilter"]}, DEFAULT_SCORE),
    ("disable-one-at-one-point",
     {"filter": plugin_set(disabled=["TaintToleration"])},
     {"filter": ["NodeUnschedulable", "NodeName", "NodeAffinity", "NodePorts", "NodeResourcesFit", *VOLUME_FILTERS,
                 "PodTopologySpread", "InterPodAffinity"],
      "preScore": DEFAULT_NAMES["preScore"]}, DEFAULT_SCORE),
    ("reenable-with-weight-moves-first",
     {"score": plugin_set([("NodeResourcesBalancedAllocation", 5)])},
     {}, [("NodeResourcesBalancedAllocation", 5), ("TaintToleration", 3), ("NodeAffinity", 2), ("NodeResourcesFit", 1),
          *VB_PTS_IPA]),
    ("reenable-without-weight-is-weight-1",
     {"score": plugin_set(["TaintToleration"])},
     {}, [("TaintToleration", 1), ("NodeAffinity", 2), ("NodeResourcesFit", 1), *VB_PTS_IPA,
          ("NodeResourcesBalancedAllocation", 1)]),
    ("disable-and-enable-same-plugin-goes-last",
     {"score": plugin_set([("NodeResourcesFit", 4)], ["NodeResourcesFit"])},
     {}, [("TaintToleration", 3), ("NodeAffinity", 2), *VB_PTS_IPA, ("NodeResourcesBalancedAllocation", 1),
          ("NodeResourcesFit", 4)]),
    ("score-star-with-weight",
     {"score": plugin_set([("NodeResourcesFit", 2)], ["*"])},
     {"preScore": DEFAULT_NAMES["preScore"]}, [("NodeResourcesFit", 2)]),
    ("multipoint-weight-replaces-in-place",
     {"multiPoint": plugin_set([("TaintToleration", 10)])},
     {"filter": DEFAULT_NAMES["filter"]},
     [("TaintToleration", 10), ("NodeAffinity", 2), ("NodeResourcesFit", 1), *VB_PTS_IPA,
      ("NodeResourcesBalancedAllocation", 1)]),
    ("multipoint-disable-removes-everywhere",
     {"multiPoint": plugin_set(disabled=["NodeAffinity"])},
     {"preFilter": ["NodePorts", "NodeResourcesFit", *VOLUME_FILTERS, "PodTopologySpread", "InterPodAffinity"],
      "filter": ["NodeUnschedulable", "NodeName", "TaintToleration", "NodePorts", "NodeResourcesFit",
                 *VOLUME_FILTERS, "PodTopologySpread", "InterPodAffinity"],
      "preScore": ["TaintToleration", "NodeResourcesFit", "VolumeBinding", "PodTopologySpread", "InterPodAffinity",
                   "NodeResourcesBalancedAllocation"]},
     [("TaintToleration", 3), ("NodeResourcesFit", 1), *VB_PTS_IPA, ("NodeResourcesBalancedAllocation", 1)]),
    ("multipoint-star-and-own-list",
     {"multiPoint": plugin_set(["PrioritySort", ("NodeResourcesFit", 2), "DefaultBinder"], ["*"])},
     {"queueSort": ["PrioritySort"], "preFilter": ["NodeResourcesFit"], "filter": ["NodeResourcesFit"],
      "preScore": ["NodeResourcesFit"], "bind": ["DefaultBinder"]},
     [("NodeResourcesFit", 2)]),
    ("score-weight-beats-multipoint-weight",
     {"multiPoint": plugin_set([("NodeResourcesFit", 7)]), "score": plugin_set([("NodeResourcesFit", 9)])},
     {}, [("NodeResourcesFit", 9), ("TaintToleration", 3), ("NodeAffinity", 2), *VB_PTS_IPA,
          ("NodeResourcesBalancedAllocation", 1)]),
    ("prescore-disable-keeps-score",
     {"preScore": plugin_set(disabled=["TaintToleration"])},
     {"preScore": ["NodeAffinity", "NodeResourcesFit", "VolumeBinding", "PodTopologySpread", "InterPodAffinity",
                   "NodeResourcesBalancedAllocation"]}, DEFAULT_SCORE),
    ("disabling-unimplemented-kube-plugins-is-harmless",
     {"multiPoint": plugin_set(disabled=["ImageLocality", "EBSLimits", "DynamicResources"])},
     DEFAULT_NAMES, DEFAULT_SCORE),
    ("disabling-preemption", {"postFilter": plugin_set(disabled=["DefaultPreemption"])},
     {**DEFAULT_NAMES, "postFilter": []}, DEFAULT_SCORE),
    ("explicit-point-order-after-multipoint",
     {"filter": plugin_set(["NodePorts", "NodeName"], ["NodeName"])},
     {"filter": ["NodePorts", "NodeUnschedulable", "TaintToleration", "NodeAffinity", "NodeResourcesFit",
                 *VOLUME_FILTERS, "PodTopologySpread", "InterPodAffinity", "NodeName"]},
     DEFAULT_SCORE),
]


@pytest.mark.parametrize("plugins, expected, expected_score", [c[1:] for c in MERGE_CASES],
                         ids=[c[0] for c in MERGE_CASES])
def test_merge_rules(plugins, expected, expected_score):
    prof = parse(doc(profile(plugins=plugins))).profiles[0]
    got = names(prof)
    for point, want in expected.items():
        assert got.get(point, []) == want, point
    assert score(prof) == expected_score


GUARDED_CASES = [
    ("kube-defaults", {}, ("DynamicResources",)),
    ("multipoint-disables-dra", {"multiPoint": plugin_set(disabled=["DynamicResources"])}, ()),
    ("filter-disables-others", {"filter": plugin_set(disabled=["PodTopologySpread", "ImageLocality"])},
     ("DynamicResources",)),
    ("filter-disables-it", {"filter": plugin_set(disabled=["DynamicResources"])}, ()),
    ("filter-star", {"filter": plugin_set(["NodeResourcesFit"], ["*"])}, ()),
    ("multipoint-star", {"multiPoint": plugin_set(["PrioritySort", "NodeResourcesFit", "DefaultBinder"], ["*"])}, ()),
]


@pytest.mark.parametrize("plugins, expected", [c[1:] for c in GUARDED_CASES], ids=[c[0] for c in GUARDED_CASES])
def test_guarded_plugins_are_those_the_profile_leaves_enabled_at_filter(plugins, expected):
    """Unimplemented default plugins whose constraints are refused rather than broken: enabled at
    filter after kube's merge and multiPoint expansion, as upstream would run their Filter."""
    assert parse(doc(profile(plugins=plugins))).profiles[0].guarded_plugins == expected


@pytest.mark.parametrize("default, custom, expected", [
    (PluginSet((PluginRef("A", 1), PluginRef("B"), PluginRef("C"))), PluginSet((PluginRef("B", 5), PluginRef("D"))),
     PluginSet((PluginRef("A", 1), PluginRef("B", 5), PluginRef("C"), PluginRef("D")))),
    (PluginSet((PluginRef("A"), PluginRef("B"))), PluginSet((PluginRef("D"),), ("*",)),
     PluginSet((PluginRef("D"),), ("*",))),
    (PluginSet((PluginRef("A"), PluginRef("B"))), PluginSet((PluginRef("A", 2),), ("A",)),
     PluginSet((PluginRef("B"), PluginRef("A", 2)), ("A",))),
], ids=["replace-in-place-then-append", "star-drops-defaults", "disable-then-reenable-appends"])
def test_merge_plugin_set(default, custom, expected):
    assert merge_plugin_set(default, custom) == expected


POINT_SETS = st.fixed_dictionaries({}, optional={
    point: st.builds(
        plugin_set,
        enabled=st.lists(st.sampled_from([n for n, pts in PLUGIN_POINTS.items() if point in pts] or ["x"]),
                         unique=True).map(lambda ns: [(n, 2) for n in ns if n != "x"]),
        disabled=st.lists(st.sampled_from(["*", *SUPPORTED_PLUGINS, "ImageLocality"]), max_size=3),
    )
    for point in (*EXTENSION_POINTS, "multiPoint")
})


@settings(max_examples=200, deadline=None)
@given(POINT_SETS)
def test_any_valid_plugins_section_resolves_consistently(plugins):
    try:
        prof = parse(doc(profile(plugins=plugins))).profiles[0]
    except ConfigError as exc:  # only the "a queueSort / a bind plugin is required" checks may fail
        assert all("plugins.queueSort:" in line or "plugins.bind:" in line for line in str(exc).splitlines())
        return
    for point, refs in prof.plugins.items():
        assert refs, point
        assert len({r.name for r in refs}) == len(refs), point
        assert all(point in PLUGIN_POINTS[r.name] for r in refs), point
        assert all(r.weight >= 1 if point == "score" else r.weight == 0 for r in refs), point
    for point in EXTENSION_POINTS:
        if "*" not in [d["name"] for d in plugins.get(point, {}).get("disabled", [])]:
            continue
        assert names(prof).get(point, []) == [e["name"] for e in plugins[point].get("enabled", [])], point
    assert len(prof.enabled("queueSort")) == 1


# ---------------------------------------------------------------- validation errors and their paths

SUPPORTED_LIST = "supported plugins: " + ", ".join(SUPPORTED_PLUGINS)
FIT_TYPES = "must be one of LeastAllocated, MostAllocated, RequestedToCapacityRatio"


def with_args(plugin: str, args) -> dict:
    """A document whose one profile configures ``plugin`` with ``args``."""
    return doc(profile(plugin_config=[(plugin, args)]))


def fit(**strategy) -> dict:
    return with_args("NodeResourcesFit", {"scoringStrategy": strategy})


def balanced(*resources: dict) -> dict:
    return with_args("NodeResourcesBalancedAllocation", {"resources": list(resources)})


def affinity(added: dict) -> dict:
    return with_args("NodeAffinity", {"addedAffinity": added})


def required_terms(*expressions) -> dict:
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": list(expressions)}]}}


P0 = "profiles[0]"
PC = "profiles[0].pluginConfig"
ARGS = f"{PC}[0].args"
SHAPE = f"{ARGS}.scoringStrategy.requestedToCapacityRatio.shape"
EXPR = f"{ARGS}.addedAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0]"
ERROR_CASES = [
    # (id, document, field path, message fragment)
    ("unknown-top-level-field", doc(percentageOfNodeToScore=50), "percentageOfNodeToScore", "unknown field"),
    ("snake-case-is-unknown", doc(pod_initial_backoff_seconds=1), "pod_initial_backoff_seconds", "unknown field"),
    ("string-for-number", doc(podInitialBackoffSeconds="1"), "podInitialBackoffSeconds", "must be a valid number"),
    ("initial-backoff-zero", doc(podInitialBackoffSeconds=0), "podInitialBackoffSeconds", "must be greater than 0"),
    ("max-backoff-below-initial", doc(podInitialBackoffSeconds=5, podMaxBackoffSeconds=2),
     "podMaxBackoffSeconds", "must be greater than or equal to podInitialBackoffSeconds"),
    ("unschedulable-duration-zero", doc(podMaxInUnschedulablePodsDurationSeconds=0),
     "podMaxInUnschedulablePodsDurationSeconds", "must be greater than 0"),
    ("percentage-over-100", doc(percentageOfNodesToScore=101), "percentageOfNodesToScore", "less than or equal to 100"),
    ("profile-percentage-negative", doc(profile(percentageOfNodesToScore=-1)),
     f"{P0}.percentageOfNodesToScore", "greater than or equal to 0"),
    ("parallelism-zero", doc(parallelism=0), "parallelism", "must be greater than 0"),
    ("max-attempts-zero", doc(shardsched={"maxSchedulingAttempts": 0}), "shardsched.maxSchedulingAttempts",
     "greater than or equal to 1"),
    ("shardsched-unknown-field", doc(shardsched={"batchSize": 10}), "shardsched.batchSize", "unknown field"),
    ("extenders", doc(extenders=[{"urlPrefix": "http://x"}]), "extenders", "does not support scheduler extenders"),
    ("burst-negative", doc(clientConnection={"burst": -1}), "clientConnection.burst", "must be non-negative"),
    ("lock-not-leases", doc(leaderElection={"resourceLock": "endpoints"}), "leaderElection.resourceLock", 'must be "leases"'),
    ("lease-not-duration", doc(leaderElection={"leaseDuration": "15"}), "leaderElection.leaseDuration", "is not a duration"),
    ("lease-below-renew", doc(leaderElection={"leaseDuration": "5s"}), "leaderElection.leaseDuration",
     "must be greater than renewDeadline"),
    ("api-version", {**doc(), "apiVersion": "kubescheduler.config.k8s.io/v2"}, "apiVersion",
     f"must be {API_VERSION} (got 'kubescheduler.config.k8s.io/v2')"),
    ("api-version-missing", {"kind": KIND}, "apiVersion", "(missing)"),
    ("kind", {**doc(), "kind": "Pod"}, "kind", "must be KubeSchedulerConfiguration (got 'Pod')"),
    ("profiles-not-a-list", doc(profiles={"schedulerName": "x"}), "profiles", "must be a valid list"),
    ("several-profiles-need-names", doc(profile("a"), profile()), "profiles[1].schedulerName", "required"),
    ("empty-scheduler-name", doc(profile("")), f"{P0}.schedulerName", "must not be empty"),
    ("duplicate-scheduler-name", doc(profile("a"), profile("a")), "profiles[1].schedulerName",
     "'a' is already the name of profiles[0]"),
    ("unknown-extension-point", doc(profile(plugins={"Filter": plugin_set(["NodeName"])})),
     f"{P0}.plugins.Filter", "unknown field"),
    ("unknown-plugin-entry-field", doc(profile(plugins={"score": {"enabled": [{"name": "NodeName", "weigth": 2}]}})),
     f"{P0}.plugins.score.enabled[0].weigth", "unknown field"),
    ("negative-weight", doc(profile(plugins={"score": plugin_set([("NodeResourcesFit", -1)])})),
     f"{P0}.plugins.score.enabled[0].weight", "greater than or equal to 0"),
    ("unknown-plugin", doc(profile(plugins={"filter": plugin_set(["FastMatch"], ["*"])})),
     f"{P0}.plugins.filter.enabled[0].name", f"unknown plugin 'FastMatch'; {SUPPORTED_LIST}"),
    ("near-miss-plugin", doc(profile(plugins={"filter": plugin_set(["NodeResourceFit"])})),
     f"{P0}.plugins.filter.enabled[0].name", "did you mean NodeResourcesFit?"),
    ("unimplemented-plugin-enabled", doc(profile(plugins={"score": plugin_set([("ImageLocality", 1)])})),
     f"{P0}.plugins.score.enabled[0].name", "shardsched does not implement kube-scheduler's ImageLocality plugin"),
    ("unimplemented-plugin-multipoint", doc(profile(plugins={"multiPoint": plugin_set(["GCEPDLimits"])})),
     f"{P0}.plugins.multiPoint.enabled[0].name", "does not implement kube-scheduler's GCEPDLimits"),
    ("unknown-plugin-disabled", doc(profile(plugins={"filter": plugin_set(disabled=["Foo"])})),
     f"{P0}.plugins.filter.disabled[0].name", f"unknown plugin 'Foo'; {SUPPORTED_LIST}"),
    ("star-enabled", doc(profile(plugins={"filter": plugin_set(["*"])})),
     f"{P0}.plugins.filter.enabled[0].name", '"*" is only allowed in disabled lists'),
    ("plugin-at-wrong-point", doc(profile(plugins={"filter": plugin_set(["PrioritySort"])})),
     f"{P0}.plugins.filter.enabled[0].name", "PrioritySort does not implement filter (it implements queueSort)"),
    ("plugin-twice-at-a-point", doc(profile(plugins={"filter": plugin_set(["NodeName", "NodePorts", "NodeName"])})),
     f"{P0}.plugins.filter.enabled[2].name", "NodeName is already enabled at profiles[0].plugins.filter.enabled[0]"),
    ("plugin-twice-in-multipoint", doc(profile(plugins={"multiPoint": plugin_set(["NodeName", "NodeName"])})),
     f"{P0}.plugins.multiPoint.enabled[1].name", "already enabled"),
    ("no-queue-sort", doc(profile(plugins={"queueSort": plugin_set(disabled=["*"])})),
     f"{P0}.plugins.queueSort", "exactly one queueSort plugin is required"),
    ("no-bind", doc(profile(plugins={"multiPoint": plugin_set(disabled=["DefaultBinder"])})),
     f"{P0}.plugins.bind", "at least one bind plugin is required"),
    ("plugin-config-unknown-plugin", with_args("FastScore", {}),
     f"{PC}[0].name", f"unknown plugin 'FastScore'; {SUPPORTED_LIST}"),
    ("plugin-config-unimplemented", with_args("AzureDiskLimits", {}),
     f"{PC}[0].name", "does not implement kube-scheduler's AzureDiskLimits"),
    ("preemption-args-both-zero", with_args("DefaultPreemption", {"minCandidateNodesPercentage": 0,
                                                                  "minCandidateNodesAbsolute": 0}),
     f"{ARGS}.minCandidateNodesPercentage", "cannot be zero at the same time as minCandidateNodesAbsolute"),
    ("preemption-args-percentage-range", with_args("DefaultPreemption", {"minCandidateNodesPercentage": 101}),
     f"{ARGS}.minCandidateNodesPercentage", "less than or equal to 100"),
    ("plugin-config-duplicate", doc(profile(plugin_config=[("NodeResourcesFit", None), ("NodeResourcesFit", None)])),
     f"{PC}[1].name", "NodeResourcesFit is already configured at profiles[0].pluginConfig[0]"),
    ("args-not-an-object", with_args("NodeResourcesFit", [1]),
     ARGS, "must be a valid dictionary"),
    ("args-unknown-field", with_args("NodeResourcesFit", {"scoringStrategyy": {}}),
     f"{ARGS}.scoringStrategyy", "unknown field"),
    ("args-for-argless-plugin", with_args("NodeName", {"foo": 1}),
     f"{ARGS}.foo", "unknown field"),
    ("args-wrong-kind", with_args("NodeAffinity", {"kind": "NodeResourcesFitArgs"}),
     f"{ARGS}.kind", "must be NodeAffinityArgs"),
    ("args-wrong-api-version", with_args("NodeAffinity", {"apiVersion": "v1"}),
     f"{ARGS}.apiVersion", f"must be {API_VERSION}"),
    ("fit-type", fit(type="LeastRequested"),
     f"{ARGS}.scoringStrategy.type", FIT_TYPES),
    ("fit-type-missing", fit(resources=[{"name": "cpu"}]),
     f"{ARGS}.scoringStrategy.type", "required"),
    ("fit-weight-over-100", fit(type="MostAllocated", resources=[{"name": "cpu", "weight": 101}]),
     f"{ARGS}.scoringStrategy.resources[0].weight", "not in valid range (0, 100]"),
    ("fit-weight-negative", fit(type="MostAllocated", resources=[{"name": "cpu", "weight": -1}]),
     f"{ARGS}.scoringStrategy.resources[0].weight", "not in valid range (0, 100]"),
    ("fit-resource-name-missing", fit(type="MostAllocated", resources=[{"weight": 1}]),
     f"{ARGS}.scoringStrategy.resources[0].name", "required"),
    ("rtcr-needs-shape", fit(type="RequestedToCapacityRatio"),
     f"{ARGS}.scoringStrategy.requestedToCapacityRatio", "must be specified when type is RequestedToCapacityRatio"),
    ("shape-only-for-rtcr", fit(type="MostAllocated", requestedToCapacityRatio={"shape": [{}]}),
     f"{ARGS}.scoringStrategy.requestedToCapacityRatio", "must not be set"),
    ("rtcr-empty-shape", fit(type="RequestedToCapacityRatio", requestedToCapacityRatio={"shape": []}),
     SHAPE, "at least one point must be specified"),
    ("rtcr-not-increasing", fit(
        type="RequestedToCapacityRatio",
        requestedToCapacityRatio={"shape": [{"utilization": 0, "score": 0}, {"utilization": 50, "score": 5},
                                            {"utilization": 50, "score": 10}]}),
     f"{SHAPE}[2].utilization", "increasing order"),
    ("rtcr-score-over-10", fit(
        type="RequestedToCapacityRatio", requestedToCapacityRatio={"shape": [{"utilization": 100, "score": 11}]}),
     f"{SHAPE}[0].score", "less than or equal to 10"),
    ("rtcr-utilization-over-100", fit(
        type="RequestedToCapacityRatio", requestedToCapacityRatio={"shape": [{"utilization": 101, "score": 1}]}),
     f"{SHAPE}[0].utilization", "less than or equal to 100"),
    ("ignored-resource-invalid", with_args("NodeResourcesFit", {"ignoredResources": ["ok.io/a", "-bad"]}),
     f"{ARGS}.ignoredResources[1]", "name part must be"),
    ("ignored-group-with-slash", with_args("NodeResourcesFit", {"ignoredResourceGroups": ["example.com/x"]}),
     f"{ARGS}.ignoredResourceGroups[0]", "resource group name can't contain '/'"),
    ("balanced-weight-not-1", balanced({"name": "cpu", "weight": 2}),
     f"{ARGS}.resources[0].weight", "must be 1"),
    ("balanced-duplicate-resource", balanced({"name": "cpu"}, {"name": "cpu"}),
     f"{ARGS}.resources[1].name", "duplicate resource 'cpu'"),
    ("affinity-bad-operator", affinity(required_terms({"key": "zone", "operator": "Equals", "values": ["a"]})),
     f"{EXPR}.operator", "is not one of In, NotIn"),
    ("affinity-in-without-values", affinity(required_terms({"key": "zone", "operator": "In"})),
     f"{EXPR}.values", "needs at least one value"),
    ("affinity-unknown-field", affinity({"requiredDuringScheduling": {}}),
     f"{ARGS}.addedAffinity.requiredDuringScheduling", "unknown field"),
    ("affinity-preferred-weight", affinity(
        {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0, "preference": {}}]}),
     f"{ARGS}.addedAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight", "1..100"),
]


@pytest.mark.parametrize("data, path, message", [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_validation_error_names_file_and_path(data, path, message):
    with pytest.raises(ConfigError) as err:
        parse(data)
    lines = str(err.value).splitlines()
    prefix = f"config.yaml: {path}: "
    matching = [line for line in lines if line.startswith(prefix)]
    assert matching, f"no error at {path}: {lines}"
    assert any(message in line for line in matching), matching


def test_mistakes_of_two_stages_are_named_together_with_the_closest_names():
    """A misspelt field (found by the shape check) and a misspelt plugin (found once the shape is
    valid) in one file: both are named, each with the closest known name (difflib)."""
    data = doc(profile(plugins={"score": plugin_set(["NodeResourcesFitt"])},
                       plugin_config=[("NodeResourcesFit", {"scoringStrategyy": {"type": "MostAllocated"}})]),
               percentageOfNodesToScor=50)
    with pytest.raises(ConfigError) as err:
        parse(data)
    lines = str(err.value).splitlines()
    assert lines[0] == ("config.yaml: percentageOfNodesToScor: unknown field (did you mean "
                        "percentageOfNodesToScore?)")
    assert lines[1].startswith("config.yaml: profiles[0].plugins.score.enabled[0].name: unknown plugin "
                               "'NodeResourcesFitt' (did you mean NodeResourcesFit?); supported plugins: ")
    assert len(lines) == 2  # the args are checked once the document's shape is valid
    del data["percentageOfNodesToScor"]
    with pytest.raises(ConfigError) as err:
        parse(data)
    assert str(err.value).splitlines()[1] == (
        "config.yaml: profiles[0].pluginConfig[0].args.scoringStrategyy: unknown field (did you mean "
        "scoringStrategy?)")


def test_scoring_type_error_reads_as_documented():
    data = doc(profile(plugin_config=[("NodeAffinity", None), ("NodeResourcesFit", {"scoringStrategy": {"type": "Foo"}})]))
    with pytest.raises(ConfigError) as err:
        parse(data)
    assert str(err.value).startswith(
        "config.yaml: profiles[0].pluginConfig[1].args.scoringStrategy.type: "
        "must be one of LeastAllocated, MostAllocated, RequestedToCapacityRatio")


def test_all_problems_of_a_stage_are_reported_together():
    data = doc(profile("a", plugins={"filter": plugin_set(["FastMatch"])}),
               profile("a", plugin_config=[("NodeResourcesFit", {"scoringStrategy": {"type": "Foo"}})]))
    with pytest.raises(ConfigError) as err:
        parse(data)
    paths = [line.split(": ")[1] for line in str(err.value).splitlines()]
    assert paths == ["profiles[0].plugins.filter.enabled[0].name", "profiles[1].schedulerName",
                     "profiles[1].pluginConfig[0].args.scoringStrategy.type"]


@pytest.mark.parametrize("text, expected", [
    ("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofiles:\n"
     "  - schedulerName: a\n   plugins: {}\n", r"^config\.yaml: line 5, column 4: invalid YAML: "),
    ("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nkind: Other\n",
     r"^config\.yaml: line 3, column 1: invalid YAML: duplicate key 'kind' \(first at line 2\)$"),
    ("profiles:\n- plugins:\n    filter: {}\n    filter: {}\n", r"line 4, column 5: invalid YAML: duplicate key 'filter'"),
    ("profiles: [{schedulerName: a, schedulerName: b}]\n",
     r"line 1, column 31: invalid YAML: duplicate key 'schedulerName' \(first at line 1\)"),
    ("- apiVersion: x\n", r"^config\.yaml: expected a KubeSchedulerConfiguration object, got list$"),
    ("a: 1\n---\nb: 2\n", r"^config\.yaml: expected one KubeSchedulerConfiguration document, found 2$"),
], ids=["bad-indentation", "duplicate-top-level-key", "duplicate-nested-key", "duplicate-key-on-one-line",
        "top-level-list", "two-documents"])
def test_yaml_problems_name_the_line(text, expected):
    with pytest.raises(ConfigError, match=expected):
        parse_config(text, "config.yaml")


@pytest.mark.parametrize("source, expected", [
    ("/nonexistent/sched.yaml", r"^/nonexistent/sched\.yaml: cannot read: No such file"),
    (".", r"^\.: cannot read: Is a directory"),
], ids=["missing-file", "directory"])
def test_unreadable_source(source, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(source)


# ---------------------------------------------------------------- plugin args on their own


def test_parse_plugin_args_for_factories():
    args = parse_plugin_args("NodeResourcesFit", {
        "apiVersion": API_VERSION, "kind": "NodeResourcesFitArgs",
        "ignoredResourceGroups": ["example.com"],
        "scoringStrategy": {"type": "RequestedToCapacityRatio", "resources": [{"name": "cpu", "weight": 0}],
                            "requestedToCapacityRatio": {"shape": [{"utilization": 0, "score": 10},
                                                                   {"utilization": 100}]}},
    })
    assert isinstance(args, NodeResourcesFitArgs)
    assert args.ignored_resource_groups == ["example.com"]
    assert [(r.name, r.weight) for r in args.scoring_strategy.resources] == [("cpu", 1)]  # 0 means 1
    assert [(p.utilization, p.score) for p in args.scoring_strategy.requested_to_capacity_ratio.shape] == [(0, 10), (100, 0)]
    assert parse_plugin_args("NodeResourcesBalancedAllocation", {"resources": []}).resources[1].name == "memory"
    with pytest.raises(ConfigError, match=r"^args\.scoringStrategy\.type: must be one of"):
        parse_plugin_args("NodeResourcesFit", {"scoringStrategy": {"type": "x"}})
    with pytest.raises(ConfigError, match="unknown plugin 'FastScore'"):
        parse_plugin_args("FastScore")


def test_coscheduling_args_pod_group_backoff():
    assert parse_plugin_args("Coscheduling", None).pod_group_backoff_seconds == 0
    assert parse_plugin_args("Coscheduling", {"podGroupBackoffSeconds": 30}).pod_group_backoff_seconds == 30
    with pytest.raises(ConfigError, match=r"^args\.podGroupBackoffSeconds: "):
        parse_plugin_args("Coscheduling", {"podGroupBackoffSeconds": -1})


def test_every_listed_plugin_is_known():
    assert not set(SUPPORTED_PLUGINS) & UNIMPLEMENTED_PLUGINS
    for plugin, points in PLUGIN_POINTS.items():
        assert points and set(points) <= set(EXTENSION_POINTS), plugin
