"""What every backend runs: the one torchrun command line (torchrun.py) and the entry shim (entry.py)."""
