"""`data stage` on Kubernetes: the pod (golden, schema) and the runner against the fake API.

The fake's kubelet runs the pod's real shell script here, on a folder standing in for the
PVC; `aws` is a stub that serves files from a folder standing in for S3, and `data verify` a
stub that checks for vocab.txt. Local uploads go through the real client's exec WebSocket.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
from pathlib import Path

import pytest

from tests.backends.kubernetes.fake_api import FakeCluster
from tests.backends.kubernetes.schemas import validate_k8s
from tests.backends.kubernetes.test_volcano import job_cfg
from tests.golden import check
from trainmaster.backends.kubernetes import jobs as kubernetes
from trainmaster.backends.kubernetes import names as k8s_names
from trainmaster.backends.kubernetes import stage, volcano
from trainmaster.errors import JobFailed, UserError

GOLDEN = Path(__file__).parent / "golden"
TUTORIAL_TAR = (
    "s3://neuron-s3/training_datasets/bert_pretrain_wikicorpus_tokenized_hdf5/"
    "bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128.tar"
)
VERIFY = [
    "sh",
    "-c",
    'test -f "$1/vocab.txt" && echo "verified $(ls "$1" | wc -l) files"',
    "verify",
]
S3_STUB = ["aws", "s3"]  # the stub below stands for `python3 -m trainmaster.cluster.aws s3`
AWS_STUB = """#!/bin/sh
echo "$*" >> "$FAKE_S3/calls"
key=${3#s3://}
case "$2" in
  cp) exec cat "$FAKE_S3/$key" ;;
  sync) mkdir -p "$4" && exec cp -R "$FAKE_S3/$key." "$4/" ;;
esac
exit 2
"""


@pytest.fixture
def world(fake: FakeCluster, tmp_path: Path) -> tuple[Path, Path]:
    """(the PVC's folder, the S3 folder); pods run for real."""
    mount, s3, bin_dir = tmp_path / "pvc", tmp_path / "s3", tmp_path / "bin"
    for d in (mount, s3, bin_dir):
        d.mkdir()
    (bin_dir / "aws").write_text(AWS_STUB)
    (bin_dir / "aws").chmod(0o755)
    fake.run_pods = True
    fake.env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_S3": str(s3)}
    return mount, s3


def shards(folder: Path) -> dict[str, bytes]:
    files = {
        "vocab.txt": b"[PAD]\n[UNK]\n",
        "wiki_training_0.hdf5": os.urandom(3000),
        "wiki_training_1.hdf5": os.urandom(5000),
        "dataset.json": b"{}",
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def tree(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def stage_it(
    cluster: kubernetes.Cluster, mount: Path, src: str, name: str = "wiki128", **kw: object
) -> tuple[str, list[str]]:
    cfg = job_cfg("trn1-32xl", [f"kubernetes.mount={mount}"])
    pod = stage.build_stage_pod(cfg, src, name, verify=VERIFY, s3=S3_STUB, **kw)  # type: ignore[arg-type]
    lines: list[str] = []
    dest = stage.run_stage(cluster, pod, on_line=lines.append, start_timeout_s=30, poll_s=0.05)
    return dest, lines


def test_golden_stage_pod() -> None:
    cfg = job_cfg("trn1-32xl", ["kubernetes.service_account=data-stager"])
    pod = stage.build_stage_pod(
        cfg, TUTORIAL_TAR, "bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128", no_sign_request=True
    )
    check(GOLDEN / "stage-wikicorpus-tar.yaml", volcano.render_yaml([pod]))
    validate_k8s(pod)
    assert k8s_names.is_dns1123_label(pod["metadata"]["name"])
    res = pod["spec"]["containers"][0]["resources"]
    assert res["requests"]["memory"] and pod["spec"]["restartPolicy"] == "Never"  # not BestEffort


def test_sources_and_names(tmp_path: Path) -> None:
    assert stage.parse_source(TUTORIAL_TAR).kind == "s3-archive"
    assert stage.parse_source("s3://bkt/x.tgz") == stage.Source(
        "s3-archive", "s3://bkt/x.tgz", gzip=True
    )
    assert stage.parse_source("s3://bkt/data") == stage.Source("s3-prefix", "s3://bkt/data/")
    assert stage.parse_source(str(tmp_path)).kind == "local"
    for bad, says in [
        ("s3:///x", "names no bucket"),
        ("gs://b/x", "use an s3:// URL"),
        (str(tmp_path / "nope"), "not a folder"),
    ]:
        with pytest.raises(UserError, match=says):
            stage.parse_source(bad)
    a, b = stage.pod_name("Wiki_128"), stage.pod_name("wiki-128")
    assert a != b and all(k8s_names.is_dns1123_label(n) for n in (a, b, stage.pod_name("x" * 200)))


def test_bad_input_before_any_api_call(fake: FakeCluster, tmp_path: Path) -> None:
    cfg = job_cfg("trn1-32xl")
    for src, name, says in [
        (TUTORIAL_TAR, "../etc", "--name: "),
        (TUTORIAL_TAR, "", "--name: "),
        (str(tmp_path / "missing"), "ok", "SRC: "),
    ]:
        with pytest.raises(UserError, match=says):
            stage.build_stage_pod(cfg, src, name)
    with pytest.raises(UserError, match="kubernetes.image: no training image"):
        stage.build_stage_pod(job_cfg("trn1-32xl", ["kubernetes.image=' '"]), TUTORIAL_TAR, "wiki")
    assert fake.requests == []


def test_s3_archive_with_one_top_folder(
    world: tuple[Path, Path], fake: FakeCluster, cluster: kubernetes.Cluster
) -> None:
    mount, s3 = world
    files = shards(s3 / "src" / "bert_seqlen128")
    (s3 / "bucket").mkdir()
    with tarfile.open(s3 / "bucket" / "wiki.tar", "w") as tar:
        tar.add(s3 / "src" / "bert_seqlen128", arcname="bert_seqlen128")
    dest, lines = stage_it(cluster, mount, "s3://bucket/wiki.tar", no_sign_request=True)
    assert dest == f"{mount}/datasets/wiki128"
    assert tree(Path(dest)) == files  # unwrapped: the shards sit directly in datasets/NAME
    assert "verified 4 files\n" in lines and lines[-1] == f"trainmaster: staged {dest}\n"
    assert (s3 / "calls").read_text() == "s3 cp s3://bucket/wiki.tar - --no-sign-request\n"
    assert sorted(p.name for p in (mount / "datasets").iterdir()) == ["wiki128"]  # no staging left
    assert not fake.pods  # the pod is gone


def test_s3_prefix(
    world: tuple[Path, Path], fake: FakeCluster, cluster: kubernetes.Cluster
) -> None:
    mount, s3 = world
    files = shards(s3 / "bucket" / "prefix")
    dest, _ = stage_it(cluster, mount, "s3://bucket/prefix")
    assert tree(Path(dest)) == files
    assert (s3 / "calls").read_text().startswith("s3 sync s3://bucket/prefix/ ")
    assert not fake.pods


@pytest.mark.parametrize("protocol", ["v5.channel.k8s.io", "v4.channel.k8s.io"])
def test_local_folder_through_exec(
    world: tuple[Path, Path],
    fake: FakeCluster,
    cluster: kubernetes.Cluster,
    tmp_path: Path,
    protocol: str,
) -> None:
    mount, _ = world
    fake.ws_protocol = protocol  # v4 has no end-of-stdin: tar stops at the archive's end marker
    files = shards(tmp_path / "mine")
    (tmp_path / "mine" / "extra").mkdir()
    (tmp_path / "mine" / "extra" / "notes.txt").write_text("n")
    dest, lines = stage_it(cluster, mount, str(tmp_path / "mine"))
    assert tree(Path(dest)) == files | {"extra/notes.txt": b"n"}
    assert lines[-1] == f"trainmaster: staged {dest}\n"
    execs = [r for r in fake.requests if r[1].endswith("/exec")]
    assert [r[2]["command"][0] for r in execs] == ["sh", "touch"] and execs[0][2]["stdin"][0] in (
        "true",
        "True",
    )
    assert not fake.pods


def test_existing_dataset_is_kept(
    world: tuple[Path, Path], fake: FakeCluster, cluster: kubernetes.Cluster, tmp_path: Path
) -> None:
    mount, _ = world
    (mount / "datasets" / "wiki128").mkdir(parents=True)
    (mount / "datasets" / "wiki128" / "old").write_text("keep")
    shards(tmp_path / "mine")
    with pytest.raises(
        UserError, match=r"--name: .*/datasets/wiki128 exists on the cluster's storage"
    ):
        stage_it(cluster, mount, str(tmp_path / "mine"))
    assert tree(mount / "datasets" / "wiki128") == {"old": b"keep"}
    assert not fake.pods


def test_failed_verify_leaves_nothing(
    world: tuple[Path, Path], fake: FakeCluster, cluster: kubernetes.Cluster
) -> None:
    mount, s3 = world
    shards(s3 / "bucket" / "prefix")
    (s3 / "bucket" / "prefix" / "vocab.txt").unlink()
    with pytest.raises(
        JobFailed,
        match=r"staging s3://bucket/prefix into .* failed \(pod stage-wiki128-.*: Failed, exit 1\)",
    ):
        stage_it(cluster, mount, "s3://bucket/prefix")
    assert not (mount / "datasets" / "wiki128").exists()
    assert list((mount / "datasets").iterdir()) == []  # staging folder removed too
    assert not fake.pods


def test_failed_download(
    world: tuple[Path, Path], fake: FakeCluster, cluster: kubernetes.Cluster
) -> None:
    mount, _ = world
    lines: list[str] = []
    with pytest.raises(JobFailed):
        cfg = job_cfg("trn1-32xl", [f"kubernetes.mount={mount}"])
        pod = stage.build_stage_pod(
            cfg, "s3://bucket/missing.tar.gz", "wiki", verify=VERIFY, s3=S3_STUB
        )
        stage.run_stage(cluster, pod, on_line=lines.append, start_timeout_s=30, poll_s=0.05)
    assert any("reading s3://bucket/missing.tar.gz failed" in line for line in lines), lines
    assert not fake.pods


def test_unschedulable_pod_is_reported_and_deleted(
    fake: FakeCluster, cluster: kubernetes.Cluster
) -> None:
    fake.pending_message = (
        "0/2 nodes are available: 2 node(s) had untolerated taint {dedicated: system}"
    )
    pod = stage.build_stage_pod(job_cfg("trn1-32xl"), TUTORIAL_TAR, "wiki")
    with pytest.raises(
        UserError, match=r"did not start within 0 s: 0/2 nodes are available.*ContainerCreating"
    ):
        stage.run_stage(cluster, pod, start_timeout_s=0.1, poll_s=0.02)
    assert not fake.pods and [r[0] for r in fake.requests if "/pods/stage-" in r[1]][-1] == "DELETE"


def test_a_running_stage_of_the_same_name(fake: FakeCluster, cluster: kubernetes.Cluster) -> None:
    fake.pending_message = "waiting"
    pod = stage.build_stage_pod(job_cfg("trn1-32xl"), TUTORIAL_TAR, "wiki")
    fake.pods[("default", pod["metadata"]["name"])] = pod
    with pytest.raises(UserError, match=r"a stage pod stage-wiki-\w+ exists .*kubectl delete pod"):
        stage.run_stage(cluster, pod)
    assert ("default", pod["metadata"]["name"]) in fake.pods  # not ours to delete


def test_upload_of_bytes_roundtrip() -> None:
    """The tar we stream is a plain POSIX archive GNU tar reads (PAX headers for long names)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("d/" + "x" * 150)
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    assert len(buf.getvalue()) % tarfile.RECORDSIZE == 0


def test_s3_is_read_with_boto3_which_every_image_has() -> None:
    """30.3: only the Neuron image has the AWS CLI; boto3 comes with trainmaster in all three."""
    cfg = job_cfg("p5-48xl")
    for src in (TUTORIAL_TAR, "s3://bucket/prefix/"):
        text = stage.build_stage_pod(cfg, src, "wiki")["spec"]["containers"][0]["command"][2]
        assert not re.search(r"(?<![.\w])aws s3", text)  # no AWS CLI
        assert "python3 -m trainmaster.cluster.aws s3 " in text


def test_stage_reads_s3_through_the_plans_service_account_by_default() -> None:
    """30.8: the plan's IRSA service account for cluster.data_buckets is the default."""
    cfg = job_cfg("trn1-32xl", ['cluster.data_buckets=["bucket"]'])
    pod = stage.build_stage_pod(cfg, "s3://bucket/wiki.tar", "wiki")
    assert pod["spec"]["serviceAccountName"] == "trainmaster-s3-reader"
    other = stage.build_stage_pod(cfg, "s3://elsewhere/wiki.tar", "wiki")
    assert "serviceAccountName" not in other["spec"]
    mine = job_cfg(
        "trn1-32xl", ['cluster.data_buckets=["bucket"]', "kubernetes.service_account=me"]
    )
    assert (
        stage.build_stage_pod(mine, "s3://bucket/w.tar", "w")["spec"]["serviceAccountName"] == "me"
    )


def test_the_upload_waits_for_the_staging_folder_or_gives_way(tmp_path: Path) -> None:
    """The exec'd upload starts before the pod script's mkdir; it must neither fail at once
    (no folder yet) nor wait out its timeout when the script has given up (dataset exists)."""
    import io
    import subprocess
    import tarfile
    import threading

    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo("a.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    folder, dest = tmp_path / "staging", tmp_path / "dataset"
    proc = subprocess.Popen(
        stage.untar_command(str(folder), str(dest), wait_s=60), stdin=subprocess.PIPE
    )
    threading.Timer(0.5, folder.mkdir).start()  # the script's mkdir, a moment later
    proc.communicate(data.getvalue(), timeout=30)
    assert proc.returncode == 0 and (folder / "a.txt").read_bytes() == b"hi"

    dest.mkdir()  # the dataset is there: the script exits 3 without a staging folder
    gone = subprocess.run(stage.untar_command(str(tmp_path / "never"), str(dest), wait_s=60),
                          input=b"", timeout=30, check=False)  # fmt: skip
    assert gone.returncode == stage.EXISTS_EXIT
