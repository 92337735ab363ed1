"""`cluster down`'s steps: the tutorial's clean-up order, each skipped when its work is done.

Nothing may hold the claim when it goes (jobs, etcd, pods first); runs/ goes to S3 once more
before the file system goes; and the file system itself (not only its PV) is gone before the
node stack and the cluster go, which would otherwise fail on its hold on the Lustre security
group.
"""

from __future__ import annotations

from trainmaster.cluster import fsx
from trainmaster.cluster.nodeguard import WATCHER, WATCHER_NAMESPACE
from trainmaster.cluster.spec import ClusterSpec
from trainmaster.cluster.steps import Step


def down_steps(spec: ClusterSpec) -> list[Step]:
    """The tutorial's clean-up order; each step is skipped when its work is done already."""
    ns = f"--namespace {spec.namespace}"
    k8s = ("aws", "kubectl")
    guard = 'cluster_exists || { echo "cluster $CLUSTER is gone"; return 0; }'
    return [
        Step(
            "down-tensorboard",
            "Delete TensorBoard",
            (guard, 'kubectl delete -f "$PLAN_DIR/k8s/tensorboard.yaml" --ignore-not-found'),
            check=f"k8s_gone deployment/tensorboard {ns}",
            tools=k8s,
        ),
        Step(
            "down-node-watcher",
            "Delete the node watcher",
            (guard, 'kubectl delete -f "$PLAN_DIR/k8s/node-watcher.yaml" --ignore-not-found'),
            check=f"k8s_gone deployment/{WATCHER} --namespace {WATCHER_NAMESPACE}",
            tools=k8s,
        ),
        Step(
            "down-jobs",
            f"Delete the Volcano jobs in {spec.namespace}",
            (
                guard,
                "if kubectl api-resources --api-group=batch.volcano.sh -o name | grep -q '^jobs'; then",
                f"  kubectl {ns} delete jobs.batch.volcano.sh --all --wait=true",
                "fi",
            ),
            tools=k8s,
        ),
        Step(
            "down-pods",
            f"Delete etcd and the pods in {spec.namespace} (nothing may hold the claim)",
            (
                guard,
                'kubectl delete -f "$PLAN_DIR/k8s/etcd.yaml" --ignore-not-found',
                f"kubectl {ns} delete pods --all --wait=true",
            ),
            tools=k8s,
        ),
        Step(
            "down-storageclass",
            "Delete the StorageClass",
            (guard, 'kubectl delete -f "$PLAN_DIR/k8s/storageclass.yaml" --ignore-not-found'),
            check="k8s_gone storageclass/fsx-sc",
            tools=k8s,
        ),
        *(
            [
                Step(
                    "down-export",
                    f"Export runs/ to {fsx.results_url(spec)} once more (the file system goes next)",
                    (guard, *fsx.export_results(spec)),
                    tools=k8s,
                    echo=True,
                )
            ]
            if spec.results_bucket
            else []
        ),
        Step(
            "down-claim",
            f"Delete claim {spec.pvc} and wait until its file system is deleted",
            (
                guard,
                *fsx.claim_fs(spec),  # $fs: the claim's file system id
                'kubectl delete -f "$PLAN_DIR/k8s/claim.yaml" --ignore-not-found --wait=true',
                'if [ -n "$pv" ]; then kubectl wait --for=delete "pv/$pv" --timeout=30m; fi',
                # the PV goes when DeleteFileSystem has started, minutes before the file system (and
                # its hold on the Lustre security group) is gone: wait for FSx itself (aws.py)
                'trainmaster cluster wait-fsx --region "$REGION" --cluster "$CLUSTER" ${fs:+--file-system-id "$fs"}',
            ),
            # done = claim gone AND no file system of the cluster still DELETING (after a timed-out
            # wait, the next run waits again instead of going on to DependencyViolation)
            check=(
                f"k8s_gone pvc/{spec.pvc} {ns} && "
                'trainmaster cluster wait-fsx --region "$REGION" --cluster "$CLUSTER" --timeout 0 >/dev/null 2>&1'
            ),
            tools=k8s,
        ),
        Step(
            "down-nodegroup",
            f"Delete node group {spec.nodegroup}",
            (
                'eksctl delete nodegroup --cluster "$CLUSTER" --region "$REGION" --name "$NODEGROUP" --wait',
            ),
            check='aws_gone aws eks describe-nodegroup --cluster-name "$CLUSTER" --nodegroup-name "$NODEGROUP"',
            tools=("aws", "eksctl"),
        ),
        Step(
            "down-node-stack",
            "Delete the node stack (launch template, security groups, role)",
            (
                'aws cloudformation delete-stack --stack-name "$STACK"',
                'aws cloudformation wait stack-delete-complete --stack-name "$STACK"',
            ),
            check='aws_gone aws cloudformation describe-stacks --stack-name "$STACK"',
        ),
        Step(
            "down-cluster",
            "Delete the cluster, its system node group, IRSA roles and VPC",
            ('eksctl delete cluster --name "$CLUSTER" --region "$REGION" --wait',),
            check='aws_gone aws eks describe-cluster --name "$CLUSTER"',
            tools=("aws", "eksctl"),
        ),
        Step(
            "down-ecr",
            "Delete the ECR repository and its images",
            (
                'aws ecr delete-repository --repository-name "$ECR_REPO" --force --output text --query repository.repositoryName',
            ),
            check='aws_gone aws ecr describe-repositories --repository-names "$ECR_REPO"',
        ),
        Step(
            "down-leftovers",
            "Check that no FSx file system of the cluster is left (they bill)",
            (
                'local left; left="$(aws fsx describe-file-systems --query '
                "\"FileSystems[?Tags[?Key=='trainmaster.io/cluster' && Value=='$CLUSTER']].FileSystemId\" --output text)\"",
                'if [ -n "$left" ] && [ "$left" != None ]; then',
                '  echo "left behind (delete with aws fsx delete-file-system --file-system-id ID): $left" >&2; return 1',
                "fi",
            ),
        ),
    ]
