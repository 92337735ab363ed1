"""Progress: a rich bar with tokens/s on a terminal, plain "prepare:" lines otherwise."""

from __future__ import annotations

import io

from rich.console import Console

from trainmaster.data.progress import LineReporter, RichReporter


def test_rich_bar_shows_tokens_per_second() -> None:
    buf = io.StringIO()
    rep = RichReporter(Console(file=buf, force_terminal=True, width=120))
    rep.stage("making examples", 4)
    rep.advance(2, tokens=50_000)
    rep.stage("writing shards", 2)
    rep.advance(2)
    rep.close()
    text = buf.getvalue()
    assert "making examples" in text and "writing shards" in text
    assert "tokens/s" in text


def test_plain_lines_start_stages_and_are_throttled() -> None:
    buf = io.StringIO()
    rep = LineReporter(buf, every_s=3600)
    rep.stage("making examples", 10)
    for _ in range(10):
        rep.advance(1, tokens=1000)
    rep.stage("writing shards", 8)
    assert buf.getvalue().splitlines() == [
        "prepare: making examples (0/10)",
        "prepare: writing shards (0/8)",
    ]
    rep = LineReporter(buf := io.StringIO(), every_s=0)
    rep.stage("making examples", 2)
    rep.advance(1, tokens=1000)
    assert "prepare: making examples (1/2, " in buf.getvalue() and "tokens/s" in buf.getvalue()
