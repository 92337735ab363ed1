"""`cluster up`'s steps: AWS and the nodes here, then what jobs need on them (servicesteps.py).

The order is the tutorial's (docs/architecture.md 5: tutorial 1, 5), with the wait its users
needed: every accelerator node offers its devices (and EFA interfaces) before anything is
scheduled.
"""

from __future__ import annotations

from trainmaster.cluster import servicesteps, versions
from trainmaster.cluster.spec import ROLE_LABEL, ClusterSpec
from trainmaster.cluster.steps import Step, helm_install


def up_steps(spec: ClusterSpec) -> list[Step]:
    kh, acc = ("kubectl", "helm"), f"{ROLE_LABEL}=accelerator"
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
                helm_install(
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
                helm_install(
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
    return steps + servicesteps.service_steps(spec)
