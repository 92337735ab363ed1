"""Kubernetes object-name rules (k8s.io/apimachinery/pkg/util/validation), in one place.

The job file (config/job.py), the cluster plan (cluster/spec.py) and the Kubernetes backend all
check names against them before anything reaches an API server. Standard library only.
"""

from __future__ import annotations

import re

LABEL_MAX = 63  # DNS-1123 label, label values, pod host names
SUBDOMAIN_MAX = 253

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def is_dns1123_label(name: str) -> bool:
    return len(name) <= LABEL_MAX and _DNS1123_LABEL.match(name) is not None


def is_dns1123_subdomain(name: str) -> bool:
    return len(name) <= SUBDOMAIN_MAX and _DNS1123_SUBDOMAIN.match(name) is not None


def is_dns1035_label(name: str) -> bool:
    """Service names: a DNS-1123 label that starts with a letter."""
    return len(name) <= LABEL_MAX and _DNS1035_LABEL.match(name) is not None


def is_qualified_name(name: str) -> bool:
    """Label keys: an optional DNS subdomain prefix and '/', then a name of <= 63 characters."""
    parts = name.split("/")
    if len(parts) > 2 or (len(parts) == 2 and not is_dns1123_subdomain(parts[0])):
        return False
    rest = parts[-1]
    return len(rest) <= LABEL_MAX and _QUALIFIED.match(rest) is not None


def is_label_value(value: str) -> bool:
    return len(value) <= LABEL_MAX and _LABEL_VALUE.match(value) is not None
