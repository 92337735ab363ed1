"""Validators for the plan's files: the published schemas (shipped in trainmaster/schemas), the
Kubernetes OpenAPI schema (kubernetes-validate, strict) and cfn-lint. No cluster or AWS account
needed."""

from __future__ import annotations

from typing import Any

import jsonschema

from tests.schemas import assert_valid, crd_validator, errors_of, validate_k8s
from trainmaster.schemas import VOLCANO_QUEUE, eksctl_validator

__all__ = [
    "cfn_lint",
    "eksctl_validator",
    "errors_of",
    "queue_validator",
    "validate_eksctl",
    "validate_k8s",
    "validate_queue",
]


def validate_eksctl(obj: dict[str, Any]) -> None:
    assert_valid(eksctl_validator(), obj)


def queue_validator() -> jsonschema.Draft7Validator:
    return crd_validator(*VOLCANO_QUEUE)


def validate_queue(obj: dict[str, Any]) -> None:
    assert_valid(queue_validator(), obj)


def cfn_lint(text: str, region: str) -> list[str]:
    """cfn-lint's findings (errors and warnings) for a template."""
    from cfnlint.api import ManualArgs, lint

    matches = lint(text, config=ManualArgs(regions=[region]))
    return [f"{m.rule.id} {m.message} (line {m.linenumber})" for m in matches]
