"""precompile -> launch warm, end to end on the CPU, through the real CLI and real processes.

One cold compile (bert-tiny, 1 node x 1 worker, ~2 min on 2 cores) is shared by the module:
the precompile job first waits for a lock that another process holds, then fills the cache;
the launch that follows must find it warm, and torch.compile's own counters must show cache
hits and no misses (no timing is asserted). Everything else here starts no training.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.backends.local.test_local import wait_final
from tests.compile.helpers import RUN_ENV, job_file, summary, tm
from tests.compile.test_lock import Proc, holder
from tests.conftest import assert_user_error, cli_command, sigint_default, wait_for
from trainmaster.compile import fingerprint, lock
from trainmaster.storage import Storage

# A cold compile takes ~2 min on 2 idle cores, far longer on a busy machine: the module's budget.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
JOB = "warmjob"


@pytest.fixture(scope="module")
def precompiled(pydoc_storage: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`precompile --wait-lock` on a cacheset locked by another process, released meanwhile."""
    tmp = tmp_path_factory.mktemp("precompile")
    path = job_file(tmp, JOB)
    folder = Storage(pydoc_storage).cache_dir(JOB)
    err = tmp / "precompile.err"
    with holder(folder, "other-job") as other:
        assert other.line().startswith("held ")
        with err.open("w") as fh:
            proc = subprocess.Popen(
                cli_command(
                    "precompile",
                    str(path),
                    "--storage",
                    str(pydoc_storage),
                    "--steps",
                    "2",
                    "--wait-lock",
                    "300",
                    "--json",
                ),
                stdout=subprocess.PIPE,
                stderr=fh,
                text=True,
                env={**os.environ, **RUN_ENV},
                preexec_fn=sigint_default,
            )
        try:
            wait_for(
                lambda: "is in use by job other-job" in err.read_text(), 60, "precompile to wait"
            )
            assert (
                not Storage(pydoc_storage)
                .run_dir(f"{JOB}-precompile")
                .joinpath("state.json")
                .exists()
            )
            other.release()
            assert other.line() == "released"
            stdout, _ = proc.communicate(timeout=1200)
        finally:
            if proc.poll() is None:  # Ctrl-C: the CLI cancels the job it started, then exits
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    assert proc.returncode == 0, err.read_text()[-3000:]
    return {"path": path, "outcome": json.loads(stdout), "stderr": err.read_text()}


@pytest.fixture(scope="module")
def warm(precompiled: dict[str, Any], pydoc_storage: Path) -> dict[str, Any]:
    result = tm(
        "launch", str(precompiled["path"]), "--storage", str(pydoc_storage), "--follow", timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"compile cache warm ({JOB})" in result.stderr  # launch says so before it starts
    assert wait_final(pydoc_storage, JOB).phase == "succeeded"
    return summary(pydoc_storage, JOB)


def test_precompile_waited_for_the_lock_then_filled_the_cache(precompiled: dict[str, Any]) -> None:
    out = precompiled["outcome"]
    assert out["ok"] and out["phase"] == "succeeded" and out["fingerprint"] == "matches"
    assert out["job"] == f"{JOB}-precompile" and out["steps"] == 2
    assert out["compile_counters"]["fxgraph_cache_miss"] > 0  # it compiled
    assert out["entries"]["inductor"] > 0


def test_launch_after_precompile_is_warm_by_the_compilers_counters(
    warm: dict[str, Any], pydoc_storage: Path
) -> None:
    assert warm["compile_cache"] == "warm" and warm["status"] == "completed"
    counts = warm["compile_counters"]
    assert counts["fxgraph_cache_miss"] == 0 and counts["autograd_cache_miss"] == 0, counts
    assert counts["fxgraph_cache_hit"] + counts["autograd_cache_hit"] > 0, counts
    assert warm["time_to_first_step_s"] is not None
    log = (Storage(pydoc_storage).run_dir(JOB) / "logs").glob("*.log")
    assert any("compile cache warm" in p.read_text(errors="replace") for p in log)
    assert lock.read(Storage(pydoc_storage).cache_dir(JOB)) is None  # released at the end


def test_changed_micro_batch_is_refused_naming_the_field(
    warm: dict[str, Any], pydoc_storage: Path, tmp_path: Path
) -> None:
    path = job_file(tmp_path, "otherbatch", f'train.cacheset="{JOB}"', "train.batch_size=4")
    result = tm("launch", str(path), "--storage", str(pydoc_storage))
    line = assert_user_error(result)
    assert "train.cacheset: compile cache warmjob holds the graphs of another job shape" in line
    assert "train.batch_size 8 in the cache, 4 now" in line and "trainmaster precompile" in line
    assert not Storage(pydoc_storage).run_dir("otherbatch").exists()  # nothing started


def test_cache_show_and_list(warm: dict[str, Any], pydoc_storage: Path) -> None:
    shown = tm("cache", "show", JOB, "--storage", str(pydoc_storage), "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert (
        data["fingerprint"]["job"] == JOB and data["fingerprint"]["fields"]["train.batch_size"] == 8
    )
    assert data["lock"] is None and data["entries"]["inductor"] > 0
    listed = tm("cache", "list", "--storage", str(pydoc_storage))
    assert listed.returncode == 0 and JOB in listed.stdout and "free" in listed.stdout


# --- no training below: the lock seen from the CLI --------------------------------------------


def test_launch_on_a_locked_cacheset_is_refused_naming_the_holder(
    pydoc_storage: Path, tmp_path: Path
) -> None:
    path = job_file(tmp_path, "lockedout")
    folder = Storage(pydoc_storage).cache_dir("lockedout")
    with holder(folder, "precompiler") as other:
        assert other.line().startswith("held ")
        line = assert_user_error(tm("launch", str(path), "--storage", str(pydoc_storage)))
        assert f"in use by job precompiler (train; pid {other.p.pid}" in line
        assert not Storage(pydoc_storage).run_dir("lockedout").joinpath("state.json").exists()
        waited = tm("launch", str(path), "--storage", str(pydoc_storage), "--wait-lock", "1")
        lines = waited.stderr.strip().splitlines()
        assert waited.returncode == 2 and "waiting up to 1 s" in lines[-2], waited.stderr
        assert lines[-1].startswith("error: ") and "after waiting 1 s" in lines[-1]
        assert not Storage(pydoc_storage).run_dir("lockedout").joinpath("state.json").exists()
        refused = tm("precompile", str(path), "--storage", str(pydoc_storage), "--wait-lock", "1")
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and "waiting up to 1 s" in lines[-2], refused.stderr
        assert lines[-1].startswith("error: ") and "after waiting 1 s" in lines[-1]
        clear = tm("cache", "clear", "lockedout", "--yes", "--storage", str(pydoc_storage))
        assert "clear it after that job has ended" in assert_user_error(clear)
        assert folder.is_dir()


def test_stale_lock_of_a_killed_process_is_recovered_by_the_cli(pydoc_storage: Path) -> None:
    folder = Storage(pydoc_storage).cache_dir("stale")
    fingerprint.write(folder, {"x": 1}, "someone")
    doomed = Proc(folder, "crashed")
    assert doomed.line().startswith("held ")
    os.kill(doomed.p.pid, signal.SIGKILL)
    doomed.p.wait(timeout=30)
    shown = tm("cache", "show", "stale", "--storage", str(pydoc_storage))
    assert (
        shown.returncode == 0 and f"stale (pid {doomed.p.pid} on this host is gone)" in shown.stdout
    )
    cleared = tm("cache", "clear", "stale", "--yes", "--storage", str(pydoc_storage))
    assert cleared.returncode == 0, cleared.stderr
    assert not folder.exists()


def test_cache_commands_bad_input(pydoc_storage: Path) -> None:
    line = assert_user_error(tm("cache", "show", "nope", "--storage", str(pydoc_storage)))
    assert "CACHESET: no cacheset 'nope' under" in line
    folder = Storage(pydoc_storage).cache_dir("keep")
    folder.mkdir(parents=True)
    result = subprocess.run(
        cli_command("cache", "clear", "keep", "--storage", str(pydoc_storage)),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env={**os.environ, **RUN_ENV},
        timeout=60,
    )
    assert "pass --yes to confirm" in assert_user_error(result) and folder.is_dir()


def test_local_dry_run_starts_nothing(pydoc_storage: Path, tmp_path: Path) -> None:
    path = job_file(tmp_path, "dry", "train.compile=false")
    result = tm(
        "precompile", str(path), "--storage", str(pydoc_storage), "--dry-run", "--steps", "3"
    )
    assert result.returncode == 0, result.stderr
    assert "--rdzv-id=dry-precompile" in result.stdout and "-m trainmaster.train" in result.stdout
    assert "train.compile is off" in result.stderr and "3 step(s) of dry" in result.stderr
    assert not Storage(pydoc_storage).run_dir("dry-precompile").exists()
    assert lock.read(Storage(pydoc_storage).cache_dir("dry")) is None


def test_precompile_of_a_custom_script_is_refused_naming_the_field(
    pydoc_storage: Path, tmp_path: Path
) -> None:
    path = job_file(tmp_path, "own", 'job.entrypoint="-m mypkg.train"')
    line = assert_user_error(
        tm("precompile", str(path), "--storage", str(pydoc_storage), "--dry-run")
    )
    assert line.startswith("error: job.entrypoint:") and "built-in trainer only" in line, line
    assert not Storage(pydoc_storage).run_dir("own-precompile").exists()
