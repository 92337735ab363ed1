"""On a GPU the optimizer's wait for a checkpoint's copy is the training stream's, not the
host's (staging.Fill.before_update only queues it), so the host's clock cannot see it. It is
timed between two CUDA timing events, read once the GPU has got past it, and counted with its
save's stand-still. No GPU here: stand-ins record what the real stream and events are asked."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from trainmaster.run import saves, timeline
from trainmaster.train.checkpoint import background, staging


class Event:
    """torch.cuda.Event's face: recorded on a stream, queried, timed against another."""

    made: list[Event] = []

    def __init__(self, enable_timing: bool = False) -> None:
        self.timing, self.done, self.at_ms = enable_timing, False, 0.0
        self.device = "cuda:0"
        Event.made.append(self)

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: Event) -> float:
        if not (self.timing and end.timing):
            raise ValueError("Both events must be created with argument 'enable_timing=True'")
        return end.at_ms - self.at_ms


class Stream:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Event]] = []

    def record_event(self, event: Event) -> Event:
        self.calls.append(("record", event))
        return event

    def wait_event(self, event: Event) -> None:
        self.calls.append(("wait", event))


@pytest.fixture
def stream(monkeypatch: pytest.MonkeyPatch) -> Stream:
    s = Stream()
    Event.made.clear()
    monkeypatch.setattr(staging.torch.cuda, "current_stream", lambda device=None: s)
    monkeypatch.setattr(staging.torch.cuda, "Event", Event)
    return s


def copied_fill() -> staging.Fill:
    """A Fill whose copy the side stream has queued: what __init__ leaves on a GPU."""
    fill = object.__new__(staging.Fill)
    fill._queued, fill._settled = threading.Event(), threading.Event()
    fill._queued.set()
    fill._copied, fill._stall = Event(), None
    return fill


def test_the_streams_wait_is_timed_and_read_once_when_the_gpu_is_past_it(stream: Stream) -> None:
    fill = copied_fill()
    copied = fill._copied
    fill.before_update()
    begin, end = stream.calls[0][1], stream.calls[2][1]
    assert stream.calls == [("record", begin), ("wait", copied), ("record", end)]
    assert begin.timing and end.timing and fill.stall_pending
    assert fill.gpu_stall_s() is None and fill.stall_pending  # not run yet: asked, not waited
    begin.at_ms, end.at_ms, end.done = 100.0, 350.0, True
    assert fill.gpu_stall_s() == pytest.approx(0.25)
    assert fill.gpu_stall_s() is None and not fill.stall_pending  # given once


def test_a_timing_that_fails_is_dropped_not_raised(stream: Stream) -> None:
    fill = copied_fill()
    fill.before_update()
    begin, end = fill._stall or pytest.fail("not timed")
    begin.timing, end.done = False, True  # elapsed_time raises
    assert fill.gpu_stall_s() is None and not fill.stall_pending


def test_a_cpu_copy_has_nothing_to_time() -> None:
    fill = copied_fill()
    fill._copied = None
    assert fill.before_update() >= 0 and not fill.stall_pending and fill.gpu_stall_s() is None


def test_the_writer_gives_each_saves_gpu_wait_once_with_its_step(stream: Stream) -> None:
    writer = object.__new__(background.BackgroundWriter)
    writer._stalls = []
    for step in (10, 20):
        writer._fill, writer._step = copied_fill(), step
        writer.before_update()
    assert writer._fill is None and writer.gpu_stalls() == []  # the GPU is not past either yet
    events: dict[int, Any] = {10: writer._stalls[0][1]._stall, 20: writer._stalls[1][1]._stall}
    events[10][1].done, events[10][1].at_ms = True, 40.0
    assert writer.gpu_stalls() == [(10, pytest.approx(0.04))]
    events[20][1].done = True
    assert writer.gpu_stalls() == [(20, 0.0)] and writer.gpu_stalls() == []


def test_a_saves_stand_still_is_its_host_wait_and_its_streams_wait() -> None:
    """What loop.Trainer records: the host's wait at the update, the GPU's after the next sync;
    the report's per-save figure is their sum."""
    events = [
        timeline.Start(0.0),
        timeline.Checkpoint(10.0, 10.02, 10),  # staging
        timeline.Checkpoint(10.5, 10.501, 10),  # host, before_update
        timeline.Steps(10.0, 12.0, 11, 20),
        timeline.Checkpoint(11.75, 12.0, 10),  # the stream's, read at 12
        timeline.Checkpoint(20.0, 20.3, 30, final=True),
    ]
    stats = saves.stats(events)
    assert stats["per_save_blocked_s"] == pytest.approx(0.271)
    assert stats["final_wait_s"] == pytest.approx(0.3)
