"""One Backend interface (docs/architecture.md 3.7): the CLI chooses a backend once, through
api.backend(), and every command talks to that interface; no command asks which backend it has."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, assert_user_error, run_cli
from trainmaster import api
from trainmaster.backends.base import (
    DryRun,
    JobRef,
    JobStatus,
    LogStream,
    NodeStatus,
    Phase,
    Submitted,
    parse_job,
)
from trainmaster.backends.kubernetes.backend import KubernetesBackend
from trainmaster.backends.local.backend import LocalBackend
from trainmaster.cli.app import hoist_global_options, main
from trainmaster.config import JobConfig
from trainmaster.errors import UserError

LOCAL_JOB = str(ROOT / "examples" / "local-cpu.toml")
IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/trainmaster:1"


@dataclasses.dataclass(frozen=True)
class FakeDryRun(DryRun):
    def render(self) -> str:
        FakeBackend.calls.append(("render", self.job))
        return f"fake plan of {self.job} on {self.backend}\n"


class FakeBackend:
    """Records every call; registered under both names, it proves the CLI has no other path."""

    calls: list[tuple[str, Any]] = []
    targets: list[api.Target] = []

    def __init__(self, target: api.Target, launch: api.LaunchOptions) -> None:
        self.targets.append(target)
        self.name = target.backend or "local"
        self.launch = launch

    def handle(self, job: str) -> str:
        return f"{self.name}://{job}"

    def plan(
        self, cfg: JobConfig, *, wait_lock_s: float = 0.0, precompile_steps: int | None = None
    ) -> DryRun:
        resume, image = self.launch.resume, self.launch.image
        self.calls.append(
            ("plan", (cfg.job.name, cfg.job.backend, resume, image, precompile_steps))
        )
        purpose = "train" if precompile_steps is None else "precompile"
        return FakeDryRun(cfg.job.name, cfg.job.backend, purpose, ())

    def submit(
        self,
        dry_run: DryRun,
        *,
        server_dry_run: bool = False,
        on_wait: Any = None,
        on_start: Callable[[str], None] | None = None,
        on_note: Callable[[str], None] | None = None,
    ) -> Submitted:
        self.calls.append(("submit", (dry_run.job, server_dry_run)))
        return Submitted(dry_run.job, (f"submitted {dry_run.job}",), ("a note",))

    def status(self, job: str) -> JobStatus:
        self.calls.append(("status", job))
        return JobStatus(
            job,
            self.name,
            self.handle(job),
            Phase.SUCCEEDED,
            message=f"{job} is fine",
            nodes=(NodeStatus(0, "p0", "Succeeded"),),
            step=3,
            max_steps=3,
        )

    def logs(self, job: str, *, rank: int | None, node: int | None, follow: bool) -> LogStream:
        self.calls.append(("logs", (job, rank, node, follow)))
        return LogStream("# from the fake", iter(["line 1\n", "line 2\n"]))

    def cancel(self, job: str, *, grace_s: float) -> str:
        self.calls.append(("cancel", (job, grace_s)))
        return f"{job}: cancelled by the fake"

    def list(self) -> list[JobStatus]:
        self.calls.append(("list", None))
        return [JobStatus("j1", self.name, self.handle("j1"), Phase.RUNNING)]

    def top(
        self, job: str, *, interval_s: float, say: Callable[[str], None]
    ) -> tuple[Callable[[], Any], float]:
        self.calls.append(("top", job))
        return (lambda: None), 0.0

    def tensorboard(
        self, job: str | None, *, host: str, port: int, announce: Callable[[str], None]
    ) -> None:
        self.calls.append(("tensorboard", (job, port)))
        announce("http://fake/")


@pytest.fixture
def fake_backend(monkeypatch: pytest.MonkeyPatch) -> type[FakeBackend]:
    FakeBackend.calls, FakeBackend.targets = [], []
    for name in ("local", "kubernetes"):
        monkeypatch.setitem(api.BACKENDS, name, FakeBackend)
    monkeypatch.delenv("TRAINMASTER_BACKEND", raising=False)
    return FakeBackend


@pytest.mark.parametrize("backend", ["local", "kubernetes"])
def test_dry_run_and_launch_go_through_plan_render_submit(
    backend: str, fake_backend: type[FakeBackend], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["launch", LOCAL_JOB, "--backend", backend, "--dry-run", "--image", "img"]) == 0
    assert fake_backend.calls == [
        ("plan", ("demo", backend, False, "img", None)),
        ("render", "demo"),
    ]  # each backend's factory takes its own options
    assert capsys.readouterr().out == f"fake plan of demo on {backend}\n"

    fake_backend.calls.clear()
    assert main(["launch", LOCAL_JOB, "--backend", backend, "--resume", "--follow"]) == 0
    assert fake_backend.calls == [
        ("plan", ("demo", backend, True, None, None)),
        ("submit", ("demo", False)),
        ("status", "demo"),
    ]  # --follow: status until the job ends
    out = capsys.readouterr()
    assert out.out == "submitted demo\n" and "a note" in out.err

    fake_backend.calls.clear()
    assert main(["launch", LOCAL_JOB, "--backend", backend, "--dry-run=server"]) == 0
    assert fake_backend.calls == [
        ("plan", ("demo", backend, False, None, None)),
        ("submit", ("demo", True)),
    ]


@pytest.mark.parametrize("backend", ["local", "kubernetes"])
def test_every_job_command_uses_the_interface(
    backend: str, fake_backend: type[FakeBackend], capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (
        ["status", "j"],
        ["list"],
        ["logs", "j", "--node", "1"],
        ["cancel", "j", "--grace", "3"],
        ["top", "j", "--once"],
        ["precompile", LOCAL_JOB, "--steps", "2", "--dry-run"],
    ):
        assert main([*argv, "--backend", backend]) == 0, argv
    names = [c[0] for c in fake_backend.calls]
    assert names == ["status", "list", "logs", "cancel", "top", "plan", "render"]
    assert ("logs", ("j", None, 1, False)) in fake_backend.calls
    assert ("plan", ("demo", backend, False, None, 2)) in fake_backend.calls
    out = capsys.readouterr()
    assert "j is fine" in out.out and "p0" in out.out and "line 1\nline 2\n" in out.out
    assert "j: cancelled by the fake" in out.out and "# from the fake" in out.err


def test_global_options_before_or_after_the_command(
    fake_backend: type[FakeBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    want = api.Target(
        storage="/s", backend="kubernetes", kubeconfig="/k", context="c", namespace="ns"
    )
    opts = [
        "--storage",
        "/s",
        "--backend=kubernetes",
        "--kubeconfig",
        "/k",
        "--context",
        "c",
        "--namespace",
        "ns",
    ]
    assert main([*opts, "status", "j"]) == 0
    assert main(["status", "j", *opts]) == 0
    assert fake_backend.targets == [want, want]
    fake_backend.targets.clear()
    monkeypatch.setenv(
        "TRAINMASTER_BACKEND", "kubernetes"
    )  # still read for commands without a job file
    assert api.backend_name(api.Target()) == "kubernetes"
    assert api.backend_name(api.Target(backend="local")) == "local"


def test_hoisting_leaves_everything_else_alone() -> None:
    assert hoist_global_options(["logs", "j", "-f", "--storage", "/s", "--rank", "1"]) == [
        "--storage",
        "/s",
        "logs",
        "j",
        "-f",
        "--rank",
        "1",
    ]
    assert hoist_global_options(["launch", "f", "--set", "job.name=x", "--namespace=a"]) == [
        "--namespace=a",
        "launch",
        "f",
        "--set",
        "job.name=x",
    ]
    assert hoist_global_options(["status", "--storage"]) == [
        "status",
        "--storage",
    ]  # no value: click says so
    assert hoist_global_options(["x", "--", "--storage", "/s"]) == ["x", "--", "--storage", "/s"]


def test_an_unknown_backend_is_one_line_naming_the_option() -> None:
    result = run_cli("status", "j", "--backend", "slurm")
    line = assert_user_error(result, where="--backend")
    assert line == "error: --backend: unknown backend 'slurm'; use local or kubernetes"


def test_the_real_backends_are_chosen_once_in_api() -> None:
    assert isinstance(api.backend(api.Target()), LocalBackend)
    assert isinstance(api.backend(api.Target(backend="kubernetes")), KubernetesBackend)
    cfg = api.load_job(ROOT / "examples" / "trn1-bert-large.toml")
    assert isinstance(api.backend(api.Target(), cfg), KubernetesBackend)  # job.backend of the file
    assert isinstance(api.backend(api.Target(backend="local"), cfg), LocalBackend)


def test_the_job_files_storage_is_the_backends_without_storage_option(tmp_path: Path) -> None:
    """launch --follow watches the folder the job runs in (job.storage), not the default."""
    cfg = api.load_job(LOCAL_JOB, [f'job.storage="{tmp_path}"'])
    chosen = api.backend(api.Target(), cfg)
    assert isinstance(chosen, LocalBackend) and chosen.storage == str(tmp_path)
    assert api.backend(api.Target(storage="/other"), cfg).storage == "/other"  # type: ignore[attr-defined]


def test_kubernetes_plan_renders_checked_yaml_without_a_cluster() -> None:
    cfg = api.load_job(ROOT / "examples" / "trn1-bert-large.toml")
    backend = api.backend(api.Target(kubeconfig="/nonexistent"), cfg)
    dry = api.backend(
        api.Target(kubeconfig="/nonexistent"), cfg, api.LaunchOptions(image=IMAGE)
    ).plan(cfg)
    cm, _, job = yaml.safe_load_all(dry.render())
    assert (cm["kind"], job["kind"], job["metadata"]["name"]) == (
        "ConfigMap",
        "Job",
        "bert-large-trn1",
    )
    assert dataclasses.is_dataclass(dry) and dataclasses.fields(dry)  # frozen, printable data
    with pytest.raises(dataclasses.FrozenInstanceError):
        dry.job = "other"  # type: ignore[misc]
    pre = backend.plan(cfg, precompile_steps=3)
    assert pre.job == "bert-large-trn1-precompile" and pre.purpose == "precompile"


def test_api_and_backends_never_import_the_cli() -> None:
    code = (
        "import sys, trainmaster.api, trainmaster.backends.local.backend, trainmaster.backends.kubernetes.backend; "
        "print(sorted(m for m in sys.modules if m.startswith(('trainmaster.cli', 'kubernetes'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"  # nor the kubernetes client: imported when a cluster is used


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        ("demo", JobRef("demo")),
        ("local://demo", JobRef("demo", "local")),
        ("kubernetes://team-a/bert", JobRef("bert", "kubernetes", "team-a")),
        ("kubernetes://bert", JobRef("bert", "kubernetes")),
    ],
)
def test_job_handles_parse(text: str, ref: JobRef) -> None:
    assert parse_job(text) == ref


@pytest.mark.parametrize(
    "text", ["slurm://x", "local://", "local://a/b", "kubernetes://a/b/c", "kubernetes:///x"]
)
def test_bad_handles_are_refused_naming_the_argument(text: str) -> None:
    with pytest.raises(UserError, match="JOB"):
        parse_job(text)


def test_a_handle_chooses_the_backend_and_namespace(
    fake_backend: type[FakeBackend], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "kubernetes://team-a/bert", "--json"]) == 0
    assert fake_backend.targets[-1] == api.Target(backend="kubernetes", namespace="team-a")
    assert ("status", "bert") in fake_backend.calls
    data = json.loads(capsys.readouterr().out)
    assert (data["job"], data["phase"], data["handle"]) == (
        "bert",
        "succeeded",
        "kubernetes://bert",
    )
    assert data["nodes"] == [
        {
            "index": 0,
            "name": "p0",
            "state": "Succeeded",
            "host": None,
            "pid": None,
            "exit_code": None,
            "restarts": 0,
            "rank0": False,
            "log": "",
            "reason": "",
        }
    ]
    assert main(["cancel", "local://demo"]) == 0 and fake_backend.targets[-1].backend == "local"
    assert main(["status", "local://demo", "--backend", "kubernetes"]) == 2
    assert "is a local job, but --backend says kubernetes" in capsys.readouterr().err


def test_list_json_is_a_list_of_statuses(
    fake_backend: type[FakeBackend], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["list", "--json"]) == 0
    assert [(j["job"], j["phase"]) for j in json.loads(capsys.readouterr().out)] == [
        ("j1", "running")
    ]


def test_image_is_refused_on_the_local_backend() -> None:
    result = run_cli("launch", LOCAL_JOB, "--backend", "local", "--image", "x:1", "--dry-run")
    assert_user_error(result, "the local backend", where="--image")
