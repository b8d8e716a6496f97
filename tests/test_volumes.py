"""The volume plugins (VolumeRestrictions, NodeVolumeLimits, VolumeBinding, VolumeZone), the storage
objects they read (shardsched.api.volumes) and `simulate` on StatefulSet-like manifests."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import yaml

from builders import node, pod, table_of
from shardsched.api.volumes import PV, PVC, VolumeCatalog, parse_volume_object
from shardsched.errors import InvalidObjectError
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import Handle
from shardsched.framework.status import Code
from shardsched.plugins.nodevolumelimits import plugin as nodevolumelimits
from shardsched.plugins.volumebinding import plugin as volumebinding
from shardsched.plugins.volumerestrictions import plugin as volumerestrictions
from shardsched.plugins.volumezone import plugin as volumezone
from shardsched.scheduler.simulate import simulate

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


# ---------------------------------------------------------------------------------- builders

def pv(name, size="10Gi", cls="local", modes=("ReadWriteOnce",), *, host=None, zone=None, claim=None,
       labels=None, csi=None, phase=None, **spec):
    """A PersistentVolume; ``host`` adds node affinity on the hostname, ``zone`` a zone label."""
    obj = {"apiVersion": "v1", "kind": PV, "metadata": {"name": name, "labels": dict(labels or {})},
           "spec": {"capacity": {"storage": size}, "accessModes": list(modes), "storageClassName": cls, **spec}}
    if host is not None:
        obj["spec"]["nodeAffinity"] = {"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": HOST, "operator": "In", "values": [host]}]}]}}
    if zone is not None:
        obj["metadata"]["labels"][ZONE] = zone
    if claim is not None:
        obj["spec"]["claimRef"] = {"namespace": "default", "name": claim}
    if csi is not None:
        obj["spec"]["csi"] = {"driver": csi[0], "volumeHandle": csi[1]}
    if phase is not None:
        obj["status"] = {"phase": phase}
    return obj


def pvc(name, size="5Gi", cls="local", modes=("ReadWriteOnce",), *, volume=None, selected=None, selector=None,
        deleting=False, completed=False):
    """A PersistentVolumeClaim; ``completed`` adds the PV controller's bind-completed annotation."""
    obj = {"apiVersion": "v1", "kind": PVC, "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
           "spec": {"accessModes": list(modes), "resources": {"requests": {"storage": size}}}}
    if cls is not None:
        obj["spec"]["storageClassName"] = cls
    if volume is not None:
        obj["spec"]["volumeName"] = volume
    if selected is not None:
        obj["metadata"]["annotations"] = {"volume.kubernetes.io/selected-node": selected}
    if completed:
        obj["metadata"]["annotations"] = {"pv.kubernetes.io/bind-completed": "yes"}
    if selector is not None:
        obj["spec"]["selector"] = {"matchLabels": selector}
    if deleting:
        obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return obj


def sc(name="local", provisioner="kubernetes.io/no-provisioner", mode="WaitForFirstConsumer", zones=None):
    obj = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
           "provisioner": provisioner, "volumeBindingMode": mode}
    if zones is not None:
        obj["allowedTopologies"] = [{"matchLabelExpressions": [{"key": ZONE, "values": list(zones)}]}]
    return obj


def csinode(name, limits, migrated=()):
    obj = {"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": name},
           "spec": {"drivers": [{"name": d, "nodeID": name, **({} if c is None else {"allocatable": {"count": c}})}
                                for d, c in limits.items()]}}
    if migrated:
        obj["metadata"]["annotations"] = {"storage.alpha.kubernetes.io/migrated-plugins": ",".join(migrated)}
    return obj


def capacity(name, cls, size, zone):
    return {"apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
            "metadata": {"name": name, "namespace": "kube-system"}, "storageClassName": cls, "capacity": size,
            "nodeTopology": {"matchLabels": {ZONE: zone}}}


def catalog(*objs) -> VolumeCatalog:
    out = VolumeCatalog()
    for obj in objs:
        try:
            out.put(parse_volume_object(obj["kind"], obj))
        except InvalidObjectError as e:
            assert obj["kind"] == PV
            out.put_invalid_pv(obj["metadata"]["name"], str(e))
    return out


def claiming(*claims, name="p"):
    p = pod(name, cpu="100m")
    for c in claims:
        p = p.with_volume(c, persistentVolumeClaim={"claimName": c})
    return p


def two_nodes(*objs, pods=()):
    """n1 (zone a) and n2 (zone b) with the storage objects ``objs``."""
    table = table_of(node("n1").with_labels({ZONE: "a"}), node("n2").with_labels({ZONE: "b"}), pods=pods)
    table.volumes = catalog(*objs)
    return table


def run(plugin, p, table):
    """(PreFilter status, {node: passes}) of ``plugin`` for pod ``p``."""
    info, state = p.info(), CycleState()
    st = plugin.pre_filter(state, info, table)
    if not st.is_success():
        return st, None
    ok = plugin.filter(state, info, table, slice(0, table.n))
    for slot in range(table.n):  # the scalar path agrees with the vectorized one
        assert plugin.filter_slot(state, info, table, slot) == bool(ok[slot])
    fits = {table.names[s]: bool(ok[s]) for s in range(table.n)}
    failed = np.flatnonzero(~ok)
    reasons = plugin.failure_reasons(state, info, table, failed) if len(failed) else {}
    return reasons, fits


# ---------------------------------------------------------------------------------- VolumeBinding
VB_PREFILTER = [
    ("missing-claim", [], claiming("data"), 'persistentvolumeclaim "data" not found'),
    ("claim-deleting", [pvc("data", deleting=True)], claiming("data"), 'persistentvolumeclaim "data" is being deleted'),
    ("unbound-immediate", [sc("fast", "csi.example.com", "Immediate"), pvc("data", cls="fast")], claiming("data"),
     "pod has unbound immediate PersistentVolumeClaims"),
    ("missing-storage-class", [pvc("data", cls="gone")], claiming("data"),
     "pod has unbound immediate PersistentVolumeClaims"),
    ("no-class", [pvc("data", cls="")], claiming("data"), "pod has unbound immediate PersistentVolumeClaims"),
    ("volume-name-not-bound-yet", [pvc("data", volume="gone")], claiming("data"),
     "pod has unbound immediate PersistentVolumeClaims"),
    ("ephemeral-not-owned", [pvc("p-scratch")], pod("p").with_volume("scratch", ephemeral={"volumeClaimTemplate": {}}),
     "PVC default/p-scratch was not created for pod default/p (pod is not owner)"),
]


@pytest.mark.parametrize("objs, p, message", [c[1:] for c in VB_PREFILTER], ids=[c[0] for c in VB_PREFILTER])
def test_volume_binding_prefilter_rejects_as_kube(objs, p, message):
    st, _ = run(volumebinding.new(), p, two_nodes(sc(), *objs))
    assert (st.code, st.message, st.plugin) == (Code.UNSCHEDULABLE_AND_UNRESOLVABLE, message, "VolumeBinding")


NODE_CONFLICT, BIND_CONFLICT = volumebinding.ERR_NODE_CONFLICT, volumebinding.ERR_BIND_CONFLICT
VB_FILTER = [
    ("no-claims", [], pod("p"), None, None),
    ("bound-pv-on-n1", [pv("pv1", host="n1", claim="data"), pvc("data", volume="pv1")], claiming("data"),
     {"n1": True, "n2": False}, {NODE_CONFLICT: 1}),
    ("bound-pv-anywhere", [pv("pv1", claim="data"), pvc("data", volume="pv1")], claiming("data"),
     {"n1": True, "n2": True}, {}),
    ("bound-to-missing-pv", [pvc("data", volume="gone", completed=True)], claiming("data"), {"n1": False, "n2": False},
     {volumebinding.ERR_PV_NOT_EXIST: 2}),
    ("bound-to-invalid-pv", [pv("bad", claim="data", nodeAffinity={"required": {"nodeSelectorTerms": []}}),
                             pvc("data", volume="bad")], claiming("data"), {"n1": False, "n2": False},
     {NODE_CONFLICT: 2}),
    ("wffc-local-pv-on-n2", [pv("pv2", host="n2"), pvc("data")], claiming("data"), {"n1": False, "n2": True},
     {BIND_CONFLICT: 1}),
    ("wffc-pv-too-small", [pv("pv2", "1Gi", host="n2"), pvc("data")], claiming("data"), {"n1": False, "n2": False},
     {BIND_CONFLICT: 2}),
    ("wffc-access-modes", [pv("pv2", host="n2", modes=("ReadOnlyMany",)), pvc("data", modes=("ReadWriteMany",))],
     claiming("data"), {"n1": False, "n2": False}, {BIND_CONFLICT: 2}),
    ("wffc-selector", [pv("pv2", host="n2", labels={"tier": "slow"}), pvc("data", selector={"tier": "fast"})],
     claiming("data"), {"n1": False, "n2": False}, {BIND_CONFLICT: 2}),
    ("wffc-other-class", [pv("pv2", cls="other", host="n2"), pvc("data")], claiming("data"),
     {"n1": False, "n2": False}, {BIND_CONFLICT: 2}),
    ("wffc-pv-taken", [pv("pv2", host="n2", claim="other", phase="Bound"), pvc("data")], claiming("data"),
     {"n1": False, "n2": False}, {BIND_CONFLICT: 2}),
    ("wffc-prebound-pv", [pv("pv1", host="n1", claim="data"), pv("pv2", host="n2"), pvc("data")], claiming("data"),
     {"n1": True, "n2": False}, {BIND_CONFLICT: 1}),
    ("two-claims-one-pv", [pv("pv2", host="n2"), pvc("a"), pvc("b")], claiming("a", "b"), {"n1": False, "n2": False},
     {BIND_CONFLICT: 2}),
    ("two-claims-two-pvs", [pv("pv2", host="n2"), pv("pv3", "20Gi", host="n2"), pvc("a"), pvc("b", "15Gi")],
     claiming("a", "b"), {"n1": False, "n2": True}, {BIND_CONFLICT: 1}),
    ("provision-allowed-topology", [sc("zonal", "csi.example.com", zones=["a"]), pvc("data", cls="zonal")],
     claiming("data"), {"n1": True, "n2": False}, {BIND_CONFLICT: 1}),
    ("provision-capacity", [sc("zonal", "csi.example.com"), pvc("data", "50Gi", cls="zonal"),
                            capacity("cap-a", "zonal", "10Gi", "a"), capacity("cap-b", "zonal", "100Gi", "b")],
     claiming("data"), {"n1": False, "n2": True}, {volumebinding.ERR_NOT_ENOUGH_SPACE: 1}),
    ("provisioning-under-way", [sc("zonal", "csi.example.com"), pvc("data", cls="zonal", selected="n1")],
     claiming("data"), {"n1": True, "n2": False}, {BIND_CONFLICT: 1}),
]


@pytest.mark.parametrize("objs, p, fits, reasons", [c[1:] for c in VB_FILTER], ids=[c[0] for c in VB_FILTER])
def test_volume_binding_filter(objs, p, fits, reasons):
    got_reasons, got_fits = run(volumebinding.new(), p, two_nodes(sc(), *objs))
    if fits is None:
        assert got_reasons.is_skip()
    else:
        assert (got_fits, got_reasons) == (fits, reasons)


class FakeVolumeClient:
    """Records PreBind's writes; a claim is bound once written (or never, with ``bind=False``)."""

    def __init__(self, bind=True):
        self.writes, self.bind = [], bind

    def bind_volume(self, pv_name, namespace, claim, claim_uid):
        self.writes.append(("claimRef", pv_name, f"{namespace}/{claim}", claim_uid))

    def set_selected_node(self, namespace, claim, node_name):
        self.writes.append(("selected-node", f"{namespace}/{claim}", node_name))

    def claim_bound(self, namespace, claim):
        return self.bind


def reserved(objs, p, node_name, client=None, clock=None):
    table = two_nodes(sc(), sc("zonal", "csi.example.com"), *objs)
    handle = Handle(volume_client=client)
    handle.table = table
    plugin = volumebinding.VolumeBinding(5.0, handle, **({} if clock is None else clock))
    state = CycleState()
    statuses = plugin.reserve(state, [p.info()], [node_name])
    return table, plugin, state, statuses[0]


def test_reserve_assumes_the_pv_so_the_next_pod_cannot_take_it_and_unreserve_gives_it_back():
    objs = [pv("pv2", host="n2"), pvc("a"), pvc("b")]
    first, second = claiming("a", name="first"), claiming("b", name="second")
    table, plugin, state, st = reserved(objs, first, "n2")
    assert st.is_success()
    assert table.volumes.pvs["pv2"].claim_ref.key == "default/a" and table.volumes.pvcs["default/a"].volume_name == "pv2"
    _, fits = run(plugin, second, table)
    assert fits == {"n1": False, "n2": False}
    plugin.unreserve(state, [first.info()], ["n2"])
    assert table.volumes.pvs["pv2"].claim_ref is None and table.volumes.pvcs["default/a"].volume_name == ""
    _, fits = run(plugin, second, table)
    assert fits == {"n1": False, "n2": True}
    plugin.unreserve(state, [first.info()], ["n2"])  # idempotent


def test_reserve_refuses_a_node_that_no_longer_fits():
    _, _, _, st = reserved([pv("pv2", host="n2"), pvc("a")], claiming("a"), "n1")
    assert (st.code, st.message) == (Code.UNSCHEDULABLE_AND_UNRESOLVABLE, BIND_CONFLICT)


def test_prebind_writes_claim_ref_and_selected_node_then_waits_for_the_binding():
    client = FakeVolumeClient()
    objs = [pv("pv2", host="n2"), pvc("a"), pvc("b", cls="zonal")]
    p = claiming("a", "b")
    _, plugin, state, st = reserved(objs, p, "n2", client)
    assert st.is_success()
    assert plugin.pre_bind(state, [p.info()], ["n2"])[0].is_success()
    assert client.writes == [("claimRef", "pv2", "default/a", "uid-a"), ("selected-node", "default/b", "n2")]


def test_prebind_times_out_after_bind_timeout_seconds():
    now = [0.0]
    clock = {"clock": lambda: now[0], "sleep": lambda s: now.__setitem__(0, now[0] + s)}
    p = claiming("a")
    _, plugin, state, _ = reserved([pv("pv2", host="n2"), pvc("a")], p, "n2", FakeVolumeClient(bind=False), clock)
    st = plugin.pre_bind(state, [p.info()], ["n2"])[0]
    assert (st.code, st.message) == (Code.ERROR, "binding volumes: timed out waiting for the condition")
    assert now[0] == 5.0


# ---------------------------------------------------------------------------------- VolumeRestrictions

def disk_pod(name, **source):
    return pod(name, cpu="100m").with_volume("disk", **source)


GCE, EBS = "gcePersistentDisk", "awsElasticBlockStore"
DISK_CASES = [
    ("gce-same-pd", {GCE: {"pdName": "d1"}}, {GCE: {"pdName": "d1"}}, False),
    ("gce-both-read-only", {GCE: {"pdName": "d1", "readOnly": True}}, {GCE: {"pdName": "d1", "readOnly": True}}, True),
    ("gce-other-pd", {GCE: {"pdName": "d1"}}, {GCE: {"pdName": "d2"}}, True),
    ("ebs-read-only-still-conflicts", {EBS: {"volumeID": "v", "readOnly": True}},
     {EBS: {"volumeID": "v", "readOnly": True}}, False),
    ("rbd-no-shared-monitor", {"rbd": {"monitors": ["m1"], "image": "i"}}, {"rbd": {"monitors": ["m2"], "image": "i"}},
     True),
    ("rbd-shared-monitor", {"rbd": {"monitors": ["m1", "m2"], "image": "i"}}, {"rbd": {"monitors": ["m2"], "image": "i"}},
     False),
    ("iscsi-same-iqn", {"iscsi": {"targetPortal": "t:3260", "iqn": "iqn.x", "lun": 0}},
     {"iscsi": {"targetPortal": "t:3260", "iqn": "iqn.x", "lun": 1}}, False),
]


@pytest.mark.parametrize("existing, new, fits_n1", [c[1:] for c in DISK_CASES], ids=[c[0] for c in DISK_CASES])
def test_volume_restrictions_disk_conflicts(existing, new, fits_n1):
    table = two_nodes(pods=[disk_pod("old", **existing).on("n1")])
    reasons, fits = run(volumerestrictions.new(), disk_pod("new", **new), table)
    assert fits == {"n1": fits_n1, "n2": True}
    assert reasons == ({} if fits_n1 else {volumerestrictions.ERR_DISK_CONFLICT: 1})


def test_volume_restrictions_read_write_once_pod_is_one_pod_in_the_cluster():
    objs = [pv("pv1", claim="data", modes=("ReadWriteOncePod",)), pvc("data", volume="pv1", modes=("ReadWriteOncePod",))]
    table = two_nodes(*objs, pods=[claiming("data", name="old").on("n1")])
    st, _ = run(volumerestrictions.new(), claiming("data", name="new"), table)
    assert (st.code, st.message) == (Code.UNSCHEDULABLE, volumerestrictions.ERR_READ_WRITE_ONCE_POD)
    shared = two_nodes(pv("pv1", claim="data"), pvc("data", volume="pv1"), pods=[claiming("data", name="old").on("n1")])
    assert run(volumerestrictions.new(), claiming("data", name="new"), shared)[0].is_skip()


# ---------------------------------------------------------------------------------- NodeVolumeLimits
EBS_CSI = "ebs.csi.aws.com"


def csi_pod(name, *claims):
    return claiming(*claims, name=name)


def limits_table(limits_n1, *objs, pods=()):
    return two_nodes(sc("ebs", EBS_CSI), *objs, *([csinode("n1", limits_n1)] if limits_n1 is not None else []),
                     pods=pods)


def bound_pair(name, handle):
    return [pv(f"pv-{name}", cls="ebs", claim=name, csi=(EBS_CSI, handle)), pvc(name, cls="ebs", volume=f"pv-{name}")]


NVL_CASES = [
    ("under-the-limit", {EBS_CSI: 2}, ["a"], ["b"], True),
    ("over-the-limit", {EBS_CSI: 1}, ["a"], ["b"], False),
    ("shared-volume-counts-once", {EBS_CSI: 1}, ["a"], ["a"], True),
    ("no-csinode", None, ["a"], ["b"], True),
    ("csinode-without-the-driver", {"other.csi.example.com": 0}, ["a"], ["b"], True),
    ("driver-without-a-count", {EBS_CSI: None}, ["a"], ["b"], True),
]


@pytest.mark.parametrize("limits, existing, new, fits_n1", [c[1:] for c in NVL_CASES], ids=[c[0] for c in NVL_CASES])
def test_node_volume_limits(limits, existing, new, fits_n1):
    objs = [o for c in {*existing, *new} for o in bound_pair(c, f"vol-{c}")]
    table = limits_table(limits, *objs, pods=[csi_pod("old", *existing).on("n1")])
    reasons, fits = run(nodevolumelimits.new(), csi_pod("new", *new), table)
    assert fits == {"n1": fits_n1, "n2": True}
    assert reasons == ({} if fits_n1 else {nodevolumelimits.ERR_MAX_VOLUME_COUNT: 1})


def test_node_volume_limits_counts_unbound_claims_by_provisioner_and_migrated_in_tree_disks():
    table = two_nodes(sc("ebs", EBS_CSI), pvc("a", cls="ebs"), pvc("b", cls="ebs"),
                      csinode("n1", {EBS_CSI: 2}, migrated=["kubernetes.io/aws-ebs"]),
                      pods=[disk_pod("old", **{EBS: {"volumeID": "vol-1"}}).on("n1")])
    _, fits = run(nodevolumelimits.new(), csi_pod("new", "a"), table)
    assert fits["n1"]  # the in-tree disk (migrated) and the new claim: 2
    _, fits = run(nodevolumelimits.new(), csi_pod("new", "a", "b"), table)
    assert not fits["n1"]


# ---------------------------------------------------------------------------------- VolumeZone
VZ_CASES = [
    ("zone-a", "a", {"n1": True, "n2": False, "bare": True}),
    ("zones-a-and-b", "a__b", {"n1": True, "n2": True, "bare": True}),
    ("zone-c", "c", {"n1": False, "n2": False, "bare": True}),
]


@pytest.mark.parametrize("zone, fits", [c[1:] for c in VZ_CASES], ids=[c[0] for c in VZ_CASES])
def test_volume_zone(zone, fits):
    """The node's zone must be among the bound PV's; a node without zone labels fits (upstream)."""
    table = table_of(node("n1").with_labels({ZONE: "a"}), node("n2").with_labels({ZONE: "b"}), node("bare"))
    table.volumes = catalog(pv("pv1", zone=zone, claim="data"), pvc("data", volume="pv1"))
    reasons, got = run(volumezone.new(), claiming("data"), table)
    assert got == fits
    assert reasons == ({volumezone.ERR_CONFLICT: list(fits.values()).count(False)} if False in fits.values() else {})


def test_volume_zone_skips_unbound_wait_for_first_consumer_claims():
    assert run(volumezone.new(), claiming("data"), two_nodes(sc(), pvc("data")))[0].is_skip()


# ---------------------------------------------------------------------------------- objects

@pytest.mark.parametrize("kind, obj, path", [
    (PV, pv("x", nodeAffinity={"required": {"nodeSelectorTerms": []}}), "spec.nodeAffinity.required.nodeSelectorTerms"),
    (PV, pv("x", host="n1") | {"spec": {**pv("x", host="n1")["spec"], "nodeAffinity": {"required": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": HOST, "operator": "Near", "values": ["n1"]}]}]}}}},
     "spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].operator"),
    (PV, pv("x", size="ten"), "spec.capacity.storage"),
    (PVC, pvc("x", modes=("ReadWriteSometimes",)), "spec.accessModes[0]"),
    ("StorageClass", sc(mode="Later"), "volumeBindingMode"),
    ("CSINode", csinode("n1", {EBS_CSI: -1}), "spec.drivers[0].allocatable.count"),
], ids=["pv-no-terms", "pv-bad-operator", "pv-bad-size", "pvc-bad-mode", "sc-bad-mode", "csinode-negative"])
def test_bad_storage_objects_name_the_field(kind, obj, path):
    with pytest.raises(InvalidObjectError) as err:
        parse_volume_object(kind, obj)
    assert err.value.path == path


# ---------------------------------------------------------------------------------- simulate

def manifests(tmp_path, *objs):
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump_all(list(objs)))
    return path


def sim_nodes():
    return [dict(node(n).with_labels({ZONE: z})) for n, z in (("n1", "a"), ("n2", "b"), ("n3", "b"))]


def stateful_set(n, cls="local"):
    """``web-0..n-1``, each with its claim ``data-web-i`` (a StatefulSet's volumeClaimTemplates)."""
    out = []
    for i in range(n):
        out.append(pvc(f"data-web-{i}", cls=cls))
        out.append(dict(claiming(f"data-web-{i}", name=f"web-{i}")))
    return out


def outcomes(report):
    return {p.name: (p.status, p.node, p.reason) for p in report.pods}


def test_simulate_stateful_set_on_local_volumes(tmp_path):
    """Local PVs on n1 and n3 only: web-0 and web-1 take one each, web-2 finds none (kube's words)."""
    path = manifests(tmp_path, *sim_nodes(), sc(), pv("local-n1", host="n1"), pv("local-n3", host="n3"),
                     *stateful_set(3))
    got = outcomes(simulate([path]))
    placed = sorted(got[f"web-{i}"][1] for i in range(2))
    assert placed == ["n1", "n3"]
    assert got["web-2"] == ("Unschedulable", None,
                            "0/3 nodes are available: 3 node(s) didn't find available persistent volumes to bind. "
                            "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling..")


def test_simulate_provisions_within_allowed_topologies_and_keeps_bound_volumes_zones(tmp_path):
    path = manifests(tmp_path, *sim_nodes(), sc("zonal", "csi.example.com", zones=["b"]), *stateful_set(4, "zonal"),
                     pv("old", cls="zonal", zone="a", claim="kept"), pvc("kept", cls="zonal", volume="old"),
                     dict(claiming("kept", name="reader")))
    got = outcomes(simulate([path]))
    assert {got[f"web-{i}"][1] for i in range(4)} <= {"n2", "n3"}
    assert got["reader"][:2] == ("Scheduled", "n1")


def test_simulate_bad_storage_input_is_reported_and_nothing_is_lost(tmp_path):
    """A PV with an invalid node affinity (an error, and its claim fits no node), a claim naming a
    missing StorageClass (kube's unbound immediate claim), a CSINode without the pod's driver (no
    limit): each pod has an outcome, none crashes the run."""
    bad = pv("bad", claim="on-bad", nodeAffinity={"required": {"nodeSelectorTerms": []}})
    path = manifests(tmp_path, *sim_nodes(), sc(), bad, pvc("on-bad", volume="bad"), pvc("lost", cls="missing"),
                     csinode("n1", {"other.csi.example.com": 1}), sc("ebs", EBS_CSI), pvc("e", cls="ebs",
                                                                                           volume="pv-e"),
                     pv("pv-e", cls="ebs", claim="e", csi=(EBS_CSI, "vol-e"), host="n1"),
                     dict(claiming("on-bad", name="a")), dict(claiming("lost", name="b")), dict(claiming("e", name="c")))
    report = simulate([path])
    assert [e.message for e in report.errors] == [
        "invalid PersistentVolume: spec.nodeAffinity.required.nodeSelectorTerms: must have at least one node "
        "selector term"]
    got = outcomes(report)
    assert got["a"][:2] == ("Unschedulable", None)
    assert got["a"][2].startswith("0/3 nodes are available: 3 node(s) had volume node affinity conflict.")
    assert got["b"][:2] == ("Unschedulable", None)
    assert got["b"][2].startswith("0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims.")
    assert got["c"][:2] == ("Scheduled", "n1")


def test_simulate_in_tree_disk_conflict(tmp_path):
    """Two pods with the same GCE PD, read-write: never on one node."""
    one = textwrap.dedent("""\
        apiVersion: v1
        kind: Pod
        metadata: {name: NAME}
        spec:
          nodeSelector: {kubernetes.io/hostname: n1}
          containers: [{name: c, image: x}]
          volumes: [{name: d, gcePersistentDisk: {pdName: disk-1}}]
        """)
    path = tmp_path / "disks.yaml"
    path.write_text(yaml.safe_dump_all(sim_nodes()) + "---\n" + one.replace("NAME", "first") + "---\n"
                    + one.replace("NAME", "second"))
    got = outcomes(simulate([path]))
    assert got["first"][:2] == ("Scheduled", "n1")
    assert got["second"][2].startswith("0/3 nodes are available: 1 node(s) had no available disk, 2 node(s) didn't "
                                       "match Pod's node affinity/selector.")


# ---------------------------------------------------------------------------------- the simulated cluster

@pytest.fixture
def sim():
    from shardsched.sim.cluster import SimCluster
    cluster = SimCluster()
    cluster.create_nodes([node("n1").with_labels({ZONE: "a"}), node("n2").with_labels({ZONE: "b"})])
    return cluster


def stored(cluster, kind, name, namespace=None):
    return cluster.get_volume_object(kind, name, namespace)


def test_sim_pv_controller_binds_a_claim_whose_pv_got_its_claim_ref(sim):
    """VolumeBinding's PreBind writes the PV's claimRef; the controller binds the claim in the same
    call (volumeName, bind-completed, phase Bound on both), each change a watch event."""
    _, rv = sim.list_pvs()
    for obj in (sc(), pv("pv2", host="n2"), pvc("data")):
        sim.create_volume_object(obj)
    assert not sim.claim_bound("default", "data")
    claim_uid = stored(sim, PVC, "data", "default")["metadata"]["uid"]
    sim.bind_volume("pv2", "default", "data", claim_uid)
    assert sim.claim_bound("default", "data")
    claim, volume = stored(sim, PVC, "data", "default"), stored(sim, PV, "pv2")
    assert (claim["spec"]["volumeName"], claim["status"]["phase"]) == ("pv2", "Bound")
    assert (volume["spec"]["claimRef"]["uid"], volume["status"]["phase"]) == (claim_uid, "Bound")
    events, _ = sim.events_since(rv, kinds=[PV, PVC])
    assert [(e.type, e.kind, e.object["metadata"]["name"]) for e in events][-2:] == [
        ("MODIFIED", PV, "pv2"), ("MODIFIED", PVC, "data")]


def test_sim_pv_controller_provisions_for_the_selected_node_with_its_topology(sim):
    sim.create_volume_object(sc("zonal", "csi.example.com"))
    sim.create_volume_object(csinode("n2", {"csi.example.com": 10}) | {"spec": {"drivers": [
        {"name": "csi.example.com", "nodeID": "n2", "topologyKeys": [ZONE]}]}})
    sim.create_volume_object(pvc("data", "3Gi", cls="zonal"))
    assert sim.list_pvs()[0] == []  # WaitForFirstConsumer: nothing before the scheduler chooses
    sim.set_selected_node("default", "data", "n2")
    [volume] = sim.list_pvs()[0]
    assert volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["b"]}]}]
    assert volume["spec"]["capacity"]["storage"] == str(3 * 2**30)
    assert sim.claim_bound("default", "data")


def test_sim_pv_controller_binds_immediate_claims_and_reclaims_deleted_ones(sim):
    sim.create_volume_object(sc("now", "csi.example.com", "Immediate"))
    sim.create_volume_object(pv("small", "1Gi", cls="now"))
    sim.create_volume_object(pv("big", "100Gi", cls="now"))
    sim.create_volume_object(pvc("fits", "1Gi", cls="now"))
    sim.create_volume_object(pvc("new", "200Gi", cls="now"))
    assert stored(sim, PVC, "fits", "default")["spec"]["volumeName"] == "small"  # the smallest that fits
    provisioned = stored(sim, PVC, "new", "default")["spec"]["volumeName"]
    assert provisioned.startswith("pvc-") and stored(sim, PV, provisioned)["spec"]["csi"]["driver"] == "csi.example.com"
    sim.delete_volume_object(PVC, "new", "default")  # class reclaim policy Delete: the PV goes
    assert provisioned not in {v["metadata"]["name"] for v in sim.list_pvs()[0]}
    sim.delete_volume_object(PVC, "fits", "default")  # a pre-created PV's default policy is Retain
    assert stored(sim, PV, "small")["status"]["phase"] == "Released"


def test_sim_refuses_bad_storage_objects_with_the_field(sim):
    from shardsched.cluster import AlreadyExists, Invalid
    with pytest.raises(Invalid, match="spec.nodeAffinity.required.nodeSelectorTerms"):
        sim.create_volume_object(pv("bad", nodeAffinity={"required": {"nodeSelectorTerms": []}}))
    sim.create_volume_object(sc())
    with pytest.raises(AlreadyExists):
        sim.create_volume_object(sc())
    assert sim.list_pvs()[0] == []


def test_sim_default_storage_class_is_given_to_a_claim_without_one(sim):
    default = sc("std", "csi.example.com")
    default["metadata"]["annotations"] = {"storageclass.kubernetes.io/is-default-class": "true"}
    sim.create_volume_object(default)
    sim.create_volume_object(pvc("data", cls=None))
    assert stored(sim, PVC, "data", "default")["spec"]["storageClassName"] == "std"


def test_prebind_against_the_simulated_cluster_binds_and_provisions(sim):
    """VolumeBinding's Reserve over a catalog of the cluster's objects, then PreBind writing to the
    simulated cluster: both claims end bound, one to the chosen PV, one to a provisioned PV."""
    for obj in (sc(), sc("zonal", "csi.example.com"), pv("pv2", host="n2"), pvc("a"), pvc("b", cls="zonal")):
        sim.create_volume_object(obj)
    table = table_of(*(n for n in (node("n1").with_labels({ZONE: "a"}), node("n2").with_labels({ZONE: "b"}))))
    table.volumes = catalog(*(o for kind in (PV, PVC, "StorageClass") for o in sim.list_storage(kind)[0]))
    handle = Handle(volume_client=sim)
    handle.table = table
    plugin = volumebinding.VolumeBinding(5.0, handle)
    p, state = claiming("a", "b").info(), CycleState()
    assert plugin.reserve(state, [p], ["n2"])[0].is_success()
    assert plugin.pre_bind(state, [p], ["n2"])[0].is_success()
    assert stored(sim, PVC, "a", "default")["spec"]["volumeName"] == "pv2"
    assert stored(sim, PVC, "b", "default")["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == "n2"
    assert sim.claim_bound("default", "b")


# ---------------------------------------------------------------------------------- the Kubernetes backend

def wait_for(check, timeout_s: float = 10.0, what: str = "condition") -> None:
    import time
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def storage_cluster(simapi_spec):
    from shardsched.kube.cluster import KubeCluster
    kc = KubeCluster(simapi_spec, ["shardsched-test"], watch_timeout_s=5, watch_storage=True)
    yield kc
    kc.stop()


def test_kube_backend_lists_and_watches_storage_and_writes_volume_binding(simapi, storage_cluster):
    """With its storage watch, KubeCluster lists the five kinds (with their apiVersions), serves
    their changes through events_since, and VolumeBinding's writes (claimRef, selected-node)
    reach the API server, where the PV controller binds; claim_bound follows the watch."""
    from shardsched.cluster import CSI_NODE, STORAGE_CLASS, STORAGE_KINDS
    sim = simapi.sim
    for obj in (sc(), sc("zonal", "csi.example.com"), pv("pv2", host="n1"), pvc("a"), csinode("n1", {EBS_CSI: 3})):
        sim.create_volume_object(obj)
    kc = storage_cluster
    assert set(STORAGE_KINDS) <= kc.capabilities.kinds
    classes, rv = kc.list_storage_classes()
    assert sorted((c["apiVersion"], c["metadata"]["name"]) for c in classes) == [
        ("storage.k8s.io/v1", "local"), ("storage.k8s.io/v1", "zonal")]
    assert [n["metadata"]["name"] for n in kc.list_csi_nodes()[0]] == ["n1"]
    assert [(p["kind"], p["metadata"]["name"]) for p in kc.list_pvs()[0]] == [(PV, "pv2")]
    sim.create_volume_object(pvc("b", cls="zonal"))
    uid = sim.get_volume_object(PVC, "a", "default")["metadata"]["uid"]
    kc.bind_volume("pv2", "default", "a", uid)
    kc.set_selected_node("default", "b", "n1")
    wait_for(lambda: kc.claim_bound("default", "a") and kc.claim_bound("default", "b"), what="both claims bound")
    events, _ = kc.events_since(rv, [PVC])
    assert {e.object["metadata"]["name"] for e in events} == {"a", "b"}
    assert not kc.events_since(rv, [STORAGE_CLASS, CSI_NODE])[0]


def test_kube_backend_without_storage_watch_keeps_its_kinds(simapi_spec):
    from shardsched.cluster import PV as PV_KIND
    from shardsched.kube.cluster import KubeCluster
    kc = KubeCluster(simapi_spec, ["shardsched-test"])
    try:
        assert PV_KIND not in kc.capabilities.kinds
    finally:
        kc.stop()


def test_simulate_a_gang_that_fails_whole_gives_back_its_volumes(tmp_path):
    """A gang of two (Coscheduling) whose second member fits nowhere: the first member is not
    placed, and the local PV it had taken is free again for the pod after it."""
    from pathlib import Path
    config = Path(__file__).resolve().parent.parent / "deploy" / "config" / "coscheduling.yaml"
    group = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
             "metadata": {"name": "train", "namespace": "default", "creationTimestamp": "2026-01-01T00:00:00Z"},
             "spec": {"minMember": 2}}

    def member(name, claim, cpu, created):
        p = dict(claiming(claim, name=name))
        p["metadata"] = {"name": name, "namespace": "default", "creationTimestamp": created,
                         "labels": {"scheduling.x-k8s.io/pod-group": "train"}}
        p["spec"] = {**p["spec"], "schedulerName": "gang-scheduler"}
        p["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu}}
        return p

    later = dict(claiming("c", name="later"))
    later["metadata"]["creationTimestamp"] = "2026-01-01T00:00:09Z"
    later["spec"]["schedulerName"] = "gang-scheduler"
    path = manifests(tmp_path, *sim_nodes(), sc(), pv("only", host="n1"), pvc("a"), pvc("b"), pvc("c"), group,
                     member("train-0", "a", "1", "2026-01-01T00:00:01Z"),
                     member("train-1", "b", "64", "2026-01-01T00:00:02Z"), later)
    got = outcomes(simulate([path], config))
    assert got["train-0"][:2] == ("Unschedulable", None)
    assert got["later"][:2] == ("Scheduled", "n1")


def test_storage_watch_events_become_catalog_changes_and_bad_objects_are_named(caplog):
    """`storage_changes` as the coordinator applies the watch: only an object's last event counts;
    a PV whose node affinity cannot be parsed is kept as invalid (a claim bound to it fits no
    node), a claim that cannot be parsed is dropped as if deleted, an object without a name is
    skipped; each is logged with its kind, key and field. `VolumeCatalog.apply` changes nothing
    for an equal view, and ``replace`` drops what the list no longer has."""
    from shardsched.cluster import storage_changes

    pv = {"metadata": {"name": "pv-1"}, "spec": {"capacity": {"storage": "1Gi"}}}
    bad_pv = {"metadata": {"name": "pv-2"}, "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": []}}}}
    bad_claim = {"metadata": {"name": "c", "namespace": "ns"}, "spec": {"resources": {"requests": {"storage": "lots"}}}}
    changes = storage_changes([("ADDED", PV, pv), ("ADDED", PV, bad_pv), ("ADDED", PVC, bad_claim),
                               ("ADDED", PVC, {"metadata": {}}), ("MODIFIED", PV, {**pv, "spec": {}}),
                               ("ADDED", "StorageClass", {"metadata": {"name": "gone"}, "provisioner": "x"}),
                               ("DELETED", "StorageClass", {"metadata": {"name": "gone"}})])
    assert [(v.name, v.capacity_bytes) for v in changes.upserts] == [("pv-1", 0)]
    assert changes.invalid_pvs == {"pv-2": "spec.nodeAffinity.required.nodeSelectorTerms: must have at least one "
                                            "node selector term"}
    assert changes.removed == [(PVC, "ns/c"), ("StorageClass", "gone")]
    assert "PersistentVolume pv-2 ignored" in caplog.text and "PersistentVolumeClaim ns/c ignored" in caplog.text
    catalog = VolumeCatalog()
    assert catalog.apply(changes.upserts, changes.removed, changes.invalid_pvs, replace=True)
    assert not catalog.apply(changes.upserts, changes.removed, changes.invalid_pvs)
    assert catalog.apply([], [], {}, replace=True) and not catalog.pvs and not catalog.invalid_pvs
