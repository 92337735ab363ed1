"""Rendezvous endpoints for local jobs: a free loopback port for c10d, or etcd.

etcd is either an endpoint the user gives (checked before any agent starts, so an unreachable
one is a clear error, not a 10-minute rendezvous timeout) or a private server that trainmaster
starts for the job (Debian's etcd 3.4 with --enable-v2, which torch's etcd rendezvous needs)
with its data under the run folder, and stops when the job ends.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from trainmaster.errors import UserError

LOOPBACK = "127.0.0.1"
INSTALL_ETCD = "install it: sudo apt-get install -y etcd-server (Debian/Ubuntu)"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def split_endpoint(endpoint: str, where: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"{endpoint!r} is not host:port", where=where)
    return host, int(port)


def etcd_healthy(endpoint: str, timeout: float = 2.0) -> bool:
    """True when an etcd serving the v2 API answers at host:port (torch's etcd rendezvous uses v2)."""
    try:
        with urllib.request.urlopen(f"http://{endpoint}/v2/keys", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def check_etcd(endpoint: str, deadline_s: float) -> None:
    """Fail fast, within the rendezvous timeout, when the given etcd cannot be used."""
    end = time.monotonic() + deadline_s
    while True:
        if etcd_healthy(endpoint):
            return
        if time.monotonic() >= end:
            raise UserError(
                f"no etcd with the v2 API answers at {endpoint} (within {deadline_s:.0f} s); "
                "start one with --enable-v2, or leave rendezvous.endpoint unset for a private one",
                where="rendezvous.endpoint",
            )
        time.sleep(0.2)  # polling a network service, not synchronising our own processes


def etcd_binary() -> str:
    path = shutil.which("etcd")
    if path is None:
        raise UserError(
            f"rendezvous.backend is etcd but the etcd server is not installed; {INSTALL_ETCD}",
            where="rendezvous.backend",
        )
    return path


def start_private_etcd(
    data_dir: Path, log_file: Path, timeout_s: float
) -> tuple[subprocess.Popen[bytes], str]:
    """Start etcd on free loopback ports as its own process group; return it and its endpoint."""
    binary = etcd_binary()
    client, peer = free_port(), free_port()
    endpoint = f"{LOOPBACK}:{client}"
    data_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        binary,
        "--enable-v2",
        "--name",
        "trainmaster",
        "--data-dir",
        str(data_dir),
        "--listen-client-urls",
        f"http://{endpoint}",
        "--advertise-client-urls",
        f"http://{endpoint}",
        "--listen-peer-urls",
        f"http://{LOOPBACK}:{peer}",
        "--initial-advertise-peer-urls",
        f"http://{LOOPBACK}:{peer}",
        "--initial-cluster",
        f"trainmaster=http://{LOOPBACK}:{peer}",
    ]
    with log_file.open("ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    end = time.monotonic() + timeout_s
    while not etcd_healthy(endpoint, timeout=1.0):
        if proc.poll() is not None:
            raise UserError(
                f"the private etcd exited with code {proc.returncode}; see {log_file}",
                where="rendezvous",
            )
        if time.monotonic() > end:
            proc.kill()
            raise UserError(
                f"the private etcd did not answer within {timeout_s:.0f} s; see {log_file}",
                where="rendezvous",
            )
        time.sleep(0.1)  # waiting for an external server to come up
    return proc, endpoint


def stop_private_etcd(etcd: subprocess.Popen[bytes] | None) -> None:
    """Stop the private etcd; a cleanup that fails must not lose the run's final phase."""
    if etcd is None:
        return
    try:
        etcd.terminate()
        etcd.wait(timeout=30)
    except Exception:  # still running after 30 s, or already gone: kill it
        with contextlib.suppress(Exception):
            etcd.kill()
            etcd.wait(timeout=5)
