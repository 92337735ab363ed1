"""Validators for the plan's files: the published schemas (../shared/schemas), the Kubernetes
OpenAPI schema (kubernetes-validate, strict) and cfn-lint. No cluster or AWS account needed."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

SCHEMAS = Path(__file__).resolve().parents[2].parent / "shared" / "schemas"


def _strict(schema: Any) -> Any:
    """A CRD's structural schema as the API server applies it with fieldValidation=Strict."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def eksctl_validator() -> jsonschema.Draft7Validator:
    schema = json.loads((SCHEMAS / "eksctl" / "clusterconfig.schema.json").read_text())
    return jsonschema.Draft7Validator(schema)


@functools.cache
def queue_validator() -> jsonschema.Draft7Validator:
    crd = yaml.safe_load((SCHEMAS / "volcano" / "scheduling.volcano.sh_queues.yaml").read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1beta1")
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def errors_of(validator: jsonschema.Draft7Validator, obj: Any) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}"
            for e in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))]


def validate_eksctl(obj: dict[str, Any]) -> None:
    errors = errors_of(eksctl_validator(), obj)
    assert not errors, "\n".join(errors)


def validate_queue(obj: dict[str, Any]) -> None:
    errors = errors_of(queue_validator(), obj)
    assert not errors, "\n".join(errors)


def validate_k8s(obj: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(copy.deepcopy(obj), version, strict=True)


def cfn_lint(text: str, region: str) -> list[str]:
    """cfn-lint's findings (errors and warnings) for a template."""
    from cfnlint.api import ManualArgs, lint

    matches = lint(text, config=ManualArgs(regions=[region]))
    return [f"{m.rule.id} {m.message} (line {m.linenumber})" for m in matches]
