"""Validators for the plan's files: the published schemas (../shared/schemas), the Kubernetes
OpenAPI schema (kubernetes-validate, strict) and cfn-lint. No cluster or AWS account needed."""

from __future__ import annotations

import functools
import json
from typing import Any

import jsonschema

from tests.schemas import SCHEMAS, assert_valid, crd_validator, errors_of, validate_k8s

__all__ = ["cfn_lint", "errors_of", "validate_eksctl", "validate_k8s", "validate_queue"]


@functools.cache
def eksctl_validator() -> jsonschema.Draft7Validator:
    schema = json.loads((SCHEMAS / "eksctl" / "clusterconfig.schema.json").read_text())
    return jsonschema.Draft7Validator(schema)


def validate_eksctl(obj: dict[str, Any]) -> None:
    assert_valid(eksctl_validator(), obj)


def queue_validator() -> jsonschema.Draft7Validator:
    return crd_validator("volcano/scheduling.volcano.sh_queues.yaml", "v1beta1")


def validate_queue(obj: dict[str, Any]) -> None:
    assert_valid(queue_validator(), obj)


def cfn_lint(text: str, region: str) -> list[str]:
    """cfn-lint's findings (errors and warnings) for a template."""
    from cfnlint.api import ManualArgs, lint

    matches = lint(text, config=ManualArgs(regions=[region]))
    return [f"{m.rule.id} {m.message} (line {m.linenumber})" for m in matches]
