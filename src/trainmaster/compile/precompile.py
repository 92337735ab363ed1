"""The precompile job, and the check a compile job makes before it starts.

The precompile job is the job itself (model, micro-batch, precision, optimizer, world size,
backend) run for a few steps (train.steps_this_run) in compile mode under the name
`<job>-precompile`: its own run folder, the job's cacheset. Because it is the same job, the
graphs it compiles are the graphs the job needs, and the fingerprint its rank 0 writes into
the cacheset is the one `launch` compares. On Neuron its torchrun command runs under
`neuron_parallel_compile` (cache.precompile_command).

Running it is the launchers' business (backends/local/precompile.py); this module is pure, so both
backends and the trainer agree on what a precompile job is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from trainmaster.compile import cache, fingerprint
from trainmaster.config import JobConfig, is_valid_job_name, jobfile
from trainmaster.errors import UserError
from trainmaster.storage import RunPaths, Storage

SUFFIX = "-precompile"
DEFAULT_STEPS = 10  # the tutorial's precompile ran 10 steps
JOB_NAME_MAX = 40  # config.JOB_NAME


def precompile_name(job: str) -> str:
    name = job + SUFFIX
    if len(name) > JOB_NAME_MAX or not is_valid_job_name(name):
        raise UserError(
            f"{job!r} is too long for its precompile job {name!r}: job names have at "
            f"most {JOB_NAME_MAX} characters, so use at most "
            f"{JOB_NAME_MAX - len(SUFFIX)}",
            where="job.name",
        )
    return name


def precompile_config(cfg: JobConfig, steps: int = DEFAULT_STEPS) -> JobConfig:
    """The same job under `<job>-precompile`, `steps` steps, compile on; the same cacheset.

    No restarts (docs/architecture.md 5: 12.8): a precompile run that fails fails the same way
    again (a compiler error, a bad shape), so torchrun's restarts only repeat the trial run and
    its graph extraction; neuron_parallel_compile already retries the compilation of a failed
    graph (cache.precompile_env). The job's own max_restarts stays what it was for the job.
    """
    if steps < 1:
        raise UserError(f"must be at least 1 (got {steps})", where="--steps")
    if not cfg.job.builtin:
        # The warm-cache check reads the fingerprint the built-in trainer's rank 0 writes; a
        # custom script writes none, so a precompile of it could never be judged. Its graphs
        # still land in the shared cache on its first launch (the cache env is the same).
        raise UserError(
            f"precompile runs the built-in trainer only, not {cfg.job.entrypoint!r}: "
            "launch the job itself (its first run fills the shared compile cache)",
            where="job.entrypoint",
        )
    data = cfg.model_dump(mode="json")
    data["job"]["name"] = precompile_name(cfg.job.name)
    data["job"]["max_restarts"] = 0
    data["train"]["compile"] = True
    data["train"]["steps_this_run"] = min(steps, cfg.train.max_steps)
    return jobfile.validate(data, where="precompile job")


@dataclass(frozen=True)
class Expectation:
    state: Literal["cold", "warm"]
    message: str


def expect(
    cfg: JobConfig, store: Storage, *, installed: dict[str, fingerprint.Value] | None = None
) -> Expectation:
    """What a compile job will find in its cacheset; UserError when the fingerprint differs.

    A differing fingerprint means the cache holds another job's graphs: the job would compile
    everything while the user believes it is warm (on Trainium: a node busy compiling makes
    the others time out). So it is refused before anything starts, naming the fields.
    """
    name = cfg.train.cacheset
    folder = store.cache_dir(name)
    saved = fingerprint.read(folder)
    current = fingerprint.compute(cfg, fingerprint.vocab_size_for(cfg, store), installed=installed)
    if saved is None:
        return Expectation(
            "cold",
            f"compile cache cold ({name}): nothing precompiled for this "
            "job yet, its first steps compile (`trainmaster precompile` fills "
            "the cache ahead)",
        )
    diffs = fingerprint.compare(saved.fields, current)
    if diffs:
        raise UserError(
            f"compile cache {name} holds the graphs of another job shape (written by job "
            f"{saved.job}): {'; '.join(map(str, diffs))}. Run `trainmaster precompile` with "
            "this job file to compile for it, or use another cacheset (--set "
            "train.cacheset=NAME)",
            where="train.cacheset",
        )
    if not cache.has_entries(folder, cache.mechanism(cfg)):
        return Expectation(
            "cold",
            f"compile cache cold ({name}): the fingerprint matches but "
            "the cache holds no compiled graphs",
        )
    return Expectation("warm", f"compile cache warm ({name})")


def outcome(store: Storage, pre: JobConfig) -> dict[str, Any]:
    """What a finished local precompile run left: the proof that the cache is warm for the job.

    JSON-ready: the run's status and time to first step, the compiler's counters (rank 0's),
    the fingerprint written, the cache's entries. `ok` is true when the fingerprint matches the
    job and compiled graphs are there.
    """
    run = RunPaths(store.run_dir(pre.job.name))
    folder = store.cache_dir(pre.train.cacheset)
    summary: dict[str, Any] = {}
    if run.summary.exists():
        summary = json.loads(run.summary.read_text(encoding="utf-8"))
    saved = fingerprint.read(folder)
    current = fingerprint.compute(pre, fingerprint.vocab_size_for(pre, store))
    diffs = fingerprint.compare(saved.fields, current) if saved else None
    entries = cache.entries(folder)
    return {
        "job": pre.job.name,
        "cacheset": pre.train.cacheset,
        "cache_dir": str(folder),
        "status": summary.get("status"),
        "steps": summary.get("steps"),
        "time_to_first_step_s": summary.get("time_to_first_step_s"),
        "compile_counters": summary.get("compile_counters", {}),
        "fingerprint": "missing" if diffs is None else "differs" if diffs else "matches",
        "differences": [str(d) for d in diffs or []],
        "entries": entries,
        "ok": diffs == [] and cache.has_entries(folder, cache.mechanism(pre)),
    }


def run_dir(store: Storage, cfg: JobConfig) -> Path:
    return store.run_dir(precompile_name(cfg.job.name))
