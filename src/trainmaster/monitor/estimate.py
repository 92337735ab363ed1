"""`trainmaster estimate`: time, node-hours and cost of a job before it is launched.

    sequences      = train.max_steps x train.global_batch_size   (fixed whatever the nodes:
                                                                  accumulation is derived)
    rate(N)        = r1 x N x efficiency(N)                      (seq/s of N nodes)
    time(N)        = sequences / rate(N)
    node-hours(N)  = N x time(N) / 3600;  cost(N) = node-hours(N) x price per node-hour

r1 is one node's rate: measured (a finished run's summary.json, or a short run made here by
`--measure`), given (`--rate`), or the catalog's published BERT-large phase-1 figure for the
instance type. A rate measured on M nodes is brought back to one node as rate / (M x
efficiency(M)). efficiency(N) follows the published multi-node points of the instance type
(catalog.SCALING), interpolated between them with the same loss per doubling of nodes and
extrapolated past the last one the same way (e(N) = e_last ** (log N / log N_last)); a type
without published points borrows trn1's, and every row says which of these it is.

Not counted: start-up, compilation, checkpoints, restarts, idle nodes, storage and network;
prices are on-demand list prices (catalog or [cluster] price_per_hour), not a bill.
No torch. `estimate` and `efficiency` are pure arithmetic; the I/O is `rate_of_run` (reads
a run's summary.json and job.toml) and `measure` (runs the job here, as a subprocess).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainmaster import catalog
from trainmaster.config import MODEL_PRESETS, JobConfig
from trainmaster.errors import EXIT_BAD_INPUT, JobFailed, UserError
from trainmaster.monitor import history, runinfo
from trainmaster.storage import ENV_VAR as STORAGE_ENV
from trainmaster.storage import SHARD_GLOB, Storage, dataset_path

DEFAULT_NODES = "2,4,16,64"
MAX_NODES = 100_000
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


@dataclass(frozen=True)
class Rate:
    per_node: float  # seq/s of one node (a multi-node measurement divided back)
    basis: str  # "measured" (--from-run) | "measured here" (--measure) | "published" | "given"
    source: str


@dataclass(frozen=True)
class Row:
    nodes: int
    workers: int
    grad_accum: int | None  # None: the global batch does not divide over these workers
    per_worker: float  # sequences per worker per optimizer step
    below_published: bool  # per_worker below the published scaling run's: expect a lower rate
    efficiency: float
    efficiency_basis: str  # "1 node" | "published" | "interpolated" | "extrapolated" | "assumed"
    seq_per_s: float
    time_s: float
    node_hours: float
    cost: float
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Estimate:
    job: str
    instance: str
    max_steps: int
    global_batch: int
    sequences: int
    rate: Rate
    scaling: str  # where the efficiencies come from
    price_per_node_hour: float
    price_source: str
    rows: tuple[Row, ...]
    assumptions: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_nodes(text: str) -> list[int]:
    """'2,4,16,64' -> [2, 4, 16, 64] (sorted, no repeats); UserError naming --nodes otherwise."""
    counts = set()
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= MAX_NODES:
            raise UserError(
                f"{part!r} is not a node count; give whole numbers from 1 to "
                f"{MAX_NODES:,} separated by commas, e.g. {DEFAULT_NODES}",
                where="--nodes",
            )
        counts.add(int(part))
    return sorted(counts)


def efficiency(scaling: catalog.Scaling, nodes: int) -> tuple[float, str]:
    """(efficiency, basis) at `nodes`: a published point, log-interpolated between points, or
    extrapolated past the last one with the same loss per doubling as from 1 node to it."""
    if nodes <= 1:
        return 1.0, "1 node"
    points = [(1, 1.0), *sorted(scaling.points)]
    for (n0, e0), (n1, e1) in zip(points, points[1:], strict=False):
        if nodes == n1:
            return e1, "published"
        if n0 < nodes < n1:
            t = math.log(nodes / n0) / math.log(n1 / n0)
            return e0 * (e1 / e0) ** t, "interpolated"
    n_last, e_last = points[-1]
    return e_last ** (math.log(nodes) / math.log(n_last)), "extrapolated"


def scaling_for(instance: str) -> tuple[catalog.Scaling, bool]:
    """The instance type's published scaling, or trn1's as a stand-in (False: borrowed)."""
    own = catalog.SCALING.get(instance)
    return (own, True) if own else (catalog.SCALING[catalog.DEFAULT_SCALING], False)


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


def per_node(total: float, nodes: int, instance: str) -> float:
    """One node's rate from a rate measured on `nodes` nodes (efficiency divided back out)."""
    return total / (nodes * efficiency(scaling_for(instance)[0], nodes)[0])


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


def estimate(cfg: JobConfig, rate: Rate, nodes: list[int]) -> Estimate:
    """Every figure of the table, from the job, a one-node rate and the node counts."""
    inst = cfg.derived.instance
    sc, own = scaling_for(inst.name)
    price = history.price_of(cfg, 1)
    assert price is not None  # a config is given
    t = cfg.train
    sequences = t.max_steps * t.global_batch_size
    workers_per_node = cfg.job.nproc_per_node
    rows = []
    for n in nodes:
        eff, basis = efficiency(sc, n)
        if not own and n > 1:
            basis = "assumed"
        workers = n * workers_per_node
        per_step = t.batch_size * workers
        accum = t.global_batch_size // per_step if t.global_batch_size % per_step == 0 else None
        notes = []
        if accum is None:
            notes.append(
                f"does not run as is: global batch {t.global_batch_size:,} is not a "
                f"multiple of batch_size {t.batch_size} x {workers:,} workers"
            )
        mine = t.global_batch_size / workers
        below = n > 1 and mine < sc.reference_per_worker(n)
        rate_n = rate.per_node * n * eff
        time_s = sequences / rate_n
        node_hours = n * time_s / 3600.0
        rows.append(
            Row(
                n,
                workers,
                accum,
                mine,
                below,
                eff,
                basis,
                rate_n,
                time_s,
                node_hours,
                node_hours * price.per_node_hour,
                tuple(notes),
            )
        )
    scaling = (
        f"published for {inst.name}: {sc.setup}; {sc.source}"
        if own
        else f"assumed: no published multi-node figure for {inst.name}, so trn1.32xlarge's is "
        f"used ({sc.setup}; {sc.source})"
    )
    assumptions = (
        f"sequences to train = max_steps {t.max_steps:,} x global batch {t.global_batch_size:,} "
        f"= {sequences:,}, the same on every node count (accumulation is derived)",
        "efficiency(N) = rate of N nodes / (N x one node's rate): published points, "
        "log-interpolated between them; past the last point it keeps losing the same share per "
        "doubling of nodes (extrapolated)",
        f"the published scaling ran {_reference(sc)} sequences per worker per optimizer step; "
        "rows with fewer (marked *; below_published in --json) spend a larger share of each step in the all-reduce, "
        "so expect a lower rate there than shown",
        "only training steps take time: no start-up, compilation, checkpoints, restarts or idle "
        "nodes; cost is the on-demand list price x node-hours (no storage, network, control "
        "plane), not a bill",
    )
    price_source = (
        "[cluster] price_per_hour of the job file"
        if price.source != "catalog"
        else f"catalog: EC2 on-demand list price of {inst.name}, us-east-1, Linux"
        + (" (a generic CPU host, m7i.8xlarge-sized)" if inst.name == "cpu" else "")
    )
    return Estimate(
        cfg.job.name,
        inst.name,
        t.max_steps,
        t.global_batch_size,
        sequences,
        rate,
        scaling,
        price.per_node_hour,
        price_source,
        tuple(rows),
        assumptions,
    )


def _reference(sc: catalog.Scaling) -> str:
    if sc.global_batch is not None:
        return f"global batch {sc.global_batch:,} / (N x {sc.workers_per_node})"
    return f"{sc.per_worker_batch:,}"
