"""`trainmaster data ...` as a user runs it: exit codes, one-line errors, Ctrl-C, summaries."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import assert_user_error, run_cli, sigint_default
from tests.data.helpers import rewrite, write_docs
from trainmaster.data.corpus import pydoc_documents
from trainmaster.data.shards import read_arrays


def test_the_data_commands_are_wired() -> None:
    """Once a skip guard; a CLI without `data` must fail here, not skip the module."""
    from trainmaster.cli.app import full

    assert any(g.name == "data" for g in full().registered_groups)


SMALL = ["--seq-len", "32", "--max-pred", "5", "--dupe-factor", "1", "--shards", "2"]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, pydoc_vocab: Path) -> Path:
    out = tmp_path_factory.mktemp("cli") / "small"
    r = run_cli(
        "data",
        "prepare",
        "--builtin",
        "pydoc",
        "--output",
        str(out),
        "--vocab",
        str(pydoc_vocab),
        "--quiet",
        *SMALL,
    )
    assert r.returncode == 0, r.stderr
    assert "examples" in r.stdout and "2 shards" in r.stdout and str(out) in r.stdout
    assert r.stderr == ""  # --quiet
    return out


def test_verify_and_inspect(made: Path) -> None:
    r = run_cli("data", "verify", str(made))
    assert r.returncode == 0 and r.stdout.startswith("ok: ")
    r = run_cli("data", "inspect", str(made), "--json", "--examples", "2")
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)
    assert stats["shards"] == 2 and stats["examples"] == sum(stats["per_shard"].values())
    assert len(stats["samples"]) == 2 and stats["samples"][0]["text"].startswith("[CLS] ")
    r = run_cli("data", "inspect", str(made))
    assert r.returncode == 0 and "[CLS]" in r.stdout and "masked" in r.stdout


def test_name_and_storage_place_the_dataset(tmp_path: Path, pydoc_vocab: Path) -> None:
    r = run_cli(
        "data",
        "prepare",
        "--builtin",
        "pydoc",
        "--storage",
        str(tmp_path),
        "--vocab",
        str(pydoc_vocab),
        "--name",
        "mine",
        *SMALL,
    )
    assert r.returncode == 0, r.stderr
    assert "prepare: making examples" in r.stderr  # plain progress lines without a terminal
    assert (tmp_path / "datasets" / "mine" / "mine_training_1.hdf5").is_file()
    r = run_cli("data", "verify", "mine", "--storage", str(tmp_path), "--quiet")
    assert r.returncode == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--builtin", "pydoc", "--seq-len", "8"], "error: --seq-len: must be at least 16 (got 8)"),
        (["--builtin", "pydoc", "--max-pred", "0"], "error: --max-pred: must be between 1"),
        (["BINARY"], "BINARY: binary file (NUL byte at offset 2)"),
        (["--builtin", "pydoc", "--output", "MADE"], "holds a dataset already"),
        ([], "error: no input"),
    ],
    ids=["seq-len", "max-pred", "binary", "occupied", "no-input"],
)
def test_bad_input_exit_2_one_line(
    tmp_path: Path, made: Path, args: list[str], message: str
) -> None:
    binary = tmp_path / "data.bin"
    binary.write_bytes(b"ab\x00cd")
    args = [str(binary) if a == "BINARY" else str(made) if a == "MADE" else a for a in args]
    message = message.replace("BINARY", str(binary))
    if "--output" not in args:
        args += ["--output", str(tmp_path / "new")]
    r = run_cli("data", "prepare", *args)
    assert_user_error(r, message)
    assert not (tmp_path / "new").exists()


def test_verify_failure_exit_1_capped(made: Path, tmp_path: Path) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    for p in made.iterdir():
        (folder / p.name).write_bytes(p.read_bytes())
    shard = folder / "small_training_0.hdf5"
    a = read_arrays(shard)
    a["next_sentence_labels"][:] = 3
    rewrite(shard, a)
    r = run_cli("data", "verify", str(folder))
    assert r.returncode == 1
    n = len(a["next_sentence_labels"])
    assert r.stdout.count("next_sentence_labels is 3") == 10
    assert f"... and {n - 10} more 'nsp' violation(s)" in r.stdout
    assert f"FAILED: {n} violation(s) in 1 file(s)" in r.stderr


@pytest.mark.parametrize(("stage", "workers"), [("making examples", "2"), ("writing shards", "1")])
def test_interrupt_leaves_nothing(
    tmp_path: Path, pydoc_vocab: Path, stage: str, workers: str
) -> None:
    """Ctrl-C in the middle: exit 130, no shard or dataset.json, temporaries removed."""
    text = write_docs(tmp_path / "big.txt", pydoc_documents(), repeat=4)
    out = tmp_path / "out" / "set"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainmaster",
            "data",
            "prepare",
            str(text),
            "--output",
            str(out),
            "--vocab",
            str(pydoc_vocab),
            "--workers",
            workers,
            "--shards",
            "16",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        preexec_fn=sigint_default,
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # wait for the stage to begin (bounded by the run itself)
        seen.append(line)
        if line.startswith(f"prepare: {stage}"):
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.stderr.read()
    rc = proc.wait(timeout=60)
    assert any(line.startswith(f"prepare: {stage}") for line in seen), seen
    assert rc == 130, (rc, rest)
    assert "interrupted" in rest and "Traceback" not in rest
    assert not out.exists() or not any(out.iterdir())
