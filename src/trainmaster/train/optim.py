"""Optimizers and learning-rate schedules of BERT pretraining.

Fp32AdamW and LAMB ("lamb": the trust ratio only where weight decay applies, as apex's FusedLAMB
with use_nvlamb=False; "nvlamb": everywhere) keep fp32 state and master weights for bf16
parameters, with tensor ops only, so they run unchanged on XLA, and put their state back where a
fresh run has it after a checkpoint load. The update, its sources and the schedules:
docs/architecture.md, "The trainer's optimizers" (2).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from itertools import chain
from typing import Any, cast

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from trainmaster.config import JobConfig
from trainmaster.train.device import DeviceKind, options_for

BETAS = (0.9, 0.999)
EPS = 1e-6
NO_DECAY = ("bias", "LayerNorm", "layer_norm", "gamma", "beta")


class Fp32StateOptimizer(torch.optim.Optimizer):
    """Adam-family state in fp32 on the parameter's device, and an fp32 master of bf16 weights."""

    def _state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
            if p.dtype != torch.float32:
                state["master"] = p.detach().float().clone()
        return state

    @staticmethod
    def _adam_direction(
        state: dict[str, torch.Tensor], grad: torch.Tensor, group: dict[str, Any]
    ) -> torch.Tensor:
        """Advance the moments one step; the bias-corrected m / (sqrt(v) + eps)."""
        b1, b2 = group["betas"]
        step, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
        step += 1
        m.mul_(b1).add_(grad, alpha=1 - b1)
        v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        m_hat = m / (1 - b1**step)
        v_hat = v / (1 - b2**step)
        return m_hat / (v_hat.sqrt() + group["eps"])

    @staticmethod
    def _write(p: torch.Tensor, state: dict[str, torch.Tensor], weight: torch.Tensor) -> None:
        if "master" in state:
            state["master"].copy_(weight)
        p.copy_(weight)  # rounds to bf16 when p is bf16; the master keeps the fp32 value

    def _new_weight(
        self,
        weight: torch.Tensor,
        state: dict[str, torch.Tensor],
        grad: torch.Tensor,
        group: dict[str, Any],
    ) -> torch.Tensor:
        """The updated fp32 weight of one parameter (the rule of the subclass)."""
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self._state(p)
                weight = state["master"] if "master" in state else p.float()
                self._write(p, state, self._new_weight(weight, state, p.grad.float(), group))
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict["state"]
        ids = list(chain.from_iterable(g["params"] for g in state_dict["param_groups"]))
        super().load_state_dict(state_dict)
        params = list(chain.from_iterable(g["params"] for g in self.param_groups))
        for key, p in zip(ids, params, strict=True):
            if key in saved:  # from the checkpoint's own fp32 values, not torch's bf16 casts
                self.state[p] = {
                    name: _placed(name, value, p) for name, value in saved[key].items()
                }
        if any(p.device.type == "xla" for p in params):
            # Materialize the on-device copies of `step` (see _placed) before the first step.
            importlib.import_module("torch_xla").sync()


def _placed(name: str, value: Any, p: torch.Tensor) -> Any:
    """A loaded state value where a fresh run has it: fp32 on the parameter's device.

    On XLA, a 0-dim `step` uploaded from the CPU makes the first resumed step another graph than
    the fresh run's steady one (same IR text, other graph hash; measured with torch_xla 2.9 on
    CPU, tests/train/test_xla.py), i.e. a compilation of the whole step after every resume.
    As the output of a device computation (clone, materialized by the caller's sync) it is the
    same kind of input as the fresh run's and the precompiled step graph is reused.
    """
    if not isinstance(value, torch.Tensor):
        return value
    out = value.detach().to(device=p.device, dtype=torch.float32, copy=True)
    return out.clone() if name == "step" and p.device.type == "xla" else out


class Fp32AdamW(Fp32StateOptimizer):
    """torch.optim.AdamW's rule (decoupled weight decay) with fp32 state and master weights."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = BETAS,
        eps: float = EPS,
        weight_decay: float = 0.01,
    ) -> None:
        super().__init__(
            params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        )

    def _new_weight(
        self,
        weight: torch.Tensor,
        state: dict[str, torch.Tensor],
        grad: torch.Tensor,
        group: dict[str, Any],
    ) -> torch.Tensor:
        weight = weight * (1 - group["lr"] * group["weight_decay"])
        return weight - group["lr"] * self._adam_direction(state, grad, group)


class Lamb(Fp32StateOptimizer):
    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = BETAS,
        eps: float = EPS,
        weight_decay: float = 0.01,
        nvlamb: bool = False,
    ) -> None:
        super().__init__(
            params,
            {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "nvlamb": nvlamb},
        )

    def _new_weight(
        self,
        weight: torch.Tensor,
        state: dict[str, torch.Tensor],
        grad: torch.Tensor,
        group: dict[str, Any],
    ) -> torch.Tensor:
        update = self._adam_direction(state, grad, group)
        if group["weight_decay"]:
            update = update + group["weight_decay"] * weight
        if group["weight_decay"] or group["nvlamb"]:
            w_norm, u_norm = weight.norm(), update.norm()
            ratio = torch.where(
                (w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm)
            )
            update = ratio * update
        return weight - group["lr"] * update


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, p in model.named_parameters():  # tied weights appear once
        if not p.requires_grad:
            continue
        (no_decay if any(k in name for k in NO_DECAY) else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def make_optimizer(cfg: JobConfig, model: nn.Module, device_kind: str) -> torch.optim.Optimizer:
    t = cfg.train
    groups = param_groups(model, t.weight_decay)
    if t.optimizer in ("lamb", "nvlamb"):
        return Lamb(
            groups,
            lr=t.lr,
            betas=BETAS,
            eps=EPS,
            weight_decay=t.weight_decay,
            nvlamb=t.optimizer == "nvlamb",
        )
    if any(p.dtype != torch.float32 for g in groups for p in g["params"]):
        return Fp32AdamW(groups, lr=t.lr, betas=BETAS, eps=EPS, weight_decay=t.weight_decay)
    impl = options_for(cast(DeviceKind, device_kind), bf16=t.precision == "bf16").adamw
    return torch.optim.AdamW(
        groups, lr=t.lr, betas=BETAS, eps=EPS, weight_decay=t.weight_decay, **{impl: True}
    )


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
    power = 0.5 if t.optimizer in ("lamb", "nvlamb") else 1.0
    return LambdaLR(optimizer, Schedule(t.warmup_steps, t.max_steps, power))
