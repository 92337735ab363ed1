"""The supervisor's run loop as transitions, without processes: outcome.decide (pure) says what
follows an attempt, and supervise() does it in order: set up once, an attempt per job retry,
teardown whatever happened, the verdict unless the supervisor itself failed. The same runs with
real processes are in test_node_loss.py, test_lifecycle.py and test_local.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmaster.backends.local import supervisor
from trainmaster.backends.local.gang import Cancelled
from trainmaster.backends.local.outcome import (
    GiveUp,
    Lost,
    Outcome,
    Retry,
    Verdict,
    decide,
    give_up_note,
    retry_note,
)

LOST = Lost(1, "SIGKILL")


@pytest.mark.parametrize(
    ("outcome", "retries", "max_retries", "expected"),
    [
        (Outcome([0, 0]), 0, 3, Verdict([0, 0])),
        (Outcome([0, 1]), 3, 3, Verdict([0, 1])),  # a failed worker is no lost node: judged
        (Outcome([-1, -9], LOST), 0, 3, Retry(LOST)),
        (Outcome([-1, -9], LOST), 2, 3, Retry(LOST)),
        (Outcome([-1, -9], LOST), 3, 3, GiveUp(LOST)),
        (Outcome([-1, -9], LOST), 0, 0, GiveUp(LOST)),  # job.max_retries = 0: none at all
    ],
)
def test_decide(outcome: Outcome, retries: int, max_retries: int, expected: object) -> None:
    assert decide(outcome, retries, max_retries) == expected


def test_a_launch_stopped_for_divergence_is_not_retried() -> None:
    """Its agents end on their own (each restart stops at once), and the last may end on a
    rendezvous error that reads as a lost node: a job retry would only stop again."""
    store = Lost(0, "rendezvous lost: RendezvousConnectionError")
    assert decide(Outcome([1, -1], store), 0, 3, diverged=True) == GiveUp(store, diverged=True)
    assert decide(Outcome([4, 4]), 0, 3, diverged=True) == Verdict([4, 4])
    assert give_up_note(store, 23, 0, 3, diverged=True) == (
        "node 0 lost at step 23 (rendezvous lost: RendezvousConnectionError); no job retry: "
        "the launch stopped for divergence"
    )


def test_notes_are_what_status_shows() -> None:
    assert retry_note(LOST, 13, 1, 3) == "node 1 lost at step 13 (SIGKILL); job retry 1/3"
    assert retry_note(Lost(0, "rendezvous lost: DistStoreError"), None, 2, 3) == (
        "node 0 lost (rendezvous lost: DistStoreError); job retry 2/3"
    )
    assert give_up_note(LOST, 7, 3, 3) == (
        "node 1 lost at step 7 (SIGKILL); no job retry left (3/3 used, job.max_retries)"
    )


class Scripted:
    """Stands in for supervisor.Supervisor: each attempt's outcome from a script, every call
    recorded; an entry that is an exception is raised by start() instead."""

    script: list[Outcome | BaseException] = []
    calls: list[str] = []

    def __init__(self, run: object) -> None:
        self.retries = 0
        self.cfg = type("Cfg", (), {"job": type("Job", (), {"max_retries": 2})})()
        self.calls.append("init")

    def setup(self) -> None:
        self.calls.append("setup")

    def start(self) -> str:
        self.calls.append("start")
        if isinstance(self.script[0], BaseException):
            raise self.script.pop(0)
        return "gang"

    def monitor(self, gang: str) -> Outcome:
        self.calls.append("monitor")
        step = self.script.pop(0)
        assert isinstance(step, Outcome)
        return step

    def retry(self, gang: str, lost: Lost) -> None:
        self.retries += 1
        self.calls.append(f"retry node {lost.node}")

    def diverged(self) -> bool:
        return False

    def give_up(self, gang: str, lost: Lost, diverged: bool = False) -> list[int]:
        self.calls.append(f"give_up node {lost.node}")
        return [0, -15]

    def cancelled(self) -> list[int]:
        self.calls.append("cancelled")
        return [-15]

    def crashed(self, exc: Exception) -> None:
        self.calls.append(f"crashed: {exc}")

    def teardown(self) -> None:
        self.calls.append("teardown")

    def finish(self, codes: list[int]) -> int:
        self.calls.append(f"finish {codes}")
        return 0 if all(c == 0 for c in codes) else 1


def run(monkeypatch: pytest.MonkeyPatch, script: list[Outcome | BaseException]) -> list[str]:
    Scripted.script, Scripted.calls = list(script), []
    monkeypatch.setattr(supervisor, "Supervisor", Scripted)
    Scripted.calls.append(f"exit {supervisor.supervise(Path('run'))}")
    return Scripted.calls


ATTEMPT = ["start", "monitor"]


def test_loop_retries_then_judges_the_last_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = run(monkeypatch, [Outcome([-1, -9], LOST), Outcome([0, 0])])
    assert calls == [
        "init",
        "setup",
        *ATTEMPT,
        "retry node 1",
        *ATTEMPT,
        "teardown",
        "finish [0, 0]",
        "exit 0",
    ]


def test_loop_gives_up_when_no_retry_is_left(monkeypatch: pytest.MonkeyPatch) -> None:
    lost = Outcome([-1, -9], LOST)
    calls = run(monkeypatch, [lost, lost, lost])
    assert calls == [
        "init",
        "setup",
        *ATTEMPT,
        "retry node 1",
        *ATTEMPT,
        "retry node 1",
        *ATTEMPT,
        "give_up node 1",
        "teardown",
        "finish [0, -15]",
        "exit 1",
    ]


def test_loop_cancelled_while_starting_still_judges(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = run(monkeypatch, [Outcome([-1, -9], LOST), Cancelled()])
    assert calls == [
        "init",
        "setup",
        *ATTEMPT,
        "retry node 1",
        "start",
        "cancelled",
        "teardown",
        "finish [-15]",
        "exit 1",
    ]


def test_loop_that_fails_records_it_tears_down_and_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(OSError, match="no space"):
        run(monkeypatch, [OSError("no space")])
    assert Scripted.calls == ["init", "setup", "start", "crashed: no space", "teardown"]
