"""Every version the cluster plan pins, in one table, with where and when it was checked.

The tutorial's worst failures were unpinned components drifting under it (Volcano from
master, etcd `:latest` gone from quay.io, the FSx CSI driver at `?ref=master`, a script
fetched from another repository's master; docs/architecture.md 5: tutorial 6.1-6.2). Here
each component is pinned, and a new release is adopted by changing one line, on purpose, after
reading its notes. Each `Pin` says the newest upstream release seen on `checked`; a pin older
than that fails tests/cluster/test_versions.py unless `held` says why it stays behind, so a
refresh is a one-line, reviewed change. `trainmaster cluster plan` prints the table.
EKS versions and their support dates: cluster/eks_versions.py.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class Pin:
    name: str
    version: str  # what the plan uses
    latest: str  # the newest upstream release seen on `checked`
    checked: datetime.date
    source: str
    held: str = ""  # why `version` stays behind `latest` (empty: it must equal it)


_D = datetime.date
CHECKED: Final = _D(2026, 12, 6)

# --- add-ons -------------------------------------------------------------------------------
# volcano-sh/volcano tag v1.15.1: the release whose CRDs trainmaster ships in
# trainmaster/schemas/volcano (`launch --dry-run` and the tests; replace them when this moves).
VOLCANO_VERSION: Final = "v1.15.1"
VOLCANO_INSTALLER: Final = (
    f"https://raw.githubusercontent.com/volcano-sh/volcano/{VOLCANO_VERSION}"
    "/installer/volcano-development.yaml"
)
VOLCANO_NAMESPACE: Final = "volcano-system"
VOLCANO_DEPLOYMENTS: Final = ("volcano-admission", "volcano-controllers", "volcano-scheduler")
VOLCANO_WEBHOOK_SERVICE: Final = "volcano-admission-service"

# etcd 3.5.x: 3.6 removed --enable-v2, which torch's etcd rendezvous needs (docs/architecture.md
# 5: tutorial 6.2); meta-pytorch/torchx resources/etcd.yaml pins the same tag.
ETCD_IMAGE: Final = "quay.io/coreos/etcd:v3.5.33"

# aws/eks-charts stable/aws-efa-k8s-device-plugin/Chart.yaml at 5239609 (2026-08-03): chart
# v0.5.30, plugin v0.5.20; its values list trn2.48xlarge, trn2.3xlarge and p5.48xlarge.
EKS_CHARTS_REPO: Final = "https://aws.github.io/eks-charts"
EFA_CHART: Final = "eks/aws-efa-k8s-device-plugin"
EFA_CHART_VERSION: Final = "v0.5.30"

# Neuron's Helm chart: device plugin, scheduler extension, node problem detector (NPD) with node
# recovery; Neuron recommends it over the raw manifests (aws-neuron-sdk deploy/eks/helm-chart.rst,
# deploy/infrastructure/problem-detector.rst: `helm upgrade --install neuron-helm-chart
# oci://public.ecr.aws/neuron/neuron-helm-chart`, recovery with npd.nodeRecovery.enabled=true).
# Chart 1.10.0: the newest on github.com/aws-neuron/neuron-helm-charts/releases (tag 1.10.0,
# 8ca1e5c, 2026-08-19; none seen for Neuron 2.33/2.34). Its Chart.yaml was not readable; its
# values were, as `helm show values --version 1.10.0` (sha256:ed5d8f73...) quoted in a user's
# write-up of 2026-09-11: device plugin 2.32.0.0, NPD v1.36.0, node recovery 1.12.0, and every
# key addons.neuron_values sets, with npd.namespaceOverride neuron-healthcheck-system.
NEURON_CHART: Final = "oci://public.ecr.aws/neuron/neuron-helm-chart"
NEURON_CHART_VERSION: Final = "1.10.0"
NEURON_NPD_NAMESPACE: Final = "neuron-healthcheck-system"  # the chart's npd.namespaceOverride

# NVIDIA/k8s-device-plugin v0.20.1 (2026-09-22; chart nvidia-device-plugin-0.20.1.tgz, read in
# the release's file list and changelog on its SourceForge mirror, sourceforge.net/projects/
# nvidia-device-plugin-k.mirror/files/v0.20.1). Its changelog gives the DaemonSets component-
# specific selector labels (#1716): a selector is immutable, so a release installed with 0.20.0
# may need its DaemonSet deleted before `helm upgrade` to 0.20.1; a new cluster is unaffected.
# The values trainmaster sets (tolerations, nodeSelector) are not among its changes.
NVIDIA_CHARTS_REPO: Final = "https://nvidia.github.io/k8s-device-plugin"
NVIDIA_CHART: Final = "nvdp/nvidia-device-plugin"
NVIDIA_CHART_VERSION: Final = "0.20.1"

# kubernetes-sigs/aws-fsx-csi-driver charts/aws-fsx-csi-driver (chart 1.17.0, driver v1.9.0).
# Checked 2026-12-06: the driver's newest release is v1.10.0, but the newest chart release seen
# (newreleases.io's list for the repository) is still helm-chart-aws-fsx-csi-driver-1.17.0, so
# no chart ships v1.10.0 yet; the chart pin stays.
FSX_CHARTS_REPO: Final = "https://kubernetes-sigs.github.io/aws-fsx-csi-driver"
FSX_CHART: Final = "aws-fsx-csi-driver/aws-fsx-csi-driver"
FSX_CHART_VERSION: Final = "1.17.0"

# Monitoring (cluster.monitoring; cluster/monitoring.py). kube-prometheus-stack 88.5.0 deploys
# prometheus-operator v0.93.1 (its rendered deployment, linode/apl-core PR 3555, 2026); the
# PodMonitor and PrometheusRule CRDs the control-plane tests check against are that operator's
# (example/prometheus-operator-crd of its Go module, controlplane/monitoring-crds.sh).
PROMETHEUS_CHARTS_REPO: Final = "https://prometheus-community.github.io/helm-charts"
PROMETHEUS_STACK_CHART: Final = "prometheus-community/kube-prometheus-stack"
PROMETHEUS_STACK_CHART_VERSION: Final = "88.5.0"
PROMETHEUS_OPERATOR_VERSION: Final = "v0.93.1"
# aws-neuron/aws-neuron-sdk src/k8/k8s-neuron-monitor-daemonset.yml (containers/tutorials/
# k8s-neuron-monitor.rst): the image AWS's DaemonSet runs, serving Prometheus on port 8000.
NEURON_MONITOR_IMAGE: Final = "public.ecr.aws/neuron/neuron-monitor:1.0.0"
# NVIDIA/dcgm-exporter's chart 4.7.0 (dcgm-exporter 4.4.2-4.7.0, the pair NVIDIA/gpu-operator
# PR 1926 moved to).
DCGM_CHARTS_REPO: Final = "https://nvidia.github.io/dcgm-exporter/helm-charts"
DCGM_CHART: Final = "gpu-helm-charts/dcgm-exporter"
DCGM_CHART_VERSION: Final = "4.7.0"

# EKS add-on: the node monitoring agent (NodeConditions for kernel, network, storage, runtime
# and accelerated hardware: NVIDIA XID, Neuron, DCGM) that managed node groups' auto repair acts
# on (docs.aws.amazon.com/eks/latest/userguide/node-health.html; aws/eks-node-monitoring-agent
# README, v1.7.0 published 2026-08-04). The add-on's version is EKS's default for the cluster's
# Kubernetes version (eksctl resolves it), so it is named here, not pinned.
NODE_MONITORING_ADDON: Final = "eks-node-monitoring-agent"

# --- node software ---------------------------------------------------------------------------
# The official EFA installer URL, pinned (the tutorial fetched "-latest" from an S3 path).
EFA_INSTALLER_VERSION: Final = "1.47.0"
EFA_INSTALLER_URL: Final = (
    f"https://efa-installer.amazonaws.com/aws-efa-installer-{EFA_INSTALLER_VERSION}.tar.gz"
)

# --- training images -------------------------------------------------------------------------
# trn1 trains on a frozen stack: Neuron ended PyTorch/XLA training with Neuron 2.30.0 ("PyTorch
# 2.9 was the last version based on the PyTorch/XLA backend for training", aws-neuron-sdk
# about-neuron/announcements/neuron2.x/announce-no-support-pytorch-xla-training.rst), and its
# successor TorchNeuron runs on Trn2/Trn3 only (release-notes/components/torchneuron.rst, Neuron
# 2.33.0). So trn1 stays on the last release that trains with PyTorch/XLA: Neuron 2.29.1
# (2026-05-01, release-notes/prev/2.29.1.rst). A 2.30.0 tag of this DLC exists, but 2.30.0 is
# past the end of XLA training support. aws-neuron/deep-learning-containers README and
# pytorch/training/2.9.0/Dockerfile.neuronx at tag 2.29.1: Ubuntu 24.04, Python 3.12.11,
# torch-neuronx 2.9.0.2.13.26312+8e870898, neuronx-cc 2.24.8799.0+6f62ff7c, runtime lib
# 2.31.24.0, NxD Training 1.7.0; for trn1, trn2, trn3, inf2.
NEURON_XLA_SDK: Final = "2.29.1"
NEURON_BASE_IMAGE: Final = (
    "public.ecr.aws/neuron/pytorch-training-neuronx:2.9.0-neuronx-py312-sdk2.29.1-ubuntu24.04"
)
NEURON_XLA_STACK: Final = {
    "neuron_sdk": NEURON_XLA_SDK,
    "torch_neuronx": "2.9.0.2.13.26312+8e870898",
    "neuronx_cc": "2.24.8799.0+6f62ff7c",
    "python": "3.12.11",
    "ubuntu": "24.04",
}
# Compiler flags of AWS's BERT pre-training scripts (docs/architecture.md 5: 12.4); neuronx-cc
# documents both (compiler/neuronx-cc/api-reference-guide, about-neuron/arch/neuron-features/
# neuron-caching.rst). train/device.py and compile/fingerprint.py use these.
NEURON_CC_FLAGS: Final = "--model-type=transformer --retry_failed_compilation"
FROZEN_XLA_NOTE: Final = (
    "trn1 trains on a frozen stack: Neuron ended PyTorch/XLA training with Neuron 2.30 and "
    "TorchNeuron runs on Trn2/Trn3 only, so trn1 stays on Neuron 2.29.1 "
    "(torch-neuronx 2.9, Python 3.12, Ubuntu 24.04)"
)

# TorchNeuron (native PyTorch, device "neuron"), Trn2/Trn3, still "TorchNeuron (Beta)" in
# Neuron 2.34.0 (2026-11-30; release-notes/2.34.0.rst). Neuron 2.34.0 ships torch-neuronx
# 2.13.3.1 and 2.14.3.1 (github.com/aws-neuron/torch-neuronx releases/tag/v2.34.0): the 2.13
# family goes with PyTorch 2.13, the torch this project installs ("install the torch-neuronx
# package family that matches the PyTorch version"). Neuron 2.33.0's table mapped 2.13.3.0.* to
# PyTorch 2.13.0 and Python 3.12-3.14 (release-notes/components/torchneuron.rst); 2.34.0's table
# was not readable here, so that 2.13.3.1 still wants torch 2.13.0 exactly is assumed: pip fails
# the build, not the job, if it does not. Base: Ubuntu 26.04, the only OS of Neuron's DLCs from
# 2.33.0 on (setup/pytorch/update-dlc.rst at v2.33.0) and of 2.33's standalone wheels; 26.04
# stays supported for TorchNeuron. The image installs the wheel from Neuron's pip repository as
# the quickstart does (no TorchNeuron DLC tag was readable: the deep-learning-containers
# snapshot read is of 2026-08-17). The ubuntu:26.04 tag itself was not verified here.
# neuron-ls: Neuron 2.34 replaced its JSON flag `-j`/`--json-output` with `--output-format json`
# (about-neuron/announcements/neuron2.x/announce-intent-eos-neuron-ls-json.rst). Nothing that
# trainmaster generates runs neuron-ls: the torchneuron image installs no Neuron tools (runtime
# and collectives only) and the trn1 image's are Neuron 2.29.1's, where `-j` still works; the
# preflight counts /dev/neuronN instead (train/health.py).
TORCHNEURON_SDK: Final = "2.34.0"
TORCHNEURON_VERSION: Final = "2.13.3.1"
TORCHNEURON_BASE_IMAGE: Final = "public.ecr.aws/docker/library/ubuntu:26.04"
NEURON_PIP_INDEX: Final = "https://pip.repos.neuron.amazonaws.com"
TORCHNEURON_BETA: Final = "TorchNeuron is a public beta (Neuron 2.34.0)"

CUDA_BASE_IMAGE: Final = "nvidia/cuda:12.8.1-base-ubuntu24.04"
CPU_BASE_IMAGE: Final = "python:3.11-slim-bookworm"
TORCH_VERSION: Final = "2.13.0"  # what the Makefile installs; the CPU and CUDA images use it too
TORCH_INDEX: Final = {
    "cpu": "https://download.pytorch.org/whl/cpu",
    "cuda": "https://download.pytorch.org/whl/cu128",
}
PYTHON_ETCD_VERSION: Final = "0.4.5"
TENSORBOARD_VERSION: Final = "2.20.0"
# The transformers of the trn1 stack: the neuron image pins it, and `make test` runs the stacks
# suite with it (stacks/trn1.txt; tests/foundation/test_stacks.py keeps the two equal). Left to
# pip, trn1's attention and numerics would move with its choice (transformers 4.54 made SDPA
# BERT's default attention); the XLA row of train/devices.py names its attention too.
TRN1_TRANSFORMERS: Final = "4.51.3"

_AUG = _D(2026, 8, 1)  # the first table: checked against the repositories in 2026-08
# Pins still dated _AUG were looked for again on 2026-12-06, but no newer source was readable
# (no volcano release list; no etcd 3.5.x patch after v3.5.33), so they stay, unverified.
PINS: Final = (
    Pin("volcano", VOLCANO_VERSION, VOLCANO_VERSION, _AUG, "github.com/volcano-sh/volcano tags"),
    Pin(
        "etcd",
        ETCD_IMAGE,
        ETCD_IMAGE,
        _AUG,
        "quay.io/coreos/etcd; meta-pytorch/torchx resources/etcd.yaml",
        held="3.5.x: etcd 3.6 removed --enable-v2 (torch's etcd rendezvous)",
    ),
    Pin(
        "neuron_helm_chart",
        NEURON_CHART_VERSION,
        "1.10.0",
        CHECKED,
        "github.com/aws-neuron/neuron-helm-charts/releases (1.10.0, 8ca1e5c, 2026-08-19); "
        "its values as `helm show values` prints them",
    ),
    Pin(
        "nvidia_device_plugin_chart",
        NVIDIA_CHART_VERSION,
        "0.20.1",
        CHECKED,
        "NVIDIA/k8s-device-plugin v0.20.1 (2026-09-22), its SourceForge mirror's file list and "
        "changelog",
    ),
    Pin(
        "efa_device_plugin_chart",
        EFA_CHART_VERSION,
        "v0.5.30",
        CHECKED,
        "aws/eks-charts stable/aws-efa-k8s-device-plugin/Chart.yaml (5239609, 2026-08-03: "
        "the newest snapshot of eks-charts readable on 2026-12-06)",
    ),
    Pin(
        "fsx_csi_driver_chart",
        FSX_CHART_VERSION,
        FSX_CHART_VERSION,
        CHECKED,
        "kubernetes-sigs/aws-fsx-csi-driver releases (newreleases.io): newest chart 1.17.0; "
        "driver v1.10.0 has no chart yet",
    ),
    Pin("efa_installer", EFA_INSTALLER_VERSION, EFA_INSTALLER_VERSION, _AUG, "efa-installer"),
    Pin(
        "neuron_xla_image",
        NEURON_BASE_IMAGE,
        "sdk2.30.0",
        CHECKED,
        "aws-neuron/deep-learning-containers README (2.32.0); announce-no-support-pytorch-xla-"
        "training.rst",
        held="frozen: PyTorch/XLA training ended with Neuron 2.30.0; 2.29.1 is the last that trains",
    ),
    Pin(
        "torchneuron",
        TORCHNEURON_VERSION,
        "2.13.3.1",
        CHECKED,
        "aws-neuron/torch-neuronx releases/tag/v2.34.0 and aws-neuron-sdk release-notes/2.34.0.rst "
        "(Neuron 2.34.0, 2026-11-30)",
        held="",
    ),
    Pin("cuda_base_image", CUDA_BASE_IMAGE, CUDA_BASE_IMAGE, _AUG, "hub.docker.com/r/nvidia/cuda"),
    Pin("cpu_base_image", CPU_BASE_IMAGE, CPU_BASE_IMAGE, _AUG, "hub.docker.com/_/python"),
    Pin("torch", TORCH_VERSION, TORCH_VERSION, _AUG, "pypi.org/project/torch (Makefile)"),
    Pin(
        "python_etcd",
        PYTHON_ETCD_VERSION,
        PYTHON_ETCD_VERSION,
        _AUG,
        "pypi.org/project/python-etcd",
    ),
    Pin(
        "tensorboard",
        TENSORBOARD_VERSION,
        TENSORBOARD_VERSION,
        _AUG,
        "pypi.org/project/tensorboard",
    ),
    Pin(
        "trn1_transformers",
        TRN1_TRANSFORMERS,
        TRN1_TRANSFORMERS,
        _D(2026, 12, 4),
        "stacks/trn1.txt: the version the trn1 stack suite runs",
    ),
)


def ami_parameter(kubernetes_version: str, neuron: bool) -> str:
    """SSM parameter of the current EKS-optimised AL2023 accelerated AMI (awslabs/amazon-eks-ami
    publishes AL2023_x86_64_NEURON and _NVIDIA for every supported version, CHANGELOG)."""
    flavour = "neuron" if neuron else "nvidia"
    return (
        f"/aws/service/eks/optimized-ami/{kubernetes_version}/amazon-linux-2023/x86_64/"
        f"{flavour}/recommended/image_id"
    )


def pins() -> dict[str, str]:
    """The pinned versions, as recorded in plan.json (what a reviewer diffs)."""
    return {p.name: p.version for p in PINS}


def pin_lines() -> list[str]:
    """`cluster plan`'s table: each pin, the newest release seen and the date it was checked."""
    width = max(len(p.name) for p in PINS)
    out = []
    for p in PINS:
        behind = f" (newest {p.latest}: {p.held})" if p.version != p.latest else ""
        out.append(f"{p.name:<{width}}  {p.version}  checked {p.checked}{behind}")
    return out
