"""`--compile`: torch.compile with its cache on storage, cold then warm. Opt-in (slow).

A cold compile of bert-tiny's training step takes ~100 s on 2 cores, more than the whole
trainer suite's budget, so this runs only with TRAINMASTER_TEST_COMPILE=1.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.train.helpers import make_job, metrics, summary, trainer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("TRAINMASTER_TEST_COMPILE") != "1",
        reason="slow (~3 min): set TRAINMASTER_TEST_COMPILE=1",
    ),
]
STEPS = ("train.max_steps=4", "train.warmup_steps=2")


def test_compiled_training_and_its_cache(pydoc_storage: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {"TRAINMASTER_COMPILE_CACHE": str(cache), "TRAINMASTER_DROPOUT": "0"}
    eager = make_job(pydoc_storage, "eager", *STEPS, nproc=1)
    cold = make_job(pydoc_storage, "compiled-cold", *STEPS, nproc=1)
    warm = make_job(pydoc_storage, "compiled-warm", *STEPS, "train.compile=true", nproc=1)
    assert trainer(eager, pydoc_storage, env=env).returncode == 0
    first = trainer(cold, pydoc_storage, env=env, timeout=600, extra=("--compile",))
    assert first.returncode == 0, first.stderr[-3000:]
    assert summary(cold)["compile_cache"] == "cold"
    assert (cache / "inductor").is_dir() and any((cache / "inductor").rglob("*.py"))
    second = trainer(warm, pydoc_storage, env=env, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert summary(warm)["compile_cache"] == "warm"
    losses = [[r["loss"] for r in metrics(job)] for job in (eager, cold, warm)]
    assert losses[1] == pytest.approx(losses[0], abs=1e-3)
    assert losses[2] == pytest.approx(losses[1], abs=1e-5)
