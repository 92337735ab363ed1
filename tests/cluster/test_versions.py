"""The one versions table: pins with their dates, EKS support, refusals (issue 27)."""

from __future__ import annotations

import datetime

import pytest

from trainmaster import catalog
from trainmaster.cluster import eks_versions, versions
from trainmaster.compile import cache
from trainmaster.config import ClusterSection, jobfile
from trainmaster.errors import ConfigError

TODAY = datetime.date(2026, 12, 6)
# How long a check stays good: past this, the table must be checked again (a one-line change).
MAX_AGE = datetime.timedelta(days=120)


@pytest.mark.parametrize("pin", versions.PINS, ids=lambda p: p.name)
def test_no_pin_is_older_than_the_release_it_was_checked_against(pin: versions.Pin) -> None:
    assert pin.version == pin.latest or pin.held, (
        f"{pin.name} {pin.version} is older than {pin.latest}, the newest release seen on "
        f"{pin.checked} ({pin.source}): adopt it or say in `held` why not"
    )
    assert pin.checked <= datetime.date.today()


def test_the_table_is_not_stale() -> None:
    for checked in (versions.CHECKED, eks_versions.CHECKED):
        assert datetime.date.today() - checked < MAX_AGE, "check the versions table again"


def test_pin_lines_carry_the_dates() -> None:
    lines = versions.pin_lines()
    assert len(lines) == len(versions.PINS)
    frozen = next(line for line in lines if line.startswith("neuron_xla_image"))
    assert "checked 2026-12-06" in frozen and "frozen" in frozen


def test_trn1_is_on_the_last_xla_training_release() -> None:
    assert "sdk2.29.1" in versions.NEURON_BASE_IMAGE
    assert versions.NEURON_XLA_STACK["python"].startswith("3.12")
    assert "ubuntu24.04" in versions.NEURON_BASE_IMAGE
    assert " ".join(cache.NEURON_CC_OPTIONS) == versions.NEURON_CC_FLAGS


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("1.31", None),  # extended support ended 2026-11-26
        ("1.32", "extended"),
        ("1.34", "extended"),  # standard support ended 2026-12-02
        ("1.35", "standard"),
        ("1.36", "standard"),
        ("1.37", None),  # not seen in any source
    ],
)
def test_eks_support_on_the_checked_date(version: str, expected: str | None) -> None:
    assert eks_versions.support(version, TODAY) == expected


def test_default_is_the_newest_in_standard_support() -> None:
    assert eks_versions.default_version(TODAY) == "1.36"
    assert ClusterSection().kubernetes_version == eks_versions.default_version(TODAY)
    assert eks_versions.supported(TODAY) == ["1.32", "1.33", "1.34", "1.35", "1.36"]


def test_unsupported_eks_version_names_the_range() -> None:
    with pytest.raises(ConfigError) as err:
        eks_versions.check("1.31", TODAY)
    msg = str(err.value)
    assert msg.startswith("cluster.kubernetes_version: EKS 1.31 is not in standard or extended")
    assert "use 1.32-1.36 (standard support: 1.35, 1.36)" in msg and "\n" not in msg


def test_ami_parameters_per_hardware() -> None:
    assert "/1.36/amazon-linux-2023/x86_64/neuron/" in versions.ami_parameter("1.36", True)
    assert "/x86_64/nvidia/" in versions.ami_parameter("1.36", False)


@pytest.mark.parametrize(
    ("preset", "overrides", "message"),
    [
        (
            "trn1-bert-large",
            ['train.device="neuron"'],
            r"train.device: trn1.32xlarge cannot run TorchNeuron \(Neuron supports it on "
            r"Trn2/Trn3 only\)",
        ),
        ("p5-bert-large", ['train.device="neuron"'], "neuron needs a Trainium node type"),
        ("p5-bert-large", ['train.device="xla"'], "xla needs a Trainium node type"),
        ("trn2-bert-large", ['train.device="cuda"'], "cuda needs a GPU node type"),
    ],
)
def test_unsupported_device_and_node_type_refused(
    preset: str, overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        jobfile.preset(preset, overrides)


def test_supported_combinations() -> None:
    trn2 = catalog.CATALOG["trn2.48xlarge"]
    assert trn2.device_kind == "neuron" and trn2.neuron and trn2.max_workers == 64
    assert catalog.device_refusal(trn2, "xla") is None  # the 2.29.1 DLC lists trn2
    assert catalog.CATALOG["trn1.32xlarge"].device_kind == "xla"
    assert jobfile.preset("trn2-bert-large").derived.grad_accum == 16
