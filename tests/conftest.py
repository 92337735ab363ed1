"""Shared fixtures: run the real `trainmaster` command in a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def cli_command(*args: str) -> list[str]:
    """`python -m trainmaster ARGS`: the command line a test starts (with Popen when it must
    watch or signal the process; run_cli otherwise)."""
    return [sys.executable, "-m", "trainmaster", *args]


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every CLI test runs in: plain text, wide enough for the tables."""
    return {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **(extra or {})}


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`python -m trainmaster ARGS` as a user would run it (no in-process shortcuts)."""
    return subprocess.run(
        cli_command(*args),
        cwd=cwd,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_user_error(
    result: subprocess.CompletedProcess[str], *texts: str, where: str | None = None
) -> str:
    """Bad input as a user must meet it: exit 2 and one line on stderr, `error: WHERE: ...`,
    holding every text (no traceback: it would be more lines). Returns the line."""
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    if where is not None:
        assert lines[0].startswith(f"error: {where}: "), lines[0]
    for text in texts:
        assert text in lines[0], (text, lines[0])
    return lines[0]


def sigint_default() -> None:
    """preexec_fn of a child the test Ctrl-Cs: SIGINT handled as in a terminal. A test run
    started in the background of a non-interactive shell inherits SIGINT ignored (POSIX), and
    Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll another process's progress until cond() holds; AssertionError after timeout s."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)  # polling another process's progress, bounded


@pytest.fixture
def cli():  # type: ignore[no-untyped-def]
    return run_cli


@pytest.fixture(scope="session")
def pydoc_storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A storage root holding the built-in corpus as shards (datasets/pydoc), made once.

    Small on purpose (one duplicate, a 4k vocabulary) so that jobs start in seconds.
    """
    root = tmp_path_factory.mktemp("storage")
    result = run_cli(
        "data",
        "prepare",
        "--builtin",
        "pydoc",
        "--output",
        str(root / "datasets" / "pydoc"),
        "--shards",
        "4",
        "--dupe-factor",
        "1",
        "--vocab-size",
        "4096",
        "--seq-len",
        "128",
        "--quiet",
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    return root


def etcd_available() -> bool:
    import shutil

    return shutil.which("etcd") is not None


@pytest.fixture(scope="session")
def finished_run(pydoc_storage: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(storage, job): a real 2-node local job of REPORT_STEPS steps, run to the end, made once
    for the session (the monitor and estimate tests read it)."""
    from tests.monitor.conftest import REPORT_STEPS, job_file
    from trainmaster.run import state
    from trainmaster.storage import Storage

    job = "monitored"
    path = job_file(tmp_path_factory.mktemp("monitor-job"), job, f"train.max_steps={REPORT_STEPS}")
    result = run_cli("launch", str(path), "--storage", str(pydoc_storage), "--follow", timeout=600)
    assert result.returncode == 0, result.stderr
    assert state.read(Storage(pydoc_storage).run_dir(job) / "state.json").phase == "succeeded"
    return pydoc_storage, job
