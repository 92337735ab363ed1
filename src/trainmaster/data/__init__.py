"""The data stage: text -> BERT pretraining shards (HDF5), and checks of any such shards.

    from trainmaster.data import prepare, verify, inspect
    result = prepare(builtin="pydoc", output="datasets/pydoc", seq_len=128)
    assert verify(result.output) == []
    print(inspect(result.output).mask_ratio)

This package never imports torch, transformers or the operator side (launch, cluster,
monitor, cli): the trainer and the CLI both use it.

Modules, in the order `data prepare` uses them:
  prepare    the whole run: settings, stages, output (PrepareResult)
  corpus     input text: files, folders, .gz, the built-in corpus
  slices     the input cut into slices the workers read themselves
  vocab      WordPiece vocabularies: load vocab.txt, or train one
  wordscan   the words of normalised text as arrays
  wordpiece  sentences -> WordPiece ids
  examples   pretraining examples as in create_pretraining_data.py, vectorised
  share      a stage's tasks shared between this process and forked workers
  pool       what each worker does in the two stages
  shards     the HDF5 shard format: names, keys, writing and reading
  output     the output folder: temporaries, the swap into place
  progress   progress on stderr
  rows       the shard format's row rules, as whole-block checks
  verify     `data verify`: every rule, every violation
  stats      `data inspect`: numbers and readable examples
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
