"""Checkpoints: atomic (a crash mid-write leaves the previous one loadable), owned, restored."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.train.helpers import make_job
from trainmaster.config import jobfile
from trainmaster.errors import UserError
from trainmaster.run import checkpoints
from trainmaster.train import model, optim, preflight
from trainmaster.train.checkpoint import saving
from trainmaster.train.dataset import Position
from trainmaster.train.device import Runtime

# Checkpoint writing and device choices use torch's newer and private APIs: run on every
# stack (the trn1 stack too, `make stacks`).
pytestmark = pytest.mark.stacks

META = {"job": "t", "config_hash": "abc", "vocab_size": 300, "files": []}


def setup():  # type: ignore[no-untyped-def]
    cfg = jobfile.preset("local-cpu", ['train.optimizer="lamb"'])
    rt = Runtime(preflight.Env(), "cpu", bf16=False)
    bert = model.build(cfg, 300)
    opt = optim.make_optimizer(cfg, bert, "cpu")
    sched = optim.make_scheduler(cfg, opt)
    return cfg, rt, bert, opt, sched


def one_step(bert, opt, sched) -> None:  # type: ignore[no-untyped-def]
    loss = sum(p.sum() for p in bert.parameters()) * 1e-3
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()


def save(folder: Path, step: int, rt, bert, opt, sched, keep: int = 3) -> Path:  # type: ignore[no-untyped-def]
    path = saving.save(
        folder,
        step=step,
        rt=rt,
        model=bert,
        optimizer=opt,
        scheduler=sched,
        position=Position(1, 2, 12),
        meta=META,
        keep=keep,
    )
    assert path is not None
    return path


def test_round_trip_restores_weights_optimizer_and_schedule(tmp_path: Path) -> None:
    _, rt, bert, opt, sched = setup()
    one_step(bert, opt, sched)
    path = save(tmp_path, 1, rt, bert, opt, sched)
    one_step(bert, opt, sched)
    after_two = {k: v.clone() for k, v in bert.state_dict().items()}

    _, rt2, bert2, opt2, sched2 = setup()
    saving.load_model(path, bert2)
    assert saving.load_trainer(path, opt2, sched2) == 1
    assert saving.load_rank(path, rt2, same_world=True)
    assert not saving.load_rank(path, rt2, same_world=False)
    one_step(bert2, opt2, sched2)
    assert all(torch.equal(after_two[k], v) for k, v in bert2.state_dict().items())
    assert sched2.get_last_lr() == sched.get_last_lr()
    meta = checkpoints.read_meta(path)
    assert meta is not None and meta["positions"] == [[1, 2, 12]] and meta["world_size"] == 1
    assert meta["config_hash"] == "abc" and meta["step"] == 1


def test_a_run_resumed_with_more_steps_decays_to_its_new_end(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """`launch --resume --set train.max_steps=30` on a run that ended at 20: the checkpoint's
    schedule (rate 0 at step 20) gives way to the job file's, from step 20 on."""
    base = ["train.warmup_steps=5", 'train.optimizer="adamw"']
    cfg = jobfile.preset("local-cpu", [*base, "train.max_steps=20"])
    rt = Runtime(preflight.Env(), "cpu", bf16=False)
    bert = model.build(cfg, 300)
    opt = optim.make_optimizer(cfg, bert, "cpu")
    sched = optim.make_scheduler(cfg, opt)
    for _ in range(20):
        one_step(bert, opt, sched)
    path = save(tmp_path, 20, rt, bert, opt, sched)
    assert sched.get_last_lr()[0] == 0.0  # the old end

    longer = jobfile.preset("local-cpu", [*base, "train.max_steps=30"])
    assert longer.derived.config_hash == cfg.derived.config_hash
    opt2 = optim.make_optimizer(longer, bert, "cpu")
    sched2 = optim.make_scheduler(longer, opt2)
    assert saving.load_trainer(path, opt2, sched2) == 20
    expected = longer.train.lr * (1 - (20 - 5) / (30 - 5))
    assert sched2.get_last_lr()[0] == pytest.approx(expected)
    assert opt2.param_groups[0]["lr"] == pytest.approx(expected)
    assert "from step 20 on" in capfd.readouterr().err

    same = optim.make_optimizer(cfg, bert, "cpu")
    sched3 = optim.make_scheduler(cfg, same)
    saving.load_trainer(path, same, sched3)  # the same schedule: untouched
    assert set(sched3.get_last_lr()) == {0.0} and sched3.last_epoch == 20
    assert "from step" not in capfd.readouterr().err


def test_rng_state_is_restored_exactly(tmp_path: Path) -> None:
    _, rt, bert, opt, sched = setup()
    torch.manual_seed(11)
    random.seed(11)
    np.random.seed(11)
    path = save(tmp_path, 3, rt, bert, opt, sched)
    expected = (torch.rand(4).tolist(), random.random(), float(np.random.rand()))
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    saving.load_rank(path, rt, same_world=True)
    assert (torch.rand(4).tolist(), random.random(), float(np.random.rand())) == expected


def test_a_half_written_checkpoint_is_ignored_and_the_previous_one_loads(tmp_path: Path) -> None:
    _, rt, bert, opt, sched = setup()
    save(tmp_path, 10, rt, bert, opt, sched)
    # a crash while writing step 20: its temporary folder, half a file in it
    tmp = checkpoints.temp_dir(tmp_path, 20)
    tmp.mkdir()
    (tmp / "model.pt").write_bytes(b"PK\x03\x04 torn")
    # a step folder without its meta.json, and one whose meta is torn
    (tmp_path / "step_30").mkdir()
    (tmp_path / "step_40").mkdir()
    (tmp_path / "step_40" / "meta.json").write_text('{"step": 4')
    latest = checkpoints.latest(tmp_path)
    assert latest is not None and latest.step == 10
    _, _, bert2, _, _ = setup()
    saving.load_model(latest.path, bert2)
    assert all(
        torch.equal(a, b)
        for a, b in zip(bert.state_dict().values(), bert2.state_dict().values(), strict=True)
    )
    save(tmp_path, 50, rt, bert, opt, sched)  # the next save clears temporaries
    assert not tmp.exists()
    assert [c.step for c in checkpoints.complete(tmp_path)] == [10, 50]


def test_only_the_newest_are_kept_and_a_step_can_be_rewritten(tmp_path: Path) -> None:
    _, rt, bert, opt, sched = setup()
    for step in (1, 2, 3, 4):
        save(tmp_path, step, rt, bert, opt, sched, keep=2)
    assert [c.step for c in checkpoints.complete(tmp_path)] == [3, 4]
    save(tmp_path, 4, rt, bert, opt, sched, keep=2)
    assert [c.step for c in checkpoints.complete(tmp_path)] == [3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_3", "step_4"]


def test_a_checkpoint_of_another_configuration_is_refused(pydoc_storage: Path) -> None:
    job = make_job(pydoc_storage, "owned", nproc=1)
    step = job.parent / "checkpoints" / "step_5"
    step.mkdir(parents=True)
    cfg = jobfile.load(job)
    (step / "meta.json").write_text(
        json.dumps({**META, "step": 5, "job": "owned", "config_hash": "0123456789abcdef"})
    )
    with pytest.raises(UserError) as err:
        preflight.make_plan(job, str(pydoc_storage), environ={})
    message = str(err.value)
    assert "step_5" in message and "0123456789abcdef" in message
    assert cfg.derived.config_hash in message and "job.name" in message and "delete" in message
    (step / "meta.json").write_text(
        json.dumps(
            {
                **META,
                "step": 5,
                "job": "owned",
                "config_hash": cfg.derived.config_hash,
                "world_size": 1,
                "positions": [[0, 1, 8]],
                "files": [f"pydoc_training_{k}.hdf5" for k in range(4)],
                "vocab_size": 4096,
            }
        )
    )
    plan = preflight.make_plan(job, str(pydoc_storage), environ={})
    assert plan.resume is not None and plan.resume.step == 5 and plan.position == Position(0, 1, 8)
    # The plan is frozen: rank 0's other choice (saving.agree_on_resume) is a new plan.
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.resume = None  # type: ignore[misc]
    fresh = plan.resuming_from(None)
    assert fresh.resume is None and fresh.position == Position() and fresh.first_shard == {}
    assert plan.resume.step == 5 and plan.position == Position(0, 1, 8)  # unchanged
    again = fresh.resuming_from(plan.resume)
    assert again.resume == plan.resume and again.position == Position(0, 1, 8)


class _Crash(Exception):
    pass


def test_a_mid_save_hook_runs_half_way_and_a_crash_there_keeps_the_previous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """saving.save knows no faults: it calls its hooks half-way (model written, the rest not)."""
    _, rt, bert, opt, sched = setup()
    save(tmp_path, 10, rt, bert, opt, sched)
    seen: list[tuple[int, list[str]]] = []

    def crash(folder: Path, step: int) -> None:
        seen.append((step, sorted(p.name for p in checkpoints.temp_dir(folder, step).iterdir())))
        raise _Crash

    monkeypatch.setattr(saving, "mid_save_hooks", [crash])
    with pytest.raises(_Crash):
        save(tmp_path, 20, rt, bert, opt, sched)
    assert seen == [(20, [saving.MODEL])]
    latest = checkpoints.latest(tmp_path)
    assert latest is not None and latest.step == 10


def test_the_fault_hook_is_installed_only_when_a_test_asks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from trainmaster.train import faults

    monkeypatch.setattr(saving, "mid_save_hooks", [])
    faults.install({})
    assert saving.mid_save_hooks == []
    faults.install({faults.KILL_IN_CHECKPOINT_ENV: "20"})
    (hook,) = saving.mid_save_hooks
    hook(tmp_path, 10)  # another step: nothing happens, no marker
    assert not list(tmp_path.iterdir())
