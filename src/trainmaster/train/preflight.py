"""Everything a worker checks and decides before it imports torch or joins the process group.

Each rank runs this on its own and reaches the same answers (they read the same files), so
bad input stops every rank with the same `error:` line within a second of starting, and no
rank is left waiting in a collective for a peer that already exited. Rank 0 confirms the
resume decision after the process group is up (see trainsetup.py).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from trainmaster.compile import cache, fingerprint
from trainmaster.config import DEFAULT_VOCAB, JobConfig, jobfile
from trainmaster.errors import ConfigError, UserError
from trainmaster.run import checkpoints
from trainmaster.storage import RunPaths, Storage, dataset_path
from trainmaster.train import dataset
from trainmaster.train.dataset import Position, ShardInfo
from trainmaster.train.env import Env

CacheState = Literal["off", "cold", "warm"]
CACHE_ENV = cache.CACHE_ENV


@dataclass(frozen=True)
class Plan:
    """What this worker will do; frozen: a change of mind (rank 0 resumes elsewhere) is a new plan."""

    cfg: JobConfig
    env: Env
    storage: Storage
    run: RunPaths
    dataset: Path
    shards: list[ShardInfo]
    vocab_size: int
    grad_accum: int
    resume: checkpoints.Checkpoint | None
    position: Position  # where this rank's data starts
    first_shard: dict[str, np.ndarray]  # the shard at `position`, loaded and checked
    compile: bool
    compile_cache: Path | None
    cache_state: CacheState
    notes: list[str]  # warnings for the log

    def resuming_from(self, resume: checkpoints.Checkpoint | None) -> Plan:
        """The plan for another resume point (rank 0's choice, trainsetup.py): its data position,
        and no preloaded shard (the loader loads the one at the new position)."""
        position = (
            Position()
            if resume is None
            else resume_position(resume, self.env, self.shards, self.notes)
        )
        return dataclasses.replace(self, resume=resume, position=position, first_shard={})


def grad_accum_for(cfg: JobConfig, env: Env) -> int:
    """Check WORLD_SIZE against the job and derive the accumulation that keeps the global batch."""
    d, job, t = cfg.derived, cfg.job, cfg.train
    w = env.world_size
    elastic = f" (min_nnodes {job.min_nnodes})" if job.min_nnodes else ""
    shape = f"job.nnodes = {job.nnodes}{elastic} x job.nproc_per_node = {job.nproc_per_node}"
    if not env.launched and d.min_world_size > 1:
        raise UserError(
            f"this job needs {d.min_world_size}+ workers ({shape}); start it with "
            "`trainmaster launch` (torchrun), not by hand",
            where="WORLD_SIZE",
        )
    if not d.min_world_size <= w <= d.world_size or w % job.nproc_per_node:
        fewest = d.min_world_size // job.nproc_per_node
        allowed = [n * job.nproc_per_node for n in range(fewest, job.nnodes + 1)]
        raise UserError(
            f"torchrun started {w} workers, but the job allows "
            f"{', '.join(map(str, allowed))} ({shape}); launch it with the job's "
            "torchrun command (trainmaster launch)",
            where="WORLD_SIZE",
        )
    if env.launched and env.local_world_size != job.nproc_per_node:
        raise UserError(
            f"{env.local_world_size} workers on this node, but job.nproc_per_node is "
            f"{job.nproc_per_node}",
            where="LOCAL_WORLD_SIZE",
        )
    per_step = t.batch_size * w
    if t.global_batch_size % per_step:
        raise ConfigError(
            f"{t.global_batch_size} is not a multiple of batch_size x world size "
            f"({t.batch_size} x {w})",
            where="train.global_batch_size",
        )
    return t.global_batch_size // per_step


def check_run_dir(run: RunPaths) -> None:
    """Create the run's folders and prove this process can write there (fail now, not at step N)."""
    probe_name = f".probe-{socket.gethostname()}-{os.getpid()}"
    for folder in (run.dir, run.checkpoints, run.tensorboard):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe = folder / probe_name
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise UserError(
                f"the run folder is not writable ({exc.strerror or exc}); check the "
                "storage's permissions and free space, or pass --storage",
                where=str(folder),
            ) from exc


def vocab_size_for(cfg: JobConfig, folder: Path) -> int:
    """vocab.txt's size; an explicit model.vocab_size may pad it (never shrink it); else 30522."""
    lines = dataset.vocab_lines(folder)
    if cfg.model.vocab_size is not None:
        if lines is not None and cfg.model.vocab_size < lines:
            raise ConfigError(
                f"{cfg.model.vocab_size}, below the {lines} tokens of "
                f"{folder / 'vocab.txt'}; leave it unset to use the vocabulary's "
                "size",
                where="model.vocab_size",
            )
        return cfg.model.vocab_size
    return lines or DEFAULT_VOCAB


def resume_position(
    ckpt: checkpoints.Checkpoint, env: Env, shards: list[ShardInfo], notes: list[str]
) -> Position:
    """This rank's saved position; an approximation when the world size or shard set changed."""
    meta = ckpt.meta
    positions = [Position.of(p) for p in meta.get("positions", [[0, 0, 0]])]
    names = [s.path.name for s in shards]
    if meta.get("world_size") == env.world_size and meta.get("files") == names:
        return positions[env.rank]
    first = positions[0]
    old_world = int(meta.get("world_size") or 1)
    rnd = first.round * old_world // env.world_size
    notes.append(
        f"the checkpoint was written by {old_world} workers on {len(meta.get('files', []))} "
        f"shards, now {env.world_size} on {len(names)}: data resumes at the start of "
        f"epoch {first.epoch} round {rnd}, not at the exact sample"
    )
    return Position(
        first.epoch, min(rnd, dataset.rounds_per_epoch(len(names), env.world_size) - 1), 0
    )


def compile_cache(
    cfg: JobConfig,
    store: Storage,
    enabled: bool,
    environ: Mapping[str, str],
    vocab_size: int,
    notes: list[str],
) -> tuple[Path | None, CacheState]:
    """The cacheset (STORAGE/cache/CACHESET, or $TRAINMASTER_COMPILE_CACHE) and what it holds:
    warm when its fingerprint is this job's and it has compiled graphs, else cold."""
    if not enabled:
        return None, "off"
    path = Path(environ.get(CACHE_ENV) or store.cache_dir(cfg.train.cacheset))
    saved = fingerprint.read(path)
    if saved is None:
        return path, "cold"
    diffs = fingerprint.compare(saved.fields, fingerprint.compute(cfg, vocab_size))
    if diffs:
        notes.append(
            f"compile cache {path.name} was filled for another job shape (job "
            f"{saved.job}): {'; '.join(map(str, diffs))}; compiling from scratch"
        )
        return path, "cold"
    return path, "warm" if cache.has_entries(path, cache.mechanism(cfg, environ)) else "cold"


def make_plan(
    job_file: str | Path,
    storage_arg: str | None,
    *,
    compile_flag: bool = False,
    environ: Mapping[str, str] = os.environ,
) -> Plan:
    cfg = jobfile.load(job_file)
    env = Env.read(environ)
    grad_accum = grad_accum_for(cfg, env)
    store = Storage.at(storage_arg, cfg.job.storage)
    run = RunPaths(Path(job_file).resolve().parent)
    check_run_dir(run)
    folder = dataset_path(store, cfg.data.dataset)
    shards = dataset.check_dataset(
        folder,
        seq_len=cfg.data.seq_len,
        max_pred=cfg.data.max_pred,
        world=env.world_size,
        batch_size=cfg.train.batch_size,
    )
    vocab = vocab_size_for(cfg, folder)
    notes: list[str] = []
    resume = checkpoints.latest(run.checkpoints)
    position = Position()
    if resume is not None:
        checkpoints.check_owner(
            resume,
            config_hash=cfg.derived.config_hash,
            job=cfg.job.name,
            folder=run.checkpoints,
            legacy=cfg.derived.legacy_config_hash,
        )
        if resume.meta.get("vocab_size") != vocab:
            raise UserError(
                f"{resume.path.name} holds a model with {resume.meta.get('vocab_size')} "
                f"token ids, but the dataset's vocabulary now has {vocab}: the dataset "
                "was made again with another vocabulary; restore it or start a new job",
                where=str(resume.path),
            )
        position = resume_position(resume, env, shards, notes)
    path = dataset.file_for(
        [s.path for s in shards],
        seed=cfg.train.seed,
        epoch=position.epoch,
        rnd=position.round,
        rank=env.rank,
        world=env.world_size,
    )
    first = dataset.load_shard(path, vocab)
    enabled = compile_flag or cfg.train.compile
    cache_path, state = compile_cache(cfg, store, enabled, environ, vocab, notes)
    return Plan(
        cfg=cfg,
        env=env,
        storage=store,
        run=run,
        dataset=folder,
        shards=shards,
        vocab_size=vocab,
        grad_accum=grad_accum,
        resume=resume,
        position=position,
        first_shard=first,
        compile=enabled,
        compile_cache=cache_path,
        cache_state=state,
        notes=notes,
    )
