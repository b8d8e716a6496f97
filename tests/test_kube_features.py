"""Preemption, gangs and volumes through the Kubernetes backend, each scenario run on the three
backends of test_kube_scenarios (``sim``, ``simapi``, and ``envtest``: a real kube-apiserver and
etcd, shardsched authenticated as its service account with only ``deploy/rbac``'s ClusterRole), so
the simulated cluster is held to the real server's answers.

What the API server does not do on envtest (no kubelet, no controller-manager) the test does, and
says so where it happens: the "kubelet" finishes the deletion of a terminating pod, the "PV
controller" completes a PersistentVolume binding, the "disruption controller" has not run (a
PodDisruptionBudget without a status allows no disruption, as the simulated cluster computes for a
budget whose pods are all needed).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardsched.config import parse_config
from shardsched.kube.client import MERGE_PATCH, Api, ClientSpec
from shardsched.kube.cluster import KubeCluster
from shardsched.kube.serving import THREADS, KubeRuntime, RuntimeOptions
from shardsched.sharding.shard import ShardOptions
from shardsched.sim.cluster import SimCluster
from shardsched.testing import envtest
from shardsched.testing.simapi import SimApiServer

import test_kube_scenarios as ks
from test_kube_scenarios import SCHED, a_node, flush, node_of, our_pod, pod_scheduled, wait_for

GANG_SCHED = "shardsched-gang"
CONFIG = parse_config(f"""apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: {SCHED}
  plugins:
    queueSort:
      enabled: [{{name: Coscheduling}}]
      disabled: [{{name: PrioritySort}}]
- schedulerName: {GANG_SCHED}
  plugins:
    multiPoint:
      enabled: [{{name: Coscheduling}}]
      disabled: [{{name: PrioritySort}}]
  pluginConfig:
  - name: Coscheduling
    args: {{permitWaitingTimeSeconds: 30}}
""", "<test>")
CRDS = Path(__file__).resolve().parent.parent / "deploy" / "crds"
#: the PriorityClasses of these scenarios (created through the API on envtest; the simulated
#: cluster's Priority admission is given the same values)
PRIORITY_CLASSES = {"feat-low": 100, "feat-mid": 500, "feat-high": 1000}


class _SimAdmin:
    """The admin operations on the simulated cluster (both ``sim`` and ``simapi``)."""

    sim: SimCluster

    def _make_sim(self) -> None:
        self.now = 0.0
        # graceful deletion on a clock of the test's: a victim stays terminating until the
        # "kubelet" (`finish_terminating`) moves the clock past its grace period
        self.sim = self.cluster = SimCluster(priority_classes=PRIORITY_CLASSES, clock=lambda: self.now,
                                             grace_period_scale=1.0)

    def create_priority_class(self, name, value, policy="PreemptLowerPriority"):
        assert PRIORITY_CLASSES.get(name) == value and policy == "PreemptLowerPriority", "sim: fixed at construction"

    def create_pdb(self, obj): self.sim.create_pdb(obj)
    def create_pod_group(self, obj): self.sim.create_pod_group(obj)
    def get_pod_group(self, ns, name): return self.sim.get_pod_group(ns, name)
    def create_volume_object(self, obj): self.sim.create_volume_object(obj)

    def get_volume_object(self, kind, name, ns=None):
        return self.sim.get_volume_object(kind, name, ns)

    def terminating(self) -> list[str]:
        return sorted(key.split("/", 1)[1] for key, _ in self.sim.terminating())

    def finish_terminating(self) -> None:
        self.now += 3600.0
        self.sim.list_pods()  # any call deletes the pods whose grace period ended

    def complete_pv_binding(self, pv_name, ns, claim): pass  # the sim's PV controller ran with the write


class SimBackend(_SimAdmin, ks.SimBackend):
    def __init__(self) -> None:
        self._make_sim()


class SimApiBackend(_SimAdmin, ks.SimApiBackend):
    def __init__(self, tmp_path: Path) -> None:
        self._make_sim()
        self.server = SimApiServer(self.sim, token="t-feat").start()
        spec = ClientSpec(kubeconfig=self.server.write_kubeconfig(str(tmp_path / "kubeconfig")), qps=0)
        self.cluster = KubeCluster(spec, [SCHED, GANG_SCHED], watch_timeout_s=5, pod_groups=True,
                                   watch_storage=True)


STORAGE_PATHS = {"PersistentVolume": "/api/v1/persistentvolumes",
                 "PersistentVolumeClaim": "/api/v1/namespaces/{ns}/persistentvolumeclaims",
                 "StorageClass": "/apis/storage.k8s.io/v1/storageclasses",
                 "CSINode": "/apis/storage.k8s.io/v1/csinodes"}


class EnvtestBackend(ks.EnvtestBackend):
    def __init__(self, plane: envtest.ControlPlane) -> None:
        super().__init__(plane)
        self.cluster.stop()
        self.cluster = KubeCluster(ClientSpec(kubeconfig=plane.kubeconfig("scheduler"), qps=0), [SCHED, GANG_SCHED],
                                   watch_timeout_s=5, pod_groups=True, watch_storage=True)
        self._cleanup: list[str] = []  # paths of cluster objects to delete at close

    def _create(self, path: str, obj: dict, resource: str) -> dict:
        out = self.admin.request("POST", path, verb="create", resource=resource, body=obj)
        self._cleanup.append(f"{path}/{obj['metadata']['name']}")
        return out

    def create_priority_class(self, name, value, policy="PreemptLowerPriority"):
        self._create("/apis/scheduling.k8s.io/v1/priorityclasses",
                     {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                      "value": value, "preemptionPolicy": policy}, "priorityclasses")

    def create_pdb(self, obj):
        self._create(f"/apis/policy/v1/namespaces/{obj['metadata']['namespace']}/poddisruptionbudgets", obj,
                     "poddisruptionbudgets")

    def create_pod_group(self, obj):
        self._create(f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{obj['metadata']['namespace']}/podgroups",
                     obj, "podgroups")

    def get_pod_group(self, ns, name):
        return self.admin.request("GET", f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups/{name}",
                                  verb="get", resource="podgroups")

    def create_volume_object(self, obj):
        path = STORAGE_PATHS[obj["kind"]].format(ns=obj["metadata"].get("namespace", ""))
        self._create(path, obj, obj["kind"].lower() + "s")

    def get_volume_object(self, kind, name, ns=None):
        path = STORAGE_PATHS[kind].format(ns=ns or "") + "/" + name
        return self.admin.request("GET", path, verb="get", resource=kind.lower() + "s")

    def terminating(self):
        items = self.admin.request("GET", "/api/v1/namespaces/default/pods", verb="list", resource="pods")["items"]
        return sorted(p["metadata"]["name"] for p in items if p["metadata"].get("deletionTimestamp"))

    def finish_terminating(self):
        # the kubelet's part: the containers stopped, the pod object goes (a DELETE with grace 0)
        for name in self.terminating():
            self.delete_pod("default", name)

    def complete_pv_binding(self, pv_name, ns, claim):
        """The PV controller's part once a PV's claimRef names the claim (envtest runs none): the
        claim's volumeName and bind-completed annotation, then both phases Bound."""
        pvc_path = f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{claim}"
        self.admin.request("PATCH", pvc_path, verb="patch", resource="persistentvolumeclaims",
                           body={"metadata": {"annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
                                 "spec": {"volumeName": pv_name}}, content_type=MERGE_PATCH)
        self.admin.request("PATCH", f"/api/v1/persistentvolumes/{pv_name}/status", verb="patch",
                           resource="persistentvolumes", body={"status": {"phase": "Bound"}}, content_type=MERGE_PATCH)
        self.admin.request("PATCH", pvc_path + "/status", verb="patch", resource="persistentvolumeclaims",
                           body={"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"],
                                            "capacity": {"storage": "1Gi"}}}, content_type=MERGE_PATCH)

    def close(self):
        super().close()
        for path in reversed(self._cleanup):
            try:
                self.admin.request("DELETE", path, verb="delete", resource="any")
            except Exception:  # noqa: BLE001 - best effort: the plane is private to this module
                pass


@pytest.fixture(scope="module")
def control_plane():
    """A plane as test_kube_scenarios' (deploy/rbac applied), with deploy/crds' PodGroup CRD
    installed through the API and waited for until it is Established."""
    folder, why = envtest.assets()
    if folder is None:
        pytest.skip(why)
    try:
        plane = envtest.ControlPlane(folder).start()
    except ImportError as e:
        pytest.skip(f"envtest needs the cryptography package: {e}")
    try:
        from kubernetes import utils

        admin = ClientSpec(kubeconfig=plane.kubeconfig("admin")).api_client()
        for f in sorted(ks.RBAC.glob("*.yaml")) + [CRDS / "scheduling.x-k8s.io_podgroups.yaml"]:
            utils.create_from_yaml(admin, str(f))
        api = Api(admin, None, (5.0, 30.0))

        def established() -> bool:
            crd = api.request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                              "podgroups.scheduling.x-k8s.io", verb="get", resource="customresourcedefinitions")
            return any(c["type"] == "Established" and c["status"] == "True"
                       for c in (crd.get("status") or {}).get("conditions") or [])

        wait_for(established, 30, "the PodGroup CRD established")
        yield plane
    finally:
        plane.stop()


@pytest.fixture(params=["sim", "simapi", "envtest"])
def backend(request, tmp_path):
    if request.param == "sim":
        b = SimBackend()
    elif request.param == "simapi":
        b = SimApiBackend(tmp_path)
    else:
        b = EnvtestBackend(request.getfixturevalue("control_plane"))
    yield b
    b.close()


@pytest.fixture
def run_scheduler(backend, redis_server):
    runtimes = []

    def start(shards: int = 2) -> KubeRuntime:
        rt = KubeRuntime(CONFIG, None, RuntimeOptions(shards=shards, mode=THREADS, redis_url=redis_server.url,
                                                      shard_options=ShardOptions(seed=0, binding_cycles=2)),
                         cluster=backend.cluster)
        rt.start()
        runtimes.append(rt)
        return rt

    yield start
    for rt in runtimes:
        rt.stop()


def bound_pod(name: str, node_name: str, cpu: str, priority_class: str, labels: dict) -> dict:
    """A pod another scheduler placed (``spec.nodeName`` at creation), of a PriorityClass."""
    p = our_pod(name, cpu=cpu, scheduler="other")
    p["metadata"]["labels"] = labels
    p["spec"].update(nodeName=node_name, priorityClassName=priority_class)
    return p


def condition(p: dict, kind: str) -> dict | None:
    return next((c for c in (p.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


# ---------------------------------------------------------------------------------------- #25 preemption
def test_preemption_deletes_the_victims_a_budget_allows_and_the_preemptor_binds(backend, run_scheduler):
    """Two full nodes: n0 holds two ``feat-low`` pods that a PodDisruptionBudget protects, n1 two
    ``feat-mid`` pods. Without the budget kube's node order would take n0 (the lowest priority of the
    first victim); with it n0's victims would violate the budget twice, so n1's go (fewest PDB
    violations first). A pod of ``feat-low`` finds no victim anywhere: upstream's
    ``preemption: 0/2 nodes are available`` message. The victims get ``DisruptionTarget``
    (``PreemptionByScheduler``) and a ``Preempted`` Event, are deleted with their grace period and
    stay Terminating (no kubelet) while the preemptor waits nominated to n1; the test's "kubelet"
    then ends them (a DELETE with grace 0 on envtest; on the simulated cluster its clock passes the
    grace period) and the preemptor binds to n1. ``status.nominatedNodeName`` stays after the bind:
    kube-scheduler does not clear it on success, and the API server clears it on binding only from
    1.35 (the ClearingNominatedNodeNameAfterBinding gate, alpha in 1.34), so a v1.24 server keeps it
    as the simulated cluster does."""
    for name, value in PRIORITY_CLASSES.items():
        backend.create_priority_class(name, value)
    backend.create_nodes([a_node("n0", cpu="2"), a_node("n1", cpu="2")])
    backend.create_pods([bound_pod(f"guarded-{i}", "n0", "1", "feat-low", {"app": "guarded"}) for i in range(2)]
                        + [bound_pod(f"free-{i}", "n1", "1", "feat-mid", {"app": "free"}) for i in range(2)])
    assert backend.get_pod("default", "guarded-0")["spec"]["priority"] == 100  # the Priority admission
    backend.create_pdb({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                        "metadata": {"name": "guarded", "namespace": "default"},
                        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "guarded"}}}})
    peer = our_pod("peer", cpu="1")
    peer["spec"]["priorityClassName"] = "feat-low"
    backend.create_pods([peer])
    run_scheduler()
    wait_for(lambda: pod_scheduled(backend, "peer") is not None, 20, "the peer's PodScheduled condition")
    assert pod_scheduled(backend, "peer")["message"] == (
        "0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are available: "
        "2 No preemption victims found for incoming pod..")

    high = our_pod("high", cpu="2")
    high["spec"]["priorityClassName"] = "feat-high"
    [created] = backend.create_pods([high])
    assert created["spec"]["priority"] == 1000
    wait_for(lambda: backend.terminating() == ["free-0", "free-1"], 30, "n1's pods terminating")
    wait_for(lambda: ((backend.get_pod("default", "high").get("status") or {}).get("nominatedNodeName")) == "n1",
             20, "the preemptor nominated to n1")
    assert node_of(backend, "high") == "", "the victims still terminate: the preemptor waits"
    for name in ("free-0", "free-1"):
        victim = backend.get_pod("default", name)
        c = condition(victim, "DisruptionTarget")
        assert c is not None, f"{name} has no DisruptionTarget condition: {victim.get('status')}"
        assert (c["status"], c["reason"]) == ("True", "PreemptionByScheduler")
        assert c["message"] == f"{SCHED}: preempting to accommodate a higher priority pod"
        assert victim["metadata"]["deletionGracePeriodSeconds"] == 30  # their own (the default) grace period
    for name in ("guarded-0", "guarded-1"):
        assert not backend.get_pod("default", name)["metadata"].get("deletionTimestamp")
    flush(backend)
    uid = created["metadata"]["uid"]
    for name in ("free-0", "free-1"):
        wait_for(lambda: ("Preempted", f"Preempted by pod {uid} on node n1") in backend.events("default", name), 10,
                 f"the Preempted Event of {name}")
    wait_for(lambda: any(r == "FailedScheduling" for r, _ in backend.events("default", "high")), 10,
             "the preemptor's FailedScheduling Event")
    # the attempt that preempted failed; the preemption succeeded, so no "preemption:" part (upstream)
    assert ("FailedScheduling", "0/2 nodes are available: 2 Insufficient cpu.") in backend.events("default", "high")

    backend.finish_terminating()  # the kubelet: the victims' containers stopped
    wait_for(lambda: node_of(backend, "high") == "n1", 30, "the preemptor bound to n1")
    assert backend.get_pod("default", "high")["status"].get("nominatedNodeName") == "n1"
    assert node_of(backend, "peer") == "", "the nomination kept the freed room from the lower-priority pod"
    assert [node_of(backend, f"guarded-{i}") for i in range(2)] == ["n0", "n0"]


def ssar_denied(cluster: KubeCluster, verb: str, group: str, resource: str, sub: str = "", ns: str = "default") -> bool:
    """Whether the real API server's RBAC denies shardsched's service account ``verb`` on it."""
    attrs = {"verb": verb, "group": group, "resource": resource, "namespace": ns, **({"subresource": sub} if sub else {})}
    review = cluster._connection().request(
        "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", verb="create",
        resource="selfsubjectaccessreviews", body={"apiVersion": "authorization.k8s.io/v1",
                                                   "kind": "SelfSubjectAccessReview",
                                                   "spec": {"resourceAttributes": attrs}})
    return review["status"].get("allowed") is not True


# ---------------------------------------------------------------------------------------- #28 gangs
def pod_group(name: str, min_member: int) -> dict:
    return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"minMember": min_member, "scheduleTimeoutSeconds": 60}}


def member(group: str, i: int, cpu: str) -> dict:
    p = our_pod(f"{group}-{i}", cpu=cpu, scheduler=GANG_SCHED)
    p["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": group}
    return p


def test_a_gang_that_fits_is_bound_whole_and_one_that_does_not_has_no_member_bound(backend, run_scheduler):
    """The PodGroup CRD of deploy/crds installed through the API (envtest), a PodGroup of three
    2-cpu members on two 4-cpu nodes: all three bound. A second PodGroup of three 2-cpu members
    then finds 2 cpu free: no member bound, each with the gang's FailedScheduling message. The
    PodGroup's status is the PodGroup controller's (docs/gangs.md): the simulated cluster writes it
    as that controller does; on a real server, where that controller does not run here, shardsched
    leaves it unwritten (its role may not write PodGroups)."""
    backend.create_nodes([a_node("n0", cpu="4"), a_node("n1", cpu="4")])
    backend.create_pod_group(pod_group("fits", 3))
    backend.create_pods([member("fits", i, "2") for i in range(3)])
    run_scheduler()
    wait_for(lambda: all(node_of(backend, f"fits-{i}") for i in range(3)), 30, "the whole gang bound")
    assert sorted(node_of(backend, f"fits-{i}") for i in range(3)).count("n0") in (1, 2)

    backend.create_pod_group(pod_group("toobig", 3))
    backend.create_pods([member("toobig", i, "2") for i in range(3)])
    wait_for(lambda: all(pod_scheduled(backend, f"toobig-{i}") for i in range(3)), 30,
             "the PodScheduled condition of every member of the gang that does not fit")
    assert not any(node_of(backend, f"toobig-{i}") for i in range(3)), "all or nothing"
    msgs = {pod_scheduled(backend, f"toobig-{i}")["message"] for i in range(3)}
    assert len(msgs) == 1, msgs
    [msg] = msgs
    assert msg.startswith("pod group default/toobig: 1/3 members schedulable; default/toobig-"), msg
    assert msg.endswith(": 0/2 nodes are available: 2 Insufficient cpu."), msg
    flush(backend)
    wait_for(lambda: any(r == "FailedScheduling" for r, _ in backend.events("default", "toobig-0")), 10, "event")
    assert (("FailedScheduling", pod_scheduled(backend, "toobig-0")["message"])
            in backend.events("default", "toobig-0"))

    status = backend.get_pod_group("default", "fits").get("status") or {}
    if backend.name == "envtest":
        assert status == {}, f"shardsched wrote a PodGroup status on the real server: {status}"
        cluster = backend.cluster
        assert cluster.missing_permissions("kube-system", "shardsched") == []  # GANG_PERMISSIONS included
        for verb, sub in [("update", ""), ("patch", ""), ("create", ""), ("delete", ""),
                          ("update", "status"), ("patch", "status")]:
            assert ssar_denied(cluster, verb, "scheduling.x-k8s.io", "podgroups", sub), f"{verb} podgroups/{sub}"
        assert not ssar_denied(cluster, "watch", "scheduling.x-k8s.io", "podgroups")
    else:
        assert status["phase"] == "Running" and status["running"] == 3, status
        assert status["scheduleStartTime"]
        assert (backend.get_pod_group("default", "toobig").get("status") or {})["phase"] == "Scheduling"


# ---------------------------------------------------------------------------------------- #30 volumes
DRIVER = "csi.example.com"


def hostname_affinity(node_name: str) -> dict:
    return {"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": [node_name]}]}]}}


def storage_class(name: str, provisioner: str, mode: str) -> dict:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
            "provisioner": provisioner, "volumeBindingMode": mode, "reclaimPolicy": "Retain"}


def pv(name: str, storage_class_name: str, node_name: str, claim: dict | None = None) -> dict:
    spec = {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": storage_class_name,
            "persistentVolumeReclaimPolicy": "Retain", "csi": {"driver": DRIVER, "volumeHandle": f"handle-{name}"},
            "nodeAffinity": hostname_affinity(node_name)}
    if claim is not None:
        spec["claimRef"] = {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": "default",
                            "name": claim["metadata"]["name"], "uid": claim["metadata"]["uid"]}
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": spec}


def pvc(name: str, storage_class_name: str) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": "default"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": storage_class_name,
                     "resources": {"requests": {"storage": "1Gi"}}}}


def csi_node(node_name: str, count: int) -> dict:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": node_name},
            "spec": {"drivers": [{"name": DRIVER, "nodeID": f"id-{node_name}", "topologyKeys": ["kubernetes.io/hostname"],
                                  "allocatable": {"count": count}}]}}


def claim_user(name: str, claim: str) -> dict:
    p = our_pod(name, cpu="100m")
    p["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
    return p


def test_volumes_go_where_their_pvs_allow_within_the_csi_limits_and_shardsched_writes_the_binding(
        backend, run_scheduler):
    """StorageClasses (WaitForFirstConsumer static, WaitForFirstConsumer provisioned by a CSI
    driver, Immediate), a PV that only node v1 reaches, CSINodes allowing one volume of the driver
    per node, all created through the API. No PV controller or provisioner runs on envtest: the
    test does their part once shardsched has written its half (the PV's claimRef; the claim's
    ``volume.kubernetes.io/selected-node``), and checks before that the pod waits unbound.

    1. ``db`` (static claim): v1, the only node its PV allows; shardsched writes the PV's claimRef.
    2. ``scratch`` (provisioned claim): v1 is at its CSI limit (``db``'s volume), so v0, named by
       shardsched in the claim's selected-node annotation; the provisioner's PV then binds it.
    3. ``over`` (another provisioned claim): both nodes at their limit, NodeVolumeLimits' message;
       ``fast`` (an unbound Immediate claim): VolumeBinding's PreFilter message."""
    for sc in (storage_class("feat-local", "kubernetes.io/no-provisioner", "WaitForFirstConsumer"),
               storage_class("feat-csi", DRIVER, "WaitForFirstConsumer"),
               storage_class("feat-immediate", "kubernetes.io/no-provisioner", "Immediate")):
        backend.create_volume_object(sc)
    backend.create_nodes([a_node("v0"), a_node("v1")])
    for n in ("v0", "v1"):
        backend.create_volume_object(csi_node(n, 1))
    backend.create_volume_object(pv("pv-a", "feat-local", "v1"))
    if backend.name == "envtest":  # the PV controller's part: a new PV becomes Available
        backend.admin.request("PATCH", "/api/v1/persistentvolumes/pv-a/status", verb="patch",
                              resource="persistentvolumes", body={"status": {"phase": "Available"}},
                              content_type=MERGE_PATCH)
    for name, sc in (("data", "feat-local"), ("scratch", "feat-csi"), ("over", "feat-csi"), ("fast", "feat-immediate")):
        backend.create_volume_object(pvc(name, sc))
    rt = run_scheduler()

    # 1. the static claim: its PV's node, claimRef written by shardsched
    backend.create_pods([claim_user("db", "data")])
    data = backend.get_volume_object("PersistentVolumeClaim", "data", "default")
    wait_for(lambda: (backend.get_volume_object("PersistentVolume", "pv-a")["spec"].get("claimRef") or {}).get("name")
             == "data", 30, "pv-a's claimRef written")
    ref = backend.get_volume_object("PersistentVolume", "pv-a")["spec"]["claimRef"]
    assert (ref["namespace"], ref["name"], ref["uid"]) == ("default", "data", data["metadata"]["uid"])
    if backend.name == "envtest":
        assert node_of(backend, "db") == "", "PreBind waits for the claim to be bound"
        backend.complete_pv_binding("pv-a", "default", "data")
    wait_for(lambda: node_of(backend, "db") == "v1", 30, "db bound to v1")

    # 2. the provisioned claim: v1 is full of volumes, shardsched selects v0 for provisioning
    backend.create_pods([claim_user("scratch-user", "scratch")])

    def selected() -> str:
        obj = backend.get_volume_object("PersistentVolumeClaim", "scratch", "default")
        return (obj["metadata"].get("annotations") or {}).get("volume.kubernetes.io/selected-node", "")

    wait_for(lambda: selected() == "v0", 30, "the claim's selected-node annotation")
    if backend.name == "envtest":  # the external provisioner's part, then the PV controller's
        assert node_of(backend, "scratch-user") == ""
        claim = backend.get_volume_object("PersistentVolumeClaim", "scratch", "default")
        backend.create_volume_object(pv("pv-scratch", "feat-csi", "v0", claim=claim))
        backend.complete_pv_binding("pv-scratch", "default", "scratch")
    wait_for(lambda: node_of(backend, "scratch-user") == "v0", 30, "scratch-user bound to v0")

    # 3. no room for another volume of the driver; an unbound Immediate claim
    backend.create_pods([claim_user("over-user", "over"), claim_user("fast-user", "fast")])
    wait_for(lambda: pod_scheduled(backend, "over-user") and pod_scheduled(backend, "fast-user"), 30,
             "the PodScheduled conditions")
    assert pod_scheduled(backend, "over-user")["message"] == (
        "0/2 nodes are available: 2 node(s) exceed max volume count. preemption: 0/2 nodes are available: "
        "2 No preemption victims found for incoming pod..")
    assert pod_scheduled(backend, "fast-user")["message"] == (
        "0/2 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/2 nodes are "
        "available: 2 Preemption is not helpful for scheduling..")
    assert selected() == "v0" and not node_of(backend, "over-user") and not node_of(backend, "fast-user")
    assert rt.status()["unschedulable"] == 2

    if backend.name == "envtest":  # deploy/rbac: what serve needs for the storage kinds, and no more
        cluster = backend.cluster
        assert cluster.missing_permissions("kube-system", "shardsched") == []  # STORAGE_PERMISSIONS included
        for verb, group, resource, sub in [("update", "", "persistentvolumes", ""),
                                           ("create", "", "persistentvolumes", ""),
                                           ("delete", "", "persistentvolumes", ""),
                                           ("update", "", "persistentvolumeclaims", ""),
                                           ("patch", "", "persistentvolumeclaims", "status"),
                                           ("create", "storage.k8s.io", "csinodes", ""),
                                           ("update", "storage.k8s.io", "storageclasses", "")]:
            assert ssar_denied(cluster, verb, group, resource, sub), f"{verb} {resource}/{sub} must be denied"
