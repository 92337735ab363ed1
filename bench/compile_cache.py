"""Time to first step with torch.compile on this machine's CPU: cold cache vs warm cache.

    python bench/compile_cache.py [--models bert-tiny,bert-base] [--steps 2] [--repeats 2]
                                  [--scopes model,layers] [--out FILE]

For each model, three kinds of runs of the trainer (`python -m trainmaster.train`, one worker, as a
launcher starts it), each a fresh process on the built-in corpus (prepared in a temp folder):
  eager  train.compile off: the reference (imports, data, model, one step)
  cold   train.compile on, an empty cacheset: precompile's situation (everything compiles)
  warm   train.compile on, the cacheset the cold run filled: a launch after precompile
time_to_first_step_s is the trainer's own figure in summary.json (process start to the end of
the first optimizer step, imports included). The compiler's counters (FX graph and AOTAutograd
cache hits and misses) are reported next to it, so a warm run is shown to be warm by the
compiler, not only by the clock. The cold run starts with nothing: its cacheset (and with it
TMPDIR, where Inductor keeps its precompiled headers) is new.

--scopes model,layers adds, per model, a cold and warm runs with TRAINMASTER_COMPILE_SCOPE=layers
(train/step.py: each encoder layer and the head compiled alone, the layers sharing one graph),
in a cacheset of their own: layers_cold_over_model_cold and the warm runs' seq/s ratio.

Prints one JSON object. No assertions (docs/architecture.md 4). The aim: warm <= 0.15 x cold.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import emit, machine, prepare_corpus
from trainmaster.config import jobfile
from trainmaster.train.step import COMPILE_SCOPE_ENV

BATCH = {"bert-tiny": 8, "bert-mini": 4, "bert-base": 2, "bert-large": 1}


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def job(root: Path, name: str, model: str, steps: int, compile_: bool, cacheset: str) -> Path:
    batch = BATCH[model]
    sets = [
        f'job.name="{name}"',
        "job.nnodes=1",
        "job.nproc_per_node=1",
        "job.max_restarts=0",
        f'model.preset="{model}"',
        f"train.batch_size={batch}",
        f"train.global_batch_size={batch}",
        f"train.max_steps={steps + 1}",
        "train.warmup_steps=1",
        f"train.steps_this_run={steps}",
        f"train.compile={'true' if compile_ else 'false'}",
        f'train.cacheset="{cacheset}"',
    ]
    cfg = jobfile.preset("local-cpu", sets)
    path = root / "runs" / name / "job.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(jobfile.render(cfg, f"bench job {name}"), encoding="utf-8")
    return path


def run(root: Path, path: Path, scope: str = "model") -> dict[str, Any]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TRAINMASTER_COMPILE_CACHE")
    }
    env |= {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(os.cpu_count() or 1)}
    env |= {COMPILE_SCOPE_ENV: scope}
    t0 = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "trainmaster.train", "--job", str(path), "--storage", str(root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    wall = time.perf_counter() - t0
    if result.returncode != 0:
        raise SystemExit(
            f"{path.parent.name} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
        )
    summary = json.loads((path.parent / "summary.json").read_text())
    return {
        "time_to_first_step_s": round(summary["time_to_first_step_s"], 2),
        "wall_s": round(wall, 2),
        "compile_cache": summary["compile_cache"],
        "compile_counters": summary.get("compile_counters") or {},
        "avg_seq_per_s": summary.get("avg_seq_per_s"),
    }


def bench_model(root: Path, model: str, steps: int, repeats: int) -> dict[str, Any]:
    """eager and warm `repeats` times (fresh processes, the best counts: a shared machine only
    ever makes a run slower), cold once (it needs an empty cacheset)."""
    out: dict[str, Any] = {"model": model, "micro_batch": BATCH[model], "steps": steps}
    plan = (
        [("eager", False, i) for i in range(repeats)]
        + [("cold", True, 0)]
        + [("warm", True, i) for i in range(repeats)]
    )
    runs: dict[str, list[dict[str, Any]]] = {"eager": [], "cold": [], "warm": []}
    for kind, compiled, i in plan:
        say(f"{model}: {kind} {i + 1} ...")
        path = job(root, f"{model}-{kind}-{i}", model, steps, compiled, model)
        runs[kind].append(run(root, path))
        say(f"{model}: {kind} {i + 1} first step after {runs[kind][-1]['time_to_first_step_s']} s")
    for kind, results in runs.items():
        out[kind] = min(results, key=lambda r: r["time_to_first_step_s"])
        out[kind]["all_time_to_first_step_s"] = [r["time_to_first_step_s"] for r in results]
    cold, warm, eager = (out[k]["time_to_first_step_s"] for k in ("cold", "warm", "eager"))
    out["warm_over_cold"] = round(warm / cold, 3)
    out["compile_overhead_s"] = {"cold": round(cold - eager, 2), "warm": round(warm - eager, 2)}
    out["cache_bytes"] = sum(
        f.stat().st_size
        for f in (root / "cache" / model).rglob("*")
        if f.is_file() and "tmp" not in f.relative_to(root / "cache" / model).parts
    )
    return out


def bench_layers(root: Path, model: str, steps: int, repeats: int) -> dict[str, Any]:
    """The same cold and warm runs with TRAINMASTER_COMPILE_SCOPE=layers (each encoder layer
    and the head compiled alone), in a cacheset of their own."""
    runs: dict[str, list[dict[str, Any]]] = {"cold": [], "warm": []}
    for kind, i in [("cold", 0)] + [("warm", i) for i in range(repeats)]:
        say(f"{model}: layers {kind} {i + 1} ...")
        path = job(root, f"{model}-layers-{kind}-{i}", model, steps, True, f"{model}-layers")
        runs[kind].append(run(root, path, "layers"))
        say(f"{model}: layers {kind} first step after {runs[kind][-1]['time_to_first_step_s']} s")
    return {kind: min(r, key=lambda x: x["time_to_first_step_s"]) for kind, r in runs.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="bert-tiny,bert-base")
    p.add_argument("--steps", type=int, default=2, help="steps per run (the first is timed)")
    p.add_argument(
        "--repeats", type=int, default=2, help="eager and warm runs per model (best counts)"
    )
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    p.add_argument(
        "--scopes",
        default="model",
        help="model (torch.compile of the whole model, the trainer's default) and/or layers "
        "(each encoder layer and the head alone): runs cold and warm for each",
    )
    args = p.parse_args()
    scopes = args.scopes.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-compile-") as tmp:
        root = Path(tmp)
        prepare_corpus(root, shards=1, extra=("--vocab-size", "4096"))
        results = []
        for m in args.models.split(","):
            out = bench_model(root, m, args.steps, max(1, args.repeats))
            if "layers" in scopes:
                layers = out["layers"] = bench_layers(root, m, args.steps, max(1, args.repeats))
                cold, model_cold = (x["cold"]["time_to_first_step_s"] for x in (layers, out))
                out["layers_cold_over_model_cold"] = round(cold / model_cold, 3)
                out["layers_warm_seq_per_s_over_model"] = round(
                    layers["warm"]["avg_seq_per_s"] / out["warm"]["avg_seq_per_s"], 3
                )
            results.append(out)
    report = {
        "bench": "compile_cache",
        "what": "time to first step (process start -> end of step 1), one CPU worker, cold vs warm "
        "torch.compile cache (FX graph + AOTAutograd caches in STORAGE/cache/CACHESET)",
        "machine": machine(),
        "aim": "warm <= 0.15 x cold",
        "results": results,
    }
    emit(report, args.out)


if __name__ == "__main__":
    main()
