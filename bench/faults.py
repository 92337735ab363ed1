"""Fault trials: does a 2-node local job survive kills and hangs, resume exactly, and how much
time does each cost? (docs/architecture.md 5: 14.6)

    python bench/faults.py [--trials 10] [--kinds kill,kill_in_checkpoint,hang] [--steps 30]
                           [--seed 0] [--out FILE]
    python bench/faults.py --trials 3 --kinds k8s_node_loss     # on the local control plane

The job: bert-tiny, 2 nodes x 1 worker on loopback (c10d), `--steps` steps, a checkpoint every
10, dropout off (so that an exact resume is decidable: the final parameters of a run that was
interrupted and resumed must equal those of an uninterrupted one, bit for bit). One
uninterrupted reference run first, then `--trials` runs of each kind, with a random rank and
step drawn from --seed:

  kill                SIGKILL a random worker right after a random step (not a checkpoint step)
  kill_in_checkpoint  SIGKILL rank 0 half-way through writing a random checkpoint (the model
                      file written, the rest not): the previous checkpoint must be used
  hang                a random worker stops after a random step (sleeps); the hang watchdog
                      (train.hang_timeout = --hang-timeout) must end it
  node_loss           a random node dies after a random step: its torchrun agent and its
                      workers SIGKILLed at once, as when an instance dies; the supervisor must
                      restart the gang (a job retry, job.max_retries) from the last checkpoint
  elastic_node_loss   node_loss in an elastic job (job.min_nnodes = 1): the survivor goes on
                      and the supervisor takes the lost node back into the same rendezvous
                      (backends/local/rejoin.py), or retries the job when the c10d store went
  partition           (root) the job runs with job.network = netns; a random node's link is cut
                      after a random step for --cut seconds (both nodes live on): the hang
                      watchdog must notice and the job complete once the link is back

One kind runs on Kubernetes instead (`make kube-build` first; not in the default --kinds):

  k8s_node_loss       the tutorial's 2-node trn1 job on the local control plane (3 kwok nodes,
                      the real kube-apiserver, controller manager and Volcano) with the node
                      watcher; the heartbeat of the node under pod 0 stops: the seconds to the
                      node NotReady, out of service, and the gang Running again, and where it
                      landed (bench/k8s_node_loss.py, which also runs it at scale)

The local faults are the trainer's test hooks (trainmaster/train/faults.py), each fires once per job.
Per kind it reports completed/N (phase succeeded with every step done), exact/N (the summary's
parameter checksum equals the reference's), the median time to resume (goodput's restart
seconds: from the dead attempt's last event to the next attempt's first step), the median
goodput ratio and the restarts. Prints one JSON object; no assertions (docs/architecture.md 4).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import agent_env, emit, load, machine, prepare_corpus, wait_final
from trainmaster.config import jobfile
from trainmaster.run import metrics as runlog
from trainmaster.run import processes, state, timeline
from trainmaster.storage import RunPaths, Storage
from trainmaster.train import faults
from trainmaster.train.model import DROPOUT_ENV

KINDS = ("kill", "kill_in_checkpoint", "hang", "node_loss", "elastic_node_loss", "partition")
K8S_KINDS = ("k8s_node_loss",)  # on the local control plane: bench/k8s_node_loss.py
CHECKPOINT_EVERY = 10
NODE_LOSS = "_BENCH_NODE_LOSS"  # node:step, read by run_job (not by the trainer)
PARTITION = "_BENCH_PARTITION"  # node:step
ELASTIC = "_BENCH_ELASTIC"  # set: the job is elastic (job.min_nnodes = 1)
TIMEOUT_S = 900.0
CUT_S = 30.0  # how long a partition lasts


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def job_file(
    root: Path,
    name: str,
    steps: int,
    hang_timeout: float,
    netns: bool = False,
    elastic: bool = False,
) -> Path:
    cfg = jobfile.preset(
        "local-cpu",
        [
            *(['job.network="netns"'] if netns else []),
            *(["job.min_nnodes=1"] if elastic else []),
            f'job.name="{name}"',
            f"train.max_steps={steps}",
            "train.warmup_steps=2",
            f"train.checkpoint_every={CHECKPOINT_EVERY}",
            "train.keep_checkpoints=3",
            "job.max_restarts=3",
            "rendezvous.timeout=180",
            f"train.hang_timeout={hang_timeout}",
        ],
    )
    path = root / "jobs" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(jobfile.render(cfg, f"fault trial {name}"), encoding="utf-8")
    return path


def fault_env(kind: str, rng: random.Random, steps: int) -> tuple[dict[str, str], str]:
    """The hook's environment variable for one trial, and the fault in words (node_loss: no
    hook; run_job kills the node itself, from outside, as the platform would)."""
    if kind in ("node_loss", "elastic_node_loss", "partition"):
        node = rng.choice((0, 1))
        step = rng.choice([s for s in range(2, steps) if s % CHECKPOINT_EVERY])
        key = PARTITION if kind == "partition" else NODE_LOSS
        extra = {ELASTIC: "1"} if kind == "elastic_node_loss" else {}
        return {key: f"{node}:{step}", **extra}, f"node {node} after step {step}"
    if kind == "kill_in_checkpoint":
        at = rng.choice(range(CHECKPOINT_EVERY, steps, CHECKPOINT_EVERY))  # not the final one
        return {faults.KILL_IN_CHECKPOINT_ENV: str(at)}, f"rank 0 in checkpoint {at}"
    rank = rng.choice((0, 1))
    step = rng.choice([s for s in range(2, steps) if s % CHECKPOINT_EVERY])
    env = faults.KILL_AT_STEP_ENV if kind == "kill" else faults.HANG_AT_STEP_ENV
    return {env: f"{rank}:{step}"}, f"rank {rank} after step {step}"


def run_job(
    root: Path, name: str, steps: int, hang_timeout: float, extra_env: dict[str, str]
) -> dict[str, Any]:
    loss = extra_env.pop(NODE_LOSS, None)
    cut = extra_env.pop(PARTITION, None)
    elastic = extra_env.pop(ELASTIC, None) is not None
    path = job_file(root, name, steps, hang_timeout, netns=cut is not None, elastic=elastic)
    env = agent_env(2) | {DROPOUT_ENV: "0", "TRAINMASTER_DIST_TIMEOUT_S": "180", **extra_env}
    t0 = time.time()
    launched = subprocess.run(
        [sys.executable, "-m", "trainmaster", "launch", str(path), "--storage", str(root)],
        env=env,
        capture_output=True,
        text=True,
    )
    if launched.returncode != 0:
        return {"phase": "not launched", "error": launched.stderr.strip()[-300:]}
    run = RunPaths(Storage(root).run_dir(name))
    if loss is not None:
        node, step = map(int, loss.split(":"))
        lose_node(run, node, step)
    back = None
    if cut is not None:
        node, step = map(int, cut.split(":"))
        back = partition(run, node, step, CUT_S)
    phase = wait_final(run.state, TIMEOUT_S)
    summary = json.loads(run.summary.read_text()) if run.summary.exists() else {}
    g = summary.get("goodput") or {}
    return {
        "phase": phase,
        "wall_s": round(time.time() - t0, 2),
        "steps": summary.get("steps"),
        "restarts": summary.get("restarts"),
        "resumed_from": summary.get("resumed_from"),
        "checksum": summary.get("param_checksum"),
        "goodput": g.get("ratio"),
        "resume_s": g.get("restart"),
        "steps_lost": g.get("steps_lost"),
        "hangs": len(run.hangs.read_text().splitlines()) if run.hangs.exists() else 0,
        "job_retries": state.read(run.state).job_retries,
        "rejoins": sum(n.rejoins for n in state.read(run.state).nodes),
        "recover_s": recover_s(run, back),
    }


def partition(run: RunPaths, node: int, step: int, seconds: float) -> float:
    """Once the job has logged `step`, cut node's link for `seconds`; returns when it is back."""
    from trainmaster.backends.local import netns

    wait_for_step(run, step)
    net = netns.plan(run.dir, 2)
    netns.set_link(net, node, "down")
    time.sleep(seconds)  # the partition's length is the experiment, not a synchronisation
    netns.set_link(net, node, "up")
    return time.time()


def recover_s(run: RunPaths, back: float | None) -> float | None:
    """From the link's return to the next training step (timeline.jsonl)."""
    if back is None:
        return None
    after = [
        e.t for e in timeline.read(run.timeline) if isinstance(e, timeline.Steps) and e.t > back
    ]
    return round(min(after) - back, 2) if after else None


def wait_for_step(run: RunPaths, step: int) -> None:
    end = time.monotonic() + TIMEOUT_S
    while time.monotonic() < end:
        rows = runlog.read_jsonl(run.metrics)
        if rows and int(rows[-1].get("step", 0)) >= step:
            return
        time.sleep(0.2)  # polling another process's progress


def lose_node(run: RunPaths, node: int, step: int) -> None:
    """Once the job has logged `step`, SIGKILL node's agent (its process group) and workers."""
    wait_for_step(run, step)
    st = state.read(run.state)
    workers = [w.pid for w in processes.workers(st) if w.node == node]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(st.nodes[node].pid or 0, signal.SIGKILL)
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def tally(trials: list[dict[str, Any]], steps: int, reference: str | None) -> dict[str, Any]:
    done = [t for t in trials if t["phase"] == "succeeded" and t["steps"] == steps]
    return {
        "trials": len(trials),
        "completed": len(done),
        "exact": sum(1 for t in done if reference and t["checksum"] == reference),
        "median_time_to_resume_s": _median(
            [t["resume_s"] for t in done if t["resume_s"] is not None]
        ),
        "median_goodput": _median([t["goodput"] for t in done if t["goodput"] is not None]),
        "restarts": [t["restarts"] for t in trials],
        "job_retries": [t.get("job_retries", 0) for t in trials],
        "rejoins": [t.get("rejoins", 0) for t in trials],
        "median_recover_s": _median(
            [t["recover_s"] for t in done if t.get("recover_s") is not None]
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10, help="trials of each kind")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"some of {','.join(KINDS)}")
    ap.add_argument("--steps", type=int, default=30, help="steps per job (a checkpoint every 10)")
    ap.add_argument("--hang-timeout", type=float, default=15.0, help="train.hang_timeout, seconds")
    ap.add_argument("--seed", type=int, default=0, help="draws the ranks and steps of the faults")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS) - set(K8S_KINDS))
    if unknown or args.trials < 1 or args.steps <= CHECKPOINT_EVERY + 2:
        ap.error(f"--kinds from {','.join(KINDS + K8S_KINDS)}, --trials >= 1, "
                 f"--steps > {CHECKPOINT_EVERY + 2}")  # fmt: skip
    rng = random.Random(args.seed)
    started, load_before = time.time(), load()
    results: dict[str, Any] = {}
    if "k8s_node_loss" in kinds:
        import k8s_node_loss  # bench/, beside this file

        say(f"k8s_node_loss: {args.trials} trial(s) on the local control plane")
        results["k8s_node_loss"] = k8s_node_loss.measure(args.trials, 60, nodes=3, nnodes=2)
    local = [k for k in kinds if k in KINDS]
    ref: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        if local:
            say("preparing the built-in corpus")
            prepare_corpus(root, shards=4)
            say("reference run (no fault)")
            ref = run_job(root, "reference", args.steps, args.hang_timeout, {})
            say(f"  {ref['phase']} in {ref['wall_s']} s, goodput {ref['goodput']}")
        for kind in local:
            assert ref is not None
            trials = []
            for i in range(args.trials):
                env, what = fault_env(kind, rng, args.steps)
                t = run_job(
                    root, f"{kind.replace('_', '-')}-{i}", args.steps, args.hang_timeout, env
                )
                t["fault"] = what
                t["exact"] = t["checksum"] == ref["checksum"] and ref["checksum"] is not None
                say(
                    f"  {kind} {i + 1}/{args.trials} ({what}): {t['phase']}, restarts "
                    f"{t['restarts']}, resumed from {t['resumed_from']}, exact {t['exact']}, "
                    f"resume {t['resume_s']} s, goodput {t['goodput']}"
                )
                trials.append(t)
            results[kind] = {**tally(trials, args.steps, ref["checksum"]), "runs": trials}
    emit(
        {
            "bench": "faults",
            "what": (
                "measured here: a 2-node x 1-worker bert-tiny job on loopback (c10d), "
                f"{args.steps} steps, a checkpoint every {CHECKPOINT_EVERY}, dropout off; "
                "faults injected by the trainer's test hooks"
            ),
            "command": "python bench/faults.py " + " ".join(sys.argv[1:]),
            "machine": machine(),
            "load_before": load_before,
            "load_after": load(),
            "seconds": round(time.time() - started, 1),
            "seed": args.seed,
            "hang_timeout_s": args.hang_timeout,
            "reference": ref,
            "summary": {
                k: {
                    x: v
                    for x, v in r.items()
                    if x != "runs" and not (x == "trials" and isinstance(v, list))
                }
                for k, r in results.items()
            },
            "results": results,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
