"""After a hang: the device probe (a real process) and the decision to mark the node."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch

from trainmaster.train import nodefault, watchdog
from trainmaster.train.watchdog import Watchdog

ON_K8S = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}


def test_a_device_that_answers_passes_the_probe() -> None:
    assert nodefault.probe_device("cpu") is None
    # a custom script's device: the net knows only train.device ("auto") and LOCAL_RANK
    assert nodefault.probe_device("auto:1") is None or torch.cuda.device_count() < 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without this GPU")
def test_a_device_that_is_not_there_fails_the_probe() -> None:
    why = nodefault.probe_device("cuda:0")
    assert why is not None and why.startswith("cuda:0 failed a probe: ")


def test_a_device_that_does_not_answer_fails_after_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(nodefault.PROBE_HANG_ENV, "1")
    assert nodefault.probe_device("cpu", timeout=3) == "cpu did not answer a probe in 3 s"


def test_only_a_failed_probe_on_kubernetes_marks_the_node() -> None:
    marks: list[tuple[str, str]] = []
    probed: list[str] = []

    def failing(device: str) -> str | None:
        probed.append(device)
        return f"{device} did not answer a probe in 60 s"

    nodefault.hang_action("cuda:3", ON_K8S, probe=failing, mark=lambda *m: marks.append(m))(
        "rank 3 on node 1: no step for 301 s, last in backward"
    )
    assert probed == ["cuda:3"]
    assert marks == [
        (
            "hang-device",
            "rank 3 on node 1: no step for 301 s, last in backward; "
            "cuda:3 did not answer a probe in 60 s",
        )
    ]
    # A device that answers: the rank was waiting for a peer, so this node is not marked.
    nodefault.hang_action("cuda:3", ON_K8S, probe=lambda d: None, mark=lambda *m: marks.append(m))(
        "rank 2 ..."
    )
    # Off Kubernetes there is nothing to mark, and nothing is probed.
    nodefault.hang_action("cuda:3", {}, probe=failing, mark=lambda *m: marks.append(m))("x")
    assert len(marks) == 1 and probed == ["cuda:3"]


def test_the_watchdog_asks_before_it_exits_and_exits_even_if_asking_fails(
    tmp_path: Path,
) -> None:
    events: list[str] = []
    done = threading.Event()

    def on_hang(what: str) -> None:
        events.append(f"asked: {what}")
        raise RuntimeError("the API server is gone")

    def exit_fn(code: int) -> None:
        events.append(f"exit {code}")
        done.set()

    wd = Watchdog(
        logs=tmp_path / "logs",
        hangs=tmp_path / "hangs.jsonl",
        rank=1,
        node=0,
        configured=0.2,
        exit_fn=exit_fn,
        poll_s=0.05,
        on_hang=on_hang,
    ).start()
    wd.beat(4, 0.01)
    assert done.wait(30), "the watchdog never fired"
    assert events[0].startswith("asked: rank 1 on node 0: no step for ")
    assert events[1:] == [f"exit {watchdog.EXIT_HUNG}"]
    assert os.path.exists(tmp_path / "hangs.jsonl")  # recorded before asking
