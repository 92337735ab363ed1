"""The operator side starts without torch or transformers (DESIGN 2): checked in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys

OPERATOR_MODULES = ["trainmaster.cli.app", "trainmaster.config", "trainmaster.jobfile",
                    "trainmaster.catalog", "trainmaster.api", "trainmaster.storage"]


def test_cli_and_config_do_not_import_torch() -> None:
    code = (
        "import importlib, json, sys\n"
        f"for m in {OPERATOR_MODULES!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'transformers'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
    # ...and the check itself can fail: importing torch is seen.
    seen = subprocess.run([sys.executable, "-c", code.replace("import importlib", "import torch, importlib")],
                          capture_output=True, text=True, check=True)
    assert "torch" in json.loads(seen.stdout)
