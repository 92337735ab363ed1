"""goodput.breakdown on hand-made timelines, checked against figures worked out by hand."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainmaster.monitor import report
from trainmaster.run import counters, goodput, saves
from trainmaster.run.timeline import Checkpoint, End, Event, Resume, Save, Start, Steps


def start(t: float, step: int | None = 0, compiles: bool = False) -> Start:
    return Start(t, step, compiles)


def steps(t: float, end: float, first: int, last: int | None = None) -> Steps:
    return Steps(t, end, first, first if last is None else last)


def ckpt(
    t: float, end: float, step: int, *, final: bool = False, saved: bool = False
) -> Checkpoint:
    return Checkpoint(t, end, step, final=final, saved=saved)


def killed_once(compiles: bool = False) -> list[Event]:
    """Launched at 100. The first trainer starts at 101, steps 1-6 (step 1 takes 2 s, the rest
    1 s), checkpoints step 4 (0.5 s), dies after step 6. The second starts at 115 from step 4,
    redoes 5-6, steps 7-8, checkpoints step 8, ends at 125; the run ends at 126."""
    return [
        start(101, 0, compiles),
        steps(105, 107, 1),
        steps(107, 108, 2),
        steps(108, 109, 3),
        steps(109, 110, 4),
        ckpt(110, 110.5, 4),
        steps(110.5, 111.5, 5),
        steps(111.5, 112.5, 6),
        start(115, 4, compiles),
        steps(120, 121, 5),
        steps(121, 122, 6),
        steps(122, 123, 7),
        steps(123, 124, 8),
        ckpt(124, 124.5, 8),
        End(125, 8),
    ]


def test_a_kill_splits_wall_time_as_worked_out_by_hand() -> None:
    g = goodput.breakdown(killed_once(), launched_at=100, ended_at=126)
    assert g is not None
    # startup 100->105; steps 1-4 of the first trainer (5 s) and 5-8 of the second (4 s) are
    # productive; its steps 5-6 (2 s) were redone: lost; two checkpoints of 0.5 s; the restart
    # runs from its last step (112.5) to the next first step (120); 124.5->126 is the end.
    assert g.seconds == pytest.approx(
        {
            "startup": 5,
            "compile": 0,
            "productive": 9,
            "lost": 2,
            "checkpoint": 1,
            "restart": 7.5,
            "other": 1.5,
        }
    )
    assert g.wall == 26 and g.ratio == pytest.approx(9 / 26)
    assert g.steps_lost == 2 and g.restarts == 1
    assert sum(g.seconds.values()) == pytest.approx(g.wall)
    assert [s.kind for s in g.spans[:3]] == ["startup", "productive", "productive"]
    assert g.spans[0] == goodput.Span("startup", 0, 5)
    assert [s for s in g.spans if s.kind == "restart"] == [goodput.Span("restart", 12.5, 20)]
    as_json = g.to_json()
    assert as_json["ratio"] == round(9 / 26, 4) and as_json["lost"] == 2 and as_json["wall"] == 26


def test_compile_is_the_first_steps_excess_over_a_steady_step() -> None:
    g = goodput.breakdown(killed_once(compiles=True), launched_at=100, ended_at=126)
    assert g is not None
    # Both trainers' steady step is 1 s: the first's step 1 (2 s) is 1 s of compile. The
    # second's first step (5, 1 s) has no excess.
    assert g.seconds["compile"] == pytest.approx(1)
    assert g.seconds["productive"] == pytest.approx(8)
    assert g.seconds["lost"] == pytest.approx(2)


def test_a_window_across_the_resume_point_is_lost_pro_rata() -> None:
    """On CUDA one event covers several steps: steps 3-6 in 4 s, resumed after step 4."""
    events = [start(0), steps(1, 2, 1, 2), steps(2, 6, 3, 6), start(10, 4), steps(12, 14, 5, 6)]
    g = goodput.breakdown(events)
    assert g is not None and g.steps_lost == 2
    assert g.seconds["lost"] == pytest.approx(2) and g.seconds["productive"] == pytest.approx(
        1 + 2 + 2
    )
    assert g.seconds["startup"] == pytest.approx(1) and g.seconds["restart"] == pytest.approx(6)
    assert g.wall == 14  # no launch time given: from the first start to the last event


def test_an_earlier_launch_of_the_job_is_not_counted() -> None:
    """`launch --resume`: the timeline holds the first launch too; only this one is measured."""
    old = [start(10), steps(12, 13, 1)]
    new = [start(51, 1), steps(53, 54, 2), steps(54, 55, 3)]
    g = goodput.breakdown(old + new, launched_at=50, ended_at=56)
    assert g is not None and g.restarts == 0 and g.steps_lost == 0
    assert g.seconds["startup"] == pytest.approx(3) and g.seconds["productive"] == pytest.approx(2)
    stats = saves.stats(
        [
            *old,
            Save(12, 13, None, 10**6),
            *new,
            Save(54, 54.5, None, 10**6),
        ],
        launched_at=50,
    )
    assert stats["count"] == 1 and stats["mb_per_s"] == 2.0


def test_a_run_still_starting_is_all_startup_and_one_restarting_is_restart() -> None:
    g = goodput.breakdown([start(1)], launched_at=0, ended_at=30)
    assert g is not None and g.seconds["startup"] == 30 and g.ratio == 0
    g = goodput.breakdown([start(1), steps(2, 3, 1), start(5, 0)], launched_at=0, ended_at=9)
    assert g is not None and g.seconds["restart"] == pytest.approx(6) and g.seconds["lost"] == 1
    assert goodput.breakdown([], launched_at=0, ended_at=5) is None


def test_a_wait_inside_a_steps_window_is_checkpoint_time_where_it_falls() -> None:
    """On CUDA a window covers several steps. Step 2 saves; step 3's update waits 0.5 s for
    the copy (the host, inside the window 2-12); the GPU's own 0.3 s wait is read after the
    window's sync and placed as [end - 0.3, end] across the window's end (12.1)."""
    events = [
        start(0),
        steps(1, 2, 1, 2),
        ckpt(2, 2.2, 2),  # staging, between windows
        steps(2.2, 12, 3, 12),
        ckpt(5, 5.5, 2),
        ckpt(11.8, 12.1, 2),
        steps(12.1, 22, 13, 22),
    ]
    g = goodput.breakdown(events)
    assert g is not None
    # 0.2 + 0.5 + 0.3 of checkpoint; windows of 1 + 9.8 + 9.9 s less 0.5 + 0.2 inside them.
    assert g.seconds["checkpoint"] == pytest.approx(1.0)
    assert g.seconds["productive"] == pytest.approx(1 + 9.8 - 0.7 + 9.9)
    assert g.seconds["startup"] == pytest.approx(1) and g.seconds["other"] == pytest.approx(0)
    assert sum(g.seconds.values()) == pytest.approx(g.wall) and g.wall == 22
    assert [(s.kind, s.start, s.end) for s in g.spans if 2 <= s.start < 12.1] == [
        ("checkpoint", 2, pytest.approx(2.2)),
        ("productive", pytest.approx(2.2), 5),
        ("checkpoint", 5, 5.5),
        ("productive", 5.5, pytest.approx(11.8)),
        ("checkpoint", pytest.approx(11.8), 12),
        ("checkpoint", 12, pytest.approx(12.1)),
    ]
    # The stand-still per save agrees: step 2's three waits.
    assert saves.stats(events)["per_save_blocked_s"] == pytest.approx(1.0)


def test_a_wait_in_a_window_later_redone_is_still_checkpoint_time() -> None:
    """Resumed after step 4: the window 3-6 (4 s) is half lost; a 1 s wait in its lost half
    comes out of the lost time, and the wall still adds up."""
    events = [start(0), steps(1, 2, 1, 2), steps(2, 6, 3, 6), ckpt(5, 6, 2), start(10, 4)]
    g = goodput.breakdown(events, ended_at=12)
    assert g is not None and g.steps_lost == 2
    assert g.seconds["checkpoint"] == pytest.approx(1) and g.seconds["lost"] == pytest.approx(1)
    assert g.seconds["productive"] == pytest.approx(1 + 2)
    assert sum(g.seconds.values()) == pytest.approx(g.wall)


def test_a_script_dead_before_its_first_step_redid_nothing() -> None:
    """A custom script's process says where it resumed (`resume`) or makes steps; one that died
    at its imports did neither and must not count the steps before it as lost."""
    events = [
        Start(0),
        *[steps(k, k + 1, k) for k in range(1, 11)],  # steps 1-10, a checkpoint at 5
        Start(12),  # dies at its imports
        Start(14),
        Resume(15, 5),
        *[steps(15 + k, 16 + k, 5 + k) for k in range(1, 6)],  # redoes 6-10
    ]
    g = goodput.breakdown(events)
    assert g is not None and g.steps_lost == 5 and g.restarts == 2
    assert g.seconds["lost"] == pytest.approx(5)
    assert goodput.resume_steps(events) == [0, 5]  # the dead one is no segment's start


def test_report_status_and_metrics_measure_one_window() -> None:
    """of_run: from the launch to the end state.json records, or now; no launch time (a
    Kubernetes folder): the first start to the last event."""
    events = [start(10), steps(12, 13, 1), steps(13, 14, 2)]
    ended = goodput.of_run(events, started_at=5, finished_at=20)
    assert ended is not None and ended.wall == 15 and ended.seconds["startup"] == 7
    running = goodput.of_run(events, started_at=5, finished_at=None, now=30)
    assert running is not None and running.wall == 25
    folder = goodput.of_run(events, started_at=None, finished_at=None)
    assert folder is not None and folder.wall == 4
    # A Kubernetes folder's running job: to now, so that a hang lowers it (the goodput alert).
    hung = goodput.of_run(events, started_at=None, finished_at=None, running=True, now=110)
    assert hung is not None and hung.wall == 100 and hung.seconds["other"] == 96
    assert counters.processes(events + [start(50, 2)], launched_at=20) == 1


def test_a_folder_without_a_launch_time_counts_the_processes_since_the_last_launch_ended() -> None:
    """A Kubernetes job's timeline holds every launch of the job: an `end` closes each."""
    first = [start(0), steps(1, 2, 1), start(3, 1), steps(4, 5, 2), End(6)]
    again = [start(100, 2), steps(101, 102, 3)]
    assert counters.processes(first) == 2
    assert counters.processes(first + again) == 1
    assert counters.processes(first + again + [start(110, 3)]) == 2
    assert counters.processes(first + again + [End(105)]) == 1


def test_saves_count_what_was_written_and_never_go_down() -> None:
    """The trainer's saves are its background writes (`save`): a staging killed before its
    write is none. A script's are its checkpoint_saved calls (`saved`)."""
    staged = [start(0), ckpt(10, 10.2, 10), start(20, 0), ckpt(30, 30.2, 10)]
    written = [*staged, Save(30.2, 31, 10, 5)]
    counts = [saves.stats(staged)["count"], saves.stats(written)["count"]]
    assert counts == [0, 1]
    script = [start(0), ckpt(5, 5.5, 5, saved=True), ckpt(9, 9.5, 10, saved=True)]
    assert saves.stats(script)["count"] == 2


def test_save_stats_sum_writes_and_stalls() -> None:
    events = [
        ckpt(10, 10.2, 10),
        Save(10.2, 12.2, 10, 40_000_000),
        ckpt(20, 20.1, 20),
        Save(20.1, 21.1, 20, 40_000_000),
    ]
    stats = saves.stats(events)
    assert stats == {
        "count": 2,
        "total_s": 3.0,
        "max_s": 2.0,
        "mb": 80.0,
        "bytes": 80_000_000,
        "mb_per_s": 26.7,
        "blocked_s": 0.3,
        "max_blocked_s": 0.2,
        "per_save_blocked_s": 0.15,
        "max_per_save_blocked_s": 0.2,
        "final_wait_s": 0.0,
    }
    assert saves.stats([])["mb_per_s"] is None


def test_a_save_stands_still_for_its_staging_and_its_copy_and_the_end_apart() -> None:
    """A save's waits are the staging (t) and the copy's rest before the next update (t + 1);
    the last save and the drain of its write (`final`) are the end's, not a save's."""
    events = [
        ckpt(10, 10.05, 10),
        ckpt(11, 11.25, 10),  # the copy of step 10's checkpoint, waited before step 11's update
        ckpt(20, 20.1, 20),
        ckpt(30, 30.1, 30),
        ckpt(30.1, 32.1, 30, final=True),
    ]
    stats = saves.stats(events)
    assert stats["per_save_blocked_s"] == pytest.approx(0.2)  # median of 0.3 and 0.1
    assert stats["max_per_save_blocked_s"] == pytest.approx(0.3)
    assert stats["final_wait_s"] == pytest.approx(2.1)
    assert stats["blocked_s"] == pytest.approx(2.5)  # goodput's checkpoint time: all of it
    text = report.standstill(stats)
    assert text == (
        "training stood still 0.20 s per save (at most 0.30 s), 2.10 s at the end for the last write"
    )
    only_end = saves.stats(events[-2:])
    assert only_end["per_save_blocked_s"] is None
    assert report.standstill(only_end) == "2.10 s at the end for the last write"
    older = {k: v for k, v in stats.items() if "per_save" not in k and k != "final_wait_s"}
    assert report.standstill(older) == "training waited 2.50 s"


def test_a_timeline_from_before_final_still_puts_its_end_apart() -> None:
    """Older trainers wrote no `final`: in a finished run (its end event) the last save after
    the last steps recorded is the end. A run still going, or killed, has no end there: its
    last save is one made while training; so is a save that steps followed."""
    events = [
        steps(1, 10, 10),
        ckpt(10, 10.1, 10),
        steps(10.1, 30, 30),
        ckpt(30, 30.1, 30),
        ckpt(30.1, 32.1, 30),  # the drain of step 30's write, unmarked
    ]
    finished = saves.stats([*events, End(32.2, 30)])
    assert finished["final_wait_s"] == pytest.approx(2.1) and finished["per_save_blocked_s"] == 0.1
    going = saves.stats(events[:4])  # saved step 30, its next steps not flushed yet
    assert going["final_wait_s"] == 0.0 and going["per_save_blocked_s"] == pytest.approx(0.1)
    followed = [*events[:2], steps(10.1, 30, 30), End(30.1, 30)]
    assert saves.stats(followed)["final_wait_s"] == 0.0


def test_record_and_read_back_skip_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "timeline.jsonl"
    goodput.record(path, "start", t=1.5, step=0, compiles=False)
    goodput.record(path, "steps", t=2.0, end=3.0, first=1, last=1)
    with path.open("a") as f:
        f.write('{"event": "steps", "t": 3.0, "en')  # a writer killed mid-line
    assert goodput.read(path) == [start(1.5), steps(2.0, 3.0, 1)]
    assert goodput.read(tmp_path / "missing.jsonl") == []
    assert goodput.launched_at_from({goodput.LAUNCHED_AT_ENV: "12.5"}) == 12.5
    assert goodput.launched_at_from({}) is None


def test_a_custom_script_says_where_it_resumed_after_its_start() -> None:
    """The entry shim (train/scriptnet.py) writes `start` without a step: a `resume` event (from
    latest_checkpoint()) says where the second process went on from; without one, the step
    before its first. Either way steps 5-6 are lost, as with the trainer's own start events."""
    events = [
        dataclasses.replace(e, step=None) if isinstance(e, Start) else e for e in killed_once()
    ]
    with_resume = [*events, Resume(116, 4)]
    for timeline in (with_resume, events):
        g = goodput.breakdown(timeline, launched_at=100, ended_at=126)
        want = goodput.breakdown(killed_once(), launched_at=100, ended_at=126)
        assert g is not None and want is not None
        assert g.steps_lost == 2 and g.restarts == 1 and g.seconds == want.seconds


def test_a_step_saved_again_after_a_restart_is_another_save_and_only_the_last_end_counts() -> None:
    """Run 1 saves step 10 and is preempted at 20 (its end); run 2 resumes, is killed after
    staging step 30, and run 3 saves step 30 again and ends at 40."""
    events = [
        Start(0),
        ckpt(10, 10.1, 10),
        ckpt(20, 20.2, 20),
        ckpt(20.2, 21.2, 20, final=True),
        Start(30),
        ckpt(35, 35.3, 30),
        Start(40),
        ckpt(45, 45.5, 30),
        ckpt(50, 50.1, 40),
        ckpt(50.1, 52.1, 40, final=True),
    ]
    stats = saves.stats(events)
    # saves while training: 0.1 (10), 0.3 (30, run 2), 0.5 (30, run 3); not 0.8 for one "30"
    assert stats["per_save_blocked_s"] == pytest.approx(0.3)
    assert stats["max_per_save_blocked_s"] == pytest.approx(0.5)
    assert stats["final_wait_s"] == pytest.approx(2.1)  # run 3's end, not run 1's as well
