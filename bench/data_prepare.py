"""Throughput of `data prepare` on the built-in corpus (seq_len 128, NVIDIA's settings).

    python bench/data_prepare.py [--repeat 3] [--scale 1]

Prints one JSON object: for 1 worker and for all cores, with and without training the
vocabulary, the median of --repeat runs. input_tokens counts the corpus's WordPiece tokens
once (not once per duplicate); examples_tokens counts the real tokens written. --scale N
feeds the corpus N times (as a text file) to see the steady state past fixed costs.
No assertions: numbers depend on the machine (DESIGN 4).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
from pathlib import Path
from typing import Any

from trainmaster.data import default_workers, prepare
from trainmaster.data.corpus import pydoc_documents


def _run(tmp: Path, tag: str, workers: int, source: dict[str, Any], vocab: Path | None) -> dict[str, Any]:
    out = tmp / tag
    r = prepare(output=out, workers=workers, seq_len=128, max_pred=20, dupe_factor=5, shards=8,
                vocab=vocab, overwrite=True, **source)
    real = 0
    import h5py

    for p in r.shards:
        with h5py.File(p) as f:
            real += int(f["input_mask"][:].sum())
    return {"seconds": r.seconds, "input_tokens": r.input_tokens, "examples": r.examples,
            "example_tokens": real, "timings": r.timings}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3, help="runs per configuration (median)")
    ap.add_argument("--scale", type=int, default=1, help="feed the corpus this many times")
    args = ap.parse_args()
    cores = default_workers()
    results = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.scale > 1:
            text = tmp / "pydoc.txt"
            docs = pydoc_documents() * args.scale
            text.write_text("\n\n".join("\n".join(doc) for doc in docs) + "\n", encoding="utf-8")
            source: dict[str, Any] = {"inputs": [text]}
        else:
            source = {"builtin": "pydoc"}
        vocab = tmp / "vocab.txt"
        prepare(output=tmp / "warmup", workers=1, shards=1, dupe_factor=1, seq_len=128,
                builtin="pydoc")
        vocab.write_bytes((tmp / "warmup" / "vocab.txt").read_bytes())
        for workers in sorted({1, cores}):
            for train in (True, False):
                runs = [_run(tmp, "set", workers, source, None if train else vocab)
                        for _ in range(args.repeat)]
                sec = statistics.median(r["seconds"] for r in runs)
                r0 = runs[0]
                stages = {k: round(statistics.median(r["timings"][k] for r in runs), 3)
                          for k in r0["timings"]}
                results.append({
                    "workers": workers, "train_vocab": train, "seconds": round(sec, 3),
                    "input_tokens": r0["input_tokens"], "examples": r0["examples"],
                    "input_tokens_per_s": round(r0["input_tokens"] / sec),
                    "per_core_input_tokens_per_s": round(r0["input_tokens"] / sec / workers),
                    "examples_per_s": round(r0["examples"] / sec),
                    "example_tokens_per_s": round(r0["example_tokens"] / sec),
                    "stages_s": stages,
                })
    print(json.dumps({
        "bench": "data_prepare", "corpus": "builtin:pydoc", "scale": args.scale,
        "seq_len": 128, "max_pred": 20, "dupe_factor": 5, "shards": 8, "cores": cores,
        "cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
        "results": results}, indent=2))


if __name__ == "__main__":
    main()
