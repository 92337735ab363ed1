"""What checkpoints cost training: step time with and without a checkpoint every N steps, and
background writes against synchronous ones (docs/architecture.md 5: 14.5).

    python bench/checkpoint_cost.py [--model bert-base] [--steps 24] [--every 4] [--rounds 1]
                                    [--out FILE]

One local worker (1 node x 1), fp32, micro-batch 2 on the built-in corpus, three runs of the
same job that differ only in checkpointing:

  none        train.checkpoint_every > steps (only the final save, after the last step)
  background  a checkpoint every --every steps, written by rank 0's writer process (the default:
              train/checkpoint/background.py; before issue 28, a writer thread)
  sync        the same, but training waits for each write (TRAINMASTER_CHECKPOINT_SYNC=1)

For each: the median and mean step time (from metrics.jsonl's seq/s, the first step left out), the
seconds training stood still for saves and the write's size, time and MB/s (summary.json's
checkpoint_saves), and the effective seconds per step = (sum of step times + stand-still) /
steps, compared with `none`. Prints one JSON object; no assertions (docs/architecture.md 4).

On a shared machine the load drifts between runs more than checkpoints cost: --rounds R runs
the three R times, in alternating order, and compares each run with the `none` run of its own
round; effective_step_vs_none is then the median of the rounds' ratios.

    python bench/checkpoint_cost.py --write-cpu [--model bert-base] [--rounds 3]

measures the writer's side alone, in this process, on the machine's load: the model and its Adam
state staged in the shared block as the trainer stages them, then saving.write() through the
page cache (plain torch.save, as before issue 28's O_DIRECT write) and direct (odirect), in
alternating order, --rounds times each: seconds, and CPU seconds (user, system) a write takes
from a core that training could use. The direct write includes the CRC-32 of every record (isal,
zipcrc); crc32_cpu_s is that part alone, the whole block checksummed by isal and by zlib.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import agent_env, cpu_s, emit, load, machine, prepare_corpus, wait_final
from trainmaster.config import jobfile
from trainmaster.storage import RunPaths, Storage
from trainmaster.train import model, optim
from trainmaster.train.checkpoint import SYNC_ENV, saving, staging

VARIANTS = ("none", "background", "sync")
GLOBAL_BATCH = 2
TIMEOUT_S = 1800.0


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(root: Path, name: str, variant: str, model: str, steps: int, every: int) -> dict[str, Any]:
    cfg = jobfile.preset(
        "local-cpu",
        [
            f'job.name="{name}"',
            "job.nnodes=1",
            f'model.preset="{model}"',
            "train.batch_size=2",
            f"train.global_batch_size={GLOBAL_BATCH}",
            f"train.max_steps={steps}",
            "train.warmup_steps=1",
            f"train.checkpoint_every={steps + 1 if variant == 'none' else every}",
            "train.keep_checkpoints=2",
            "job.max_restarts=0",
        ],
    )
    path = root / "jobs" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(jobfile.render(cfg, f"checkpoint bench {variant}"), encoding="utf-8")
    env = agent_env(1) | ({SYNC_ENV: "1"} if variant == "sync" else {})
    launched = subprocess.run(
        [sys.executable, "-m", "trainmaster", "launch", str(path), "--storage", str(root)],
        env=env,
        capture_output=True,
        text=True,
    )
    if launched.returncode != 0:
        raise SystemExit(f"launch {name}: {launched.stderr.strip()}")
    paths = RunPaths(Storage(root).run_dir(name))
    phase = wait_final(paths.state, TIMEOUT_S)
    if phase != "succeeded":
        raise SystemExit(f"{name} {phase}: see {paths.logs}")
    rows = [json.loads(line) for line in paths.metrics.read_text().splitlines()]
    # seconds per step from each row's seq/s (global batch 2); the first step warms up
    step_s = [GLOBAL_BATCH / float(r["seq_per_s"]) for r in rows[1:]]
    summary = json.loads(paths.summary.read_text())
    saves = summary["checkpoint_saves"]
    # Stand-still before the final save is not a training cost of the cadence: leave it out.
    stalls = [
        e["end"] - e["t"]
        for e in map(json.loads, paths.timeline.read_text().splitlines())
        if e["event"] == "checkpoint" and e["step"] < steps
    ]
    return {
        "median_step_s": round(statistics.median(step_s), 4),
        "mean_step_s": round(statistics.mean(step_s), 4),
        "stood_still_s": round(sum(stalls), 3),
        "saves_during_training": len(stalls),
        "effective_s_per_step": round((sum(step_s) + sum(stalls)) / len(step_s), 4),
        "checkpoint_saves": saves,
        "goodput": summary["goodput"]["ratio"],
    }


def write_cpu(model_name: str, rounds: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)  # as in the writer process
    cfg = jobfile.preset("local-cpu", [f'model.preset="{model_name}"'])
    bert = model.build(cfg, 30522)
    opt = optim.make_optimizer(cfg, bert, "cpu")
    torch.stack([p.sum() for p in bert.parameters()]).sum().backward()
    opt.step()  # Adam's state exists from the first step on
    state: tuple[Any, ...] = (bert.state_dict(), {"optimizer": opt.state_dict(), "step": 1}, [], {})
    skeleton, tensors = staging.flatten(state)
    layout, size = staging.layout_of(tensors)
    fd = staging.shared_fd()
    os.ftruncate(fd, size)
    arena = staging.Arena(fd, size, layout)
    arena.fill(tensors)
    staged = saving.Staged(1, *staging.unflatten(skeleton, arena.views))
    runs: dict[str, list[dict[str, float]]] = {"page_cache": [], "direct": []}
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-write-") as d:
        for r in range(rounds):
            for way in list(runs) if r % 2 == 0 else list(runs)[::-1]:
                before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                _, nbytes = saving.write(
                    Path(d) / way, staged, 1, arena=arena if way == "direct" else None
                )
                after = resource.getrusage(resource.RUSAGE_SELF)
                runs[way].append(
                    {
                        "seconds": round(time.perf_counter() - t0, 3),
                        "user_s": round(after.ru_utime - before.ru_utime, 3),
                        "sys_s": round(after.ru_stime - before.ru_stime, 3),
                    }
                )
                say(f"  {way}: {json.dumps(runs[way][-1])}")
    crc32_cpu_s = {lib: cpu_seconds(f, arena.buffer, rounds) for lib, f in crc32s().items()}
    arena.close()
    os.close(fd)
    cpu = {w: [x["user_s"] + x["sys_s"] for x in v] for w, v in runs.items()}
    return {
        "bench": "checkpoint_write_cpu",
        "what": f"saving.write() of {model_name} + Adam state ({nbytes / 1e9:.2f} GB), "
        f"{rounds} round(s), in a temporary folder",
        "runs": runs,
        "median_cpu_s": {w: round(statistics.median(v), 3) for w, v in cpu.items()},
        "median_seconds": {
            w: round(statistics.median(x["seconds"] for x in v), 3) for w, v in runs.items()
        },
        "crc32_cpu_s": crc32_cpu_s,
    }


def crc32s() -> dict[str, Any]:
    import zlib

    from isal import isal_zlib

    return {"isal": isal_zlib.crc32, "zlib": zlib.crc32}


def cpu_seconds(f: Any, data: Any, rounds: int) -> float:
    """The median CPU seconds (user + system) of f(data)."""
    times = []
    for _ in range(rounds):
        before = cpu_s()
        f(data)
        times.append(cpu_s() - before)
    return round(statistics.median(times), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bert-base", help="bert-tiny | bert-base | bert-large")
    ap.add_argument("--steps", type=int, default=24, help="steps per run")
    ap.add_argument("--every", type=int, default=4, help="checkpoint every N steps")
    ap.add_argument("--rounds", type=int, default=1, help="run the three this many times")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    ap.add_argument("--write-cpu", action="store_true", help="the writer's CPU alone (above)")
    args = ap.parse_args()
    if args.write_cpu:
        report = write_cpu(args.model, args.rounds)
        emit({**report, "machine": machine(), "load_after": load()}, args.out)
        return
    if args.every < 1 or args.steps <= args.every + 1 or args.rounds < 1:
        ap.error("--every >= 1, --steps > --every + 1 and --rounds >= 1")
    started, load_before = time.time(), load()
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as d:
        root = Path(d)
        say("preparing the built-in corpus")
        prepare_corpus(root, shards=2)
        for r in range(args.rounds):
            results: dict[str, Any] = {}
            for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
                say(f"round {r + 1}/{args.rounds}: {variant} ...")
                name = f"ckpt-{variant}-{r}"
                results[variant] = run(root, name, variant, args.model, args.steps, args.every)
                say(f"  {json.dumps(results[variant])}")
            rounds.append({v: results[v] for v in VARIANTS})
    ratios = {
        v: [
            round(rr[v]["effective_s_per_step"] / rr["none"]["effective_s_per_step"], 3)
            for rr in rounds
        ]
        for v in VARIANTS
    }
    emit(
        {
            "bench": "checkpoint_cost",
            "what": (
                f"measured here: {args.model}, 1 local worker, fp32, micro-batch 2, "
                f"{args.steps} steps, a checkpoint every {args.every} (none: only the final), "
                f"{args.rounds} round(s)"
            ),
            "command": "python bench/checkpoint_cost.py " + " ".join(sys.argv[1:]),
            "machine": machine(),
            "load_before": load_before,
            "load_after": load(),
            "seconds": round(time.time() - started, 1),
            "results": rounds[0] if args.rounds == 1 else rounds,
            "effective_step_vs_none": {v: statistics.median(x) for v, x in ratios.items()},
            "effective_step_vs_none_per_round": ratios,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
