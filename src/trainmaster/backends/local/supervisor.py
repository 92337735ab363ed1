"""The supervisor of one local run: `python -m trainmaster.backends.local.supervisor RUN_DIR`.

Started detached by `launch`, it starts the private etcd (if any) and one torchrun agent per
node, each in its own process group, waits for them, records exit codes and the final phase
in state.json, and stops etcd. SIGTERM (from `cancel`) is passed on to every agent's group;
a cancel recorded while it is still starting (no group to signal yet) is honoured at every
step of the start-up. If the supervisor itself is killed, the agents finish the run on their
own and whoever next reads the state (state.observed) records the end and stops the etcd.

A lost node is not a failed job (the local twin of Volcano's RestartJob): when a node's agent
dies by a signal (the instance died) or exits on a rendezvous or store error (the c10d store
lived in a lost agent: its peers cannot go on), the supervisor stops the other nodes and starts
the whole gang again under a new rendezvous id (and, for c10d on a free port, a new port), up
to job.max_retries times; the workers resume from the last checkpoint. An elastic job goes on
with the nodes it has instead (torchrun re-forms the group) and the supervisor starts the lost
node's agent again, which rejoins at the next rendezvous round (rejoin.py), unless the c10d
store went with the lost node: then it is a job retry as above.

A worker that dies at exit after the run completed (torch 2.13 at times aborts a gloo worker
so) leaves its agent waiting in a restart rendezvous for nodes that have finished: the
supervisor stops the agents and counts the job as succeeded, with a warning (completion.py).

Shaped like torch's elastic agent (torch/distributed/elastic/agent/server/api.py,
SimpleElasticAgent._invoke_run): `supervise` is a short loop over attempts. Supervisor sets
up once (etcd, network, the agents' environment), starts a Gang per attempt (gang.py: start,
wait -> Outcome, stop), acts on outcome.decide's typed answer (the verdict, a job retry, or
none left) and tears down; at the end ending.py's verdict, a pure function of what was seen,
goes into state.json. The Supervisor owns the SIGTERM handler and the attempt's gang, whose
agents the handler signals.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainmaster.backends.local import agents, completion, logs, netns, rejoin, rendezvous
from trainmaster.backends.local.ending import ending
from trainmaster.backends.local.gang import Cancel, Cancelled, CancelWatch, Gang
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
from trainmaster.compile import cache, lock
from trainmaster.config import JobConfig, jobfile
from trainmaster.launch.torchrun import Rendezvous
from trainmaster.monitor import exporter
from trainmaster.run import divergence, goodput, state
from trainmaster.run import metrics as runlog
from trainmaster.run.goodput import JOB_RETRIES_ENV
from trainmaster.storage import RunPaths, Storage


def _last_step(run: RunPaths) -> int | None:
    rows = [r for r in runlog.read_jsonl(run.metrics) if isinstance(r.get("step"), int)]
    return int(rows[-1]["step"]) if rows else None


def _hold_cache_lock(cfg: JobConfig, storage: Path) -> lock.CacheLock | None:
    """The cacheset lock that `launch` took and handed over: held (heartbeat) until the end."""
    token = os.environ.get(cache.LOCK_ENV)
    if not cfg.train.compile or not token:
        return None
    held = lock.adopt(Storage(storage).cache_dir(cfg.train.cacheset), token)
    if held is not None:
        held.start_heartbeat()
    return held


class Supervisor:
    """One run's supervisor: what torch's SimpleElasticAgent is to its worker group, with a
    gang of node agents per attempt. Constructed, it already answers SIGTERM (`cancel`), holds
    the cacheset lock and serves /metrics; teardown() lets them go."""

    def __init__(self, run: RunPaths) -> None:
        self.run, self.st = run, state.read(run.state)
        self.cfg = jobfile.load(run.job_toml)
        # A fresh --rdzv-id per launch (backends/local/agents.py); older state files have none.
        rdzv = self.st.rendezvous
        self.rdzv = Rendezvous(rdzv["backend"], rdzv["endpoint"], run_id=rdzv.get("run_id") or None)
        self.storage = Path(self.st.storage)
        self.elastic = bool(
            self.cfg.job.min_nnodes and self.cfg.job.min_nnodes < self.cfg.job.nnodes
        )
        self.cancel, self.watch = Cancel(), CancelWatch(run)
        self.gang: Gang | None = None  # the attempt's: the SIGTERM handler signals its agents
        self.etcd: subprocess.Popen[bytes] | None = None
        self.net: netns.Network | None = None
        self.end: completion.EndWatch | None = None  # the last attempt's
        self.env: dict[str, str] = {}
        self.workdir, self.launched = "", 0.0
        self.retries = self.rejoins_used = 0
        signal.signal(signal.SIGTERM, self.on_term)
        self.held = _hold_cache_lock(self.cfg, self.storage)
        # /metrics for Prometheus while the job lives, on a free port named in the run folder
        self.metrics = exporter.serve_in_background(
            run, self.st.job, lambda: state.observed(run.state).phase
        )

    def on_term(self, signum: int, _frame: object) -> None:
        """SIGTERM (`cancel`): recorded, and passed on to the agents started so far."""
        self.cancel.requested = True
        state.update(self.run.state, cancel_requested=True)
        if self.gang is not None:
            self.gang.signal_all(signal.SIGTERM)

    def setup(self) -> None:
        """Once per launch (torch's _initialize_workers): etcd, network, the agents' env."""
        # `cancel` of a pending run finds no process group to signal: it only records the
        # request, so every step of the start-up looks for it before starting anything more.
        self.watch.check()
        if self.st.private_etcd:
            self.etcd, endpoint = rendezvous.start_private_etcd(
                self.run.dir / "etcd", self.run.logs / "etcd.log", timeout_s=30.0
            )
            self.rdzv = Rendezvous(self.rdzv.backend, endpoint, run_id=self.rdzv.run_id)
            state.update(
                self.run.state,
                etcd_pid=self.etcd.pid,
                etcd_start=state.start_time(self.etcd.pid),
                rendezvous=self.st.rendezvous | {"endpoint": endpoint},
            )
        self.env = agents.agent_env(self.cfg, self.storage)
        # The launching shell's folder: a custom entrypoint runs from there (like TorchX local_cwd).
        self.workdir = self.st.workdir or os.getcwd()
        if self.cfg.job.network == "netns":
            self.net = netns.plan(self.run.dir, self.cfg.job.nnodes)
            netns.up(self.net)
            self.env["GLOO_SOCKET_IFNAME"] = netns.IFNAME  # not the host name's address
        # One launch time for state.json and the trainers' goodput (summary.json), so that
        # summary and `report` measure startup from the same instant.
        self.launched = time.time()
        self.env[goodput.LAUNCHED_AT_ENV] = repr(self.launched)

    def start(self) -> Gang:
        """Start one attempt's gang and record its agents in state.json."""
        self.env[JOB_RETRIES_ENV] = str(self.retries)
        cfg, run = self.cfg, self.run
        commands = agents.agent_commands(cfg, self.rdzv, run, self.storage, self.workdir)
        self.gang = Gang(run, commands, dict(self.env), self.workdir, self.held)
        self.gang.start(self.watch.check)
        self._record_started(self.gang)
        return self.gang

    def _record_started(self, gang: Gang) -> None:
        """Read under the same lock as the write: a cancel recorded before it saw no agents to
        signal, so they are signalled here; a later one finds them in state.json."""
        nodes = [
            n.model_copy(
                update={"pid": pid, "start_time": state.start_time(pid), "exit_code": None}
            )
            for n, pid in zip(self.st.nodes, (a.pid for a in gang.agents), strict=True)
        ]
        rdzv = self.st.rendezvous | {
            "endpoint": self.rdzv.endpoint,
            "run_id": self.rdzv.run_id or "",
        }
        now = state.update(
            self.run.state, phase="running", started_at=self.launched, nodes=nodes, rendezvous=rdzv
        )
        if now.cancel_requested:
            self.cancel.requested = True
            gang.signal_all(signal.SIGTERM)

    def monitor(self, gang: Gang) -> Outcome:
        """Wait on the gang until its attempt has an outcome (torch's _monitor_workers)."""
        cfg, run = self.cfg, self.run
        rejoins = None
        if self.elastic:
            last = functools.partial(_last_step, run)
            rejoins = rejoin.Rejoins(
                run.state, cfg.job.max_retries, gang.start_node, last, self.rejoins_used
            )
        store_lost = functools.partial(rejoin.store_lost, cfg, self.rdzv)
        builtin = cfg.job.builtin
        self.end = completion.EndWatch(
            run, builtin, gang.offsets, self.launched, cfg.job.nproc_per_node
        )
        outcome = gang.wait(self.cancel, rejoins, store_lost, self.end)
        self.rejoins_used = rejoins.used if rejoins is not None else 0
        return outcome

    def retry(self, gang: Gang, lost: Lost) -> None:
        """Stop the gang, record the job retry, and draw the next attempt's rendezvous."""
        step = _last_step(self.run)
        self.retries += 1
        note = retry_note(lost, step, self.retries, self.cfg.job.max_retries)
        print(f"trainmaster supervisor: {note}", flush=True)
        gang.stop()
        goodput.record(
            self.run.timeline, "job_retry", t=time.time(), node=lost.node, step=step, why=lost.why
        )
        state.update(self.run.state, job_retries=self.retries, message=note)
        self.watch.check()
        self.rdzv = agents.fresh(self.cfg, self.rdzv)

    def diverged(self) -> bool:
        """This launch stopped for divergence (its trainer recorded it: run/divergence.py)."""
        env = {goodput.LAUNCHED_AT_ENV: self.env.get(goodput.LAUNCHED_AT_ENV, "")}
        return divergence.refuse_restart(self.run.rollbacks, env) is not None

    def give_up(self, gang: Gang, lost: Lost, diverged: bool = False) -> list[int]:
        """A node lost with no job retry left (or none worth it): stop the others; their codes."""
        step = _last_step(self.run)
        codes = gang.stop()
        note = give_up_note(lost, step, self.retries, self.cfg.job.max_retries, diverged)
        state.update(self.run.state, message=note)
        return codes

    def cancelled(self) -> list[int]:
        """A cancel seen while starting: pass it on to the agents started, and wait for them."""
        if self.gang is None:  # cancelled before the first agent
            return []
        self.gang.signal_all(signal.SIGTERM)
        return [a.wait() for a in self.gang.agents]

    def crashed(self, exc: Exception) -> None:
        """The supervisor failed: kill what it started and record why (the traceback follows)."""
        if self.gang is not None:
            self.gang.signal_all(signal.SIGKILL)
        state.update(self.run.state, phase="failed", finished_at=time.time(), message=str(exc))

    def teardown(self) -> None:
        """Whatever happened: /metrics, etcd, the network and the cache lock go."""
        self.metrics.stop()
        rendezvous.stop_private_etcd(self.etcd)
        if self.net is not None:
            netns.down(self.net)
        if self.held is not None:
            with contextlib.suppress(Exception):
                self.held.release()

    def finish(self, codes: list[int]) -> int:
        """ending.py's verdict on what was seen, into state.json; the exit code."""
        final = state.read(self.run.state)
        end = self.end
        verdict = ending(
            final,
            codes,
            elastic=self.elastic,
            stuck=end.stuck if end is not None else [],
            barrier=end.barrier if end is not None else [],
            attempt_summary=state.summary_of_attempt(self.run.state, final),
            first_error=functools.partial(logs.first_error, self.run),
        )
        extra = {"message": verdict.message} if verdict.message is not None else {}
        state.update(
            self.run.state,
            phase=verdict.phase,
            nodes=verdict.nodes,
            finished_at=time.time(),
            **extra,
        )
        return 0 if verdict.phase == "succeeded" else 1


def supervise(run_dir: Path) -> int:
    sup = Supervisor(RunPaths(run_dir))
    codes: list[int] = []
    try:
        sup.setup()
        while True:
            gang = sup.start()
            match decide(sup.monitor(gang), sup.retries, sup.cfg.job.max_retries, sup.diverged()):
                case Retry(lost):
                    sup.retry(gang, lost)
                case GiveUp(lost, diverged):
                    codes = sup.give_up(gang, lost, diverged)
                    break
                case Verdict(ended):
                    codes = ended
                    break
    except Cancelled:
        codes = sup.cancelled()
    except Exception as exc:  # record why, then let the traceback reach supervisor.log
        sup.crashed(exc)
        raise
    finally:
        sup.teardown()
    return sup.finish(codes)


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1])))
