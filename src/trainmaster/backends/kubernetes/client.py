"""The connection to a cluster and the errors its API answers, for the Kubernetes backend.

A thin layer over the official `kubernetes` client. Every API answer a user can act on becomes
one UserError line: 401 (credentials), 403 (which verb on which resource RBAC refuses, or what
Volcano's admission webhook said), 404 (no such job, or no such API: Volcano missing), 409 (a
name clash, raised as Conflict for the caller to explain).

Lists are read in chunks (list_all): `limit` items per request and the server's `continue`
token for the next, so a 1,024-pod job is a few bounded answers, not one giant one. Pages are
parsed as plain JSON, not into the client's models, which cost many times more to build for
a large job (`python bench/k8s_scale.py` times `status` of 1,024 pods).
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream as _stream

from trainmaster.backends.kubernetes.names import GROUP
from trainmaster.errors import JobFailed, UserError

JOBS = f"jobs.{GROUP}"
# Items per list request: kubectl's default (`kubectl get --chunk-size=500`, "Return large lists
# in chunks rather than all at once"; kubectl reference, kubernetes.io/docs/reference/kubectl/).
PAGE = 500
# Concurrent requests of one command (pod logs when looking for rank 0): also the size of the
# client's connection pool, so that no connection is opened and dropped per request.
CONNECTIONS = 16
FIX_CREDENTIALS = (
    "refresh them (`aws eks update-kubeconfig --name CLUSTER`) or pick others with "
    "--kubeconfig / --context"
)


@dataclass
class Cluster:
    """A connection: the API client and the namespace that commands act in."""

    api: k8s.ApiClient
    namespace: str
    context: str | None = None

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    @property
    def coordination(self) -> k8s.CoordinationV1Api:
        return k8s.CoordinationV1Api(self.api)

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.api)


def connect(
    kubeconfig: str | None = None, context: str | None = None, namespace: str | None = None
) -> Cluster:
    """From a kubeconfig (--kubeconfig, else $KUBECONFIG, else ~/.kube/config) or, inside a pod, the
    service account. Namespace: --namespace, else the context's, else "default"."""
    env = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    path = Path(kubeconfig or env or "~/.kube/config").expanduser()
    configuration = k8s.Configuration()
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, CONNECTIONS)
    if not path.exists():
        if kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ:
            k8s_config.load_incluster_config(client_configuration=configuration)
            return Cluster(k8s.ApiClient(configuration), namespace or "default", None)
        raise UserError(
            f"no kubeconfig at {path}; create it with `aws eks update-kubeconfig --name "
            "CLUSTER` or pass --kubeconfig",
            where="--kubeconfig",
        )
    try:
        contexts, active = k8s_config.list_kube_config_contexts(str(path))
        chosen = next((c for c in contexts if c["name"] == context), None) if context else active
        if chosen is None:
            names = ", ".join(c["name"] for c in contexts) or "none"
            raise UserError(
                f"no context {context!r} in {path} (contexts: {names})", where="--context"
            )
        k8s_config.load_kube_config(
            config_file=str(path),
            context=chosen["name"],
            client_configuration=configuration,
            persist_config=False,
        )
    except k8s_config.ConfigException as exc:
        raise UserError(f"cannot use {path}: {exc}", where="--kubeconfig") from exc
    ns = namespace or chosen.get("context", {}).get("namespace") or "default"
    return Cluster(k8s.ApiClient(configuration), ns, chosen["name"])


class NotFound(UserError):
    """404 for a named object: it does not exist (the message says which)."""


class Conflict(UserError):
    """409: an object of that name exists (handled by the caller)."""


def _message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "")
        return str(body.get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.body or exc.reason).strip()


def _details(exc: ApiException) -> dict[str, Any]:
    try:
        details = json.loads(exc.body or "")["details"]
    except (ValueError, KeyError, TypeError):
        return {}
    return details if isinstance(details, dict) else {}


def _missing_object(exc: ApiException, name: str | None) -> bool:
    """404 for an object (Status with details.name) rather than for an unknown API."""
    return name is not None and _details(exc).get("name") == name


def _missing_subresource(exc: ApiException) -> str:
    """The subresource (e.g. pods/log) a 404 is about, when it is one: the object exists and
    its node (the kubelet) had nothing to serve. Seen on kwok's fake nodes, which serve no log."""
    kind = str(_details(exc).get("kind") or "")
    return kind if "/" in kind else ""


@contextlib.contextmanager
def call(
    cluster: Cluster,
    verb: str,
    resource: str,
    name: str | None = None,
    namespace: str | None = None,
) -> Iterator[None]:
    """Turn what the API answers into errors that say what to do."""
    ns = namespace or cluster.namespace
    try:
        yield
    except ApiException as exc:
        msg, code = _message(exc), exc.status
        if code == 401:
            raise UserError(
                f"the API server did not accept the credentials (401 Unauthorized); "
                f"{FIX_CREDENTIALS}",
                where="kubernetes",
            ) from exc
        if "admission webhook" in msg:
            raise UserError(
                f"Volcano refused the job: {msg} (is kubernetes.queue created and "
                "open? `trainmaster cluster up` creates it)",
                where="kubernetes",
            ) from exc
        if code == 403:
            raise UserError(
                f"not allowed to {verb} {resource} in namespace {ns} (403 Forbidden: "
                f"{msg}); ask for an RBAC Role that grants {verb} on {resource}",
                where="kubernetes",
            ) from exc
        if code == 404 and _missing_subresource(exc):
            raise UserError(
                f"{_missing_subresource(exc)} of {name} in namespace {ns}: its node served "
                f"nothing (404: {msg}); the container may not have started, or the node "
                "serves no logs",
                where="kubernetes",
            ) from exc
        if code == 404 and _missing_object(exc, name):
            what = "job" if resource == JOBS else resource.rstrip("s")
            raise NotFound(f"no {what} {name} in namespace {ns}", where="JOB") from exc
        if code == 404:
            raise UserError(
                f"the API server has no {resource} ({msg}); is Volcano installed? "
                "(`trainmaster cluster up` installs it)",
                where="kubernetes",
            ) from exc
        if code == 409:
            raise Conflict(msg, where="kubernetes") from exc
        if code in (400, 422):
            raise UserError(
                f"the API server refused to {verb} {resource}: {msg}", where="kubernetes"
            ) from exc
        raise JobFailed(f"{verb} {resource} failed: {code} {exc.reason}: {msg}") from exc
    except urllib3.exceptions.HTTPError as exc:
        host = cluster.api.configuration.host
        raise UserError(
            f"cannot reach the API server at {host} ({type(exc).__name__}); check the "
            "network and --kubeconfig / --context",
            where="kubernetes",
        ) from exc


def list_all(
    cluster: Cluster, resource: str, fetch: Callable[..., Any], *, limit: int | None = None
) -> list[dict[str, Any]]:
    """Every item of a list call, `limit` (default PAGE) per request, following `continue`.

    `fetch` is a list method of the client with its arguments bound (functools.partial); it
    gets limit, _continue and _preload_content=False, and the raw JSON is parsed here. A page
    may hold fewer items than `limit`, even none, while a token says more follow: only the
    token ends the list ("Retrieving large results sets in chunks",
    https://kubernetes.io/docs/reference/using-api/api-concepts/). A token expires (410 Gone,
    after 5 minutes by default): the list then starts over, once, as that page advises.
    """
    items: list[dict[str, Any]] = []
    token, restarted = "", False
    with call(cluster, "list", resource):
        while True:
            opts: dict[str, Any] = {"limit": limit or PAGE, "_preload_content": False}
            if token:
                opts["_continue"] = token
            try:
                resp = fetch(**opts)
                try:
                    page = json.loads(resp.data)
                finally:
                    resp.release_conn()
            except ApiException as exc:
                if exc.status != 410 or not token or restarted:
                    raise
                items, token, restarted = [], "", True
                continue
            items += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return items


def as_body(manifest: dict[str, Any]) -> Any:
    """A manifest dict as a request body: the client sends dicts as they are, no model needed."""
    return manifest


def obj(value: object) -> dict[str, Any]:
    """A custom object as the client returns it (parsed JSON)."""
    if not isinstance(value, dict):
        raise JobFailed(f"unexpected answer from the API server: {type(value).__name__}")
    return value


def lines(resp: Any) -> Iterator[str]:
    """Lines of a streamed HTTP response, as they arrive (follow=true never ends early)."""
    decoder, pending = codecs.getincrementaldecoder("utf-8")(errors="replace"), ""
    try:
        for chunk in resp.stream(65536):
            pending += decoder.decode(chunk)
            *complete, pending = pending.split("\n")
            for line in complete:
                yield line + "\n"
        pending += decoder.decode(b"", final=True)
        if pending:
            yield pending
    finally:
        resp.release_conn()


# The one module that imports the kubernetes client (and urllib3, its transport): others catch
# these names and open exec streams through exec_stream().
ApiError = ApiException
TransportError = urllib3.exceptions.HTTPError


@contextlib.contextmanager
def best_effort() -> Iterator[None]:
    """Clean-up calls whose failure changes nothing for the user (the object is gone or will be)."""
    with contextlib.suppress(ApiException, urllib3.exceptions.HTTPError):
        yield


def whoami(cluster: Cluster) -> dict[str, Any]:
    """The caller's user info as the API server sees it (SelfSubjectReview): a pod's token
    carries its node in extra (backends/kubernetes/nodemark.py)."""
    with call(cluster, "create", "selfsubjectreviews"):
        review = k8s.AuthenticationV1Api(cluster.api).create_self_subject_review({})
    info = review.status.user_info if review.status else None
    return {"username": info.username, "extra": info.extra or {}} if info else {}


def exec_stream(
    cluster: Cluster, pod: str, namespace: str, command: list[str], **kwargs: Any
) -> Any:
    """An exec websocket into `pod` (kubernetes.stream); the caller reads and closes it."""
    return _stream(
        cluster.core.connect_get_namespaced_pod_exec,
        pod,
        namespace,
        command=command,
        stdout=True,
        stderr=True,
        tty=False,
        _preload_content=False,
        **kwargs,
    )
