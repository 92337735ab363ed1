"""No constructor in train/ starts a process or thread, installs a signal handler or writes a
file: those live in explicit start()/open()/install() methods with their undoing
close(), so that an object can be made, inspected and thrown away without leaving a writer
process, a SIGTERM handler or a half-written metrics log behind.

Two ways to hold it: every `__init__` of train/ read for calls that do one of those things (and
the methods of its class it calls), and the trainer's own start-up run for real under a
tripwire: building and constructing its setup does none of them, start() does all of them and
close() undoes them.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import trainmaster.train
from tests.train.helpers import make_job
from trainmaster.run import goodput
from trainmaster.storage import RunPaths
from trainmaster.train import metrics, preflight, trainsetup

TRAIN = Path(trainmaster.train.__file__).parent

# The last name of a call that starts a process or thread, installs a handler or writes a file.
SIDE_EFFECTS = {
    # processes and threads
    "Popen", "Process", "fork", "spawn", "system", "start", "submit", "start_new_thread",
    # signal handlers, exit hooks
    "signal", "install", "setitimer", "register", "enable",
    # files and folders
    "open", "write", "write_text", "write_bytes", "mkdir", "makedirs", "touch", "truncate",
    "truncate_after", "rename", "unlink", "rmtree", "record", "write_json", "write_rank0",
    "SummaryWriter", "_summary_writer", "memfd_create", "ftruncate",
}  # fmt: skip


def _called(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Name):
            return f.id
        if isinstance(f, ast.Attribute):
            return f.attr
    return None


def _self_method(node: ast.AST) -> str | None:
    """`self.NAME(...)`: a method of the same class, read as part of the constructor."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        owner = node.func.value
        if isinstance(owner, ast.Name) and owner.id == "self":
            return node.func.attr
    return None


def constructor_side_effects(source: str) -> dict[str, list[str]]:
    """class name -> the side-effecting calls its __init__ makes (with the methods it calls)."""
    found: dict[str, list[str]] = {}
    for cls in ast.walk(ast.parse(source)):
        if not isinstance(cls, ast.ClassDef):
            continue
        methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
        todo, seen, calls = ["__init__"], set(), []
        while todo:
            name = todo.pop()
            if name in seen or name not in methods:
                continue
            seen.add(name)
            for node in ast.walk(methods[name]):
                callee = _called(node)
                if callee in SIDE_EFFECTS:
                    calls.append(f"{name}: {callee}() line {node.lineno}")  # type: ignore[attr-defined]
                own = _self_method(node)
                if own is not None:
                    todo.append(own)
        if calls:
            found[cls.name] = calls
    return found


def test_the_reader_sees_what_a_constructor_must_not_do() -> None:
    bad = """
class Setup:
    def __init__(self, writer):
        self.writer = writer
        self._go()

    def _go(self):
        self.writer.start()
        signal.signal(15, print)
        self.f = open("metrics.jsonl", "a")

class Fine:
    def __init__(self):
        self.thread = threading.Thread(target=print)

    def start(self):
        self.thread.start()
"""
    assert constructor_side_effects(bad) == {
        "Setup": ["_go: start() line 8", "_go: signal() line 9", "_go: open() line 10"]
    }


def test_no_constructor_in_train_starts_installs_or_writes() -> None:
    found = {
        f"{path.relative_to(TRAIN)}:{cls}": calls
        for path in sorted(TRAIN.rglob("*.py"))
        for cls, calls in constructor_side_effects(path.read_text(encoding="utf-8")).items()
    }
    assert found == {}, (
        f"constructors with side effects (move them to a start/open method): {found}"
    )


class Tripwire(Exception):
    pass


WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class Wire:
    """Inside on(), any new process or thread, signal handler, file opened for writing or
    folder made raises Tripwire and is recorded in `tripped`."""

    def __init__(self) -> None:
        self.armed = False
        self.tripped: list[str] = []

    @contextlib.contextmanager
    def on(self) -> Iterator[list[str]]:
        self.armed = True
        try:
            yield self.tripped
        finally:
            self.armed = False

    def trip(self, what: str) -> None:
        if self.armed:
            self.tripped.append(what)
            raise Tripwire(what)


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> Wire:
    w = Wire()

    def guard(owner: Any, name: str, why: Any) -> None:
        real = getattr(owner, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            what = why(*args, **kwargs)
            if what:
                w.trip(f"{name}: {what}")
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapped)

    guard(subprocess, "Popen", lambda *a, **k: str(a[0] if a else k.get("args")))
    guard(threading.Thread, "start", lambda self: self.name)
    guard(signal, "signal", lambda sig, handler: str(sig))
    for owner in (builtins, io):
        guard(owner, "open", lambda f, mode="r", *a, **k: f"{f} {mode}" if set(mode) - {"r", "b", "t"} else None)  # fmt: skip
    guard(os, "open", lambda path, flags, *a, **k: str(path) if flags & WRITES else None)
    guard(os, "mkdir", lambda path, *a, **k: str(path))
    return w


def test_the_wire_trips_on_a_thread_a_handler_a_write_and_a_process(
    wire: Wire, tmp_path: Path
) -> None:
    acts = [
        threading.Thread(target=print).start,
        lambda: signal.signal(signal.SIGUSR2, signal.getsignal(signal.SIGUSR2)),
        lambda: (tmp_path / "x").write_text(""),
        lambda: (tmp_path / "d").mkdir(),
        lambda: subprocess.Popen(["true"]),
    ]
    with wire.on():
        (tmp_path / "vocab.txt").exists()  # reading is allowed
        for act in acts:
            with pytest.raises(Tripwire):
                act()
    assert len(wire.tripped) == len(acts) and not (tmp_path / "x").exists()


@pytest.mark.slow  # the writer process starts (a Python with torch)
def test_the_trainer_setup_is_built_without_side_effects_then_started_and_closed(
    pydoc_storage: Path, wire: Wire
) -> None:
    job = make_job(pydoc_storage, "pure-setup", nproc=1)  # the node preflight too
    plan = preflight.make_plan(job, str(pydoc_storage), environ={})
    with wire.on() as tripped:
        setup = trainsetup.build(plan, 0.0)  # model, optimizer, data: read, nothing started
    assert tripped == []
    before = signal.getsignal(signal.SIGTERM)
    with setup:
        assert signal.getsignal(signal.SIGTERM) == setup.preempt._on_signal
        assert setup.writer is not None and setup.writer.pid is not None
        pid = setup.writer.pid
        assert Path(f"/proc/{pid}").exists()
        assert setup.metrics is not None and plan.run.metrics.exists()
        assert [e.KIND for e in goodput.read(plan.run.timeline)] == ["start"]
        assert any(t.name == "hang-watchdog-0" for t in threading.enumerate())
    assert signal.getsignal(signal.SIGTERM) == before
    assert setup.writer.pid is None and not Path(f"/proc/{pid}").exists()  # ended and reaped
    setup.loader.close()


@pytest.mark.slow  # the writer process starts (a Python with torch)
def test_a_failed_start_leaves_no_writer_or_handler(
    pydoc_storage: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = make_job(pydoc_storage, "failed-start", "train.preflight=false", nproc=1)
    setup = trainsetup.build(preflight.make_plan(job, str(pydoc_storage), environ={}), 0.0)
    before = signal.getsignal(signal.SIGTERM)
    pids: list[int | None] = []

    def no_disk(*args: Any, **kwargs: Any) -> None:
        pids.append(setup.writer.pid if setup.writer is not None else None)
        raise OSError("disk full")

    monkeypatch.setattr(trainsetup, "write_rank0", no_disk)
    with pytest.raises(OSError, match="disk full"), setup:
        pass
    assert pids and pids[0] is not None  # the writer had started ...
    assert not Path(f"/proc/{pids[0]}").exists()  # ... and was ended and reaped
    assert signal.getsignal(signal.SIGTERM) == before
    setup.loader.close()


def test_the_metrics_log_writes_only_once_opened(tmp_path: Path, wire: Wire) -> None:
    run = RunPaths(tmp_path / "run")
    run.dir.mkdir()
    with wire.on() as tripped:
        log = metrics.MetricsLog(run, start_step=0, started=0.0, flops_per_seq=1.0,
                                 peak_tflops=0.0, world=1, global_batch=4, seq_len=8)  # fmt: skip
    assert tripped == [] and not run.metrics.exists()
    log.open()
    log.step(step=1, loss=1.0, mlm_loss=1.0, nsp_loss=0.0, lr=1e-4, grad_norm=1.0, step_s=1.0)
    log.close()
    log.close()  # twice: the loop's end, then the setup's
    assert [r["step"] for r in map(json.loads, run.metrics.read_text().splitlines())] == [1]
