# The README's two commands: `make demo` and `make test`. Each sets up a fresh machine by itself:
# .venv when missing, torch==2.13.0 first (a CPU wheel; an unpinned torch would pull a CUDA
# build of several GB), then the project with its test extras, then etcd for the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.trainmaster-installed
TORCH := torch==2.13.0
DEMO_DIR ?= demo-run

.PHONY: demo test test-xla lint unit install system-deps torchx-venv clean

install: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

# Debian's etcd (3.4, serves the v2 API that torch's etcd rendezvous needs with --enable-v2).
# Also openssl (the local control plane's certificates) and iproute2 (job.network = netns).
system-deps:
	@if command -v etcd >/dev/null 2>&1 && command -v openssl >/dev/null 2>&1 && command -v ip >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing etcd-server, openssl, iproute2 (apt)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server openssl iproute2 >/dev/null; \
	else echo "note: etcd, openssl or ip not found; the tests that need them will be skipped (sudo apt-get install -y etcd-server openssl iproute2)"; fi

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy
	$(BIN)/lint-imports

# TorchX 0.7.0 in its own environment (it pins urllib3<1.27): the export tests run its
# Kubernetes scheduler's dry run on the component `trainmaster export torchx` writes.
TORCHX_VENV ?= .venv-torchx
torchx-venv: $(TORCHX_VENV)/bin/torchx
$(TORCHX_VENV)/bin/torchx:
	$(PYTHON) -m venv $(TORCHX_VENV)
	$(TORCHX_VENV)/bin/python -m pip install --quiet torchx==0.7.0 kubernetes==25.3.0

# The real control plane (kube-apiserver, Volcano, kwok; controlplane/README.md) is built once
# into ~/.cache/trainmaster-kube; the tests marked `kube` start it on a free loopback port.
include controlplane/controlplane.mk

unit: $(STAMP) system-deps torchx-venv kube-build
	$(BIN)/pytest -q

test: lint unit

# The whole local flow on the built-in corpus: shards, a 2-node job with c10d rendezvous,
# checkpoints, metrics, TensorBoard events, and a summary with the commands to look further.
demo: $(STAMP)
	rm -rf $(DEMO_DIR)
	$(BIN)/trainmaster demo --dir $(DEMO_DIR)

# Opt-in: the XLA (Trainium) code path on the CPU, in its own venv (torch_xla pins its torch;
# ~7 GB). See docs/architecture.md 4, "The XLA path on a CPU".
XLA_VENV ?= .venv-xla
test-xla:
	[ -x $(XLA_VENV)/bin/python ] || $(PYTHON) -m venv $(XLA_VENV)
	$(XLA_VENV)/bin/python -m pip install --quiet torch==2.9.0 torch_xla==2.9.0
	$(XLA_VENV)/bin/python -m pip install --quiet -e ".[test]"
	PJRT_DEVICE=CPU $(XLA_VENV)/bin/pytest -q tests/train/test_xla.py

clean:
	rm -rf $(VENV) $(XLA_VENV) $(TORCHX_VENV) $(DEMO_DIR) .pytest_cache .mypy_cache .ruff_cache
