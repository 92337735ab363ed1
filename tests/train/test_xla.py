"""The XLA path (how Trainium runs PyTorch), on torch_xla's CPU device: `make test-xla`.

Skipped unless torch_xla is importable; it needs its own environment (torch and torch_xla of
the same version, ~7 GB: see ../shared/reference/xla-on-cpu.md and the Makefile's test-xla).
Dropout is off (TRAINMASTER_DROPOUT=0): XLA's random numbers are not the CPU's, so with
dropout the two devices would train different networks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch_xla")

from tests.train.helpers import make_job, metrics, processes_mentioning, summary, torchrun, trainer  # noqa: E402

pytestmark = pytest.mark.slow
XLA_ENV = {"PJRT_DEVICE": "CPU", "TRAINMASTER_DROPOUT": "0"}
STEPS = ("train.max_steps=6", "train.warmup_steps=2", "train.checkpoint_every=3")


def test_xla_losses_are_the_cpu_losses(pydoc_storage: Path) -> None:
    cpu = make_job(pydoc_storage, "xla-ref-cpu", 'train.device="cpu"', *STEPS, nproc=1)
    xla = make_job(pydoc_storage, "xla-run", 'train.device="xla"', *STEPS, nproc=1)
    for job in (cpu, xla):
        result = trainer(job, pydoc_storage, timeout=600, env=XLA_ENV)
        assert result.returncode == 0, result.stderr[-3000:]
    assert summary(xla)["device"] == "xla" and summary(xla)["steps"] == 6
    a, b = metrics(cpu), metrics(xla)
    assert [r["loss"] for r in b] == pytest.approx([r["loss"] for r in a], abs=1e-4)
    assert [r["grad_norm"] for r in b] == pytest.approx([r["grad_norm"] for r in a], rel=1e-3)
    assert (xla.parent / "checkpoints" / "step_6" / "model.pt").exists()


def test_xla_resumes_from_its_checkpoint(pydoc_storage: Path) -> None:
    job = make_job(pydoc_storage, "xla-resume", 'train.device="xla"', *STEPS,
                   "train.steps_this_run=3", nproc=1)
    for _ in range(2):
        result = trainer(job, pydoc_storage, timeout=600, env=XLA_ENV)
        assert result.returncode == 0, result.stderr[-3000:]
    assert summary(job)["resumed_from"] == 3 and [r["step"] for r in metrics(job)] == list(range(1, 7))


def test_more_than_one_xla_worker_on_a_cpu_is_refused(pydoc_storage: Path) -> None:
    """torch_xla on a CPU would give every process rank 0 of 1 and silently not all-reduce."""
    job = make_job(pydoc_storage, "xla-two", 'train.device="xla"', *STEPS)
    result = torchrun(job, pydoc_storage, timeout=300, env=XLA_ENV)
    assert result.codes == [1]
    lines = result.error_lines()
    assert lines and all("PJRT_DEVICE=CPU" in line and "2 workers" in line for line in lines)
    assert not processes_mentioning(str(job))
