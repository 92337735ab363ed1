"""`trainmaster data stage SRC --name NAME` on the Kubernetes backend: a dataset onto the PVC.

A short-lived pod (the training image, the shared-storage PVC mounted) copies the data into a
hidden staging folder next to STORAGE/datasets/NAME, runs `trainmaster data verify` on it and
only then renames it into place, so a failed or interrupted copy never leaves a half dataset
under a name the trainer would read. An archive holding one top folder (the tutorial's
wikicorpus .tar does) is unwrapped. The pod is deleted whatever happens.

Sources: an `s3://` prefix (`s3 sync`), an `s3://` .tar/.tar.gz/.tgz (`s3 cp - | tar x`,
nothing written twice), or a local folder, streamed as a tar through the API (pod exec with
stdin, like `kubectl cp`): meant for small and medium datasets, since every byte crosses the
API server; put large ones on S3. The image needs GNU `tar` and `trainmaster`. S3 is read with
boto3 (`python3 -m trainmaster.cluster.aws s3 ...`), which trainmaster depends on, so every
training image has it; only the Neuron image has the AWS CLI. The credentials come
through IRSA: kubernetes.service_account, else the plan's read-only service account for the
buckets in cluster.data_buckets (config.S3_READER), since pods cannot reach the node's
instance metadata.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import shlex
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, Literal, cast

from trainmaster import storage
from trainmaster.backends.kubernetes import names as k8s_names
from trainmaster.backends.kubernetes import podspec
from trainmaster.backends.kubernetes.client import (
    Cluster,
    Conflict,
    as_body,
    call,
    exec_stream,
    lines,
)
from trainmaster.backends.kubernetes.volcano import check_settings, image_of, labels
from trainmaster.config import S3_READER, JobConfig
from trainmaster.errors import JobFailed, UserError

VERIFY = ["python3", "-m", "trainmaster", "data", "verify"]
S3 = ["python3", "-m", "trainmaster.cluster.aws", "s3"]  # `cp URL -` and `sync URL DIR`, as aws s3
EXISTS_EXIT = 3  # the script's exit code when datasets/NAME is already there
WAIT_UPLOAD_S = 6 * 3600  # a local upload must finish within this
DEADLINE_S = 24 * 3600  # activeDeadlineSeconds: no stage pod outlives a day, even if orphaned
DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
# S3 bucket naming rules (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html)
# and the key characters S3 calls safe (.../userguide/object-keys.html, "Safe characters"):
# a URL that also holds a shell's or a tar's special characters is refused before any quoting.
S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
S3_KEY = re.compile(r"[A-Za-z0-9!_.*'()/-]*")
CHUNK = 256 << 10
ANN_SOURCE, ANN_DEST, ANN_STAGING = (
    "trainmaster.io/source",
    "trainmaster.io/dest",
    "trainmaster.io/staging",
)


@dataclass(frozen=True)
class Source:
    kind: Literal["s3-prefix", "s3-archive", "local"]
    location: str
    gzip: bool = False


def parse_source(src: str) -> Source:
    if src.startswith("s3://"):
        bucket, _, key = src[5:].partition("/")
        if not bucket:
            raise UserError(f"{src!r} names no bucket (s3://BUCKET/PREFIX)", where="SRC")
        if not S3_BUCKET.fullmatch(bucket):
            raise UserError(
                f"{src!r}: {bucket!r} is not an S3 bucket name (3-63 of a-z 0-9 . -)", where="SRC"
            )
        if not S3_KEY.fullmatch(key):
            raise UserError(
                f"{src!r}: an S3 key here is letters, digits and ! - _ . * ' ( ) / "
                "(S3's safe characters)",
                where="SRC",
            )
        if key.endswith((".tar.gz", ".tgz")):
            return Source("s3-archive", src, gzip=True)
        if key.endswith(".tar"):
            return Source("s3-archive", src)
        return Source("s3-prefix", src.rstrip("/") + "/")
    if "://" in src:
        raise UserError(f"{src!r}: use an s3:// URL or a local folder", where="SRC")
    folder = Path(src).expanduser()
    if not folder.is_dir():
        raise UserError(f"{src!r} is not a folder here (or an s3:// URL)", where="SRC")
    return Source("local", str(folder.resolve()))


def pod_name(dataset: str) -> str:
    """`stage-<slug>-<hash>`: dataset names may hold '_' and be long; pod names may not."""
    slug = re.sub(r"[^a-z0-9-]+", "-", dataset.lower()).strip("-")[:40].strip("-") or "data"
    return f"stage-{slug}-{hashlib.sha256(dataset.encode()).hexdigest()[:8]}"


def paths(cfg: JobConfig, dataset: str) -> tuple[str, str]:
    """(destination, staging folder) on the shared storage, as the pod sees it."""
    datasets = PurePosixPath(cfg.kubernetes.mount, storage.DATASETS)
    return str(datasets / dataset), str(datasets / f".{dataset}.staging-{pod_name(dataset)}")


def script(
    source: Source,
    dest: str,
    tmp: str,
    *,
    no_sign_request: bool = False,
    verify: list[str] | None = None,
    s3: list[str] | None = None,
) -> str:
    q = shlex.quote  # every value below enters the shell quoted (docs/architecture.md 5: 17.9)
    unsigned = " --no-sign-request" if no_sign_request else ""
    s3_cmd = shlex.join(s3 or S3)
    if source.kind == "s3-prefix":
        copy = [f'{s3_cmd} sync "$src_url" "$tmp" --no-progress{unsigned}']
    elif source.kind == "s3-archive":
        flags = "-xzf" if source.gzip else "-xf"
        copy = [
            "rc=0",
            f'( {s3_cmd} cp "$src_url" -{unsigned} || touch "$tmp.failed" ) | '
            f'tar {flags} - -C "$tmp" || rc=$?',
            'if [ -e "$tmp.failed" ]; then echo "trainmaster: reading $src_url '
            'failed" >&2; exit 1; fi',
            'if [ "$rc" -ne 0 ]; then echo "trainmaster: $src_url is not a readable '
            'tar archive (tar exit $rc)" >&2; exit 1; fi',
        ]
    else:  # the runner streams a tar into $tmp over exec, then creates $tmp.done
        copy = [
            "n=0",
            'until [ -e "$tmp.done" ]; do',
            f'  n=$((n + 1)); if [ "$n" -ge {WAIT_UPLOAD_S} ]; then echo "trainmaster: no '
            'upload arrived" >&2; exit 1; fi',
            "  sleep 1",
            "done",
        ]
    return (
        "\n".join(
            [
                "set -eu",
                f"dest={q(dest)}",
                f"tmp={q(tmp)}",
                f"src_url={q(source.location)}",
                'if [ -e "$dest" ]; then echo "trainmaster: $dest exists; choose another --name or '
                f'remove it" >&2; exit {EXISTS_EXIT}; fi',
                'trap \'rm -rf "$tmp" "$tmp.done" "$tmp.failed"\' EXIT',
                'rm -rf "$tmp" "$tmp.done" "$tmp.failed"',
                'mkdir -p "$tmp"',
                *copy,
                'src="$tmp"; top=$(ls -A "$tmp")',
                'if [ "$(printf \'%s\\n\' "$top" | wc -l)" -eq 1 ] && [ -d "$tmp/$top" ]; then src="$tmp/$top"; fi',
                f'{shlex.join(verify or VERIFY)} "$src"',
                'mv -T "$src" "$dest"',
                'echo "trainmaster: staged $dest"',
            ]
        )
        + "\n"
    )


def build_stage_pod(
    cfg: JobConfig,
    src: str,
    dataset: str,
    *,
    image: str | None = None,
    no_sign_request: bool = False,
    verify: list[str] | None = None,
    s3: list[str] | None = None,
) -> dict[str, Any]:
    """The stage pod: a pure function of the config, the source and the dataset name."""
    if not DATASET_NAME.match(dataset):
        raise UserError(
            f"{dataset!r}: a dataset name is letters, digits, '.', '_' and '-'", where="--name"
        )
    image = image_of(cfg, image)
    check_settings(cfg)
    source = parse_source(src)
    dest, tmp = paths(cfg, dataset)
    name, k = pod_name(dataset), cfg.kubernetes
    # Sized for the system nodes, m6i.large (2 vCPU, 8 GiB, of which EKS keeps some for the
    # kubelet and the add-ons run there): 2 CPU / 8 Gi never fitted one. A copy and a verify need
    # little; requests keep it off BestEffort, and it may use idle CPU (no CPU limit, as the
    # add-ons in cluster/addons.py).
    requests, limits = {"cpu": "500m", "memory": "1Gi"}, {"memory": "4Gi"}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": DEADLINE_S,
        "containers": [
            {
                "name": "stage",
                "image": image,
                "command": [
                    "/bin/sh",
                    "-c",
                    script(
                        source, dest, tmp, no_sign_request=no_sign_request, verify=verify, s3=s3
                    ),
                ],
                "env": [
                    {"name": "TRAINMASTER_STORAGE", "value": k.mount},
                    *({"name": key, "value": v} for key, v in podspec.scratch_env().items()),
                ],
                "resources": {"requests": requests, "limits": limits},
                "volumeMounts": [
                    {"name": podspec.STORAGE_VOLUME, "mountPath": k.mount},
                    podspec.scratch_mount(),
                ],
                "securityContext": podspec.security_context(None),
                "workingDir": podspec.WORKING_DIR,
            }
        ],
        "volumes": [
            {"name": podspec.STORAGE_VOLUME, "persistentVolumeClaim": {"claimName": k.pvc}},
            podspec.scratch_volume(),
        ],
        # No node selector: any node that can mount the volume, accelerator nodes included.
        "tolerations": podspec.tolerations(cfg, None),
    }
    # The S3 credentials (IRSA) come with the service account: the job's own, else the plan's
    # read-only one when it reads this bucket (cluster.data_buckets).
    account = k.service_account
    bucket = src[5:].partition("/")[0] if source.kind != "local" else None
    if account is None and not no_sign_request and bucket in cfg.cluster.data_buckets:
        account = S3_READER
    if account:
        spec["serviceAccountName"] = account
    if not k8s_names.is_dns1123_label(name):  # pragma: no cover - pod_name() makes valid names
        raise UserError(f"bad pod name {name!r}", where="--name")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": k.namespace,
            "labels": labels(name, "stage"),
            "annotations": {ANN_SOURCE: src, ANN_DEST: dest, ANN_STAGING: tmp},
        },
        "spec": spec,
    }


def _phase(cluster: Cluster, name: str, ns: str) -> tuple[str, Any]:
    with call(cluster, "get", "pods", name, ns):
        pod = cluster.core.read_namespaced_pod(name, ns)
    return (pod.status.phase if pod.status else None) or "Pending", pod


def _wait(
    cluster: Cluster, name: str, ns: str, until: tuple[str, ...], timeout_s: float, poll_s: float
) -> tuple[str, Any]:
    end = time.monotonic() + timeout_s
    while True:
        phase, pod = _phase(cluster, name, ns)
        if phase in until or time.monotonic() > end:
            return phase, pod
        time.sleep(poll_s)  # polling the API server for another machine's progress


def _exec(
    cluster: Cluster, name: str, ns: str, command: list[str], folder: Path | None = None
) -> None:
    """Run a command in the pod; with `folder`, stream it as a tar to the command's stdin."""
    with call(cluster, "exec in", "pods", name, ns):
        ws = exec_stream(cluster, name, ns, command, stdin=folder is not None, binary=True)
    try:
        if folder is not None:

            class _Writer:
                def write(self, data: bytes) -> int:
                    for i in range(0, len(data), CHUNK):
                        ws.write_stdin(bytes(data[i : i + CHUNK]))
                    return len(data)

            with tarfile.open(
                fileobj=cast(IO[bytes], _Writer()), mode="w|", format=tarfile.PAX_FORMAT
            ) as tar:
                tar.add(folder, arcname=".")
            close = getattr(ws, "close_channel", None)  # kubernetes >= 36 speaks v5
            if close is not None:
                close(0)  # v5: end of stdin; v4: tar stops at the archive's end marker
        ws.run_forever(timeout=WAIT_UPLOAD_S)
        err = ws.read_stderr()
        try:
            code = ws.returncode
        except (TypeError, KeyError, ValueError):  # the connection closed without an exit status
            code = None
    finally:
        ws.close()
    if code != 0:
        text = err.decode(errors="replace").strip() if isinstance(err, bytes) else str(err).strip()
        raise JobFailed(f"`{shlex.join(command)}` in pod {name} failed (exit {code}): {text}")


def untar_command(folder: str, dest: str, wait_s: int = 300) -> list[str]:
    """tar into the staging folder once the pod's script has made it. A pod is Running as soon
    as its container starts, before the script's `mkdir -p "$tmp"`: an upload exec'd at once
    found no folder (tar: Cannot open). The script makes the folder after removing any old one,
    so its existence says the script is ready for the upload. When the dataset exists already
    the script exits without making it (EXISTS_EXIT): so does the upload."""
    wait = (
        'n=0; until [ -d "$1" ]; do n=$((n + 1)); '
        f'if [ -e "$2" ]; then exit {EXISTS_EXIT}; fi; '
        f'if [ "$n" -ge {wait_s * 10} ]; then echo "no staging folder $1" >&2; exit 1; fi; '
        'sleep 0.1; done; exec tar -x -f - -C "$1"'
    )
    return ["sh", "-c", wait, "untar", folder, dest]


def run_stage(
    cluster: Cluster,
    pod: dict[str, Any],
    *,
    on_line: Callable[[str], None] = lambda line: None,
    start_timeout_s: float = 600,
    poll_s: float = 2.0,
) -> str:
    """Create the pod, feed it (local sources), show its log, delete it; return the dataset path."""
    meta = pod["metadata"]
    name, ns, ann = meta["name"], meta["namespace"], meta["annotations"]
    src, dest, tmp = ann[ANN_SOURCE], ann[ANN_DEST], ann[ANN_STAGING]
    source = parse_source(src)
    try:
        with call(cluster, "create", "pods", name, ns):
            cluster.core.create_namespaced_pod(ns, as_body(pod))
    except Conflict as exc:
        raise UserError(
            f"a stage pod {name} exists in namespace {ns} (another stage of this dataset?); "
            f"wait for it or delete it: kubectl delete pod -n {ns} {name}",
            where="--name",
        ) from exc
    try:
        phase, obj = _wait(
            cluster, name, ns, ("Running", "Succeeded", "Failed"), start_timeout_s, poll_s
        )
        if phase == "Pending":
            why = (
                "; ".join(
                    [c.message for c in obj.status.conditions or [] if c.message]
                    + [
                        f"{cs.state.waiting.reason}: {cs.state.waiting.message}"
                        for cs in obj.status.container_statuses or []
                        if cs.state and cs.state.waiting
                    ]
                )
                or "not scheduled"
            )
            raise UserError(
                f"the stage pod did not start within {start_timeout_s:.0f} s: {why}",
                where="kubernetes",
            )
        if source.kind == "local" and phase == "Running":
            try:
                _exec(cluster, name, ns, untar_command(tmp, dest), Path(source.location))
                _exec(cluster, name, ns, ["touch", f"{tmp}.done"])
            except (UserError, JobFailed):
                # The pod may have ended on its own (e.g. the dataset exists): its log says why.
                if _wait(cluster, name, ns, ("Succeeded", "Failed"), 30, poll_s)[0] == "Running":
                    raise
        with call(cluster, "read log of", "pods", name, ns):
            resp = cluster.core.read_namespaced_pod_log(
                name, ns, follow=True, _preload_content=False
            )
        for line in lines(resp):
            on_line(line)
        phase, obj = _wait(cluster, name, ns, ("Succeeded", "Failed"), start_timeout_s, poll_s)
        term = [
            cs.state.terminated
            for cs in obj.status.container_statuses or []
            if cs.state and cs.state.terminated
        ]
        code = term[0].exit_code if term else None
        if code == EXISTS_EXIT:
            raise UserError(
                f"{dest} exists on the cluster's storage; choose another --name", where="--name"
            )
        if phase != "Succeeded":
            raise JobFailed(
                f"staging {src} into {dest} failed (pod {name}: {phase}, exit {code}); "
                "its log is above"
            )
        return dest
    finally:
        with contextlib.suppress(UserError, JobFailed), call(cluster, "delete", "pods", name, ns):
            cluster.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
