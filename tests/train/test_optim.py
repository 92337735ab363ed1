"""LAMB against a NumPy computation of the published rule; parameter groups; schedules."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainmaster import jobfile
from trainmaster.train import model, optim


def lamb_reference(params: list[np.ndarray], grads: list[list[np.ndarray]], *, lr: float,
                   wd: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6) -> list[np.ndarray]:
    """The LAMB rule, step by step, in float64."""
    p = [x.astype(np.float64) for x in params]
    m = [np.zeros_like(x) for x in p]
    v = [np.zeros_like(x) for x in p]
    for t, step_grads in enumerate(grads, start=1):
        for i, g in enumerate(step_grads):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            m_hat, v_hat = m[i] / (1 - b1**t), v[i] / (1 - b2**t)
            u = m_hat / (np.sqrt(v_hat) + eps) + wd * p[i]
            w_norm, u_norm = np.linalg.norm(p[i]), np.linalg.norm(u)
            ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            p[i] = p[i] - lr * ratio * u
    return p


def test_lamb_matches_the_numpy_reference() -> None:
    rng = np.random.default_rng(0)
    start = [rng.normal(size=(4, 3)), rng.normal(size=5), np.zeros(3)]  # a zero tensor: ratio 1
    grads = [[rng.normal(size=x.shape) for x in start] for _ in range(5)]
    tensors = [torch.tensor(x, dtype=torch.float32, requires_grad=True) for x in start]
    opt = optim.Lamb(tensors, lr=0.01, weight_decay=0.01)
    for step_grads in grads:
        for t, g in zip(tensors, step_grads, strict=True):
            t.grad = torch.tensor(g, dtype=torch.float32)
        opt.step()
    expected = lamb_reference(start, [[g.astype(np.float64) for g in s] for s in grads],
                              lr=0.01, wd=0.01)
    for t, e in zip(tensors, expected, strict=True):
        np.testing.assert_allclose(t.detach().numpy(), e, rtol=1e-5, atol=1e-6)
    # the trust ratio matters: plain Adam would have moved the first tensor differently
    adam = start[0] - 0.01 * 5 * np.sign(grads[0][0])
    assert not np.allclose(tensors[0].detach().numpy(), adam, atol=1e-3)


def test_lamb_state_round_trips() -> None:
    p = torch.nn.Parameter(torch.ones(3))
    opt = optim.Lamb([p], lr=0.1)
    p.grad = torch.ones(3)
    opt.step()
    again = optim.Lamb([torch.nn.Parameter(p.detach().clone())], lr=0.1)
    again.load_state_dict(opt.state_dict())
    assert float(again.state[again.param_groups[0]["params"][0]]["step"]) == 1.0


def test_no_weight_decay_on_bias_and_layer_norm() -> None:
    cfg = jobfile.preset("local-cpu")
    bert = model.build(cfg, 300)
    decay, no_decay = optim.param_groups(bert, 0.01)
    names = {id(p): n for n, p in bert.named_parameters()}
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert all("bias" in names[id(p)] or "LayerNorm" in names[id(p)] for p in no_decay["params"])
    assert all("bias" not in names[id(p)] and "LayerNorm" not in names[id(p)] for p in decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(bert.parameters()))


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_optimizer_choice(name: str) -> None:
    cfg = jobfile.preset("local-cpu", [f'train.optimizer="{name}"'])
    opt = optim.make_optimizer(cfg, model.build(cfg, 300), "cpu")
    if name == "adamw":
        assert isinstance(opt, torch.optim.AdamW) and opt.defaults["fused"] is True
        assert opt.defaults["eps"] == 1e-6
    else:
        assert isinstance(opt, optim.Lamb)


def test_schedules_warm_up_then_decay_to_zero() -> None:
    linear = optim.Schedule(warmup=4, max_steps=12, power=1.0)
    poly = optim.Schedule(warmup=4, max_steps=12, power=0.5)
    assert [linear(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert [linear(s) for s in (4, 8, 11, 12)] == [1.0, 0.5, 0.125, 0.0]
    assert poly(8) == pytest.approx(0.5**0.5) and poly(12) == 0.0
    assert all(linear(s) > 0 for s in range(12))  # no update runs with lr 0
    no_warmup = optim.Schedule(warmup=0, max_steps=10, power=1.0)
    assert no_warmup(0) == 1.0
