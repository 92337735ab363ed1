"""The rendered job file (runs/JOB/job.toml, `init`) reads back as the same job, for every field
of every section: load(render(cfg)) == cfg, checked with generated values (hypothesis).

Strategies are derived from the pydantic annotations, so a field added later is covered at once;
a field of a type this file does not know fails loudly (extend `_strategy`)."""

from __future__ import annotations

import tomllib
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from trainmaster.config import JobConfig, jobfile

# Any Unicode scalar value (hypothesis leaves out lone surrogates, which no UTF-8 file holds):
# control characters, quotes, backslashes, characters outside the BMP, newlines.
TEXT = st.text(max_size=12)
KEYS = st.one_of(
    TEXT,
    st.sampled_from(["node.kubernetes.io/instance-type", "a b", "", "ü", "🙂/x", 'q"uote', "key"]),
)


def _strategy(annotation: Any) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _strategy(typing.get_args(annotation)[0])
    if origin is Literal:
        return st.sampled_from(typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(_strategy(a) for a in typing.get_args(annotation)))
    if origin is list:
        return st.lists(_strategy(typing.get_args(annotation)[0]), max_size=3)
    if origin is dict:
        _, value = typing.get_args(annotation)
        return st.dictionaries(KEYS, _strategy(value), max_size=3)
    simple: dict[Any, st.SearchStrategy[Any]] = {
        type(None): st.none(),
        bool: st.booleans(),
        int: st.one_of(st.integers(0, 64), st.integers(-(2**63), 2**63 - 1)),
        float: st.one_of(st.floats(allow_nan=False), st.floats(1e-6, 10.0)),
        str: st.one_of(TEXT, st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9]", fullmatch=True)),
    }
    if annotation in simple:
        return simple[annotation]
    raise TypeError(f"no strategy for {annotation!r}: extend _strategy in {__file__}")


# Fields whose valid values the type alone rarely draws: job.entrypoint is a file path or
# `-m package.module` (a module, paths with spaces, quotes and non-ASCII characters).
ENTRYPOINTS = st.one_of(
    TEXT,
    st.sampled_from(
        [
            "-m trainmaster.train",
            "-m  pkg.sub_mod",
            "train.py",
            "my dir/tr'ain.py",
            "/workspace/🙂.py",
            "examples/custom-gpt/train_gpt.py",
        ]
    ),
    st.from_regex(
        r"-m [A-Za-z_][A-Za-z0-9_]{0,6}(\.[A-Za-z_][A-Za-z0-9_]{0,6}){0,2}", fullmatch=True
    ),
)
SPECIAL = {"entrypoint": ENTRYPOINTS}


def _section(model: type[BaseModel]) -> st.SearchStrategy[BaseModel]:
    """A valid section with each field drawn; a value the section refuses (pattern, bounds, a
    cross-field rule) leaves that field at its default, so no draw is wasted."""
    fields = {
        k: SPECIAL[k] if k in SPECIAL else _strategy(f.annotation)
        for k, f in model.model_fields.items()
    }

    @st.composite
    def build(draw: st.DrawFn) -> BaseModel:
        data: dict[str, Any] = {}
        for key, strategy in fields.items():
            value = draw(strategy)
            try:
                model.model_validate({**data, key: value})
            except ValidationError:
                continue
            data[key] = value
        return model.model_validate(data)

    return build()


CONFIGS = st.builds(
    JobConfig,
    **{
        name: _section(f.annotation)  # type: ignore[arg-type]
        for name, f in JobConfig.model_fields.items()
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CONFIGS)
def test_render_reads_back_as_the_same_job(cfg: JobConfig) -> None:
    text = jobfile.render(cfg, "round trip")
    loaded = JobConfig.model_validate(tomllib.loads(text))
    assert loaded.model_dump() == cfg.model_dump()
    assert loaded == cfg


def test_every_field_is_covered() -> None:
    """A new field of a new type makes this fail until _strategy knows the type."""
    for section in JobConfig.model_fields.values():
        for field in section.annotation.model_fields.values():  # type: ignore[union-attr]
            _strategy(field.annotation)


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        (
            'kubernetes.node_selector={ "node.kubernetes.io/instance-type" = "trn1.32xlarge" }',
            {"node.kubernetes.io/instance-type": "trn1.32xlarge"},
        ),
        (
            'kubernetes.node_selector={ "topology.k8s.aws/zone-id" = "usw2-az4", "team" = "🙂 ml" }',
            {"topology.k8s.aws/zone-id": "usw2-az4", "team": "🙂 ml"},
        ),
    ],
)
def test_well_known_labels_survive_the_job_file(
    tmp_path: Path, setting: str, expected: dict[str, str]
) -> None:
    """The file launch writes is read by every pod: it must load as the same job."""
    cfg = jobfile.preset("trn1-bert-large", [setting])
    path = tmp_path / "job.toml"
    path.write_text(jobfile.render(cfg, "resolved job (written by launch)"), encoding="utf-8")
    again = jobfile.load(path)
    assert again.kubernetes.node_selector == expected
    assert again == cfg and again.derived.config_hash == cfg.derived.config_hash
