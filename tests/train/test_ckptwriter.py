"""Background checkpoint writes (ckptwriter): training goes on, the atomic-save guarantees hold."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, wait_for
from tests.train.test_checkpoint import META, one_step, setup
from trainmaster.train import checkpoint, ckptdir, ckptwriter
from trainmaster.train.dataset import Position


def stage(step: int, rt, bert, opt, sched) -> checkpoint.Staged:  # type: ignore[no-untyped-def]
    staged = checkpoint.stage(
        step=step,
        rt=rt,
        model=bert,
        optimizer=opt,
        scheduler=sched,
        position=Position(1, 2, 12),
        meta=META,
    )
    assert staged is not None
    return staged


class _Crash(Exception):
    pass


def test_a_staged_copy_is_private_and_the_write_loads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training updates the weights and optimizer state in place while the write runs: what is
    written is the state at the save, not whatever training reached meanwhile."""
    _, rt, bert, opt, sched = setup()
    one_step(bert, opt, sched)
    at_save = {k: v.clone() for k, v in bert.state_dict().items()}
    staged = stage(1, rt, bert, opt, sched)
    assert all(staged.model[k].data_ptr() != v.data_ptr() for k, v in bert.state_dict().items())
    trained = threading.Event()
    monkeypatch.setattr(checkpoint, "mid_save_hooks", [lambda folder, step: trained.wait(60)])
    done: list[ckptwriter.Written] = []
    writer = ckptwriter.BackgroundWriter(tmp_path, keep=3, on_written=done.append)
    writer.submit(staged)
    one_step(bert, opt, sched)  # while the writer is held half-way
    trained.set()
    writer.wait()
    assert not writer.busy and [w.step for w in done] == [1]
    assert done[0].bytes == sum(f.stat().st_size for f in done[0].path.glob("*.pt"))
    _, _, bert2, opt2, sched2 = setup()
    checkpoint.load_model(done[0].path, bert2)
    assert all(torch.equal(at_save[k], v) for k, v in bert2.state_dict().items())
    assert checkpoint.load_trainer(done[0].path, opt2, sched2) == 1
    exp_avg = [s for s in opt2.state_dict()["state"].values()]
    assert exp_avg and all(int(s["step"]) == 1 for s in exp_avg)  # not 2: the state at the save


def test_a_second_save_waits_for_the_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, rt, bert, opt, sched = setup()
    entered, release = threading.Event(), threading.Event()

    def hold_first(folder: Path, step: int) -> None:
        if step == 10:
            entered.set()
            assert release.wait(60)

    monkeypatch.setattr(checkpoint, "mid_save_hooks", [hold_first])
    writer = ckptwriter.BackgroundWriter(tmp_path, keep=3)
    writer.submit(stage(10, rt, bert, opt, sched))
    assert entered.wait(60)
    second = stage(20, rt, bert, opt, sched)
    submitter = threading.Thread(target=writer.submit, args=(second,))
    submitter.start()
    wait_for(lambda: writer.waiting_for == 10, 30, "the second save to wait for the first")
    assert not list(tmp_path.glob("*step_20*"))  # not started while step 10 is in flight
    release.set()
    submitter.join(60)
    writer.wait()
    assert [c.step for c in ckptdir.complete(tmp_path)] == [10, 20]
    assert not list(tmp_path.glob(f"{ckptdir.TMP_PREFIX}*"))


def test_a_failed_background_write_fails_the_next_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, rt, bert, opt, sched = setup()
    writer = ckptwriter.BackgroundWriter(tmp_path, keep=3)
    writer.submit(stage(10, rt, bert, opt, sched))
    writer.wait()

    def crash(folder: Path, step: int) -> None:
        raise _Crash

    monkeypatch.setattr(checkpoint, "mid_save_hooks", [crash])
    writer.submit(stage(20, rt, bert, opt, sched))
    with pytest.raises(_Crash):
        writer.wait()
    writer.wait()  # reported once
    latest = ckptdir.latest(tmp_path)
    assert latest is not None and latest.step == 10


CHILD = """
import sys, threading
from pathlib import Path
from tests.train.test_checkpoint import setup, one_step
from tests.train.test_ckptwriter import stage
from trainmaster.train import checkpoint, ckptwriter
from trainmaster.train.loop import param_checksum

folder = Path(sys.argv[1])
_, rt, bert, opt, sched = setup()
writer = ckptwriter.BackgroundWriter(folder, keep=3)
one_step(bert, opt, sched)
writer.submit(stage(10, rt, bert, opt, sched))
writer.wait()
(folder.parent / "sum10").write_text(param_checksum(bert))
never = threading.Event()
def hang(f, step):
    (folder.parent / "in-write").write_text(str(step))
    never.wait()
checkpoint.mid_save_hooks.append(hang)
one_step(bert, opt, sched)
writer.submit(stage(20, rt, bert, opt, sched))
for _ in range(3):  # training goes on while step 20 is being written
    one_step(bert, opt, sched)
(folder.parent / "trained").write_text(f"{writer.busy}")
never.wait()
"""


def test_a_kill_during_a_background_write_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    """A real process, SIGKILLed while its writer thread is half-way through step 20 and its
    training thread has gone on three steps: step 10 is the newest checkpoint, and loads."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(folder)], cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(
            lambda: (tmp_path / "trained").exists() or child.poll() is not None,
            120,
            "the child to train on during the write",
        )
        assert child.poll() is None, child.stderr.read() if child.stderr else ""
        assert (tmp_path / "in-write").read_text() == "20"
        assert (tmp_path / "trained").read_text() == "True"  # the write was still in flight
        child.send_signal(signal.SIGKILL)
        assert child.wait(60) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(60)
    assert list(folder.glob(f"{ckptdir.TMP_PREFIX}step_20-*"))  # the torn write is there...
    latest = ckptdir.latest(folder)
    assert latest is not None and latest.step == 10  # ...and not taken for a checkpoint
    from trainmaster.train.loop import param_checksum

    _, _, bert, opt, sched = setup()
    checkpoint.load_model(latest.path, bert)
    assert checkpoint.load_trainer(latest.path, opt, sched) == 10
    assert param_checksum(bert) == (tmp_path / "sum10").read_text()
