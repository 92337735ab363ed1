"""The instance catalog: the facts other builders rely on."""

from __future__ import annotations

import pytest

from trainmaster import catalog
from trainmaster.errors import ConfigError


def test_tutorial_node_types() -> None:
    trn1 = catalog.get("trn1.32xlarge")
    assert (trn1.devices, trn1.max_workers, trn1.efa_interfaces) == (16, 32, 8)
    assert catalog.get("trn1n.32xlarge").efa_interfaces == 16
    assert trn1.device_resource == catalog.NEURON and trn1.device_kind == "xla"
    # 3,040 TF over 32 NeuronCores: the per-worker peak the MFU of Neuron's benchmarks uses.
    assert trn1.peak_tflops_per_worker == pytest.approx(95.0)


def test_gpu_and_cpu_types() -> None:
    p5 = catalog.get("p5.48xlarge")
    assert (p5.device_resource, p5.max_workers, p5.device_kind) == (catalog.NVIDIA_GPU, 8, "cuda")
    cpu = catalog.get("cpu")
    assert cpu.device_resource is None and cpu.max_workers == cpu.vcpu


def test_every_type_is_complete() -> None:
    expected = {
        "trn1.2xlarge",
        "trn1.32xlarge",
        "trn1n.32xlarge",
        "trn2.48xlarge",
        "p4d.24xlarge",
        "p5.48xlarge",
        "p5e.48xlarge",
        "cpu",
    }
    assert set(catalog.CATALOG) == expected
    for t in catalog.CATALOG.values():
        assert t.vcpu > 0 and t.memory_gib > 0 and t.price_per_hour > 0 and t.default_workers > 0
        assert t.default_workers <= t.max_workers


def test_unknown_type_names_the_field() -> None:
    with pytest.raises(
        ConfigError, match=r"^kubernetes\.instance_type: unknown instance type 'trn9'"
    ):
        catalog.get("trn9", where="kubernetes.instance_type")
