"""Helpers of the trainer tests: job files in run folders, real torchrun agents, their leftovers.

Jobs run exactly as the launcher runs them: the torchrun command line comes from
trainmaster.launch.torchrun (the builder both backends use), one agent per node.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainmaster.backends.local import rendezvous
from trainmaster.config import jobfile
from trainmaster.data import shards as fmt
from trainmaster.launch.torchrun import Rendezvous, command

# Every run: one thread per worker (2 cores), a short bounded collective timeout, and the
# output unbuffered so a failure shows what happened.
RUN_ENV = {"OMP_NUM_THREADS": "1", "TRAINMASTER_DIST_TIMEOUT_S": "60", "PYTHONUNBUFFERED": "1"}


def make_job(storage: Path, name: str, *sets: str, nnodes: int = 1, nproc: int = 2) -> Path:
    """STORAGE/runs/NAME/job.toml: the local-cpu preset (bert-tiny on pydoc) with overrides."""
    base = [
        f'job.name="{name}"',
        f"job.nnodes={nnodes}",
        f"job.nproc_per_node={nproc}",
        "job.max_restarts=0",
        "train.batch_size=4",
        "train.global_batch_size=16",
        "train.warmup_steps=5",
        "train.max_steps=60",
        "train.checkpoint_every=25",
        "train.keep_checkpoints=2",
    ]
    cfg = jobfile.preset("local-cpu", [*base, *sets])
    path = storage / "runs" / name / "job.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(jobfile.render(cfg, f"test job {name}"), encoding="utf-8")
    return path


@dataclass
class Result:
    codes: list[int]
    output: str  # every agent's stdout and stderr, agent after agent

    @property
    def ok(self) -> bool:
        return all(c == 0 for c in self.codes)

    def error_lines(self) -> list[str]:
        """The trainer's `error: ...` lines (torchrun's --tee prefixes them with the rank)."""
        return [
            line.split("]:", 1)[-1] if "]:" in line else line
            for line in self.output.splitlines()
            if "error: " in line
        ]


def torchrun(
    job: Path, storage: Path, *, timeout: float = 180, env: dict[str, str] | None = None
) -> Result:
    """Run the job's torchrun agents (one per node, c10d on a free loopback port) to the end."""
    cfg = jobfile.load(job)
    rdzv = Rendezvous("c10d", f"{rendezvous.LOOPBACK}:{rendezvous.free_port()}")
    cmd = command(cfg, rdzv, job_file=str(job), storage=str(storage), python=sys.executable)
    full_env = {**os.environ, **RUN_ENV, **(env or {})}
    agents = [
        subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=full_env,
            start_new_session=True,
        )
        for _ in range(cfg.job.nnodes)
    ]
    outputs = []
    try:
        for agent in agents:
            out, _ = agent.communicate(timeout=timeout)
            outputs.append(out)
    finally:  # after a timeout: end what this call started (agents, then their workers)
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
        for pid in processes_mentioning(str(job)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return Result([a.returncode for a in agents], "\n".join(outputs))


def trainer(
    job: Path,
    storage: Path,
    *,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    extra: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """One worker started by hand (no torchrun): a world of 1."""
    full_env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    }
    full_env |= {**RUN_ENV, **(env or {})}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "trainmaster.train",
            "--job",
            str(job),
            "--storage",
            str(storage),
            *extra,
        ],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains text (e.g. a job file's path)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if text in cmdline and ") Z " not in stat:  # zombies are gone already
            found.append(int(entry.name))
    return found


def metrics(job: Path) -> list[dict[str, Any]]:
    path = job.parent / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def summary(job: Path) -> dict[str, Any]:
    return json.loads((job.parent / "summary.json").read_text())


def copy_dataset(
    src: Path, dst: Path, shards: list[int] | None = None, rows: int | None = None
) -> Path:
    """A copy of a dataset that a test may damage: some of its shards (renumbered), and only
    their first `rows` sequences if given (small shards reach the next file round sooner)."""
    dst.mkdir(parents=True)
    files = fmt.list_shards(src)
    chosen = files if shards is None else [files[i] for i in shards]
    for k, path in enumerate(chosen):
        if rows is None:
            shutil.copy(path, dst / f"copy_training_{k}.hdf5")
        else:
            fmt.write_shard(dst / f"copy_training_{k}.hdf5", fmt.read_arrays(path, slice(0, rows)))
    shutil.copy(src / "vocab.txt", dst / "vocab.txt")
    return dst
