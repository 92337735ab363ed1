"""`trainmaster data prepare | verify | inspect`: a thin layer over trainmaster.data."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trainmaster.cli.options import SetOpt, target
from trainmaster.data.settings import DEFAULTS, SHARDS
from trainmaster.errors import EXIT_FAILED, UserError
from trainmaster.storage import Storage, dataset_path

if TYPE_CHECKING:
    from trainmaster.data.verify import Violation

# trainmaster.data (numpy, h5py, tokenizers) is imported inside the commands: `trainmaster
# --help` and every other command must not pay ~0.5 s for it.
data_app = typer.Typer(
    help="Make, check and look at BERT pretraining shards.", no_args_is_help=True
)
out = Console()
PER_KIND = 10  # violation lines printed per rule; the total is always printed
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C

DirArg = Annotated[
    str,
    typer.Argument(
        metavar="DIR", help="A folder of shards, or a dataset name under STORAGE/datasets"
    ),
]


@data_app.command()
def prepare(
    ctx: typer.Context,
    inputs: Annotated[
        list[Path] | None,
        typer.Argument(
            metavar="[INPUT]...",
            help="Text files (.gz too) or folders of them: one sentence per "
            "line, documents separated by blank lines",
        ),
    ] = None,
    builtin: Annotated[
        str | None,
        typer.Option(help="Use a built-in corpus: pydoc (Python's reference docs, ~100k tokens)"),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(help="Folder to write the shards to (default: STORAGE/datasets/NAME)"),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(
            help="Dataset name under STORAGE/datasets (default 'pydoc' with --builtin pydoc)"
        ),
    ] = None,
    vocab: Annotated[
        Path | None,
        typer.Option(help="An existing BERT WordPiece vocab.txt (default: train one on the input)"),
    ] = None,
    vocab_size: Annotated[
        int | None, typer.Option(help="Size of the vocabulary to train (default 8192)")
    ] = None,
    lower_case: Annotated[
        bool,
        typer.Option(
            "--lower-case/--no-lower-case", help="Lower-case and strip accents, as bert-*-uncased"
        ),
    ] = True,
    seq_len: Annotated[
        int, typer.Option(help="Tokens per example, [CLS] and [SEP]s included")
    ] = DEFAULTS.seq_len,
    max_pred: Annotated[
        int, typer.Option(help="Most masked tokens per example")
    ] = DEFAULTS.max_pred,
    masked_lm_prob: Annotated[
        float, typer.Option(help="Fraction of tokens to mask")
    ] = DEFAULTS.masked_lm_prob,
    short_seq_prob: Annotated[
        float, typer.Option(help="Fraction of examples made shorter than --seq-len on purpose")
    ] = DEFAULTS.short_seq_prob,
    dupe_factor: Annotated[
        int, typer.Option(help="Passes over the input, each masked differently")
    ] = DEFAULTS.dupe_factor,
    whole_word_mask: Annotated[
        bool, typer.Option("--whole-word-mask", help="Mask all pieces of a word together")
    ] = DEFAULTS.whole_word_mask,
    shards: Annotated[
        int, typer.Option(help="Number of shard files (at least the number of training workers)")
    ] = SHARDS,
    workers: Annotated[
        int | None,
        typer.Option(
            help="Processes to use (default: all cores); the output does not depend on it"
        ),
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Random seed: the same seed and input give the same bytes")
    ] = DEFAULTS.seed,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Replace a dataset already in the output folder (once the new one is complete)",
        ),
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress, only the summary")
    ] = False,
    stall_timeout: Annotated[
        float | None,
        typer.Option(
            help="Seconds a worker may send nothing before the run ends as hung (default 600)"
        ),
    ] = None,
) -> None:
    """Turn text into shuffled, masked BERT pretraining shards (+ vocab.txt, dataset.json)."""
    storage = target(ctx).storage
    from trainmaster.data.prepare import prepare

    folder = _output(output, name, storage, builtin)
    try:
        result = prepare(
            inputs or [],
            output=folder,
            builtin=builtin,
            vocab=vocab,
            vocab_size=vocab_size,
            lower_case=lower_case,
            seq_len=seq_len,
            max_pred=max_pred,
            masked_lm_prob=masked_lm_prob,
            short_seq_prob=short_seq_prob,
            dupe_factor=dupe_factor,
            whole_word_mask=whole_word_mask,
            shards=shards,
            workers=workers,
            seed=seed,
            overwrite=overwrite,
            quiet=quiet,
            stall_timeout=stall_timeout,
        )
    except KeyboardInterrupt as exc:
        # typer turns Ctrl-C into a silent exit 130; say what became of the output.
        typer.echo(
            f"error: interrupted; nothing was written to {folder} (partial files removed)", err=True
        )
        raise typer.Exit(EXIT_INTERRUPTED) from exc
    t = result.timings
    table = Table(
        title=f"prepared {escape(str(result.output))}",
        title_justify="left",
        show_header=False,
        box=None,
    )
    table.add_row(
        "examples",
        f"{result.examples:,} in {len(result.shards)} shards "
        f"({min(result.counts):,}-{max(result.counts):,} each)",
    )
    table.add_row("input", f"{result.input_tokens:,} tokens, vocabulary of {result.vocab_size:,}")
    table.add_row(
        "speed",
        f"{result.tokens_per_s:,.0f} tokens/s with {result.workers} worker(s) "
        # The workers read their own slices, so reading is part of 'examples'.
        f"({result.seconds:.1f} s: vocab {t.get('vocab', 0):.1f}, "
        f"read+examples {t.get('examples', 0):.1f}, write "
        f"{t.get('write', 0):.1f})",
    )
    table.add_row("next", f"trainmaster data verify {escape(str(result.output))}")
    out.print(table)


def _output(
    output: Path | None, name: str | None, storage: str | None, builtin: str | None
) -> Path:
    if output is not None and name is not None:
        raise UserError("give --output DIR or --name NAME, not both")
    if output is not None:
        return output
    if name is None and builtin is None:
        raise UserError(
            "where to? pass --output DIR or --name NAME (a dataset under STORAGE/datasets)"
        )
    return Storage.at(storage).dataset_dir(name or str(builtin))


def _folder(directory: str, storage: str | None) -> Path:
    """An existing folder as given, else a dataset name under storage."""
    p = Path(directory).expanduser()
    return p if p.is_dir() else dataset_path(Storage.at(storage), directory)


@data_app.command()
def verify(
    ctx: typer.Context,
    directory: DirArg,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the verdict")] = False,
) -> None:
    """Check every row of every shard against the format; exit 1 when anything is wrong."""
    storage = target(ctx).storage
    from trainmaster.data.verify import verify

    folder = _folder(directory, storage)
    violations = verify(folder)
    if not violations:
        n = len(list(folder.glob("*_training_*.hdf5")))
        typer.echo(f"ok: {folder}: {n} shard(s), every row follows the format")
        return
    by_kind: dict[str, list[Violation]] = defaultdict(list)
    for v in violations:
        by_kind[v.kind].append(v)
    if not quiet:
        for kind, items in by_kind.items():
            for v in items[:PER_KIND]:
                typer.echo(str(v))
            if len(items) > PER_KIND:
                typer.echo(f"... and {len(items) - PER_KIND} more '{kind}' violation(s)")
    files = len({v.file for v in violations})
    typer.echo(
        f"FAILED: {len(violations)} violation(s) in {files} file(s) of {folder} "
        f"({', '.join(f'{k}: {len(i)}' for k, i in by_kind.items())})",
        err=True,
    )
    raise typer.Exit(EXIT_FAILED)


@data_app.command()
def inspect(
    ctx: typer.Context,
    directory: DirArg,
    examples: Annotated[int, typer.Option(help="Examples to show decoded")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print the statistics as JSON")] = False,
) -> None:
    """Statistics of a dataset (tokens, padding, masking, NSP balance) and decoded examples."""
    storage = target(ctx).storage
    from trainmaster.data.stats import inspect

    st = inspect(_folder(directory, storage), examples=examples)
    if as_json:
        typer.echo(json.dumps(st.to_json(), indent=2))
        return
    table = Table(title=escape(st.folder), title_justify="left", show_header=False, box=None)
    rows = [
        (
            "shards",
            f"{st.shards} ({min(st.per_shard.values()):,}-{max(st.per_shard.values()):,} "
            "examples each)",
        ),
        ("examples", f"{st.examples:,} x {st.seq_len} tokens, up to {st.max_pred} masked"),
        ("real tokens", f"{st.real_tokens:,} (padding {st.padding_ratio:.1%})"),
        (
            "masked",
            f"{st.masked:,} = {st.mask_ratio:.2%} of real tokens: {st.masked_as_mask:.1%} "
            f"[MASK], {st.masked_as_random:.1%} random, {st.masked_as_kept:.1%} kept",
        ),
        (
            "next sentence",
            f"{st.next_sentence_random:.1%} random, {1 - st.next_sentence_random:.1%} actual",
        ),
        ("ids read with", st.vocab),
    ]
    for key, value in rows:
        table.add_row(key, value)
    out.print(table)
    for ex in st.samples:
        kind = "random B" if ex.next_sentence_random else "actual B"
        out.print(f"\n[bold]{escape(ex.shard)} row {ex.row}[/bold] ({kind})")
        out.print(f"  input:    {escape(ex.text)}", soft_wrap=True)
        out.print(f"  original: {escape(ex.original)}", soft_wrap=True)


@data_app.command()
def stage(
    ctx: typer.Context,
    src: Annotated[
        str,
        typer.Argument(
            metavar="SRC", help="s3://bucket/prefix/, s3://.../data.tar, or a local folder"
        ),
    ],
    name: Annotated[str, typer.Option("--name", help="Dataset name: lands in MOUNT/datasets/NAME")],
    job: Annotated[
        str,
        typer.Option(
            "--job",
            metavar="FILE",
            help="Job file giving the cluster side (image, PVC, mount, namespace)",
        ),
    ],
    overrides: SetOpt = None,
    image: Annotated[
        str | None, typer.Option(help="Image of the stage pod (else kubernetes.image)")
    ] = None,
    no_sign_request: Annotated[
        bool, typer.Option(help="Public S3 data (the tutorial's bucket)")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the stage pod; create nothing")
    ] = False,
) -> None:
    """Copy a dataset onto the cluster's shared storage through a short-lived pod, verify it there."""
    where = target(ctx)
    from trainmaster import api
    from trainmaster.config import jobfile

    extra = [f'kubernetes.namespace="{where.namespace}"'] if where.namespace else []
    cfg = jobfile.load(job, [*(overrides or []), *extra])
    pod = api.stage_pod(cfg, src, name, image=image, public=no_sign_request)
    if dry_run:
        typer.echo(api.stage_yaml(pod), nl=False)
        return
    dest = api.run_stage(where, cfg, pod, on_line=lambda line: typer.echo(line))
    typer.echo(f"staged and verified: {dest}")
