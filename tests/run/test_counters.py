"""The counters' rules (run/counters.py), each on the sources it combines."""

from __future__ import annotations

from trainmaster.run import counters, timeline
from trainmaster.run.timeline import Rollback, Start, Steps


def test_worker_group_restarts_never_fall_when_the_summary_comes() -> None:
    """Running: rank 0 started 4 times, one of them a whole-gang retry: 2 restarts of the worker
    group. At the end torchrun's own count arrives; a smaller one (its agent joined later)
    does not take the count down, a larger one (a trainer that died before its start event)
    raises it."""
    running = counters.worker_group(4, 1)
    assert running == 2
    assert counters.worker_group(4, 1, {"restarts": 1}, None) == running
    assert counters.worker_group(4, 1, {"status": "completed"}, {"restarts": 3}) == 3
    assert counters.worker_group(0, 0) == 0 and counters.worker_group(1, 2) == 0  # never below 0
    assert counters.worker_group(2, 0, {"restarts": float("nan")}, {"restarts": True}) == 1


def test_status_restarts_are_the_worker_groups_and_the_gangs_summed() -> None:
    assert counters.training_restarts(2, 1) == 3
    assert counters.training_restarts(-1, 1) == 1  # neither part counts below 0


def test_torchrun_agents_count_the_same_restarts_the_largest_is_the_jobs() -> None:
    assert counters.agents([2, 2, 1]) == 2
    assert counters.agents([0]) == 0


def test_a_rollback_is_no_new_process_nor_a_restart() -> None:
    events = [
        Start(0.0, 0),
        Steps(1.0, 2.0, 1, 10),
        Rollback(2.0, 2.5, 10, to=5),
        Steps(2.5, 3.5, 6, 12),
        Start(5.0, 10),
    ]
    assert counters.processes(events) == 2
    attempts = timeline.attempts(events)
    assert counters.trainer_restarts(attempts) == 1 and counters.rollbacks(attempts) == 1


def test_job_retries_come_from_the_launchers_environment() -> None:
    assert counters.job_retries({counters.JOB_RETRIES_ENV: "2"}) == 2
    assert counters.job_retries({counters.JOB_RETRIES_ENV: "x"}) == 0
    assert counters.job_retries({}) == 0
