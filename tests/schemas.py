"""Validation against the published schemas (../shared/schemas) and the Kubernetes OpenAPI
schema (kubernetes-validate, strict), shared by the k8s and cluster tests. No cluster needed."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

SCHEMAS = Path(__file__).resolve().parents[1].parent / "shared" / "schemas"
K8S_VERSION = "1.33"


def _strict(schema: Any) -> Any:
    """A CRD's structural schema as the API server applies it with fieldValidation=Strict: an
    unknown field is an error (the CRDs themselves do not say additionalProperties: false)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def crd_validator(relative: str, version: str) -> jsonschema.Draft7Validator:
    """The strict validator of one version of a CRD under ../shared/schemas."""
    crd = yaml.safe_load((SCHEMAS / relative).read_text())
    served = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    return jsonschema.Draft7Validator(_strict(served["schema"]["openAPIV3Schema"]))


def errors_of(validator: jsonschema.Draft7Validator, obj: Any) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}"
            for e in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))]


def assert_valid(validator: jsonschema.Draft7Validator, obj: Any) -> None:
    errors = errors_of(validator, obj)
    assert not errors, "\n".join(errors)


def validate_k8s(obj: dict[str, Any], version: str = K8S_VERSION) -> None:
    kubernetes_validate.validate(copy.deepcopy(obj), version, strict=True)
