"""Fixtures of the data tests: real shards made once per session, and helpers to write text.

The built-in corpus is prepared once (small settings) and shared read-only; tests that
change shards copy them first.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.data.helpers import SMALL, write_docs
from trainmaster.data.corpus import pydoc_documents
from trainmaster.data.prepare import PrepareResult, prepare


@pytest.fixture(scope="session")
def pydoc_dataset(tmp_path_factory: pytest.TempPathFactory) -> PrepareResult:
    out = tmp_path_factory.mktemp("datasets") / "pydoc"
    return prepare(builtin="pydoc", output=out, workers=1, **SMALL)


@pytest.fixture(scope="session")
def pydoc_vocab(pydoc_dataset: PrepareResult) -> Path:
    return pydoc_dataset.output / "vocab.txt"


@pytest.fixture(scope="session")
def pydoc_text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in corpus as a text file (as a user's input would be)."""
    return write_docs(tmp_path_factory.mktemp("text") / "pydoc.txt", pydoc_documents())
