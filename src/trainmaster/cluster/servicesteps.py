"""`cluster up`'s steps once the nodes offer their devices: what the jobs need on the cluster.

etcd for the rendezvous, Volcano and its queue for gang scheduling, the node-marker and
job-progress policies, FSx for Lustre (IRSA, CSI driver, the claim, runs/ exported to S3),
`data stage`'s S3 reader, the training image and TensorBoard. With the waits the tutorial's users needed: Volcano's admission
webhook answering before the queue is created, the claim Bound before a job mounts it.
"""

from __future__ import annotations

from trainmaster.cluster import fsx, monitoring, versions
from trainmaster.cluster.addons import ETCD, ETCD_NAMESPACE
from trainmaster.cluster.eksctl import FSX_NAMESPACE, FSX_SERVICE_ACCOUNT
from trainmaster.cluster.nodeguard import WATCHER, WATCHER_NAMESPACE
from trainmaster.cluster.spec import ClusterSpec
from trainmaster.cluster.steps import Step, helm_install
from trainmaster.config import S3_READER


def service_steps(spec: ClusterSpec) -> list[Step]:
    k, kh = ("aws", "kubectl"), ("kubectl", "helm")
    ns = f"--namespace {spec.namespace}"
    vol = versions.VOLCANO_NAMESPACE
    steps = [
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
            "job-progress",
            "RBAC and admission policy: rank 0's pod may publish its own job's progress",
            (
                "ensure_namespace",
                'kubectl apply --server-side -f "$PLAN_DIR/k8s/job-progress.yaml"',
            ),
            check="kubectl get validatingadmissionpolicy trainmaster-job-progress >/dev/null 2>&1",
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
                *helm_install(
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
            "node-watcher",
            "Node watcher: takes a lost node out of service, so its gang restarts elsewhere",
            (
                'local file; file="$(render k8s/node-watcher.yaml)"',
                'kubectl apply --server-side -f "$file"',
                f"kubectl -n {WATCHER_NAMESPACE} rollout status deployment/{WATCHER} --timeout=5m",
            ),
            check=f"kubectl -n {WATCHER_NAMESPACE} get deployment {WATCHER} >/dev/null 2>&1",
            tools=k,
        ),
        *(_monitoring(spec) if spec.monitoring else []),
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
    if spec.data_buckets:  # `data stage`'s S3 reader (eksctl.s3_irsa_config)
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


def _monitoring(spec: ClusterSpec) -> list[Step]:
    """cluster.monitoring: the stack (its CRDs first), then the jobs' monitors, alerts, dashboard
    and device exporters (cluster/monitoring.py)."""
    kh = ("kubectl", "helm")
    stack = Step(
        "monitoring-stack",
        "Prometheus, Grafana and Alertmanager (kube-prometheus-stack)",
        helm_install(
            monitoring.RELEASE,
            versions.PROMETHEUS_STACK_CHART,
            versions.PROMETHEUS_STACK_CHART_VERSION,
            "prometheus-community",
            versions.PROMETHEUS_CHARTS_REPO,
            "helm/kube-prometheus-stack.yaml",
            namespace=monitoring.NAMESPACE,
        ),
        check=f"helm status {monitoring.RELEASE} --namespace {monitoring.NAMESPACE} >/dev/null 2>&1",
        tools=kh,
    )
    jobs = Step(
        "monitoring",
        "The jobs' PodMonitor, alert rules and dashboard; the device exporter",
        ('kubectl apply --server-side -f "$PLAN_DIR/k8s/monitoring.yaml"',),
        check="kubectl get podmonitors.monitoring.coreos.com --all-namespaces -l "
        "app.kubernetes.io/managed-by=trainmaster -o name 2>/dev/null | grep -q .",
        tools=("kubectl",),
    )
    if spec.instance.device_kind != "cuda":
        return [stack, jobs]
    dcgm = Step(
        "dcgm-exporter",
        "NVIDIA DCGM exporter: GPU utilisation, memory, power, XID errors",
        helm_install(
            "dcgm-exporter",
            versions.DCGM_CHART,
            versions.DCGM_CHART_VERSION,
            "gpu-helm-charts",
            versions.DCGM_CHARTS_REPO,
            "helm/dcgm-exporter.yaml",
            namespace=monitoring.NAMESPACE,
        ),
        check=f"helm status dcgm-exporter --namespace {monitoring.NAMESPACE} >/dev/null 2>&1",
        tools=kh,
    )
    return [stack, dcgm, jobs]
