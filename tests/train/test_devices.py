"""The native device path: one table of per-device choices; cpu end to end, cuda and neuron
checked as data (issue 27)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from trainmaster.train import devices
from trainmaster.train.device import Runtime, resolve_kind
from trainmaster.train.preflight import Env

# Checkpoint writing and device choices use torch's newer and private APIs: run on every
# stack (the trn1 stack too, `make stacks`).
pytestmark = pytest.mark.stacks


def test_one_row_per_kind() -> None:
    assert set(devices.TABLE) == {"cpu", "cuda", "neuron", "xla"}
    cuda = devices.options_for("cuda", bf16=True)
    assert cuda.autocast_bf16 and cuda.adamw == "fused" and cuda.compile_backend == "inductor"
    assert cuda.pin_memory and cuda.non_blocking and cuda.tf32
    neuron = devices.options_for("neuron", bf16=True)
    assert neuron.autocast_bf16 and neuron.compile_backend == "neuron"
    assert neuron.adamw == "foreach" and not neuron.pin_memory and not neuron.tf32
    assert neuron.compile_cache == "inductor"  # TorchDynamo's caches
    xla = devices.options_for("xla", bf16=True)
    assert not xla.autocast_bf16 and xla.compile_backend is None and xla.compile_cache == "neuron"
    assert not devices.options_for("cpu", bf16=False).autocast_bf16


def test_backends_come_from_torch() -> None:
    assert devices.dist_backend("cpu") == "gloo"
    assert devices.dist_backend("cuda") == "nccl"
    assert devices.dist_backend("xla") == "xla"


def test_cpu_runs_the_native_path() -> None:
    rt = Runtime(Env(rank=0, local_rank=0, world_size=1, local_world_size=1), "cpu", bf16=True)
    assert rt.device == torch.device("cpu") and rt.options == devices.options_for("cpu", bf16=True)
    with rt.autocast():
        out = torch.nn.Linear(4, 4)(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16


def test_neuron_without_torchneuron_is_refused() -> None:
    from trainmaster.errors import UserError

    with pytest.raises(UserError, match="torch has no neuron device"):
        resolve_kind("neuron")


def test_a_device_registered_as_neuron_is_found() -> None:
    """TorchNeuron names PyTorch's PrivateUse1 backend "neuron"; a renamed PrivateUse1 device
    is what resolve_kind and the autocast/compile choices see (in a fresh interpreter)."""
    code = (
        "import torch; torch.utils.rename_privateuse1_backend('neuron');"
        "from trainmaster.train.device import resolve_kind;"
        "from trainmaster.train.devices import options_for;"
        "print(resolve_kind('neuron'), options_for('neuron', bf16=True).compile_backend)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["neuron", "neuron"]


def test_the_private_privateuse1_name_is_guarded(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch._C._get_privateuse1_backend_name (private): read where it exists (no "neuron"
    device here), and a torch without it is taken as having no such device, not an error."""
    from trainmaster.train import device

    assert device._registered("neuron") is False
    monkeypatch.delattr(torch._C, "_get_privateuse1_backend_name")
    assert device._registered("neuron") is False


def test_the_compilers_private_counters_are_guarded(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch._dynamo.utils.counters (private): read on this torch, and a torch without it
    gives no counts (no proof either way) instead of an error."""
    from trainmaster.compile import counters

    now = counters.snapshot()
    assert set(now) == {k for keys in counters.KEYS.values() for k in keys}
    assert all(isinstance(v, int) and v >= 0 for v in now.values())
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils", None)  # import fails
    assert counters.snapshot() == {}
