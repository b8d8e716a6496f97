"""What RBAC a running scheduler needs, and the check `serve` makes of it at start-up.

The lists name ``(verb, API group, resource)``; deploy/rbac/02-clusterrole.yaml grants exactly
them (docs/kubernetes.md compares the role with ``system:kube-scheduler``'s). `missing_permissions`
asks the API server with SelfSubjectAccessReviews, which every authenticated user may create.
"""

from __future__ import annotations

from shardsched.kube.client import Api

#: (verb, API group, resource) a running scheduler needs; deploy/rbac/02-clusterrole.yaml grants exactly
#: these (core/v1 Events only matter on servers without events.k8s.io/v1)
PERMISSIONS = [("list", "", "nodes"), ("watch", "", "nodes"), ("list", "", "pods"), ("watch", "", "pods"),
               ("list", "", "namespaces"), ("watch", "", "namespaces"),
               ("list", "policy", "poddisruptionbudgets"), ("watch", "policy", "poddisruptionbudgets"),
               ("list", "", "services"), ("watch", "", "services"),
               ("list", "", "replicationcontrollers"), ("watch", "", "replicationcontrollers"),
               ("list", "apps", "replicasets"), ("watch", "apps", "replicasets"),
               ("list", "apps", "statefulsets"), ("watch", "apps", "statefulsets"),
               ("create", "", "pods/binding"), ("patch", "", "pods/status"), ("delete", "", "pods"),
               ("create", "events.k8s.io", "events"), ("patch", "events.k8s.io", "events"),
               ("create", "", "events"), ("patch", "", "events")]
#: and when a profile has Coscheduling (gangs: the PodGroups are watched)
GANG_PERMISSIONS = [("list", "scheduling.x-k8s.io", "podgroups"), ("watch", "scheduling.x-k8s.io", "podgroups")]
#: and with ``watch_storage`` (the volume plugins' objects, VolumeBinding's PreBind writes)
STORAGE_PERMISSIONS = [*((verb, group, resource) for group, resource in (
    ("", "persistentvolumes"), ("", "persistentvolumeclaims"), ("storage.k8s.io", "storageclasses"),
    ("storage.k8s.io", "csinodes"), ("storage.k8s.io", "csistoragecapacities")) for verb in ("list", "watch")),
    ("patch", "", "persistentvolumes"), ("patch", "", "persistentvolumeclaims")]
#: and with --leader-elect, in the Lease's namespace
LEADER_PERMISSIONS = [("get", "coordination.k8s.io", "leases"), ("create", "coordination.k8s.io", "leases"),
                      ("update", "coordination.k8s.io", "leases")]


def missing_permissions(api: Api, pod_groups: bool, watch_storage: bool, lease_namespace: str | None = None,
                        lease_name: str | None = None) -> list[str]:
    """Ask the API server (SelfSubjectAccessReview, allowed to every authenticated user) which of
    `PERMISSIONS` (with `GANG_PERMISSIONS` for ``pod_groups``, `STORAGE_PERMISSIONS` for
    ``watch_storage``, and `LEADER_PERMISSIONS` in ``lease_namespace`` when given) we lack.

    ``get`` and ``update`` of the Lease are asked for ``lease_name`` itself, as the elector uses
    them: a role may grant them on that one name (``resourceNames``, as deploy/rbac does), and
    a review without a name would then answer "denied". ``create`` cannot be limited by name.

    Returns: ``"verb group/resource"`` strings, empty when all are granted.
    Raises: `Unauthorized`, `TemporaryError` (API server unreachable or failing).
    """
    wanted = [(v, g, r, None) for v, g, r in PERMISSIONS + (GANG_PERMISSIONS if pod_groups else [])
              + (STORAGE_PERMISSIONS if watch_storage else [])]
    if lease_namespace:
        wanted += [(v, g, r, lease_namespace) for v, g, r in LEADER_PERMISSIONS]
    missing = []
    for verb, group, resource, namespace in wanted:
        res, _, sub = resource.partition("/")
        attrs = {"verb": verb, "group": group, "resource": res}
        if sub:
            attrs["subresource"] = sub
        if namespace:
            attrs["namespace"] = namespace
        name = lease_name if namespace and lease_name and verb != "create" else None
        if name:
            attrs["name"] = name
        review = api.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", verb="create",
                             resource="selfsubjectaccessreviews",
                             body={"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                                   "spec": {"resourceAttributes": attrs}})
        if not ((review or {}).get("status") or {}).get("allowed"):
            where = (f" {name}" if name else "") + (f" in namespace {namespace}" if namespace else "")
            missing.append(f"{verb} {group + '/' if group else ''}{resource}{where}")
    return missing
