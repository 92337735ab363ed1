"""`python3 -m trainmaster.backends.kubernetes.cache_hold ... -- COMMAND`: hold a cacheset's lock around a command.

Pod 0 of a Kubernetes job that uses the shared compile cache runs its whole command under this
(backends/kubernetes/volcano.py), for two reasons the trainer's own lock (train/__main__._use_cache, rank 0,
released when the trainer exits) cannot cover (docs/architecture.md 5: 17.3):

- neuron_parallel_compile runs the training script first and compiles the graphs it extracted
  only after the script has exited: the lock must outlive the trainer, so it is held here,
  around the wrapper, until the command has ended.
- A Neuron job with train.compile=false still compiles every graph, into the same shared
  cache (podspec.env configures it whatever train.compile says): it takes the lock as well.
  Sharing the cache under the lock, rather than a private per-pod cache, keeps what the job
  compiles for the next one, which a Neuron job needs (a cold compile of BERT-large is hours).

The token is the attempt's rendezvous id, known to every pod of the attempt (TRAINMASTER_CACHE_LOCK
in every pod's environment), so the trainer's rank 0, on whichever pod it lands, sees that its
job holds the lock and does not take it again. A lock left by this job's previous attempt is
taken over at once; another job's is waited for, up to --wait seconds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainmaster.backends.kubernetes import podproc
from trainmaster.compile import lock
from trainmaster.errors import UserError

EXIT_BAD_INPUT = 2


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise UserError(
            "usage: cache_hold --cache DIR --job NAME --token T [--wait S] -- COMMAND...",
            where="cache_hold",
        )
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="trainmaster.backends.kubernetes.cache_hold")
    parser.add_argument("--cache", required=True, type=Path)
    parser.add_argument("--job", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--purpose", default="train")
    parser.add_argument("--wait", type=float, default=600.0)
    args = parser.parse_args(argv[:cut])
    command = argv[cut + 1 :]
    if not command or not args.token:
        raise UserError("needs a token and a command after --", where="cache_hold")
    return args, command


def main(argv: list[str] | None = None) -> int:
    try:
        args, command = parse(sys.argv[1:] if argv is None else argv)
        held = lock.acquire(
            args.cache,
            job=args.job,
            purpose=args.purpose,
            wait_s=args.wait,
            reclaim_own_job=True,
            token=args.token,
            on_wait=lambda h: print(
                f"trainmaster: waiting up to {args.wait:g} s for "
                f"the compile cache, in use by {h.describe()}",
                file=sys.stderr,
                flush=True,
            ),
        )
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    held.start_heartbeat()
    try:
        child = podproc.start(command)  # SIGTERM passed on: the lock is kept until its end
        if child is None:
            return podproc.CANNOT_START
        code = child.wait()
    finally:
        held.release()
    return podproc.exit_code(code)


if __name__ == "__main__":
    sys.exit(main())
