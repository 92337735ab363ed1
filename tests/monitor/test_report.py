"""`trainmaster report JOB` on a real local run: the table, and report.png read back as pixels."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import assert_user_error, run_cli
from tests.monitor.conftest import REPORT_STEPS
from trainmaster.monitor import history, report, runinfo
from trainmaster.run import segments, state
from trainmaster.storage import RunPaths, Storage

pytestmark = pytest.mark.slow
C0 = np.array([31, 119, 180])  # matplotlib's first colour: every panel's main curve


def spine_rows(img: np.ndarray) -> list[int]:
    """Rows that are dark across most of the width: the top and bottom frame of each panel."""
    dark = img.sum(axis=2) / 3 < 160
    rows = np.flatnonzero(dark.mean(axis=1) > 0.5)
    groups: list[list[int]] = []
    for r in rows:
        if groups and r - groups[-1][-1] <= 2:
            groups[-1].append(int(r))
        else:
            groups.append([int(r)])
    return [g[0] for g in groups]


def curve_pixels(img: np.ndarray, top: int, bottom: int) -> tuple[np.ndarray, np.ndarray]:
    """(ys, xs) of C0-coloured pixels strictly inside a panel."""
    inside = img[top + 2 : bottom - 1]
    ys, xs = np.nonzero(np.abs(inside - C0).sum(axis=2) < 60)
    return ys + top + 2, xs


COST = re.compile(
    r"estimated cost\s*│\s*\$([\d,.]+)\s+\(2 x cpu at \$1\.61/node-hour "
    r"\(catalog\) x ([\d.]+) h\)"
)


def printed_cost(text: str) -> tuple[float, float]:
    """(dollars, hours) from the report's "estimated cost" row, as printed."""
    m = COST.search(text)
    assert m, text
    return float(m[1].replace(",", "")), float(m[2])


def test_printed_cost_is_parsed_numerically() -> None:
    """The cost row as Report.rows() writes it is what printed_cost reads (quick: the slow
    test below relies on this parser to compare the printed figures numerically)."""
    rep = report.Report(
        job="j",
        phase="succeeded",
        steps=1,
        max_steps=1,
        wall_s=41.925,
        avg_seq_per_s=None,
        peak_seq_per_s=None,
        mfu=None,
        restarts=0,
        compile_cache="off",
        final_loss=None,
        price=history.Price(1.61, 2, "cpu", "catalog"),
        png=Path("r.png"),
    )
    text = "\n".join(f"{k} │ {v}" for k, v in rep.rows())
    spent, hours = printed_cost(text)
    assert rep.cost is not None and spent == round(rep.cost, 2)
    assert hours == round(41.925 / 3600, 3)


def test_report_table_and_three_panels(finished_run: tuple[Path, str]) -> None:
    store, job = finished_run
    run = RunPaths(Storage(store).run_dir(job))
    run.report_png.unlink(missing_ok=True)
    result = run_cli("report", job, "--storage", str(store))
    assert result.returncode == 0, result.stderr
    rows = runinfo.read_metrics(run.metrics)
    text = result.stdout
    assert f"{REPORT_STEPS} / {REPORT_STEPS}" in text and "succeeded" in text
    assert f"{max(r['seq_per_s'] for r in rows):.2f}" in text  # peak seq/s from the metrics
    assert re.search(r"compile cache\s*│\s*off", text) and re.search(r"restarts\s*│\s*0", text)
    assert "2 x cpu at $1.61/node-hour (catalog)" in text  # price x nodes x hours
    # One figure: the cost and the hours the report printed, checked against each other and
    # against state.json numerically (recomputing the cent from other timestamps is flaky).
    spent, hours = printed_cost(text)
    assert spent == pytest.approx(2 * 1.61 * hours, abs=0.005 + 2 * 1.61 * 0.0005)
    st = state.read(run.state)
    assert st.finished_at is not None and st.started_at is not None
    assert hours == pytest.approx((st.finished_at - st.started_at) / 3600, abs=0.0005)

    g = json.loads(run.summary.read_text())["goodput"]  # no restart: nothing lost
    assert g["steps_lost"] == 0 and g["lost"] == 0 and g["restart"] == 0 and 0 < g["ratio"] < 1
    assert re.search(r"goodput\s*│\s*[\d.]+% \(useful step time / wall time\)", text)

    img = np.asarray(Image.open(run.report_png).convert("RGB")).astype(int)
    frames = spine_rows(img)
    # three panels and goodput's timeline below them, each framed top and bottom
    assert len(frames) == 8, frames
    panels = list(zip(frames[0:6:2], frames[1:6:2], strict=True))
    for top, bottom in panels:
        assert bottom - top > 100  # real plot areas, not lines
        ys, xs = curve_pixels(img, top, bottom)
        assert len(ys) > 200, "every panel has a plotted curve"

    # The right curve in the right panel. Loss falls: its first point is near the top of the
    # top panel. The learning rate warms up, then decays to 0: the top of its curve lies right
    # of its first point, and its last point is near the bottom of the middle panel.
    def height(y: float, top: int, bottom: int) -> float:
        return (y - top) / (bottom - top)  # 0 at the top, 1 at the bottom

    ys, xs = curve_pixels(img, *panels[0])
    assert height(ys[xs <= xs.min() + 3].mean(), *panels[0]) < 0.3
    ys, xs = curve_pixels(img, *panels[1])
    assert xs[ys.argmin()] > xs.min() + 20
    assert height(ys[xs >= xs.max() - 3].mean(), *panels[1]) > 0.8


def test_report_returns_the_panels_it_drew(finished_run: tuple[Path, str]) -> None:
    store, job = finished_run
    rep = report.make_report(Storage(store), job)
    img = np.asarray(Image.open(rep.png).convert("RGB")).astype(int)
    assert len(rep.panels) == 3 and rep.timeline is not None
    frames = spine_rows(img)
    assert abs(rep.timeline[1] - frames[6]) <= 2 and abs(rep.timeline[3] - frames[7]) <= 2
    for (x0, y0, x1, y1), (top, bottom) in zip(
        rep.panels, zip(frames[0:6:2], frames[1:6:2], strict=True), strict=True
    ):
        assert abs(y0 - top) <= 2 and abs(y1 - bottom) <= 2
        assert len(curve_pixels(img[:, x0:x1], y0, y1)[0]) > 200
    assert rep.steps == REPORT_STEPS and rep.restarts == 0 and rep.compile_cache == "off"
    assert rep.mfu is None  # a CPU host has no catalog peak: said, not invented


def test_unknown_job(finished_run: tuple[Path, str]) -> None:
    store, job = finished_run
    result = run_cli("report", "nope", "--storage", str(store))
    assert_user_error(result, "no job 'nope'")
    assert job in result.stderr  # the known jobs are listed


def test_job_without_metrics_yet(finished_run: tuple[Path, str], tmp_path: Path) -> None:
    """What launch writes before the first step: job.toml and state.json, no metrics."""
    store, job = finished_run
    src, dst = RunPaths(Storage(store).run_dir(job)), RunPaths(Storage(tmp_path).run_dir("fresh"))
    dst.logs.mkdir(parents=True)
    dst.job_toml.write_text(src.job_toml.read_text())
    dst.state.write_text(state.RunState(job="fresh", phase="pending").model_dump_json())
    result = run_cli("report", "fresh", "--storage", str(tmp_path))
    assert_user_error(result, "job fresh has no metrics yet")
    dst.metrics.write_text('{"step": 1, "loss": 9.0')  # a line being written is not a step
    assert_user_error(run_cli("report", "fresh", "--storage", str(tmp_path)), "has no metrics yet")
    assert not dst.report_png.exists()


def test_kubernetes_run_folder_without_state(
    finished_run: tuple[Path, str], tmp_path: Path
) -> None:
    """A cluster job's folder (copied from shared storage) has metrics but no state.json."""
    store, job = finished_run
    src, dst = RunPaths(Storage(store).run_dir(job)), RunPaths(Storage(tmp_path).run_dir(job))
    dst.dir.mkdir(parents=True)
    for name in ("job.toml", "metrics.jsonl", "summary.json"):
        (dst.dir / name).write_bytes((src.dir / name).read_bytes())
    result = run_cli("report", job, "--storage", str(tmp_path))
    assert result.returncode == 0, result.stderr
    summary = json.loads(src.summary.read_text())
    assert summary["status"] in result.stdout  # "completed"
    # No timeline.jsonl in the copy: goodput as the trainer summed it up, and no timeline drawn.
    assert f"{summary['goodput']['ratio']:.1%} (useful step time" in result.stdout
    assert dst.report_png.stat().st_size > 10_000


def test_plot_marks_restarts(tmp_path: Path) -> None:
    """A restarted trainer (elapsed_s starts again) is a dashed grey line in every panel."""
    rows = [
        {
            "step": s,
            "loss": 9 - s / 10,
            "lr": 1e-3,
            "seq_per_s": 10.0 + s % 3,
            "elapsed_s": float(s if s <= 10 else s - 10),
        }
        for s in range(1, 21)
    ]
    restarts = tuple(int(seg[0]["step"]) for seg in segments.segments(rows)[1:])
    assert restarts == (11,)
    panels = report.plot(rows, tmp_path / "r.png", "restarted", restarts=restarts)
    img = np.asarray(Image.open(tmp_path / "r.png").convert("RGB")).astype(int)
    assert len(panels) == 3
    for x0, y0, x1, y1 in panels:
        grey = np.abs(img[y0 + 2 : y1 - 1, x0 + 2 : x1 - 1] - 127).max(axis=2) < 12
        columns = np.flatnonzero(grey.sum(axis=0) > (y1 - y0) / 4)  # a tall grey line
        assert columns.size, "restart marker"
