"""The fence on the checkpoint writer (train/checkpoint/saving.py publish_guards, run/peers.py):
an attempt that another one replaced never publishes a checkpoint, only its temporary folder is
left, which no reader takes for one."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from trainmaster.run import checkpoints, peers
from trainmaster.train.checkpoint import saving


def staged(step: int) -> saving.Staged:
    return saving.Staged(step, {"w": torch.ones(2)}, {"step": step}, [{}], {"step": step})


def test_a_fenced_attempt_does_not_publish_its_checkpoint(tmp_path: Path) -> None:
    folder, fence = tmp_path / "checkpoints", peers.Fence(tmp_path / "fence", "attempt-v0")
    saving.publish_guards[:] = [pickle.loads(pickle.dumps(fence))]  # as the writer gets it
    try:
        fence.claim()
        saving.write(folder, staged(2), keep=2)  # ours: published
        peers.Fence(tmp_path / "fence", "attempt-v1").claim()
        with pytest.raises(peers.Fenced):
            saving.write(folder, staged(3), keep=2)
    finally:
        saving.publish_guards[:] = []
    newest = checkpoints.latest(folder)
    assert newest is not None and newest.step == 2
    assert not (folder / checkpoints.step_name(3)).exists()
