"""The checkpoint writer process: `python -m trainmaster.train.checkpoint.writerproc CMD RESULT ARENA
TRAINER` (file descriptors: commands in, results out, the shared staging block; the trainer's
pid). background starts it; nothing else should.

It runs saving.write() on what the trainer staged in the shared block, one request at a
time, and answers each with what it wrote or the exception it raised. Its own GIL, its own
core time (one thread): the trainer's Python never waits on a write. The big files go from the
block to disk with O_DIRECT (odirect): the page cache's copy of them cost this process more
system CPU than all the rest, on a core that training needs.

It lives exactly as long as its trainer: the trainer closing the command pipe, or dying (the
kernel closes it then), ends it at once, even half-way through a write. So a write that its
trainer did not live to see is never published (the .tmp-* folder stays, which readers ignore),
and an orphan cannot race a restarted trainer's own writer. SIGTERM and SIGINT are the
trainer's to handle (preemption: it saves, then closes the pipe); the writer ignores them.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

# Not below the trainer by default: on a machine whose cores training fills (the 2-core bench),
# a niced writer (10) starved, its 1.1 GB writes took 15-23 s instead of 3-4, and the next save
# stood still waiting for it with a core idle (bench/checkpoint_cost.py, 2 rounds: 2.1x and 3.2x
# the no-checkpoint run, against 2.1x and 1.19x at nice 0). TRAINMASTER_CHECKPOINT_WRITER_NICE
# sets it where spare cores make a lower priority free.
NICE_ENV, NICE = "TRAINMASTER_CHECKPOINT_WRITER_NICE", 0


def main(argv: list[str]) -> None:
    cmd_fd, result_fd, arena_fd, trainer = map(int, argv)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.nice(int(os.environ.get(NICE_ENV) or NICE))
    import torch  # after the signals: a SIGTERM while torch loads must not end the writer

    from trainmaster.train.checkpoint import saving

    torch.set_num_threads(1)
    saving.writing_for = trainer
    commands = Connection(cmd_fd, writable=False)
    results = Connection(result_fd, readable=False)
    requests: queue.Queue[Any] = queue.Queue()
    threading.Thread(
        target=_serve, args=(requests, results, arena_fd, trainer), daemon=True
    ).start()
    while True:
        try:
            requests.put(commands.recv_bytes())
        except (EOFError, OSError):
            os._exit(0)  # the trainer is done or gone: drop whatever is being written


def _serve(requests: queue.Queue[Any], results: Connection, arena_fd: int, trainer: int) -> None:
    from trainmaster.train.checkpoint import saving, staging

    arena: staging.Arena | None = None

    def trainer_alive() -> None:
        if os.getppid() != trainer:
            os._exit(0)

    while True:
        request = requests.get()
        started, t0 = time.time(), time.perf_counter()
        try:
            step, folder, keep, size, layout, skeleton, hooks, guards = pickle.loads(request)
            if arena is None or (arena.size, arena.layout) != (size, layout):
                if arena is not None:
                    arena.close()
                arena = staging.Arena(arena_fd, size, layout)
            model, trainer_state, ranks, meta = staging.unflatten(skeleton, arena.views)
            saving.mid_save_hooks[:] = hooks
            saving.publish_guards[:] = guards
            staged = saving.Staged(step, model, trainer_state, ranks, meta)
            path, nbytes = saving.write(Path(folder), staged, keep, trainer_alive, arena)
            seconds = time.perf_counter() - t0
            answer: tuple[Any, ...] = ("ok", step, str(path), started, seconds, nbytes)
        except BaseException as exc:  # the trainer raises it at its next wait
            answer = ("error", _picklable(exc), traceback.format_exc())
        results.send_bytes(pickle.dumps(answer))


def _picklable(exc: BaseException) -> BaseException:
    """The exception itself where it survives pickling (so the trainer raises the same type,
    as a save on its own thread would have), else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main(sys.argv[1:])
