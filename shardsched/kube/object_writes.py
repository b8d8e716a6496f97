"""The synchronous single-object writes of `KubeCluster`: a preemption's (the victims' delete and
DisruptionTarget, the preemptor's nominatedNodeName, many candidates at once) and VolumeBinding's
PreBind (a PV's claimRef, a claim's selected-node annotation).

Unlike Events and conditions, which are queued and written in the background
(`shardsched.kube.writers`), these are requests whose typed errors (`Forbidden`, `NotFound`,
`Conflict`) the caller acts on. `ObjectWrites` is mixed into `KubeCluster`, whose
``_connection()`` (the API client of this process) and ``store`` (the informers' cache) it uses.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from shardsched.api.objects import disruption_target_condition
from shardsched.api.volumes import SELECTED_NODE_ANNOTATION
from shardsched.cluster.preemption import Candidate, CandidateResult, prepare_candidate, prepare_candidates
from shardsched.kube.client import MERGE_PATCH, STRATEGIC_MERGE_PATCH
from shardsched.kube.writers import condition_patch

#: most preemptions' writes in flight at once in `KubeCluster.prepare_candidates` (each a few
#: synchronous requests; the token bucket still paces them)
PREEMPTION_WORKERS = 16


class ObjectWrites:
    """The writes of the module docstring, for `KubeCluster` (which provides ``_connection`` and
    ``store``)."""

    # ------------------------------------------------------------------ VolumeBinding's PreBind
    def bind_volume(self, pv_name: str, namespace: str, claim: str, claim_uid: str) -> None:
        """Set a PV's ``spec.claimRef`` (a merge patch of ``persistentvolumes``), synchronously, as
        upstream's ``bindAPIUpdate`` updates it; the PV controller binds the claim.
        Raises: `NotFound`, `Conflict`, `Forbidden`, `TemporaryError`."""
        body = {"spec": {"claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": namespace,
                                      "name": claim, "uid": claim_uid}}}
        self._connection().request("PATCH", f"/api/v1/persistentvolumes/{pv_name}", verb="patch",
                                   resource="persistentvolumes", body=body, content_type=MERGE_PATCH)

    def set_selected_node(self, namespace: str, claim: str, node: str) -> None:
        """Annotate a claim with ``volume.kubernetes.io/selected-node`` (a merge patch), synchronously;
        the provisioner then provisions. Raises: `NotFound`, `Forbidden`, `TemporaryError`."""
        body = {"metadata": {"annotations": {SELECTED_NODE_ANNOTATION: node}}}
        self._connection().request("PATCH", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}",
                                   verb="patch", resource="persistentvolumeclaims", body=body,
                                   content_type=MERGE_PATCH)

    # ------------------------------------------------------------------ preemption
    def delete_pod(self, namespace: str, name: str, uid: str | None = None,
                   grace_period_s: int | None = None) -> dict:
        """Delete a pod (``DELETE pods/<name>`` with ``DeleteOptions``), synchronously: the API
        server's answer, the pod with its ``deletionTimestamp`` (or a Status once it is gone).

        Args:
            uid: ``preconditions.uid``: the pod must still be that one.
            grace_period_s: ``gracePeriodSeconds``; None for the pod's own.

        Raises: `NotFound` (already gone), `Conflict` (the uid precondition failed: the pod was
        re-created), `Forbidden` (RBAC), `TemporaryError`.
        """
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        return self._connection().request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", verb="delete",
                                          resource="pods", body=body)

    def set_disruption_target(self, namespace: str, name: str, scheduler_name: str) -> bool:
        """Patch the ``DisruptionTarget`` condition onto a victim through ``pods/status``, synchronously
        (`ClusterBackend.set_disruption_target`); not sent when the watched pod already has it.
        Raises: `NotFound`, `Forbidden`, `TemporaryError`."""
        body = condition_patch(self.store.pod(namespace, name), disruption_target_condition(scheduler_name))
        if body is None:
            return False
        self._patch_status(namespace, name, body)
        return True

    def set_nominated_node_name(self, namespace: str, name: str, node_name: str) -> bool:
        """Set (or with ``""`` clear: ``null`` in the strategic merge patch) ``status.nominatedNodeName``
        through ``pods/status``, synchronously; not sent when the watched pod already has that value.
        Raises: `NotFound`, `Forbidden`, `TemporaryError`."""
        pod = self.store.pod(namespace, name)
        if pod is not None and ((pod.get("status") or {}).get("nominatedNodeName") or "") == node_name:
            return False
        self._patch_status(namespace, name, {"status": {"nominatedNodeName": node_name or None}})
        return True

    def prepare_candidates(self, candidates: Sequence[Candidate]) -> list[CandidateResult]:
        """Many preemptions' writes (`ClusterBackend.prepare_candidates`): the candidates run
        concurrently, up to `PREEMPTION_WORKERS` at once on this copy's connection pool (under its
        rate limiter), each one's requests in order (`shardsched.cluster.preemption.prepare_candidate`:
        the synchronous DisruptionTarget patches and deletes, then the queued Events and condition
        and the nominatedNodeName patch). One result per candidate, in order; never raises for one."""
        if len(candidates) <= 1:
            return prepare_candidates(self, candidates)
        with ThreadPoolExecutor(min(len(candidates), PREEMPTION_WORKERS), thread_name_prefix="preemption") as pool:
            return list(pool.map(lambda c: prepare_candidate(self, c), candidates))

    def _patch_status(self, namespace: str, name: str, body: dict) -> Any:
        return self._connection().request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                                          verb="patch", resource="pods/status", body=body,
                                          content_type=STRATEGIC_MERGE_PATCH)
