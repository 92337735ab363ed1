"""The ordered steps that build the cluster, and those that take it down, as data.

One list drives three things: runbook.sh (each step a shell function), `cluster up` (runs them
with progress, skipping what exists, resuming after a failure) and `--dry-run` (prints them). A
step is a few shell lines plus an optional check that exits 0 when the step's work is already
done. The order is the tutorial's (docs/architecture.md 5: tutorial 1, 5), with the waits its
users needed: Volcano's admission webhook answering before the queue is created, device
resources allocatable before anything is scheduled, the claim Bound, the file system gone before
the cluster goes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from trainmaster.cluster import fsx, versions
from trainmaster.cluster.addons import ETCD, ETCD_NAMESPACE
from trainmaster.cluster.eksctl import FSX_NAMESPACE, FSX_SERVICE_ACCOUNT
from trainmaster.cluster.spec import ROLE_LABEL, ClusterSpec
from trainmaster.config import S3_READER


@dataclass(frozen=True)
class Step:
    id: str
    title: str
    commands: tuple[str, ...]
    check: str | None = None  # exits 0 when the work is done already
    tools: tuple[str, ...] = field(default=("aws",))
    echo: bool = False  # show the step's output (what it tells the user), not only its log

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"commands": list(self.commands), "tools": list(self.tools)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Step:
        return cls(
            id=data["id"],
            title=data["title"],
            commands=tuple(data["commands"]),
            check=data.get("check"),
            tools=tuple(data.get("tools", ())),
            echo=bool(data.get("echo", False)),
        )


def _helm(
    release: str, chart: str, version: str, repo_name: str, repo: str, values: str
) -> tuple[str, ...]:
    return (
        f"helm repo add {repo_name} {repo} --force-update",
        f"helm upgrade --install {release} {chart} --version {version} --namespace kube-system "
        f'--values "$PLAN_DIR/{values}" --wait --timeout 10m',
    )


def up_steps(spec: ClusterSpec) -> list[Step]:
    k, kh, acc = ("aws", "kubectl"), ("kubectl", "helm"), f"{ROLE_LABEL}=accelerator"
    ns = f"--namespace {spec.namespace}"
    steps = [
        Step(
            "tools",
            "Check the tools and the AWS identity",
            (
                "aws sts get-caller-identity --output table",
                "eksctl version",
                "kubectl version --client=true",
                "helm version --short",
            ),
            tools=("aws", "eksctl", "kubectl", "helm", "docker"),
        ),
        Step(
            "ecr",
            "ECR repository for the training image",
            (
                'aws ecr create-repository --repository-name "$ECR_REPO" '
                "--image-scanning-configuration scanOnPush=true --query repository.repositoryUri --output text",
            ),
            check='aws ecr describe-repositories --repository-names "$ECR_REPO" >/dev/null 2>&1',
        ),
        Step(
            "cluster",
            "EKS control plane, OIDC, system node group (eksctl, 10-15 min)",
            ('eksctl create cluster --config-file "$PLAN_DIR/eksctl/cluster.yaml"',),
            check='[ "$(cluster_field status 2>/dev/null)" = ACTIVE ]',
            tools=("aws", "eksctl"),
        ),
        Step(
            "kubeconfig",
            "kubectl context for the cluster",
            ('aws eks update-kubeconfig --name "$CLUSTER" --region "$REGION"',),
        ),
        Step(
            "node-stack",
            "Launch template, EFA security groups, placement group, node role (CloudFormation)",
            (
                "local endpoint ca cidr sg vpc",
                'endpoint="$(cluster_field endpoint)"; ca="$(cluster_field certificateAuthority.data)"',
                'cidr="$(cluster_field kubernetesNetworkConfig.serviceIpv4Cidr)"',
                'sg="$(cluster_field resourcesVpcConfig.clusterSecurityGroupId)"; vpc="$(cluster_field resourcesVpcConfig.vpcId)"',
                'aws cloudformation deploy --stack-name "$STACK" \\\n'
                '  --template-file "$PLAN_DIR/cloudformation/accelerator-nodes.yaml" \\\n'
                "  --capabilities CAPABILITY_IAM --no-fail-on-empty-changeset \\\n"
                '  --tags trainmaster.io/cluster="$CLUSTER" \\\n'
                '  --parameter-overrides ClusterName="$CLUSTER" ClusterEndpoint="$endpoint" \\\n'
                '    ClusterCertificateAuthority="$ca" ClusterServiceCidr="$cidr" ClusterSecurityGroup="$sg" VpcId="$vpc"',
            ),
            check="stack_status | grep -Eqx '(CREATE|UPDATE)_COMPLETE'",
        ),
        Step(
            "nodegroup",
            f"{spec.nodes} x {spec.instance.name} managed node group in {spec.accelerator_zone}",
            (
                'local file; file="$(render eksctl/nodegroup.yaml)"',
                "# eksctl would install its own device plugins; the pinned ones come next\n"
                'eksctl create nodegroup --config-file "$file" --install-neuron-plugin=false --install-nvidia-plugin=false',
                f"kubectl wait --for=condition=Ready node --selector {acc} --timeout=20m",
            ),
            check=(
                '[ "$(aws eks describe-nodegroup --cluster-name "$CLUSTER" --nodegroup-name "$NODEGROUP" '
                '--query nodegroup.status --output text 2>/dev/null)" = ACTIVE ]'
            ),
            tools=("aws", "eksctl", "kubectl"),
        ),
    ]
    if spec.instance.neuron:
        npd_ns = versions.NEURON_NPD_NAMESPACE
        steps.append(
            Step(
                "device-plugin",
                "Neuron Helm chart: device plugin (aws.amazon.com/neuron), node problem detector "
                "and recovery (IRSA for its Auto Scaling group)",
                (
                    f"kubectl create namespace {npd_ns} --dry-run=client -o yaml | kubectl apply -f -",
                    'local file; file="$(render eksctl/npd-irsa.yaml)"',
                    'eksctl create iamserviceaccount --config-file "$file" --approve '
                    "--override-existing-serviceaccounts",
                    f"helm upgrade --install neuron-helm-chart {versions.NEURON_CHART} "
                    f"--version {versions.NEURON_CHART_VERSION} --namespace kube-system "
                    '--values "$PLAN_DIR/helm/neuron-helm-chart.yaml" --wait --timeout 10m',
                ),
                check="helm status neuron-helm-chart --namespace kube-system >/dev/null 2>&1",
                tools=("aws", "eksctl", "kubectl", "helm"),
            )
        )
    else:
        steps.append(
            Step(
                "device-plugin",
                "NVIDIA device plugin (nvidia.com/gpu)",
                _helm(
                    "nvidia-device-plugin",
                    versions.NVIDIA_CHART,
                    versions.NVIDIA_CHART_VERSION,
                    "nvdp",
                    versions.NVIDIA_CHARTS_REPO,
                    "helm/nvidia-device-plugin.yaml",
                ),
                check="helm status nvidia-device-plugin --namespace kube-system >/dev/null 2>&1",
                tools=kh,
            )
        )
    resources = [(spec.taint_key, spec.instance.devices)]
    if spec.efa:
        steps.append(
            Step(
                "efa-device-plugin",
                "EFA device plugin (vpc.amazonaws.com/efa)",
                _helm(
                    "aws-efa-k8s-device-plugin",
                    versions.EFA_CHART,
                    versions.EFA_CHART_VERSION,
                    "eks",
                    versions.EKS_CHARTS_REPO,
                    "helm/efa-device-plugin.yaml",
                ),
                check="helm status aws-efa-k8s-device-plugin --namespace kube-system >/dev/null 2>&1",
                tools=kh,
            )
        )
        resources.append(("vpc.amazonaws.com/efa", spec.instance.efa_interfaces))
    steps.append(
        Step(
            "devices-ready",
            "Every accelerator node offers its devices",
            tuple(f"wait_allocatable {r} {n} {spec.nodes}" for r, n in resources),
            tools=("kubectl",),
        )
    )
    vol = versions.VOLCANO_NAMESPACE
    steps += [
        Step(
            "etcd",
            f"etcd 3.5 with the v2 API ({ETCD}.{ETCD_NAMESPACE}.svc:2379, trainmaster's pods only)",
            (
                'kubectl apply -f "$PLAN_DIR/k8s/etcd.yaml"',
                f"kubectl --namespace {ETCD_NAMESPACE} rollout status deployment/{ETCD} --timeout=10m",
            ),
            check=f"kubectl --namespace {ETCD_NAMESPACE} get deployment {ETCD} >/dev/null 2>&1",
            tools=("kubectl",),
        ),
        Step(
            "volcano",
            f"Volcano {versions.VOLCANO_VERSION} (gang scheduling), its webhook answering",
            (
                f"kubectl apply --server-side -f {versions.VOLCANO_INSTALLER}",
                *(
                    f"kubectl --namespace {vol} rollout status deployment/{d} --timeout=10m"
                    for d in versions.VOLCANO_DEPLOYMENTS
                ),
                '# the admission webhook answers only once its endpoint is ready ("no endpoints available")',
                'retry 30 10 kubectl apply --dry-run=server -f "$PLAN_DIR/k8s/queue.yaml"',
            ),
            check=f"kubectl --namespace {vol} get deployment volcano-admission >/dev/null 2>&1",
            tools=("kubectl",),
        ),
        Step(
            "queue",
            f"Volcano queue {spec.queue}",
            ('retry 30 10 kubectl apply -f "$PLAN_DIR/k8s/queue.yaml"',),
            check=f"kubectl get queues.scheduling.volcano.sh {spec.queue} >/dev/null 2>&1",
            tools=("kubectl",),
        ),
        Step(
            "node-marker",
            "RBAC and admission policy: a training pod may mark its own node unhealthy",
            ('kubectl apply --server-side -f "$PLAN_DIR/k8s/node-marker.yaml"',),
            check="kubectl get validatingadmissionpolicy trainmaster-node-marker >/dev/null 2>&1",
            tools=("kubectl",),
        ),
        Step(
            "fsx-irsa",
            "IAM role for the FSx CSI controller (IRSA, least privilege)",
            (
                'eksctl create iamserviceaccount --config-file "$PLAN_DIR/eksctl/fsx-irsa.yaml" '
                "--approve --override-existing-serviceaccounts",
            ),
            check=(
                f"kubectl --namespace {FSX_NAMESPACE} get serviceaccount {FSX_SERVICE_ACCOUNT} "
                "-o jsonpath='{.metadata.annotations.eks\\.amazonaws\\.com/role-arn}' 2>/dev/null | grep -q '^arn:'"
            ),
            tools=("eksctl", "kubectl"),
        ),
        Step(
            "fsx-csi",
            "FSx for Lustre CSI driver",
            (
                *_helm(
                    "aws-fsx-csi-driver",
                    versions.FSX_CHART,
                    versions.FSX_CHART_VERSION,
                    "aws-fsx-csi-driver",
                    versions.FSX_CHARTS_REPO,
                    "helm/aws-fsx-csi-driver.yaml",
                ),
                "kubectl get csidriver fsx.csi.aws.com",
            ),
            check="helm status aws-fsx-csi-driver --namespace kube-system >/dev/null 2>&1",
            tools=kh,
        ),
        Step(
            "storage",
            f"StorageClass and claim {spec.pvc}: an FSx for Lustre file system (5-10 min)",
            (
                "ensure_namespace",
                'local file; file="$(render k8s/storageclass.yaml)"',
                'kubectl apply -f "$file"',
                'kubectl apply -f "$PLAN_DIR/k8s/claim.yaml"',
                f"kubectl {ns} wait --for=jsonpath='{{.status.phase}}'=Bound pvc/{spec.pvc} --timeout=30m",
            ),
            check=(
                f"[ \"$(kubectl {ns} get pvc {spec.pvc} -o jsonpath='{{.status.phase}}' "
                '2>/dev/null)" = Bound ]'
            ),
            tools=("aws", "kubectl"),
        ),
        *(
            [
                Step(
                    "results",
                    f"runs/ on the file system exported to {fsx.results_url(spec)} (FSx data "
                    "repository association)",
                    fsx.link_results(spec),
                    check=fsx.results_linked(spec),
                    tools=("aws", "kubectl"),
                )
            ]
            if spec.results_bucket
            else []
        ),
        Step(
            "image",
            f"Training image ({spec.flavour}) built for linux/amd64 and pushed to ECR",
            (
                'local uri src; uri="$(image_uri)"; src="$(trainmaster_src)"',
                'aws ecr get-login-password --region "$REGION" | docker login --username AWS --password-stdin "${uri%%/*}"',
                f'DOCKER_BUILDKIT=1 docker build --platform linux/amd64 -f "$PLAN_DIR/image/Dockerfile.{spec.flavour}" '
                '-t "$uri" "$src"',
                'docker push "$uri"',
                # record what was pushed, pinned by digest: the tag moves with the next build
                'mkdir -p "$PLAN_DIR/.state"; image_ref | tee "$PLAN_DIR/.state/image"',
            ),
            check=(
                'aws ecr describe-images --repository-name "$ECR_REPO" '
                '--image-ids imageTag="$IMAGE_TAG" >/dev/null 2>&1'
            ),
            tools=("aws", "docker"),
        ),
        Step(
            "tensorboard",
            "TensorBoard (ClusterIP; reach it with kubectl port-forward)",
            (
                'local file; file="$(render k8s/tensorboard.yaml)"',
                'kubectl apply -f "$file"',
                f"kubectl {ns} rollout status deployment/tensorboard --timeout=10m",
            ),
            check=f"kubectl {ns} get deployment tensorboard >/dev/null 2>&1",
            tools=k,
        ),
        Step(
            "summary",
            "What to run next",
            (
                'local ref; ref="$(image_ref)"',
                'echo "training image: $ref (tag $IMAGE_TAG)"',
                'echo "launch:          trainmaster launch JOB.toml --set kubernetes.image=$ref"',
                f'echo "tensorboard:     kubectl {ns} port-forward service/tensorboard 6006:6006"',
            ),
            echo=True,
        ),
    ]
    if spec.data_buckets:  # `data stage`'s S3 reader (eksctl.s3_irsa_config; issue 30.8)
        steps.insert(
            next(i for i, st in enumerate(steps) if st.id == "fsx-irsa") + 1,
            Step(
                "s3-irsa",
                f"IAM role for `data stage` to read s3://{', s3://'.join(spec.data_buckets)} (IRSA)",
                (
                    'eksctl create iamserviceaccount --config-file "$PLAN_DIR/eksctl/s3-irsa.yaml" '
                    "--approve --override-existing-serviceaccounts",
                ),
                check=(
                    f"kubectl {ns} get serviceaccount {S3_READER} "
                    "-o jsonpath='{.metadata.annotations.eks\\.amazonaws\\.com/role-arn}' 2>/dev/null | grep -q '^arn:'"
                ),
                tools=("eksctl", "kubectl"),
            ),
        )
    return steps


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


def scale_command(cluster: str, region: str, nodegroup: str, nodes: int) -> list[str]:
    """Resize the accelerator node group (max stays >= 1: EKS refuses a maximum of 0)."""
    return [
        "eksctl",
        "scale",
        "nodegroup",
        "--cluster",
        cluster,
        "--region",
        region,
        "--name",
        nodegroup,
        "--nodes",
        str(nodes),
        "--nodes-min",
        str(nodes),
        "--nodes-max",
        str(max(nodes, 1)),
    ]
