"""Checkpoint files written from the staging block past the page cache (odirect) are the
same torch-loadable zips as torch.save's, every record's CRC-32 in place (zipcrc), wherever
O_DIRECT is refused too, and a state whose records cannot be matched to the block is saved the
plain way rather than written wrong."""

from __future__ import annotations

import os
import struct
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.serialization import config

from tests.train.test_background_writer import stage
from tests.train.test_checkpoint import setup
from trainmaster.train.checkpoint import background, odirect, saving, staging, zipcrc

# Checkpoint writing and device choices use torch's newer and private APIs: run on every
# stack (the trn1 stack too, `make stacks`).
pytestmark = pytest.mark.stacks


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
def staged() -> Iterator[tuple[dict[str, Any], Any, staging.Arena]]:
    """A state, the same state as views of a filled block (as the writer process sees it)."""
    original = state()
    skeleton, tensors = staging.flatten(original)
    layout, size = staging.layout_of(tensors)
    fd = staging.shared_fd()
    os.ftruncate(fd, size)
    arena = staging.Arena(fd, size, layout)
    arena.fill(tensors)
    yield original, staging.unflatten(skeleton, arena.views), arena
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


def data_offsets(path: Path) -> dict[str, tuple[int, int]]:
    """(where its bytes start, its size) of every record, by its name inside the archive, as
    any zip reader finds them (no torch internals: they differ between torch versions)."""
    out = {}
    with zipfile.ZipFile(path) as z, path.open("rb") as f:
        for info in z.infolist():
            f.seek(info.header_offset + 26)
            names, extra = struct.unpack("<HH", f.read(4))
            name = info.filename.partition("/")[2]
            out[name] = (info.header_offset + 30 + names + extra, info.file_size)
    return out


def record_offsets(path: Path) -> list[int]:
    return [at for name, (at, _) in data_offsets(path).items() if name.startswith("data/")]


def crcs_check(path: Path) -> None:
    """Every record's CRC-32 is right, as a zip reader that checks (zipfile, unzip) sees it."""
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None


def check_loads(path: Path, original: dict[str, Any]) -> None:
    crcs_check(path)
    back = torch.load(path, map_location="cpu", weights_only=True)
    assert same(original, back)
    assert (
        back["tied"].untyped_storage().data_ptr() == back["tied_again"].untyped_storage().data_ptr()
    )
    assert back["empty"].shape == (0, 5)


def test_a_direct_write_loads_as_the_same_tensors(staged, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    original, views, arena = staged
    size = odirect.save(views, tmp_path / "m.pt", arena)
    assert size == (tmp_path / "m.pt").stat().st_size
    offsets = record_offsets(tmp_path / "m.pt")
    assert len(offsets) == 9  # the tied weight once, the empty tensor too
    assert all(o % staging.ALIGN == 0 for o in offsets)  # the direct layout, not torch.save's
    check_loads(tmp_path / "m.pt", original)


def test_the_crcs_are_those_torch_save_writes(staged, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The direct file is torch.save's own with the same alignment, crc32 on: the same records
    at the same offsets with the same CRCs (all but the serialization id, random per save)."""
    _, views, arena = staged
    odirect.save(views, tmp_path / "m.pt", arena)
    (tmp_path / "ref").mkdir()  # the same name: the archive's records are named after it
    with config.patch({"save.storage_alignment": staging.ALIGN}):
        torch.save(views, tmp_path / "ref" / "m.pt")

    def entries(path: Path) -> list[tuple[str, int, int, int]]:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
        return [(i.filename, i.header_offset, i.file_size, i.CRC) for i in infos]

    ours, theirs = entries(tmp_path / "m.pt"), entries(tmp_path / "ref" / "m.pt")
    assert ours[-1][0] == theirs[-1][0] == "m/.data/serialization_id"
    assert ours[:-1] == theirs[:-1]
    assert any(crc for *_, crc in ours)


def test_a_flipped_byte_in_a_record_is_caught_by_its_crc(staged, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, views, arena = staged
    path = tmp_path / "m.pt"
    odirect.save(views, path, arena)
    with zipfile.ZipFile(path) as z:
        tensor, pickle = z.getinfo("m/data/0"), z.getinfo("m/data.pkl")
    for info in (tensor, pickle):  # a record of the block's and one torch wrote itself
        good = path.read_bytes()
        names, extra = struct.unpack_from("<HH", good, info.header_offset + 26)
        at = info.header_offset + 30 + names + extra + info.file_size // 2  # amid its bytes
        bad = bytearray(good)
        bad[at] ^= 0x01
        path.write_bytes(bad)
        with zipfile.ZipFile(path) as z:
            assert z.testzip() == info.filename
        path.write_bytes(good)
    crcs_check(path)


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no tmpfs at /dev/shm")
def test_where_o_direct_is_refused_the_same_file_is_written_buffered(
    staged, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """tmpfs refuses O_DIRECT at open: the same bytes go through the page cache instead."""
    original, views, arena = staged
    shm = Path(f"/dev/shm/trainmaster-test-{os.getpid()}")
    shm.mkdir()
    try:
        odirect.save(views, shm / "m.pt", arena)
        odirect.save(views, tmp_path / "m.pt", arena)
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
    with pytest.raises(odirect.Unsuitable, match="record 0"):
        odirect.save(mixed, tmp_path / "direct.pt", arena)
    saving._save(mixed, tmp_path / "m.pt", arena)
    crcs_check(tmp_path / "m.pt")
    back = torch.load(tmp_path / "m.pt", weights_only=False)  # our own dict subclass
    assert torch.equal(back["bf16"], original["bf16"]) and torch.equal(
        back["int64"], original["int64"]
    )
    assert "written through the page cache" in capfd.readouterr().err


def test_a_tensor_outside_the_block_falls_back_to_a_plain_save(staged, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    original, views, arena = staged
    views = {**views, "outside": torch.arange(7)}
    with pytest.raises(odirect.Unsuitable, match="not in the staging block"):
        odirect.save(views, tmp_path / "direct.pt", arena)
    saving._save(views, tmp_path / "m.pt", arena)
    crcs_check(tmp_path / "m.pt")
    back = torch.load(tmp_path / "m.pt", weights_only=True)
    assert torch.equal(back.pop("outside"), torch.arange(7))
    assert same(original, back)


def test_the_writer_process_writes_model_and_trainer_directly(tmp_path: Path) -> None:
    _, rt, bert, opt, sched = setup()
    writer = background.BackgroundWriter(tmp_path, keep=1)
    try:
        writer.submit(stage(3, rt, bert, opt, sched))
        writer.wait()
    finally:
        writer.close()
    (path,) = tmp_path.glob("step_*")
    for name in (saving.MODEL, saving.TRAINER):
        assert all(o % staging.ALIGN == 0 for o in record_offsets(path / name)), name
    for name in (saving.MODEL, saving.TRAINER, saving.RANKS):
        crcs_check(path / name)
    model = torch.load(path / saving.MODEL, weights_only=True)
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
    direct = odirect._open_direct(path)
    if direct is None:
        pytest.skip(f"{tmp_path} refuses O_DIRECT at open")
    try:
        with pytest.raises(OSError):
            os.pwrite(direct, data, 4096)
        assert odirect._pwrite(direct, memoryview(data), 4096, buffered) == 100
    finally:
        os.close(direct)
        os.close(buffered)
    assert path.read_bytes() == b"\0" * 4096 + data + b"\0" * 3996


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT here")
def test_direct_writes_refused_part_way_still_make_a_valid_zip(  # type: ignore[no-untyped-def]
    staged, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of a length no block device takes direct: a record of one page or two is written
    direct (shorter than a chunk), a longer one is refused (EINVAL) at its first chunk and
    goes on buffered, so the file has both, and its CRCs hold all the same."""
    original, views, arena = staged
    probe = tmp_path / "probe"
    probe.touch()
    direct = odirect._open_direct(probe)
    if direct is None:
        pytest.skip(f"{tmp_path} refuses O_DIRECT at open")
    os.close(direct)
    monkeypatch.setattr(odirect, "CHUNK", 3 * staging.ALIGN + 100)
    odirect.save(views, tmp_path / "m.pt", arena)
    check_loads(tmp_path / "m.pt", original)


def test_crcs_of_records_past_4_gib_go_where_zip64_puts_them(tmp_path: Path) -> None:
    """Past 4 GiB, offsets move into zip64 fields and data descriptors get 8-byte sizes. A
    sparse file (torch.save of an untouched 4 GiB tensor under skip_data) has both."""
    path = tmp_path / "big.pt"
    small = {"after": torch.arange(20), "last": torch.ones(3)}
    state = {"big": torch.empty((4 << 30) + 100, dtype=torch.uint8), **small}
    layout = {"save.storage_alignment": staging.ALIGN, "save.compute_crc32": False}
    with config.patch(layout), torch.serialization.skip_data():  # type: ignore[attr-defined]
        torch.save(state, path)
    fd = os.open(path, os.O_RDWR)
    try:
        records = {r.name.partition("/")[2]: r for r in zipcrc.records(fd)}
        assert {n: (r.data, r.size) for n, r in records.items()} == data_offsets(path)
        for key, t in enumerate(small.values(), start=1):
            os.pwrite(fd, t.numpy().tobytes(), records[f"data/{key}"].data)
        del records["data/0"]  # 4 GiB of zeros: too long to read back in a test
        crcs = [(r, zlib.crc32(os.pread(fd, r.size, r.data))) for r in records.values()]
        zipcrc.set_crcs(fd, crcs)
        last = records["data/2"]
        descriptor = os.pread(fd, 24, last.data + last.size)
    finally:
        os.close(fd)
    assert last.data > 1 << 32
    assert descriptor == b"PK\x07\x08" + struct.pack("<IQQ", dict(crcs)[last], last.size, last.size)
    with zipfile.ZipFile(path) as z:
        for name in records:
            z.read(f"big/{name}")  # checks the CRC: BadZipFile if wrong
        assert z.getinfo("big/data/2").header_offset > 1 << 32  # from its zip64 field


def test_a_zip_not_laid_out_as_torch_writes_it_is_refused(tmp_path: Path) -> None:
    """Where a CRC's place is not certain (a compressed record, no zip at all), zipcrc says so,
    and odirect's caller saves the plain way rather than set a field it is not sure of."""
    deflated = tmp_path / "deflated.zip"
    with zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("m/data.pkl", b"x" * 1000)
    (tmp_path / "junk").write_bytes(b"PK" * 100)
    for path, why in ((deflated, "compressed"), (tmp_path / "junk", "no end of central")):
        fd = os.open(path, os.O_RDONLY)
        try:
            with pytest.raises(zipcrc.BadZip, match=why):
                zipcrc.records(fd)
        finally:
            os.close(fd)


def test_this_torch_has_what_direct_writes_need() -> None:
    """On every torch of the stacks matrix (2.9 and the pin): the probe finds the options."""
    assert odirect.unavailable() is None, odirect.unavailable()


def test_any_failure_of_the_direct_write_saves_the_plain_way_once_said(  # type: ignore[no-untyped-def]
    staged, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """torch 2.11 had no PyTorchFileReader.get_record_size, and its AttributeError killed every
    save: now an error the optimisation did not foresee turns it off for the process, in one
    line, and every file is saved the plain way."""
    original, views, arena = staged
    calls = []

    def broken(*args: Any) -> int:
        calls.append(args)
        raise AttributeError("'PyTorchFileReader' object has no attribute 'get_record_size'")

    monkeypatch.setattr(saving, "_direct_off", [])
    monkeypatch.setattr(odirect, "save", broken)
    for name in ("model.pt", "trainer.pt"):
        saving._save(views, tmp_path / name, arena)
        check_loads(tmp_path / name, original)
    assert len(calls) == 1  # decided once: the second file did not try again
    err = capfd.readouterr().err.splitlines()
    (line,) = [x for x in err if "direct writes off" in x]
    assert "get_record_size" in line and torch.__version__ in line


def test_a_torch_without_the_save_options_saves_the_plain_way(  # type: ignore[no-untyped-def]
    staged, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    original, views, arena = staged
    monkeypatch.setattr(saving, "_direct_off", [])
    monkeypatch.setattr(odirect, "unavailable", lambda: "torch 2.6 has no config")
    with pytest.raises(odirect.Unsuitable, match="has no config"):
        odirect.save(views, tmp_path / "direct.pt", arena)
    for name in ("model.pt", "trainer.pt"):
        saving._save(views, tmp_path / name, arena)
        check_loads(tmp_path / name, original)
        assert record_offsets(tmp_path / name)[0] % staging.ALIGN  # torch.save's layout
    err = capfd.readouterr().err
    assert err.count("direct writes off") == 1 and "torch 2.6 has no config" in err
