"""README's examples of the CLI, as written: the options it names exist, its commands run and
its quoted output is what the command prints."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT, run_cli

README = (ROOT / "README.md").read_text(encoding="utf-8")


def words(text: str) -> str:
    return " ".join(text.split())


def test_every_command_readme_follows_with_f_has_the_option() -> None:
    named = set(re.findall(r"`(?:trainmaster )?([a-z]+)(?: [\w.-]+)? -f`", README))
    assert "logs" in named  # README names `logs JOB -f`: the check reads what it should
    for command in sorted(named):
        shown = run_cli(command, "--help")
        assert "--follow" in shown.stdout, f"README says `{command} -f`; {command} has no -f"


def test_the_config_show_example_prints_what_readme_quotes() -> None:
    command = "trainmaster config show examples/trn1-bert-large.toml"
    block = README.split(f"$ {command}\n", 1)[1].split("\n$ ", 1)[0]
    quoted = [line for line in block.splitlines() if line.strip()]
    assert any("config hash" in line for line in quoted)
    shown = run_cli(*command.split()[1:], cwd=ROOT)
    assert shown.returncode == 0, shown.stderr
    printed = [words(line) for line in shown.stdout.splitlines()]
    assert [line for line in quoted if words(line) not in printed] == []


def test_the_data_prepare_example_runs(tmp_path: Path) -> None:
    row = next(line for line in README.splitlines() if line.startswith("| `data prepare` |"))
    command = re.findall(r"`(trainmaster data prepare [^`]+)`", row)[0]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    sentences = [f"the model reads sentence {i} of the corpus." for i in range(12)]
    (corpus / "a.txt").write_text("\n\n".join("\n".join(sentences) for _ in range(30)) + "\n")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "the", "model", "reads",
             "sentence", "of", "corpus", *map(str, range(12))]  # fmt: skip
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    args = command.split()[1:]
    result = run_cli("--storage", str(tmp_path / "st"), *args, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "st" / "datasets").glob("*/dataset.json"))
