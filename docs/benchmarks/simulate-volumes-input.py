"""Writes the input of docs/benchmarks.md's "simulate with volumes": N nodes, one local
PersistentVolume on P of them (a WaitForFirstConsumer class without a provisioner), and P pods, each
with its own claim, as a StatefulSet's volumeClaimTemplates create them.

    python docs/benchmarks/simulate-volumes-input.py > local.yaml && shardsched simulate -f local.yaml
"""

import sys

import yaml

N, P = 1000, 500
docs = [{"apiVersion": "v1", "kind": "Node",
         "metadata": {"name": f"n{i}", "labels": {"kubernetes.io/hostname": f"n{i}",
                                                  "topology.kubernetes.io/zone": f"z{i % 3}"}},
         "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}}} for i in range(N)]
docs.append({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "local"},
             "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "WaitForFirstConsumer"})
for i in range(P):
    docs.append({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"pv{i}"},
                 "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"],
                          "storageClassName": "local", "local": {"path": "/mnt"},
                          "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                              {"key": "kubernetes.io/hostname", "operator": "In", "values": [f"n{(i * 7) % N}"]}]}]}}}})
for i in range(P):
    docs.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                 "metadata": {"name": f"data-web-{i}", "namespace": "default"},
                 "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local",
                          "resources": {"requests": {"storage": "5Gi"}}}})
    docs.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"web-{i}", "namespace": "default"},
                 "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                          "resources": {"requests": {"cpu": "100m"}}}],
                          "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": f"data-web-{i}"}}]}})
yaml.safe_dump_all(docs, sys.stdout)
