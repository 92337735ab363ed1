"""The control plane's processes: start, readiness waits, liveness and stop.

Each process is started in a session (so a process group) of its own, with its pid in
RUN/pids/NAME.pid and its output in RUN/logs/NAME.log, so that `down` can stop it, and every
child it may have, from another shell. Readiness is polled with a deadline, never slept for,
and a process that exits while we wait ends the wait at once with the tail of its log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ORDER = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "vc-webhook-manager",
    "vc-controller-manager",
    "vc-scheduler",
    "kwok",
]
PORT_NAMES = [
    "etcd",
    "etcd-peer",
    "controller-manager",
    "webhook",
    "webhook-healthz",
    "vc-controllers-healthz",
    "vc-controllers-metrics",
    "vc-scheduler-healthz",
    "vc-scheduler-metrics",
    "kwok",
]


class StartError(RuntimeError):
    pass


def _pid(run: Path, name: str) -> int | None:
    try:
        return int((run / "pids" / f"{name}.pid").read_text())
    except (OSError, ValueError):
        return None


def _ours(pid: int, run: Path) -> bool:
    """Whether PID is still the process we started: every command line here names the run dir
    (a pid file may outlive its process, and the pid be reused)."""
    try:
        return f"{run}/" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def recorded(run: Path, name: str) -> int | None:
    """The pid recorded for NAME, if it is still the process we started."""
    pid = _pid(run, name)
    return pid if pid is not None and _ours(pid, run) else None


def alive(run: Path, name: str) -> bool:
    return recorded(run, name) is not None


ours = _ours


def liveness(run: Path) -> dict[str, bool]:
    return {name: (pid := _pid(run, name)) is not None and _ours(pid, run) for name in ORDER}


def all_alive(run: Path) -> bool:
    return all(liveness(run).values())


def stop_recorded(run: Path, grace: float = 10.0) -> int:
    """Stop the recorded process groups: first the API server's clients, then the API server,
    then etcd, each stage SIGTERM, then SIGKILL what is left after GRACE s. All at once takes
    ten times as long: etcd and the API server each wait for the other's connections to drain.
    """
    stopped = 0
    for stage in (ORDER[:1:-1], ["kube-apiserver"], ["etcd"]):
        groups = [pid for name in stage if (pid := _pid(run, name)) and _ours(pid, run)]
        for pid in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(_ours(pid, run) for pid in groups) and time.monotonic() < deadline:
            time.sleep(0.05)  # waiting for other processes to exit, bounded by grace
        for pid in groups:
            if _ours(pid, run):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        stopped += len(groups)
    return stopped


def _https(run: Path, port: int, path: str) -> int:
    ctx = ssl.create_default_context(cafile=str(run / "pki" / "ca.crt"))
    ctx.load_cert_chain(str(run / "pki" / "admin.crt"), str(run / "pki" / "admin.key"))
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", context=ctx, timeout=2) as r:
            return int(r.status)
    except OSError:  # refused, TLS not ready, HTTP errors (urllib's are OSErrors too)
        return 0


def api_healthy(run: Path, state: dict[str, Any]) -> bool:
    return _https(run, state["ports"]["apiserver"], "/readyz") == 200


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


class Processes:
    """Starts the binaries of BINS with RUN as their working dir; waits with a deadline."""

    def __init__(self, run: Path, bins: Path, deadline: float) -> None:
        self.run, self.bins, self.deadline = run, bins, deadline
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started = time.monotonic()
        self.milestones: list[tuple[str, float]] = []  # (what, seconds since start) per wait

    def start(
        self,
        name: str,
        *args: str,
        env: dict[str, str] | None = None,
        exe: str | None = None,
        preexec: Callable[[], None] | None = None,
    ) -> None:
        """Start BINS/NAME (or EXE, a host binary such as containerd); PREEXEC runs in the child
        before it execs (a real node's process joins the node's cgroup there)."""
        with open(self.run / "logs" / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [exe or str(self.bins / name), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.run,
                start_new_session=True,
                env={**os.environ, **(env or {})},
                preexec_fn=preexec,
            )
        (self.run / "pids" / f"{name}.pid").write_text(str(proc.pid))
        self.procs[name] = proc

    def mark(self, what: str) -> None:
        self.milestones.append((what, time.monotonic() - self.started))

    def wait(self, what: str, ready: Callable[[], bool]) -> None:
        while not ready():
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    tail = (self.run / "logs" / f"{name}.log").read_text(errors="replace")[-2000:]
                    raise StartError(
                        f"{name} exited ({proc.returncode}) while waiting for "
                        f"{what}; end of logs/{name}.log:\n{tail}"
                    )
            if time.monotonic() > self.deadline:
                raise StartError(f"timed out waiting for {what}")
            time.sleep(0.2)  # polling other processes' readiness, bounded by the deadline
        self.mark(what)

    def stop(self) -> None:
        stop_recorded(self.run)
