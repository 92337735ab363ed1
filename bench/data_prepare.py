"""Throughput of `data prepare` beside NVIDIA's logic, per core and on 2 workers, in one run.

    python bench/data_prepare.py [--repeat 5] [--scale 16] [--train-vocab]

Same corpus (the built-in one, fed --scale times as a text file; 16 by default, --scale 1
uses the built-in corpus itself), same vocabulary (given, not trained, unless
--train-vocab), seq 128, max_pred 20, dupe factor 5, 8 shards. Each round runs, back to back:
the reference (bench/reference_prepare.py: the algorithm of NVIDIA's
create_pretraining_data.py, tokenise-mask-write in one process), `data prepare` with 1
worker, and with 2 workers (this process and one forked worker); the figures are medians
over rounds, so a busy shared machine slows all three alike. The load average is printed
beside them, and CPU seconds (this process and its forked workers) beside wall seconds:
tokens per CPU-second is the per-core figure a busy machine disturbs least;
cpu_2_workers_over_1 is the work 2 workers add, and minor_faults (medians) the part of it
that is a forked worker's start (its fresh heap, copy-on-write pages). input_tokens counts
the corpus's WordPiece tokens once.

Per-stage times: the reference's read/tokenise/pairs_mask/shuffle_write (wall), and ours'
wall stages (read: stat and cut the input, vocab, examples, write) with, under
"examples/..." and "write/...", the workers' CPU seconds per step summed over slices and
shards (read, sentences, tokenise, pairs_mask, save; gather, expand, hdf5: interleaved, an
HDF5 chunk at a time).

Also times tokenisation alone, ours (trainmaster.data.wordpiece.Encoder) vs HF tokenizers'
encode_batch_fast on the same sentences, one thread: why the product does not call HF per
sentence. Prints one JSON object; no assertions (numbers depend on the machine).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import emit, load, machine  # noqa: E402
from reference_prepare import reference_prepare  # noqa: E402
from trainmaster.data.corpus import pydoc_documents, read_corpus, split_sentences  # noqa: E402
from trainmaster.data.prepare import prepare  # noqa: E402
from trainmaster.data.vocab import hf_tokenizer, load_vocab  # noqa: E402
from trainmaster.data.wordpiece import Encoder  # noqa: E402

SETTINGS: dict[str, Any] = {"seq_len": 128, "max_pred": 20, "dupe_factor": 5, "shards": 8}


def _cpu() -> float:
    """CPU seconds of this process (all threads) and of its reaped children (forked workers):
    on a busy shared machine, tokens per CPU-second is the steadier per-core figure."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _faults() -> int:
    """Minor page faults, this process and its reaped children: what a forked worker costs
    beyond its share of the work (~6 us each here, its fresh heap and copy-on-write pages)."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_minflt + kids.ru_minflt


def _ours(tmp: Path, source: dict[str, Any], workers: int, vocab: Path | None) -> dict[str, Any]:
    """A new dataset each time, removed untimed: --overwrite would also time deleting the
    last round's shards (20-40 ms here, serial after the swap), which the reference, writing
    its files over the old ones, does not do."""
    c0, f0 = _cpu(), _faults()
    r = prepare(output=tmp / f"ours{workers}", workers=workers, vocab=vocab, **source, **SETTINGS)
    c1, f1 = _cpu(), _faults()
    shutil.rmtree(r.output)
    return {
        "seconds": r.seconds,
        "cpu_seconds": c1 - c0,
        "minor_faults": f1 - f0,
        "tokens": r.input_tokens,
        "examples": r.examples,
        "stages": r.timings,
    }


def _reference(tmp: Path, source: dict[str, Any], vocab: Path) -> dict[str, Any]:
    t0, c0 = time.monotonic(), _cpu()
    docs = read_corpus([Path(p) for p in source.get("inputs", [])], source.get("builtin")).documents
    stages = {"read": time.monotonic() - t0}
    tokens = reference_prepare(
        docs,
        load_vocab(vocab),
        tmp / "ref",
        seq_len=128,
        max_pred=20,
        dupe_factor=5,
        shards=8,
        stages=stages,
    )
    seconds = time.monotonic() - t0
    return {
        "seconds": seconds,
        "cpu_seconds": _cpu() - c0,
        "tokens": tokens,
        "stages": {**stages, "total": seconds},
    }


def _tokenise_only(source: dict[str, Any], vocab: Path, repeat: int) -> dict[str, Any]:
    docs = read_corpus([Path(p) for p in source.get("inputs", [])], source.get("builtin")).documents
    sentences = [s for doc in docs for line in doc for s in split_sentences(line)]
    voc = load_vocab(vocab)
    hf = hf_tokenizer(voc, True)
    ours_s, hf_s = [], []
    for _ in range(repeat):
        enc = Encoder(voc, True)  # a fresh word cache: the first chunk's cost included
        t0 = time.monotonic()
        flat, _ = enc.encode(sentences)
        ours_s.append(time.monotonic() - t0)
        t0 = time.monotonic()
        n = sum(len(e.ids) for e in hf.encode_batch_fast(sentences, add_special_tokens=False))
        hf_s.append(time.monotonic() - t0)
    assert n == len(flat), "the two tokenisers disagree on the token count"
    ours, ref = statistics.median(ours_s), statistics.median(hf_s)
    return {
        "tokens": n,
        "ours_tokens_per_s": round(n / ours),
        "hf_encode_batch_tokens_per_s": round(n / ref),
        "ratio": round(ref / ours, 2),
    }


def _fresh_reference(tmp: Path, source: dict[str, Any], vocab: Path) -> dict[str, Any]:
    """The reference in a new interpreter, as NVIDIA's script runs (its start is not timed).

    Not in this process: its freed memory (Python lists of the whole corpus) stays scattered
    through this heap, and a worker forked from it afterwards wanders over those pages,
    copying each one it writes: `data prepare` with 2 workers took 41k page faults instead of
    12k (~0.2 s of CPU), a cost of the bench, not of the tool."""
    where = {k: [str(p) for p in v] if k == "inputs" else v for k, v in source.items()}
    cmd = [sys.executable, __file__, "--reference", str(tmp), json.dumps(where), str(vocab)]
    done = subprocess.run(cmd, capture_output=True)
    if done.returncode:
        sys.exit(f"the reference failed:\n{done.stderr.decode(errors='replace')}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main() -> None:
    if sys.argv[1:2] == ["--reference"]:  # _fresh_reference's child: tmp, source, vocab
        tmp, source, vocab = sys.argv[2:5]
        print(json.dumps(_reference(Path(tmp), json.loads(source), Path(vocab))))
        return
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeat", type=int, default=5, help="rounds (each runs all three; medians)")
    ap.add_argument("--scale", type=int, default=16, help="feed the corpus this many times")
    ap.add_argument(
        "--train-vocab",
        action="store_true",
        help="ours also trains the vocabulary (the reference is always given it)",
    )
    args = ap.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per process, on every side
    rounds: dict[str, list[dict[str, Any]]] = {"reference": [], "ours_1": [], "ours_2": []}
    load_before = load()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        source: dict[str, Any] = {"builtin": "pydoc"}
        if args.scale > 1:
            text = tmp / "pydoc.txt"
            docs = pydoc_documents() * args.scale
            text.write_text("\n\n".join("\n".join(doc) for doc in docs) + "\n", encoding="utf-8")
            source = {"inputs": [text]}
        prepare(
            output=tmp / "warmup", workers=1, shards=1, dupe_factor=1, seq_len=128, builtin="pydoc"
        )
        vocab = tmp / "vocab.txt"
        vocab.write_bytes((tmp / "warmup" / "vocab.txt").read_bytes())
        given = None if args.train_vocab else vocab
        for _ in range(args.repeat):
            rounds["reference"].append(_fresh_reference(tmp, source, vocab))
            rounds["ours_1"].append(_ours(tmp, source, 1, given))
            rounds["ours_2"].append(_ours(tmp, source, 2, given))
        tokenise = _tokenise_only(source, vocab, args.repeat)
    load_after = load()
    tokens = rounds["ours_1"][0]["tokens"]
    assert all(r["tokens"] == tokens for rs in rounds.values() for r in rs), "token counts differ"
    sec = {k: statistics.median(r["seconds"] for r in rs) for k, rs in rounds.items()}
    cpu = {k: statistics.median(r["cpu_seconds"] for r in rs) for k, rs in rounds.items()}
    rate = {k: round(tokens / s) for k, s in sec.items()}
    stages = {
        name: {k: round(statistics.median(r["stages"][k] for r in rs), 4) for k in rs[0]["stages"]}
        for name, rs in rounds.items()
    }
    steps = {k: v for k, v in stages["ours_1"].items() if "/" in k}
    share = {k: round(v / sum(steps.values()), 3) for k, v in steps.items()}
    emit(
        {
            "bench": "data_prepare",
            "corpus": "builtin:pydoc",
            "scale": args.scale,
            **SETTINGS,
            "vocab": "trained by ours, given to the reference" if args.train_vocab else "given",
            "rounds": args.repeat,
            "input_tokens": tokens,
            "examples": rounds["ours_1"][0]["examples"],
            "seconds": {k: round(s, 4) for k, s in sec.items()},
            "input_tokens_per_s": rate,
            "cpu_seconds": {k: round(s, 4) for k, s in cpu.items()},
            "input_tokens_per_cpu_s": {k: round(tokens / s) for k, s in cpu.items()},
            "ratio_vs_reference_per_core": round(sec["reference"] / sec["ours_1"], 2),
            "ratio_vs_reference_per_cpu_s": round(cpu["reference"] / cpu["ours_1"], 2),
            "ratio_vs_reference_2_workers": round(sec["reference"] / sec["ours_2"], 2),
            "speedup_2_workers": round(sec["ours_1"] / sec["ours_2"], 2),
            # CPU seconds of 2 workers over 1: the work the split adds (1.0: none)
            "cpu_2_workers_over_1": round(cpu["ours_2"] / cpu["ours_1"], 2),
            "minor_faults": {
                k: statistics.median(r["minor_faults"] for r in rounds[k])
                for k in ("ours_1", "ours_2")
            },
            "stages_s": stages,
            "ours_1_step_share": share,
            "tokenise_only": tokenise,
            "cores": len(os.sched_getaffinity(0)),
            "load_avg_before": load_before,
            "load_avg_after": load_after,
            "machine": machine(),
        },
        None,
    )


if __name__ == "__main__":
    main()
