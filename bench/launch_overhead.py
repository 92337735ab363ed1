"""Time from `trainmaster launch` to the first training step, vs plain torchrun, side by side.

    python bench/launch_overhead.py [--repeats 3] [--steps 2] [--out FILE]

The job is the demo's shape (bert-tiny, 2 nodes x 1 worker, c10d on loopback) on the built-in
corpus, prepared once in a temp folder. Two ways to start the very same program:

  launch    `python -m trainmaster launch JOB.toml` (checks, run folder, state.json, detached
            supervisor, one torchrun agent per node): what a user runs
  torchrun  the two torchrun commands that launch would run (backends/local/launcher.py's plan), started
            directly by this script with the same environment: the floor

Each run is timed from just before its first process starts to the moment rank 0 appended
step 1 to metrics.jsonl (that file's modification time, read while it holds one row). The
order alternates per repeat (launch first, then torchrun first), and the medians are
compared: the machine is shared and noisy. Prints one JSON object; no assertions
(docs/architecture.md 4). The aim: overhead within 15% of raw torchrun.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import agent_env, emit, first_step_at, machine, prepare_corpus, wait_final
from trainmaster import jobfile
from trainmaster.backends.local import launcher as local
from trainmaster.storage import Storage

POLL_S = 0.01
TIMEOUT_S = 600.0


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def job_file(root: Path, name: str, steps: int) -> Path:
    cfg = jobfile.preset(
        "local-cpu",
        [
            f'job.name="{name}"',
            f"train.max_steps={steps}",
            "train.warmup_steps=1",
            "job.max_restarts=0",
        ],
    )
    path = root / "jobs" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(jobfile.render(cfg, f"bench job {name}"), encoding="utf-8")
    return path


def via_launch(root: Path, name: str, steps: int) -> dict[str, Any]:
    path = job_file(root, name, steps)
    run = Storage(root).run_dir(name)
    env = agent_env(2)
    t0 = time.time()
    result = subprocess.run(
        [sys.executable, "-m", "trainmaster", "launch", str(path), "--storage", str(root)],
        env=env,
        capture_output=True,
        text=True,
    )
    returned = time.time() - t0
    if result.returncode != 0:
        raise SystemExit(f"launch {name} failed: {result.stderr.strip()}")
    first = first_step_at(run / "metrics.jsonl", t0, TIMEOUT_S)
    phase = wait_final(run / "state.json", TIMEOUT_S)
    if phase != "succeeded":
        raise SystemExit(f"launch {name} {phase}: see {run}/logs")
    return {"first_step_s": round(first, 3), "cli_returned_s": round(returned, 3)}


def via_torchrun(root: Path, name: str, steps: int) -> dict[str, Any]:
    cfg = jobfile.load(job_file(root, name, steps))
    plan = local.plan(cfg, Storage(root))
    plan.run.dir.mkdir(parents=True)
    plan.run.logs.mkdir()
    plan.run.job_toml.write_text(jobfile.render(cfg, f"bench job {name}"), encoding="utf-8")
    env = agent_env(cfg.derived.world_size)
    logs = [(plan.run.logs / f"node{i}.log").open("wb") for i in range(len(plan.commands))]
    t0 = time.time()
    procs = [
        subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        for cmd, log in zip(plan.commands, logs, strict=True)
    ]
    try:
        first = first_step_at(plan.run.dir / "metrics.jsonl", t0, TIMEOUT_S)
        codes = [p.wait(timeout=TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            p.kill() if p.poll() is None else None
        for log in logs:
            log.close()
    if any(codes):
        raise SystemExit(f"torchrun {name} exit codes {codes}: see {plan.run.logs}")
    return {"first_step_s": round(first, 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="runs of each way (alternating order)")
    p.add_argument("--steps", type=int, default=2, help="steps per run (the first is timed)")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = p.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"launch": [], "torchrun": []}
    ways = {"launch": via_launch, "torchrun": via_torchrun}
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as tmp:
        root = Path(tmp)
        say("preparing the built-in corpus ...")
        prepare_corpus(root, shards=2)
        for i in range(max(1, args.repeats)):
            order = ["launch", "torchrun"] if i % 2 == 0 else ["torchrun", "launch"]
            for way in order:
                runs[way].append(ways[way](root, f"{way}-{i}", args.steps))
                say(f"{i + 1}: {way:8s} first step after {runs[way][-1]['first_step_s']:.2f} s")
    med = {way: statistics.median(r["first_step_s"] for r in rs) for way, rs in runs.items()}
    report = {
        "bench": "launch_overhead",
        "what": "seconds from starting the job to rank 0's step 1 in metrics.jsonl; bert-tiny, "
        "2 nodes x 1 worker, c10d on loopback, built-in corpus",
        "machine": machine(),
        "aim": "launch within 1.15 x torchrun",
        "repeats": len(runs["launch"]),
        "launch_first_step_s": [r["first_step_s"] for r in runs["launch"]],
        "launch_cli_returned_s": [r["cli_returned_s"] for r in runs["launch"]],
        "torchrun_first_step_s": [r["first_step_s"] for r in runs["torchrun"]],
        "median_s": {k: round(v, 3) for k, v in med.items()},
        "launch_over_torchrun": round(med["launch"] / med["torchrun"], 3),
        "overhead_s": round(med["launch"] - med["torchrun"], 3),
    }
    emit(report, args.out)


if __name__ == "__main__":
    main()
