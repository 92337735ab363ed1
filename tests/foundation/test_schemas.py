"""The repository stands alone: the published schemas ship inside the package (copied from the
team folder beside the first checkouts; their upstream sources are in
src/trainmaster/schemas/README.md), nothing reads that folder at run time, and `launch --dry-run`
(kubernetes) checks the Job against the CRD."""

from __future__ import annotations

import ast
import fnmatch
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from trainmaster import schemas
from trainmaster.backends.kubernetes import volcano
from trainmaster.cli.app import main
from trainmaster.errors import UserError

SHIPPED = [schemas.VOLCANO_JOB[0], schemas.VOLCANO_QUEUE[0], schemas.EKSCTL]


def test_schemas_are_in_the_package_with_source_and_version() -> None:
    readme = schemas.read_text("README.md")
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["trainmaster"]
    for relative in SHIPPED:
        assert len(schemas.read_text(relative)) > 1000, relative
        row = next(line for line in readme.splitlines() if line.startswith(f"| {relative} |"))
        assert "https://github.com/" in row and (" v1.15.1 " in row or " v0.230.0 " in row), row
        # A wheel carries the file only if a package-data glob names it.
        assert any(fnmatch.fnmatch(f"schemas/{relative}", g) for g in package_data), relative
    assert schemas.crd_validator(*schemas.VOLCANO_JOB).schema["type"] == "object"
    assert "ClusterConfig" in schemas.eksctl_validator().schema["definitions"]


# The old team folder beside the checkout (its name is built here, so that a search of the tree
# for references to it finds only real ones; this test reads nothing from it).
TEAM = "sha" + "red"
SHARED = (f"../{TEAM}", f"{TEAM}/schemas", f"{TEAM}/reference")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of string constants that are documentation (module/class/function docstrings)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            out.add(id(body[0].value))
    return out


def test_no_code_reads_the_team_folder() -> None:
    """A clone alone has no team folder beside it: no path built from one in src, tests or bench,
    and no Makefile command uses it (what it held that the code needs is in docs/ and
    src/trainmaster/schemas/)."""
    found = []
    for folder in ("src", "tests", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == Path(__file__).resolve():
                continue  # the patterns themselves
            tree = ast.parse(path.read_text(encoding="utf-8"))
            docs = _docstrings(tree)
            for node in ast.walk(tree):
                text = (
                    node.value if isinstance(node, ast.Constant) and id(node) not in docs else None
                )
                if isinstance(text, str) and any(s in text for s in SHARED):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text!r}")
                # the old tests/schemas.py built the path as ROOT.parent / TEAM / ...
                if (
                    isinstance(node, ast.BinOp)
                    and isinstance(node.op, ast.Div)
                    and isinstance(node.right, ast.Constant)
                    and node.right.value == TEAM
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: / {TEAM!r}")
    for n, line in enumerate((ROOT / "Makefile").read_text().splitlines(), 1):
        if not line.lstrip().startswith("#") and any(s in line for s in SHARED):
            found.append(f"Makefile:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def _example(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    rc = main(
        [
            "launch",
            str(ROOT / "examples" / "trn1-bert-large.toml"),
            "--backend",
            "kubernetes",
            "--dry-run",
            *extra,
        ]
    )
    got = capsys.readouterr()
    return rc, got.out, got.err


def test_dry_run_refuses_a_job_the_crd_rejects(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A field Volcano does not know (here: injected into the builder's output, as a builder
    bug or a hand edit would) is one line and exit 2, before anything is printed."""
    real = volcano.objects

    def with_typo(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        objs = real(*args, **kwargs)
        objs[-1]["spec"]["tasks"][0]["minAvaliable"] = 1
        return objs

    monkeypatch.setattr(volcano, "objects", with_typo)
    rc, out, err = _example(capsys)
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "does not match the Volcano CRD: spec.tasks[0]: Additional properties" in lines[0]
    assert "'minAvaliable' was unexpected" in lines[0] and out == ""


def test_dry_run_of_the_example_passes_the_check(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _example(capsys)
    assert rc == 0, err
    assert "kind: Job" in out and "kind: ConfigMap" in out


def test_check_objects_skips_core_kinds_and_names_the_field() -> None:
    schemas.check_objects([{"apiVersion": "v1", "kind": "ConfigMap", "anything": 1}])
    queue = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": "q"},
        "spec": {"weight": "heavy"},
    }
    with pytest.raises(
        UserError,
        match=r"Queue q .*: spec\.weight: 'heavy' is not of "
        r"type 'integer'",
    ):
        schemas.check_objects([queue])
