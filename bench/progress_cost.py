"""What watching a job costs: the progress record (`status` on Kubernetes) and a /metrics scrape.

Both are read from the run folder (monitor/progress.py, monitor/exporter.py): rank 0's pod
computes the record every 15 s and Prometheus scrapes every 30 s, for the job's whole life. This
writes the run folder of a finished BERT-large phase-1 run (the tutorial's 28,125 steps, one
metrics row each, a goodput window every 10 steps) and times both, the median of --repeats.

    python bench/progress_cost.py [--steps 28125] [--repeats 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from benchlib import NOISE, emit, machine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainmaster.monitor import exporter, progress  # noqa: E402
from trainmaster.run import goodput  # noqa: E402
from trainmaster.storage import RunPaths  # noqa: E402


def run_folder(root: Path, steps: int) -> RunPaths:
    run = RunPaths(root / "runs" / "bench")
    run.dir.mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "trn1-bert-large.toml", run.job_toml)
    row = {"lr": 1e-4, "seq_per_s": 6400.0, "tokens_per_s": 819200.0, "mfu": 0.4, "grad_norm": 1.0}
    with run.metrics.open("w") as f:
        for s in range(1, steps + 1):
            f.write(json.dumps({"step": s, "loss": 7.0 - s * 1e-4, **row, "elapsed_s": s * 1.3}))
            f.write("\n")
    goodput.record(run.timeline, "start", t=1000.0, step=0, compiles=True)
    with run.timeline.open("a") as f:
        for s in range(1, steps + 1, 10):
            window = {"event": "steps", "t": 1000 + s * 1.3, "end": 1000 + (s + 10) * 1.3}
            f.write(json.dumps({**window, "first": s, "last": min(steps, s + 9)}) + "\n")
    return run


def timed(fn: object, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - t0)
    return round(statistics.median(out), 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=28_125)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = run_folder(Path(tmp), args.steps)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(exporter.RunCollector(run, "bench", lambda: "running"))
        record = progress.of_folder(run, "bench", "running")
        report = {
            "bench": "progress_cost",
            "steps": args.steps,
            "metrics_jsonl_mb": round(run.metrics.stat().st_size / 1e6, 2),
            "record_s": timed(lambda: progress.of_folder(run, "bench", "running"), args.repeats),
            "record_bytes": len(record.to_json()),
            "scrape_s": timed(lambda: generate_latest(registry), args.repeats),
            "scrape_bytes": len(generate_latest(registry)),
            "machine": machine(),
            "note": NOISE,
        }
    emit(report, args.out)


if __name__ == "__main__":
    main()
