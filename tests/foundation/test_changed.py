"""`make check`'s choice of tests (tests/changed.py): a changed file to the tests that cover it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.changed import covering


@pytest.mark.parametrize(
    ("changed", "tests"),
    [
        ("src/trainmaster/backends/local/supervisor.py", "tests/backends/local"),
        ("src/trainmaster/backends/kubernetes/volcano.py", "tests/backends/kubernetes"),
        ("src/trainmaster/train/loop.py", "tests/train"),
        ("src/trainmaster/run/divergence.py", "tests/run"),
        ("src/trainmaster/api.py", "tests/foundation"),  # a top-level module
        ("src/trainmaster/naming.py", "tests/foundation"),
        ("tests/train/test_divergence.py", "tests/train/test_divergence.py"),
        ("tests/train/helpers.py", "tests/train"),  # a helper: its folder's tests
        ("tests/conftest.py", None),  # the suite's own
        ("README.md", None),
        ("src/trainmaster/schemas/README.md", None),
    ],
)
def test_a_changed_file_maps_to_the_tests_that_cover_it(changed: str, tests: str | None) -> None:
    assert covering(Path(changed)) == (Path(tests) if tests else None)
