"""Progress, ETA and cost (pure functions over metrics rows), and the line `status` prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmaster.config import jobfile
from trainmaster.monitor import cost, history, runinfo
from trainmaster.run import segments
from trainmaster.storage import Storage


def rows(
    steps: range, t0: float, per_step: float, first_extra: float = 0.0
) -> list[dict[str, float]]:
    """metrics.jsonl rows of one trainer process: the first step also pays start-up."""
    return [
        {"step": s, "loss": 9.0, "elapsed_s": t0 + first_extra + per_step * (i + 1)}
        for i, s in enumerate(steps)
    ]


def test_segments_and_times_across_a_restart() -> None:
    before = rows(range(1, 11), 0.0, 2.0, first_extra=30.0)  # steps 1-10, then killed
    after = rows(range(11, 16), 0.0, 1.0, first_extra=20.0)  # restarted: elapsed_s starts again
    all_rows = before + after
    assert [len(s) for s in segments.segments(all_rows)] == [10, 5]
    assert segments.trained_s(all_rows) == pytest.approx(50.0 + 25.0)
    # Recent steps of the newest process, its first (start-up) step left out.
    assert segments.step_s(all_rows) == pytest.approx(1.0)
    assert segments.step_s(rows(range(1, 2), 0.0, 2.0, 30.0)) == pytest.approx(32.0)
    assert segments.step_s([]) is None


def test_an_early_restart_is_a_new_segment_where_the_timeline_says_it_began() -> None:
    """Killed after 4 s at step 8; the next process resumed after step 5 and took 5 s to start:
    its elapsed_s (5.5, 6, ...) never goes back, so only the timeline's resume tells."""
    before = rows(range(1, 6), 0.0, 0.5, first_extra=1.5)  # steps 1-5 up to 4.0 s
    after = rows(range(6, 26), 0.0, 0.5, first_extra=5.0)  # its rows 6-8 replaced these
    assert len(segments.segments(before + after)) == 1  # what elapsed_s alone says
    split = segments.segments(before + after, resumed=[0, 5])
    assert [len(s) for s in split] == [5, 20]
    assert segments.trained_s(before + after, [0, 5]) == pytest.approx(4.0 + 15.0)
    assert segments.step_s(before + after, [0, 5]) == pytest.approx(0.5)
    # The ETA runs on the newest process's clock alone (mixed with the killed one's: 0.55 s).
    assert segments.step_s(before + after) == pytest.approx(0.55)
    p = cost.progress(before + after, 125, "running", 30.0, None, resumed=[0, 5])
    assert p.eta_s == pytest.approx(100 * 0.5)


def test_progress_eta_and_cost() -> None:
    price = history.Price(10.0, 2, "trn1.2xlarge", "catalog")
    p = cost.progress(rows(range(1, 51), 0.0, 3.0, 60.0), 200, "running", 3600.0, price)
    assert p.step == 50 and p.fraction == 0.25
    assert p.eta_s == pytest.approx(150 * 3.0)
    assert p.spent == pytest.approx(20.0) and p.to_finish == pytest.approx(20.0 * 450 / 3600)
    line = cost.render(p)
    assert line.startswith("[" + "█" * 8 + "░" * 22 + "]")
    assert "50/200 steps" in line and "25%" in line and "ETA 7m30s" in line
    assert (
        "cost so far $20.00, to finish ~$2.50 (2 x trn1.2xlarge at $10.00/node-hour (catalog))"
        in line
    )
    done = cost.progress(rows(range(1, 201), 0.0, 3.0), 200, "succeeded", 600.0, price)
    assert done.eta_s is None and "ETA" not in cost.render(done) and "█" * 30 in cost.render(done)
    waiting = cost.render(cost.progress([], 200, "running", 5.0, None))
    assert (
        "0/200 steps" in waiting and "waiting for the first step" in waiting and "$" not in waiting
    )


def test_price_from_catalog_or_override() -> None:
    cfg = jobfile.preset("trn1-bert-large")
    p = history.price_of(cfg)
    assert p is not None and (p.per_node_hour, p.nodes, p.instance, p.source) == (
        21.50,
        2,
        "trn1.32xlarge",
        "catalog",
    )
    assert p.cost(3600) == pytest.approx(43.0)
    over = history.price_of(
        jobfile.preset("trn1-bert-large", ["cluster.price_per_hour=13.0"]), nodes=4
    )
    assert over is not None and over.per_hour == 52.0 and over.source == "cluster.price_per_hour"
    local = history.price_of(jobfile.preset("local-cpu"))
    assert local is not None and local.instance == "cpu"  # local jobs: a generic CPU host
    assert history.price_of(None) is None


def test_formatting() -> None:
    assert [cost.duration(s) for s in (4, 65, 3725)] == ["4s", "1m05s", "1h02m05s"]
    assert [cost.money(v) for v in (0, 0.004, 12345.678)] == ["$0.00", "$0.0040", "$12,345.68"]


@pytest.mark.slow
def test_progress_line_of_a_finished_run(finished_run: tuple[Path, str]) -> None:
    store, job = finished_run
    s = runinfo.status(Storage(store), job)
    line = cost.progress_line(s, Storage(store))
    assert line is not None
    assert f"{s.max_steps}/{s.max_steps} steps" in line and "100%" in line and "ETA" not in line
    assert "2 x cpu at $1.61/node-hour (catalog)" in line


def test_a_script_that_keeps_its_rows_past_a_resume_splits_where_the_resumed_process_began() -> (
    None
):
    """A logs 1-100 (a checkpoint at 50); B resumes after 50 without dropping A's rows: A's own
    step 51 is no restart, B's is (the last row of step 51)."""
    a = rows(range(1, 101), 0.0, 1.0)
    b = rows(range(51, 61), 0.0, 1.0, first_extra=200.0)  # its elapsed_s never goes back
    split = segments.segments(a + b, resumed=[0, 50])
    assert [(s[0]["step"], s[-1]["step"]) for s in split] == [(1, 100), (51, 60)]
    assert segments.trained_s(a + b, [0, 50]) == pytest.approx(100 + 210)


def test_the_eta_right_after_a_restart_borrows_the_pace_before_it() -> None:
    """The new process's one row holds its start-up (120 s): not the time of every step left."""
    before = rows(range(1, 101), 0.0, 1.0)
    after = rows(range(101, 102), 0.0, 1.0, first_extra=119.0)
    assert len(segments.segments(before + after, [0, 100])) == 2
    assert segments.step_s(before + after, [0, 100]) == pytest.approx(1.0)
    p = cost.progress(before + after, 10_000, "running", 300.0, None, resumed=[0, 100])
    assert p.eta_s == pytest.approx(9_899)
    assert segments.step_s(after) == pytest.approx(120)  # a first process: all there is
