"""runbook.sh: the plan's steps as one bash script a person can read, run, or run step by step.

    ./runbook.sh               every step in order, skipping those whose work exists
    ./runbook.sh run STEP...   the named steps
    ./runbook.sh check STEP    exit 0 when STEP's work is done already
    ./runbook.sh list          the steps, then the clean-up steps
    ./runbook.sh down          the clean-up steps, in the tutorial's order

IDs that AWS assigns at creation (launch template, node role, Lustre security group, subnet,
account) appear in the plan's files as @NAME@ placeholders; `render FILE` writes a copy under
.rendered/ with them filled in from the stack outputs and describe calls, just before use.
`trainmaster cluster up` runs the same functions (`run STEP`, `check STEP`) with progress.
"""

from __future__ import annotations

import shlex

from trainmaster.cluster.spec import ROLE_LABEL, ClusterSpec
from trainmaster.cluster.steps import Step

_HELPERS = r"""
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
"""

_MAIN = r"""
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
"""


def _function(name: str, lines: tuple[str, ...] | list[str]) -> str:
    body = "\n".join("  " + line.replace("\n", "\n  ") for line in lines)
    return f"{name}() {{\n{body}\n}}\n"


def _step(step: Step) -> str:
    fn = step.id.replace("-", "_")
    text = f"# {step.id}: {step.title}\n" + _function(f"step_{fn}", step.commands)
    if step.check:
        text += _function(f"check_{fn}", [step.check])
    return text


def render(spec: ClusterSpec, up: list[Step], down: list[Step]) -> str:
    q = shlex.quote
    variables = {
        "CLUSTER": spec.name,
        "REGION": spec.region,
        "STACK": spec.stack_name,
        "NODEGROUP": spec.nodegroup,
        "NAMESPACE": spec.namespace,
        "ECR_REPO": spec.image_repository,
        "IMAGE_TAG": spec.image_tag,
        "ACCELERATOR_SELECTOR": f"{ROLE_LABEL}=accelerator",
    }
    head = [
        "#!/usr/bin/env bash",
        f"# trainmaster cluster runbook: {spec.name}, {spec.nodes} x {spec.instance.name} in "
        f"{spec.region} ({spec.accelerator_zone}), Kubernetes {spec.kubernetes_version}.",
        "# Written by `trainmaster cluster plan`; `trainmaster cluster up` runs the same steps.",
        *(f"# {line}" if line else "#" for line in (__doc__ or "").strip().splitlines()[1:8]),
        "set -euo pipefail",
        'PLAN_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        *(f"{k}={q(v)}" for k, v in variables.items()),
        'export AWS_REGION="$REGION" AWS_DEFAULT_REGION="$REGION" AWS_PAGER=""',
        f"UP_STEPS=({' '.join(s.id for s in up)})",
        f"DOWN_STEPS=({' '.join(s.id for s in down)})",
    ]
    parts = ["\n".join(head), _HELPERS.strip() + "\n", "# --- build ---\n"]
    parts += [_step(s) for s in up]
    parts.append("# --- clean-up (the tutorial's order) ---\n")
    parts += [_step(s) for s in down]
    parts.append(_MAIN.strip() + "\n")
    return "\n".join(parts)
