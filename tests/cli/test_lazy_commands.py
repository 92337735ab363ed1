"""The CLI imports only the module of the command it runs (cli/app.py COMMANDS): `launch` starts
its job without rich, yaml or the other commands' imports, and the root's --help still lists
every command."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainmaster.cli import app

ROOT = Path(__file__).resolve().parents[2]


def loaded_after(args: list[str]) -> list[str]:
    """The modules a fresh interpreter holds after main(args)."""
    code = (
        "import json, sys\nfrom trainmaster.cli.app import main\n"
        f"code = main({args!r})\n"
        "print(json.dumps([code, sorted(sys.modules)]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    code_, modules = json.loads(out.stdout.strip().splitlines()[-1])
    assert code_ == 0, out.stderr
    return list(modules)


def test_launch_imports_no_other_command(tmp_path: Path) -> None:
    args = ["--storage", str(tmp_path), "launch", "bench/ddp_script.py", "--nnodes", "2"]
    modules = loaded_after([*args, "--dry-run"])
    assert [m for m in modules if m.startswith("trainmaster.cli.")] == [
        "trainmaster.cli.app",
        "trainmaster.cli.job_cmd",
        "trainmaster.cli.options",
    ]
    assert not {m.split(".")[0] for m in modules} & {"rich", "yaml", "torch"}
    # ...and the check can fail: `status` prints with rich
    status = loaded_after(["--storage", str(tmp_path), "list"])
    assert "trainmaster.cli.show" in status and "rich" in status


def test_the_root_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert app.main(["--help"]) == 0
    shown = capsys.readouterr().out
    listed = [w for w in re.findall(r"^│ (\S+) ", shown, re.M) if not w.startswith("-")]
    assert sorted(listed) == sorted(name for name, *_ in app.COMMANDS)  # typer: groups last
    every = app.full()
    assert len(every.registered_commands) + len(every.registered_groups) == len(app.COMMANDS)


@pytest.mark.parametrize(
    ("args", "command"),
    [
        (["--storage", "/x", "launch", "a.py", "--", "--lr", "1"], "launch"),
        (["--storage=/x", "--debug", "status", "j"], "status"),
        (["--backend", "local", "cancel", "--grace", "1", "j"], "cancel"),
        (["--help", "launch"], None),  # the root's help: every command
        (["--version"], None),
        (["lunch", "a.py"], None),  # unknown: click's "No such command ... Did you mean"
        ([], None),
    ],
)
def test_the_command_of_an_invocation(args: list[str], command: str | None) -> None:
    assert app.command_of(app.hoist_global_options(args)) == command
