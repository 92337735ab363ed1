"""`trainmaster demo`: the whole local flow on the built-in corpus, in one command.

Prepares shards from Python's own reference documentation, writes a job file (bert-tiny,
2 nodes x 1 worker, c10d rendezvous, checkpoints), launches it with the local backend, follows
it with a progress bar and prints a summary with the commands to look further.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from trainmaster import api
from trainmaster.cli.job_cmd import follow_job
from trainmaster.errors import UserError
from trainmaster.storage import RunPaths, Storage

err = Console(stderr=True)


def demo(
    folder: Annotated[
        Path,
        typer.Option(
            "--dir", help="Folder to work in (made if missing; must hold no earlier demo)"
        ),
    ] = Path("."),
    steps: Annotated[int, typer.Option(min=20, help="Optimizer steps to train")] = 200,
) -> None:
    """Prepare the built-in corpus, train bert-tiny on 2 local nodes, and summarise the run."""
    store = Storage(folder / "trainmaster-data")
    job_toml = folder / "demo.toml"
    if store.run_dir("demo").exists() or job_toml.exists():
        raise UserError("holds an earlier demo; use another --dir or delete it", where=str(folder))
    store.ensure_writable()
    from trainmaster.data.prepare import prepare  # numpy/h5py/tokenizers only when the demo runs

    err.print(
        f"[bold]1/3[/bold] preparing shards from Python's reference docs into {store.dataset_dir('pydoc')}"
    )
    result = prepare(output=store.dataset_dir("pydoc"), builtin="pydoc", shards=4, quiet=False)
    err.print(
        f"    {result.examples} examples in {len(result.shards)} shards, "
        f"{result.tokens_per_s:,.0f} input tokens/s"
    )
    job_toml.write_text(
        api.init_job(
            "local-cpu", [f"train.max_steps={steps}", f'job.storage="{store.root.resolve()}"']
        )
    )
    err.print(f"[bold]2/3[/bold] wrote {job_toml} (bert-tiny, 2 nodes x 1 worker, c10d)")
    cfg = api.load_job(job_toml)
    backend = api.backend(api.Target(storage=str(store.root), backend="local"), cfg)
    backend.submit(backend.plan(cfg))
    err.print(
        f"[bold]3/3[/bold] training (`trainmaster status demo --storage {store.root}` "
        "from another shell)"
    )
    follow_job(backend, "demo")
    _summary(RunPaths(store.run_dir("demo")), store)


def _summary(run: RunPaths, store: Storage) -> None:
    s = json.loads(run.summary.read_text())
    rows = [json.loads(line) for line in run.metrics.read_text().splitlines() if line.strip()]
    first, last = rows[0], rows[-1]
    storage = f"--storage {store.root}"
    typer.echo(
        f"\ndemo finished: {s['status']}, {s['steps']} steps on {s['world_size']} workers\n"
        f"  loss            {first['loss']:.3f} (step {first['step']}) -> {last['loss']:.3f} (step {last['step']})\n"
        f"  throughput      {s['avg_seq_per_s']:.1f} seq/s average, {s['peak_seq_per_s']:.1f} peak\n"
        f"  time to step 1  {s['time_to_first_step_s']:.1f} s\n"
        f"  restarts        {s['restarts']}\n"
        f"  checkpoints     {run.checkpoints}\n"
        f"  TensorBoard     {run.tensorboard}\n"
        f"  metrics         {run.metrics}\n"
        f"look further:\n"
        f"  trainmaster status demo {storage}\n"
        f"  trainmaster logs demo {storage}            # rank 0\n"
        f"  trainmaster list {storage}\n"
        f"  tensorboard --logdir {run.tensorboard}\n"
    )
