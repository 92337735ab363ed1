"""The data stage: text -> BERT pretraining shards (HDF5), and checks of any such shards.

    from trainmaster.data.prepare import prepare
    from trainmaster.data.stats import inspect
    from trainmaster.data.verify import verify
    result = prepare(builtin="pydoc", output="datasets/pydoc", seq_len=128)
    assert verify(result.output) == []
    print(inspect(result.output).mask_ratio)

This package never imports torch, transformers or the operator side (launch, cluster,
monitor, cli): the trainer and the CLI both use it. This face imports nothing, so the CLI reads
the defaults (settings) without numpy, h5py or tokenizers; import what you use from its module.

Modules, in the order `data prepare` uses them:
  settings   what a run makes and the defaults, written once (stdlib only)
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
