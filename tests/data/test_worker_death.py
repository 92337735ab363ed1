"""A forked worker of `data prepare` that dies (the OOM killer, a crash in a C extension) or
hangs without dying (stopped, deadlocked) ends the run through the real CLI: one line on
stderr, exit 2, no output, no process left.

The fault is injected as in test_output_safety.py: a script patches the product, then runs the
CLI's main() in a fresh interpreter; the first forked worker to take a slice sends itself the
signal (SIGKILL: dies; SIGSTOP: alive, silent for good)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

HOOK = """
import multiprocessing as mp, os, signal, sys
from trainmaster.cli.app import main
from trainmaster.data import pool

parent, ctx = os.getpid(), mp.get_context("fork")
taken, first = ctx.Event(), ctx.Lock()  # inherited by the forked workers
real = pool.Worker.examples

def forked():
    with open(sys.argv[1], "a") as f:
        f.write(f"{os.getpid()}\\n")

def examples(self, *args):
    if os.getpid() == parent:
        assert taken.wait(120), "no forked worker took a slice"
    elif first.acquire(block=False):
        taken.set()
        os.kill(os.getpid(), getattr(signal, sys.argv[2]))  # holding its slice
    return real(self, *args)

os.register_at_fork(after_in_child=forked)
pool.Worker.examples = examples
sys.exit(main(sys.argv[3:]))
"""


def prepare_with(tmp_path: Path, vocab: Path, sig: str, *more: str) -> tuple[Path, str]:
    """Run `data prepare` (3 workers) whose first forked worker to take a slice gets SIG;
    (the output folder, stderr) once it exited 2."""
    out, pids = tmp_path / "datasets" / "set", tmp_path / "pids"
    args = ["data", "prepare", "--builtin", "pydoc", "--output", str(out), "--quiet"]
    args += ["--vocab", str(vocab), "--seq-len", "32", "--max-pred", "5"]
    args += ["--dupe-factor", "1", "--shards", "2", "--workers", "3", *more]
    proc = subprocess.run(
        [sys.executable, "-c", HOOK, str(pids), sig, *args],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert proc.returncode == 2, proc.stderr
    return out, proc.stderr


def nothing_left(tmp_path: Path, out: Path, culprit: int) -> None:
    """The culprit was one of the two forked workers, both are gone, and nothing a loader or
    `data verify` would take is there: no output folder, no staging folder."""
    forked = [int(pid) for pid in (tmp_path / "pids").read_text().split()]
    assert len(forked) == 2 and culprit in forked
    assert not any(psutil.pid_exists(pid) for pid in forked)  # the other one was stopped
    assert not out.exists() and list(out.parent.iterdir()) == []
    assert [f for _, _, files in os.walk(tmp_path) for f in files] == ["pids"]


@pytest.mark.timeout(240)  # the failure this guards against was a hang
def test_a_killed_worker_ends_prepare_with_one_line(tmp_path: Path, pydoc_vocab: Path) -> None:
    out, stderr = prepare_with(tmp_path, pydoc_vocab, "SIGKILL")
    line = re.fullmatch(
        r"error: data prepare: worker [12] \(pid (\d+)\) was killed by SIGKILL \(out of "
        r"memory\?\) during the examples stage; the output is unchanged; rerun, with fewer "
        r"--workers if memory is short\n",
        stderr,
    )
    assert line, stderr  # one line, no traceback
    nothing_left(tmp_path, out, int(line.group(1)))


@pytest.mark.timeout(240)
def test_a_hung_worker_ends_prepare_with_one_line(tmp_path: Path, pydoc_vocab: Path) -> None:
    out, stderr = prepare_with(tmp_path, pydoc_vocab, "SIGSTOP", "--stall-timeout", "3")
    line = re.fullmatch(
        r"error: data prepare: worker [12] \(pid (\d+)\) sent nothing for (\d+) s during the "
        r"examples stage \(hung or stopped; --stall-timeout 3\); the output is unchanged; "
        r"rerun\n",
        stderr,
    )
    assert line, stderr
    assert int(line.group(2)) >= 3
    nothing_left(tmp_path, out, int(line.group(1)))
