"""Checkpoint writes in a writer process (background): training goes on, the atomic-save
guarantees hold, and a kill of the trainer or of its writer, at any point, leaves the previous
checkpoint as the newest complete one."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, wait_for
from tests.train import ckpt_hooks
from tests.train.test_checkpoint import META, one_step, setup
from trainmaster.run import checkpoints
from trainmaster.train.checkpoint import background, saving, staging
from trainmaster.train.dataset import Position
from trainmaster.train.loop import param_checksum

# Checkpoint writing and device choices use torch's newer and private APIs: run on every
# stack (the trn1 stack too, `make stacks`).
pytestmark = pytest.mark.stacks


def stage(step: int, rt, bert, opt, sched) -> saving.Staged:  # type: ignore[no-untyped-def]
    staged = saving.stage(
        step=step,
        rt=rt,
        model=bert,
        optimizer=opt,
        scheduler=sched,
        position=Position(1, 2, 12),
        meta=META,
        host=False,
    )
    assert staged is not None
    return staged


def hold(monkeypatch: pytest.MonkeyPatch, folder: Path, step: int) -> None:
    """The writer stops half-way through `step` until release(folder)."""
    os.mkfifo(folder.parent / ckpt_hooks.RELEASE)
    hook = functools.partial(ckpt_hooks.hold_at, step)
    monkeypatch.setattr(saving, "mid_save_hooks", [hook])


def held_at(folder: Path) -> int | None:
    marker = folder.parent / ckpt_hooks.HELD
    return int(marker.read_text()) if marker.exists() else None


def release(folder: Path) -> None:
    with open(folder.parent / ckpt_hooks.RELEASE, "w", encoding="utf-8"):
        pass


def gone(pid: int) -> bool:
    """Exited (a zombie counts: in a container nobody may reap an orphan), every thread of it:
    the main thread turns zombie while the others may still be exiting, and the process's open
    files (a FIFO it reads) are closed only when the last of them has."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except (FileNotFoundError, ProcessLookupError):
        return True
    return all(_state(t) in ("Z", None) for t in tasks)


def _state(task: Path) -> str | None:
    """A thread's state letter; None once it is gone."""
    try:
        return (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "checkpoints").mkdir()
    return tmp_path / "checkpoints"


@pytest.fixture
def writer(folder: Path):  # type: ignore[no-untyped-def]
    done: list[background.Written] = []
    w = background.BackgroundWriter(folder, keep=3, on_written=done.append)
    w.done = done  # type: ignore[attr-defined]
    yield w
    w.close()


def test_what_is_written_is_the_state_at_the_save(
    folder: Path, writer: background.BackgroundWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training updates the weights and optimizer state in place while the writer process
    writes: the checkpoint holds the state at the save, not whatever training reached since."""
    _, rt, bert, opt, sched = setup()
    one_step(bert, opt, sched)
    at_save = param_checksum(bert)
    hold(monkeypatch, folder, 1)
    writer.submit(stage(1, rt, bert, opt, sched))
    wait_for(lambda: held_at(folder) == 1, 120, "the writer to be half-way through step 1")
    one_step(bert, opt, sched)  # while the write is held half-way
    assert writer.busy
    release(folder)
    writer.wait()
    done = writer.done  # type: ignore[attr-defined]
    assert not writer.busy and [w.step for w in done] == [1]
    assert done[0].bytes == sum(f.stat().st_size for f in done[0].path.glob("*.pt"))
    assert param_checksum(bert) != at_save
    _, _, bert2, opt2, sched2 = setup()
    saving.load_model(done[0].path, bert2)
    assert param_checksum(bert2) == at_save
    assert saving.load_trainer(done[0].path, opt2, sched2) == 1
    exp_avg = [s for s in opt2.state_dict()["state"].values()]
    assert exp_avg and all(int(s["step"]) == 1 for s in exp_avg)  # not 2: the state at the save
    # The same file format as a synchronous save: tied weights once, every key there.
    monkeypatch.setattr(saving, "mid_save_hooks", [])
    sync = saving.save(
        folder.parent / "sync",
        step=1,
        rt=rt,
        model=bert2,
        optimizer=opt2,
        scheduler=sched2,
        position=Position(1, 2, 12),
        meta=META,
        keep=1,
    )
    assert sync is not None
    ours = torch.load(done[0].path / saving.MODEL, weights_only=True)
    theirs = torch.load(sync / saving.MODEL, weights_only=True)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], v) for k, v in theirs.items())
    storages = [{v.untyped_storage().data_ptr() for v in d.values()} for d in (ours, theirs)]
    assert len(storages[0]) == len(storages[1]) < len(ours)  # tied weights written once


def slow_copy(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """A stand-in for a slow device-to-host copy into the block: (started, let_go)."""
    started, let_go = threading.Event(), threading.Event()
    real = staging.Arena.fill

    def fill(self: staging.Arena, tensors: list[torch.Tensor]) -> None:
        started.set()
        assert let_go.wait(120)
        real(self, tensors)

    monkeypatch.setattr(staging.Arena, "fill", fill)
    return started, let_go


def test_the_copy_runs_beside_the_next_step_and_only_the_update_waits(
    folder: Path, writer: background.BackgroundWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save costs training what is left of its copy into the block when the next step's
    optimizer update comes (forward and backward change no saved tensor): submit() returns
    while the copy is still held, before_update() waits for it, and the checkpoint holds the
    values of its step although training updated them right after."""
    _, rt, bert, opt, sched = setup()
    one_step(bert, opt, sched)
    at_save = param_checksum(bert)
    started, let_go = slow_copy(monkeypatch)
    writer.submit(stage(1, rt, bert, opt, sched))  # returns: the copy runs in its thread
    assert started.wait(60) and not let_go.is_set()
    waited: list[float | None] = []
    update = threading.Thread(target=lambda: waited.append(writer.before_update()))
    update.start()
    update.join(timeout=0.5)
    assert update.is_alive()  # the optimizer may not touch the tensors yet
    let_go.set()
    update.join(timeout=60)
    assert not update.is_alive() and waited and (waited[0] or 0) > 0
    assert writer.before_update() is None  # one wait per save
    one_step(bert, opt, sched)  # the update, and the next
    writer.wait()
    done = writer.done  # type: ignore[attr-defined]
    assert [w.step for w in done] == [1] and param_checksum(bert) != at_save
    _, _, bert2, _, _ = setup()
    saving.load_model(done[0].path, bert2)
    assert param_checksum(bert2) == at_save


def test_a_copy_that_fails_fails_the_next_wait_and_publishes_nothing(
    folder: Path, writer: background.BackgroundWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, rt, bert, opt, sched = setup()

    def broken(self: staging.Arena, tensors: list[torch.Tensor]) -> None:
        raise RuntimeError("the device copy failed")

    monkeypatch.setattr(staging.Arena, "fill", broken)
    writer.submit(stage(1, rt, bert, opt, sched))
    writer.before_update()  # nothing to protect any more: returns
    with pytest.raises(RuntimeError, match="the device copy failed"):
        writer.wait()
    assert checkpoints.latest(folder) is None and not list(folder.iterdir())


def test_a_second_save_waits_for_the_first(
    folder: Path, writer: background.BackgroundWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, rt, bert, opt, sched = setup()
    hold(monkeypatch, folder, 10)
    writer.submit(stage(10, rt, bert, opt, sched))
    wait_for(lambda: held_at(folder) == 10, 120, "the writer to be half-way through step 10")
    second = stage(20, rt, bert, opt, sched)
    submitter = threading.Thread(target=writer.submit, args=(second,))
    submitter.start()
    wait_for(lambda: writer.waiting_for == 10, 30, "the second save to wait for the first")
    assert not list(folder.glob("*step_20*"))  # not started while step 10 is in flight
    release(folder)
    submitter.join(60)
    writer.wait()
    assert [c.step for c in checkpoints.complete(folder)] == [10, 20]
    assert not list(folder.glob(f"{checkpoints.TMP_PREFIX}*"))


def test_a_failed_write_fails_the_next_wait_with_its_exception(
    folder: Path, writer: background.BackgroundWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, rt, bert, opt, sched = setup()
    writer.submit(stage(10, rt, bert, opt, sched))
    writer.wait()
    monkeypatch.setattr(saving, "mid_save_hooks", [functools.partial(ckpt_hooks.crash_at, 20)])
    writer.submit(stage(20, rt, bert, opt, sched))
    with pytest.raises(ckpt_hooks.Crash, match="disk full at step 20") as raised:
        writer.wait()
    assert any("writing step 20" in note for note in raised.value.__notes__)
    writer.wait()  # reported once
    latest = checkpoints.latest(folder)
    assert latest is not None and latest.step == 10
    writer.submit(stage(30, rt, bert, opt, sched))  # the same writer goes on
    writer.wait()
    assert [c.step for c in checkpoints.complete(folder)] == [10, 30]


def test_a_writer_killed_mid_write_fails_the_next_wait_and_a_new_one_takes_over(
    folder: Path, writer: background.BackgroundWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, rt, bert, opt, sched = setup()
    writer.submit(stage(10, rt, bert, opt, sched))
    writer.wait()
    hold(monkeypatch, folder, 20)
    writer.submit(stage(20, rt, bert, opt, sched))
    wait_for(lambda: held_at(folder) == 20, 120, "the writer to be half-way through step 20")
    first = writer.pid
    assert first is not None and first != os.getpid()
    os.kill(first, signal.SIGKILL)
    with pytest.raises(background.WriterDied, match=rf"pid {first}\) was killed by SIGKILL"):
        writer.wait()
    assert list(folder.glob(f"{checkpoints.TMP_PREFIX}step_20-*"))  # the torn write is there...
    latest = checkpoints.latest(folder)
    assert latest is not None and latest.step == 10  # ...and not taken for a checkpoint
    monkeypatch.setattr(saving, "mid_save_hooks", [])
    writer.submit(stage(30, rt, bert, opt, sched))
    writer.wait()
    assert writer.pid not in (None, first)
    assert [c.step for c in checkpoints.complete(folder)] == [10, 30]
    assert not list(folder.glob(f"{checkpoints.TMP_PREFIX}*"))  # the next save cleared it


def test_a_writer_ignores_sigterm_the_trainer_decides(
    folder: Path, writer: background.BackgroundWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A preemption's SIGTERM reaches the whole process group: the writer finishes its write
    (the trainer's preemption checkpoint may be the one in flight)."""
    _, rt, bert, opt, sched = setup()
    hold(monkeypatch, folder, 10)
    writer.submit(stage(10, rt, bert, opt, sched))
    wait_for(lambda: held_at(folder) == 10, 120, "the writer to be half-way through step 10")
    assert writer.pid is not None
    os.kill(writer.pid, signal.SIGTERM)
    release(folder)
    writer.wait()
    latest = checkpoints.latest(folder)
    assert latest is not None and latest.step == 10


CHILD = """
import functools, sys, threading
from pathlib import Path
from tests.train import ckpt_hooks
from tests.train.test_checkpoint import setup, one_step
from tests.train.test_background_writer import stage
from trainmaster.train.checkpoint import background, saving, staging
from trainmaster.train.loop import param_checksum

folder = Path(sys.argv[1])
_, rt, bert, opt, sched = setup()
writer = background.BackgroundWriter(folder, keep=3)
one_step(bert, opt, sched)
writer.submit(stage(10, rt, bert, opt, sched))
writer.wait()
(folder.parent / "sum10").write_text(param_checksum(bert))
saving.mid_save_hooks.append(functools.partial(ckpt_hooks.hold_at, 20))
one_step(bert, opt, sched)
writer.submit(stage(20, rt, bert, opt, sched))
for _ in range(3):  # training goes on while step 20 is being written
    one_step(bert, opt, sched)
(folder.parent / "trained").write_text(f"{writer.busy} {writer.pid}")
threading.Event().wait()
"""


def test_a_trainer_killed_during_a_write_leaves_the_previous_checkpoint(folder: Path) -> None:
    """A real trainer process, SIGKILLed while its writer process is half-way through step 20
    and it has trained three steps on: the writer ends without publishing step 20 (released
    or not), and step 10 is the newest checkpoint, and loads."""
    tmp_path = folder.parent
    os.mkfifo(tmp_path / ckpt_hooks.RELEASE)
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
        assert held_at(folder) == 20
        busy, pid = (tmp_path / "trained").read_text().split()
        assert busy == "True"  # the write was still in flight
        child.send_signal(signal.SIGKILL)
        assert child.wait(60) == -signal.SIGKILL
        wait_for(lambda: gone(int(pid)), 60, "the writer process to end with its trainer")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(60)
    with pytest.raises(OSError):  # nobody left to release: the held write is gone for good
        os.open(tmp_path / ckpt_hooks.RELEASE, os.O_WRONLY | os.O_NONBLOCK)
    assert list(folder.glob(f"{checkpoints.TMP_PREFIX}step_20-*"))  # the torn write is there...
    latest = checkpoints.latest(folder)
    assert latest is not None and latest.step == 10  # ...and not taken for a checkpoint
    _, _, bert, opt, sched = setup()
    saving.load_model(latest.path, bert)
    assert saving.load_trainer(latest.path, opt, sched) == 10
    assert param_checksum(bert) == (tmp_path / "sum10").read_text()


def test_the_shared_buffer_is_reused_and_tied_weights_share_a_slot() -> None:
    from trainmaster.train.checkpoint import staging

    _, _, bert, _, _ = setup()
    state = bert.state_dict()
    skeleton, tensors = staging.flatten(state)
    views = {(v.data_ptr(), tuple(v.shape), v.stride()) for v in state.values()}
    assert len(tensors) == len(views) < len(state)  # the MLM decoder is the word embeddings
    layout, size = staging.layout_of(tensors)
    fd = staging.shared_fd()
    os.ftruncate(fd, size)
    arena = staging.Arena(fd, size, layout)
    try:
        arena.fill(tensors)
        back = staging.unflatten(skeleton, arena.views)
        assert back.keys() == state.keys()
        assert all(torch.equal(back[k], v) for k, v in state.items())
        assert len({id(t) for t in back.values()}) == len(views)  # still tied, saved once
        assert all(s.offset % staging.ALIGN == 0 for s in layout)
    finally:
        arena.close()
        os.close(fd)


def test_tensors_without_an_address_get_a_slot_each() -> None:
    """An XLA tensor has no address (data_ptr() is 0, as on the meta device here): keyed by it,
    every tensor of one shape and dtype shared one slot, and a checkpoint of an XLA run held
    one LayerNorm weight for every LayerNorm weight and bias, and exp_avg for exp_avg_sq (NaN
    after a resume: tests/train/test_xla.py). The one tensor met twice still shares its slot."""
    from trainmaster.train.checkpoint import staging

    a, b = torch.zeros(4, device="meta"), torch.ones(4, device="meta")
    assert a.data_ptr() == b.data_ptr() == 0
    skeleton, tensors = staging.flatten({"a": a, "b": b, "a again": a})
    assert len(tensors) == 2 and skeleton["a"] == skeleton["a again"] != skeleton["b"]


def test_the_block_is_page_locked_portably_on_the_trainings_gpu_and_a_refusal_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No GPU here: a stand-in for torch's CUDA runtime binding records what the pin asks.
    It runs on a thread of its own, on the training's device, with the portable flag; the
    unpin on the same device; a refused pin is said once and never tried again."""
    calls: list[tuple[str, str, object]] = []
    answer = {"register": 0}

    class Runtime:
        def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:  # noqa: N802
            calls.append(("register", threading.current_thread().name, flags))
            return answer["register"]

        def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802
            calls.append(("unregister", threading.current_thread().name, ptr))
            return 0

    devices: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "cudart", Runtime)
    monkeypatch.setattr(torch.cuda, "set_device", devices.append)
    gpu = torch.device("cuda", 3)
    fd = staging.shared_fd()
    os.ftruncate(fd, staging.ALIGN)
    try:
        arena = staging.Arena(fd, staging.ALIGN, ())
        arena.pin_for_cuda(gpu)
        arena.pin_for_cuda(gpu)  # pinned already: not again
        arena.close()
        assert [c[0] for c in calls] == ["register", "unregister"]
        assert calls[0][1] == "checkpoint-pin" and calls[0][2] == staging.HOST_REGISTER_PORTABLE
        assert devices == [gpu, gpu]

        calls.clear()
        answer["register"] = 2  # cudaErrorMemoryAllocation
        refused = staging.Arena(fd, staging.ALIGN, ())
        refused.pin_for_cuda(gpu)
        refused.pin_for_cuda(gpu)
        refused.close()
        assert [c[0] for c in calls] == ["register"]  # once, and nothing to unpin
        assert capsys.readouterr().err.count("staging block not page-locked (2)") == 1
    finally:
        os.close(fd)
