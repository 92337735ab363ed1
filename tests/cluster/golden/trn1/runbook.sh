#!/usr/bin/env bash
# trainmaster cluster runbook: trainmaster-trn1, 2 x trn1.32xlarge in us-west-2 (us-west-2d), Kubernetes 1.36.
# Written by `trainmaster cluster plan`; `trainmaster cluster up` runs the same steps.
#
#     ./runbook.sh               every step in order, skipping those whose work exists
#     ./runbook.sh run STEP...   the named steps
#     ./runbook.sh check STEP    exit 0 when STEP's work is done already
#     ./runbook.sh list          the steps, then the clean-up steps
#     ./runbook.sh down          the clean-up steps, in the tutorial's order
#
set -euo pipefail
PLAN_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CLUSTER=trainmaster-trn1
REGION=us-west-2
STACK=trainmaster-trn1-accelerator-nodes
NODEGROUP=trn1-32xlarge
NAMESPACE=default
ECR_REPO=trainmaster
IMAGE_TAG=0.1.0-neuron
ACCELERATOR_SELECTOR=trainmaster.io/role=accelerator
export AWS_REGION="$REGION" AWS_DEFAULT_REGION="$REGION" AWS_PAGER=""
UP_STEPS=(tools ecr cluster kubeconfig node-stack nodegroup device-plugin efa-device-plugin devices-ready etcd volcano queue node-marker job-progress fsx-irsa s3-irsa fsx-csi storage image tensorboard node-watcher summary)
DOWN_STEPS=(down-tensorboard down-node-watcher down-jobs down-pods down-storageclass down-claim down-nodegroup down-node-stack down-cluster down-ecr down-leftovers)
cluster_field() { aws eks describe-cluster --name "$CLUSTER" --query "cluster.$1" --output text; }
cluster_exists() { aws eks describe-cluster --name "$CLUSTER" >/dev/null 2>&1; }
stack_status() { aws cloudformation describe-stacks --stack-name "$STACK" --query 'Stacks[0].StackStatus' --output text 2>/dev/null; }
stack_output() {
  aws cloudformation describe-stacks --stack-name "$STACK" \
    --query "Stacks[0].Outputs[?OutputKey=='$1'].OutputValue" --output text
}
account_id() { aws sts get-caller-identity --query Account --output text; }
image_uri() { echo "$(account_id).dkr.ecr.$REGION.amazonaws.com/$ECR_REPO:$IMAGE_TAG"; }
image_digest() {  # the digest the tag points at now (the tag is pushed again by every build)
  aws ecr describe-images --repository-name "$ECR_REPO" --image-ids imageTag="$IMAGE_TAG" \
    --query 'imageDetails[0].imageDigest' --output text
}
image_ref() {  # the pushed image pinned by digest: what jobs and manifests use
  local digest; digest="$(image_digest)" || return 1
  case "$digest" in sha256:*) ;; *) echo "image $ECR_REPO:$IMAGE_TAG is not pushed yet" >&2; return 1 ;; esac
  echo "$(account_id).dkr.ecr.$REGION.amazonaws.com/$ECR_REPO@$digest"
}

placeholder() {  # the value of an @NAME@ placeholder
  case "$1" in
    LAUNCH_TEMPLATE_ID) stack_output LaunchTemplateId ;;
    NODE_ROLE_ARN) stack_output NodeInstanceRoleArn ;;
    LUSTRE_SG_ID) stack_output LustreSecurityGroup ;;
    SUBNET_ID) aws eks describe-nodegroup --cluster-name "$CLUSTER" --nodegroup-name "$NODEGROUP" \
                 --query 'nodegroup.subnets[0]' --output text ;;
    NODE_ASG_NAME) aws eks describe-nodegroup --cluster-name "$CLUSTER" --nodegroup-name "$NODEGROUP" \
                 --query 'nodegroup.resources.autoScalingGroups[0].name' --output text ;;
    NODE_ASG_ARN) aws autoscaling describe-auto-scaling-groups \
                 --auto-scaling-group-names "$(placeholder NODE_ASG_NAME)" \
                 --query 'AutoScalingGroups[0].AutoScalingGroupARN' --output text ;;
    IMAGE) image_ref ;;
    *) echo "unknown placeholder @$1@" >&2; return 1 ;;
  esac
}

render() {  # render FILE: a copy under .rendered/ with its placeholders filled in; prints its path
  local src="$PLAN_DIR/$1" dst="$PLAN_DIR/.rendered/$1" text name value
  mkdir -p "$(dirname "$dst")"
  text="$(cat "$src")"
  for name in $(grep -o '@[A-Z_]*@' "$src" | sort -u | tr -d @); do
    value="$(placeholder "$name")"
    if [ -z "$value" ] || [ "$value" = None ]; then
      echo "no value for @$name@ yet: run the steps before this one" >&2; return 1
    fi
    text="${text//@$name@/$value}"
  done
  printf '%s\n' "$text" >"$dst"
  echo "$dst"
}

retry() {  # retry TRIES DELAY COMMAND...: for what is not ready the moment it is created
  local tries=$1 delay=$2 i
  shift 2
  for ((i = 1; i <= tries; i++)); do
    if "$@"; then return 0; fi
    echo "not ready yet ($i/$tries), again in ${delay}s: $*" >&2
    sleep "$delay"
  done
  return 1
}

ensure_namespace() {
  kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
}

wait_allocatable() {  # wait_allocatable RESOURCE COUNT NODES: every node offers COUNT of RESOURCE
  local resource=$1 count=$2 nodes=$3 i have
  for ((i = 1; i <= 60; i++)); do
    have="$(kubectl get nodes --selector "$ACCELERATOR_SELECTOR" \
      -o jsonpath="{range .items[*]}{.status.allocatable.${resource//./\\.}}{'\n'}{end}" | grep -cx "$count" || true)"
    if [ "$have" -ge "$nodes" ]; then echo "$have node(s) offer $count $resource"; return 0; fi
    echo "$have of $nodes node(s) offer $count $resource; waiting" >&2
    sleep 10
  done
  echo "nodes do not offer $resource: check the device plugin pods (kubectl -n kube-system get pods)" >&2
  return 1
}

k8s_gone() {  # k8s_gone OBJECT [ARGS]: true when the object (or the whole cluster) is gone
  cluster_exists || return 0
  local out
  if out="$(kubectl get "$@" -o name 2>&1)"; then return 1; fi
  grep -q NotFound <<<"$out"
}

aws_gone() {  # aws_gone COMMAND...: true when AWS answers that the resource does not exist
  local out
  if out="$("$@" 2>&1)"; then return 1; fi
  grep -Eq 'NotFound|does not exist' <<<"$out"
}

trainmaster_src() {  # the trainmaster source tree the image is built from
  local src="${TRAINMASTER_SRC:-}"
  if [ -z "$src" ]; then
    src="$(python3 -c 'import pathlib, trainmaster; print(pathlib.Path(trainmaster.__file__).resolve().parents[2])' 2>/dev/null || true)"
  fi
  if [ ! -f "$src/pyproject.toml" ]; then
    echo "set TRAINMASTER_SRC to a trainmaster source checkout (the image is built from it)" >&2
    return 1
  fi
  echo "$src"
}

# --- build ---

# tools: Check the tools and the AWS identity
step_tools() {
  aws sts get-caller-identity --output table
  eksctl version
  kubectl version --client=true
  helm version --short
}

# ecr: ECR repository for the training image
step_ecr() {
  aws ecr create-repository --repository-name "$ECR_REPO" --image-scanning-configuration scanOnPush=true --query repository.repositoryUri --output text
}
check_ecr() {
  aws ecr describe-repositories --repository-names "$ECR_REPO" >/dev/null 2>&1
}

# cluster: EKS control plane, OIDC, system node group (eksctl, 10-15 min)
step_cluster() {
  eksctl create cluster --config-file "$PLAN_DIR/eksctl/cluster.yaml"
}
check_cluster() {
  [ "$(cluster_field status 2>/dev/null)" = ACTIVE ]
}

# kubeconfig: kubectl context for the cluster
step_kubeconfig() {
  aws eks update-kubeconfig --name "$CLUSTER" --region "$REGION"
}

# node-stack: Launch template, EFA security groups, placement group, node role (CloudFormation)
step_node_stack() {
  local endpoint ca cidr sg vpc
  endpoint="$(cluster_field endpoint)"; ca="$(cluster_field certificateAuthority.data)"
  cidr="$(cluster_field kubernetesNetworkConfig.serviceIpv4Cidr)"
  sg="$(cluster_field resourcesVpcConfig.clusterSecurityGroupId)"; vpc="$(cluster_field resourcesVpcConfig.vpcId)"
  aws cloudformation deploy --stack-name "$STACK" \
    --template-file "$PLAN_DIR/cloudformation/accelerator-nodes.yaml" \
    --capabilities CAPABILITY_IAM --no-fail-on-empty-changeset \
    --tags trainmaster.io/cluster="$CLUSTER" \
    --parameter-overrides ClusterName="$CLUSTER" ClusterEndpoint="$endpoint" \
      ClusterCertificateAuthority="$ca" ClusterServiceCidr="$cidr" ClusterSecurityGroup="$sg" VpcId="$vpc"
}
check_node_stack() {
  stack_status | grep -Eqx '(CREATE|UPDATE)_COMPLETE'
}

# nodegroup: 2 x trn1.32xlarge managed node group in us-west-2d
step_nodegroup() {
  local file; file="$(render eksctl/nodegroup.yaml)"
  # eksctl would install its own device plugins; the pinned ones come next
  eksctl create nodegroup --config-file "$file" --install-neuron-plugin=false --install-nvidia-plugin=false
  kubectl wait --for=condition=Ready node --selector trainmaster.io/role=accelerator --timeout=20m
}
check_nodegroup() {
  [ "$(aws eks describe-nodegroup --cluster-name "$CLUSTER" --nodegroup-name "$NODEGROUP" --query nodegroup.status --output text 2>/dev/null)" = ACTIVE ]
}

# device-plugin: Neuron Helm chart: device plugin (aws.amazon.com/neuron), node problem detector and recovery (IRSA for its Auto Scaling group)
step_device_plugin() {
  kubectl create namespace neuron-healthcheck-system --dry-run=client -o yaml | kubectl apply -f -
  local file; file="$(render eksctl/npd-irsa.yaml)"
  eksctl create iamserviceaccount --config-file "$file" --approve --override-existing-serviceaccounts
  helm upgrade --install neuron-helm-chart oci://public.ecr.aws/neuron/neuron-helm-chart --version 1.10.0 --namespace kube-system --values "$PLAN_DIR/helm/neuron-helm-chart.yaml" --wait --timeout 10m
}
check_device_plugin() {
  helm status neuron-helm-chart --namespace kube-system >/dev/null 2>&1
}

# efa-device-plugin: EFA device plugin (vpc.amazonaws.com/efa)
step_efa_device_plugin() {
  helm repo add eks https://aws.github.io/eks-charts --force-update
  helm upgrade --install aws-efa-k8s-device-plugin eks/aws-efa-k8s-device-plugin --version v0.5.30 --namespace kube-system --values "$PLAN_DIR/helm/efa-device-plugin.yaml" --wait --timeout 10m
}
check_efa_device_plugin() {
  helm status aws-efa-k8s-device-plugin --namespace kube-system >/dev/null 2>&1
}

# devices-ready: Every accelerator node offers its devices
step_devices_ready() {
  wait_allocatable aws.amazon.com/neuron 16 2
  wait_allocatable vpc.amazonaws.com/efa 8 2
}

# etcd: etcd 3.5 with the v2 API (etcd-server.trainmaster-etcd.svc:2379, trainmaster's pods only)
step_etcd() {
  kubectl apply -f "$PLAN_DIR/k8s/etcd.yaml"
  kubectl --namespace trainmaster-etcd rollout status deployment/etcd-server --timeout=10m
}
check_etcd() {
  kubectl --namespace trainmaster-etcd get deployment etcd-server >/dev/null 2>&1
}

# volcano: Volcano v1.15.1 (gang scheduling), its webhook answering
step_volcano() {
  kubectl apply --server-side -f https://raw.githubusercontent.com/volcano-sh/volcano/v1.15.1/installer/volcano-development.yaml
  kubectl --namespace volcano-system rollout status deployment/volcano-admission --timeout=10m
  kubectl --namespace volcano-system rollout status deployment/volcano-controllers --timeout=10m
  kubectl --namespace volcano-system rollout status deployment/volcano-scheduler --timeout=10m
  # the admission webhook answers only once its endpoint is ready ("no endpoints available")
  retry 30 10 kubectl apply --dry-run=server -f "$PLAN_DIR/k8s/queue.yaml"
}
check_volcano() {
  kubectl --namespace volcano-system get deployment volcano-admission >/dev/null 2>&1
}

# queue: Volcano queue trainmaster
step_queue() {
  retry 30 10 kubectl apply -f "$PLAN_DIR/k8s/queue.yaml"
}
check_queue() {
  kubectl get queues.scheduling.volcano.sh trainmaster >/dev/null 2>&1
}

# node-marker: RBAC and admission policy: a training pod may mark its own node unhealthy
step_node_marker() {
  kubectl apply --server-side -f "$PLAN_DIR/k8s/node-marker.yaml"
}
check_node_marker() {
  kubectl get validatingadmissionpolicy trainmaster-node-marker >/dev/null 2>&1
}

# job-progress: RBAC and admission policy: rank 0's pod may publish its own job's progress
step_job_progress() {
  ensure_namespace
  kubectl apply --server-side -f "$PLAN_DIR/k8s/job-progress.yaml"
}
check_job_progress() {
  kubectl get validatingadmissionpolicy trainmaster-job-progress >/dev/null 2>&1
}

# fsx-irsa: IAM role for the FSx CSI controller (IRSA, least privilege)
step_fsx_irsa() {
  eksctl create iamserviceaccount --config-file "$PLAN_DIR/eksctl/fsx-irsa.yaml" --approve --override-existing-serviceaccounts
}
check_fsx_irsa() {
  kubectl --namespace kube-system get serviceaccount fsx-csi-controller-sa -o jsonpath='{.metadata.annotations.eks\.amazonaws\.com/role-arn}' 2>/dev/null | grep -q '^arn:'
}

# s3-irsa: IAM role for `data stage` to read s3://trainmaster-data-bucket (IRSA)
step_s3_irsa() {
  eksctl create iamserviceaccount --config-file "$PLAN_DIR/eksctl/s3-irsa.yaml" --approve --override-existing-serviceaccounts
}
check_s3_irsa() {
  kubectl --namespace default get serviceaccount trainmaster-s3-reader -o jsonpath='{.metadata.annotations.eks\.amazonaws\.com/role-arn}' 2>/dev/null | grep -q '^arn:'
}

# fsx-csi: FSx for Lustre CSI driver
step_fsx_csi() {
  helm repo add aws-fsx-csi-driver https://kubernetes-sigs.github.io/aws-fsx-csi-driver --force-update
  helm upgrade --install aws-fsx-csi-driver aws-fsx-csi-driver/aws-fsx-csi-driver --version 1.17.0 --namespace kube-system --values "$PLAN_DIR/helm/aws-fsx-csi-driver.yaml" --wait --timeout 10m
  kubectl get csidriver fsx.csi.aws.com
}
check_fsx_csi() {
  helm status aws-fsx-csi-driver --namespace kube-system >/dev/null 2>&1
}

# storage: StorageClass and claim fsx-claim: an FSx for Lustre file system (5-10 min)
step_storage() {
  ensure_namespace
  local file; file="$(render k8s/storageclass.yaml)"
  kubectl apply -f "$file"
  kubectl apply -f "$PLAN_DIR/k8s/claim.yaml"
  kubectl --namespace default wait --for=jsonpath='{.status.phase}'=Bound pvc/fsx-claim --timeout=30m
}
check_storage() {
  [ "$(kubectl --namespace default get pvc fsx-claim -o jsonpath='{.status.phase}' 2>/dev/null)" = Bound ]
}

# image: Training image (neuron) built for linux/amd64 and pushed to ECR
step_image() {
  local uri src; uri="$(image_uri)"; src="$(trainmaster_src)"
  aws ecr get-login-password --region "$REGION" | docker login --username AWS --password-stdin "${uri%%/*}"
  DOCKER_BUILDKIT=1 docker build --platform linux/amd64 -f "$PLAN_DIR/image/Dockerfile.neuron" -t "$uri" "$src"
  docker push "$uri"
  mkdir -p "$PLAN_DIR/.state"; image_ref | tee "$PLAN_DIR/.state/image"
}
check_image() {
  aws ecr describe-images --repository-name "$ECR_REPO" --image-ids imageTag="$IMAGE_TAG" >/dev/null 2>&1
}

# tensorboard: TensorBoard (ClusterIP; reach it with kubectl port-forward)
step_tensorboard() {
  local file; file="$(render k8s/tensorboard.yaml)"
  kubectl apply -f "$file"
  kubectl --namespace default rollout status deployment/tensorboard --timeout=10m
}
check_tensorboard() {
  kubectl --namespace default get deployment tensorboard >/dev/null 2>&1
}

# node-watcher: Node watcher: takes a lost node out of service, so its gang restarts elsewhere
step_node_watcher() {
  local file; file="$(render k8s/node-watcher.yaml)"
  kubectl apply --server-side -f "$file"
  kubectl -n trainmaster-system rollout status deployment/trainmaster-node-watcher --timeout=5m
}
check_node_watcher() {
  kubectl -n trainmaster-system get deployment trainmaster-node-watcher >/dev/null 2>&1
}

# summary: What to run next
step_summary() {
  local ref; ref="$(image_ref)"
  echo "training image: $ref (tag $IMAGE_TAG)"
  echo "launch:          trainmaster launch JOB.toml --set kubernetes.image=$ref"
  echo "tensorboard:     kubectl --namespace default port-forward service/tensorboard 6006:6006"
}

# --- clean-up (the tutorial's order) ---

# down-tensorboard: Delete TensorBoard
step_down_tensorboard() {
  cluster_exists || { echo "cluster $CLUSTER is gone"; return 0; }
  kubectl delete -f "$PLAN_DIR/k8s/tensorboard.yaml" --ignore-not-found
}
check_down_tensorboard() {
  k8s_gone deployment/tensorboard --namespace default
}

# down-node-watcher: Delete the node watcher
step_down_node_watcher() {
  cluster_exists || { echo "cluster $CLUSTER is gone"; return 0; }
  kubectl delete -f "$PLAN_DIR/k8s/node-watcher.yaml" --ignore-not-found
}
check_down_node_watcher() {
  k8s_gone deployment/trainmaster-node-watcher --namespace trainmaster-system
}

# down-jobs: Delete the Volcano jobs in default
step_down_jobs() {
  cluster_exists || { echo "cluster $CLUSTER is gone"; return 0; }
  if kubectl api-resources --api-group=batch.volcano.sh -o name | grep -q '^jobs'; then
    kubectl --namespace default delete jobs.batch.volcano.sh --all --wait=true
  fi
}

# down-pods: Delete etcd and the pods in default (nothing may hold the claim)
step_down_pods() {
  cluster_exists || { echo "cluster $CLUSTER is gone"; return 0; }
  kubectl delete -f "$PLAN_DIR/k8s/etcd.yaml" --ignore-not-found
  kubectl --namespace default delete pods --all --wait=true
}

# down-storageclass: Delete the StorageClass
step_down_storageclass() {
  cluster_exists || { echo "cluster $CLUSTER is gone"; return 0; }
  kubectl delete -f "$PLAN_DIR/k8s/storageclass.yaml" --ignore-not-found
}
check_down_storageclass() {
  k8s_gone storageclass/fsx-sc
}

# down-claim: Delete claim fsx-claim and wait until its file system is deleted
step_down_claim() {
  cluster_exists || { echo "cluster $CLUSTER is gone"; return 0; }
  local pv fs=; pv="$(kubectl --namespace default get pvc fsx-claim -o jsonpath='{.spec.volumeName}' 2>/dev/null || true)"
  if [ -n "$pv" ]; then fs="$(kubectl get pv "$pv" -o jsonpath='{.spec.csi.volumeHandle}' 2>/dev/null || true)"; fi
  kubectl delete -f "$PLAN_DIR/k8s/claim.yaml" --ignore-not-found --wait=true
  if [ -n "$pv" ]; then kubectl wait --for=delete "pv/$pv" --timeout=30m; fi
  trainmaster cluster wait-fsx --region "$REGION" --cluster "$CLUSTER" ${fs:+--file-system-id "$fs"}
}
check_down_claim() {
  k8s_gone pvc/fsx-claim --namespace default && trainmaster cluster wait-fsx --region "$REGION" --cluster "$CLUSTER" --timeout 0 >/dev/null 2>&1
}

# down-nodegroup: Delete node group trn1-32xlarge
step_down_nodegroup() {
  eksctl delete nodegroup --cluster "$CLUSTER" --region "$REGION" --name "$NODEGROUP" --wait
}
check_down_nodegroup() {
  aws_gone aws eks describe-nodegroup --cluster-name "$CLUSTER" --nodegroup-name "$NODEGROUP"
}

# down-node-stack: Delete the node stack (launch template, security groups, role)
step_down_node_stack() {
  aws cloudformation delete-stack --stack-name "$STACK"
  aws cloudformation wait stack-delete-complete --stack-name "$STACK"
}
check_down_node_stack() {
  aws_gone aws cloudformation describe-stacks --stack-name "$STACK"
}

# down-cluster: Delete the cluster, its system node group, IRSA roles and VPC
step_down_cluster() {
  eksctl delete cluster --name "$CLUSTER" --region "$REGION" --wait
}
check_down_cluster() {
  aws_gone aws eks describe-cluster --name "$CLUSTER"
}

# down-ecr: Delete the ECR repository and its images
step_down_ecr() {
  aws ecr delete-repository --repository-name "$ECR_REPO" --force --output text --query repository.repositoryName
}
check_down_ecr() {
  aws_gone aws ecr describe-repositories --repository-names "$ECR_REPO"
}

# down-leftovers: Check that no FSx file system of the cluster is left (they bill)
step_down_leftovers() {
  local left; left="$(aws fsx describe-file-systems --query "FileSystems[?Tags[?Key=='trainmaster.io/cluster' && Value=='$CLUSTER']].FileSystemId" --output text)"
  if [ -n "$left" ] && [ "$left" != None ]; then
    echo "left behind (delete with aws fsx delete-file-system --file-system-id ID): $left" >&2; return 1
  fi
}

main() {
  case "${1:-all}" in
    all | down)
      local steps=("${UP_STEPS[@]}") s
      [ "${1:-all}" = down ] && steps=("${DOWN_STEPS[@]}")
      for s in "${steps[@]}"; do
        if declare -F "check_${s//-/_}" >/dev/null && "check_${s//-/_}"; then
          echo "== $s: done already"
        else
          echo "== $s"; "step_${s//-/_}"
        fi
      done ;;
    run) shift; local s; for s in "$@"; do "step_${s//-/_}"; done ;;
    check) "check_${2//-/_}" ;;
    list) printf '%s\n' "${UP_STEPS[@]}" "${DOWN_STEPS[@]}" ;;
    *) echo "usage: $0 [all | run STEP... | check STEP | list | down]" >&2; return 2 ;;
  esac
}

main "$@"
