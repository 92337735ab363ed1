"""The supervisor's verdict (backends/local/ending.py), a pure function of what it saw: the
phase, the nodes' codes and notes, and the one message `status` shows. The same runs with real
processes are in test_local.py, test_node_loss.py and test_exit_abort.py."""

from __future__ import annotations

import pytest

from trainmaster.backends.local import completion
from trainmaster.backends.local.ending import ending
from trainmaster.run import state


def final(**kw: object) -> state.RunState:
    nodes = [state.NodeState(index=i) for i in range(2)]
    return state.RunState(job="j", nodes=nodes, message="node 1 lost at step 13 (SIGKILL)", **kw)


def no_error() -> str | None:
    raise AssertionError("the workers' error line is read only for a failed run")


def verdict(run: state.RunState, codes: list[int], **kw: object) -> tuple[str, str | None]:
    args = {"elastic": False, "stuck": [], "barrier": [], "attempt_summary": False,
            "first_error": no_error} | kw  # fmt: skip
    out = ending(run, codes, **args)  # type: ignore[arg-type]
    assert [n.exit_code for n in out.nodes] == [*codes, None][: len(out.nodes)]
    return out.phase, out.message


@pytest.mark.parametrize(
    ("codes", "kw", "want"),
    [
        ([0, 0], {}, ("succeeded", None)),
        (
            [0, 1],
            {"first_error": lambda: "node 1 failed its preflight"},
            ("failed", "node 1 failed its preflight"),
        ),
        ([0, 1], {"first_error": lambda: None}, ("failed", "node 1 lost at step 13 (SIGKILL)")),
        (
            [0, -9],
            {"elastic": True, "attempt_summary": False, "first_error": lambda: None},
            ("failed", "node 1 lost at step 13 (SIGKILL)"),
        ),  # an earlier launch's summary
    ],
    ids=["all-zero", "failed-with-error", "failed-keeps-message", "elastic-stale-summary"],
)
def test_the_phase_and_message_from_the_codes(
    codes: list[int], kw: dict[str, object], want: tuple[str, str | None]
) -> None:
    assert verdict(final(), codes, **kw) == want


def test_a_cancel_wins_and_a_cancel_before_every_agent_started_keeps_the_rest() -> None:
    out = ending(final(cancel_requested=True), [-15], elastic=False, stuck=[], barrier=[],
                 attempt_summary=False, first_error=no_error)  # fmt: skip
    assert out.phase == "cancelled" and out.message is None
    assert [n.exit_code for n in out.nodes] == [-15, None]  # node 1 never started


def test_an_elastic_run_that_lost_a_node_tells_its_story() -> None:
    run = final()
    run.nodes[1] = run.nodes[1].model_copy(update={"note": "lost at step 13 (SIGKILL)"})
    assert verdict(run, [0, -9], elastic=True, attempt_summary=True) == (
        "succeeded",
        "node 1 lost at step 13 (SIGKILL); completed on 1 of 2 nodes",
    )


def test_a_retried_run_keeps_the_lost_node_in_its_message() -> None:
    assert verdict(final(job_retries=1), [0, 0]) == (
        "succeeded",
        "node 1 lost at step 13 (SIGKILL); completed after 1 job retry(s)",
    )


def test_a_worker_dead_at_exit_ends_succeeded_with_the_warning_and_notes() -> None:
    stuck = [completion.Stuck(1, -6)]
    out = ending(final(job_retries=1), [-9, -9], elastic=False, stuck=stuck, barrier=[0],
                 attempt_summary=True, first_error=no_error)  # fmt: skip
    assert out.phase == "succeeded"
    assert out.message == (
        "node 1: a worker aborted at exit (SIGABRT) after the run completed; job counted as "
        "succeeded; completed after 1 job retry(s)"
    )
    assert [n.note for n in out.nodes] == [completion.BARRIER_NOTE, stuck[0].note]
