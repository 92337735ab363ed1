"""The supervisor started by `launch` (backends/local/detach.py), with real processes: a fork of
the CLI that holds nothing of its caller, and the program itself when the caller has threads."""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_for
from trainmaster import api
from trainmaster.backends.local import launcher
from trainmaster.run import pids, state
from trainmaster.storage import RunPaths, Storage

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
# Each rank waits for the test to open its FIFO (go0, go1 in the launch folder): the job runs
# until the test has looked at its supervisor.
SCRIPT = """\
import os
print("hello from rank", os.environ["RANK"], flush=True)
open(f"go{os.environ['RANK']}").read()
"""


def _go(folder: Path, ranks: int) -> None:
    for rank in range(ranks):
        with (folder / f"go{rank}").open("w"):  # opens once the rank reads; closing ends it
            pass


def _fifos(folder: Path, ranks: int) -> None:
    (folder / "hello.py").write_text(SCRIPT)
    for rank in range(ranks):
        os.mkfifo(folder / f"go{rank}")


@contextlib.contextmanager
def _cancelled_unless_released(
    run: RunPaths, cli: subprocess.Popen[bytes] | None = None
) -> Iterator[None]:
    """A failed check leaves no job waiting on its FIFOs, and no CLI waiting on the job."""
    try:
        yield
    except BaseException:
        if cli is not None:
            cli.kill()
        if run.state.exists():
            launcher.cancel(run, grace_s=5)
        raise


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_the_forked_supervisor_keeps_none_of_the_callers_pipes(tmp_path: Path) -> None:
    """A caller that reads the CLI's output, or any pipe it passed down, gets EOF when the CLI
    returns, not when the job ends; the supervisor is nobody's child and logs to its file."""
    _fifos(tmp_path, 2)
    extra_read, extra_write = os.pipe()
    store = tmp_path / "store"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainmaster", "--storage", str(store), "launch", "hello.py",
         "--nnodes", "2", "--name", "forked"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(extra_write,),
        env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    os.close(extra_write)
    run = RunPaths(Storage(store).run_dir("forked"))
    with _cancelled_unless_released(run, proc):
        out, err = proc.communicate(timeout=120)  # EOF on both pipes: no copy of them lives on
        assert proc.returncode == 0, err
        ready, _, _ = select.select([extra_read], [], [], 60)  # bounded: a held pipe never ends
        assert ready and os.read(extra_read, 1) == b"", "the supervisor holds the caller's pipe"
        st = state.read(run.state)
        sup = st.supervisor_pid
        assert sup and pids.pid_alive(sup, st.supervisor_start) and os.getsid(sup) == sup
        assert os.readlink(f"/proc/{sup}/fd/1") == str(run.logs / "supervisor.log")
        _go(tmp_path, 2)
    os.close(extra_read)
    wait_for(lambda: state.observed(run.state).phase in state.FINAL, 240, "the end")
    assert state.read(run.state).phase == "succeeded", (run.logs / "supervisor.log").read_text()
    assert "hello from rank 1" in (run.logs / "rank1.log").read_text()
    assert b"local://forked" in out


def test_a_caller_with_threads_starts_the_supervisor_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork copies only the calling thread: with another thread running, the supervisor is
    `python -m trainmaster.backends.local.supervisor RUN_DIR`, as before."""
    _fifos(tmp_path, 1)
    monkeypatch.chdir(tmp_path)
    cfg = api.script_job("hello.py", [], nnodes=1, name="threaded")
    store = Storage(tmp_path / "store")
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    run = RunPaths(store.run_dir("threaded"))
    try:
        st = launcher.start(cfg, store, launcher.plan(cfg, store))
    finally:
        stop.set()
        other.join()
    with _cancelled_unless_released(run):
        assert st.supervisor_pid is not None
        assert "-m trainmaster.backends.local.supervisor" in _cmdline(st.supervisor_pid)
        _go(tmp_path, 1)
    wait_for(lambda: state.observed(run.state).phase in state.FINAL, 240, "the end")
    assert state.read(run.state).phase == "succeeded", (run.logs / "supervisor.log").read_text()
    assert json.loads(run.summary.read_text())["status"] == "completed"
