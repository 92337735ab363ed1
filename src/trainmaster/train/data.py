"""The batch iterator: one shard at a time per rank, the next one loaded in the background.

Shard loading (gzip decode, int64 casts, label building, vocabulary check) runs on a single
background thread while the current shard trains, as the Neuron tutorial's loader does. The
iterator may run ahead of training (the XLA device loader prefetches), so the position that
goes into a checkpoint is the consumer's: the loop calls `consumed()` once per micro-batch it
has trained on, and `position` is where the next unconsumed micro-batch starts.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from trainmaster.train import dataset
from trainmaster.train.dataset import Position


class ShardLoader:
    def __init__(
        self,
        files: list[Path],
        *,
        rank: int,
        world: int,
        batch_size: int,
        seed: int,
        vocab_size: int,
        start: Position,
        first_shard: dict[str, np.ndarray] | None = None,
    ) -> None:
        self.files, self.rank, self.world = files, rank, world
        self.batch_size, self.seed, self.vocab_size = batch_size, seed, vocab_size
        self.start = start
        self.position = start
        self._first = first_shard
        self._pending: collections.deque[Position] = collections.deque()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-prefetch")
        self.shard_log: list[tuple[Position, str]] = []  # (position, file) of every shard opened

    def file_at(self, pos: Position) -> Path:
        return dataset.file_for(
            self.files,
            seed=self.seed,
            epoch=pos.epoch,
            rnd=pos.round,
            rank=self.rank,
            world=self.world,
        )

    def _load(self, pos: Position) -> dict[str, np.ndarray]:
        return dataset.load_shard(self.file_at(pos), self.vocab_size)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        pos = self.start
        if self._first is not None:
            shard, self._first = self._first, None
        else:
            shard = self._load(pos)
        while True:
            upcoming = dataset.next_shard(pos, len(self.files), self.world)
            future: Future[dict[str, np.ndarray]] = self._pool.submit(self._load, upcoming)
            self.shard_log.append((pos, self.file_at(pos).name))
            tensors = {k: torch.from_numpy(v) for k, v in shard.items()}
            n = len(shard["input_ids"])
            order = torch.from_numpy(
                dataset.sample_order(
                    n, seed=self.seed, epoch=pos.epoch, rnd=pos.round, rank=self.rank
                )
            )
            offset = pos.offset
            while offset + self.batch_size <= n:
                idx = order[offset : offset + self.batch_size]
                offset += self.batch_size
                with self._lock:
                    self._pending.append(Position(pos.epoch, pos.round, offset))
                yield {k: v.index_select(0, idx) for k, v in tensors.items()}
            shard, pos = future.result(), upcoming

    def consumed(self) -> None:
        """The loop trained on the oldest micro-batch handed out: advance the saved position."""
        with self._lock:
            self.position = self._pending.popleft()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
