"""`trainmaster export checkpoint JOB DEST`: the newest complete checkpoint out of a run, to a
folder or S3 (moto), verified against SHA-256 sums; never a half copy under the final name."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from tests.conftest import assert_user_error, run_cli
from trainmaster.cli.app import main
from trainmaster.errors import UserError
from trainmaster.run import export, state
from trainmaster.storage import RunPaths, Storage


@pytest.fixture
def run(tmp_path: Path) -> RunPaths:
    """A finished local run with checkpoints 10 and 20, and 30 still being written."""
    run = RunPaths(Storage(tmp_path / "data").run_dir("bert"))
    run.dir.mkdir(parents=True)
    state.write(run.state, state.RunState(job="bert", phase="succeeded"))
    for step in (10, 20):
        ckpt = run.checkpoints / f"step_{step}"
        (ckpt / "shards").mkdir(parents=True)
        (ckpt / "model.pt").write_bytes(os.urandom(5000))
        (ckpt / "shards" / "rank1.pt").write_bytes(os.urandom(300))
        (ckpt / "meta.json").write_text(json.dumps({"step": step}))
    (run.checkpoints / ".tmp-step_30-123").mkdir()
    return run


def test_the_newest_checkpoint_is_copied_and_verified(run: RunPaths, tmp_path: Path) -> None:
    storage = str(run.dir.parent.parent)
    dest = tmp_path / "kept"
    done = run_cli("export", "checkpoint", "local://bert", str(dest), "--storage", storage)
    assert done.returncode == 0, done.stderr
    copy = dest / "bert" / "step_20"
    assert f"{copy}: 3 file(s), verified" in done.stdout
    want = json.loads((copy / export.MANIFEST).read_text())
    assert want["step"] == 20 and export.verify(copy, want) == []
    assert (copy / "model.pt").read_bytes() == (
        run.checkpoints / "step_20" / "model.pt"
    ).read_bytes()
    again = run_cli("export", "checkpoint", "bert", str(dest), "--storage", storage)
    assert_user_error(again, where="DEST")
    older = run_cli("export", "checkpoint", "bert", str(dest), "--step", "10", "--storage", storage)
    assert older.returncode == 0 and (dest / "bert" / "step_10" / "meta.json").exists()
    none = run_cli("export", "checkpoint", "bert", str(dest), "--step", "30", "--storage", storage)
    assert_user_error(none, "have: 10, 20")  # .tmp-step_30 is not complete


def test_a_copy_that_differs_never_gets_the_final_name(
    run: RunPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = shutil.copytree

    def damaging(src: Path, dst: Path, *args: object, **kwargs: object) -> object:
        out = real(src, dst, *args, **kwargs)  # type: ignore[arg-type]
        if (Path(dst) / "model.pt").exists():
            (Path(dst) / "model.pt").write_bytes(b"torn")
        return out

    monkeypatch.setattr(shutil, "copytree", damaging)
    with pytest.raises(UserError, match="differs from the checkpoint in model.pt"):
        export.to_folder("bert", run.checkpoints / "step_20", tmp_path / "kept")
    assert not (tmp_path / "kept" / "bert" / "step_20").exists()
    assert list((tmp_path / "kept" / "bert").iterdir()) == []  # no temporary left either


def test_to_s3_every_file_checked_and_the_manifest_last(
    run: RunPaths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, "testing")
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-west-2")
        s3.create_bucket(
            Bucket="results", CreateBucketConfiguration={"LocationConstraint": "us-west-2"}
        )
        storage = str(run.dir.parent.parent)
        assert (
            main(["export", "checkpoint", "bert", "s3://results/ckpt", "--storage", storage]) == 0
        )
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="results")["Contents"]]
        assert sorted(keys) == sorted(f"ckpt/bert/step_20/{k}" for k in
                                      ("model.pt", "shards/rank1.pt", "meta.json", export.MANIFEST))  # fmt: skip
        body = s3.get_object(Bucket="results", Key="ckpt/bert/step_20/model.pt")["Body"].read()
        assert body == (run.checkpoints / "step_20" / "model.pt").read_bytes()
        want = json.loads(
            s3.get_object(Bucket="results", Key=f"ckpt/bert/step_20/{export.MANIFEST}")[
                "Body"
            ].read()
        )
        assert set(want["files"]) == {"model.pt", "shards/rank1.pt", "meta.json"}
        assert (
            main(["export", "checkpoint", "bert", "s3://missing-bucket/x", "--storage", storage])
            == 2
        )
    assert "checked by S3 against its SHA-256" in capsys.readouterr().out


def test_kubernetes_jobs_are_refused_with_the_way_out() -> None:
    shown = run_cli("export", "checkpoint", "kubernetes://ml/bert", "/tmp/x")
    assert_user_error(shown, "kubectl cp")
