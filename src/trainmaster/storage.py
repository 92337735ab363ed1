"""The storage layout (docs/architecture.md 3.3): every path under STORAGE is computed here and
nowhere else; docs/architecture.md 3.10 lists the files of a run folder and who writes them.

Storage is a directory: a local folder on one machine, the FSx for Lustre volume mounted at
/data in the cluster's pods. Which one is used: --storage, else the job file's job.storage,
else $TRAINMASTER_STORAGE, else ./trainmaster-data.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from trainmaster.errors import UserError

ENV_VAR = "TRAINMASTER_STORAGE"
DEFAULT_ROOT = "trainmaster-data"
SHARD_GLOB = "*_training_*.hdf5"
# The folders under STORAGE. A pod's paths are these under kubernetes.mount (PurePosixPath).
RUNS, DATASETS, CACHES = "runs", "datasets", "cache"


def resolve_root(cli: str | os.PathLike[str] | None = None, job: str | None = None) -> Path:
    """Pick the storage root by the documented precedence."""
    for candidate in (cli, job, os.environ.get(ENV_VAR)):
        if candidate:
            return Path(candidate).expanduser()
    return Path(DEFAULT_ROOT)


@dataclass(frozen=True)
class Storage:
    root: Path

    @classmethod
    def at(cls, cli: str | os.PathLike[str] | None = None, job: str | None = None) -> Storage:
        return cls(resolve_root(cli, job))

    # datasets/NAME/: NAME_training_K.hdf5 ..., vocab.txt, dataset.json
    def dataset_dir(self, name: str) -> Path:
        return self.root / DATASETS / name

    # cache/CACHESET/: compiler caches, fingerprint.json, .lock
    @property
    def caches(self) -> Path:
        return self.root / CACHES

    def cache_dir(self, cacheset: str) -> Path:
        return self.caches / cacheset

    # runs/JOB/: job.toml, state.json, logs/, checkpoints/, tensorboard/, metrics.jsonl, ...
    @property
    def runs(self) -> Path:
        return self.root / RUNS

    def run_dir(self, job: str) -> Path:
        return self.runs / job

    def ensure_writable(self) -> Path:
        """Create the root if needed and prove we can write to it (fail early, not hours in)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".write-probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise UserError(
                f"storage is not writable ({exc.strerror}); pass --storage PATH or set ${ENV_VAR}",
                where=str(self.root),
            ) from exc
        return self.root


@dataclass(frozen=True)
class RunPaths:
    """Files of one run (runs/JOB/)."""

    dir: Path

    @property
    def job_toml(self) -> Path:
        return self.dir / "job.toml"

    @property
    def state(self) -> Path:
        return self.dir / "state.json"

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    @property
    def checkpoints(self) -> Path:
        return self.dir / "checkpoints"

    @property
    def tensorboard(self) -> Path:
        return self.dir / "tensorboard"

    @property
    def metrics(self) -> Path:
        return self.dir / "metrics.jsonl"

    @property
    def timeline(self) -> Path:
        """rank 0's events for goodput (run/timeline.py): never truncated, unlike metrics.jsonl."""
        return self.dir / "timeline.jsonl"

    @property
    def hangs(self) -> Path:
        """One JSON line per hang the workers' watchdogs caught (train/watchdog.py)."""
        return self.dir / "hangs.jsonl"

    @property
    def heartbeats(self) -> Path:
        """One folder per attempt of the trainer, a file per node that its local rank 0 rewrites
        every few seconds: how the nodes see that a peer stopped answering (run/peers.py)."""
        return self.dir / "heartbeats"

    @property
    def fence(self) -> Path:
        """The attempt that holds the run now (run/peers.py): an older one may not write."""
        return self.dir / "fence"

    @property
    def rollbacks(self) -> Path:
        """One JSON line per divergence the trainer met: rolled back or stopped (run/divergence.py)."""
        return self.dir / "rollbacks.jsonl"

    @property
    def preemptions(self) -> Path:
        """One JSON line per SIGTERM honoured with a checkpoint (train/preempt.py)."""
        return self.dir / "preemptions.jsonl"

    @property
    def summary(self) -> Path:
        return self.dir / "summary.json"

    @property
    def finished(self) -> Path:
        """Locally, a custom script's workers whose script returned: one file per node and
        local rank, nodeN.L (launch/entry.py), for the supervisor (backends/local/completion.py)."""
        return self.dir / "finished"

    @property
    def rank0(self) -> Path:
        return self.dir / "rank0.json"

    @property
    def report_png(self) -> Path:
        return self.dir / "report.png"


def dataset_path(storage: Storage, dataset: str) -> Path:
    """A dataset is a name under STORAGE/datasets, or a path (absolute, or containing '/')."""
    if os.sep in dataset or dataset.startswith("."):
        return Path(dataset).expanduser()
    return storage.dataset_dir(dataset)
