"""EKS Kubernetes versions: which ones a plan accepts, and the default.

A version is accepted while EKS supports it (standard support for 14 months after its EKS
release, then extended support for 12 more: docs.aws.amazon.com/eks/latest/userguide/
kubernetes-versions.html) and EKS publishes AL2023 Neuron and NVIDIA AMIs for it. EKS published
no AL2 accelerated AMIs after 1.32 (docs/architecture.md 5: tutorial 6.12), so AL2023 it is.
The default is the newest version in standard support.

Dates, checked 2026-12-04 and again 2026-12-06 (no source read on 2026-12-06 adds to them):
- 1.29-1.34: the release calendar of awsdocs/amazon-eks-user-guide
  latest/ug/versioning/kubernetes-versions.adoc; 1.35: endoflife.date/amazon-eks (EKS release
  2026-01-28, end of standard support 2027-03-27, of extended support 2028-03-27).
- 1.36: awslabs/amazon-eks-ami CHANGELOG publishes AL2023 x86_64 NEURON and NVIDIA AMIs for 1.36
  from release 1.36.1-20260610 (v20260610) on. Its EKS release date and support end dates were
  not readable in any source here, so they are None: accepted, in standard support, until this
  table is refreshed (tests/cluster/test_versions.py fails once CHECKED is old).
- No source seen here mentions EKS 1.37, so it is refused.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Final, Literal

from trainmaster.errors import ConfigError

Support = Literal["standard", "extended"]
_D = datetime.date
CHECKED: Final = _D(2026, 12, 6)


@dataclass(frozen=True)
class EksVersion:
    version: str
    eks_release: datetime.date | None
    end_of_standard: datetime.date | None  # None: not known yet (still in standard support)
    end_of_extended: datetime.date | None
    neuron_and_nvidia_al2023_amis: bool = True


CALENDAR: Final = (
    EksVersion("1.29", _D(2024, 1, 23), _D(2025, 3, 23), _D(2026, 3, 23)),
    EksVersion("1.30", _D(2024, 5, 23), _D(2025, 7, 23), _D(2026, 7, 23)),
    EksVersion("1.31", _D(2024, 9, 26), _D(2025, 11, 26), _D(2026, 11, 26)),
    EksVersion("1.32", _D(2025, 1, 23), _D(2026, 3, 23), _D(2027, 3, 23)),
    EksVersion("1.33", _D(2025, 5, 29), _D(2026, 7, 29), _D(2027, 7, 29)),
    EksVersion("1.34", _D(2025, 10, 2), _D(2026, 12, 2), _D(2027, 12, 2)),
    EksVersion("1.35", _D(2026, 1, 28), _D(2027, 3, 27), _D(2028, 3, 27)),
    EksVersion("1.36", None, None, None),
)
_BY_VERSION = {v.version: v for v in CALENDAR}


def support(version: str, today: datetime.date) -> Support | None:
    v = _BY_VERSION.get(version)
    if v is None or not v.neuron_and_nvidia_al2023_amis:
        return None
    if v.end_of_standard is None or today < v.end_of_standard:
        return "standard"
    if v.end_of_extended is None or today < v.end_of_extended:
        return "extended"
    return None


def supported(today: datetime.date) -> list[str]:
    return [v.version for v in CALENDAR if support(v.version, today)]


def default_version(today: datetime.date) -> str:
    """The newest version in standard support (with Neuron and NVIDIA AL2023 AMIs)."""
    return [v for v in supported(today) if support(v, today) == "standard"][-1]


def check(version: str, today: datetime.date | None = None) -> Support:
    """The version's support on `today`, or a ConfigError naming the supported range."""
    today = today or datetime.date.today()
    found = support(version, today)
    if found is None:
        ok = supported(today)
        std = [v for v in ok if support(v, today) == "standard"]
        raise ConfigError(
            f"EKS {version} is not in standard or extended support on {today} (or has no "
            f"AL2023 Neuron/NVIDIA AMIs); use {ok[0]}-{ok[-1]} (standard support: "
            f"{', '.join(std)})",
            where="cluster.kubernetes_version",
        )
    return found
