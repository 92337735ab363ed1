"""Per-device compile cache settings, and what a cacheset holds (docs/architecture.md 3.3).

inductor/, triton/, neuron/ and xla/rankN/ under STORAGE/cache/CACHESET, never the compilers'
scratch (TMPDIR stays on the node). All pure functions of the device kind and the cacheset's
path: the local launcher, the Kubernetes pod spec and the trainer take the same values from
here. Why, with the upstream sources: docs/architecture.md, "The compile cache" (3.3).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # the preflight reads PRECOMPILE_MARK: no pydantic on a worker for that
    from trainmaster.config import JobConfig

Mechanism = Literal["inductor", "neuron", "xla"]
SUBDIRS: dict[Mechanism, tuple[str, ...]] = {
    "inductor": ("inductor", "triton"),
    "neuron": ("neuron",),
    "xla": ("xla",),
}
# The compiler flags of the Neuron BERT pretraining recipe, part of the compile fingerprint
# (compile/fingerprint.py): Neuron's cache key hashes the flags with the graph, so a graph
# compiled under other flags is a miss, and a fingerprint without them could call such a cache
# warm (optimum-neuron issue 457: flags missing from the cache key gave wrong cache hits).
# - --model-type=transformer: aws-neuron-samples
#   torch-neuronx/training/dp_bert_hf_pretrain/dp_bert_large_hf_pretrain_hdf5.py appends it to
#   NEURON_CC_FLAGS at import (transformer-specific scheduling in neuronx-cc, see
#   aws-neuron-sdk compiler/neuronx-cc/api-reference-guide/neuron-compiler-cli-reference-guide.rst).
# - --retry_failed_compilation: the same script at HEAD; neuronx-cc caches a failed compilation as
#   failed and, without it, later runs fail on that entry instead of compiling again (aws-neuron-sdk
#   frameworks/torch/torch-neuronx/api-reference-guide/training/pytorch-neuron-parallel-compile.rst).
NEURON_CC_OPTIONS = ("--model-type=transformer", "--retry_failed_compilation")
PRECOMPILE_WRAPPER = "neuron_parallel_compile"
CACHE_ENV = "TRAINMASTER_COMPILE_CACHE"  # the cacheset's path, for the trainer
LOCK_ENV = "TRAINMASTER_CACHE_LOCK"  # the token of the lock the launcher holds for this job


def mechanism(cfg: JobConfig, environ: Mapping[str, str] | None = None) -> Mechanism:
    """Which compiler cache a job uses, from train.device, the node type and PJRT_DEVICE."""
    environ = os.environ if environ is None else environ
    device: str = cfg.train.device
    if device == "auto":
        local = "xla" if environ.get("PJRT_DEVICE") else "cpu"
        device = cfg.derived.instance.device_kind if cfg.job.backend == "kubernetes" else local
    if device != "xla":
        return "inductor"
    if cfg.job.backend == "kubernetes":
        return "neuron" if cfg.derived.instance.neuron else "xla"
    pjrt = environ.get("PJRT_DEVICE", "").upper()
    return "xla" if pjrt and pjrt != "NEURON" else "neuron"


def env(kind: Mechanism, cache_dir: PurePath) -> dict[str, str]:
    """The environment of every worker of a compile job (train or precompile); no scratch."""
    if kind == "inductor":
        return {
            "TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "inductor"),
            "TRITON_CACHE_DIR": str(cache_dir / "triton"),
            "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
            "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
        }
    if kind == "neuron":
        neuron = str(cache_dir / "neuron")
        # --cache_dir in NEURON_CC_FLAGS wins over NEURON_COMPILE_CACHE_URL; both say the same.
        return {
            "NEURON_CC_FLAGS": " ".join((*NEURON_CC_OPTIONS, f"--cache_dir={neuron}")),
            "NEURON_COMPILE_CACHE_URL": neuron,
        }
    return {"XLA_PERSISTENT_CACHE_PATH": str(cache_dir / "xla")}


def worker_env(kind: Mechanism, cache_dir: PurePath, rank: int) -> dict[str, str]:
    """Per-process additions: torch_xla's persistent cache wants one path per process."""
    if kind == "xla":
        return {
            "XLA_PERSISTENT_CACHE_PATH": str(cache_dir / "xla" / f"rank{rank}"),
            "XLA_PERSISTENT_CACHE_READ_ONLY": "0",
        }
    return {}


# Set in every precompile job: its trial run's values are not checked (train/health.py), since
# under neuron_parallel_compile the outputs are invalid.
PRECOMPILE_MARK = "TRAINMASTER_PRECOMPILE"


def precompile_env(kind: Mechanism, cache_dir: PurePath) -> dict[str, str]:
    """The precompile job's environment: the job's, plus neuron_parallel_compile's settings."""
    out = env(kind, cache_dir) | {PRECOMPILE_MARK: "1"}
    if kind == "neuron":
        out |= {
            # The trial run computes with placeholder values: a failed check of the script
            # (a loss, a norm) must not stop the graphs it extracted from being compiled.
            "NEURON_IGNORE_TRAINING_SCRIPT_ERROR_AND_COMPILE": "1",
            # One retry of a graph whose compilation failed (default 0: cached as failed).
            "NEURON_PARALLEL_COMPILE_MAX_RETRIES": "1",
        }
    return out


def precompile_command(kind: Mechanism, torchrun: list[str]) -> list[str]:
    """The precompile job's command: the job's own torchrun command, wrapped on Neuron."""
    return [PRECOMPILE_WRAPPER, *torchrun] if kind == "neuron" else list(torchrun)


def dirs_to_make(kind: Mechanism, cache_dir: Path) -> list[Path]:
    return [cache_dir / sub for sub in SUBDIRS[kind]]


def entries(cache_dir: Path) -> dict[str, int]:
    """Files per compiler folder (.lock and fingerprint.json are not entries)."""
    out: dict[str, int] = {}
    for sub in ("inductor", "triton", "neuron", "xla"):
        folder = cache_dir / sub
        if folder.is_dir():
            out[sub] = sum(len(files) for _, _, files in os.walk(folder))
    return out


def size_bytes(cache_dir: Path) -> int:
    total = 0
    for root, _, files in os.walk(cache_dir):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def has_entries(cache_dir: Path, kind: Mechanism) -> bool:
    counts = entries(cache_dir)
    return any(counts.get(sub, 0) > 0 for sub in SUBDIRS[kind])
