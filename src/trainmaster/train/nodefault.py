"""Is it this node? The mark a restart must avoid (docs/architecture.md, node loss), and the
device probe that decides it after a hang.

A hang fires every rank's watchdog: the rank whose device stopped and the ranks waiting for
its gradients all sit in the same collective, so the stack dump alone cannot name the culprit,
and marking every node of the gang would leave the job nowhere to go. What can tell them
apart is the device itself: a fresh process on this node asks it for one 512x512 matmul and
compares it with float64 on the CPU. A device that answers correctly is not the cause (the
rank was waiting for a peer): no mark. One that fails, or does not answer in PROBE_TIMEOUT_S
(a wedged GPU hangs its next process too), marks the node `hang-device` before the worker
exits, so the restarted gang is placed elsewhere.

Neuron cores belong to one process at a time (the hung trainer still holds them), so on trn
the probe checks what the preflight's `neuron` check checks: the /dev/neuronN devices are
still there (a device the driver dropped is gone from /dev).

    python -m trainmaster.train.nodefault DEVICE      # the probe; exit 0 and "ok", or 1 and why

DEVICE is torch's name (cpu, cuda:3, xla:0) or auto:LOCAL_RANK for a custom script, whose
device the net does not know.

Light imports: the watchdog thread calls this from a process that may be a user's script.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

PROBE_TIMEOUT_S = 60.0
MATMUL_N = 512
MATMUL_RTOL = 1e-3  # fp32 over 512 terms is far inside this; a bad device is not
HANG_REASON = "hang-device"
PROBE_HANG_ENV = "TRAINMASTER_FAULT_PROBE_HANG"  # test hook: the probe never answers


def mark_node(reason: str, detail: str, environ: Mapping[str, str] = os.environ) -> None:
    """On Kubernetes, before the pod fails: taint this node so that the restarted gang avoids
    it, and leave the termination message (backends/kubernetes/nodemark.py; who may: cluster/
    nodeguard.py). A separate process: the trainer never imports the operator side. Bounded,
    and its failure only costs the mark."""
    if not environ.get("KUBERNETES_SERVICE_HOST"):
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            [sys.executable, "-m", "trainmaster.backends.kubernetes.nodemark", reason, detail],
            timeout=30,
            check=False,
        )


def probe_device(device: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why DEVICE failed its probe, or None when it answered correctly."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "trainmaster.train.nodefault", device],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"{device} did not answer a probe in {timeout:g} s"
    if done.returncode == 0:
        return None
    lines = (done.stdout + done.stderr).strip().splitlines() or [f"exit {done.returncode}"]
    return f"{device} failed a probe: {lines[-1][:200]}"


def hang_action(
    device: str,
    environ: Mapping[str, str] = os.environ,
    probe: Callable[[str], str | None] = probe_device,
    mark: Callable[[str, str], None] = mark_node,
) -> Callable[[str], None]:
    """The watchdog's on_hang: probe this rank's device and mark the node only if it failed.
    Off Kubernetes there is nothing to mark, so nothing is probed."""

    def act(what: str) -> None:
        if not environ.get("KUBERNETES_SERVICE_HOST"):
            return
        why = probe(device)
        if why is not None:
            print(f"trainmaster: {why}: marking this node ({HANG_REASON})", flush=True)
            mark(HANG_REASON, f"{what}; {why}")

    return act


def matmul_case() -> tuple[Any, Any, Any]:
    """The preflight's and the probe's one check: two seeded fp32 matrices and their float64
    product (torch tensors; torch is imported here, not by this module)."""
    import torch

    gen = torch.Generator().manual_seed(1234)
    a = torch.randn(MATMUL_N, MATMUL_N, generator=gen)
    b = torch.randn(MATMUL_N, MATMUL_N, generator=gen)
    return a, b, a.double() @ b.double()


def _probe(device: str) -> str | None:
    """In the probe process: None when DEVICE computes a matmul right."""
    if os.environ.get(PROBE_HANG_ENV):
        import signal

        signal.pause()  # a wedged device: the caller's timeout ends this process
    import torch

    kind, _, index = device.partition(":")
    if kind == "auto":  # a custom script's train.device: what it would have found
        neuron = any(Path("/dev").glob("neuron[0-9]*"))
        kind = "cuda" if torch.cuda.is_available() else "xla" if neuron else "cpu"
        device = f"cuda:{index or 0}" if kind == "cuda" else kind
    if kind in ("xla", "neuron"):
        found = len(list(Path("/dev").glob("neuron[0-9]*")))
        return None if found else "no /dev/neuronN device left"

    a, b, want = matmul_case()
    try:
        got = (a.to(device) @ b.to(device)).to("cpu").double()
    except (RuntimeError, AssertionError) as e:  # no such device, or its driver refuses
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    err = float((got - want).abs().max() / want.abs().max())
    return None if err <= MATMUL_RTOL else f"relative error {err:.1e} (limit {MATMUL_RTOL:g})"


if __name__ == "__main__":
    failed = _probe(sys.argv[1])
    print(failed or "ok", flush=True)
    sys.exit(1 if failed else 0)
