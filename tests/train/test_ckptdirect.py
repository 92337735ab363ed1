"""Checkpoint files written from the staging block past the page cache (ckptdirect) are the
same torch-loadable zips as torch.save's, wherever O_DIRECT is refused too, and a state whose
records cannot be matched to the block is saved the plain way rather than written wrong."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.train.test_checkpoint import setup
from tests.train.test_ckptwriter import stage
from trainmaster.train import checkpoint, ckptarena, ckptdirect, ckptwriter


def state() -> dict[str, Any]:
    tied = torch.randn(3000, 77)  # 924,000 bytes: whole pages and a tail
    return {
        "tied": tied,
        "tied_again": tied,
        "empty": torch.empty(0, 5),
        "bf16": torch.randn(4097).bfloat16(),
        "int64": torch.arange(12345),
        "transposed": torch.randn(10, 30).t(),
        "page": torch.ones(1024),  # exactly one page, no tail
        "scalar": torch.tensor(3.0),
        "nested": [torch.ones(3), (torch.zeros(2, dtype=torch.int64), "text")],
        "number": 5,
    }


@pytest.fixture
def staged() -> Iterator[tuple[dict[str, Any], Any, ckptarena.Arena]]:
    """A state, the same state as views of a filled block (as the writer process sees it)."""
    original = state()
    skeleton, tensors = ckptarena.flatten(original)
    layout, size = ckptarena.layout_of(tensors)
    fd = ckptarena.shared_fd()
    os.ftruncate(fd, size)
    arena = ckptarena.Arena(fd, size, layout)
    arena.fill(tensors)
    yield original, ckptarena.unflatten(skeleton, arena.views), arena
    arena.close()
    os.close(fd)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(v, b[k]) for k, v in a.items())
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return bool(a == b)


def record_offsets(path: Path) -> list[int]:
    reader: Any = torch._C.PyTorchFileReader(str(path))
    names = [n for n in reader.get_all_records() if n.startswith("data/")]
    return [reader.get_record_offset(n) for n in names]


def check_loads(path: Path, original: dict[str, Any]) -> None:
    back = torch.load(path, map_location="cpu", weights_only=True)
    assert same(original, back)
    assert (
        back["tied"].untyped_storage().data_ptr() == back["tied_again"].untyped_storage().data_ptr()
    )
    assert back["empty"].shape == (0, 5)


def test_a_direct_write_loads_as_the_same_tensors(staged, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    original, views, arena = staged
    size = ckptdirect.save(views, tmp_path / "m.pt", arena)
    assert size == (tmp_path / "m.pt").stat().st_size
    offsets = record_offsets(tmp_path / "m.pt")
    assert len(offsets) == 9  # the tied weight once, the empty tensor too
    assert all(o % ckptarena.ALIGN == 0 for o in offsets)  # the direct layout, not torch.save's
    check_loads(tmp_path / "m.pt", original)


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no tmpfs at /dev/shm")
def test_where_o_direct_is_refused_the_same_file_is_written_buffered(
    staged, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """tmpfs refuses O_DIRECT at open: the same bytes go through the page cache instead."""
    original, views, arena = staged
    shm = Path(f"/dev/shm/trainmaster-test-{os.getpid()}")
    shm.mkdir()
    try:
        ckptdirect.save(views, shm / "m.pt", arena)
        ckptdirect.save(views, tmp_path / "m.pt", arena)
        check_loads(shm / "m.pt", original)
        assert record_offsets(shm / "m.pt") == record_offsets(tmp_path / "m.pt")
    finally:
        for f in shm.iterdir():
            f.unlink()
        shm.rmdir()


class Reversed(dict[str, Any]):
    """Iterates its values backwards, so the order walk() sees is not the one pickle writes."""

    def values(self) -> Any:
        return list(super().values())[::-1]


def test_records_that_do_not_match_the_block_fall_back_to_a_plain_save(  # type: ignore[no-untyped-def]
    staged, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    original, views, arena = staged
    mixed = Reversed(bf16=views["bf16"], int64=views["int64"])
    with pytest.raises(ckptdirect.Unsuitable, match="record 0"):
        ckptdirect.save(mixed, tmp_path / "direct.pt", arena)
    checkpoint._save(mixed, tmp_path / "m.pt", arena)
    back = torch.load(tmp_path / "m.pt", weights_only=False)  # our own dict subclass
    assert torch.equal(back["bf16"], original["bf16"]) and torch.equal(
        back["int64"], original["int64"]
    )
    assert "written through the page cache" in capfd.readouterr().err


def test_a_tensor_outside_the_block_falls_back_to_a_plain_save(staged, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    original, views, arena = staged
    views = {**views, "outside": torch.arange(7)}
    with pytest.raises(ckptdirect.Unsuitable, match="not in the staging block"):
        ckptdirect.save(views, tmp_path / "direct.pt", arena)
    checkpoint._save(views, tmp_path / "m.pt", arena)
    back = torch.load(tmp_path / "m.pt", weights_only=True)
    assert torch.equal(back.pop("outside"), torch.arange(7))
    assert same(original, back)


def test_the_writer_process_writes_model_and_trainer_directly(tmp_path: Path) -> None:
    _, rt, bert, opt, sched = setup()
    writer = ckptwriter.BackgroundWriter(tmp_path, keep=1)
    try:
        writer.submit(stage(3, rt, bert, opt, sched))
        writer.wait()
    finally:
        writer.close()
    (path,) = tmp_path.glob("step_*")
    for name in (checkpoint.MODEL, checkpoint.TRAINER):
        assert all(o % ckptarena.ALIGN == 0 for o in record_offsets(path / name)), name
    model = torch.load(path / checkpoint.MODEL, weights_only=True)
    assert model.keys() == bert.state_dict().keys()
    assert all(torch.equal(model[k], v) for k, v in bert.state_dict().items())


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT here")
def test_a_direct_write_the_kernel_refuses_goes_on_buffered(tmp_path: Path) -> None:
    """A file system may take the flag and refuse the write (EINVAL on an alignment it does not
    support): here a length of 100 bytes, which no block device accepts direct."""
    path = tmp_path / "f"
    path.write_bytes(b"\0" * 8192)
    data = bytes(range(100))
    buffered = os.open(path, os.O_WRONLY)
    direct = ckptdirect._open_direct(path)
    if direct is None:
        pytest.skip(f"{tmp_path} refuses O_DIRECT at open")
    try:
        with pytest.raises(OSError):
            os.pwrite(direct, data, 4096)
        assert ckptdirect._pwrite(direct, memoryview(data), 4096, buffered) == 100
    finally:
        os.close(direct)
        os.close(buffered)
    assert path.read_bytes() == b"\0" * 4096 + data + b"\0" * 3996
