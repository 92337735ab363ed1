"""An in-process fake of the few Kubernetes API paths trainmaster uses, for the REAL client.

Serves JSON over HTTP/1.1 from a thread: Volcano Jobs (namespaced custom objects), ConfigMaps,
pods (list by label selector, create, read, delete; lists in chunks with limit/continue), pod
logs (plain text; follow=true as a chunked stream that ends when the pod ends; timestamps,
limitBytes, tailLines) and pod exec over a WebSocket (the k8s channel protocol, v5 or v4).
Bearer-token auth answers 401, a forbid-list answers 403 with the API server's wording,
missing objects 404, clashes 409.

A small "kubelet" can run a created pod's command as a local subprocess (run_pods=True): its
output becomes the pod log, its exit code the pod's phase. Exec runs commands the same way.
Nothing here waits on sleeps: log followers wait on a condition variable, bounded.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import socket
import struct
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

TOKEN = "good-token"
VOLCANO = "/apis/batch.volcano.sh/v1alpha1"
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def status_body(
    code: int, reason: str, message: str, name: str | None = None, kind: str = ""
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if name is not None:
        body["details"] = {"name": name, "kind": kind}
    return body


class FakeCluster:
    def __init__(self, tmp: Path) -> None:
        self.lock = threading.Condition()
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.configmaps: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.logs: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self.done: set[tuple[str, str]] = set()
        self.procs: dict[tuple[str, str], subprocess.Popen[bytes]] = {}
        self.requests: list[tuple[str, str, dict[str, list[str]], Any]] = []
        self.list_pages: list[tuple[str, int, int]] = []  # every list: (path, HTTP status, items)
        self.expire_continues = 0  # this many next requests with a continue token: 410 Gone
        self.short_pages = False  # a page examines only `limit` keys (fewer matches, even none)
        self.latency_s = 0.0  # a simulated round trip added to every request (bench/k8s_scale.py)
        self.log_barrier: threading.Barrier | None = None  # log reads wait for each other here
        self.forbid: set[tuple[str, str]] = set()  # (verb, resource)
        self.deny_jobs: str | None = None  # an admission webhook's answer
        self.volcano_installed = True
        self.run_pods = False
        self.pending_message: str | None = None  # pods stay Pending with this condition
        self.ws_protocol = "v5.channel.k8s.io"
        self.env: dict[str, str] = {}
        self.clock = 1_700_000_000.0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.tmp = tmp

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def kubeconfig(self, token: str = TOKEN, namespace: str | None = None) -> Path:
        ctx: dict[str, Any] = {"cluster": "fake", "user": "tester"}
        if namespace:
            ctx["namespace"] = namespace
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "contexts": [{"name": "fake", "context": ctx}, {"name": "other", "context": ctx}],
            "users": [{"name": "tester", "user": {"token": token}}],
        }
        path = self.tmp / f"kubeconfig-{token}-{namespace}"
        path.write_text(json.dumps(cfg))
        return path

    # --- what the tests drive (Volcano's controller and the kubelet, simulated) --------------
    def _stamp(self) -> str:
        self.clock += 0.25
        whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(self.clock)))
        frac = f"{self.clock % 1:.9f}"[2:].rstrip("0")  # RFC3339Nano trims trailing zeros
        return f"{whole}{'.' + frac if frac else ''}Z"

    def add_pod(
        self,
        ns: str,
        name: str,
        labels: dict[str, str],
        phase: str = "Running",
        log: list[str] | None = None,
        exit_code: int | None = None,
    ) -> None:
        status: dict[str, Any] = {
            "phase": phase,
            "containerStatuses": [
                {
                    "name": "trainer",
                    "restartCount": 0,
                    "ready": phase == "Running",
                    "image": "x",
                    "imageID": "",
                    "state": {"terminated": {"exitCode": exit_code, "reason": "Error"}}
                    if exit_code is not None
                    else {"running": {}},
                }
            ],
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"nodeName": "node-1", "containers": [{"name": "trainer"}]},
            "status": status,
        }
        with self.lock:
            self.pods[(ns, name)] = pod
            self.logs[(ns, name)] = []
        for line in log or []:
            self.append_log(ns, name, line)

    def append_log(self, ns: str, pod: str, line: str) -> None:
        with self.lock:
            self.logs[(ns, pod)].append((self._stamp(), line))
            self.lock.notify_all()

    def finish(self, ns: str, pod: str, phase: str = "Succeeded", exit_code: int = 0) -> None:
        with self.lock:
            p = self.pods[(ns, pod)]
            p["status"]["phase"] = phase
            p["status"]["containerStatuses"][0]["state"] = {
                "terminated": {"exitCode": exit_code, "reason": phase}
            }
            self.done.add((ns, pod))
            self.lock.notify_all()

    def _env(self, pod: dict[str, Any]) -> dict[str, str]:
        env = {**os.environ, **self.env, "POD_NAME": pod["metadata"]["name"], "POD_IP": "127.0.0.1"}
        for item in pod["spec"]["containers"][0].get("env", []):
            if "value" in item:
                env[item["name"]] = item["value"]
        return env

    def _kubelet(self, ns: str, pod: dict[str, Any]) -> None:
        """Run the pod's command here: its output is the log, its exit the phase."""
        name = pod["metadata"]["name"]
        proc = subprocess.Popen(
            pod["spec"]["containers"][0]["command"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=self._env(pod),
            start_new_session=True,
        )
        self.procs[(ns, name)] = proc

        def pump() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                with contextlib.suppress(KeyError):
                    self.append_log(ns, name, raw.decode(errors="replace").rstrip("\n"))
            code = proc.wait()
            with contextlib.suppress(KeyError):
                self.finish(ns, name, "Succeeded" if code == 0 else "Failed", code)

        threading.Thread(target=pump, daemon=True).start()

    def close(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        self.server.shutdown()
        self.server.server_close()


def _handler(fake: FakeCluster) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()  # headers and body are separate writes: no Nagle delay between them
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
            pass

        def handle(self) -> None:
            # A client that drops a kept-alive connection with an unread answer (a log stream it
            # did not consume) resets it: normal for a client, no traceback on the test's stderr.
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                super().handle()

        def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(
            self, code: int, reason: str, message: str, name: str | None = None, kind: str = ""
        ) -> None:
            self._send(code, status_body(code, reason, message, name, kind))

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length)) if length else None

        def _dispatch(self, method: str) -> None:
            url = urlparse(self.path)
            query = parse_qs(url.query)
            body = self._body() if method in ("POST", "PUT", "PATCH", "DELETE") else None
            fake.requests.append((method, url.path, query, body))
            if fake.latency_s:
                time.sleep(fake.latency_s)  # simulating the network, not waiting for anything
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                return self._error(401, "Unauthorized", "Unauthorized")
            from tests.backends.kubernetes.fake_routes import route

            route(fake, self, method, url.path, query, body)

        def do_GET(self) -> None:  # noqa: N802
            self._dispatch("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._dispatch("POST")

        def do_PUT(self) -> None:  # noqa: N802
            self._dispatch("PUT")

        def do_PATCH(self) -> None:  # noqa: N802
            self._dispatch("PATCH")

        def do_DELETE(self) -> None:  # noqa: N802
            self._dispatch("DELETE")

        # --- streaming -------------------------------------------------------------------------
        def chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

        def start_chunked(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

        def websocket(self) -> tuple[Any, Any]:
            key = self.headers["Sec-WebSocket-Key"]
            accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
            self.send_response(101, "Switching Protocols")
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", accept)
            offered = [p.strip() for p in self.headers.get("Sec-WebSocket-Protocol", "").split(",")]
            chosen = fake.ws_protocol if fake.ws_protocol in offered else offered[0]
            self.send_header("Sec-WebSocket-Protocol", chosen)
            self.end_headers()
            self.close_connection = True
            return self.rfile, self.wfile

    return Handler


# --- WebSocket frames (RFC 6455), just what the k8s exec protocol needs ------------------------
def ws_read(rfile: Any) -> tuple[int, bytes] | None:
    head = rfile.read(2)
    if len(head) < 2:
        return None
    opcode, length, masked = head[0] & 0x0F, head[1] & 0x7F, head[1] & 0x80
    if length == 126:
        length = struct.unpack(">H", rfile.read(2))[0]
    elif length == 127:
        length = struct.unpack(">Q", rfile.read(8))[0]
    mask = rfile.read(4) if masked else b""
    data = rfile.read(length)
    if mask:
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
    return opcode, data


def ws_write(wfile: Any, opcode: int, data: bytes) -> None:
    n = len(data)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([n])
    elif n < 1 << 16:
        head += bytes([126]) + struct.pack(">H", n)
    else:
        head += bytes([127]) + struct.pack(">Q", n)
    wfile.write(head + data)


def new_uid() -> str:
    return str(uuid.uuid4())
