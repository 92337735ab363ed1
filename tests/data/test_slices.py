"""Workers read slices of the input themselves: the slices cover the text exactly once, cut
only at line starts (at blank lines where there are any), and give the sentences and
documents that reading the whole file gives."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.data.helpers import write_docs
from trainmaster.data.corpus import (
    document_ids,
    documents_from_text,
    pydoc_documents,
    sentence_lines,
    split_sentences,
)
from trainmaster.data.prepare import prepare
from trainmaster.data.slices import boundary, plan, read_slice
from trainmaster.data.verify import verify
from trainmaster.data.vocab import load_vocab
from trainmaster.data.wordpiece import Encoder
from trainmaster.errors import DataError


def _messy(tmp: Path) -> Path:
    """The built-in corpus three times, with CRLF and whitespace-only blank lines in places,
    a long document without blank lines, and non-ASCII text."""
    docs = pydoc_documents() * 3
    text = "\n\n".join("\n".join(d) for d in docs)
    text = text.replace("\n\n", "\r\n \t\r\n", 40)
    long_doc = "\n".join(
        f"Line {i} of one long document. It has two sentences." for i in range(9000)
    )
    path = tmp / "messy.txt"
    path.write_text("\ufeff" + text + "\n\n" + long_doc + "\n\nCafé — “déjà vu”.\n", "utf-8")
    return path


def _chunks(path: Path) -> tuple[list[str], int]:
    pieces, _, size = plan([path], None)
    return [t for p in pieces for _, t in read_slice(p, size)], len(pieces)


def test_slices_cover_the_text_once_and_cut_at_lines(tmp_path: Path) -> None:
    path = _messy(tmp_path)
    chunks, n = _chunks(path)
    assert n > 10 and len(chunks) >= n
    whole = path.read_bytes().decode("utf-8").removeprefix("\ufeff")
    assert "".join(chunks) == whole
    for c in chunks[1:]:
        at = whole.index(c)  # chunks are long and distinct enough to be found
        assert whole[at - 1] == "\n"


def test_boundaries_are_monotone() -> None:
    data = b"a\n\nb\nc\n \n" * 50 + b"x" * 500 + b"\nend\n"
    cuts = [boundary(data, o, 8) for o in range(len(data) + 1)]
    assert cuts == sorted(cuts) and cuts[0] == 0 and cuts[-1] == len(data)
    assert all(c == 0 or data[c - 1 : c] == b"\n" or c == len(data) for c in cuts)


def test_lines_and_documents_equal_reading_whole_documents(
    tmp_path: Path, pydoc_vocab: Path
) -> None:
    """sentence_lines + document_ids over a chunk = documents_from_text + split_sentences."""
    text = _messy(tmp_path).read_bytes().decode("utf-8").removeprefix("\ufeff")
    text += "\n\n\x01\x02\nA line of controls above stays in its document.\n"
    want = [[s for line in d for s in split_sentences(line)] for d in documents_from_text(text)]
    lines = sentence_lines(text)
    _, lengths = Encoder(load_vocab(pydoc_vocab), True).encode_text(lines)
    doc, nonblank = document_ids(lines, lengths)
    got: dict[int, list[str]] = {}
    for d, line in zip(doc.tolist(), lines.split("\n"), strict=True):
        if line.strip():
            got.setdefault(d, []).append(line.strip())
    assert list(got.values()) == want
    assert nonblank == sum(map(len, want))
    assert len(lengths) == len(lines.split("\n")) and np.all(lengths >= 0)


def test_a_bad_byte_deep_in_a_slice_names_its_file_offset(
    tmp_path: Path, pydoc_vocab: Path
) -> None:
    """Found by a worker process, reported as reading the whole file would."""
    path = write_docs(tmp_path / "big.txt", pydoc_documents(), repeat=4)
    data = path.read_bytes()
    at = len(data) * 3 // 4
    path.write_bytes(data[:at] + b"\0" + data[at:])
    with pytest.raises(DataError, match=f"big.txt: binary file \\(NUL byte at offset {at}\\)"):
        prepare([path], output=tmp_path / "out", vocab=pydoc_vocab, workers=2, shards=2)
    assert not (tmp_path / "out").exists()


SETTINGS: dict[str, Any] = {"seq_len": 64, "max_pred": 10, "dupe_factor": 1, "shards": 2}


def test_plain_gz_and_folder_inputs_read_the_same_text(tmp_path: Path, pydoc_vocab: Path) -> None:
    """A .gz file is one slice, cut into chunks by its worker; a folder is its files in order."""
    plain = write_docs(tmp_path / "a.txt", pydoc_documents())
    packed = tmp_path / "a.txt.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    docs = pydoc_documents()
    folder = tmp_path / "parts"
    folder.mkdir()
    write_docs(folder / "1.txt", docs[:40])
    write_docs(folder / "2.txt", docs[40:])
    results = [
        prepare([src], output=tmp_path / f"out{k}", vocab=pydoc_vocab, workers=w, **SETTINGS)
        for k, (src, w) in enumerate([(plain, 1), (packed, 2), (folder, 2)])
    ]
    assert len({r.input_tokens for r in results}) == 1
    for r in results:
        assert verify(r.output) == []


def test_files_give_the_same_bytes_for_any_workers(tmp_path: Path, pydoc_vocab: Path) -> None:
    folder = tmp_path / "text"
    folder.mkdir()
    write_docs(folder / "1.txt", pydoc_documents(), repeat=2)
    write_docs(folder / "2.txt", pydoc_documents()[::-1])
    one, two = (
        prepare(
            [folder], output=tmp_path / f"w{w}" / "set", vocab=pydoc_vocab, workers=w, **SETTINGS
        )
        for w in (1, 2)
    )
    assert two.workers == 2
    files = [{p.name: p.read_bytes() for p in r.output.iterdir()} for r in (one, two)]
    assert files[0] == files[1] and len(files[0]) == 4
