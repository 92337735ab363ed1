"""Validation of built objects against the published schemas (no cluster needed).

- The Volcano Job against its CRD's openAPIV3Schema (../shared/schemas/volcano), made strict
  the way the API server treats a structural schema with fieldValidation=Strict: an unknown
  field is an error (the CRD itself does not say additionalProperties: false).
- Pod templates, pods and ConfigMaps against the Kubernetes OpenAPI schema, strict mode
  (kubernetes-validate), for a recent Kubernetes version.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

SCHEMAS = Path(__file__).resolve().parents[2].parent / "shared" / "schemas"
K8S_VERSION = "1.33"


def _strict(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def volcano_job_validator() -> jsonschema.Draft7Validator:
    crd = yaml.safe_load((SCHEMAS / "volcano" / "batch.volcano.sh_jobs.yaml").read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def validate_volcano_job(job: dict[str, Any]) -> None:
    errors = sorted(volcano_job_validator().iter_errors(job), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def validate_k8s(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(copy.deepcopy(obj), K8S_VERSION, strict=True)


def validate_pod_templates(job: dict[str, Any]) -> None:
    for task in job["spec"]["tasks"]:
        validate_k8s({"apiVersion": "v1", "kind": "PodTemplate",
                      "metadata": {"name": task["name"], "namespace": job["metadata"]["namespace"]},
                      "template": task["template"]})
