"""`cluster up`, `cluster down`, `cluster scale`: run the plan's steps with progress.

Each step is `bash runbook.sh run STEP` (the same function a person runs by hand), preceded by
`bash runbook.sh check STEP`: when the check says the work exists, the step is skipped. What
finished is recorded in DIR/.state/{up,down}.json, so that after a failure (a quota, a
timeout, a typo in credentials) the next run starts at the failed step. Each step's output
goes to DIR/.state/logs/STEP.log; a failure shows its last lines and where the log is.
`--dry-run` prints the steps and their commands and runs nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from trainmaster.cluster.plan import LoadedPlan
from trainmaster.cluster.steps import Step, scale_command
from trainmaster.errors import JobFailed, UserError

INSTALL_HINTS = {
    "aws": "AWS CLI v2: https://docs.aws.amazon.com/cli/latest/userguide/getting-started-install.html",
    "eksctl": "eksctl: https://eksctl.io/installation/ (a release binary into /usr/local/bin)",
    "kubectl": "kubectl: https://kubernetes.io/docs/tasks/tools/ (within one minor version of the cluster)",
    "helm": "Helm 3: https://helm.sh/docs/intro/install/",
    "docker": "Docker Engine with BuildKit: https://docs.docker.com/engine/install/",
    "bash": "bash (apt-get install bash)",
}
TAIL_LINES = 15

Which = Callable[[str], str | None]


def missing_tools(tools: Sequence[str], which: Which = shutil.which) -> list[str]:
    return [t for t in dict.fromkeys(tools) if which(t) is None]


def require_tools(tools: Sequence[str], which: Which = shutil.which) -> None:
    missing = missing_tools(["bash", *tools], which)
    if missing:
        hints = "; ".join(f"{t} - install {INSTALL_HINTS.get(t, t)}" for t in missing)
        raise UserError(f"missing tool{'s' if len(missing) > 1 else ''}: {hints}", where="cluster")


# --- progress state ----------------------------------------------------------------------------


class State:
    """Steps done so far, for one plan (cluster + region) and one direction (up or down)."""

    def __init__(self, plan: LoadedPlan, kind: str) -> None:
        self.path = plan.state_dir / f"{kind}.json"
        self.identity = {"cluster": plan.cluster["name"], "region": plan.cluster["region"]}
        self.done: list[str] = []
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if {k: data.get(k) for k in self.identity} == self.identity:
                self.done = [str(s) for s in data.get("done", [])]
        except (OSError, ValueError):
            pass

    def save(self, failed: str | None = None) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {**self.identity, "done": self.done, "failed": failed}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        tmp.replace(self.path)

    def reset(self) -> None:
        self.done = []
        self.path.unlink(missing_ok=True)


# --- running -------------------------------------------------------------------------------------


def _stream(
    cmd: list[str], cwd: Path, log: Path, on_line: Callable[[str], None]
) -> tuple[int, list[str]]:
    """Run cmd, appending its output to log; returns the exit code and the last lines."""
    log.parent.mkdir(parents=True, exist_ok=True)
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    with log.open("a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        # runbook.sh calls `trainmaster` (cluster wait-fsx): reachable even from an unactivated venv
        path = os.pathsep.join([os.environ.get("PATH", ""), str(Path(sys.executable).parent)])
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            env={**os.environ, "PATH": path},
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            tail.append(line.rstrip())
            on_line(line.rstrip())
        code = proc.wait()
        out.write(f"# exit {code}\n")
    return code, list(tail)


def print_steps(plan: LoadedPlan, steps: list[Step], console: Console, heading: str) -> None:
    console.print(
        f"# {heading}: {len(steps)} steps of {plan.runbook} (nothing runs: --dry-run)",
        markup=False,
        highlight=False,
    )
    for i, step in enumerate(steps, 1):
        console.print(
            f"\n# [{i}/{len(steps)}] {step.id}: {step.title}", markup=False, highlight=False
        )
        if step.check:
            console.print(f"#   skipped when: {step.check}", markup=False, highlight=False)
        for line in step.commands:
            console.print(line, markup=False, highlight=False)


def run_steps(
    plan: LoadedPlan,
    steps: list[Step],
    kind: str,
    console: Console,
    *,
    fresh: bool = False,
    which: Which = shutil.which,
) -> list[str]:
    """Run steps in order with progress; returns the ids that ran (not skipped)."""
    state = State(plan, kind)
    if fresh:
        state.reset()
    todo = [s for s in steps if s.id not in state.done]
    require_tools([t for s in todo for t in s.tools], which)
    if len(todo) < len(steps):
        console.print(
            f"resuming: {len(steps) - len(todo)} of {len(steps)} steps done earlier "
            f"({state.path}; --fresh starts over)"
        )
    ran: list[str] = []
    runbook = str(plan.runbook)
    for i, step in enumerate(steps, 1):
        label = f"[{i}/{len(steps)}] {step.id}"
        if step.id in state.done:
            console.print(f"[green]✓[/] {label}: {escape(step.title)} [dim](done earlier)[/]")
            continue
        log = plan.state_dir / "logs" / f"{step.id}.log"
        if step.check:
            code, _ = _stream(
                ["bash", runbook, "check", step.id], plan.dir, log, lambda _line: None
            )
            if code == 0:
                console.print(
                    f"[green]✓[/] {label}: {escape(step.title)} [dim](exists, skipped)[/]"
                )
                state.done.append(step.id)
                state.save()
                continue
        started = time.monotonic()
        with console.status(f"{label}: {escape(step.title)}") as status:

            def show(line: str, status: Any = status, label: str = label) -> None:
                if line.strip():
                    status.update(f"{label}: [dim]{escape(line.strip()[:100])}[/]")

            code, tail = _stream(["bash", runbook, "run", step.id], plan.dir, log, show)
        took = time.monotonic() - started
        if code != 0:
            state.save(failed=step.id)
            console.print(f"[red]✗[/] {label}: {escape(step.title)} (exit {code}, {took:.0f}s)")
            for line in tail:
                console.print(f"    {line}", markup=False, highlight=False)
            raise JobFailed(
                f"step {step.id} failed (exit {code}); its log: {log}. Fix the cause "
                f"and run the same command again: it resumes at {step.id}"
            )
        console.print(f"[green]✓[/] {label}: {escape(step.title)} [dim]({took:.0f}s)[/]")
        if step.echo:
            for line in tail:
                console.print(f"    {line}", markup=False, highlight=False)
        state.done.append(step.id)
        state.save()
        ran.append(step.id)
    return ran


def up(
    plan: LoadedPlan,
    console: Console,
    *,
    dry_run: bool = False,
    fresh: bool = False,
    which: Which = shutil.which,
) -> list[str]:
    if dry_run:
        print_steps(plan, plan.up, console, f"cluster up {plan.cluster['name']}")
        return []
    State(plan, "down").reset()  # what `down` removed is coming back: check every step again
    return run_steps(plan, plan.up, "up", console, fresh=fresh, which=which)


def down(
    plan: LoadedPlan,
    console: Console,
    *,
    dry_run: bool = False,
    fresh: bool = False,
    which: Which = shutil.which,
) -> list[str]:
    if dry_run:
        print_steps(plan, plan.down, console, f"cluster down {plan.cluster['name']}")
        return []
    State(plan, "up").reset()  # what `up` made is going: a later `up` checks every step again
    return run_steps(plan, plan.down, "down", console, fresh=fresh, which=which)


def what_down_deletes(plan: LoadedPlan) -> list[str]:
    c = plan.cluster
    return [
        f"EKS cluster {c['name']} in {c['region']} with its node groups ({c['nodes']} x "
        f"{c['instance_type']} and the system nodes), VPC and IAM roles",
        f"claim {c['pvc']} and its FSx for Lustre file system: every dataset, compile cache, "
        "checkpoint and run on it",
        f"all Volcano jobs and pods in namespace {c['namespace']}",
        f"ECR repository {c['image_repository']} and its images",
    ]


def scale(
    plan: LoadedPlan,
    nodes: int,
    console: Console,
    *,
    dry_run: bool = False,
    which: Which = shutil.which,
) -> None:
    if nodes < 0:
        raise UserError(f"{nodes}: the number of nodes cannot be negative", where="--nodes")
    c = plan.cluster
    cmd = scale_command(c["name"], c["region"], c["nodegroup"], nodes)
    if dry_run:
        console.print(" ".join(cmd), markup=False, highlight=False)
        return
    require_tools(["eksctl"], which)
    log = plan.state_dir / "logs" / "scale.log"
    with console.status(f"scaling {c['nodegroup']} to {nodes} node(s)") as status:
        code, tail = _stream(cmd, plan.dir, log, lambda line: status.update(escape(line[:100])))
    if code != 0:
        for line in tail:
            console.print(f"    {line}", markup=False, highlight=False)
        raise JobFailed(f"eksctl scale nodegroup failed (exit {code}); its log: {log}")
    console.print(f"[green]✓[/] node group {c['nodegroup']}: {nodes} node(s)")
