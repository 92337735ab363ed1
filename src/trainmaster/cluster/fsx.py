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
- Results outlive the cluster when cluster.results_bucket is set: a data repository
  association links the file system's /runs to s3://BUCKET/CLUSTER/runs/ and exports every new,
  changed or deleted file (AutoExportPolicy; FSx for Lustre User Guide, "Exporting changes to
  the data repository"), and `cluster down` runs one EXPORT_TO_REPOSITORY task and waits for it
  before the claim (and with it the file system) is deleted. Without a bucket `cluster down`
  asks for --discard-data.
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


RUNS_PATH = "/runs"  # the run folders, relative to the file system root mounted at kubernetes.mount


def results_url(spec: ClusterSpec) -> str | None:
    return f"s3://{spec.results_bucket}/{spec.name}/runs/" if spec.results_bucket else None


def claim_fs(spec: ClusterSpec) -> tuple[str, ...]:
    """Shell lines setting $fs to the claim's file system id: the PV's volumeHandle is fs-...
    (aws-fsx-csi-driver)."""
    return (
        f'local pv fs=; pv="$(kubectl --namespace {spec.namespace} get pvc {spec.pvc} '
        "-o jsonpath='{.spec.volumeName}' 2>/dev/null || true)\"",
        'if [ -n "$pv" ]; then fs="$(kubectl get pv "$pv" '
        "-o jsonpath='{.spec.csi.volumeHandle}' 2>/dev/null || true)\"; fi",
    )


def _dra_lifecycle() -> str:
    return (
        'aws fsx describe-data-repository-associations --region "$REGION" '
        '--filters Name=file-system-id,Values="$fs" '
        f"--query \"Associations[?FileSystemPath=='{RUNS_PATH}'].Lifecycle | [0]\" --output text"
    )


def link_results(spec: ClusterSpec) -> tuple[str, ...]:
    """Shell lines: associate /runs with the results bucket, wait until it is AVAILABLE."""
    return (
        *claim_fs(spec),
        f'aws s3api head-bucket --bucket {spec.results_bucket} --region "$REGION"',
        'aws fsx create-data-repository-association --region "$REGION" --file-system-id "$fs" '
        f"--file-system-path {RUNS_PATH} --data-repository-path {results_url(spec)} "
        "--no-batch-import-meta-data-on-create "
        "--s3 'AutoExportPolicy={Events=[NEW,CHANGED,DELETED]}'",
        "local i st; for i in $(seq 180); do",
        f'  st="$({_dra_lifecycle()})"',
        '  case "$st" in AVAILABLE) return 0;; FAILED|MISCONFIGURED) '
        'echo "the association of /runs is $st" >&2; return 1;; esac; sleep 10',
        "done",
        'echo "the association of /runs is not AVAILABLE after 30 min" >&2; return 1',
    )


def results_linked(spec: ClusterSpec) -> str:
    return f'{{ {"; ".join(claim_fs(spec))}; [ "$({_dra_lifecycle()})" = AVAILABLE ]; }}'


def export_results(spec: ClusterSpec) -> tuple[str, ...]:
    """Shell lines: one last export of runs/ (whatever auto-export has not sent yet), waited for."""
    return (
        *claim_fs(spec),
        'if [ -z "$fs" ]; then echo "no file system behind the claim: nothing to export"; return 0; fi',
        'local task st i; task="$(aws fsx create-data-repository-task --region "$REGION" '
        '--file-system-id "$fs" --type EXPORT_TO_REPOSITORY --paths runs --report Enabled=false '
        '--query DataRepositoryTask.TaskId --output text)"',
        "for i in $(seq 720); do",
        '  st="$(aws fsx describe-data-repository-tasks --region "$REGION" --task-ids "$task" '
        "--query 'DataRepositoryTasks[0].Lifecycle' --output text)\"",
        f'  case "$st" in SUCCEEDED) echo "runs/ exported to {results_url(spec)}"; return 0;; '
        'FAILED|CANCELED) echo "the export of runs/ is $st: the file system is kept" >&2; '
        "return 1;; esac; sleep 10",
        "done",
        'echo "the export of runs/ did not finish in 2 h: the file system is kept" >&2; return 1',
    )
