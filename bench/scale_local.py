"""Rendezvous at scale on one machine: 16 and 32 local nodes, `launch` vs raw torchrun, c10d and etcd.

    python bench/scale_local.py [--nodes 16,32] [--backends c10d,etcd] [--repeats 1] [--out FILE]

Every node is one torchrun agent with one worker, all on this machine; the model is bert-tiny
cut down further (1 layer, hidden 32) and runs 1 step, so what is timed is start-up and
rendezvous, not training. For each node count and rendezvous backend, two ways to start the
very same program:

  launch    `python -m trainmaster launch JOB.toml`: checks, run folder, state.json, detached
            supervisor, (etcd: a private etcd server), one torchrun agent per node
  torchrun  the same torchrun commands (backends/local/launcher.py's plan) started directly by this
            script with the supervisor's environment, each in its own session as the
            supervisor starts them (and as torchrun on N machines would be): with the kernel's
            autogroup scheduling (/proc/sys/kernel/sched_autogroup_enabled) a session is a
            scheduling group, so agents sharing one session would get less of a busy
            machine's CPU than the launched ones; for etcd this script starts the same private
            etcd first (backends/local/rendezvous.py), inside the timed interval, because the launch
            side does too

Each run is timed from just before its first process starts to rank 0's write of step 1 in
metrics.jsonl. The order alternates (launch first, then torchrun first, per configuration and
repeat) and medians are compared. The machine has 2 cores shared with other work: 32 nodes
means 64 Python processes importing torch on 2 cores, so the absolute seconds measure this
machine's CPU, and the ratio is what carries over. The load average is recorded around every
run. Prints one JSON object; no assertions (docs/architecture.md 4). The aim: within 1.1x
(docs/architecture.md 5: 15.3).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import agent_env, emit, first_step_at, load, machine, prepare_corpus, wait_final
from trainmaster.backends.local import launcher as local
from trainmaster.backends.local import rendezvous
from trainmaster.config import jobfile
from trainmaster.launch.torchrun import Rendezvous
from trainmaster.run import state
from trainmaster.storage import Storage

TIMEOUT_S = 900.0
# Small enough that the one step costs next to nothing next to start-up (seq_len and max_pred
# are the prepared shards').
TINY = [
    "model.num_layers=1",
    "model.hidden_size=32",
    "model.num_heads=2",
    "model.intermediate_size=64",
    "train.batch_size=1",
    "train.max_steps=1",
    "train.warmup_steps=0",
    "train.checkpoint_every=1000",
    "job.max_restarts=0",
    "rendezvous.timeout=900",
]


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def job_file(root: Path, name: str, nodes: int, backend: str) -> Path:
    cfg = jobfile.preset(
        "local-cpu",
        [
            f'job.name="{name}"',
            f"job.nnodes={nodes}",
            *TINY,
            f"train.global_batch_size={nodes}",
            f'rendezvous.backend="{backend}"',
        ],
    )
    path = root / "jobs" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(jobfile.render(cfg, f"bench job {name}"), encoding="utf-8")
    return path


def via_launch(root: Path, name: str, nodes: int, backend: str) -> dict[str, Any]:
    path = job_file(root, name, nodes, backend)
    run = Storage(root).run_dir(name)
    cfg = jobfile.load(path)
    before = load()
    t0 = time.time()
    result = subprocess.run(
        [sys.executable, "-m", "trainmaster", "launch", str(path), "--storage", str(root)],
        env=agent_env(cfg.derived.world_size),
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
    st = state.read(run / "state.json")
    return {
        "first_step_s": round(first, 3),
        "cli_returned_s": round(returned, 3),
        # the supervisor records started_at once every agent has been started
        "agents_started_s": round((st.started_at or t0) - t0, 3),
        "load_before": before,
        "load_after": load(),
    }


def via_torchrun(root: Path, name: str, nodes: int, backend: str) -> dict[str, Any]:
    cfg = jobfile.load(job_file(root, name, nodes, backend))
    plan = local.plan(cfg, Storage(root))
    plan.run.dir.mkdir(parents=True)
    plan.run.logs.mkdir()
    plan.run.job_toml.write_text(jobfile.render(cfg, f"bench job {name}"), encoding="utf-8")
    env = agent_env(cfg.derived.world_size)
    logs = [(plan.run.logs / f"node{i}.log").open("wb") for i in range(nodes)]
    etcd: subprocess.Popen[bytes] | None = None
    procs: list[subprocess.Popen[bytes]] = []
    before = load()
    t0 = time.time()
    try:
        commands = plan.commands
        if plan.private_etcd:  # the same private etcd the supervisor starts, timed likewise
            etcd, endpoint = rendezvous.start_private_etcd(
                plan.run.dir / "etcd", plan.run.logs / "etcd.log", timeout_s=30.0
            )
            rdzv = Rendezvous(plan.rdzv.backend, endpoint, run_id=plan.rdzv.run_id)
            commands = local.agent_commands(cfg, rdzv, plan.run, root)
        procs = [
            subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
            for cmd, log in zip(commands, logs, strict=True)
        ]
        started = time.time() - t0
        first = first_step_at(plan.run.dir / "metrics.jsonl", t0, TIMEOUT_S)
        codes = [p.wait(timeout=TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            p.kill() if p.poll() is None else None
        if etcd is not None:
            etcd.terminate()
            etcd.wait(timeout=30)
        for log in logs:
            log.close()
    if any(codes):
        raise SystemExit(f"torchrun {name} exit codes {codes}: see {plan.run.logs}")
    return {
        "first_step_s": round(first, 3),
        "agents_started_s": round(started, 3),
        "load_before": before,
        "load_after": load(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", default="16,32", help="node counts, comma-separated (1 worker each)")
    p.add_argument("--backends", default="c10d,etcd", help="rendezvous backends, comma-separated")
    p.add_argument("--repeats", type=int, default=1, help="runs of each way per configuration")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = p.parse_args()
    counts = [int(n) for n in args.nodes.split(",")]
    backends = args.backends.split(",")
    ways = {"launch": via_launch, "torchrun": via_torchrun}
    results: list[dict[str, Any]] = []
    report: dict[str, Any] = {
        "bench": "scale_local",
        "what": "measured here: seconds from starting the job to rank 0's step 1 in metrics.jsonl; N local "
        "nodes x 1 worker, bert-tiny cut to 1 layer / hidden 32, 1 step, built-in corpus",
        "machine": machine() | {"sched_autogroup": _autogroup()},
        "aim": "launch within 1.1 x torchrun",
        "repeats": max(1, args.repeats),
        "results": results,
        "complete": False,
    }
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        root = Path(tmp)
        say(f"preparing the built-in corpus in {max(counts)} shards ...")
        prepare_corpus(root, shards=max(counts))
        k = 0
        for nodes in counts:
            for backend in backends:
                runs: dict[str, list[dict[str, Any]]] = {"launch": [], "torchrun": []}
                for i in range(max(1, args.repeats)):
                    order = ["launch", "torchrun"] if k % 2 == 0 else ["torchrun", "launch"]
                    k += 1
                    for way in order:
                        run = ways[way](root, f"{way}-{nodes}-{backend}-{i}", nodes, backend)
                        runs[way].append(run | {"order": order.index(way)})
                        say(
                            f"{nodes} nodes {backend:5s} {way:8s} first step after {run['first_step_s']:.2f} s "
                            f"(load {run['load_before'][0]})"
                        )
                med = {
                    way: statistics.median(r["first_step_s"] for r in rs)
                    for way, rs in runs.items()
                }
                results.append(
                    {
                        "nodes": nodes,
                        "backend": backend,
                        "runs": runs,
                        "median_first_step_s": {w: round(v, 3) for w, v in med.items()},
                        "launch_over_torchrun": round(med["launch"] / med["torchrun"], 3),
                        "overhead_s": round(med["launch"] - med["torchrun"], 3),
                    }
                )
                if args.out:  # what is done so far survives an interrupted run
                    args.out.write_text(json.dumps(report, indent=2) + "\n")
    report["complete"] = True
    emit(report, args.out)


def _autogroup() -> str:
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
    except OSError:
        return "unknown"


if __name__ == "__main__":
    main()
