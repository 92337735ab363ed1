"""The local backend behind the Backend interface: backends/local/launcher.py (plan, start, cancel) and
the run folder as monitor/ reads it (status, logs, list, top, TensorBoard)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from trainmaster.backends.base import (
    DryRun,
    JobStatus,
    LogStream,
    NodeStatus,
    Phase,
    Submitted,
    Waiting,
    WorkerStatus,
)
from trainmaster.backends.local import launcher as local
from trainmaster.backends.local import logs as logs_mod
from trainmaster.backends.local import precompile as runner
from trainmaster.backends.local.rejoin import Rejoins
from trainmaster.config import JobConfig
from trainmaster.errors import UserError
from trainmaster.monitor import progress, runinfo
from trainmaster.run import state
from trainmaster.storage import ENV_VAR, RunPaths, Storage


@dataclass(frozen=True)
class LocalDryRun(DryRun):
    cfg: JobConfig  # the job that runs (for a precompile: `<job>-precompile`)
    store: Storage
    plan: local.Plan

    def render(self) -> str:
        lines = []
        if self.purpose == "train":  # a precompile says what it does on stderr (notes)
            c, r = self.cfg.job, self.plan.rdzv
            lines.append(
                f"# job {c.name}: {c.nnodes} node(s) x {c.nproc_per_node} worker(s), "
                f"rendezvous {r.backend} at {r.endpoint}"
            )
        for i, cmd in enumerate(self.plan.commands):
            lines += [f"# node {i}", " ".join(cmd)]
        return "\n".join(lines) + "\n"


def _could_create(store: Storage) -> None:
    """plan()'s storage check, which creates nothing (a dry run must leave no folder behind):
    the root, or the nearest folder above it that exists, is one this process may write in.
    submit() then creates the root and writes to it (Storage.ensure_writable)."""
    try:  # exists() raises where a folder above may not be searched
        existing = next((p for p in (store.root, *store.root.parents) if p.exists()), store.root)
        usable = existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)
    except OSError:
        existing, usable = store.root, False
    if not usable:
        raise UserError(
            f"storage is not writable ({existing} is no folder this user may write in); "
            f"pass --storage PATH or set ${ENV_VAR}",
            where=str(store.root),
        )


@dataclass(frozen=True)
class LocalOptions:
    storage: str | None = (
        None  # --storage; else job.storage, $TRAINMASTER_STORAGE, ./trainmaster-data
    )
    resume: bool = False  # launch --resume: continue an existing run from its last checkpoint


class LocalBackend:
    """Jobs on this machine; their files under the storage root (--storage, else job.storage)."""

    name = "local"

    def __init__(self, options: LocalOptions) -> None:
        self.storage = options.storage
        self.resume = options.resume

    def _store(self) -> Storage:
        return Storage.at(self.storage)

    def handle(self, job: str) -> str:
        return f"local://{job}"

    def plan(
        self, cfg: JobConfig, *, wait_lock_s: float = 0.0, precompile_steps: int | None = None
    ) -> LocalDryRun:
        store = Storage.at(self.storage, cfg.job.storage)
        if precompile_steps is not None:
            # Planned as a dry run: the folder of a finished earlier precompile is removed by
            # submit(), not here (a running one is refused either way).
            pre, plan = runner.plan_local(
                cfg, store, steps=precompile_steps, wait_lock_s=wait_lock_s, dry_run=True
            )
            note = (
                f"precompile {pre.job.name}: {pre.train.steps_this_run} step(s) of {cfg.job.name} "
                f"({cfg.job.nnodes} node(s) x {cfg.job.nproc_per_node}) in compile mode into "
                f"{store.cache_dir(cfg.train.cacheset)}"
            )
            return LocalDryRun(pre.job.name, self.name, "precompile", (note,), pre, store, plan)
        _could_create(store)
        plan = dataclasses.replace(
            local.plan(cfg, store, resume=self.resume), lock_wait_s=wait_lock_s
        )
        return LocalDryRun(cfg.job.name, self.name, "train", (), cfg, store, plan)

    def submit(
        self,
        dry_run: DryRun,
        *,
        server_dry_run: bool = False,
        on_wait: Waiting | None = None,
        on_start: Callable[[str], None] | None = None,
        on_note: Callable[[str], None] | None = None,  # nothing here waits but the lock
    ) -> Submitted:
        dry = _own(dry_run)
        if server_dry_run:  # no server here: the same as --dry-run
            return Submitted(dry.job, tuple(dry.render().splitlines()))
        run = dry.plan.run
        if dry.purpose == "precompile":
            runner.remove_previous(run)

            def started(st: state.RunState) -> None:
                if on_start is not None:
                    on_start(
                        f"{st.job} started (runs in {run.dir}; `trainmaster logs {st.job} -f`)"
                    )

            result = runner.run_local(
                dry.cfg, dry.store, dry.plan, on_wait=on_wait, on_start=started
            )
            return Submitted(dry.job, (), result=result)
        dry.store.ensure_writable()  # plan() only looked (_could_create): a dry run makes nothing
        st = local.start(dry.cfg, dry.store, dry.plan, on_wait=on_wait)
        notes = (dry.plan.compile_note,) if dry.plan.compile_note else ()
        return Submitted(
            st.job,
            (
                f"{self.handle(st.job)}  (runs in {run.dir}; `trainmaster status "
                f"{st.job}`, `trainmaster logs {st.job} -f`)",
            ),
            notes,
        )

    def status(self, job: str) -> JobStatus:
        store = self._store()
        return _job_status(self.handle(job), runinfo.status(store, job), store, detail=True)

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

    def list(self) -> list[JobStatus]:
        """The jobs under the storage root, newest first."""
        store = self._store()
        found = [runinfo.status(store, job) for job in runinfo.list_jobs(store)]
        return [
            _job_status(self.handle(s.state.job), s, store, detail=False)
            for s in sorted(found, key=lambda s: s.state.created_at, reverse=True)
        ]

    def top(
        self, job: str, *, interval_s: float, say: Callable[[str], None]
    ) -> tuple[Callable[[], Any], float]:
        from trainmaster.monitor import top as top_mod

        store = self._store()
        top_mod.running_state(store, job)  # no such job / not running: exit 2 before sampling

        def sample() -> Any:
            st = state.observed(RunPaths(store.run_dir(job)).state)
            if st.phase in state.FINAL:
                say(f"{job}: {st.phase}")
                return None
            rows = top_mod.local_rows(st, interval_s)  # samples CPU use over interval_s
            title = (
                f"{job}  ({st.phase}, {st.nnodes} node(s) x {st.nproc_per_node})  "
                f"{time.strftime('%H:%M:%S')}"
            )
            note = "" if rows else "no worker processes yet (the job is starting)"
            return top_mod.table(rows, title, " ".join(filter(None, [top_mod.host_line(), note])))

        return sample, 0.0  # the sample itself takes interval_s

    def tensorboard(
        self, job: str | None, *, host: str, port: int, announce: Callable[[str], None]
    ) -> None:
        from trainmaster.monitor import tensorboard as tb

        tb.serve_local(self._store(), job, host, port, announce)


def _own(dry_run: DryRun) -> LocalDryRun:
    if not isinstance(dry_run, LocalDryRun):
        raise UserError(
            f"a {dry_run.backend} plan cannot run on the local backend", where="--backend"
        )
    return dry_run


def _job_status(handle: str, s: runinfo.Status, store: Storage, *, detail: bool) -> JobStatus:
    """The run folder's story as a JobStatus; with `detail`, also progress, cost and the lines
    `status` prints (list leaves them out: one cheap row per job)."""
    st = s.state
    run = runinfo.run_paths(store, st.job)
    p = progress.of_status(s, run, detail=detail)
    notes = list(p.notes)
    # An elastic job goes on without a lost node (torchrun re-forms the group) and takes it back
    # (backends/local/rejoin.py); a restarted agent runs no worker until a round admits it.
    back = [n for n in st.nodes if not n.note.endswith(Rejoins.REJOINING)]
    live = [n for n in back if state.pid_alive(n.pid, n.start_time)]
    lost_any = any(n.note for n in st.nodes)
    if st.phase == "running" and st.nodes and (0 < len(live) < len(st.nodes) or lost_any):
        out = [f"{n.index} {'gone' if n in back else Rejoins.REJOINING}"
               for n in st.nodes if n not in live]  # fmt: skip
        why = f" (node {', '.join(out)})" if out else ""
        notes.append(f"runs on {len(live)} of {len(st.nodes)} nodes{why}")
    phase = Phase(st.phase)
    if phase == Phase.RUNNING and state.summary_of_attempt(run.state, st):
        phase = Phase.FINISHING  # the workers are done; the supervisor has yet to record it
    return JobStatus(
        job=st.job,
        backend="local",
        handle=handle,
        phase=phase,
        message=st.message,
        nnodes=st.nnodes,
        nproc_per_node=st.nproc_per_node,
        # UTC, as Kubernetes' creationTimestamp: the same job reads the same from any shell
        created=datetime.fromtimestamp(st.created_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        nodes=tuple(
            NodeStatus(
                index=n.index,
                name=f"node-{n.index}",
                state="running" if state.pid_alive(n.pid, n.start_time) else "exited",
                pid=n.pid,
                exit_code=n.exit_code,
                rank0=(s.rank0 or {}).get("node_rank") == n.index,
                log=n.log,
            )
            for n in st.nodes
        ),
        workers=tuple(WorkerStatus(w.rank, w.node, w.local_rank, w.pid) for w in s.workers),
        details={"rendezvous": f"{st.rendezvous.get('backend')} {st.rendezvous.get('endpoint')}"},
        # as the Kubernetes backend fills them from the same record (one mapping)
        **progress.status_fields(
            p, job_retries=st.job_retries, running=st.phase == "running", now=time.time()
        ),
        notes=tuple(notes),
    )
