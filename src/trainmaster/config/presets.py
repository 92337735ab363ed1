"""Job presets for `trainmaster init --preset NAME` (docs/architecture.md 3.2).

Each preset is a set of overrides of the defaults in `config/job.py`, nothing more, so that the
defaults stay the one place where a value is declared.
"""

from __future__ import annotations

from typing import Any

# AWS's documentation account id: presets name images with it; a real launch refuses it.
EXAMPLE_ACCOUNT = "123456789012"

JOB_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # The demo's shape: bert-tiny on the built-in corpus, 2 local nodes x 1 worker, c10d.
    "local-cpu": {
        "job": {"name": "demo", "backend": "local", "nnodes": 2, "nproc_per_node": 1},
        "rendezvous": {"backend": "c10d"},
        "model": {"preset": "bert-tiny"},
        "data": {"dataset": "pydoc", "seq_len": 128, "max_pred": 20},
        "train": {
            "device": "cpu",
            "precision": "fp32",
            "batch_size": 16,
            "global_batch_size": 32,
            "lr": 1e-3,
            "warmup_steps": 20,
            "max_steps": 200,
            "checkpoint_every": 50,
        },
    },
    # The AWS tutorial's job: 2 x trn1.32xlarge, 32 workers each, micro-batch 16, bf16, AdamW
    # lr 4e-4, 2000 warm-up of 28,125 steps, the NVIDIA wikicorpus shards. The tutorial's etcd
    # rendezvous needs etcd's v2 API, which etcd 3.6 removed (pytorch/pytorch issues 158326,
    # 170707), so the preset uses c10d through the Volcano svc plugin's stable name of pod 0
    # (backends/kubernetes/volcano.py); `--set rendezvous.backend=etcd` is the tutorial's way, against
    # etcd-server.trainmaster-etcd.svc:2379 (etcd 3.5 with --enable-v2).
    # The tutorial passed micro-batch 16 and accumulation 32 to 64 workers, a global batch of
    # 32,768 (twice the 1-node recipe's 16,384, unnoticed). Here the global batch is what is
    # written down, and the accumulation (32 on 2 nodes) follows from it.
    "trn1-bert-large": {
        "job": {
            "name": "bert-large-trn1",
            "backend": "kubernetes",
            "nnodes": 2,
            "nproc_per_node": 32,
            "storage": "/data",
        },
        "rendezvous": {"backend": "c10d"},
        "model": {"preset": "bert-large"},
        "data": {
            "dataset": "bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128",
            "seq_len": 128,
            "max_pred": 20,
        },
        "train": {
            "device": "xla",
            "precision": "bf16",
            "batch_size": 16,
            "global_batch_size": 32768,
            "optimizer": "adamw",
            "lr": 4e-4,
            "warmup_steps": 2000,
            "max_steps": 28125,
            "checkpoint_every": 500,
            "keep_checkpoints": 3,
            "compile": True,
            "cacheset": "bert-large",
        },
        # 123456789012 is AWS's documentation account: put yours (`cluster plan` prints the URI).
        "kubernetes": {
            "instance_type": "trn1.32xlarge",
            "queue": "trainmaster",
            "image": f"{EXAMPLE_ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com/trainmaster:0.1.0-neuron",
        },
        "cluster": {"name": "trainmaster-trn1", "region": "us-west-2"},
    },
    # The same model on 2 x trn2.48xlarge through TorchNeuron (native PyTorch, device "neuron";
    # a public beta as of Neuron 2.34.0, Trn2/Trn3 only: cluster/versions.py): 64 workers per node
    # (16 Trainium2 x 4 logical NeuronCores at LNC=2, catalog.py), DDP, bf16 autocast. The global
    # batch is the trn1 preset's, so the accumulation is 16 on 2 nodes. Region us-east-2: one
    # that offers trn2.48xlarge in cfn-lint 1.58.0's EC2 data (instancetype_enum.json), and
    # `cluster plan` looks up the zones that offer it.
    "trn2-bert-large": {
        "job": {
            "name": "bert-large-trn2",
            "backend": "kubernetes",
            "nnodes": 2,
            "nproc_per_node": 64,
            "storage": "/data",
        },
        "rendezvous": {"backend": "c10d"},
        "model": {"preset": "bert-large"},
        "data": {
            "dataset": "bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128",
            "seq_len": 128,
            "max_pred": 20,
        },
        "train": {
            "device": "neuron",
            "precision": "bf16",
            "batch_size": 16,
            "global_batch_size": 32768,
            "optimizer": "adamw",
            "lr": 4e-4,
            "warmup_steps": 2000,
            "max_steps": 28125,
            "checkpoint_every": 500,
            "keep_checkpoints": 3,
            "compile": True,
            "cacheset": "bert-large-trn2",
        },
        "kubernetes": {
            "instance_type": "trn2.48xlarge",
            "queue": "trainmaster",
            "image": f"{EXAMPLE_ACCOUNT}.dkr.ecr.us-east-2.amazonaws.com/trainmaster:0.1.0-torchneuron",
        },
        "cluster": {"name": "trainmaster-trn2", "region": "us-east-2"},
    },
    # The same model on 2 x p5.48xlarge (8 x H100 each), NCCL, c10d through the job's service.
    "p5-bert-large": {
        "job": {
            "name": "bert-large-p5",
            "backend": "kubernetes",
            "nnodes": 2,
            "nproc_per_node": 8,
            "storage": "/data",
        },
        "rendezvous": {"backend": "c10d"},
        "model": {"preset": "bert-large"},
        "data": {
            "dataset": "bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128",
            "seq_len": 128,
            "max_pred": 20,
        },
        "train": {
            "device": "cuda",
            "precision": "bf16",
            "batch_size": 256,
            "global_batch_size": 16384,
            "optimizer": "adamw",
            "lr": 4e-4,
            "warmup_steps": 2000,
            "max_steps": 28125,
            "checkpoint_every": 500,
            "keep_checkpoints": 3,
            "cacheset": "bert-large-p5",
        },
        "kubernetes": {
            "instance_type": "p5.48xlarge",
            "queue": "trainmaster",
            "image": f"{EXAMPLE_ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/trainmaster:0.1.0-cuda",
        },
        "cluster": {"name": "trainmaster-p5", "region": "us-east-1"},
    },
}
