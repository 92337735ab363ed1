"""Fixtures of the cluster tests: job configs, a fake AWS (moto), the CLI, fake tools on PATH."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainmaster.cluster import spec as _spec
from trainmaster.config import JobConfig, jobfile

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TRN1_ZONES = '["us-west-2d", "us-west-2b"]'
TRN2_ZONES = '["us-east-2a", "us-east-2b"]'
P5_ZONES = '["us-east-1a", "us-east-1b"]'
FAKE_TOOLS = ("aws", "eksctl", "kubectl", "helm", "docker", "trainmaster")

# `trainmaster ...` run by the interpreter of the tests (the same main() the entry point calls).
_MAIN = """
import sys
from trainmaster.cli.app import main
raise SystemExit(main(sys.argv[1:]))
"""


def trn1_config(*overrides: str) -> JobConfig:
    return jobfile.preset("trn1-bert-large", [f"cluster.zones={TRN1_ZONES}", *overrides])


def trn2_config(*overrides: str) -> JobConfig:
    return jobfile.preset("trn2-bert-large", [f"cluster.zones={TRN2_ZONES}", *overrides])


def p5_config(*overrides: str) -> JobConfig:
    return jobfile.preset("p5-bert-large", [f"cluster.zones={P5_ZONES}", *overrides])


def tm(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    stdin: str | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", _MAIN, *args],
        cwd=cwd,
        env=full,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


MOTO_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-west-2",
    "MOTO_EC2_LOAD_DEFAULT_AMIS": "false",
}


def _moto(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """moto's in-process AWS, with fake credentials that nothing real would accept."""
    import boto3
    from moto import mock_aws

    for key, value in MOTO_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # credentials are read per session
    mock = mock_aws()
    mock.start()
    mock.reset()  # nested in the shared mock, a new one would otherwise keep its data
    try:
        yield
    finally:
        mock.stop()


def tm_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`trainmaster ARGS` in this process (the same main() and error handling, no start-up cost)."""
    from trainmaster.cli.app import main

    capsys.readouterr()
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fresh moto account per test (for tests that create resources)."""
    yield from _moto(monkeypatch)


@pytest.fixture(scope="module")
def _shared_moto() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        yield from _moto(monkeypatch)


@pytest.fixture
def aws_read_only(_shared_moto: None) -> None:
    """One moto account shared by a module's tests that only read (zone look-ups): its EC2 data
    loads once per module, and the mock ends with the module (it patches requests too)."""


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    import boto3

    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)


@pytest.fixture
def fake_tools(tmp_path: Path) -> dict[str, str]:
    """aws, eksctl, kubectl, helm and docker as one bash fake (fake_tools.sh) first on PATH.

    It logs every call to FAKE_LOG, keeps what was created as marker files in FAKE_DIR, and
    answers describe/get calls from them; FAKE_FAIL makes the first call containing it fail.
    """
    bin_dir, state = tmp_path / "fakebin", tmp_path / "fakestate"
    bin_dir.mkdir()
    state.mkdir()
    script = (HERE / "fake_tools.sh").read_text()
    for tool in FAKE_TOOLS:
        path = bin_dir / tool
        path.write_text(script)
        path.chmod(0o755)
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_DIR": str(state),
        "FAKE_LOG": str(tmp_path / "calls.log"),
        "TRAINMASTER_SRC": str(ROOT),
    }


@pytest.fixture(autouse=True)
def _caller_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """`cluster plan` opens the API endpoint to this machine's address, looked up on the network
    (spec.caller_cidr, kept as REAL_CALLER_CIDR); tests use a documentation address instead."""
    monkeypatch.setattr(_spec, "caller_cidr", lambda: "203.0.113.7/32")


REAL_CALLER_CIDR = _spec.caller_cidr
