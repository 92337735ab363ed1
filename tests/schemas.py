"""Validation against the published schemas shipped in the package (trainmaster/schemas, with
their source and version in its README) and the Kubernetes OpenAPI schema (kubernetes-validate,
strict), shared by the k8s and cluster tests. No cluster needed, nothing outside the repository."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate

from trainmaster.schemas import crd_validator, errors_of

__all__ = ["K8S_VERSION", "assert_valid", "crd_validator", "errors_of", "validate_k8s"]

K8S_VERSION = "1.33"


def assert_valid(validator: jsonschema.Draft7Validator, obj: Any) -> None:
    errors = errors_of(validator, obj)
    assert not errors, "\n".join(errors)


def validate_k8s(obj: dict[str, Any], version: str = K8S_VERSION) -> None:
    kubernetes_validate.validate(copy.deepcopy(obj), version, strict=True)
