"""The compile fingerprint: everything that changes the compiled graphs, in fingerprint.json.

Compiler caches are content-addressed, so a job whose shape differs from the precompiled one
silently compiles everything again (on Trainium ~40 minutes); `launch` compares fingerprints
first and names the differing fields. Not in it: lr, schedule, seed, steps, the job's name,
checkpointing (they do not change graphs). What is in it, and why: docs/architecture.md, "The
compile cache" (3.3).
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainmaster import files
from trainmaster.compile import cache
from trainmaster.config import DEFAULT_VOCAB, JobConfig
from trainmaster.errors import UserError
from trainmaster.storage import Storage, dataset_path

FILE = "fingerprint.json"
SCHEMA = 1
Value = str | int | None

# fingerprint key -> distribution name on PyPI
DISTRIBUTIONS = {
    "versions.torch": "torch",
    "versions.torch_xla": "torch-xla",
    "versions.torch_neuronx": "torch-neuronx",
    "versions.neuronx_cc": "neuronx-cc",
    "versions.triton": "triton",
    "versions.transformers": "transformers",
}


def versions() -> dict[str, Value]:
    """Installed versions of the compiler stack (None = not installed), without importing it."""
    out: dict[str, Value] = {"versions.python": ".".join(platform.python_version_tuple()[:2])}
    for key, dist in DISTRIBUTIONS.items():
        try:
            out[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[key] = None
    return out


def device_of(cfg: JobConfig) -> str:
    """train.device as far as the config decides it (`auto` on a local machine stays auto)."""
    if cfg.train.device != "auto":
        return cfg.train.device
    if cfg.job.backend == "kubernetes":
        return cfg.derived.instance.device_kind
    return "auto"


def vocab_size_for(cfg: JobConfig, store: Storage) -> int:
    """The model's vocabulary as the trainer will size it (model.vocab_size, else vocab.txt)."""
    if cfg.model.vocab_size is not None:
        return cfg.model.vocab_size
    path = dataset_path(store, cfg.data.dataset) / "vocab.txt"
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return sum(1 for _ in f)
    except OSError:
        return DEFAULT_VOCAB


def compute(
    cfg: JobConfig, vocab_size: int, *, installed: dict[str, Value] | None = None
) -> dict[str, Value]:
    """The fingerprint of a job: flat `field -> value`, fields named as in the job file."""
    m, t, d = cfg.model, cfg.train, cfg.derived
    device = device_of(cfg)
    fields: dict[str, Value] = {
        k: m.size(k) for k in ("num_layers", "hidden_size", "num_heads", "intermediate_size")
    }
    fields = {f"model.{k}": v for k, v in fields.items()}
    fields |= {
        "model.vocab_size": vocab_size,
        "model.max_position_embeddings": m.max_position_embeddings,
        "data.seq_len": cfg.data.seq_len,
        "data.max_pred": cfg.data.max_pred,
        "train.batch_size": t.batch_size,
        "train.precision": t.precision,
        "train.optimizer": t.optimizer,
        "train.device": device,
        "job.nnodes": cfg.job.nnodes,
        "job.nproc_per_node": cfg.job.nproc_per_node,
        "world_size": d.world_size,
        "instance_type": d.instance.name,
    }
    if device == "xla":
        fields["grad_accum"] = d.grad_accum
        fields["neuron_cc_flags"] = " ".join(cache.NEURON_CC_OPTIONS)
    return fields | (versions() if installed is None else installed)


@dataclass(frozen=True)
class Difference:
    field: str
    saved: Value
    current: Value

    def __str__(self) -> str:
        return f"{self.field} {_show(self.saved)} in the cache, {_show(self.current)} now"


def _show(value: Value) -> str:
    return "(none)" if value is None else str(value)


def compare(saved: dict[str, Value], current: dict[str, Value]) -> list[Difference]:
    """The fields whose values differ (a field only one side has counts as differing)."""
    keys = list(current) + [k for k in saved if k not in current]
    return [
        Difference(k, saved.get(k), current.get(k)) for k in keys if saved.get(k) != current.get(k)
    ]


@dataclass(frozen=True)
class Saved:
    """fingerprint.json: the fields and who wrote them (the last job that compiled here)."""

    fields: dict[str, Value]
    job: str
    written_at: float
    host: str

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "job": self.job,
            "written_at": self.written_at,
            "host": self.host,
            "fields": self.fields,
        }


def path_of(cache_dir: Path) -> Path:
    return cache_dir / FILE


def read(cache_dir: Path) -> Saved | None:
    """The saved fingerprint, None when there is none; UserError when it is unreadable."""
    path = path_of(cache_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UserError(
            f"unreadable ({type(exc).__name__}); run `trainmaster precompile` again "
            "to rewrite it, or `trainmaster cache clear`",
            where=str(path),
        ) from exc
    if (
        not isinstance(data, dict)
        or data.get("schema") != SCHEMA
        or not isinstance(data.get("fields"), dict)
    ):
        raise UserError(
            f"not a fingerprint of schema {SCHEMA}; run `trainmaster precompile` "
            "again to rewrite it",
            where=str(path),
        )
    return Saved(
        fields=dict(data["fields"]),
        job=str(data.get("job", "?")),
        written_at=float(data.get("written_at", 0.0)),
        host=str(data.get("host", "?")),
    )


def write(cache_dir: Path, fields: dict[str, Value], job: str) -> Saved:
    """Write fingerprint.json atomically (temporary name, fsync, rename)."""
    saved = Saved(fields=dict(fields), job=job, written_at=time.time(), host=socket.gethostname())
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = path_of(cache_dir)
    files.write_json(path, saved.to_json())
    return saved
