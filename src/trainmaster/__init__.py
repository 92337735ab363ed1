"""trainmaster: multi-node BERT pretraining on Kubernetes accelerator clusters and on one machine."""

__version__ = "0.1.0"
