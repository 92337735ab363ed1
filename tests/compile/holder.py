"""A real process that takes a cacheset's lock: `python -m tests.compile.holder DIR JOB [WAIT_S]`.

Prints `waiting JOB` when it has to wait (naming the holder), `held TOKEN` once it holds the
lock, then holds it until a line arrives on stdin (or stdin closes), releases it and prints
`released`. A refusal prints `refused MESSAGE` and exits 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

from trainmaster.compile import lock
from trainmaster.errors import UserError


def main(argv: list[str]) -> int:
    folder, job = Path(argv[0]), argv[1]
    wait_s = float(argv[2]) if len(argv) > 2 else 0.0
    try:
        held = lock.acquire(
            folder,
            job=job,
            purpose="train",
            wait_s=wait_s,
            on_wait=lambda h: print(f"waiting {h.job}", flush=True),
        )
    except UserError as exc:
        print(f"refused {exc}", flush=True)
        return 2
    print(f"held {held.holder.token}", flush=True)
    sys.stdin.readline()
    held.release()
    print("released", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
