"""The data stage: text -> BERT pretraining shards (HDF5), and checks of any such shards.

    from trainmaster.data import prepare, verify, inspect
    result = prepare(builtin="pydoc", output="datasets/pydoc", seq_len=128)
    assert verify(result.output) == []
    print(inspect(result.output).mask_ratio)

This package never imports torch, transformers or the operator side (launch, cluster,
monitor, cli): the trainer and the CLI both use it.
"""

from trainmaster.data.prepare import PrepareResult, default_workers, prepare
from trainmaster.data.stats import Example, Stats, inspect
from trainmaster.data.verify import Violation, verify
from trainmaster.data.vocab import Vocab, load_vocab, train_vocab

__all__ = [
    "Example",
    "PrepareResult",
    "Stats",
    "Violation",
    "Vocab",
    "default_workers",
    "inspect",
    "load_vocab",
    "prepare",
    "train_vocab",
    "verify",
]
