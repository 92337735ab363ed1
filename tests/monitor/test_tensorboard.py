"""`trainmaster tensorboard`: a real TensorBoard on a real run's events, read back over HTTP;
the kubernetes path against the fake API with a stand-in kubectl."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.backends.kubernetes import fake_routes
from tests.backends.kubernetes.fake_api import FakeCluster, status_body
from tests.conftest import (
    assert_user_error,
    cli_command,
    cli_env,
    run_cli,
    sigint_default,
    wait_for,
)
from tests.monitor.conftest import REPORT_STEPS
from trainmaster.backends.local import rendezvous
from trainmaster.monitor import runinfo
from trainmaster.monitor import tensorboard as tb
from trainmaster.storage import Storage

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def serving(*args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """Run the command in the foreground as a user would; yield its URL line; Ctrl-C it."""
    proc = subprocess.Popen(
        cli_command(*args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(env),
        preexec_fn=sigint_default,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    try:
        try:
            line = lines.get(timeout=120)
        except queue.Empty:
            proc.kill()
            raise AssertionError(f"no URL printed: {proc.communicate()[1]}") from None
        yield line
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
        err = proc.stderr.read() if proc.stderr else ""
    assert code == 0, err  # Ctrl-C is how it ends


def port_free(port: int) -> bool:
    return not rendezvous.port_in_use("127.0.0.1", port)


def test_serves_the_runs_scalars(finished_run: tuple[Path, str]) -> None:
    store, job = finished_run
    port = rendezvous.free_port()
    with serving("tensorboard", job, "--port", str(port), "--storage", str(store)) as line:
        assert line.startswith(f"TensorBoard: http://127.0.0.1:{port}/"), line
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: bool(tb.known_tags(url)), 60, "TensorBoard to load the events")
        tags = tb.known_tags(url)
        (run,) = tags  # this job only, named after it
        assert run.startswith(job) and {"loss", "lr", "seq_per_s"} <= set(tags[run])
        q = f"{url}/data/plugin/scalars/scalars?run={run}&tag=loss"
        with urllib.request.urlopen(q, timeout=10) as resp:
            assert resp.status == 200
            points = json.loads(resp.read())
    rows = runinfo.read_metrics(Storage(store).run_dir(job) / "metrics.jsonl")
    assert [p[1] for p in points] == list(range(1, REPORT_STEPS + 1))
    assert [p[2] for p in points] == pytest.approx([r["loss"] for r in rows], rel=1e-5)
    wait_for(lambda: port_free(port), 30, "TensorBoard to stop")  # nothing left running


def test_serves_every_run(finished_run: tuple[Path, str]) -> None:
    store, job = finished_run
    port = rendezvous.free_port()
    with serving("tensorboard", "--port", str(port), "--storage", str(store)) as line:
        assert "every run" in line
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: f"{job}/tensorboard" in tb.known_tags(url), 60, "the job's run")
        assert "loss" in tb.known_tags(url)[f"{job}/tensorboard"]


def test_bad_input(finished_run: tuple[Path, str], tmp_path: Path) -> None:
    store, job = finished_run
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert_user_error(
            run_cli("tensorboard", job, "--port", str(port), "--storage", str(store)),
            f"port {port} on 127.0.0.1 is in use",
        )
    assert_user_error(run_cli("tensorboard", "nope", "--storage", str(store)), "no job 'nope'")
    (tmp_path / "runs" / "fresh").mkdir(parents=True)
    (tmp_path / "runs" / "fresh" / "state.json").write_text("{}")
    assert_user_error(
        run_cli("tensorboard", "fresh", "--storage", str(tmp_path)), "no TensorBoard events yet"
    )
    assert_user_error(run_cli("tensorboard", "--storage", str(tmp_path / "empty")), "no runs under")


# --- kubernetes: the add-ons' Service, forwarded by kubectl ---------------------------------------

KUBECTL = """#!{python}
import http.server, json, os, sys
with open(os.environ["KUBECTL_LOG"], "w") as f:
    json.dump(sys.argv[1:], f)
port = int(next(a for a in sys.argv if a.endswith(":6006")).split(":")[0])

class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"forwarded")
    def log_message(self, *a):
        pass

http.server.HTTPServer(("127.0.0.1", port), Ok).serve_forever()
"""


@pytest.fixture
def services(fake: FakeCluster, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Services on the fake API (GET one), which it does not serve by itself."""
    found: dict[str, Any] = {}
    original = fake_routes.route

    def route(fk: FakeCluster, h: Any, method: str, path: str, query: Any, body: Any) -> None:
        parts = path.split("/")
        if method == "GET" and len(parts) == 7 and parts[5] == "services":
            ns, name = parts[4], parts[6]
            if (ns, name) in found:
                return h._send(200, found[(ns, name)])
            return h._error(404, "NotFound", f'services "{name}" not found', name, "services")
        return original(fk, h, method, path, query, body)

    monkeypatch.setattr(fake_routes, "route", route)
    assert status_body  # the fake's error shape is what route answers with
    return found


def test_kubernetes_port_forward(
    fake: FakeCluster, services: dict[str, Any], tmp_path: Path
) -> None:
    services[("default", "tensorboard")] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "tensorboard", "namespace": "default"},
        "spec": {"ports": [{"port": 6006}]},
    }
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text(KUBECTL.format(python=sys.executable))
    (bin_dir / "kubectl").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "KUBECTL_LOG": str(tmp_path / "argv.json")}
    port, kube = rendezvous.free_port(), str(fake.kubeconfig())
    with serving(
        "tensorboard", "--backend", "kubernetes", "--kubeconfig", kube, "--port", str(port), env=env
    ) as line:
        assert line.startswith(f"TensorBoard: http://127.0.0.1:{port}/") and "port-forward" in line
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv == [
        "port-forward",
        "--namespace",
        "default",
        "--address",
        "127.0.0.1",
        "service/tensorboard",
        f"{port}:6006",
        "--kubeconfig",
        kube,
        "--context",
        "fake",
    ]
    wait_for(lambda: port_free(port), 30, "kubectl to stop")


def test_kubernetes_without_the_addon(fake: FakeCluster, services: dict[str, Any]) -> None:
    assert_user_error(
        run_cli("tensorboard", "--backend", "kubernetes", "--kubeconfig", str(fake.kubeconfig())),
        "no TensorBoard Service 'tensorboard' in namespace default",
    )
