"""The output folder of `data prepare`: built beside, swapped in whole, at the very end.

The promise to the user: at every instant (an error, Ctrl-C, SIGKILL, a full disk) the output
folder holds either the complete old dataset or the complete new one, never a mix and never
nothing. So the new dataset is written into a sibling folder `.NAME.partial-HOST-PID/`, whose
shard files are named `part-K.hdf5` while incomplete. NVIDIA's loader takes every *file* of the
data folder whose name contains `training` (NVIDIA/DeepLearningExamples
PyTorch/LanguageModeling/BERT/run_pretraining.py: `os.listdir(input_dir)`, `os.path.isfile` and
`'training' in f`), the tutorial's script `glob(data_dir + "/*_training_*.hdf5")`; neither looks
into sub-folders, and `part-K` matches neither. Once complete, the shards get their final names (inside the hidden folder),
files of the user's that lived in the old folder are hard-linked over, and the two folders are
swapped with one atomic rename (RENAME_EXCHANGE) where the file system has it, else with two
renames that a later run repairs if it was killed between them. The old folder is removed only
after the new one is in place.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fnmatch
import glob
import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainmaster import files
from trainmaster.data import shards as fmt
from trainmaster.data.vocab import Vocab
from trainmaster.errors import DataError
from trainmaster.run.pids import pid_alive
from trainmaster.storage import SHARD_GLOB

HOST = socket.gethostname()
# renameat2(2) flag, Linux >= 3.15, glibc >= 2.28 (https://man7.org/linux/man-pages/man2/rename.2.html):
# "Atomically exchange oldpath and newpath". File systems without it answer EINVAL (the man
# page: "flags contains RENAME_EXCHANGE ... not supported"); some say EOPNOTSUPP or ENOSYS.
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM}


def exchange(a: Path, b: Path) -> None:
    """Swap two paths atomically, or raise OSError (errno in _NO_EXCHANGE: not supported)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        raise OSError(errno.ENOSYS, "renameat2 not available")
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(a), None, str(b))


def is_dataset_file(name: str) -> bool:
    """What a dataset folder holds (and a new dataset replaces): shards, vocab, manifest, and
    the temporaries of an earlier version of trainmaster."""
    if name.startswith(".") and name.endswith(fmt.TMP_SUFFIX):
        name = name[1 : -len(fmt.TMP_SUFFIX)]
    return name in (fmt.VOCAB, fmt.MANIFEST) or fnmatch.fnmatchcase(name, SHARD_GLOB)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:  # no hard links here (or not allowed): a copy keeps the file all the same
        shutil.copy2(src, dst, follow_symlinks=False)


class Output:
    def __init__(self, folder: Path, shards: int, overwrite: bool) -> None:
        self.folder = folder.expanduser()
        self.name = self.folder.name or self.folder.resolve().name
        self.shards = shards
        self.overwrite = overwrite
        self.staging: Path | None = None

    @property
    def target(self) -> Path:
        """The folder itself (a symlink to a folder is followed: the link stays as it is)."""
        return Path(os.path.realpath(self.folder))

    def _sibling(self, kind: str, host: str = HOST, pid: int | str | None = None) -> Path:
        t = self.target
        return t.parent / f".{t.name}.{kind}-{host}-{os.getpid() if pid is None else pid}"

    def final_path(self, k: int) -> Path:
        return self.folder / fmt.shard_name(self.name, k)

    def temp_path(self, k: int) -> Path:
        """Where shard k is written: no loader's pattern matches it (no `training` in it)."""
        assert self.staging is not None, "temp_path outside writing()"
        return self.staging / f"part-{k}.hdf5"

    def scratch(self) -> Path:
        """A folder for the examples between the two stages (removed before commit; a
        killed run's goes with its staging folder)."""
        assert self.staging is not None, "scratch outside writing()"
        folder = self.staging / "examples"
        folder.mkdir()
        return folder

    def final_paths(self) -> list[Path]:
        return [self.final_path(k) for k in range(self.shards)]

    def check(self) -> None:
        """Before any work: repair what a killed run left, refuse an occupied folder, and one
        we could not write beside."""
        where = str(self.folder)
        if self.folder.exists() and not self.folder.is_dir():
            raise DataError("exists and is not a folder; choose another --output", where=where)
        self._recover()
        target = self.target
        if target.is_dir():
            held = fmt.list_shards(target)
            has_manifest = (target / fmt.MANIFEST).exists()
            if (held or has_manifest) and not self.overwrite:
                what = f"{len(held)} shard(s)" + (" and dataset.json" if has_manifest else "")
                raise DataError(
                    f"holds a dataset already ({what}); pass --overwrite to replace "
                    "it, or choose another --output",
                    where=where,
                )
            if os.path.ismount(target):
                raise DataError(
                    "is a mount point; a dataset is replaced as a whole folder: "
                    "give a folder inside it",
                    where=where,
                )
        parent = target.parent
        while not parent.exists():
            parent = parent.parent
        if not os.access(parent, os.W_OK | os.X_OK):
            raise DataError(
                f"cannot write in {parent} (the new dataset is built beside the "
                "folder); choose another --output or --storage",
                where=where,
            )

    def _recover(self) -> None:
        """Leftovers of runs that were killed: an old dataset moved aside goes back when the
        folder is missing (killed between the two renames), else it is removed; a staging
        folder of a dead process on this host is removed."""
        t = self.target
        if not t.parent.is_dir():
            return
        pattern = glob.escape(f".{t.name}.")
        olds = sorted(t.parent.glob(pattern + "old-*"), key=lambda p: p.stat().st_mtime)
        for old in reversed(olds):
            if not t.exists():
                os.rename(old, t)
            else:
                shutil.rmtree(old, ignore_errors=True)
        for partial in t.parent.glob(pattern + "partial-*"):
            host, _, pid = partial.name.rpartition(".partial-")[2].rpartition("-")
            if host == HOST and pid.isdigit() and not pid_alive(int(pid)):
                shutil.rmtree(partial, ignore_errors=True)

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Make the staging folder; on any failure (Ctrl-C too) remove it: the output folder
        itself is touched only by the swap in commit()."""
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.staging = self._sibling("partial")
        shutil.rmtree(self.staging, ignore_errors=True)  # our pid's, from a reused pid
        self.staging.mkdir()
        try:
            yield
        except BaseException:
            self._clean()
            raise

    def _clean(self) -> None:
        # Before the swap it holds the incomplete new dataset; after an exchange, the old one.
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)

    def write_meta(self, vocab: Vocab, manifest: dict[str, Any]) -> None:
        """vocab.txt and dataset.json (durable) into the staging folder: known once the shard
        sizes are, so `data prepare` writes them while the shards are written, and their
        fsyncs are not part of the serial end."""
        assert self.staging is not None, "write_meta outside writing()"
        vocab.write(self.staging / fmt.VOCAB)
        files.write_json(self.staging / fmt.MANIFEST, manifest)

    def commit(self) -> None:
        """All shards, vocab.txt and dataset.json are complete in the staging folder: name the
        shards, carry the user's other files over, then swap the folders."""
        stage = self.staging
        assert stage is not None, "commit outside writing()"
        need = [self.temp_path(k) for k in range(self.shards)]
        missing = [p for p in [*need, stage / fmt.VOCAB, stage / fmt.MANIFEST] if not p.is_file()]
        if missing:
            raise RuntimeError(f"files missing before commit: {missing}")
        for k in range(self.shards):
            os.replace(self.temp_path(k), stage / fmt.shard_name(self.name, k))
        target = self.target
        if target.is_dir():
            self._carry_over(target, stage)
            os.chmod(stage, target.stat().st_mode & 0o7777)  # a shared folder stays shared
        fmt.fsync_dir(stage)
        self._swap(stage, target)
        fmt.fsync_dir(target.parent)

    def _carry_over(self, old: Path, new: Path) -> None:
        """Whatever else the old folder holds (notes, a README, sub-folders) goes into the new
        one as hard links: both folders are complete until the swap."""
        for entry in os.scandir(old):
            if is_dataset_file(entry.name):
                continue
            dst = os.path.join(new, entry.name)
            if entry.is_dir(follow_symlinks=False):
                shutil.copytree(entry.path, dst, symlinks=True, copy_function=_link_or_copy)
            elif entry.is_symlink():
                os.symlink(os.readlink(entry.path), dst)
            else:
                _link_or_copy(entry.path, dst)

    def _swap(self, stage: Path, target: Path) -> None:
        if not target.exists():
            os.rename(stage, target)
            return
        try:
            exchange(stage, target)
        except OSError as exc:
            if exc.errno not in _NO_EXCHANGE:
                raise
        else:
            shutil.rmtree(stage, ignore_errors=True)  # now the old dataset
            return
        # Two renames. Killed between them, the folder is missing and the old dataset waits
        # under .NAME.old-*: the next `data prepare` puts it back first (_recover).
        old = self._sibling("old")
        os.rename(target, old)
        try:
            os.rename(stage, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.rename(old, target)
            raise
        shutil.rmtree(old, ignore_errors=True)
