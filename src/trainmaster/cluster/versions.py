"""Every version the cluster plan pins, in one table, with where it was checked.

The tutorial's worst failures were unpinned components drifting under it (Volcano from
master, etcd `:latest` gone from quay.io, the FSx CSI driver at `?ref=master`, a script
fetched from another repository's master; docs/architecture.md 5: tutorial 6.1-6.2). Here
each component is pinned, and a new release is adopted by changing one line, on purpose, after
reading its notes.
Checked 2026-08 against the upstream repositories named in the comments.
"""

from __future__ import annotations

from typing import Final

# EKS versions that have AL2023 accelerated (Neuron and NVIDIA) AMIs and are in standard or
# extended support; EKS published no AL2 AMIs after 1.32, so AL2023 it is
# (docs/architecture.md 5: tutorial 6.12).
SUPPORTED_KUBERNETES: Final = ("1.30", "1.31", "1.32", "1.33", "1.34")

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

# aws/eks-charts stable/aws-efa-k8s-device-plugin (chart v0.5.30, plugin v0.5.20).
EKS_CHARTS_REPO: Final = "https://aws.github.io/eks-charts"
EFA_CHART: Final = "eks/aws-efa-k8s-device-plugin"
EFA_CHART_VERSION: Final = "v0.5.30"

# aws-neuron neuron-device-plugin image (neuron-helm-chart values, Neuron docs
# deploy/includes/k8s-neuron-device-plugin.rst). Installed from our own manifest, not the
# chart, so that it is validated here and carries exactly the tolerations our taints need.
NEURON_DEVICE_PLUGIN_IMAGE: Final = "public.ecr.aws/neuron/neuron-device-plugin:2.22.4.0"

# NVIDIA/k8s-device-plugin Helm chart.
NVIDIA_CHARTS_REPO: Final = "https://nvidia.github.io/k8s-device-plugin"
NVIDIA_CHART: Final = "nvdp/nvidia-device-plugin"
NVIDIA_CHART_VERSION: Final = "0.17.1"

# kubernetes-sigs/aws-fsx-csi-driver charts/aws-fsx-csi-driver (chart 1.17.0, driver v1.9.0).
FSX_CHARTS_REPO: Final = "https://kubernetes-sigs.github.io/aws-fsx-csi-driver"
FSX_CHART: Final = "aws-fsx-csi-driver/aws-fsx-csi-driver"
FSX_CHART_VERSION: Final = "1.17.0"

# --- node software ---------------------------------------------------------------------------
# The official EFA installer URL, pinned (the tutorial fetched "-latest" from an S3 path).
EFA_INSTALLER_VERSION: Final = "1.47.0"
EFA_INSTALLER_URL: Final = (
    f"https://efa-installer.amazonaws.com/aws-efa-installer-{EFA_INSTALLER_VERSION}.tar.gz"
)

# --- training image ----------------------------------------------------------------------------
# AWS Neuron Deep Learning Container (torch-neuronx 2.8, Neuron SDK 2.26.1, Python 3.11).
NEURON_BASE_IMAGE: Final = (
    "public.ecr.aws/neuron/pytorch-training-neuronx:2.8.0-neuronx-py311-sdk2.26.1-ubuntu22.04"
)
CUDA_BASE_IMAGE: Final = "nvidia/cuda:12.8.1-base-ubuntu24.04"
CPU_BASE_IMAGE: Final = "python:3.11-slim-bookworm"
TORCH_VERSION: Final = "2.13.0"  # what the Makefile installs; the CPU and CUDA images use it too
TORCH_INDEX: Final = {
    "cpu": "https://download.pytorch.org/whl/cpu",
    "cuda": "https://download.pytorch.org/whl/cu128",
}
PYTHON_ETCD_VERSION: Final = "0.4.5"
TENSORBOARD_VERSION: Final = "2.20.0"


def ami_parameter(kubernetes_version: str, device_kind: str) -> str:
    """SSM parameter of the current EKS-optimised AL2023 accelerated AMI."""
    flavour = "neuron" if device_kind == "xla" else "nvidia"
    return (
        f"/aws/service/eks/optimized-ami/{kubernetes_version}/amazon-linux-2023/x86_64/"
        f"{flavour}/recommended/image_id"
    )


def pins() -> dict[str, str]:
    """The pinned versions, as recorded in plan.json (what a reviewer diffs)."""
    return {
        "volcano": VOLCANO_VERSION,
        "etcd": ETCD_IMAGE,
        "efa_device_plugin_chart": EFA_CHART_VERSION,
        "neuron_device_plugin": NEURON_DEVICE_PLUGIN_IMAGE,
        "nvidia_device_plugin_chart": NVIDIA_CHART_VERSION,
        "fsx_csi_driver_chart": FSX_CHART_VERSION,
        "efa_installer": EFA_INSTALLER_VERSION,
        "neuron_base_image": NEURON_BASE_IMAGE,
        "cuda_base_image": CUDA_BASE_IMAGE,
        "cpu_base_image": CPU_BASE_IMAGE,
        "torch": TORCH_VERSION,
        "python_etcd": PYTHON_ETCD_VERSION,
        "tensorboard": TENSORBOARD_VERSION,
    }
