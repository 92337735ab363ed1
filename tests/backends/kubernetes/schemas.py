"""The Volcano Job against its CRD (strict, as the API server with fieldValidation=Strict) and
its pod templates, pods and ConfigMaps against the Kubernetes OpenAPI schema (strict)."""

from __future__ import annotations

from typing import Any

from tests.schemas import assert_valid, crd_validator, validate_k8s
from trainmaster.schemas import VOLCANO_JOB

__all__ = ["validate_k8s", "validate_pod_templates", "validate_volcano_job"]


def validate_volcano_job(job: dict[str, Any]) -> None:
    assert_valid(crd_validator(*VOLCANO_JOB), job)


def validate_pod_templates(job: dict[str, Any]) -> None:
    for task in job["spec"]["tasks"]:
        validate_k8s(
            {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": task["name"], "namespace": job["metadata"]["namespace"]},
                "template": task["template"],
            }
        )
