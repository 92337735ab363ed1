"""The test folders a change touches, for `make check` (the fast loop; `make test` runs all).

    python -m tests.changed [--base REV]

Prints the test paths for the files changed since REV (default: HEAD, i.e. the uncommitted
change, untracked files included): src/trainmaster/PKG/... -> tests/PKG (tests/backends/local
for backends/local, and so on), a top-level module (api.py, storage.py, ...) and anything else
of the package -> tests/foundation, a changed test file -> itself, a test helper -> its folder.
Nothing changed: nothing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = Path("src/trainmaster")


def changed(base: str) -> list[Path]:
    def git(*args: str) -> list[str]:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
        return out.stdout.split()

    names = git("diff", "--name-only", base) + git("ls-files", "--others", "--exclude-standard")
    return [Path(n) for n in dict.fromkeys(names)]


def covering(path: Path) -> Path | None:
    if path.parts[:1] == ("tests",):  # a test file itself; a helper: its folder's tests
        if not (ROOT / path).exists() or path.suffix != ".py" or len(path.parts) < 3:
            return None  # gone, not Python, or the suite's own (conftest.py, golden.py)
        return path if path.name.startswith("test_") else path.parent
    if path.parts[: len(SRC.parts)] != SRC.parts or path.suffix != ".py":
        return None
    inner = path.parts[len(SRC.parts) :]
    for depth in (2, 1):  # backends/local before backends
        folder = Path("tests", *inner[:depth])
        if len(inner) > depth and (ROOT / folder).is_dir():
            return folder
    return Path("tests/foundation")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="HEAD", help="what the change is against (default HEAD)")
    args = p.parse_args(argv)
    found = {t for f in changed(args.base) if (t := covering(f)) is not None}
    # a folder already listed covers the files in it
    kept = sorted(t for t in found if not any(f != t and f in t.parents for f in found))
    print(" ".join(str(t) for t in kept))
    return 0


if __name__ == "__main__":
    sys.exit(main())
