"""One attempt's outcome and what the supervisor does next: pure.

The local twin of torch's RunResult and of the branches of SimpleElasticAgent._invoke_run
(torch/distributed/elastic/agent/server/api.py): there the agent monitors its worker group,
gets a WorkerState and decides (succeeded: the exit barrier; failed: restart while restarts
are left, else stop). Here the supervisor waits on one gang of node agents (gang.py) and
decides on its Outcome: judge the run (every agent ended, or its work is done: ending.py), a
job retry (a node was lost and a retry is left: the gang again, under a new rendezvous), or
give up (a node was lost and none is left: stop the rest, then judge). Only the decision and
the words it leaves in state.json live here, so a test reads them without starting a process;
the supervisor does what they say.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lost:
    """The lost node that ended an attempt (gang.lost_reason says why it counts as lost)."""

    node: int
    why: str  # the signal that killed its agent (SIGKILL), or "rendezvous lost: DistStoreError"


@dataclass(frozen=True)
class Outcome:
    """What Gang.wait saw: the agents' exit codes (-1: an agent still running when a node was
    lost; the stop that follows gives its real code) and the lost node, if one ended it."""

    codes: list[int]
    lost: Lost | None = None


@dataclass(frozen=True)
class Verdict:
    """Every agent ended, or the run's work is done: ending.py judges these codes."""

    codes: list[int]


@dataclass(frozen=True)
class Retry:
    """A node was lost and a job retry is left: stop the gang, start it again."""

    lost: Lost


@dataclass(frozen=True)
class GiveUp:
    """A node was lost and no job retry is left: stop the rest, then ending.py judges."""

    lost: Lost
    diverged: bool = False  # the launch stopped for divergence: a retry would stop at once


Next = Verdict | Retry | GiveUp


def decide(outcome: Outcome, retries: int, max_retries: int, diverged: bool = False) -> Next:
    """RETRIES: the job retries used so far in this launch; MAX_RETRIES: job.max_retries.
    DIVERGED: this launch stopped for divergence (run/divergence.refuse_restart). Its agents end
    on their own, racing each other through torchrun's restarts, and the last may end on a
    rendezvous error that reads as a lost node; a job retry would only stop again at once."""
    if outcome.lost is None:
        return Verdict(outcome.codes)
    if diverged:
        return GiveUp(outcome.lost, diverged=True)
    if retries >= max_retries:
        return GiveUp(outcome.lost)
    return Retry(outcome.lost)


def _lost(lost: Lost, step: int | None) -> str:
    at = f" at step {step}" if step is not None else ""
    return f"node {lost.node} lost{at} ({lost.why})"


def retry_note(lost: Lost, step: int | None, retry: int, max_retries: int) -> str:
    """state.json's message and the supervisor log's line for job retry number RETRY; STEP:
    the last step in metrics.jsonl when the node was found lost."""
    return f"{_lost(lost, step)}; job retry {retry}/{max_retries}"


def give_up_note(
    lost: Lost, step: int | None, retries: int, max_retries: int, diverged: bool = False
) -> str:
    """state.json's message when a node is lost with every job retry used, or after the launch
    stopped for divergence."""
    if diverged:
        return f"{_lost(lost, step)}; no job retry: the launch stopped for divergence"
    used = f"{retries}/{max_retries} used, job.max_retries"
    return f"{_lost(lost, step)}; no job retry left ({used})"
