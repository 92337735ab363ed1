"""One node's rate, from where it can come: the catalog's published figure (published_rate), a
finished run's summary.json (rate_of_run), or a short run made here (measure: `trainmaster
launch --follow` as a subprocess in a temporary storage root)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainmaster import catalog
from trainmaster.config import MODEL_PRESETS, JobConfig
from trainmaster.errors import EXIT_BAD_INPUT, JobFailed, UserError
from trainmaster.estimate.figures import Rate, per_node
from trainmaster.monitor import history, runinfo
from trainmaster.storage import ENV_VAR as STORAGE_ENV
from trainmaster.storage import SHARD_GLOB, Storage, dataset_path

SIZES = ("num_layers", "hidden_size", "num_heads", "intermediate_size")
# What must match for a rate measured on one job to stand for another.
SAME_SHAPE = (
    "model",
    "data.seq_len",
    "data.max_pred",
    "train.precision",
    "train.batch_size",
    "job.nproc_per_node",
    "instance type",
)


def shape_of(cfg: JobConfig) -> dict[str, Any]:
    m = cfg.model
    return {
        "model": tuple(m.size(k) for k in SIZES),
        "data.seq_len": cfg.data.seq_len,
        "data.max_pred": cfg.data.max_pred,
        "train.precision": cfg.train.precision,
        "train.batch_size": cfg.train.batch_size,
        "job.nproc_per_node": cfg.job.nproc_per_node,
        "instance type": cfg.derived.instance.name,
    }


def published_rate(cfg: JobConfig) -> Rate:
    """The catalog's figure for the job's instance type, if it applies to this job."""
    inst = cfg.derived.instance.name
    figure = catalog.BERT_LARGE_PHASE1.get(inst)
    fix = "give --rate SEQ_PER_S_PER_NODE, --from-run JOB or --measure"
    if figure is None:
        known = ", ".join(catalog.BERT_LARGE_PHASE1)
        raise UserError(
            f"no published training rate for {inst} (published: {known}); {fix}", where="--rate"
        )
    large = tuple(MODEL_PRESETS["bert-large"][k] for k in SIZES)
    if shape_of(cfg)["model"] != large or cfg.data.seq_len != 128:
        raise UserError(
            f"the published {inst} rate is BERT-large phase 1 (seq 128); this job "
            f"trains {cfg.model.preset or 'a custom model'} at seq {cfg.data.seq_len}; "
            f"{fix}",
            where="--rate",
        )
    if cfg.train.precision != figure.precision:
        raise UserError(
            f"the published {inst} rate is for {figure.precision} training; this job "
            f"trains in {cfg.train.precision}; {fix}",
            where="--rate",
        )
    return Rate(figure.seq_per_s, "published", f"{figure.setup}; {figure.source}")


def rate_of_run(store: Storage, job: str, cfg: JobConfig, basis: str = "measured") -> Rate:
    """The steady rate a finished run measured (summary.json), if that run is shaped as `cfg`."""
    try:
        run = history.find_run(store, job)
    except UserError as exc:  # named after the option the job came from
        raise UserError(str(exc).removeprefix(f"{exc.where}: "), where="--from-run") from exc
    summary = runinfo.read_json(run.summary) or {}
    avg, world = summary.get("avg_seq_per_s"), summary.get("world_size")
    if not isinstance(avg, (int, float)) or avg <= 0 or not isinstance(world, int):
        raise UserError(
            f"run {job} has no summary.json with a rate ({run.summary}): it has not "
            "finished; wait for it, or use --measure",
            where="--from-run",
        )
    ran = history.read_config(run)
    if ran is None:
        raise UserError(f"run {job} has no readable job.toml ({run.job_toml})", where="--from-run")
    mine, theirs = shape_of(cfg), shape_of(ran)
    diffs = [f"{k} {theirs[k]} vs {mine[k]}" for k in SAME_SHAPE if mine[k] != theirs[k]]
    if diffs:
        raise UserError(
            f"run {job} is shaped differently from this job ({'; '.join(diffs)}), so "
            "its rate does not apply; measure this job (--measure) or give --rate",
            where="--from-run",
        )
    nodes = max(1, world // ran.job.nproc_per_node)
    inst = ran.derived.instance.name
    where = "on this machine (local nodes share it)" if inst == "cpu" else f"on {inst}"
    steps = summary.get("steps_this_run", summary.get("steps"))
    return Rate(
        per_node(float(avg), nodes, inst),
        basis,
        f"run {job}: {float(avg):,.2f} seq/s average over {steps} steps (the first left "
        f"out) on {nodes} node(s) x {ran.job.nproc_per_node} worker(s) {where}",
    )


def measure(
    job_file: Path,
    overrides: list[str],
    cfg: JobConfig,
    store: Storage,
    steps: int,
    say: Callable[[str], None] = print,
) -> Rate:
    """Run the job here for `steps` steps (`trainmaster launch --follow`, a subprocess, in a
    temporary storage root reading the job's dataset) and return the rate it measured; `say`
    announces the run once the job is checked."""
    if cfg.derived.instance.name != "cpu":
        raise UserError(
            f"--measure runs the job on this machine, but it is a {cfg.job.backend} "
            f"job on {cfg.derived.instance.name}: a rate measured here says nothing "
            "about that; leave the rate to the catalog, or give --rate or --from-run",
            where="--measure",
        )
    dataset = dataset_path(store, cfg.data.dataset).resolve()
    if not any(dataset.glob(SHARD_GLOB)):  # said here, before a launch that names a temp folder
        raise UserError(
            f"no {SHARD_GLOB} shards in {dataset} to measure with; make them with "
            "`trainmaster data prepare`, or point --storage at the storage root that "
            "holds them",
            where="data.dataset",
        )
    say(
        f"measuring: {steps} steps of {cfg.job.name} here ({cfg.job.nnodes} node(s) x "
        f"{cfg.job.nproc_per_node} worker(s))..."
    )
    with tempfile.TemporaryDirectory(prefix="trainmaster-estimate-") as tmp:
        sets = [
            *overrides,
            f"job.storage={json.dumps(tmp)}",
            'job.backend="local"',
            f"data.dataset={json.dumps(str(dataset))}",
            f"train.max_steps={steps}",
            "train.warmup_steps=0",
        ]
        cmd = [sys.executable, "-m", "trainmaster", "launch", str(job_file), "--follow"]
        for s in sets:
            cmd += ["--set", s]
        # The storage both as job.storage and in the environment: `launch` and its --follow
        # look in the same place whichever of the two they read.
        env = {**os.environ, "NO_COLOR": "1", STORAGE_ENV: tmp}
        cancel = [sys.executable, "-m", "trainmaster", "cancel", cfg.job.name]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        except KeyboardInterrupt:  # stop the job's processes too, then let the CLI say so
            subprocess.run(cancel, capture_output=True, env=env)
            raise
        if done.returncode != 0:
            subprocess.run(cancel, capture_output=True, env=env)  # nothing left running
            last = (done.stderr.strip().splitlines() or ["no output"])[-1].removeprefix("error: ")
            if done.returncode == EXIT_BAD_INPUT:
                raise UserError(f"the measuring run refused the job: {last}", where="--measure")
            raise JobFailed(f"the measuring run failed (exit {done.returncode}): {last}")
        rate = rate_of_run(Storage(Path(tmp)), cfg.job.name, cfg, "measured here")
    return dataclasses.replace(
        rate, source=rate.source.replace(f"run {cfg.job.name}:", "a run here:", 1)
    )
