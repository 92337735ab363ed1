"""The fake API server's routes (see fake_api.py): one function per API path."""

from __future__ import annotations

import base64
import bisect
import contextlib
import json
import re
import subprocess
import threading
import time
from typing import Any

from tests.backends.kubernetes.fake_api import VOLCANO, FakeCluster, new_uid, ws_read, ws_write

CORE = "/api/v1"
TRUE = {
    "1",
    "t",
    "T",
    "TRUE",
    "true",
    "True",
}  # Go's strconv.ParseBool, as the API server reads flags


def _flag(query: dict[str, list[str]], key: str) -> bool:
    return query.get(key, ["false"])[0] in TRUE


def _forbidden(fake: FakeCluster, h: Any, verb: str, resource: str, group: str, ns: str) -> bool:
    if (verb, resource) in fake.forbid:
        h._error(
            403,
            "Forbidden",
            f'{resource}{"." + group if group else ""} is forbidden: User "tester" '
            f'cannot {verb} resource "{resource}" in API group "{group}" in the namespace "{ns}"',
        )
        return True
    return False


def _stamp_new(obj: dict[str, Any], ns: str) -> dict[str, Any]:
    meta = obj.setdefault("metadata", {})
    meta.update(namespace=ns, uid=new_uid(), creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ"))
    return obj


def _objects(
    fake: FakeCluster,
    h: Any,
    method: str,
    store: dict[tuple[str, str], dict[str, Any]],
    ns: str,
    name: str | None,
    query: dict[str, list[str]],
    body: Any,
    resource: str,
    group: str,
    kind: str,
) -> None:
    """create / get / list / replace / patch / delete of one kind of namespaced object."""
    verb = {
        "POST": "create",
        "GET": "get" if name else "list",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete",
    }[method]
    if _forbidden(fake, h, verb, resource, group, ns):
        return
    dry = query.get("dryRun") == ["All"]
    if method == "POST":
        key = (ns, body["metadata"]["name"])
        if key in store:
            return h._error(
                409, "AlreadyExists", f'{resource} "{key[1]}" already exists', key[1], resource
            )
        if resource == "jobs" and fake.deny_jobs:
            return h._error(
                400,
                "BadRequest",
                f'admission webhook "validatejob.volcano.sh" denied the request: {fake.deny_jobs}',
            )
        obj = _stamp_new(json.loads(json.dumps(body)), ns)
        if resource == "jobs":
            obj["status"] = {"state": {"phase": "Pending"}}
        if not dry:
            store[key] = obj
            if resource == "pods":
                _start_pod(fake, ns, obj)
        return h._send(201, obj)
    if name is None:
        return _list(fake, h, store, ns, query, kind)
    if (ns, name) not in store:
        return h._error(404, "NotFound", f'{resource} "{name}" not found', name, resource)
    if method == "GET":
        return h._send(200, store[(ns, name)])
    if method == "PUT":
        store[(ns, name)] = _stamp_new(body, ns)
        return h._send(200, store[(ns, name)])
    if method == "PATCH":  # a merge of metadata and of a ConfigMap's data (progressmap.publish)
        store[(ns, name)]["metadata"].update(body.get("metadata", {}))
        if "data" in body:
            store[(ns, name)].setdefault("data", {}).update(body["data"])
        return h._send(200, store[(ns, name)])
    with fake.lock:
        obj = store.pop((ns, name))
        fake.lock.notify_all()
    if resource == "pods":
        proc = fake.procs.pop((ns, name), None)
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
    return h._send(200, obj)


def _list(
    fake: FakeCluster,
    h: Any,
    store: dict[tuple[str, str], dict[str, Any]],
    ns: str,
    query: dict[str, list[str]],
    kind: str,
) -> None:
    """A list, in chunks as the API server serves them when asked with `limit`: in key order
    (etcd keys are /registry/<resource>/<namespace>/<name>), at most `limit` items, and a
    `continue` token while keys remain, the last page possibly empty; an expired token
    (fake.expire_continues) is refused with 410 Gone. "Retrieving large results sets in
    chunks": https://kubernetes.io/docs/reference/using-api/api-concepts/
    With fake.short_pages, a page examines only `limit` keys, so a label selector returns fewer
    items, even none, with a token, as the API reference allows: "Setting a limit may return
    fewer than the requested amount of items (up to zero items) in the event all requested
    objects are filtered out" (`limit`, kubernetes.io/docs/reference/kubernetes-api/
    common-parameters/common-parameters/).
    """
    with fake.lock:  # one consistent snapshot (the real server lists at one resourceVersion)
        code, body = _page(fake, store, ns, query, kind)
        data = json.dumps(body).encode()  # under the lock: the kubelet thread changes pods
    fake.list_pages.append((h.path.partition("?")[0], code, len(body.get("items", []))))
    if code != 200:
        return h._error(code, body["reason"], body["message"])
    h._send(200, data)


def _page(
    fake: FakeCluster,
    store: dict[tuple[str, str], dict[str, Any]],
    ns: str,
    query: dict[str, list[str]],
    kind: str,
) -> tuple[int, dict[str, Any]]:
    terms = (t.partition("=") for t in filter(None, query.get("labelSelector", [""])[0].split(",")))
    sel = [(k, v) for k, _, v in terms]
    limit = int(query.get("limit", ["0"])[0] or 0)
    token = query.get("continue", [""])[0]
    keys = sorted(k for k in store if ns == "*" or k[0] == ns)
    start = 0
    if token:
        try:
            mark = json.loads(base64.urlsafe_b64decode(token))
        except ValueError:
            return 400, {
                "reason": "BadRequest",
                "message": "continue key is not valid: illegal base64 data",
            }
        if fake.expire_continues:
            fake.expire_continues -= 1
            return 410, {
                "reason": "Expired",
                "message": "The provided continue parameter is too old to "
                "display a consistent list result. You can start a new list without the "
                "continue parameter.",
            }
        start = bisect.bisect_right(keys, tuple(mark["start"]))
    items: list[dict[str, Any]] = []
    i = start
    while i < len(keys) and not (
        limit and (len(items) == limit or (fake.short_pages and i - start == limit))
    ):
        o = store[keys[i]]
        i += 1
        if all(o["metadata"].get("labels", {}).get(k) == v for k, v in sel):
            items.append(o)
    meta: dict[str, Any] = {"resourceVersion": "1"}
    if limit and i < len(keys):
        meta["continue"] = base64.urlsafe_b64encode(
            json.dumps({"v": "meta.k8s.io/v1", "start": list(keys[i - 1])}).encode()
        ).decode()
    return 200, {"apiVersion": "v1", "kind": f"{kind}List", "metadata": meta, "items": items}


def _start_pod(fake: FakeCluster, ns: str, pod: dict[str, Any]) -> None:
    name = pod["metadata"]["name"]
    fake.logs[(ns, name)] = []
    status: dict[str, Any] = {
        "phase": "Pending",
        "conditions": [],
        "containerStatuses": [
            {
                "name": "c",
                "restartCount": 0,
                "ready": False,
                "image": "x",
                "imageID": "",
                "state": {"waiting": {"reason": "ContainerCreating"}},
            }
        ],
    }
    pod["status"] = status
    if fake.pending_message is not None:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": fake.pending_message,
            }
        ]
        return
    if fake.run_pods:
        status["phase"] = "Running"
        status["containerStatuses"][0]["state"] = {"running": {}}
        fake._kubelet(ns, pod)


def _log(fake: FakeCluster, h: Any, ns: str, name: str, query: dict[str, list[str]]) -> None:
    if _forbidden(fake, h, "get", "pods/log", "", ns):
        return
    if (ns, name) not in fake.pods:
        return h._error(404, "NotFound", f'pods "{name}" not found', name, "pods")
    if fake.log_barrier is not None:  # passes only when that many reads are in flight at once
        with contextlib.suppress(threading.BrokenBarrierError):
            fake.log_barrier.wait(timeout=10)
    stamps = _flag(query, "timestamps")

    def fmt(entries: list[tuple[str, str]]) -> bytes:
        return "".join(f"{s} {t}\n" if stamps else f"{t}\n" for s, t in entries).encode()

    if not _flag(query, "follow"):
        entries = list(fake.logs[(ns, name)])
        if "tailLines" in query:
            entries = entries[-int(query["tailLines"][0]) :]
        data = fmt(entries)
        if "limitBytes" in query:
            data = data[: int(query["limitBytes"][0])]
        return h._send(200, data, "text/plain")
    h.start_chunked()
    sent = 0
    while True:
        with fake.lock:
            fake.lock.wait_for(
                lambda n=sent: (
                    len(fake.logs.get((ns, name), [])) > n
                    or (ns, name) in fake.done
                    or (ns, name) not in fake.pods
                ),
                timeout=30,
            )
            entries = list(fake.logs.get((ns, name), []))[sent:]
            over = (ns, name) in fake.done or (ns, name) not in fake.pods
        sent += len(entries)
        if entries:
            h.chunk(fmt(entries))
        if over and not entries:
            break
    h.wfile.write(b"0\r\n\r\n")


def _exec(fake: FakeCluster, h: Any, ns: str, name: str, query: dict[str, list[str]]) -> None:
    if _forbidden(fake, h, "create", "pods/exec", "", ns):
        return
    if (ns, name) not in fake.pods:
        return h._error(404, "NotFound", f'pods "{name}" not found', name, "pods")
    rfile, wfile = h.websocket()
    lock = threading.Lock()

    def send(channel: int, data: bytes) -> None:
        with lock:
            ws_write(wfile, 2, bytes([channel]) + data)

    stdin = _flag(query, "stdin")
    proc = subprocess.Popen(
        query["command"],
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=fake._env(fake.pods[(ns, name)]),
    )

    def pump(stream: Any, channel: int) -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):
            send(channel, chunk)

    pumps = [
        threading.Thread(target=pump, args=(proc.stdout, 1)),
        threading.Thread(target=pump, args=(proc.stderr, 2)),
    ]
    for t in pumps:
        t.start()

    def finish() -> None:
        code = proc.wait()
        for t in pumps:
            t.join()
        result: dict[str, Any] = {"metadata": {}, "status": "Success"}
        if code:
            result = {
                "metadata": {},
                "status": "Failure",
                "reason": "NonZeroExitCode",
                "message": f"command terminated with non-zero exit code: {code}",
                "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
            }
        send(3, json.dumps(result).encode())
        with lock:
            ws_write(wfile, 8, b"\x03\xe8")

    waiter = threading.Thread(target=finish)
    waiter.start()
    while True:
        frame = ws_read(rfile)
        if frame is None or frame[0] == 8:
            break
        opcode, data = frame
        if not data or proc.stdin is None or proc.stdin.closed:
            continue
        if data[0] == 0:
            with contextlib.suppress(BrokenPipeError, ValueError):
                proc.stdin.write(data[1:])
                proc.stdin.flush()
        elif data[:2] == b"\xff\x00":  # v5: the client closed stdin
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
    if proc.stdin is not None and not proc.stdin.closed:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
    waiter.join(timeout=30)


PATHS = [
    (re.compile(rf"^{VOLCANO}/namespaces/([^/]+)/jobs(?:/([^/]+))?$"), "jobs"),
    (re.compile(rf"^{VOLCANO}/(jobs)$"), "all-jobs"),
    (re.compile(rf"^{CORE}/namespaces/([^/]+)/configmaps(?:/([^/]+))?$"), "configmaps"),
    (re.compile(rf"^{CORE}/namespaces/([^/]+)/pods/([^/]+)/log$"), "log"),
    (re.compile(rf"^{CORE}/namespaces/([^/]+)/pods/([^/]+)/exec$"), "exec"),
    (re.compile(rf"^{CORE}/namespaces/([^/]+)/pods(?:/([^/]+))?$"), "pods"),
]


def route(
    fake: FakeCluster, h: Any, method: str, path: str, query: dict[str, list[str]], body: Any
) -> None:
    for pattern, what in PATHS:
        m = pattern.match(path)
        if not m:
            continue
        if what in ("jobs", "all-jobs") and not fake.volcano_installed:
            break
        if what == "jobs":
            return _objects(
                fake,
                h,
                method,
                fake.jobs,
                m[1],
                m[2],
                query,
                body,
                "jobs",
                "batch.volcano.sh",
                "Job",
            )
        if what == "all-jobs":
            return _objects(
                fake,
                h,
                method,
                fake.jobs,
                "*",
                None,
                query,
                body,
                "jobs",
                "batch.volcano.sh",
                "Job",
            )
        if what == "configmaps":
            return _objects(
                fake,
                h,
                method,
                fake.configmaps,
                m[1],
                m[2],
                query,
                body,
                "configmaps",
                "",
                "ConfigMap",
            )
        if what == "pods":
            return _objects(fake, h, method, fake.pods, m[1], m[2], query, body, "pods", "", "Pod")
        if what == "log":
            return _log(fake, h, m[1], m[2], query)
        return _exec(fake, h, m[1], m[2], query)
    h._send(404, b"404 page not found\n", "text/plain")
