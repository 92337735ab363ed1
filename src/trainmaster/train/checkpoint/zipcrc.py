"""The CRC-32 fields of a checkpoint zip that odirect wrote without them.

odirect has torch.save write the zip's headers with crc32 off (the bytes are not there yet),
and a zip whose CRCs are 0 reads as corrupt to every reader that checks them (zipfile's
testzip, `unzip -t`, tools that repack checkpoints). So the writer computes each record's CRC
from the bytes it writes and sets it here, where torch.save would have put it:

- the central directory entry of the record (offset 16), which zipfile and unzip compare with
  the data;
- the data descriptor after the record's bytes (torch's miniz sets flag bit 3: its local
  header's CRC and sizes stay 0, as in torch.save's own files, and the descriptor carries
  them, with 8-byte sizes where the record needs zip64); a record without the flag (an empty
  one) has its CRC in the local header (offset 14) instead.

Zip64 extra fields carry sizes and offsets, never a CRC; they are read for the offsets of
records past 4 GiB. Anything not as described raises BadZip: a field we are not sure of is
left to the plain torch.save, never written wrong.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass


class BadZip(Exception):
    """Not the zip we know how to fill in (says why): odirect saves it the plain way."""


@dataclass(frozen=True)
class Record:
    name: str
    data: int  # where its bytes start in the file
    size: int
    fields: tuple[int, int]  # where its CRC goes: the central directory's, the local copy's


EOCD, EOCD64, LOCATOR = b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07"
CENTRAL, LOCAL, DESCRIPTOR = b"PK\x01\x02", b"PK\x03\x04", b"PK\x07\x08"
SATURATED = 0xFFFFFFFF  # a 32-bit field whose value is in the zip64 extra field


def records(fd: int) -> list[Record]:
    """Every record of the zip in `fd`, from its central directory (read, nothing written)."""
    start, count = _directory(fd)
    at, found = start, []
    table = _read(fd, at, os.fstat(fd).st_size - at)
    for _ in range(count):
        pos = at - start
        if table[pos : pos + 4] != CENTRAL:
            raise BadZip(f"no central directory entry at byte {at}")
        flags, method = struct.unpack_from("<HH", table, pos + 8)
        csize, usize, n, x, c = struct.unpack_from("<IIHHH", table, pos + 20)
        (local,) = struct.unpack_from("<I", table, pos + 42)
        name = table[pos + 46 : pos + 46 + n].decode()
        extra = table[pos + 46 + n : pos + 46 + n + x]
        usize, csize, local = _zip64(extra, [usize, csize, local], name)
        if method != 0 or csize != usize:
            raise BadZip(f"{name} is compressed")
        found.append(_locate(fd, name, flags, usize, local, at + 16))
        at += 46 + n + x + c
    return found


def set_crcs(fd: int, crcs: list[tuple[Record, int]]) -> None:
    for record, crc in crcs:
        for field in record.fields:
            os.pwrite(fd, struct.pack("<I", crc), field)


def _directory(fd: int) -> tuple[int, int]:
    """Where the central directory starts and how many entries it has. torch writes no zip
    comment, so the end record is the last 22 bytes; past 4 GiB its numbers are in zip64's."""
    end = os.fstat(fd).st_size - 22
    tail = _read(fd, end - 20, 42) if end >= 20 else b""
    if tail[20:24] != EOCD:
        raise BadZip("no end of central directory record at the end of the file")
    count, _, start = struct.unpack_from("<HII", tail, 20 + 10)
    if count != 0xFFFF and start != SATURATED:
        return start, count
    if tail[:4] != LOCATOR:
        raise BadZip("a saturated end record and no zip64 locator")
    (at,) = struct.unpack_from("<Q", tail, 8)
    record = _read(fd, at, 56)
    if record[:4] != EOCD64:
        raise BadZip(f"no zip64 end record at byte {at}")
    count, _, start = struct.unpack_from("<QQQ", record, 32)
    return start, count


def _zip64(extra: bytes, values: list[int], name: str) -> list[int]:
    """The saturated ones of (size, compressed size, local header offset) from the zip64
    extra field (id 1), which holds exactly those, in that order."""
    pos = 0
    while pos + 4 <= len(extra):
        kind, length = struct.unpack_from("<HH", extra, pos)
        if kind == 1:
            longs = iter(struct.unpack_from(f"<{length // 8}Q", extra, pos + 4))
            try:
                return [next(longs) if v == SATURATED else v for v in values]
            except StopIteration:
                raise BadZip(f"{name}: a zip64 field too short") from None
        pos += 4 + length
    if SATURATED in values:
        raise BadZip(f"{name}: a saturated size or offset and no zip64 field")
    return values


def _locate(fd: int, name: str, flags: int, size: int, local: int, central: int) -> Record:
    header = _read(fd, local, 30)
    n, x = struct.unpack_from("<HH", header, 26)
    if header[:4] != LOCAL or _read(fd, local + 30, n).decode() != name:
        raise BadZip(f"{name}: its local header is not at byte {local}")
    data = local + 30 + n + x
    if not flags & 8:  # no data descriptor: the local header holds the CRC
        return Record(name, data, size, (central, local + 14))
    after = _read(fd, data + size, 24)
    wide = struct.pack("<QQ", size, size)
    narrow = struct.pack("<II", size, size) if size < SATURATED else None
    if after[:4] != DESCRIPTOR or (after[8:16] != narrow and after[8:24] != wide):
        raise BadZip(f"{name}: no data descriptor after its {size} bytes")
    return Record(name, data, size, (central, data + size + 4))


def _read(fd: int, offset: int, length: int) -> bytes:
    data = os.pread(fd, length, offset)
    if len(data) != length:
        raise BadZip(f"the file ends before byte {offset + length}")
    return data
