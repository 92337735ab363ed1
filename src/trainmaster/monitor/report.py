"""`trainmaster report JOB`: how a run went, as a table and as runs/JOB/report.png.

The table: steps, wall time, average and peak seq/s, MFU, restarts, compile cache, final
loss and the estimated cost (price per node-hour x nodes x wall hours, see history.Price).
The picture: loss, learning rate and throughput against step, one panel each, restarts marked
as dashed lines; for a custom script's metrics, the values it logged (panels_for); below them,
when the trainer recorded its timeline, goodput's: one bar from launch to end, coloured by
where the time went (run/goodput.py). The table shows the same split. matplotlib is imported here
only, inside `plot`, with the Agg canvas (no display needed, nothing global switched), so
`trainmaster --help` stays fast.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainmaster import files
from trainmaster.monitor import cost, history, runinfo
from trainmaster.run import counters, goodput, saves, segments, timeline
from trainmaster.run.goodput import Span
from trainmaster.storage import RunPaths, Storage

PANELS = (("loss", "loss"), ("lr", "learning rate"), ("seq_per_s", "throughput (seq/s)"))
# Not worth a panel of their own: bookkeeping, and the parts drawn into the loss panel.
NOT_PLOTTED = frozenset({"step", "elapsed_s", "max_steps", "mlm_loss", "nsp_loss", "resumed_from"})
LABELS = {"tokens_per_s": "throughput (tokens/s)"}
Box = tuple[int, int, int, int]  # x0, y0, x1, y1 in image pixels, origin top-left
# Light colours: the bar's labels stay readable, and nothing is mistaken for a panel's curve.
COLOURS = {
    "startup": "#c8c8c8",
    "compile": "#ffd480",
    "productive": "#90d890",
    "lost": "#f4a3a3",
    "checkpoint": "#a6cee3",
    "restart": "#f6c1dd",
    "other": "#ececec",
}
NAMES = {"productive": "useful steps", "lost": "steps lost"}


@dataclass(frozen=True)
class Report:
    job: str
    phase: str
    steps: int | None  # None: the job logged no metrics (a custom script need not)
    max_steps: int | None
    wall_s: float
    avg_seq_per_s: float | None
    peak_seq_per_s: float | None
    mfu: float | None
    restarts: int
    compile_cache: str
    final_loss: float | None
    price: history.Price | None
    png: Path | None  # None: nothing to plot
    panels: tuple[Box, ...] = ()
    goodput: dict[str, Any] | None = None  # summary.json's shape (goodput.Goodput.to_json)
    spans: tuple[Span, ...] = ()  # the timeline drawn, when the run recorded one
    saves: dict[str, Any] | None = None  # saves.stats
    restart_steps: tuple[int, ...] = ()  # the first step of each trainer process after the first
    timeline: Box | None = None

    @property
    def cost(self) -> float | None:
        return self.price.cost(self.wall_s) if self.price else None

    def rows(self) -> list[tuple[str, str]]:
        """(field, value) pairs: what the CLI prints as a table."""

        def num(v: float | None, fmt: str) -> str:
            return "-" if v is None else format(v, fmt)

        steps = ("-" if self.steps is None else f"{self.steps}") + (
            f" / {self.max_steps}" if self.max_steps else ""
        )
        mfu = (
            f"{self.mfu:.1%}"
            if self.mfu is not None
            else "n/a (no peak TFLOP/s known for this device; set TRAINMASTER_PEAK_TFLOPS)"
        )
        spent = (
            f"{cost.money(self.cost)}  ({self.price.basis()} x {self.wall_s / 3600:.3f} h)"
            if self.cost is not None and self.price
            else "n/a (no readable job.toml)"
        )
        return [
            ("job", self.job),
            ("phase", self.phase),
            ("steps", steps),
            ("wall time", cost.duration(self.wall_s)),
            ("average seq/s", num(self.avg_seq_per_s, ".2f")),
            ("peak seq/s", num(self.peak_seq_per_s, ".2f")),
            ("MFU", mfu),
            ("restarts", str(self.restarts)),
            *self.goodput_rows(),
            ("compile cache", self.compile_cache),
            ("final loss", num(self.final_loss, ".4f")),
            ("estimated cost" + (" so far" if self.phase in ("pending", "running") else ""), spent),
            (
                "plot",
                str(self.png)
                if self.png
                else "none: no metrics.jsonl rows (a custom script writes them with trainmaster.api.log_metrics)",
            ),
        ]

    def goodput_rows(self) -> list[tuple[str, str]]:
        g = self.goodput
        if not g:
            return [("goodput", "n/a (no timeline.jsonl: an older run)"), *self._saves_row()]
        wall = g["wall"] or 1.0
        out = [("goodput", f"{g['ratio']:.1%} (useful step time / wall time)")]
        for kind in goodput.KINDS:
            text = f"{g[kind]:.2f} s ({g[kind] / wall:.1%})"
            if kind == "lost":
                text += f", {g['steps_lost']} steps redone"
                if g.get("rollbacks"):  # part of them taken back by divergence rollbacks
                    text += f" ({g['rollbacks']} divergence rollback(s): rollbacks.jsonl)"
            out.append((f"  {NAMES.get(kind, kind)}", text))
        return out + self._saves_row()

    def _saves_row(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        s = self.saves
        if s and s.get("count"):
            background = (  # the built-in trainer's writer; a script saves in its own time
                f", {s['total_s']:.2f} s writing (max {s['max_s']:.2f} s, {s['mb_per_s']} MB/s) "
                "in the background"
                if s.get("max_s") is not None
                else ""
            )
            out.append(("checkpoint saves", f"{s['count']}{background}; " + standstill(s)))
        return out


def standstill(s: dict[str, Any]) -> str:
    """How long training stood still for its checkpoints: per save while it trained, and at
    the end (the last save and its write). A summary written before the split has the total."""
    if "per_save_blocked_s" not in s:
        return f"training waited {s['blocked_s']:.2f} s"
    parts = []
    if s["per_save_blocked_s"] is not None:
        parts.append(
            f"training stood still {s['per_save_blocked_s']:.2f} s per save (at most "
            f"{s['max_per_save_blocked_s']:.2f} s)"
        )
    if s["final_wait_s"]:
        parts.append(f"{s['final_wait_s']:.2f} s at the end for the last write")
    return ", ".join(parts) or "training never waited"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _floats(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]


def summarize(run: RunPaths, job: str, rows: list[dict[str, Any]]) -> Report:
    """The figures of the table, from the run folder's files (reads only)."""
    st = history.read_state(run)
    summary = (runinfo.summary_of_launch(run, st) if st else runinfo.read_json(run.summary)) or {}
    rank0 = runinfo.read_json(run.rank0) or {}
    cfg = history.read_config(run)
    events = timeline.read(run.timeline)
    resumed = timeline.resume_steps(events)
    segs = segments.segments(rows, resumed)
    steady = [r for seg in segs for r in (seg[1:] or seg)]  # each process's first step is warm-up
    launched = runinfo.launch_time(st) if st else None
    processes = counters.processes(events, launched) if events else len(segs)
    restarts = counters.worker_group(processes, st.job_retries if st else 0, summary, rank0)
    phase = st.phase if st else str(summary.get("status", "unknown"))
    # The window status and /metrics measure too (runinfo.goodput_of); the trainer's summary
    # stops as it exits: the parts agree, wall and other run longer here.
    g = runinfo.goodput_of(events, st)
    return Report(
        job=job,
        phase=phase,
        steps=int(rows[-1]["step"]) if rows else None,
        max_steps=runinfo.max_steps_of(cfg, rows),
        wall_s=history.wall_s(st, rows, resumed=resumed),
        avg_seq_per_s=_mean(_floats(steady, "seq_per_s")),
        peak_seq_per_s=max(_floats(rows, "seq_per_s"), default=None),
        mfu=_mean(_floats(steady, "mfu")),
        restarts=int(restarts),
        compile_cache=str(summary.get("compile_cache", "-")),
        final_loss=float(rows[-1]["loss"])
        if rows and isinstance(rows[-1].get("loss"), (int, float))
        else None,
        price=history.price_of(cfg, st.nnodes if st else None, history.device_of(run)),
        png=run.report_png if rows else None,
        goodput=g.to_json() if g else summary.get("goodput"),
        spans=g.spans if g else (),
        restart_steps=tuple(int(seg[0]["step"]) for seg in segs[1:]),
        saves=saves.stats(events, launched_at=launched)
        if events
        else summary.get("checkpoint_saves"),
    )


def panels_for(rows: list[dict[str, Any]]) -> tuple[tuple[str, str], ...]:
    """Three panels: the built-in trainer's (loss, lr, seq/s) where the rows have them, the
    rest filled with the numeric values a custom script logged, in the order first seen."""

    def numeric(key: str) -> bool:
        return any(
            isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool) for r in rows
        )

    chosen = [(k, label) for k, label in PANELS if numeric(k)]
    known = {k for k, _ in PANELS}
    extra = list(
        dict.fromkeys(
            k for r in rows for k in r if k not in NOT_PLOTTED and k not in known and numeric(k)
        )
    )
    chosen += [(k, LABELS.get(k, k)) for k in extra[: len(PANELS) - len(chosen)]]
    taken = {k for k, _ in chosen}
    chosen += [p for p in PANELS if p[0] not in taken][: len(PANELS) - len(chosen)]  # empty ones
    return tuple(chosen)


def plot(
    rows: list[dict[str, Any]],
    path: Path,
    title: str,
    spans: tuple[goodput.Span, ...] = (),
    restarts: tuple[int, ...] = (),
) -> tuple[Box, ...]:
    """Write the three panels (and the goodput timeline, given its spans) to `path`
    (atomically); return each panel's plot area in pixels, the timeline's last."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 11 if spans else 9), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    panels = panels_for(rows)
    every = fig.subplots(
        len(panels) + bool(spans), 1, height_ratios=[3] * len(panels) + [1] * bool(spans)
    )
    axes = every[: len(panels)]
    for ax in axes[1:]:
        ax.sharex(axes[0])
    for ax in axes[:-1]:
        ax.tick_params(labelbottom=False)  # one step axis, under the last panel
    for ax, (key, label) in zip(axes, panels, strict=True):
        pts = [
            (int(r["step"]), float(r[key])) for r in rows if isinstance(r.get(key), (int, float))
        ]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.plot(
                xs,
                ys,
                color="C0",
                linewidth=1.5,
                marker="." if len(pts) < 50 else None,
                label=label,
            )
        if key == "loss":
            for part, color in (("mlm_loss", "C1"), ("nsp_loss", "C2")):
                sub = [
                    (int(r["step"]), float(r[part]))
                    for r in rows
                    if isinstance(r.get(part), (int, float))
                ]
                if sub:
                    ax.plot(*zip(*sub, strict=True), color=color, linewidth=0.8, label=part)
            ax.legend(loc="upper right", fontsize="small")
        if key == "lr":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        for step in restarts:
            ax.axvline(step, color="0.5", linestyle="--", linewidth=0.8)
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[0].set_title(title)
    axes[-1].set_xlabel("step")
    if spans:
        _timeline(every[-1], spans)
    fig.canvas.draw()
    height = fig.bbox.height
    boxes = []
    for ax in every:
        b = ax.get_window_extent()
        boxes.append((int(b.x0), int(height - b.y1), int(b.x1), int(height - b.y0)))
    with files.replacing(path) as tmp:
        fig.savefig(tmp, dpi=fig.dpi, facecolor="white", format="png")
    return tuple(boxes)


def _timeline(ax: Any, spans: tuple[goodput.Span, ...]) -> None:
    """One bar from launch to end, each stretch in its category's colour; the legend sums them."""
    wall = max(s.end for s in spans) or 1.0
    for kind in goodput.KINDS:
        mine = [(s.start, s.end - s.start) for s in spans if s.kind == kind]
        total = sum(d for _, d in mine)
        if mine:
            ax.broken_barh(
                mine,
                (0.15, 0.7),
                facecolors=COLOURS[kind],
                label=f"{NAMES.get(kind, kind)} {total:.1f} s ({total / wall:.0%})",
            )
    ax.set_xlim(0, wall)
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    ax.set_xlabel("seconds since launch")
    useful = sum(s.end - s.start for s in spans if s.kind == "productive")
    ax.set_title(f"goodput {useful / wall:.1%}: where the wall time went", fontsize="medium")
    ax.legend(
        loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=4, fontsize="small", frameon=False
    )


def make_report(store: Storage, job: str) -> Report:
    """Read the run, write report.png, return the figures (UserError: no such job, no metrics)."""
    run = history.find_run(store, job)
    cfg = history.read_config(run)
    if cfg is not None and not cfg.job.builtin:
        # A custom script need not log metrics: phase, restarts, wall time and cost still count.
        rows = runinfo.read_metrics(run.metrics)
        if not rows:
            return summarize(run, job, rows)
    else:
        rows = history.metrics_or_fail(run, job)
    rep = summarize(run, job, rows)
    title = f"{job}: {rep.steps} steps, {rep.phase}"
    boxes = plot(rows, run.report_png, title, rep.spans, rep.restart_steps)
    n = len(panels_for(rows))
    return dataclasses.replace(rep, panels=boxes[:n], timeline=boxes[n] if len(boxes) > n else None)
