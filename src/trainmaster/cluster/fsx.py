"""Shared storage: the FSx for Lustre CSI driver's Helm values, the StorageClass and the claim.

The claim is the job's storage root (kubernetes.pvc, mounted at kubernetes.mount): datasets,
compile caches, runs. Provisioning it creates the file system (5-10 minutes); deleting it
deletes the file system and its data (reclaimPolicy Delete, as in the tutorial, so `cluster
down` leaves nothing that bills).

- Subnet: the accelerator node group's (looked up from the node group by runbook.sh), not
  "the first running instance with a tag" (the tutorial's, which may be a system node in
  another zone): Lustre traffic then stays in the zone of the nodes that use it most.
- PERSISTENT_2, 250 MB/s per TiB (1.2 TiB: 300 MB/s baseline, the tutorial's PERSISTENT_1 at
  200 gave 240), Lustre 2.15, LZ4 compression off (BERT shards are gzip'd HDF5 already).
- The controller runs on the system nodes with the IRSA service account made by
  `eksctl create iamserviceaccount` (so the chart must not create its own).
"""

from __future__ import annotations

from typing import Any

from trainmaster.cluster.addons import MANAGED, SYSTEM_SELECTOR
from trainmaster.cluster.eksctl import FSX_SERVICE_ACCOUNT
from trainmaster.cluster.spec import CLAIM_SIZE, STORAGE_CLASS, ClusterSpec

PROVISIONER = "fsx.csi.aws.com"
SUBNET_ID = "@SUBNET_ID@"
LUSTRE_SG_ID = "@LUSTRE_SG_ID@"


def csi_values(spec: ClusterSpec) -> dict[str, Any]:
    return {
        "controller": {
            "region": spec.region,
            "nodeSelector": SYSTEM_SELECTOR,
            "serviceAccount": {"create": False, "name": FSX_SERVICE_ACCOUNT},
            "extraTags": {"trainmaster.io/cluster": spec.name},
        },
        "node": {"tolerateAllTaints": True},
    }


def storage_class(spec: ClusterSpec) -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS, "labels": dict(MANAGED)},
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
        "parameters": {
            "subnetId": SUBNET_ID,
            "securityGroupIds": LUSTRE_SG_ID,
            "deploymentType": "PERSISTENT_2",
            "perUnitStorageThroughput": "250",
            "fileSystemTypeVersion": "2.15",
            "dataCompressionType": "NONE",
            "automaticBackupRetentionDays": "0",
            "weeklyMaintenanceStartTime": "7:09:00",
            "extraTags": f"trainmaster.io/cluster={spec.name}",
        },
        "mountOptions": ["flock"],
    }


def claim(spec: ClusterSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": spec.pvc, "namespace": spec.namespace, "labels": dict(MANAGED)},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": STORAGE_CLASS,
            "resources": {"requests": {"storage": CLAIM_SIZE}},
        },
    }
