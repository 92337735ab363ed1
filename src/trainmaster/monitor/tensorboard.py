"""`trainmaster tensorboard [JOB]`: TensorBoard on a run's events, or on every run's.

Local: `python -m tensorboard.main` as a child process on STORAGE/runs/JOB/tensorboard (the
run is named after the job: --logdir_spec JOB:PATH) or on STORAGE/runs (runs named
JOB/tensorboard), bound to 127.0.0.1 unless --host says otherwise. The port is checked before
anything starts; the URL is printed once TensorBoard answers; it runs in the foreground until
Ctrl-C (or SIGTERM), and is stopped with the command: nothing is left running.

The Kubernetes backend serves the cluster's TensorBoard through the same serve() with a
`kubectl port-forward` (backends/kubernetes/tensorboard.py).
"""

from __future__ import annotations

import contextlib
import importlib.util
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import IO, Any

from trainmaster.cluster.addons import TENSORBOARD_PORT
from trainmaster.errors import JobFailed, UserError
from trainmaster.monitor import history
from trainmaster.storage import Storage

START_TIMEOUT_S = 90.0
DEFAULT_PORT = TENSORBOARD_PORT


def port_in_use(host: str, port: int) -> bool:
    """Someone listens there, or the address cannot be bound (as TensorBoard would bind it)."""
    probe_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        if s.connect_ex((probe_host, port)) == 0:
            return True
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def check_port(host: str, port: int) -> None:
    if not 0 < port < 65536:
        raise UserError(f"{port} is not a TCP port (1-65535)", where="--port")
    if port_in_use(host, port):
        raise UserError(
            f"port {port} on {host} is in use (another TensorBoard?); pick a free one with --port",
            where="--port",
        )


def logdir_args(store: Storage, job: str | None) -> tuple[list[str], str]:
    """(TensorBoard's logdir arguments, what they show) for one job or every run."""
    if job is None:
        runs = store.runs
        if not runs.is_dir():
            raise UserError(f"no runs under {store.root} yet; check --storage", where="--storage")
        return ["--logdir", str(runs.resolve())], f"every run under {runs}"
    run = history.find_run(store, job)
    if not run.tensorboard.is_dir() or not any(run.tensorboard.iterdir()):
        raise UserError(
            f"job {job} has no TensorBoard events yet ({run.tensorboard}); it writes "
            f"them from its first step (see `trainmaster status {job}`)",
            where="JOB",
        )
    return ["--logdir_spec", f"{job}:{run.tensorboard.resolve()}"], f"job {job}"


def command(logdir: list[str], host: str, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tensorboard.main",
        *logdir,
        "--host",
        host,
        "--port",
        str(port),
        "--reload_interval",
        "5",
    ]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _tail(log: IO[bytes]) -> str:
    log.seek(0)
    lines = log.read().decode(errors="replace").strip().splitlines()
    return " | ".join(lines[-3:]) or "no output"


def wait_until_answers(
    proc: subprocess.Popen[bytes],
    url: str,
    log: IO[bytes],
    what: str,
    timeout_s: float = START_TIMEOUT_S,
) -> None:
    """Poll `url` until it answers 200; JobFailed if the process ends or time runs out."""
    end = time.monotonic() + timeout_s
    while not _answers(url):
        if proc.poll() is not None:
            raise JobFailed(f"{what} exited with code {proc.returncode}: {_tail(log)}")
        if time.monotonic() > end:
            raise JobFailed(
                f"{what} did not answer at {url} within {timeout_s:.0f} s: {_tail(log)}"
            )
        time.sleep(0.2)  # polling a server that is starting (bounded)


@contextlib.contextmanager
def _child(cmd: list[str]) -> Iterator[tuple[subprocess.Popen[bytes], IO[bytes]]]:
    """A child process with its output in a temporary file; stopped (TERM, then KILL) on exit,
    including when this process gets SIGTERM."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    previous_int = signal.signal(
        signal.SIGINT, signal.default_int_handler
    )  # even if inherited ignored
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            yield proc, log
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def serve(cmd: list[str], url: str, probe: str, what: str, announce: Callable[[str], None]) -> None:
    with _child(cmd) as (proc, log):
        wait_until_answers(proc, probe, log, what)
        try:
            announce(url)
            code = proc.wait()
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the normal end; _child stops it
            return
        raise JobFailed(f"{what} stopped with code {code}: {_tail(log)}")


def serve_local(
    store: Storage, job: str | None, host: str, port: int, announce: Callable[[str], None]
) -> None:
    """Start TensorBoard, call `announce(url)` once it answers, block until Ctrl-C."""
    logdir, what = logdir_args(store, job)
    if importlib.util.find_spec("tensorboard") is None:
        raise UserError(
            "the tensorboard package is not installed: pip install tensorboard", where="tensorboard"
        )
    check_port(host, port)
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    url = f"http://{shown}:{port}/"
    serve(
        command(logdir, host, port),
        f"{url}  ({what}; Ctrl-C stops it)",
        url,
        "TensorBoard",
        announce,
    )


def known_tags(url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """Scalar tags TensorBoard serves ({run: {tag: ...}}): what tests and scripts check."""
    import json

    with urllib.request.urlopen(
        f"{url.rstrip('/')}/data/plugin/scalars/tags", timeout=timeout_s
    ) as resp:
        data = json.loads(resp.read())
    return data if isinstance(data, dict) else {}
