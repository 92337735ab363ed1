"""The local backend behind the Backend interface: backends/local/launcher.py (plan, start, cancel) and
the run folder as monitor/ reads it (status, logs, list, top, TensorBoard)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from trainmaster.backends.base import (
    DryRun,
    Grid,
    Line,
    LogStream,
    Submitted,
    Target,
    View,
    Waiting,
)
from trainmaster.backends.local import launcher as local
from trainmaster.backends.local import logs as logs_mod
from trainmaster.backends.local import precompile as runner
from trainmaster.config import JobConfig
from trainmaster.errors import UserError
from trainmaster.monitor import cost, runinfo
from trainmaster.run import state
from trainmaster.storage import Storage


@dataclass(frozen=True)
class LocalDryRun(DryRun):
    cfg: JobConfig  # the job that runs (for a precompile: `<job>-precompile`)
    store: Storage
    plan: local.Plan

    def render(self) -> str:
        lines = []
        if self.purpose == "train":  # a precompile says what it does on stderr (notes)
            c, r = self.cfg.job, self.plan.rdzv
            lines.append(f"# job {c.name}: {c.nnodes} node(s) x {c.nproc_per_node} worker(s), "
                         f"rendezvous {r.backend} at {r.endpoint}")
        for i, cmd in enumerate(self.plan.commands):
            lines += [f"# node {i}", " ".join(cmd)]
        return "\n".join(lines) + "\n"


class LocalBackend:
    """Jobs on this machine; their files under the storage root (--storage, else job.storage)."""

    name = "local"

    def __init__(self, target: Target) -> None:
        self.storage = target.storage

    def _store(self) -> Storage:
        return Storage.at(self.storage)

    def plan(self, cfg: JobConfig, *, resume: bool = False, image: str | None = None,
             wait_lock_s: float = 0.0, precompile_steps: int | None = None) -> LocalDryRun:
        store = Storage.at(self.storage, cfg.job.storage)
        if precompile_steps is not None:
            # Planned as a dry run: the folder of a finished earlier precompile is removed by
            # submit(), not here (a running one is refused either way).
            pre, plan = runner.plan_local(cfg, store, steps=precompile_steps, wait_lock_s=wait_lock_s,
                                          dry_run=True)
            note = (f"precompile {pre.job.name}: {pre.train.steps_this_run} step(s) of {cfg.job.name} "
                    f"({cfg.job.nnodes} node(s) x {cfg.job.nproc_per_node}) in compile mode into "
                    f"{store.cache_dir(cfg.train.cacheset)}")
            return LocalDryRun(pre.job.name, self.name, "precompile", (note,), pre, store, plan)
        store.ensure_writable()
        plan = dataclasses.replace(local.plan(cfg, store, resume=resume), lock_wait_s=wait_lock_s)
        return LocalDryRun(cfg.job.name, self.name, "train", (), cfg, store, plan)

    def submit(self, dry_run: DryRun, *, server_dry_run: bool = False, on_wait: Waiting | None = None,
               on_start: Callable[[str], None] | None = None) -> Submitted:
        dry = _own(dry_run)
        if server_dry_run:  # no server here: the same as --dry-run
            return Submitted(dry.job, tuple(dry.render().splitlines()))
        run = dry.plan.run
        if dry.purpose == "precompile":
            runner.remove_previous(run)

            def started(st: state.RunState) -> None:
                if on_start is not None:
                    on_start(f"{st.job} started (runs in {run.dir}; `trainmaster logs {st.job} -f`)")

            result = runner.run_local(dry.cfg, dry.store, dry.plan, on_wait=on_wait, on_start=started)
            return Submitted(dry.job, (), result=result)
        st = local.start(dry.cfg, dry.store, dry.plan, on_wait=on_wait)
        notes = (dry.plan.compile_note,) if dry.plan.compile_note else ()
        return Submitted(st.job, (f"{st.job}  (runs in {run.dir}; `trainmaster status {st.job}`, "
                                  f"`trainmaster logs {st.job} -f`)",), notes)

    def status(self, job: str) -> View:
        store = self._store()
        s = runinfo.status(store, job)
        st = s.state
        blocks: list[Line | Grid] = [Line(
            f"[bold]{st.job}[/bold]  phase [bold]{st.phase}[/bold]  backend {st.backend}  "
            f"rendezvous {st.rendezvous.get('backend')} {st.rendezvous.get('endpoint')}", markup=True)]
        if st.message:
            blocks.append(Line(f"  {st.message}"))
        progress = runinfo.progress_text(s)
        blocks.append(Line(f"  {progress}"))
        line = cost.progress_line(s, store)
        if line:
            blocks.append(Line(line))
        blocks.append(Grid(("node", "agent pid", "alive", "exit code", "log"), tuple(
            (str(n.index), str(n.pid or "-"), "yes" if state.pid_alive(n.pid) else "no",
             "-" if n.exit_code is None else str(n.exit_code), n.log) for n in st.nodes)))
        if s.workers:
            blocks.append(Grid(("rank", "node", "local rank", "pid"), tuple(
                (str(w.rank), str(w.node), str(w.local_rank), str(w.pid)) for w in s.workers)))
        blocks += [Line(f"  {line}") for line in runinfo.hang_lines(s)]
        summary = runinfo.summary_text(s)
        if summary:
            blocks.append(Line(f"  {summary}"))
        return View(st.job, st.phase, tuple(blocks), message=st.message,
                    step=int(s.last["step"]) if s.last else None, max_steps=s.max_steps, info=progress)

    def logs(self, job: str, *, rank: int | None, node: int | None, follow: bool) -> LogStream:
        run = runinfo.run_paths(self._store(), job)
        path = logs_mod.log_file(run, rank, node)
        if follow:
            return LogStream(None, logs_mod.follow(path, run))
        return LogStream(None, iter([path.read_text(encoding="utf-8", errors="replace")]))

    def cancel(self, job: str, *, grace_s: float) -> str:
        asked = time.time()
        st = local.cancel(runinfo.run_paths(self._store(), job), grace_s)
        if st.phase in state.FINAL and st.finished_at is not None and st.finished_at < asked:
            # Ended before we asked: its pids may be other processes' by now, so nothing was signalled.
            return f"{job}: already {st.phase}; nothing to cancel, nothing signalled"
        return f"{job}: {st.phase}"

    def list(self) -> Grid:
        """The jobs under the storage root, newest first."""
        store = self._store()
        found = [runinfo.status(store, job) for job in runinfo.list_jobs(store)]
        rows = []
        for s in sorted(found, key=lambda s: s.state.created_at, reverse=True):
            loss = s.last.get("loss") if s.last else None
            rows.append((s.state.job, s.state.phase, f"{s.state.nnodes}x{s.state.nproc_per_node}",
                         datetime.fromtimestamp(s.state.created_at).strftime("%Y-%m-%d %H:%M"),
                         str(s.last["step"]) if s.last else "-",
                         f"{loss:.3f}" if isinstance(loss, (int, float)) else "-"))
        return Grid(("job", "phase", "nodes", "created", "step", "loss"), tuple(rows))

    def top(self, job: str, *, interval_s: float, say: Callable[[str], None]
            ) -> tuple[Callable[[], Any], float]:
        from trainmaster.monitor import top as top_mod

        store = self._store()
        top_mod.running_state(store, job)  # no such job / not running: exit 2 before sampling

        def sample() -> Any:
            st = state.observed(store.run_dir(job) / "state.json")
            if st.phase in state.FINAL:
                say(f"{job}: {st.phase}")
                return None
            rows = top_mod.local_rows(st, interval_s)  # samples CPU use over interval_s
            title = (f"{job}  ({st.phase}, {st.nnodes} node(s) x {st.nproc_per_node})  "
                     f"{time.strftime('%H:%M:%S')}")
            note = "" if rows else "no worker processes yet (the job is starting)"
            return top_mod.table(rows, title, " ".join(filter(None, [top_mod.host_line(), note])))

        return sample, 0.0  # the sample itself takes interval_s

    def tensorboard(self, job: str | None, *, host: str, port: int, announce: Callable[[str], None]) -> None:
        from trainmaster.monitor import tensorboard as tb

        tb.serve_local(self._store(), job, host, port, announce)


def _own(dry_run: DryRun) -> LocalDryRun:
    if not isinstance(dry_run, LocalDryRun):
        raise UserError(f"a {dry_run.backend} plan cannot run on the local backend", where="--backend")
    return dry_run
