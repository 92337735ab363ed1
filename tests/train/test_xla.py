"""The XLA path (how Trainium runs PyTorch), on torch_xla's CPU device: part of `make test`.

Skipped unless torch_xla is importable: it runs in the trn1 stack's environment (.venv-trn1,
stacks/trn1.txt; docs/architecture.md, "Stacks"), where `make stacks` runs the tests marked
`stacks`. Dropout is off (TRAINMASTER_DROPOUT=0): XLA's random numbers are not the CPU's, so
with dropout the two devices would train different networks.
"""

from __future__ import annotations

import concurrent.futures
import math
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch_xla")

import torch  # noqa: E402

from tests.train.helpers import make_job, metrics, processes_mentioning, summary, torchrun, trainer  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.stacks]
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


@pytest.mark.parametrize(
    "sets",
    [(), ('train.precision="bf16"', 'train.optimizer="lamb"'), ('train.precision="bf16"',)],
    ids=["fp32", "bf16-lamb", "bf16-adamw"],
)
def test_xla_resumes_from_its_checkpoint(pydoc_storage: Path, sets: tuple[str, ...]) -> None:
    """bf16 weights use the fp32-state optimizers (issues 12.5, 17.12) through a resume."""
    job = make_job(
        pydoc_storage,
        f"xla-resume-{len(sets)}",
        'train.device="xla"',
        *STEPS,
        "train.steps_this_run=3",
        *sets,
        nproc=1,
    )
    for _ in range(2):
        result = trainer(job, pydoc_storage, timeout=600, env=XLA_ENV)
        assert result.returncode == 0, result.stderr[-3000:]
    assert summary(job)["resumed_from"] == 3 and [r["step"] for r in metrics(job)] == list(
        range(1, 7)
    )


@pytest.mark.timeout(900)  # three jobs of up to 600 s (trainer's timeout) on a shared machine
def test_a_resumed_xla_run_keeps_finite_losses(pydoc_storage: Path) -> None:
    """Its losses are the uninterrupted run's. The background writer once saved one XLA tensor
    for all of a shape and dtype (they have no address to tell them apart: staging.flatten), so
    the resumed run started from wrong weights and went NaN at its first update."""
    resumed = make_job(
        pydoc_storage, "xla-resume-finite", 'train.device="xla"', *STEPS,
        "train.steps_this_run=3", nproc=1,
    )  # fmt: skip
    straight = make_job(pydoc_storage, "xla-straight", 'train.device="xla"', *STEPS, nproc=1)
    for job in (resumed, resumed, straight):
        assert trainer(job, pydoc_storage, timeout=600, env=XLA_ENV).returncode == 0
    losses = [r["loss"] for r in metrics(resumed)]
    assert summary(resumed)["resumed_from"] == 3 and all(math.isfinite(x) for x in losses)
    assert losses == pytest.approx([r["loss"] for r in metrics(straight)], abs=1e-5)


@pytest.mark.parametrize("sets", [(), ('train.precision="bf16"', 'train.optimizer="lamb"')],
                         ids=["fp32-adamw", "bf16-lamb"])  # fmt: skip
def test_a_checkpoint_of_xla_tensors_holds_each_of_them(
    tmp_path: Path, sets: tuple[str, ...]
) -> None:
    """The background writer's checkpoint of a model and optimizer on the XLA device holds the
    live values, each its own (XLA tensors all have data_ptr() 0: keyed by it, every tensor of
    one shape and dtype was saved as one of them), and the optimizer state loaded from it on
    the device is the saved one. In a fresh interpreter: torch's autograd engine sizes its
    device queues when it first runs, and a backward on the CPU earlier in this process (the
    stacks suite's other tests) leaves none for the XLA device (an INTERNAL ASSERT in
    engine.cpp)."""
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
        pool.submit(_checkpoint_holds_each_tensor, tmp_path, sets).result(timeout=600)


def _checkpoint_holds_each_tensor(tmp_path: Path, sets: tuple[str, ...]) -> None:
    from tests.train.test_checkpoint import META, one_step
    from trainmaster.config import jobfile
    from trainmaster.train import model, optim, preflight
    from trainmaster.train.checkpoint import BackgroundWriter, Written, saving
    from trainmaster.train.dataset import Position
    from trainmaster.train.device import Runtime

    cfg = jobfile.preset("local-cpu", ['train.device="xla"', *sets])
    rt = Runtime(preflight.Env(), "xla", bf16=cfg.train.precision == "bf16")

    def trainer_state() -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
        bert = model.build(cfg, 300).to(device=rt.device, dtype=rt.model_dtype())
        bert.tie_weights()  # as the trainer does on XLA
        opt = optim.make_optimizer(cfg, bert, "xla")
        return bert, opt, optim.make_scheduler(cfg, opt)

    bert, opt, sched = trainer_state()
    for _ in range(2):
        one_step(bert, opt, sched)
        rt.sync()
    staged = saving.stage(
        step=2, rt=rt, model=bert, optimizer=opt, scheduler=sched,
        position=Position(1, 2, 12), meta=META, host=False,
    )  # fmt: skip
    assert staged is not None
    done: list[Written] = []
    writer = BackgroundWriter(tmp_path, keep=1, on_written=done.append)
    try:
        writer.submit(staged)
        writer.wait()
    finally:
        writer.close()
    path = done[0].path
    live_model, live_opt = saving.to_cpu(bert.state_dict()), saving.to_cpu(opt.state_dict())
    saved_model = torch.load(path / saving.MODEL, weights_only=True)
    saved_opt = torch.load(path / saving.TRAINER, weights_only=True)["optimizer"]
    assert saved_model.keys() == live_model.keys()
    assert all(torch.equal(saved_model[k], v) for k, v in live_model.items())
    ln = "bert.embeddings.LayerNorm"
    assert not torch.equal(saved_model[f"{ln}.weight"], saved_model[f"{ln}.bias"])
    assert _same(saved_opt, live_opt)
    assert all((s["exp_avg_sq"] >= 0).all() for s in saved_opt["state"].values())
    resumed, opt2, sched2 = trainer_state()
    assert saving.load_trainer(path, opt2, sched2) == 2
    assert _same(saving.to_cpu(opt2.state_dict()), saved_opt)


def _tensors(obj: Any, where: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a nested state by its path."""
    if isinstance(obj, dict):
        return {k: v for key, o in obj.items() for k, v in _tensors(o, f"{where}/{key}").items()}
    if isinstance(obj, (list, tuple)):
        return {k: v for i, o in enumerate(obj) for k, v in _tensors(o, f"{where}/{i}").items()}
    return {where: obj} if isinstance(obj, torch.Tensor) else {}


def _same(a: Any, b: Any) -> bool:
    """The same tensors at the same places: dtype, shape and values."""
    x, y = _tensors(a), _tensors(b)
    return x.keys() == y.keys() and all(
        x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]) for k in x
    )


def test_more_than_one_xla_worker_on_a_cpu_is_refused(pydoc_storage: Path) -> None:
    """torch_xla on a CPU would give every process rank 0 of 1 and silently not all-reduce."""
    job = make_job(pydoc_storage, "xla-two", 'train.device="xla"', *STEPS)
    result = torchrun(job, pydoc_storage, timeout=300, env=XLA_ENV)
    assert result.codes == [1]
    lines = result.error_lines()
    assert lines and all("PJRT_DEVICE=CPU" in line and "2 workers" in line for line in lines)
    assert not processes_mentioning(str(job))


@pytest.mark.parametrize("name", ["lamb", "adamw"])
def test_a_resumed_optimizer_step_is_the_fresh_runs_graph(name: str) -> None:
    """docs/architecture.md 5: 17.12. After loading a (CPU) checkpoint, the optimizer's state sits
    where a fresh run's does and the resumed steps compile nothing: they are the fresh run's
    steady graph, which the precompile job put in the cache.

    Before the fix `step` stayed on the CPU (and the moments became bf16); the first resumed
    step compiled one more graph: its IR text equals the steady graph's, the graph hash does
    not, because a 0-dim `step` uploaded from the CPU is another kind of input than one computed
    on the device. The load now compiles one tiny graph (a clone of the steps) instead.
    """
    import torch
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    from trainmaster.train import optim
    from trainmaster.train.checkpoint import saving

    device = xm.xla_device()
    make = optim.Lamb if name == "lamb" else optim.Fp32AdamW

    def compiled() -> int:
        return int(met.metric_data("CompileTime")[0])

    def steps(opt: torch.optim.Optimizer, p: torch.nn.Parameter, n: int) -> None:
        for _ in range(n):
            p.grad = torch.full_like(p, 0.01)
            opt.step()
            xm.mark_step()

    p = torch.nn.Parameter(torch.ones(8, 4, dtype=torch.bfloat16, device=device))
    fresh = make([p], lr=0.1)
    steps(fresh, p, 3)  # step 1 builds the state; steps 2 and 3 are the steady graph
    saved = saving.to_cpu(fresh.state_dict())
    q = torch.nn.Parameter(p.detach().cpu().to(device))  # as the trainer loads model.pt
    resumed = make([q], lr=0.1)
    resumed.load_state_dict(saved)
    assert {k: (v.device, v.dtype) for k, v in resumed.state[q].items()} == {
        k: (v.device, v.dtype) for k, v in fresh.state[p].items()
    }
    assert resumed.state[q]["step"].device == q.device
    loaded = compiled()
    steps(resumed, q, 3)
    assert compiled() == loaded
