"""Instance types: one data table, every figure with its source.

The launcher, the Kubernetes builder, the cluster planner and the reports read hardware
facts from here only. Sources (checked 2026-12; list prices change, so `[cluster]
price_per_hour` can override the price):
  [trn1]   AWS blog "Scaling distributed training with AWS Trainium and Amazon EKS" instance
           table; aws-neuron-sdk about-neuron/arch/neuron-hardware/trn1-arch.rst (16 Trainium
           chips x 2 NeuronCore-v2, 190 TF bf16/chip, 3,040 TF per trn1.32xlarge).
  [trn2]   aws-neuron-sdk about-neuron/arch/neuron-hardware/trainium2.rst, trn2-arch.rst
           (16 Trainium2 x 8 NeuronCore-v3, 96 GiB/chip, 667 TF dense bf16/chip; LNC=2 default
           exposes 64 logical cores); EC2 trn2 page (192 vCPU, 2 TiB, 3.2 Tbps EFAv3).
  [p4d]    EC2 P4 page: 8 x A100-40GB, 96 vCPU, 1152 GiB, 400 Gbps, 4 EFA; A100 312 TF bf16.
  [p5]     EC2 P5 page: 8 x H100-80GB / H200-141GB (p5e), 192 vCPU, 2 TiB, 3200 Gbps, 32 EFA;
           H100/H200 SXM 989.4 TF dense bf16 (glennklockwood.com/garden/processors/h100).
  [eks]    aws-neuron-eks-samples: efa per trn1.32xlarge 8, trn1n 16; device plugin resources
           aws.amazon.com/neuron (devices) and vpc.amazonaws.com/efa.
  [price]  EC2 on-demand, us-east-1, Linux; P4d/P5 after the June 2025 reduction.
  [bert]   published BERT-large phase-1 throughput per node and multi-node scaling, for
           `trainmaster estimate`: BERT_LARGE_PHASE1 and SCALING below, each with its source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from trainmaster.errors import ConfigError

Accelerator = Literal["trainium1", "trainium2", "trainium3", "a100", "h100", "h200", "cpu"]
# The software path a node type trains with: trn1 on PyTorch/XLA (frozen at Neuron 2.29.1,
# cluster/versions.py), Trn2/Trn3 on TorchNeuron, native PyTorch with device "neuron".
DeviceKind = Literal["xla", "neuron", "cuda", "cpu"]

NEURON = "aws.amazon.com/neuron"
EFA = "vpc.amazonaws.com/efa"
NVIDIA_GPU = "nvidia.com/gpu"


@dataclass(frozen=True)
class InstanceType:
    name: str
    accelerator: Accelerator
    devices: int  # accelerator chips (0 for a CPU host)
    cores_per_device: int  # NeuronCores per chip; 1 for a GPU
    default_workers: int  # worker processes per node (one per NeuronCore / GPU)
    efa_interfaces: int
    vcpu: int
    memory_gib: int
    accelerator_memory_gib: int
    network_gbps: float
    peak_bf16_tflops: float  # dense, whole instance; 0 when unknown (CPU: measured instead)
    price_per_hour: float  # USD on-demand

    @property
    def neuron(self) -> bool:
        """Trainium hardware (Neuron devices, driver, AMI, device plugin), whatever the path."""
        return self.accelerator.startswith("trainium")

    @property
    def device_kind(self) -> DeviceKind:
        if self.accelerator == "trainium1":
            return "xla"
        if self.neuron:
            return "neuron"
        return "cpu" if self.accelerator == "cpu" else "cuda"

    @property
    def max_workers(self) -> int:
        """Most worker processes a node can host: one per core, or per vCPU on a CPU host."""
        return self.devices * self.cores_per_device if self.devices else self.vcpu

    @property
    def device_resource(self) -> str | None:
        """The Kubernetes extended resource of the accelerator (device plugin name)."""
        if self.neuron:
            return NEURON
        return NVIDIA_GPU if self.device_kind == "cuda" else None

    @property
    def peak_tflops_per_worker(self) -> float:
        return self.peak_bf16_tflops / self.max_workers if self.peak_bf16_tflops else 0.0


_TYPES = [
    #            name              accel        dev cores wrk efa  vcpu  mem  accmem  gbps  peakTF  $/h
    InstanceType(
        "trn1.2xlarge", "trainium1", 1, 2, 2, 0, 8, 32, 32, 12.5, 190.0, 1.34375
    ),  # [trn1]
    InstanceType("trn1.32xlarge", "trainium1", 16, 2, 32, 8, 128, 512, 512, 800, 3040.0, 21.50),
    InstanceType("trn1n.32xlarge", "trainium1", 16, 2, 32, 16, 128, 512, 512, 1600, 3040.0, 24.78),
    InstanceType(
        "trn2.48xlarge", "trainium2", 16, 4, 64, 16, 192, 2048, 1536, 3200, 10672.0, 44.70
    ),
    InstanceType("p4d.24xlarge", "a100", 8, 1, 8, 4, 96, 1152, 320, 400, 2496.0, 21.96),  # [p4d]
    InstanceType("p5.48xlarge", "h100", 8, 1, 8, 32, 192, 2048, 640, 3200, 7915.2, 55.04),  # [p5]
    InstanceType("p5e.48xlarge", "h200", 8, 1, 8, 32, 192, 2048, 1128, 3200, 7915.2, 66.00),
    # A generic CPU host: what the local backend runs on, and CPU node groups (e.g. m7i.8xlarge
    # shape). Its peak is measured by the benchmark, not looked up.
    InstanceType("cpu", "cpu", 0, 0, 1, 0, 32, 128, 0, 12.5, 0.0, 1.61),
]
# trn2: 8 physical NeuronCore-v3 per chip are grouped 2 by 2 (LNC=2), so 4 logical cores per
# chip is what a worker sees; 16 x 4 = 64 workers.

CATALOG: dict[str, InstanceType] = {t.name: t for t in _TYPES}


def device_refusal(inst: InstanceType, device: str) -> str | None:
    """Why `train.device` cannot train on this node type (None: it can). Neuron's support:
    PyTorch/XLA training ended with Neuron 2.30 and its last DLC (2.29.1) lists trn1, trn2, trn3;
    TorchNeuron ("neuron") supports Trn2 and Trn3 only (cluster/versions.py has the sources)."""
    if device == "neuron" and inst.accelerator == "trainium1":
        return (
            f"{inst.name} cannot run TorchNeuron (Neuron supports it on Trn2/Trn3 only); trn1 "
            'trains with train.device = "xla" on the frozen Neuron 2.29.1 stack'
        )
    if device in ("xla", "neuron") and not inst.neuron:
        return f"{device} needs a Trainium node type, not {inst.name}"
    if device == "cuda" and inst.accelerator not in ("a100", "h100", "h200"):
        return f"cuda needs a GPU node type, not {inst.name}"
    return None


# --- Published BERT-large phase-1 (seq 128) training throughput: what `trainmaster estimate`
# uses when no rate of the job itself is known. Only figures found in their source are here;
# p5/p5e (H100/H200), trn2, trn1.2xlarge and the CPU host have none (NVIDIA's PyTorch BERT
# README stops at A100, Neuron publishes no Trn2 BERT training figure), so an estimate for them
# needs a measured or given rate.


@dataclass(frozen=True)
class PublishedRate:
    """One node's published training throughput of BERT-large phase 1 (seq 128, max_pred 20)."""

    seq_per_s: float  # the whole node
    precision: str  # the job precision the figure stands for ("bf16": bf16/fp16 mixed precision)
    setup: str
    source: str


@dataclass(frozen=True)
class Scaling:
    """Published multi-node efficiency: (nodes, rate / (nodes x one node's rate)) points.

    `global_batch` set: strong scaling, that global batch split over every node count (fewer
    sequences per worker per all-reduce as nodes grow); unset: weak scaling at
    `per_worker_batch` sequences per worker per optimizer step."""

    points: tuple[tuple[int, float], ...]
    workers_per_node: int
    global_batch: int | None
    per_worker_batch: int | None
    setup: str
    source: str

    def reference_per_worker(self, nodes: int) -> float:
        """Sequences per worker per optimizer step in the published run at `nodes` nodes."""
        if self.global_batch is not None:
            return self.global_batch / (self.workers_per_node * nodes)
        return float(self.per_worker_batch or 0)


_NEURON_CSV = (
    "aws-neuron/aws-neuron-sdk about-neuron/benchmarks/trn1/training_data_encoder.csv "
    "(commit 86a92868, Neuron 2.28.0)"
)
_TRN1_RATE = PublishedRate(
    3826.6103,
    "bf16",
    "1 x trn1.32xlarge, 32 workers, BF16+SR, micro-batch 16, global batch 16,384, AdamW",
    _NEURON_CSV,
)
# 16 nodes: 57,407.9207 seq/s (BF16+SR, micro-batch 16, global batch 1,048,576, LAMB), same file
# and release; the ratio to 16 x the 1-node figure is the published scaling (the two rows differ
# in optimizer: Neuron publishes no 1-node LAMB row for 2.28; 2.12.0's LAMB pair, 3,520.05 and
# 53,436.34 in general/benchmarks/trn1/trn1_trn1n_nlp_data.csv at 12ad249c, gives 94.9%).
_TRN1_SCALING = Scaling(
    ((16, 57407.9207 / (16 * 3826.6103)),),
    32,
    None,
    16 * 128,
    "16 x trn1.32xlarge, BF16+SR, micro-batch 16 x 128 accumulation, LAMB, weak scaling",
    _NEURON_CSV,
)
_DLE = "NVIDIA/DeepLearningExamples PyTorch/LanguageModeling/BERT/README.md"
BERT_LARGE_PHASE1: dict[str, PublishedRate] = {
    "trn1.32xlarge": _TRN1_RATE,
    "trn1n.32xlarge": _TRN1_RATE,  # the CSV's rows are "trn1.32xlarge/trn1n.32xlarge"
    # p4d = 8 x A100-40GB: DGX A100 40GB, 8 GPUs, AMP fp16, 3,231 seq/s (fp16 and bf16 have the
    # same A100 tensor-core peak, 312 TF).
    "p4d.24xlarge": PublishedRate(
        3231.0,
        "bf16",
        "DGX A100 (8 x A100-40GB), AMP fp16, 8,192 sequences per GPU per step",
        f"{_DLE} at commit 78ec6802, 'Pre-training NVIDIA DGX A100 (8x A100 40GB)', pytorch:20.06",
    ),
}
SCALING: dict[str, Scaling] = {
    "trn1.32xlarge": _TRN1_SCALING,
    "trn1n.32xlarge": _TRN1_SCALING,
    # DGX A100 80GB over InfiniBand, mixed precision, global batch 65,536 split over 1-32 nodes
    # (accumulation 32 -> 1): strong scaling 2.02 / 3.98 / 7.86 / 15.50 / 30.37. p4d's network
    # (400 Gbps EFA) is slower than a DGX A100's 8 x 200 Gb/s InfiniBand.
    "p4d.24xlarge": Scaling(
        ((2, 2.02 / 2), (4, 3.98 / 4), (8, 7.86 / 8), (16, 15.50 / 16), (32, 30.37 / 32)),
        8,
        65536,
        None,
        "1-32 x DGX A100 80GB, AMP fp16, global batch 65,536, strong scaling",
        f"{_DLE} at commit 729963dd, 'Pre-training NVIDIA DGX A100 (8x A100 80GB) Multi-node "
        "Scaling'",
    ),
}
# What estimate assumes for a type without its own published scaling: trn1's, labelled so.
DEFAULT_SCALING = "trn1.32xlarge"


def get(name: str, *, where: str = "instance_type") -> InstanceType:
    try:
        return CATALOG[name]
    except KeyError as exc:
        known = ", ".join(CATALOG)
        raise ConfigError(f"unknown instance type {name!r}; known: {known}", where=where) from exc


# A GPU by the name its driver reports (torch.cuda.get_device_name: "NVIDIA H200") -> the
# instance type whose per-GPU peak applies. The instances carry the SXM parts: a PCIe or NVL
# card of the same name has another peak (an H100 PCIe 756 dense bf16 TFLOP/s, not 989), and a
# GH200 is not an H200, so the name must hold the model as a word and no other form factor.
GPU_INSTANCES = (("H200", "p5e.48xlarge"), ("H100", "p5.48xlarge"), ("A100", "p4d.24xlarge"))
OTHER_FORMS = re.compile(r"\b(PCIe|NVL)\b", re.IGNORECASE)


def instance_for_device(name: str) -> InstanceType | None:
    """The instance type whose GPUs are named `name` by the driver ("NVIDIA H200"); None for
    a device the catalog does not know."""
    if OTHER_FORMS.search(name):
        return None
    return next((get(inst) for key, inst in GPU_INSTANCES if re.search(rf"\b{key}\b", name)), None)


def peak_for_device(name: str) -> tuple[float, str] | None:
    """(dense bf16 TFLOP/s of one device, the instance type it comes from) for a GPU named
    `name`; None for a device the catalog does not know."""
    inst = instance_for_device(name)
    return (inst.peak_tflops_per_worker, inst.name) if inst is not None else None
