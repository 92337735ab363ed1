"""bench/gpu.sh: its arguments, and the JSON line's shape through the --dry run on the CPU (the
real run needs a CUDA machine; README says whether it has run on one)."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import assert_user_error

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu.sh"
ENV = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}


def _run(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or ENV,
        cwd=ROOT,
    )


def test_help_says_what_it_does() -> None:
    r = _run("--help")
    assert r.returncode == 0
    assert "BERT-large phase 1" in r.stdout and "--dry" in r.stdout and "torch==2.13.0" in r.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--modes", "eager,jit"), "--modes: unknown jit"),
        (("--steps", "0"), "--steps must be at least 1"),
        (("--batch", "-4"), "--batch must be non-negative"),
        (("--stpes", "3"), "unrecognized arguments: --stpes"),
    ],
)
def test_bad_arguments_fail_before_anything_is_installed(
    args: tuple[str, ...], message: str
) -> None:
    r = _run(*args)
    assert r.returncode == 2  # argparse's usage lines, then the error: a bench, not the CLI
    assert message in r.stderr.splitlines()[-1]


@pytest.mark.skipif(
    shutil.which("nvidia-smi") is not None, reason="a CUDA machine: it would install"
)
def test_without_a_gpu_it_says_so() -> None:
    r = _run("--steps", "3")
    assert_user_error(r, "needs a CUDA machine")


def test_dry_run_prints_one_json_line_of_the_real_shape(tmp_path: Path) -> None:
    modes = "eager,handwritten,checkpoint,launch,profile"  # compile's take minutes on a CPU
    r = _run(
        "--dry",
        "--modes",
        modes,
        "--steps",
        "1",
        "--warmup",
        "0",
        timeout=600,
        env={**ENV, "TRAINMASTER_BENCH_OUT": str(tmp_path)},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert out["bench"] == "gpu" and out["dry"] is True and out["micro_batch"] == 4
    assert out["seq_len"] == 128 and out["max_pred"] == 20 and out["gpus"] == 1
    assert (
        out["published"]["seq_per_s"] == 580
        and "DeepLearningExamples" in out["published"]["source"]
    )
    # Each mode's result also went to stderr as it came: what a run cut off at its limit keeps.
    said = [x for x in r.stderr.splitlines() if x.startswith("gpu_bench: ") and "): {" in x]
    assert [json.loads(x.partition("): ")[2]) for x in said] == out["results"]
    res, hand, ckpt, job, prof = out["results"]
    assert set(res) == {
        "mode",
        "seq_per_s",
        "mfu",
        "peak_memory_gib",
        "time_to_first_step_s",
        "timed_steps",
        "step_s",
        "final_loss",
    }
    assert res["mode"] == "eager" and res["timed_steps"] == 1
    assert res["seq_per_s"] > 0 and res["time_to_first_step_s"] > 0
    assert res["mfu"] is None and res["peak_memory_gib"] is None  # no GPU, no catalog peak
    assert 0 < res["final_loss"] < 20  # a real loss came back from the trainer's step
    assert hand["mode"] == "handwritten" and hand["seq_per_s"] > 0 and 0 < hand["final_loss"] < 20
    assert ckpt["mode"] == "checkpoint" and ckpt["saves"] == 1  # 4 steps, a save every 2
    assert ckpt["checkpoint_gb"] > 0 and ckpt["write_mb_per_s"] > 0
    assert isinstance(ckpt["standstill_per_save_s"], float) and ckpt["host_wait_per_save_s"] >= 0
    # launch: the real CLI, 6 steps, a save every 2 (steps 2 and 4 while training, 6 at the end)
    assert job["mode"] == "launch" and job["phase"] == "succeeded" and job["steps"] == 6
    assert job["saves"] == 3 and job["final_wait_s"] > 0
    assert 0 <= job["standstill_per_save_s"] <= job["max_standstill_per_save_s"]
    assert job["seq_per_s"] > 0 and job["time_to_first_step_s"] > 0 and job["mfu"] is None
    assert job["compile_cache"] == "off" and 0 < job["final_loss"] < 20 and 0 < job["goodput"] < 1
    assert job["cost_line"].startswith("cost so far $") and "1 x cpu at $" in job["cost_line"]
    # profile: eager on a CPU, no kernels; its ops and the chrome trace are real
    assert prof["mode"] == "profile" and prof["compiled"] is False and prof["profiled_steps"] == 3
    assert prof["gpu_busy"] is None and prof["syncs_per_step"] is None
    assert prof["categories_ms_per_step"] == {} and prof["step_ms"] > 0
    assert prof["attention"] and set(prof["attention"]) <= {"math", "flash (cpu)"}
    assert any(name.startswith("aten::") for name, _ in prof["top_ms_per_step"])
    assert Path(prof["trace"]) == tmp_path / "profile-trace.json.gz"
    trace = json.loads(gzip.decompress(Path(prof["trace"]).read_bytes()))  # what Perfetto opens
    assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])
    summary = out["summary"]
    assert summary["attention_kernel"] == prof["attention"] and summary["gpu_busy_compiled"] is None
    assert summary["seq_per_s_launch"] == job["seq_per_s"]
    assert summary["standstill_per_save_s_launch"] == job["standstill_per_save_s"]
    assert summary["seq_per_s_eager"] == res["seq_per_s"]
    assert summary["standstill_per_save_s"] == ckpt["standstill_per_save_s"]
    assert summary["vs_handwritten"] == round(res["seq_per_s"] / hand["seq_per_s"], 3)
    assert summary["first_step_s_compile_cold"] is None  # not run: said, not made up


def test_a_launch_past_its_time_is_cancelled_not_left_training(
    tmp_path: Path, pydoc_storage: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launch mode's CLI follows the job; killing it at the time limit would leave the
    local supervisor training on the GPU: the mode cancels the job first."""
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_bench
    import gpu_modes

    a = gpu_bench.parse(["--dry", "--ckpt-steps", "100000"])  # hours of bert-tiny steps
    a.data = str(pydoc_storage / "datasets" / "pydoc")
    monkeypatch.setenv(gpu_modes.STORAGE_ENV, str(tmp_path))
    monkeypatch.setenv(gpu_modes.LAUNCH_TIMEOUT_ENV, "20")
    with pytest.raises(SystemExit, match="ran past 20 s; the job is cancelled"):
        gpu_modes.launch(a, 4, 30522)
    status = gpu_modes._cli(tmp_path, "status", gpu_modes.JOB, "--json")
    assert json.loads(status.stdout)["phase"] == "cancelled", status.stderr


def test_the_micro_batch_fit_runs_in_a_child_and_a_failed_child_is_no_fit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The fit probes each candidate in a process of its own (two steps, AdamW's state in the
    second's peak): whatever ends that process, the parent goes on to the next candidate."""
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_bench

    a = argparse.Namespace(data=str(tmp_path / "no-such-dataset"), dry=True)
    fits, why = gpu_bench._fits(a, 8)
    assert fits is False
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said.endswith(f"({why})")
    # the reason is the child's last line (here: a loader over no shards at all)
    assert said.startswith("gpu_bench: micro-batch 8: fits=False (") and "Error" in said


@pytest.mark.parametrize(
    ("line", "kept"),
    [
        ("checkpoint: staging block not page-locked (cudaErrorNotSupported)", True),
        ("checkpoint: step-00000010 written through the page cache: EINVAL", True),
        ("/x/torch/nn/functional.py:5: UserWarning: Flash attention was not used because", True),
        ("warning: tensorboard is not installed; no TensorBoard events are written", True),
        ("W1205 12:00:00.123000 77 torch/_dynamo/convert_frame.py:1 recompile limit", True),
        ("step 10 loss 7.1", False),
        ("Traceback (most recent call last):", False),
    ],
)
def test_a_modes_fallback_lines_go_with_its_figures(line: str, kept: bool) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_modes

    assert gpu_modes.notes_in(["step 1", line, line]) == ([line] if kept else [])


@pytest.mark.parametrize(
    ("code", "stderr", "says"),
    [
        (
            1,
            "x\nRuntimeError: CUDA error: out of memory\n",
            "RuntimeError: CUDA error: out of memory",
        ),
        (-9, "", "killed by SIGKILL (out of host memory?)"),
        (-11, "step 3\n", "killed by SIGSEGV after: step 3"),
        (3, "", "exit 3 with no output"),
    ],
)
def test_a_failed_child_is_told_in_one_line_with_its_signal(
    code: int, stderr: str, says: str
) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_bench

    proc = subprocess.CompletedProcess(["child"], code, stdout="", stderr=stderr)
    assert gpu_bench.failure(proc) == says
