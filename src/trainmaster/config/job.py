"""The job file (docs/architecture.md 3.2): typed sections, validation, derived values
and the config hash.

A job is described once, here, and everything else (trainer, launchers, manifests, cluster
plan) reads the resolved `JobConfig`. Models are strict (a string is not an int) and forbid
unknown keys, so a typo in a job file fails before anything runs. Loading, --set overrides
and presets live in `jobfile.py`; this module has no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from trainmaster import catalog
from trainmaster.config.base import (
    CACHESET,
    JOB_NAME,
    JOB_NAME_RULE,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Section,
)
from trainmaster.config.infra import ClusterSection, KubernetesSection

# The built-in BERT trainer (train/__main__.py); any other entrypoint is the user's own script.
BUILTIN_ENTRYPOINT = "-m trainmaster.train"
SPOT_NOTICE_S = 120  # EC2 reclaims a Spot instance two minutes after its interruption notice
_MODULE = re.compile(r"-m[ \t]+([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
_LAUNCHERS = ("python", "python3", "torchrun")
_TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def check_entrypoint(value: str) -> str:
    """A file path or `-m package.module`, nothing else: arguments belong in job.args, and
    torchrun is trainmaster's to start (a "python train.py --x" here would run nothing)."""
    text = value.strip()
    if not text or "\0" in text or "\n" in text:
        raise ValueError("give a Python file (train.py) or -m package.module")
    if text.startswith("-"):
        m = _MODULE.fullmatch(text)
        if m is None:
            raise ValueError("expected -m package.module (arguments go in job.args)")
        if m.group(1) in _TORCHRUN_MODULES:
            raise ValueError("torchrun is started for you; give the module it should run")
        return f"-m {m.group(1)}"
    first = text.split()[0]
    if first in _LAUNCHERS or first.endswith("/python3") or first.endswith("/python"):
        raise ValueError(
            f"give the script alone, not a command ({first} is started for you by "
            "torchrun); put its arguments in job.args"
        )
    return text


class JobSection(Section):
    name: str = Field(
        "demo",
        description="job id: lower-case letters, digits and '-', starting with a letter, at most 40 characters",
    )
    backend: Literal["local", "kubernetes"] = Field(
        "local",
        description="where the job runs: local (this machine) or kubernetes (Volcano on EKS)",
    )
    nnodes: PositiveInt = Field(
        1, description="nodes (torchrun agents / pods); the most nodes of an elastic job"
    )
    min_nnodes: PositiveInt | None = Field(
        None, description="elastic jobs: fewest nodes to go on with (unset = not elastic)"
    )
    nproc_per_node: PositiveInt = Field(
        1, description="worker processes per node (one per NeuronCore or GPU)"
    )
    storage: str | None = Field(
        None,
        description="storage root (local folder, or /data on the cluster); unset = --storage, $TRAINMASTER_STORAGE, ./trainmaster-data",
    )
    max_restarts: NonNegativeInt = Field(
        3,
        description="restarts of failed workers before the job fails; each resumes from the last checkpoint",
    )
    network: Literal["host", "netns"] = Field(
        "host",
        description="local: host = every node on this machine's loopback; netns = each node in a network namespace of its own with its own address on a bridge (root, iproute2), so that the rendezvous and collectives cross a network (c10d only)",
    )
    max_retries: NonNegativeInt = Field(
        3,
        description="bounds both job retries and node rejoins, each per launch: restarts of the whole job after a node is lost (local: the supervisor starts every node again; each resumes from the last checkpoint), and in an elastic job the times a lost node is taken back (local: backends/local/rejoin.py starts its agent again, at most max_retries times); counted apart from max_restarts",
    )
    entrypoint: str = Field(
        BUILTIN_ENTRYPOINT,
        description="what torchrun starts on every worker: a Python file (train.py; local: from the launch folder, kubernetes: from the image's /workspace) or -m package.module; default the built-in BERT trainer",
    )
    args: list[str] = Field(
        default_factory=list, description='arguments after the entrypoint, e.g. ["--lr", "3e-4"]'
    )

    @property
    def builtin(self) -> bool:
        """The built-in BERT trainer runs (and [train], [model], [data] configure it), not a
        script of the user's: the one place that asks."""
        return self.entrypoint == BUILTIN_ENTRYPOINT

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        from trainmaster.naming import is_dns1035_label

        if not (is_dns1035_label(value) and re.fullmatch(JOB_NAME, value)):
            raise ValueError(f"{value!r} {JOB_NAME_RULE}")
        return value

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, value: str) -> str:
        return check_entrypoint(value)

    @field_validator("args")
    @classmethod
    def _args(cls, value: list[str]) -> list[str]:
        if any("\0" in a for a in value):
            raise ValueError("an argument holds a NUL character, which no command line can carry")
        return value


# Versions that serve the v2 API torch's etcd rendezvous needs: etcd 3.6 removed it
# (pytorch/pytorch issues 158326 and 170707).
ETCD_VERSIONS = "etcd 3.4 or 3.5 started with --enable-v2 (etcd 3.6 and later removed the v2 API)"


class RendezvousSection(Section):
    backend: Literal["c10d", "etcd", "etcd-v2"] = Field(
        "c10d", description="torchrun rendezvous: c10d (no extra service), etcd or etcd-v2"
    )
    endpoint: str | None = Field(
        None,
        description="host:port; unset = a free loopback port / private etcd (local), pod 0's service name (kubernetes, c10d) / etcd-server.trainmaster-etcd.svc:2379 (kubernetes, etcd)",
    )
    timeout: PositiveInt = Field(600, description="seconds to wait for all nodes to join")


MODEL_PRESETS: dict[str, dict[str, int]] = {
    # (layers, hidden, heads, intermediate): Google's BERT release (bert-tiny/mini from
    # "Well-Read Students Learn Better", Turc et al. 2019) and bert-base/large (Devlin et al.).
    "bert-tiny": {"num_layers": 2, "hidden_size": 128, "num_heads": 2, "intermediate_size": 512},
    "bert-mini": {"num_layers": 4, "hidden_size": 256, "num_heads": 4, "intermediate_size": 1024},
    "bert-base": {"num_layers": 12, "hidden_size": 768, "num_heads": 12, "intermediate_size": 3072},
    "bert-large": {
        "num_layers": 24,
        "hidden_size": 1024,
        "num_heads": 16,
        "intermediate_size": 4096,
    },
}
DEFAULT_VOCAB = 30522  # bert-*-uncased; NVIDIA's and the tutorial's shards carry no vocabulary


class ModelSection(Section):
    preset: Literal["bert-tiny", "bert-mini", "bert-base", "bert-large"] | None = Field(
        "bert-tiny",
        description="bert-tiny | bert-mini | bert-base | bert-large; explicit sizes below override it",
    )
    num_layers: PositiveInt | None = Field(None, description="transformer layers")
    hidden_size: PositiveInt | None = Field(None, description="hidden size")
    num_heads: PositiveInt | None = Field(
        None, description="attention heads (must divide hidden_size)"
    )
    intermediate_size: PositiveInt | None = Field(None, description="feed-forward size")
    vocab_size: PositiveInt | None = Field(
        None, description="unset = from the dataset's vocab.txt, else 30522"
    )
    max_position_embeddings: PositiveInt = Field(
        512, description="longest sequence the model can take"
    )

    def size(self, key: str) -> int:
        """An explicit size, else the preset's."""
        value = getattr(self, key)
        if value is None:
            assert self.preset is not None  # checked by the validator
            value = MODEL_PRESETS[self.preset][key]
        return int(value)

    @model_validator(mode="after")
    def _complete(self) -> ModelSection:
        keys = ("num_layers", "hidden_size", "num_heads", "intermediate_size")
        missing = [k for k in keys if getattr(self, k) is None]
        if self.preset is None and missing:
            raise ValueError(f"without a preset, set {', '.join(missing)}")
        if self.size("hidden_size") % self.size("num_heads"):
            raise ValueError("num_heads must divide hidden_size")
        return self


class DataSection(Section):
    dataset: str = Field(
        "pydoc",
        description="a name under STORAGE/datasets/ or a path to a folder of *_training_*.hdf5 shards",
    )
    seq_len: Annotated[int, Field(ge=16, le=4096)] = Field(
        128, description="tokens per example; must equal the shards'"
    )
    max_pred: PositiveInt = Field(
        20, description="masked positions per example; must equal the shards'"
    )

    @model_validator(mode="after")
    def _pred_fits(self) -> DataSection:
        if self.max_pred >= self.seq_len:
            raise ValueError("max_pred must be below seq_len")
        return self


class TrainSection(Section):
    device: Literal["auto", "cpu", "cuda", "xla", "neuron"] = Field(
        "auto",
        description="auto | cpu (gloo) | cuda (nccl) | xla (trn1: PyTorch/XLA, frozen at Neuron 2.29.1) | neuron (Trn2/Trn3: TorchNeuron, beta)",
    )
    precision: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="fp32 | bf16 (autocast on cpu/cuda, bf16 weights with stochastic rounding on Neuron)",
    )
    batch_size: PositiveInt = Field(16, description="micro-batch per worker")
    global_batch_size: PositiveInt = Field(
        32,
        description="sequences per optimizer step; fixed when nodes change (accumulation is derived)",
    )
    optimizer: Literal["adamw", "lamb", "nvlamb"] = Field(
        "adamw",
        description="adamw (linear decay) | lamb (polynomial 0.5 decay) | nvlamb (lamb, trust ratio on every parameter)",
    )
    lr: PositiveFloat = Field(1e-3, description="peak learning rate")
    weight_decay: Annotated[float, Field(ge=0)] = Field(
        0.01, description="not applied to bias and LayerNorm"
    )
    warmup_steps: NonNegativeInt = Field(20, description="linear warm-up steps")
    max_steps: PositiveInt = Field(200, description="optimizer steps of the whole schedule")
    steps_this_run: PositiveInt | None = Field(
        None, description="stop after this many steps in this run (unset = until max_steps)"
    )
    checkpoint_every: PositiveInt = Field(50, description="optimizer steps between checkpoints")
    keep_checkpoints: PositiveInt = Field(2, description="checkpoints kept (the newest)")
    preflight: bool = Field(
        True,
        description="check every node before the first step (device, a matmul against float64, an all-reduce, disk, /dev/shm, Neuron and EFA devices); a failing node stops the job naming the node and the check",
    )
    hang_timeout: Annotated[float, Field(ge=0)] | None = Field(
        None,
        description="seconds without a finished step before a worker counts as hung: its stacks are dumped and the job restarts from its last checkpoint (unset = max(300, 20x the slowest recent step); 0 = off)",
    )
    on_divergence: Literal["rollback", "stop", "off"] = Field(
        "rollback",
        description="a non-finite loss or gradient norm, or a loss spike: rollback (to the newest checkpoint from before it, skipping the batches that led there) | stop (exit, the last good checkpoint kept as newest) | off",
    )
    loss_spike: Annotated[float, Field(ge=0)] = Field(
        2.0,
        description="a step's loss above this many times the median of the last 50 counts as divergence (0 = only non-finite values)",
    )
    max_rollbacks: NonNegativeInt = Field(
        3, description="rollbacks allowed within rollback_window steps; one more stops the job"
    )
    rollback_window: PositiveInt = Field(
        1000, description="the steps over which max_rollbacks counts"
    )
    seed: NonNegativeInt = Field(12345, description="seed of weights, data order and dropout")
    compile: bool = Field(
        False, description="torch.compile (cpu/cuda) or the Neuron compile cache (xla)"
    )
    cacheset: str = Field(
        "default", pattern=CACHESET, description="compile cache under STORAGE/cache/"
    )

    @model_validator(mode="after")
    def _schedule(self) -> TrainSection:
        if self.warmup_steps >= self.max_steps:
            raise ValueError("warmup_steps must be below max_steps")
        if self.global_batch_size % self.batch_size:
            raise ValueError("global_batch_size must be a multiple of batch_size")
        return self


@dataclass(frozen=True)
class Derived:
    """Values computed once from the config; nobody recomputes them elsewhere."""

    world_size: int
    min_world_size: int
    grad_accum: int
    tokens_per_step: int
    instance: catalog.InstanceType
    config_hash: str
    # The hash as it was computed before max_steps left it: checkpoints written then still
    # belong to this job (with the max_steps they were written with).
    legacy_config_hash: str


class JobConfig(Section):
    job: JobSection = Field(default_factory=JobSection)
    rendezvous: RendezvousSection = Field(default_factory=RendezvousSection)
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection = Field(default_factory=DataSection)
    train: TrainSection = Field(default_factory=TrainSection)
    kubernetes: KubernetesSection = Field(default_factory=KubernetesSection)
    cluster: ClusterSection = Field(default_factory=ClusterSection)

    @cached_property
    def derived(self) -> Derived:
        """Checked and computed on first use; `jobfile.load` touches it so errors come early."""
        return derive(self)


def _check(ok: bool, where: str, message: str) -> None:
    from trainmaster.errors import ConfigError

    if not ok:
        raise ConfigError(message, where=where)


def instance_of(cfg: JobConfig) -> catalog.InstanceType:
    """The node type: the cluster's for kubernetes jobs, a generic CPU host for local ones."""
    if cfg.job.backend == "kubernetes":
        return catalog.get(cfg.kubernetes.instance_type, where="kubernetes.instance_type")
    return catalog.CATALOG["cpu"]


def derive(cfg: JobConfig) -> Derived:
    """Cross-section checks and derived values; raises ConfigError naming the field."""
    job, train = cfg.job, cfg.train
    inst = instance_of(cfg)
    # Validate the types the job names even when another backend runs it now.
    k8s_inst = catalog.get(cfg.kubernetes.instance_type, where="kubernetes.instance_type")
    if cfg.cluster.instance_type is not None:
        catalog.get(cfg.cluster.instance_type, where="cluster.instance_type")
        _check(
            cfg.cluster.instance_type == k8s_inst.name,
            "cluster.instance_type",
            f"{cfg.cluster.instance_type} differs from kubernetes.instance_type "
            f"{k8s_inst.name}: the job's pods would never be scheduled",
        )
    # A Spot node is reclaimed two minutes after its notice, whatever the pod's grace says, and
    # the drain starts a few seconds after the notice: a longer grace would let the node go
    # under a trainer still saving, instead of the trainer leaving saved.
    most = SPOT_NOTICE_S - 10
    _check(
        not cfg.cluster.spot or cfg.kubernetes.stop_grace_s <= most,
        "kubernetes.stop_grace_s",
        f"{cfg.kubernetes.stop_grace_s} s does not fit in the {SPOT_NOTICE_S} s a Spot node has "
        f"after its notice (cluster.spot); use at most {most}",
    )
    if job.backend == "kubernetes":
        refusal = catalog.device_refusal(inst, train.device)
        _check(refusal is None, "train.device", refusal or "")
        _check(
            job.nproc_per_node <= inst.max_workers,
            "job.nproc_per_node",
            f"{job.nproc_per_node} workers per node, but {inst.name} has {inst.max_workers} "
            f"{'cores' if inst.devices else 'vCPUs'}; use at most {inst.max_workers}",
        )
    min_nodes = job.min_nnodes or job.nnodes
    _check(
        min_nodes <= job.nnodes, "job.min_nnodes", f"{min_nodes} is above job.nnodes {job.nnodes}"
    )
    world = job.nnodes * job.nproc_per_node
    # [train], [model] and [data] configure the built-in trainer; a custom entrypoint's batch is
    # its own business (its arguments), so its job shape is not checked against them.
    builtin = job.builtin
    # Accumulation must divide exactly for every node count the job may run with, so that the
    # global batch (and with it the meaning of lr and max_steps) never silently changes.
    for nodes in range(min_nodes, job.nnodes + 1) if builtin else ():
        w = nodes * job.nproc_per_node
        per_step = train.batch_size * w
        _check(
            train.global_batch_size % per_step == 0,
            "train.global_batch_size",
            f"{train.global_batch_size} is not a multiple of batch_size x world size "
            f"({train.batch_size} x {w} = {per_step}"
            f"{f' with {nodes} nodes' if min_nodes != job.nnodes else ''}); "
            f"use a multiple of {per_step}",
        )
    _check(
        cfg.model.max_position_embeddings >= cfg.data.seq_len,
        "model.max_position_embeddings",
        f"{cfg.model.max_position_embeddings} is below data.seq_len {cfg.data.seq_len}",
    )
    return Derived(
        world_size=world,
        min_world_size=min_nodes * job.nproc_per_node,
        grad_accum=max(1, train.global_batch_size // (train.batch_size * world)) if builtin else 1,
        tokens_per_step=train.global_batch_size * cfg.data.seq_len,
        instance=inst,
        config_hash=config_hash(cfg),
        legacy_config_hash=config_hash(cfg, legacy=True),
    )


def config_hash(cfg: JobConfig, *, legacy: bool = False) -> str:
    """Hash of what decides the training result (model, data, schedule, seed, precision).

    Left out on purpose: where and how the job runs (backend, nodes, workers, micro-batch,
    steps_this_run, checkpoint cadence, compile, kubernetes, cluster), and max_steps: a job
    resumed with more steps (`launch --resume --set train.max_steps=N`), on more nodes or after
    a restart keeps its hash, and its learning rate decays to the new end from where it
    stopped (checkpoint.load_trainer); a checkpoint of another model or schedule shape (lr,
    warm-up, optimizer, batch) is refused. legacy: the hash as it was with max_steps in it.
    """
    model: dict[str, int | None] = {
        k: cfg.model.size(k)
        for k in ("num_layers", "hidden_size", "num_heads", "intermediate_size")
    }
    model |= {
        "vocab_size": cfg.model.vocab_size,
        "max_position_embeddings": cfg.model.max_position_embeddings,
    }
    t = cfg.train
    identity = {
        "name": cfg.job.name,
        "model": model,
        "data": cfg.data.model_dump(),
        "train": {
            "global_batch_size": t.global_batch_size,
            "optimizer": t.optimizer,
            "lr": t.lr,
            "weight_decay": t.weight_decay,
            "warmup_steps": t.warmup_steps,
            "seed": t.seed,
            "precision": t.precision,
        }
        | ({"max_steps": t.max_steps} if legacy else {}),
    }
    blob = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def is_valid_job_name(name: str) -> bool:
    return re.fullmatch(JOB_NAME, name) is not None
