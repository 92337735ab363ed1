"""The published schemas trainmaster validates against, shipped inside the package.

`launch --dry-run` checks the Volcano Job it prints against Volcano's own CRD, so that a user
learns about a bad field before submitting (and without a cluster); the tests use the same
validators for every generated manifest and the eksctl ClusterConfig. Source and version of
each file: README.md beside this module.

jsonschema and yaml are imported on first use: `trainmaster --help` stays fast.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import TYPE_CHECKING, Any

from trainmaster.errors import UserError

if TYPE_CHECKING:
    import jsonschema

VOLCANO_JOB = ("volcano/batch.volcano.sh_jobs.yaml", "v1alpha1")
VOLCANO_QUEUE = ("volcano/scheduling.volcano.sh_queues.yaml", "v1beta1")
EKSCTL = "eksctl/clusterconfig.schema.json"
# (apiVersion, kind) -> the CRD file and served version that validates it.
CRDS: dict[tuple[str, str], tuple[str, str]] = {
    ("batch.volcano.sh/v1alpha1", "Job"): VOLCANO_JOB,
    ("scheduling.volcano.sh/v1beta1", "Queue"): VOLCANO_QUEUE,
}


def read_text(relative: str) -> str:
    """A schema file's text (from the installed package, wherever it lives)."""
    return resources.files(__name__).joinpath(relative).read_text(encoding="utf-8")


def strict(schema: Any) -> Any:
    """A CRD's structural schema as the API server applies it with fieldValidation=Strict: an
    unknown field is an error (the CRDs themselves do not say additionalProperties: false)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@functools.cache
def crd_validator(relative: str, version: str) -> jsonschema.Draft7Validator:
    """The strict validator of one served version of a shipped CRD."""
    import jsonschema
    import yaml

    crd = yaml.safe_load(read_text(relative))
    served = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    return jsonschema.Draft7Validator(strict(served["schema"]["openAPIV3Schema"]))


@functools.cache
def eksctl_validator() -> jsonschema.Draft7Validator:
    import jsonschema

    return jsonschema.Draft7Validator(json.loads(read_text(EKSCTL)))


def errors_of(validator: jsonschema.Draft7Validator, obj: Any) -> list[str]:
    """Every violation as `path: message`, in document order."""
    return [
        f"{_path(list(e.absolute_path))}: {e.message}"
        for e in sorted(validator.iter_errors(obj), key=lambda e: [str(p) for p in e.absolute_path])
    ]


def _path(parts: list[str | int]) -> str:
    """["spec", "tasks", 0, "name"] -> spec.tasks[0].name (how kubectl names a field)."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(object)"


def check_objects(objects: list[dict[str, Any]]) -> None:
    """Validate every object of a kind with a shipped CRD; UserError (one line) on the first bad
    one, naming the object and the field. Core kinds (ConfigMap, ...) are left to the server."""
    for obj in objects:
        key = (str(obj.get("apiVersion")), str(obj.get("kind")))
        if key not in CRDS:
            continue
        errors = errors_of(crd_validator(*CRDS[key]), obj)
        if errors:
            name = obj.get("metadata", {}).get("name", "?")
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            first = " ".join(errors[0].split())  # one line, whatever the value held
            first = first if len(first) <= 240 else first[:237] + "..."
            raise UserError(
                f"{key[1]} {name} does not match the Volcano CRD: {first}{more}; "
                "check the [kubernetes] section",
                where="launch --dry-run",
            )
