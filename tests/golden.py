"""Golden files: compare generated text with tests/**/golden/; UPDATE_GOLDEN=1 rewrites them."""

from __future__ import annotations

import os
from pathlib import Path


def check(path: Path, text: str) -> None:
    if os.environ.get("UPDATE_GOLDEN") or not path.exists():
        if not os.environ.get("UPDATE_GOLDEN"):
            raise AssertionError(
                f"missing golden file {path}; run with UPDATE_GOLDEN=1 to create it"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.read_text() == text, f"{path} differs; review, then UPDATE_GOLDEN=1 if intended"
