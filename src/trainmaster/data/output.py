"""The output folder of `data prepare`: checked first, changed only at the very end.

The promise to the user: after a failed or interrupted run there is no file under a final
name that was not there before, and an existing dataset is only replaced (with --overwrite)
once every new shard is complete on disk.
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainmaster.data import shards as fmt
from trainmaster.data.vocab import Vocab
from trainmaster.errors import DataError


class Output:
    def __init__(self, folder: Path, shards: int, overwrite: bool) -> None:
        self.folder = folder.expanduser()
        self.name = self.folder.name or self.folder.resolve().name
        self.shards = shards
        self.overwrite = overwrite
        self._created = False
        self._placed: list[Path] = []

    def final_path(self, k: int) -> Path:
        return self.folder / fmt.shard_name(self.name, k)

    def temp_path(self, k: int) -> Path:
        return self.folder / fmt.temp_name(fmt.shard_name(self.name, k))

    def final_paths(self) -> list[Path]:
        return [self.final_path(k) for k in range(self.shards)]

    def _temps(self) -> list[Path]:
        return list(self.folder.glob(glob.escape(fmt.temp_name(fmt.shard_name(self.name, "@")))
                                     .replace("@", "*")))

    def check(self) -> None:
        """Before any work: refuse an occupied folder, and one we could not write to."""
        where = str(self.folder)
        if self.folder.exists() and not self.folder.is_dir():
            raise DataError("exists and is not a folder; choose another --output", where=where)
        if self.folder.is_dir():
            held = fmt.list_shards(self.folder)
            has_manifest = (self.folder / fmt.MANIFEST).exists()
            if (held or has_manifest) and not self.overwrite:
                what = f"{len(held)} shard(s)" + (" and dataset.json" if has_manifest else "")
                raise DataError(f"holds a dataset already ({what}); pass --overwrite to replace "
                                "it, or choose another --output", where=where)
        parent = self.folder
        while not parent.exists():
            parent = parent.parent
        if not os.access(parent, os.W_OK | os.X_OK):
            raise DataError(f"cannot write in {parent}; choose another --output or --storage",
                            where=where)

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Create the folder; on any failure (Ctrl-C too) remove what this run made."""
        if not self.folder.exists():
            self.folder.mkdir(parents=True)
            self._created = True
        for stale in self._temps():
            stale.unlink()  # left by a run that was killed (SIGKILL leaves no chance to clean)
        try:
            yield
        except BaseException:
            self._clean()
            raise

    def _clean(self) -> None:
        for path in [*self._temps(), *self._placed, self.folder / fmt.temp_name(fmt.MANIFEST),
                     self.folder / fmt.temp_name(fmt.VOCAB)]:
            path.unlink(missing_ok=True)
        if self._created:
            with contextlib.suppress(OSError):
                self.folder.rmdir()  # only if empty

    def commit(self, vocab: Vocab, manifest: dict[str, Any]) -> None:
        """All shards are complete as temporaries: put them in place, dataset.json last."""
        missing = [p for p in (self.temp_path(k) for k in range(self.shards)) if not p.is_file()]
        if missing:
            raise RuntimeError(f"shard temporaries missing before commit: {missing}")
        old = set(fmt.list_shards(self.folder))
        # The old manifest goes first: never a dataset.json that describes a mix of shards.
        (self.folder / fmt.MANIFEST).unlink(missing_ok=True)
        for k in range(self.shards):
            os.replace(self.temp_path(k), self.final_path(k))
            self._placed.append(self.final_path(k))
        for path in old - set(self._placed):
            path.unlink()
        vocab.write(self.folder / fmt.VOCAB)
        fmt.write_json_atomic(self.folder / fmt.MANIFEST, manifest)
        fmt.fsync_dir(self.folder)
