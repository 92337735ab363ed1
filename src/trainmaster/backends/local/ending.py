"""How a local run ended, from what its supervisor saw: the final phase, the nodes' exit codes
and notes, and the one message `status` shows. Pure: the supervisor reads the files and
applies the result (state.json).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainmaster.backends.local import completion
from trainmaster.run import state


@dataclass(frozen=True)
class Ending:
    phase: str  # succeeded | failed | cancelled
    nodes: list[state.NodeState]
    message: str | None  # None: the message recorded during the run stays


def phase(
    final: state.RunState, codes: list[int], elastic: bool, done: bool, attempt_summary: bool
) -> str:
    """done: the work finished while agents waited (completion.py); attempt_summary: rank 0
    wrote summary.json in this attempt (one left by an earlier launch does not count)."""
    if final.cancel_requested:
        return "cancelled"
    if done or all(c == 0 for c in codes):
        return "succeeded"
    # An elastic job may lose a node and still finish: the survivors' agents exit 0.
    if elastic and any(c == 0 for c in codes) and attempt_summary:
        return "succeeded"
    return "failed"


def ending(
    final: state.RunState,
    codes: list[int],
    *,
    elastic: bool,
    stuck: list[completion.Stuck],
    barrier: list[int],
    attempt_summary: bool,
    first_error: Callable[[], str | None],
) -> Ending:
    """FINAL: state.json as the run left it; CODES: the agents' exit codes (fewer than the
    nodes when a cancel came before every agent started); STUCK and BARRIER: the verdict of
    completion.EndWatch, if it gave one; first_error: the workers' error line, read only for a
    failed run."""
    nodes = [
        n.model_copy(update={"exit_code": c}) for n, c in zip(final.nodes, codes, strict=False)
    ]
    nodes += final.nodes[len(codes) :]
    for s in stuck:
        nodes[s.node] = nodes[s.node].model_copy(update={"note": s.note})
    for i in barrier if stuck else []:  # their agents were stopped
        nodes[i] = nodes[i].model_copy(update={"note": completion.BARRIER_NOTE})
    end = phase(final, codes, elastic, bool(stuck), attempt_summary)
    retried = final.job_retries
    message = None
    if end == "succeeded" and stuck:
        after = f"; completed after {retried} job retry(s)" if retried else ""
        message = "; ".join(s.warning() for s in stuck) + after
    elif end == "failed":
        message = first_error() or final.message
    elif end == "succeeded" and retried:  # keep the lost node's story in status
        message = f"{final.message}; completed after {retried} job retry(s)"
    elif end == "succeeded" and any(n.note for n in nodes):  # an elastic job's lost nodes
        story = "; ".join(f"node {n.index} {n.note}" for n in nodes if n.note)
        on = sum(1 for c in codes if c == 0)
        message = f"{story}; completed on {on} of {len(nodes)} nodes"
    return Ending(end, nodes, message)
