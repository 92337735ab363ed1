"""Start a run's supervisor detached from `launch`: in a fork of the CLI when it can.

A fresh `python -m trainmaster.backends.local.supervisor RUN_DIR` spends a noticeable part of
a second (more on a busy machine) starting an interpreter and importing pydantic, the config and this backend before
it starts the first agent: the CLI has all of that loaded already, so a fork of it starts the
agents that much sooner: a custom script starts as fast as with TorchX's local_cwd
(bench/launch_overhead.py).

The fork is what the program would be: a session of its own, stdin from /dev/null, stdout and
stderr into supervisor.log, the environment given, supervise(RUN_DIR), and an exit that runs
none of the CLI's exit handlers. It is taken only from a single-threaded process (the CLI): a
fork copies the calling thread alone, and a lock another thread held would stay held in the
child. Anything else (an API caller with threads, a platform without fork) starts the program.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import BinaryIO

MODULE = "trainmaster.backends.local.supervisor"


def supervisor(run_dir: Path, log: BinaryIO, env: dict[str, str]) -> int:
    """Start the supervisor of run_dir, writing into log; return its pid."""
    if hasattr(os, "fork") and threading.active_count() == 1:
        pid = _fork(run_dir, log, env)
        if pid:
            return pid
    proc = subprocess.Popen(
        [sys.executable, "-m", MODULE, str(run_dir)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    return proc.pid


def _fork(run_dir: Path, log: BinaryIO, env: dict[str, str]) -> int:
    """Fork twice, so that the supervisor is nobody's child (a long-lived caller collects no
    zombie); the middle process reports its pid through a pipe. 0: no fork happened."""
    from trainmaster.backends.local import supervisor as program  # loaded before the fork

    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # or the child would write the CLI's pending output again
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle:
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            said = pipe.read()
        os.waitpid(middle, 0)
        return int(said or 0)
    code = 1
    try:
        os.close(read_end)
        pid = os.fork()
        if pid:
            os.write(write_end, str(pid).encode())
            os._exit(0)
        os.setsid()  # a session and process group of its own, as start_new_session gives
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        # Every other descriptor goes, as with Popen's close_fds: a pipe the caller waits on
        # (the write end above too) must not stay open for the life of the job. Objects of the
        # CLI that own some are frozen, so that no collection closes a number reused since.
        gc.freeze()
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        # New stream objects: the CLI's may be buffering for a terminal or a pipe.
        sys.stdout = sys.stderr = open(1, "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115
        os.environ.clear()
        os.environ.update(env)
        code = program.supervise(run_dir)
    except BaseException:  # as the program's traceback would reach supervisor.log
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        os._exit(code)
