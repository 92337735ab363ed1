"""Bad input ends every worker with one clear line and exit code 2, and nothing is left running.

Single workers are started by hand (exit code 2 is the trainer's own); multi-worker cases run
under torchrun, which exits 1 when a worker fails: there the checks are the error line, that
torchrun returns in bounded time, and that no worker process survives it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.conftest import assert_user_error
from tests.train.helpers import (
    RUN_ENV,
    Result,
    copy_dataset,
    make_job,
    processes_mentioning,
    torchrun,
    trainer,
)
from trainmaster.config import jobfile
from trainmaster.train import dataset

PYDOC = Path("datasets") / "pydoc"


def assert_all_gone(job: Path) -> None:
    assert not processes_mentioning(str(job)), "workers survived torchrun"


# --- one worker -----------------------------------------------------------------------------


def test_seq_len_other_than_the_shards(pydoc_storage: Path) -> None:
    job = make_job(pydoc_storage, "bad-seq-len", "data.seq_len=64", nproc=1)
    result = trainer(job, pydoc_storage)
    line = assert_user_error(result)
    assert "data.seq_len: 64" in line and "sequences of 128 tokens" in line
    assert "pydoc_training_" in line


def test_truncated_shard_is_named(pydoc_storage: Path, tmp_path: Path) -> None:
    data = copy_dataset(pydoc_storage / PYDOC, tmp_path / "truncated")
    shard = data / "copy_training_2.hdf5"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    job = make_job(pydoc_storage, "bad-truncated", f'data.dataset="{data}"', nproc=1)
    result = trainer(job, pydoc_storage)
    line = assert_user_error(result)
    assert str(shard) in line and "truncated or corrupt" in line


def test_unwritable_run_folder(pydoc_storage: Path, tmp_path: Path) -> None:
    job = make_job(pydoc_storage, "bad-run-folder", nproc=1)
    (job.parent / "checkpoints").write_text("a file where the checkpoints folder goes")
    result = trainer(job, pydoc_storage)
    line = assert_user_error(result)
    assert str(job.parent / "checkpoints") in line and "not writable" in line


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permissions")
def test_read_only_run_folder(pydoc_storage: Path) -> None:
    job = make_job(pydoc_storage, "read-only-run", nproc=1)
    job.parent.chmod(0o555)
    try:
        result = trainer(job, pydoc_storage)
    finally:
        job.parent.chmod(0o755)
    assert_user_error(result, "not writable")


def test_checkpoint_of_another_configuration(pydoc_storage: Path) -> None:
    job = make_job(pydoc_storage, "bad-owner", nproc=1)
    step = job.parent / "checkpoints" / "step_5"
    step.mkdir(parents=True)
    (step / "meta.json").write_text(
        '{"step": 5, "job": "bad-owner", "config_hash": "feedfacefeedface"}'
    )
    result = trainer(job, pydoc_storage)
    line = assert_user_error(result)
    assert "feedfacefeedface" in line and "new job.name" in line and "delete" in line


# --- under torchrun, 2 workers --------------------------------------------------------------


@pytest.mark.slow
def test_fewer_shards_than_workers(pydoc_storage: Path, tmp_path: Path) -> None:
    data = copy_dataset(pydoc_storage / PYDOC, tmp_path / "one-shard", shards=[0])
    job = make_job(pydoc_storage, "bad-few-shards", f'data.dataset="{data}"')
    result = torchrun(job, pydoc_storage, timeout=120)
    assert result.codes == [1]
    lines = result.error_lines()
    assert len(lines) == 2  # every worker says it
    assert all(f"{data}: 1 shards for 2 workers" in line for line in lines)
    assert "exitcode  : 2" in result.output  # torchrun's report of the worker's own code
    assert_all_gone(job)


@pytest.mark.slow
def test_token_ids_outside_the_vocabulary(pydoc_storage: Path, tmp_path: Path) -> None:
    data = copy_dataset(pydoc_storage / PYDOC, tmp_path / "big-ids", shards=[0, 1])
    shard = data / "copy_training_1.hdf5"
    with h5py.File(shard, "r+") as f:
        ids = np.asarray(f["input_ids"])
        ids[3, 5] = 4096  # the vocabulary has 4096 ids: 0..4095
        f["input_ids"][...] = ids
    job = make_job(pydoc_storage, "bad-ids", f'data.dataset="{data}"')
    result = torchrun(job, pydoc_storage, timeout=120)
    assert result.codes == [1]
    lines = result.error_lines()
    assert lines and all(str(shard) in line and "token id 4096" in line for line in lines)
    assert_all_gone(job)


@pytest.mark.slow
def test_corrupt_shard_found_mid_run(pydoc_storage: Path, tmp_path: Path) -> None:
    """Damage inside a shard's compressed data passes the header check; the worker that loads
    it (in its second file round, after training has begun) names it, and all workers end."""
    data = copy_dataset(pydoc_storage / PYDOC, tmp_path / "corrupt", rows=24)
    job = make_job(
        pydoc_storage,
        "bad-corrupt",
        f'data.dataset="{data}"',
        "train.batch_size=8",
        "train.global_batch_size=16",
        "train.max_steps=100",
    )
    cfg = jobfile.load(job)
    files = sorted(data.glob("*_training_*.hdf5"))
    victim = dataset.file_for(files, seed=cfg.train.seed, epoch=0, rnd=1, rank=0, world=2)
    with h5py.File(victim, "r") as f:
        chunk = f["input_ids"].id.get_chunk_info(0)
    with open(victim, "r+b") as f:
        f.seek(chunk.byte_offset + chunk.size // 3)
        f.write((bytes(range(256)) * 8)[: chunk.size // 3])  # inside the chunk only
    assert dataset.check_header(victim, 128, 20) > 0  # the header still reads
    result = torchrun(job, pydoc_storage, timeout=150)
    assert result.codes == [1]
    assert "step 3 " in result.output  # training had gone through the first shard
    lines = result.error_lines()
    assert lines and str(victim) in lines[0] and "truncated or corrupt" in lines[0]
    assert_all_gone(job)


@pytest.mark.slow
def test_world_size_the_job_does_not_allow(pydoc_storage: Path) -> None:
    job = make_job(pydoc_storage, "bad-world", nproc=1)  # a 1-worker job started with 2
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "--max-restarts=0",
        "--monitor-interval=1",
        "--tee=3",
        "-m",
        "trainmaster.train",
        "--job",
        str(job),
        "--storage",
        str(pydoc_storage),
    ]
    run = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, env={**os.environ, **RUN_ENV}
    )
    result = Result([run.returncode], run.stdout + run.stderr)
    assert result.codes == [1]
    lines = result.error_lines()
    assert len(lines) == 2 and all(
        "WORLD_SIZE: torchrun started 2 workers" in line for line in lines
    )
    assert_all_gone(job)
