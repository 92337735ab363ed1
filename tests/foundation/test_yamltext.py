"""trainmaster/yamltext.py, the one YAML renderer of manifests and plan files."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from trainmaster import yamltext

SRC = Path(yamltext.__file__).parent


def test_documents_read_back_with_scripts_as_blocks_and_no_aliases() -> None:
    shared = {"name": "fsx"}
    docs = [{"kind": "Pod", "script": "set -e\necho hi\n", "a": shared, "b": shared}, {"k": 1}]
    text = yamltext.dump(docs, comment="made by a test\nsecond line")
    assert text.startswith("# made by a test\n# second line\nkind: Pod\n")
    assert "script: |\n  set -e\n  echo hi\n" in text and "&" not in text and "*id" not in text
    assert list(yaml.safe_load_all(text)) == docs  # key order kept, as the builders gave it


def test_no_module_dumps_yaml_but_the_renderer() -> None:
    found = [
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if re.search(r"\byaml\.(safe_)?dump|SafeDumper", p.read_text(encoding="utf-8"))
    ]
    assert found == ["yamltext.py"]
