"""What `data prepare` makes, as settings: the defaults are written here and nowhere else.

Standard library only, so the CLI shows these defaults in `--help` without importing numpy,
h5py or tokenizers (the rest of trainmaster.data is imported when a command runs).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmaster.errors import DataError

SHARDS = 8  # shard files a run writes (at least the number of training workers)

MIN_SEQ_LEN = 16


@dataclass(frozen=True)
class ExampleSettings:
    seq_len: int = 128
    max_pred: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 5
    whole_word_mask: bool = False
    seed: int = 12345

    def check(self) -> None:
        """Every bad value, as the option that sets it and what to do."""
        if self.seq_len < MIN_SEQ_LEN:
            raise DataError(
                f"must be at least {MIN_SEQ_LEN} (got {self.seq_len})", where="--seq-len"
            )
        if not 1 <= self.max_pred <= self.seq_len:
            raise DataError(
                f"must be between 1 and --seq-len ({self.seq_len}); got {self.max_pred}",
                where="--max-pred",
            )
        if not 0 < self.masked_lm_prob < 1:
            raise DataError(
                f"must be above 0 and below 1 (got {self.masked_lm_prob})", where="--masked-lm-prob"
            )
        if not 0 <= self.short_seq_prob <= 1:
            raise DataError(
                f"must be between 0 and 1 (got {self.short_seq_prob})", where="--short-seq-prob"
            )
        if self.dupe_factor < 1:
            raise DataError(f"must be at least 1 (got {self.dupe_factor})", where="--dupe-factor")
        if not 0 <= self.seed < 2**63:
            raise DataError(f"must be a non-negative integer (got {self.seed})", where="--seed")


DEFAULTS = ExampleSettings()
