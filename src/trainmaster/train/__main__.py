"""`python -m trainmaster.train --job STORAGE/runs/JOB/job.toml [--storage ROOT] [--compile]`.

torchrun starts this on every worker (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR... come from
its environment); started by hand without torchrun it is one worker of a world of 1. Exit
codes: 0 done, 2 bad input (one `error: ...` line on stderr, no traceback), 3 hung (the
watchdog), 4 diverged (train.on_divergence: one line, run/divergence.py), 143 preempted
(SIGTERM, after a checkpoint), 1 anything else.
"""

from __future__ import annotations

import time

STARTED = time.time()  # before the heavy imports: time_to_first_step_s counts them

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402

from trainmaster.compile import cache, lock  # noqa: E402
from trainmaster.errors import EXIT_BAD_INPUT, EXIT_FAILED, UserError  # noqa: E402
from trainmaster.run import divergence, ranklog  # noqa: E402
from trainmaster.train import preempt, preflight  # noqa: E402

LOCK_WAIT_ENV = "TRAINMASTER_CACHE_LOCK_WAIT_S"
DEFAULT_LOCK_WAIT_S = 600.0  # a trainer that takes the lock itself (Kubernetes) waits this long


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m trainmaster.train",
        description="Train BERT (MLM + NSP) as one worker of a job.",
    )
    p.add_argument("--job", required=True, help="the run's job.toml (STORAGE/runs/JOB/job.toml)")
    p.add_argument(
        "--storage",
        default=None,
        help="storage root (else job.storage, $TRAINMASTER_STORAGE, ./trainmaster-data)",
    )
    p.add_argument(
        "--compile", action="store_true", help="torch.compile the model (as train.compile)"
    )
    return p.parse_args(argv)


def _exit(code: int, *, hard: bool) -> int:
    """Leave a distributed run with os._exit: no interpreter teardown.

    Tearing down a gloo process group can deadlock: ~ProcessGroupGloo joins its worker thread
    while holding the GIL, and that thread may be freeing a finished collective's tensors,
    which needs the GIL (seen at exit after DDP). A peer or the prefetch thread may also be
    mid-operation after an error. Everything worth keeping is flushed and closed by then.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    if hard:
        os._exit(code)
    return code


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        plan = preflight.make_plan(args.job, args.storage, compile_flag=args.compile)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return _exit(EXIT_BAD_INPUT, hard=False)
    hard = plan.env.world_size > 1
    ranklog.tee_to_rank_file(plan.run.logs, plan.env.rank)
    stopped = divergence.refuse_restart(plan.run.rollbacks, os.environ)
    if stopped is not None:  # a restart of a launch that stopped for divergence: stop again
        if plan.env.rank == 0:
            print(f"trainmaster: {stopped}", file=sys.stderr)
        return _exit(divergence.EXIT_DIVERGED, hard=hard)
    held: lock.CacheLock | None = None
    code = 0
    try:
        if plan.compile_cache is not None:  # before torch reads its cache settings
            held = _use_cache(plan)
        from trainmaster.train import faults, loop  # torch, transformers: only after the checks

        faults.install()  # tests only: does nothing unless a fault test asks for one
        loop.train(plan, STARTED)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = EXIT_BAD_INPUT
    except preempt.Preempted as exc:
        print(f"trainmaster: {exc}", flush=True)
        code = preempt.EXIT_PREEMPTED
    except divergence.Diverged as exc:
        if plan.env.rank == 0:
            print(f"trainmaster: {exc}", file=sys.stderr, flush=True)
        code = divergence.EXIT_DIVERGED
    except BaseException:
        traceback.print_exc()
        code = EXIT_FAILED
    if held is not None:  # before os._exit, which runs no finally blocks
        held.release()
    return _exit(code, hard=hard)


def _use_cache(plan: preflight.Plan) -> lock.CacheLock | None:
    """The cacheset's settings for this process; on rank 0, its lock unless the launcher holds it."""
    assert plan.compile_cache is not None
    kind = cache.mechanism(plan.cfg)
    os.environ.update(cache.env(kind, plan.compile_cache))
    os.environ.update(cache.worker_env(kind, plan.compile_cache, plan.env.rank))
    for folder in cache.dirs_to_make(kind, plan.compile_cache):
        folder.mkdir(parents=True, exist_ok=True)
    if plan.env.rank != 0:
        return None
    wait_s = float(os.environ.get(LOCK_WAIT_ENV) or DEFAULT_LOCK_WAIT_S)
    return lock.for_worker(
        plan.compile_cache,
        job=plan.cfg.job.name,
        wait_s=wait_s,
        launcher_token=os.environ.get(cache.LOCK_ENV),
        on_wait=lambda h: print(
            f"waiting up to {wait_s:g} s for the compile cache, in use by {h.describe()}",
            flush=True,
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
