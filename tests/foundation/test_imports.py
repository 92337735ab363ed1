"""The operator side starts without torch or transformers (docs/architecture.md 2): checked in a
fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

OPERATOR_MODULES = [
    "trainmaster.cli.app",
    "trainmaster.config",
    "trainmaster.config.jobfile",
    "trainmaster.catalog",
    "trainmaster.api",
    "trainmaster.storage",
]


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
    seen = subprocess.run(
        [sys.executable, "-c", code.replace("import importlib", "import torch, importlib")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "torch" in json.loads(seen.stdout)


def test_help_imports_no_accelerator_or_cloud_client() -> None:
    """`trainmaster --help` (and every command's parsing) starts without torch, the kubernetes
    client or boto3: each is imported where a command first needs it."""
    code = (
        "import json, sys\nfrom trainmaster.cli.app import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'torch', 'kubernetes', 'boto3', 'botocore', 'transformers'})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_a_script_importing_the_worker_helpers_pays_for_nothing_heavy() -> None:
    code = (
        "import json, sys\nbefore = set(sys.modules)\nfrom trainmaster.worker import log_metrics, "
        "heartbeat, preempted, checkpoint_dir, checkpoint_saved, latest_checkpoint, drop_after\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    new = json.loads(out.stdout)
    assert [m for m in new if m.startswith("trainmaster")] == [
        "trainmaster",
        "trainmaster.errors",  # errors, files and storage: the standard library only
        "trainmaster.files",
        "trainmaster.run",
        "trainmaster.run.metrics",
        "trainmaster.storage",  # the run folder's names (RunPaths)
        "trainmaster.worker",
    ]
    assert not [
        m for m in new if m.split(".")[0] in ("torch", "pydantic", "numpy", "typer", "rich")
    ]


def test_no_import_circle_anywhere_in_src() -> None:
    """Modules importing each other, directly or around a loop (imports inside functions
    included), are one module in disguise: the layers contracts catch most, this the rest."""
    import grimp

    graph = grimp.build_graph("trainmaster")
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        order[module] = low[module] = len(order)
        stack.append(module)
        for other in graph.find_modules_directly_imported_by(module):
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            part = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(part) > 1:
                circles.append(sorted(part))

    for module in sorted(graph.modules):
        if module not in order:
            visit(module)
    assert len(order) > 100 and circles == []


def test_data_prepare_help_reads_its_defaults_without_numpy() -> None:
    """The defaults live once, on data/settings.py's dataclass (stdlib only): `--help` shows
    them without importing the data stage's numpy, h5py or tokenizers."""
    code = (
        "import json, sys\nfrom trainmaster.cli.app import main\n"
        "try:\n    main(['data', 'prepare', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'numpy', 'h5py', 'tokenizers'})))\n"
    )
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
    from trainmaster.data.settings import DEFAULTS

    help_text = " ".join(out.stdout.split())
    assert (
        f"[default: {DEFAULTS.seq_len}]" in help_text and f"{DEFAULTS.masked_lm_prob}" in help_text
    )
