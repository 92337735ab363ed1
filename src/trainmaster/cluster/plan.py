"""`cluster plan`: the job file's [cluster] section -> a folder of reviewable files.

    DIR/plan.json                           what was resolved, the pins, the steps (`cluster up` reads it)
    DIR/runbook.sh                          the ordered commands (runbook.py)
    DIR/eksctl/{cluster,nodegroup,fsx-irsa}.yaml
    DIR/eksctl/s3-irsa.yaml                 with cluster.data_buckets: `data stage`'s S3 reader
    DIR/cloudformation/accelerator-nodes.yaml
    DIR/k8s/*.yaml                          device plugin, queue, etcd, storage class, claim, TensorBoard
    DIR/helm/*.yaml                         values of the pinned charts
    DIR/image/Dockerfile.{neuron,cuda,cpu}  the training image
    DIR/image/Dockerfile.workspace          with kubernetes.workspace: your code on top of it

`build` is pure (spec -> {path: text}); `write_plan` resolves the spec (an AWS look-up of the
zones when none are given) and writes the files. Nothing here creates anything in AWS.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainmaster import __version__, yamltext
from trainmaster.cluster import (
    addons,
    cloudformation,
    downsteps,
    eksctl,
    fsx,
    image,
    monitoring,
    nodeguard,
    progressguard,
    runbook,
    steps,
    upsteps,
    versions,
)
from trainmaster.cluster.spec import ClusterSpec, ZoneLookup, resolve
from trainmaster.config import JobConfig
from trainmaster.errors import UserError

PLAN_JSON = "plan.json"
STATE_DIR = ".state"
RENDERED_DIR = ".rendered"
PLACEHOLDER_NOTE = (
    "Names between at-signs are placeholders for IDs that exist only once an "
    "earlier step ran; runbook.sh fills them in (.rendered/)."
)


def to_yaml(docs: list[dict[str, Any]] | dict[str, Any], comment: str = "") -> str:
    return yamltext.dump(docs, width=110, comment=comment)


def build(spec: ClusterSpec) -> dict[str, str]:
    """Every file of the plan, relative path -> text (pure)."""
    up, down = upsteps.up_steps(spec), downsteps.down_steps(spec)
    made = "Written by `trainmaster cluster plan`."
    files: dict[str, str] = {
        "eksctl/cluster.yaml": to_yaml(
            eksctl.cluster_config(spec), f"{made} eksctl create cluster -f"
        ),
        "eksctl/nodegroup.yaml": to_yaml(
            eksctl.nodegroup_config(spec), f"{made} eksctl create nodegroup -f\n{PLACEHOLDER_NOTE}"
        ),
        "eksctl/fsx-irsa.yaml": to_yaml(
            eksctl.fsx_irsa_config(spec), f"{made} eksctl create iamserviceaccount -f"
        ),
        "cloudformation/accelerator-nodes.yaml": to_yaml(
            cloudformation.template(spec), f"{made} aws cloudformation deploy"
        ),
        "k8s/queue.yaml": to_yaml(addons.queue(spec), made),
        "k8s/etcd.yaml": to_yaml(addons.etcd(spec), made),
        "k8s/storageclass.yaml": to_yaml(fsx.storage_class(spec), f"{made}\n{PLACEHOLDER_NOTE}"),
        "k8s/claim.yaml": to_yaml(fsx.claim(spec), made),
        "k8s/node-marker.yaml": to_yaml(
            nodeguard.rbac(spec.namespace, spec.service_account),
            f"{made} Lets a training pod mark only its own node unhealthy (nodeguard.py).",
        ),
        "k8s/job-progress.yaml": to_yaml(
            progressguard.rbac(spec.namespace, spec.service_account),
            f"{made} Lets rank 0's pod publish its own job's progress (progressguard.py).",
        ),
        "k8s/node-watcher.yaml": to_yaml(
            nodeguard.watcher(addons.IMAGE, addons.SYSTEM_SELECTOR),
            f"{made} Takes a lost node out of service, so its gang restarts elsewhere "
            f"(backends/kubernetes/nodewatch.py).\n{PLACEHOLDER_NOTE}",
        ),
        "k8s/tensorboard.yaml": to_yaml(addons.tensorboard(spec), f"{made}\n{PLACEHOLDER_NOTE}"),
        "helm/aws-fsx-csi-driver.yaml": to_yaml(
            fsx.csi_values(spec), f"{made} {versions.FSX_CHART} {versions.FSX_CHART_VERSION}"
        ),
    }
    if spec.data_buckets:  # `data stage`'s S3 reader through IRSA
        files["eksctl/s3-irsa.yaml"] = to_yaml(
            eksctl.s3_irsa_config(spec), f"{made} eksctl create iamserviceaccount -f"
        )
    if spec.instance.neuron:
        files["eksctl/npd-irsa.yaml"] = to_yaml(
            eksctl.npd_irsa_config(spec), f"{made} eksctl create iamserviceaccount -f"
        )
        files["helm/neuron-helm-chart.yaml"] = to_yaml(
            addons.neuron_values(spec),
            f"{made} {versions.NEURON_CHART} {versions.NEURON_CHART_VERSION}",
        )
    else:
        files["helm/nvidia-device-plugin.yaml"] = to_yaml(
            addons.nvidia_values(spec),
            f"{made} {versions.NVIDIA_CHART} {versions.NVIDIA_CHART_VERSION}",
        )
    if spec.efa:
        files["helm/efa-device-plugin.yaml"] = to_yaml(
            addons.efa_values(spec), f"{made} {versions.EFA_CHART} {versions.EFA_CHART_VERSION}"
        )
    if spec.monitoring:  # cluster/monitoring.py
        board = json.dumps(monitoring.dashboard(), indent=2) + "\n"
        files["grafana/trainmaster-job.json"] = board
        files["k8s/monitoring.yaml"] = to_yaml(
            monitoring.objects(spec, board), f"{made} The jobs' PodMonitor, alerts and dashboard."
        )
        files["helm/kube-prometheus-stack.yaml"] = to_yaml(
            monitoring.stack_values(),
            f"{made} {versions.PROMETHEUS_STACK_CHART} {versions.PROMETHEUS_STACK_CHART_VERSION}",
        )
        if spec.instance.device_kind == "cuda":
            files["helm/dcgm-exporter.yaml"] = to_yaml(
                monitoring.dcgm_values(),
                f"{made} {versions.DCGM_CHART} {versions.DCGM_CHART_VERSION}",
            )
    files |= {f"image/{name}": text for name, text in image.dockerfiles().items()}
    if spec.workspace:  # your code on top of the training image (docs/architecture.md 3.8)
        files |= {
            f"image/{n}": t for n, t in image.workspace_files(spec.workspace, spec.flavour).items()
        }
    files["runbook.sh"] = runbook.render(spec, up, down)
    files = dict(sorted(files.items()))
    summary = {
        "trainmaster": __version__,
        "cluster": {
            "name": spec.name,
            "region": spec.region,
            "kubernetes_version": spec.kubernetes_version,
            "instance_type": spec.instance.name,
            "nodes": spec.nodes,
            "zones": list(spec.zones),
            "accelerator_zone": spec.accelerator_zone,
            "nodegroup": spec.nodegroup,
            "system_nodegroup": spec.system_nodegroup,
            "stack": spec.stack_name,
            "namespace": spec.namespace,
            "queue": spec.queue,
            "pvc": spec.pvc,
            "mount": spec.mount,
            "results": fsx.results_url(spec),
            "image_repository": spec.image_repository,
            "image_tag": spec.image_tag,
            "flavour": spec.flavour,
        },
        "pins": versions.pins(),
        "files": [*files, PLAN_JSON],
        "steps": [s.to_json() for s in up],
        "down": [s.to_json() for s in down],
    }
    files[PLAN_JSON] = json.dumps(summary, indent=2) + "\n"
    return files


@dataclass(frozen=True)
class WrittenPlan:
    dir: Path
    spec: ClusterSpec
    files: list[str]


def write_plan(
    cfg: JobConfig, out_dir: str | Path, zone_lookup: ZoneLookup | None = None
) -> WrittenPlan:
    spec = resolve(cfg, zone_lookup)
    files = build(spec)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserError("exists and is not a folder", where=str(out))
    previous = _previous_files(out)
    try:
        for rel, text in files.items():
            path = out / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            if rel.endswith(".sh"):
                path.chmod(0o755)
        for rel in previous - set(files):  # a file of an earlier plan this one does not have
            (out / rel).unlink(missing_ok=True)
        shutil.rmtree(out / RENDERED_DIR, ignore_errors=True)
    except OSError as exc:
        raise UserError(f"cannot write the plan ({exc.strerror})", where=str(out)) from exc
    return WrittenPlan(out, spec, list(files))


def _previous_files(out: Path) -> set[str]:
    try:
        data = json.loads((out / PLAN_JSON).read_text(encoding="utf-8"))
        return {str(f) for f in data.get("files", []) if ".." not in str(f)}
    except (OSError, ValueError):
        return set()


@dataclass(frozen=True)
class LoadedPlan:
    dir: Path
    cluster: dict[str, Any]
    up: list[steps.Step]
    down: list[steps.Step]

    @property
    def runbook(self) -> Path:
        return self.dir / "runbook.sh"

    @property
    def state_dir(self) -> Path:
        return self.dir / STATE_DIR


def load_plan(plan_dir: str | Path) -> LoadedPlan:
    d = Path(plan_dir).absolute()  # steps run with the plan folder as their working directory
    try:
        data = json.loads((d / PLAN_JSON).read_text(encoding="utf-8"))
        plan = LoadedPlan(
            d,
            dict(data["cluster"]),
            [steps.Step.from_json(s) for s in data["steps"]],
            [steps.Step.from_json(s) for s in data["down"]],
        )
    except FileNotFoundError as exc:
        raise UserError(
            f"no {PLAN_JSON} here; write a plan first: trainmaster cluster plan JOB.toml --out {d}",
            where=str(d),
        ) from exc
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(
            f"{PLAN_JSON} is unreadable ({exc}); write the plan again with "
            "`trainmaster cluster plan`",
            where=str(d),
        ) from exc
    if not plan.runbook.is_file():
        raise UserError("runbook.sh is missing; write the plan again", where=str(d))
    return plan
