"""Optimizers and learning-rate schedules of BERT pretraining.

AdamW is torch's (fused kernels on cpu/cuda, foreach on xla). LAMB (You et al. 2019, as in
NVIDIA's FusedLAMB with adam_w_mode, bias correction and no trust clipping) is written here with
tensor ops only (no .item()), so it runs unchanged on XLA:

    m = b1 m + (1 - b1) g          v = b2 v + (1 - b2) g^2
    u = m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd * p
    r = ||p|| / ||u||   (1 when either norm is 0)
    p = p - lr * r * u

Neither decays biases or LayerNorm weights (NVIDIA's no_decay list). Schedules: linear warm-up,
then linear decay to 0 at max_steps (AdamW, Hugging Face's get_linear_schedule_with_warmup) or
(1 - progress)^0.5 (LAMB, NVIDIA's PolyWarmUpScheduler).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from trainmaster.config import JobConfig

BETAS = (0.9, 0.999)
EPS = 1e-6
NO_DECAY = ("bias", "LayerNorm", "layer_norm", "gamma", "beta")


class Lamb(torch.optim.Optimizer):
    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = BETAS,
                 eps: float = EPS, weight_decay: float = 0.01) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.float()
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                step, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
                step += 1
                m.mul_(b1).add_(grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
                m_hat = m / (1 - b1 ** step)
                v_hat = v / (1 - b2 ** step)
                weight = p.float()
                update = m_hat / (v_hat.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update = update + group["weight_decay"] * weight
                w_norm, u_norm = weight.norm(), update.norm()
                ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm,
                                    torch.ones_like(w_norm))
                p.copy_(weight - group["lr"] * ratio * update)
        return loss


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, p in model.named_parameters():  # tied weights appear once
        if not p.requires_grad:
            continue
        (no_decay if any(k in name for k in NO_DECAY) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(cfg: JobConfig, model: nn.Module, device_kind: str) -> torch.optim.Optimizer:
    t = cfg.train
    groups = param_groups(model, t.weight_decay)
    if t.optimizer == "lamb":
        return Lamb(groups, lr=t.lr, betas=BETAS, eps=EPS, weight_decay=t.weight_decay)
    fast: dict[str, bool] = {"fused": True} if device_kind in ("cpu", "cuda") else {"foreach": True}
    return torch.optim.AdamW(groups, lr=t.lr, betas=BETAS, eps=EPS, weight_decay=t.weight_decay,
                             **fast)


class Schedule:
    """lr factor for the update with 0-based index s (a picklable object, so LambdaLR saves it).

    Warm-up: (s + 1) / warmup, reaching the peak at the last warm-up step; then progress
    p = (s - warmup) / (max_steps - warmup) in [0, 1): factor 1 - p (linear) or (1 - p)^0.5
    (poly), 0 at max_steps. No update ever runs with lr 0.
    """

    def __init__(self, warmup: int, max_steps: int, power: float) -> None:
        self.warmup, self.max_steps, self.power = warmup, max_steps, power

    def __call__(self, s: int) -> float:
        if s < self.warmup:
            return (s + 1) / self.warmup
        progress = min(1.0, (s - self.warmup) / max(1, self.max_steps - self.warmup))
        return float((1.0 - progress) ** self.power)


def make_scheduler(cfg: JobConfig, optimizer: torch.optim.Optimizer) -> LambdaLR:
    t = cfg.train
    power = 0.5 if t.optimizer == "lamb" else 1.0
    return LambdaLR(optimizer, Schedule(t.warmup_steps, t.max_steps, power))
