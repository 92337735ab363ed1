"""Progress, ETA and money: the line `status` prints under a running job.

    [██████░░░░░░░░░░░░░░░░░░░░░░░░]  40/200 steps  20%  ETA 5m12s
      cost so far $0.09, to finish ~$0.28 (2 x cpu at $1.61/node-hour (catalog))

The ETA is the recent time per step (segments.step_s: the newest trainer process, its first
step left out) times the steps left; the cost is price per node-hour x nodes x hours, the
price from [cluster] price_per_hour or the catalog. Costs are estimates of on-demand list
prices, not a bill: storage, network, the control plane and idle nodes are not in them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from trainmaster.monitor import history, runinfo
from trainmaster.run import segments, state, timeline
from trainmaster.storage import RunPaths, Storage

BAR_WIDTH = 30


@dataclass(frozen=True)
class Progress:
    step: int
    max_steps: int
    phase: str
    eta_s: float | None  # None when not running or not known yet
    spent: float | None  # USD so far
    to_finish: float | None  # USD for the steps left
    price: history.Price | None

    @property
    def fraction(self) -> float:
        return min(1.0, self.step / self.max_steps) if self.max_steps else 0.0


def progress(
    rows: list[dict[str, Any]],
    max_steps: int,
    phase: str,
    wall_s: float,
    price: history.Price | None,
    resumed: Iterable[int] = (),
) -> Progress:
    """Pure: where a job stands, from its metrics rows (split by process where `resumed`,
    timeline.resume_steps, says) and wall time."""
    step = int(rows[-1]["step"]) if rows else 0
    eta = None
    if phase in ("pending", "running") and rows:
        per_step = segments.step_s(rows, resumed)
        if per_step is not None:
            eta = per_step * max(0, max_steps - step)
    spent = price.cost(wall_s) if price else None
    to_finish = price.cost(eta) if price and eta is not None else None
    return Progress(step, max_steps, phase, eta, spent, to_finish, price)


def duration(seconds: float) -> str:
    """3725 -> '1h02m05s'; 65 -> '1m05s'; 4 -> '4s'."""
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    if h:
        return f"{h}h{m:02d}m{sec:02d}s"
    return f"{m}m{sec:02d}s" if m else f"{sec}s"


def money(usd: float) -> str:
    return f"${usd:,.2f}" if usd >= 0.01 or usd == 0 else f"${usd:.4f}"


def bar(fraction: float, width: int = BAR_WIDTH) -> str:
    filled = int(round(fraction * width))
    return "[" + "█" * filled + "░" * (width - filled) + "]"


def render(p: Progress) -> str:
    parts = [bar(p.fraction), f"{p.step}/{p.max_steps} steps", f"{p.fraction:.0%}"]
    if p.eta_s is not None:
        parts.append(f"ETA {duration(p.eta_s)}")
    elif p.phase in ("pending", "running"):
        parts.append("ETA after the second step" if p.step else "waiting for the first step")
    line = "  ".join(parts)
    if p.spent is not None and p.price is not None:
        money_part = f"cost so far {money(p.spent)}"
        if p.to_finish is not None:
            money_part += f", to finish ~{money(p.to_finish)}"
        line += f"\n  {money_part} ({p.price.basis()})"
    return line


def progress_of_run(
    run: RunPaths, st: state.RunState | None, max_steps: int | None
) -> Progress | None:
    cfg = history.read_config(run)
    rows = runinfo.read_metrics(run.metrics)
    max_steps = max_steps or runinfo.max_steps_of(cfg, rows)
    if not max_steps:
        return None
    phase = st.phase if st else "running"
    nodes = st.nnodes if st else None
    price = history.price_of(cfg, nodes, history.device_of(run))
    resumed = timeline.resume_steps(timeline.read(run.timeline))
    wall = history.wall_s(st, rows, resumed=resumed)
    return progress(rows, max_steps, phase, wall, price, resumed)


def progress_line(s: runinfo.Status, store: Storage) -> str | None:
    """The progress bar and ETA, and on a second line the cost so far and to finish, for
    `trainmaster status`; None without a job file (no max_steps to measure against)."""
    run = RunPaths(store.run_dir(s.state.job))
    p = progress_of_run(run, s.state, s.max_steps)
    return render(p) if p else None
