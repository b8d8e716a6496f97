"""``bench perf`` on scheduler_perf's volume workloads (``volumes/performance-config.yaml``): the
plan stamps upstream's bound PV/claim pairs and CSINodes, fields it does not know are named with
their file, and the short workloads run through the sharded runtime with every pod bound and the
invariants kept, the volume plugins deciding with the storage objects (a CSI limit of one volume
per node leaves the pods beyond it unschedulable). No timing assertions."""

from __future__ import annotations

import json
import shutil

import pytest

from shardsched.bench import perf
from shardsched.bench.harness import machine
from shardsched.config import load_config

VOLUME_CASES = ("SchedulingSecrets", "SchedulingInTreePVs", "SchedulingMigratedInTreePVs", "SchedulingCSIPVs",
                "PreemptionPVs")

#: a test case of upstream's format whose CSINodes allow one volume of the driver per node
LIMITED = """
- name: CSILimitOfOne
  workloadTemplate:
  - opcode: createNodes
    countParam: $initNodes
    nodeAllocatableStrategy:
      csiNodeAllocatable:
        ebs.csi.aws.com:
          count: 1
  - opcode: createPods
    countParam: $measurePods
    persistentVolumeTemplatePath: ../templates/pv-csi.yaml
    persistentVolumeClaimTemplatePath: ../templates/pvc.yaml
    collectMetrics: true
  workloads:
  - name: 5Nodes_7Pods
    params:
      initNodes: 5
      measurePods: 7
"""

BAD = """
- name: BadVolumes
  workloadTemplate:
  - opcode: createNodes
    count: 2
    nodeAllocatableStrategy:
      csiNodeAllocatable:
        ebs.csi.aws.com:
          count: 1
          perZone: 3
      fancy: true
  - opcode: createPods
    count: 2
    persistentVolumeTemplatePath: ../templates/pv-csi.yaml
    collectMetrics: true
  - opcode: resizeVolumes
  workloads:
  - name: tiny
    params: {}
"""


def _workload(name: str, directory=None) -> perf.Workload:
    return next(w for w in perf.load_workloads(directory) if w.full_name == name)


def test_the_volume_workloads_are_shipped_and_run():
    cat = {c["workload"]: c for c in perf.catalog(perf.load_workloads())}
    for case in VOLUME_CASES:
        entries = [c for name, c in cat.items() if name.startswith(f"{case}/")]
        assert entries and all(c["source"] == "volumes/performance-config.yaml" for c in entries), case
        assert {c["status"] for c in entries} == {perf.RUN, perf.SKIP}, case  # SKIP: the feature-gate twins
    assert cat["SchedulingInTreePVs/5000Nodes_2000Pods"]["threshold"] == 290
    assert cat["SchedulingCSIPVs/5000Nodes_5000Pods"]["threshold"] == 100
    assert cat["SchedulingSecrets/5000Nodes_10000Pods"]["threshold"] == 790


def test_plan_gives_each_pod_its_bound_claim_and_each_node_its_csinode():
    """SchedulingCSIPVs/5Nodes: upstream's createPods with PV templates (pvc-<i> in the op's
    namespace bound to the PV <namespace>-vol-<i>, whose CSI handle is its name) and
    nodeAllocatableStrategy (a CSINode per node with ebs.csi.aws.com's count 39, and the
    attachable-volumes allocatable)."""
    p = perf.plan(_workload("SchedulingCSIPVs/5Nodes"), perf._Templates(), "default-scheduler")
    assert p.status == perf.RUN and len(p.nodes) == 5 and len(p.init_pods) == 5 and len(p.measured) == 10
    kinds = [o["kind"] for o in p.storage]
    assert kinds.count("CSINode") == 5 and kinds.count("PersistentVolume") == kinds.count("PersistentVolumeClaim") == 15
    node = p.nodes[0]
    [csi] = [o for o in p.storage if o["kind"] == "CSINode" and o["metadata"]["name"] == node["metadata"]["name"]]
    assert csi["spec"]["drivers"] == [{"name": "ebs.csi.aws.com", "nodeID": node["metadata"]["name"],
                                       "allocatable": {"count": 39}}]
    assert node["status"]["allocatable"]["attachable-volumes-csi-ebs.csi.aws.com"] == "39"
    pod = p.measured[3]
    ns = pod["metadata"]["namespace"]
    assert pod["spec"]["volumes"] == [{"name": "vol", "persistentVolumeClaim": {"claimName": "pvc-3"}}]
    [pvc] = [o for o in p.storage if o["kind"] == "PersistentVolumeClaim"
             and (o["metadata"]["namespace"], o["metadata"]["name"]) == (ns, "pvc-3")]
    [pv] = [o for o in p.storage if o["metadata"]["name"] == f"{ns}-vol-3"]
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"] and pvc["status"]["phase"] == "Bound"
    assert pv["spec"]["claimRef"]["name"] == "pvc-3" and pv["spec"]["claimRef"]["namespace"] == ns
    assert pv["spec"]["csi"] == {"driver": "ebs.csi.aws.com", "volumeHandle": pv["metadata"]["name"]}
    assert perf.place_init_pods(load_config(None), p.nodes, p.init_pods, 0, p.spread_selectors, p.storage) == 0


def test_plan_of_migrated_in_tree_pvs_names_the_plugin_and_the_aws_volume():
    p = perf.plan(_workload("SchedulingMigratedInTreePVs/5Nodes"), perf._Templates(), "default-scheduler")
    csi = next(o for o in p.storage if o["kind"] == "CSINode")
    assert csi["metadata"]["annotations"] == {"storage.alpha.kubernetes.io/migrated-plugins": "kubernetes.io/aws-ebs"}
    pv = next(o for o in p.storage if o["kind"] == "PersistentVolume")
    assert pv["spec"]["awsElasticBlockStore"] == {"volumeID": "vol-0"}


def test_fields_and_ops_it_does_not_know_are_named_with_their_file(tmp_path):
    data = tmp_path / "scheduler_perf"
    shutil.copytree(perf.DEFAULT_DATA_DIR, data)
    (data / "bad").mkdir()
    (data / "bad" / "performance-config.yaml").write_text(BAD)
    [entry] = [c for c in perf.catalog(perf.load_workloads(data)) if c["workload"] == "BadVolumes/tiny"]
    where = "(bad/performance-config.yaml)"
    assert entry["status"] == perf.SKIP
    assert entry["reasons"] == [
        f"createNodes nodeAllocatableStrategy.fancy is not supported by this runner {where}",
        f"createNodes nodeAllocatableStrategy.csiNodeAllocatable.ebs.csi.aws.com.perZone is not supported by this "
        f"runner {where}",
        f"createPods needs both persistentVolumeTemplatePath and persistentVolumeClaimTemplatePath {where}",
        f"op resizeVolumes is not supported by this runner {where}"]


def test_short_volume_workloads_bind_every_pod_through_the_sharded_runtime(ray_session, tmp_path):
    data = tmp_path / "scheduler_perf"
    shutil.copytree(perf.DEFAULT_DATA_DIR, data)
    (data / "limits").mkdir()
    (data / "limits" / "performance-config.yaml").write_text(LIMITED)
    params = perf.PerfParams(workloads=[f"{c}/5Nodes" for c in VOLUME_CASES] + ["CSILimitOfOne/5Nodes_7Pods"],
                             data_dir=str(data), timeout_s=120)
    results, cat = perf.run(params)
    by_name = {r.workload.full_name: r for r in results}
    for case, storage in (("SchedulingSecrets", 0), ("SchedulingInTreePVs", 30), ("SchedulingMigratedInTreePVs", 35),
                          ("SchedulingCSIPVs", 35)):
        r = by_name[f"{case}/5Nodes"]
        m = r.measurement
        assert r.status == perf.RUN and r.nodes == 5 and r.init_pods == 5 and not r.init_unplaced, case
        assert m.bound == m.pods == 10 and m.invariants_ok and not m.errors, (case, m.errors)
        assert r.storage_objects == storage, case
    # 4 low-priority pods of 900m fill each 4-CPU node: each 3-CPU preemptor with its PV takes a node
    r = by_name["PreemptionPVs/5Nodes"]
    m = r.measurement
    assert m.bound == m.pods == 5 and m.invariants_ok and (r.preemptions, r.victims) == (5, 15), m.errors
    # one volume of the driver per node: 5 of the 7 pods bind, the other 2 stay unschedulable
    # (NodeVolumeLimits read the CSINodes and the PVs in the cluster)
    m = by_name["CSILimitOfOne/5Nodes_7Pods"].measurement
    assert m.bound == 5 and m.pods == 7 and m.invariants_ok
    assert m.params["unschedulable_at_end"] == 2
    data_out = json.loads(json.dumps(perf.to_json(results, cat, params, machine())))
    assert [w["storage_objects"] for w in data_out["workloads"]] == [0, 30, 35, 35, 10, 19]
    assert "PVs, claims and CSINodes" in perf.markdown(results, cat, params)


def test_sim_creates_storage_objects_in_one_call_and_binds_once():
    """`SimCluster.create_volume_objects`: upstream's pair (the claim with volumeName, then the PV
    with claimRef) ends bound on both sides after the one controller pass; an invalid object stops
    the call with its field named, the objects before it created."""
    from shardsched.cluster import Invalid
    from shardsched.sim.cluster import SimCluster

    sim = SimCluster()
    p = perf.plan(_workload("SchedulingCSIPVs/5Nodes"), perf._Templates(), "default-scheduler")
    made = sim.create_volume_objects(p.storage)
    assert len(made) == len(p.storage) == 35
    pvc = sim.get_volume_object("PersistentVolumeClaim", "pvc-0", p.measured[0]["metadata"]["namespace"])
    assert sim.claim_bound(pvc["metadata"]["namespace"], "pvc-0") and pvc["status"]["phase"] == "Bound"
    bad = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "bad"},
           "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": []}}}}
    ok = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "first"},
          "provisioner": "kubernetes.io/no-provisioner"}
    with pytest.raises(Invalid, match="nodeSelectorTerms"):
        sim.create_volume_objects([ok, bad])
    assert sim.get_volume_object("StorageClass", "first")["metadata"]["name"] == "first"
