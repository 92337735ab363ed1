"""Comments stand alone: every `docs/architecture.md ...` reference in src names a section or a
row of its table of references (5), every repository path a comment names exists, and no comment
cites a ticket number the reader cannot look up (upstream issues, named with their project,
are links, not tickets)."""

from __future__ import annotations

import re
from pathlib import Path

import trainmaster

SRC = Path(trainmaster.__file__).parent
ROOT = SRC.parents[1]
ARCH = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
SECTIONS = set(re.findall(r"^#{2,4} (\d+(?:\.\d+)?)[. ]", ARCH, re.M))
ROWS = set(re.findall(r"^\| (\d+(?:\.\d+)?|tutorial [\d.]+) \|", ARCH, re.M))
TOP = {p.name for p in ROOT.iterdir()} | {p.name for p in SRC.iterdir()}
UPSTREAM = re.compile(r"[\w.-]+/[\w.-]+\s+(issues?\s+)?$|\$$")  # owner/repo before it, or $var


def sources() -> list[tuple[str, str]]:
    found = [(str(p.relative_to(SRC)), p.read_text(encoding="utf-8")) for p in SRC.rglob("*.py")]
    assert len(found) > 100
    return found


def test_every_architecture_reference_names_a_section_or_a_row() -> None:
    bad = []
    for name, text in sources():
        for m in re.finditer(r"docs/architecture\.md (5: )?((?:tutorial )?[\d.]*\d)", text):
            if m.group(2) not in (ROWS if m.group(1) else SECTIONS):
                bad.append(f"{name}: {m.group(0)}")
        for m in re.finditer(r"\b5: (\d+\.\d+) and (\d+\.\d+)", text):  # "5: 12.1 and 17.3"
            bad += [f"{name}: 5: {r}" for r in m.groups() if r not in ROWS]
    assert not bad, bad


def test_every_repository_path_named_in_src_exists() -> None:
    bad = []
    pattern = r"(?<![\w./$-])((?:[\w-]+/)+[\w.-]+\.(?:py|md|toml|sh|txt|yaml|json))\b"
    for name, text in sources():
        for m in re.finditer(pattern, text):
            path, line_start = m.group(1), text.rfind("\n", 0, m.start()) + 1
            if path.split("/")[0] not in TOP or UPSTREAM.search(text[line_start : m.start()]):
                continue  # a file of the run folder, a plan, or another project
            if not ((ROOT / path).exists() or (SRC / path).exists()):
                bad.append(f"{name}: {path}")
    assert not bad, bad


def test_no_comment_cites_a_ticket_number() -> None:
    bad = []
    for name, text in sources():
        for m in re.finditer(r"\b[Ii]ssues? \d+", text):
            before = text[text.rfind("\n", 0, m.start()) + 1 : m.start()]
            if not re.search(r"([\w.-]+/[\w.-]+|optimum-neuron|aws-neuron-sdk)\s+$", before):
                bad.append(f"{name}: {text[m.start() - 30 : m.end() + 10]!r}")
    assert not bad, bad


def test_every_package_face_maps_its_modules() -> None:
    """A newcomer opens a package's __init__ and finds each module of it with a line on what
    it does (as cluster/ and train/ did first)."""
    import ast

    missing = []
    inits = sorted(SRC.rglob("__init__.py"))
    for init in inits:
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        here = [p.stem for p in init.parent.glob("*.py") if p.stem != "__init__"]
        here += [p.name for p in init.parent.iterdir() if (p / "__init__.py").exists()]
        missing += [f"{init.parent.name}/{m}" for m in here if not re.search(rf"\b{m}\b", doc)]
    assert len(inits) > 10 and not missing, missing


# Files of other projects or of a user that comments name on purpose (a script's name in an
# example, NVIDIA's data tool, torch's rendezvous backend).
FOREIGN = {"train.py", "script.py", "create_pretraining_data.py", "c10d_rendezvous_backend.py"}


def test_every_module_named_bare_in_src_exists() -> None:
    """`see top_k8s.py` with no folder: the module must exist somewhere in the repository (a
    rename leaves such names behind, and the paths test above does not see them)."""
    here = {p.name for top in ("src", "tests", "bench", "controlplane", "examples")
            for p in (ROOT / top).rglob("*.py")}  # fmt: skip
    bad = []
    for name, text in sources():
        for m in re.finditer(r"(?<![\w/.-])([a-z_]\w*\.py)\b", text):
            if m.group(1) not in here | FOREIGN:
                bad.append(f"{name}: {m.group(1)}")
    assert not bad, bad


# What storage.py computes: the folders under STORAGE and the files of a run folder.
LAYOUT = (r"runs|datasets|cache|checkpoints|logs|tensorboard|job\.toml|state\.json|metrics\.jsonl"
          r"|summary\.json|timeline\.jsonl|hangs\.jsonl|preemptions\.jsonl|rollbacks\.jsonl"
          r"|rank0\.json")  # fmt: skip


def test_the_storage_layout_is_spelled_only_in_storage_py() -> None:
    """storage.py says every path under STORAGE is computed there: a path joined from a layout
    name anywhere else (`root / "runs"`, `with_name("summary.json")`) is a second source. The
    cluster plan's own folder (`plan.state_dir / "logs"`) is not under STORAGE."""
    join = re.compile(rf"""(/|with_name\(|joinpath\()\s*["']({LAYOUT})["']""")
    bad = []
    for name, text in sources():
        if name == "storage.py":
            continue
        for line in text.splitlines():
            if join.search(line) and "plan.state_dir" not in line:
                bad.append(f"{name}: {line.strip()}")
    assert not bad, bad
