#!/usr/bin/env bash
# A fake of aws, eksctl, kubectl, helm and docker for the runbook tests (installed under each
# name). Every call is appended to $FAKE_LOG. What a create/deploy/install made is a marker
# file in $FAKE_DIR; describe/get/status calls answer from those markers the way the real tools
# do (a value, or "NotFound"/"does not exist" and a non-zero exit). FAKE_FAIL=TEXT makes the
# first call whose command line contains TEXT fail. FAKE_K8S_EXISTS=1 makes `kubectl get` find
# every object.
set -u
tool="$(basename "$0")"
line="$tool $*"
echo "$line" >>"$FAKE_LOG"
m() { [ -e "$FAKE_DIR/$1" ]; }
mk() { touch "$FAKE_DIR/$1"; }
rmk() { rm -f "$FAKE_DIR/$1"; }
has() { [[ "$line" == *"$1"* ]]; }
notfound() { echo "An error occurred (ResourceNotFoundException): $1 not found" >&2; exit 254; }

if [ -n "${FAKE_FAIL:-}" ] && has "$FAKE_FAIL" && ! m failed-once; then
  mk failed-once
  echo "simulated failure: $line" >&2
  exit 1
fi

case "$tool" in
aws)
  case "$line" in
  "aws sts get-caller-identity"*) echo 123456789012 ;;
  "aws ecr create-repository"*) mk ecr; echo "123456789012.dkr.ecr.x.amazonaws.com/trainmaster" ;;
  "aws ecr describe-repositories"*) m ecr || { echo "An error occurred (RepositoryNotFoundException)" >&2; exit 254; } ;;
  "aws ecr delete-repository"*) rmk ecr; echo trainmaster ;;
  "aws ecr get-login-password"*) echo password ;;
  "aws ecr describe-images"*)
    m image || { echo "An error occurred (ImageNotFoundException)" >&2; exit 254; }
    case "$line" in *imageDigest*) echo "sha256:$(printf '%064d' 7)" ;; esac ;;
  "aws eks update-kubeconfig"*) echo "Updated context" ;;
  "aws eks describe-cluster"*)
    m cluster || notfound cluster
    case "$line" in
    *cluster.status*) echo ACTIVE ;;
    *cluster.endpoint*) echo https://FAKE.gr7.us-west-2.eks.amazonaws.com ;;
    *certificateAuthority*) echo Q0EK ;;
    *serviceIpv4Cidr*) echo 10.100.0.0/16 ;;
    *clusterSecurityGroupId*) echo sg-cluster ;;
    *vpcId*) echo vpc-fake ;;
    *) echo '{"cluster": {}}' ;;
    esac ;;
  "aws eks describe-nodegroup"*)
    m nodegroup || notfound nodegroup
    case "$line" in
    *subnets*) echo subnet-accel ;;
    *autoScalingGroups*) echo eks-accel-asg ;;
    *) echo ACTIVE ;;
    esac ;;
  "aws autoscaling describe-auto-scaling-groups"*)
    echo "arn:aws:autoscaling:us-west-2:123456789012:autoScalingGroup:1:autoScalingGroupName/eks-accel-asg" ;;
  "aws cloudformation deploy"*) mk stack ;;
  "aws cloudformation delete-stack"*) rmk stack ;;
  "aws cloudformation wait"*) ;;
  "aws cloudformation describe-stacks"*)
    m stack || { echo "An error occurred (ValidationError): Stack with id x does not exist" >&2; exit 254; }
    case "$line" in
    *LaunchTemplateId*) echo lt-0fake ;;
    *NodeInstanceRoleArn*) echo arn:aws:iam::123456789012:role/fake-node-role ;;
    *LustreSecurityGroup*) echo sg-lustre ;;
    *StackStatus*) echo CREATE_COMPLETE ;;
    esac ;;
  "aws fsx describe-file-systems"*) echo "${FAKE_LEFTOVER:-}" ;;
  "aws s3api head-bucket"*) ;;
  "aws fsx create-data-repository-association"*) mk dra ;;
  "aws fsx describe-data-repository-associations"*) if m dra; then echo AVAILABLE; else echo None; fi ;;
  "aws fsx create-data-repository-task"*) mk export-task; echo task-0fake ;;
  "aws fsx describe-data-repository-tasks"*) echo "${FAKE_EXPORT:-SUCCEEDED}" ;;
  *) echo "fake aws: unexpected: $line" >&2; exit 2 ;;
  esac ;;
eksctl)
  case "$line" in
  "eksctl version"*) echo 0.230.0 ;;
  "eksctl create cluster"*) mk cluster ;;
  "eksctl create nodegroup"*) mk nodegroup ;;
  "eksctl create iamserviceaccount"*) mk irsa ;;
  "eksctl delete nodegroup"*) rmk nodegroup ;;
  "eksctl delete cluster"*) rmk cluster ;;
  "eksctl scale nodegroup"*) echo scaled ;;
  *) echo "fake eksctl: unexpected: $line" >&2; exit 2 ;;
  esac ;;
kubectl)
  case "$line" in
  *" get nodes"*allocatable*)
    case "$line" in *neuron*) n=16 ;; *) n=8 ;; esac
    printf '%s\n%s\n' "$n" "$n" ;;
  *"create namespace"*) echo "apiVersion: v1"; echo "kind: Namespace" ;;
  *"apply -f -"*) cat >/dev/null ;;
  *"api-resources"*) echo jobs.batch.volcano.sh ;;
  *" get csidriver"*) echo csidriver.storage.k8s.io/fsx.csi.aws.com ;;
  *" get "*)
    if [ "${FAKE_K8S_EXISTS:-}" = 1 ]; then
      case "$line" in *role-arn*) echo arn:aws:iam::1:role/x ;; *volumeHandle*) echo fs-0fake ;; *volumeName*) echo pv-fake ;; *status.phase*) echo Bound ;; esac
    else
      echo 'Error from server (NotFound): not found' >&2; exit 1
    fi ;;
  *) ;;
  esac ;;
helm)
  case "$line" in
  "helm status"*) m "helm-$2" || { echo "Error: release: not found" >&2; exit 1; } ;;
  "helm upgrade --install"*) mk "helm-$3" ;;
  *) ;;
  esac ;;
trainmaster) ;;  # `cluster wait-fsx` (tested with moto in test_aws.py)
docker)
  case "$line" in
  "docker login"*) cat >/dev/null; echo "Login Succeeded" ;;
  "docker push"*) mk image ;;
  *) ;;
  esac ;;
esac
exit 0
