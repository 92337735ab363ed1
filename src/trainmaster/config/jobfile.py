"""Job files on disk: TOML loading, typed `--set` overrides, presets, and the commented writer.

Errors are turned into one ConfigError line that names the file and the field, e.g.
`job.toml: train.batch_size: must be greater than 0 (got -1)`.
"""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path
from typing import Any

import tomli_w
from pydantic import ValidationError

from trainmaster.config.job import MODEL_PRESETS, JobConfig
from trainmaster.config.presets import JOB_PRESETS
from trainmaster.errors import ConfigError


def parse_override(item: str) -> tuple[list[str], Any]:
    """`section.key=value` -> (["section", "key"], typed value).

    The value is read as a TOML value (32 -> int, 1e-4 -> float, true -> bool, ["a"] -> list,
    {k = "v"} -> table), and as a plain string when it is not valid TOML, so `--set
    kubernetes.image=repo/img:tag` needs no quotes.
    """
    key, sep, raw = item.partition("=")
    path = key.strip().split(".")
    if not sep or len(path) != 2 or not all(path):
        raise ConfigError(
            "expected section.key=value, e.g. train.batch_size=8", where=f"--set {item}"
        )
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return path, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    merged = copy.deepcopy(data)
    for item in overrides:
        (section, key), value = parse_override(item)
        if section not in JobConfig.model_fields:
            known = ", ".join(JobConfig.model_fields)
            raise ConfigError(
                f"unknown section {section!r}; sections: {known}", where=f"--set {item}"
            )
        target = merged.setdefault(section, {})
        if not isinstance(target, dict):
            raise ConfigError(f"{section} is not a table", where=f"--set {item}")
        target[key] = value
    return merged


def _describe(err: dict[str, Any]) -> str:
    loc = ".".join(str(p) for p in err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        return f"{loc}: unknown key (check the spelling; `trainmaster init` lists every key)"
    if err["type"] == "missing":
        return f"{loc}: required"
    got = err.get("input")
    shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {json.dumps(got)})"
    return f"{loc}: {msg[0].lower()}{msg[1:]}{shown}"


def validate(data: dict[str, Any], where: str) -> JobConfig:
    """Validate a dict as a job; compute the derived values so every error surfaces now."""
    try:
        cfg = JobConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ConfigError(_describe(dict(first)) + more, where=where) from exc
    try:
        cfg.derived  # noqa: B018 - cross-section checks run here
    except ConfigError as exc:
        raise ConfigError(str(exc), where=where) from exc
    return cfg


def read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(
            "no such job file; create one with `trainmaster init`", where=str(path)
        ) from exc
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read the job file ({type(exc).__name__})", where=str(path)
        ) from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", where=str(path)) from exc


def load(path: str | Path, overrides: list[str] | None = None) -> JobConfig:
    path = Path(path)
    return validate(apply_overrides(read_toml(path), overrides or []), where=path.name)


def preset(name: str, overrides: list[str] | None = None) -> JobConfig:
    if name not in JOB_PRESETS:
        raise ConfigError(
            f"unknown preset {name!r}; presets: {', '.join(JOB_PRESETS)}", where="--preset"
        )
    return validate(apply_overrides(JOB_PRESETS[name], overrides or []), where=f"preset {name}")


# --- the commented writer ---------------------------------------------------------------------
# Keys and scalars are written by tomli-w, a TOML writer: a key such as
# `node.kubernetes.io/instance-type` must be quoted, and a string outside the BMP must not
# become a JSON surrogate pair (both made runs/JOB/job.toml unreadable, and every pod exit 2).
# Arrays and inline tables are assembled here so that each key stays one commented line.


def _scalar(value: Any) -> str:
    return tomli_w.dumps({"v": value})[len("v = ") :].rstrip("\n")


def _key(key: str) -> str:
    return tomli_w.dumps({key: True}).removesuffix(" = true\n")


def _toml_value(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an empty one stays `{  }`, as the examples/ files have it
        return (
            "{ " + ", ".join(f"{_key(str(k))} = {_toml_value(v)}" for k, v in value.items()) + " }"
        )
    if isinstance(value, (bool, int, float, str)):
        return _scalar(value)
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def render(cfg: JobConfig, title: str) -> str:
    """The resolved job as a TOML file with every key and a comment on each."""
    lines = [
        f"# {' '.join(title.split())}",
        "# Every key is listed with its meaning; unset keys are commented out.",
        "# Check with `trainmaster config validate FILE`, see derived values with `config show`.",
        "",
    ]
    for section_name in JobConfig.model_fields:
        section = getattr(cfg, section_name)
        lines.append(f"[{section_name}]")
        for key, field in type(section).model_fields.items():
            value = getattr(section, key)
            if field.description:
                lines.append(f"# {field.description}")
            if (
                value is None
                and section_name == "model"
                and cfg.model.preset
                and key in MODEL_PRESETS[cfg.model.preset]
            ):
                lines.append(
                    f"# {key} = {cfg.model.size(key)}  (the preset's; uncomment to change)"
                )
            elif value is None:
                lines.append(f"# {_key(key)} =")
            else:
                lines.append(f"{_key(key)} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)
