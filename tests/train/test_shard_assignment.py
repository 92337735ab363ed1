"""Shard assignment at 1,024 workers: what train/dataset.py's docstring promises, checked for
every rank and round (pure arithmetic on file names: no shard is opened, no torch).

Promises (dataset.py, module docstring and file_for / next_shard / check_dataset):
  - per epoch the sorted file list is shuffled with random.Random(seed + epoch), and in round f
    rank r reads files[(f * world + r) % n]; the order is the same for every rank;
  - an epoch has ceil(n / world) rounds, and next_shard walks them in order, then the next epoch;
  - in a round no two ranks read the same file (this needs n >= world, which check_dataset
    enforces before any worker starts);
  - over an epoch every shard is read; with n a multiple of world exactly once, otherwise the
    last round wraps around and rounds x world - n shards are read a second time (never twice
    in one round);
  - every epoch is reshuffled.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from trainmaster.errors import DataError
from trainmaster.train import dataset
from trainmaster.train.dataset import Position

WORLD = 1024  # e.g. 32 trn1.32xlarge nodes x 32 NeuronCores
SEED = 12345


def shards(n: int) -> list[Path]:
    """Shard names in the order the trainer lists them (natural order, as list_shards sorts)."""
    return [Path(f"wiki_training_{k}.hdf5") for k in range(n)]


def epoch_reads(files: list[Path], epoch: int) -> list[list[Path]]:
    """reads[round][rank]: the file each rank opens in each round of one epoch."""
    rounds = dataset.rounds_per_epoch(len(files), WORLD)
    return [
        [
            dataset.file_for(files, seed=SEED, epoch=epoch, rnd=r, rank=k, world=WORLD)
            for k in range(WORLD)
        ]
        for r in range(rounds)
    ]


@pytest.mark.parametrize(
    "n",
    [
        WORLD,  # as many shards as workers
        2 * WORLD,  # a multiple
        WORLD + 1,  # one more: the second round wraps almost entirely
        1536,  # more than the workers, not a multiple
    ],
)
def test_every_rank_reads_its_own_file_every_round_and_every_shard_is_read(n: int) -> None:
    files = shards(n)
    reads = epoch_reads(files, epoch=0)
    rounds = -(-n // WORLD)
    assert len(reads) == rounds == dataset.rounds_per_epoch(n, WORLD)
    for r, names in enumerate(reads):
        assert len(set(names)) == WORLD, f"round {r}: {WORLD - len(set(names))} files read twice"
    counts = Counter(p for names in reads for p in names)
    assert set(counts) == set(files)  # every shard is read in the epoch
    assert sum(counts.values()) == rounds * WORLD
    twice = [p for p, c in counts.items() if c == 2]
    assert max(counts.values()) <= 2 and len(twice) == rounds * WORLD - n
    if n % WORLD == 0:
        assert not twice  # a multiple of the world size: each shard exactly once
    # the documented formula, the same for every rank: one shuffle per epoch, rank r of round f
    # takes position f * world + r
    order = list(files)
    random.Random(SEED + 0).shuffle(order)
    assert all(
        reads[r][k] == order[(r * WORLD + k) % n] for r in range(rounds) for k in range(WORLD)
    )


@pytest.mark.parametrize("n", [WORLD, 1536])
def test_next_shard_walks_the_rounds_then_the_next_epoch(n: int) -> None:
    pos, seen = Position(), []
    for _ in range(dataset.rounds_per_epoch(n, WORLD)):
        seen.append((pos.epoch, pos.round))
        pos = dataset.next_shard(Position(pos.epoch, pos.round, 37), n, WORLD)
    assert seen == [(0, r) for r in range(dataset.rounds_per_epoch(n, WORLD))]
    assert pos == Position(1, 0, 0)  # a new shard starts at offset 0


def test_each_epoch_is_reshuffled_and_still_disjoint() -> None:
    files = shards(WORLD)
    first, second = epoch_reads(files, 0)[0], epoch_reads(files, 1)[0]
    assert len(set(second)) == WORLD and set(second) == set(files)
    moved = sum(a != b for a, b in zip(first, second, strict=True))
    assert moved > WORLD // 2  # most ranks get another shard in the next epoch


def test_fewer_shards_than_workers_is_refused_before_any_worker_starts(tmp_path: Path) -> None:
    """The no-sharing guarantee needs n >= world; check_dataset says so, from the file names
    alone (no header read), and lists them in natural order (…_2 before …_10)."""
    for k in reversed(range(WORLD - 1)):
        (tmp_path / f"wiki_training_{k}.hdf5").touch()
    assert dataset.list_files(tmp_path) == [tmp_path / p.name for p in shards(WORLD - 1)]
    with pytest.raises(DataError, match=rf"1023 shards for {WORLD} workers: .*at least {WORLD}"):
        dataset.check_dataset(tmp_path, seq_len=128, max_pred=20, world=WORLD, batch_size=16)
