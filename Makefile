# The README's two commands: `make demo` and `make test`. Each sets up a fresh machine by itself:
# .venv when missing, torch==2.13.0 first (PyPI's build; an unpinned torch would pull whatever is
# newest), then the project with its test extras, then etcd for the tests. `make test` also
# builds .venv-trn1, the trn1 stack (stacks/trn1.txt), and runs the stacks suite in it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.trainmaster-installed
TORCH_VERSION := 2.13.0
DEMO_DIR ?= demo-run
# Exits 1 unless the environment's torch is version $(1) (a local build label like +cpu is fine).
HAS_TORCH = -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$(1)')"

.PHONY: demo test check stacks lint unit install system-deps torchx-venv clean

install: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The version is checked, not only the import: a reused .venv keeps no other torch.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python $(call HAS_TORCH,$(TORCH_VERSION)) 2>/dev/null || $(BIN)/python -m pip install --quiet torch==$(TORCH_VERSION)
	$(BIN)/python -m pip install --quiet -e ".[test]"
	$(BIN)/python $(call HAS_TORCH,$(TORCH_VERSION)) || { echo "error: $(VENV) does not hold torch $(TORCH_VERSION)" >&2; exit 1; }
	touch $(STAMP)

# Debian's etcd (3.4, serves the v2 API that torch's etcd rendezvous needs with --enable-v2).
# Also openssl (the local control plane's certificates), iproute2 (job.network = netns),
# prometheus (2.42: scrapes a real job's /metrics in tests/monitor/test_prometheus.py), and what
# the local cluster's real nodes run on (controlplane/README.md): containerd, runc, the CNI
# plugins, iptables and conntrack (kube-proxy), buildah and debootstrap (the training image).
SYSTEM_TOOLS := etcd openssl ip prometheus containerd runc buildah debootstrap iptables conntrack
SYSTEM_PACKAGES := etcd-server openssl iproute2 prometheus containerd runc buildah debootstrap \
	containernetworking-plugins iptables conntrack
system-deps:
	@if (for t in $(SYSTEM_TOOLS); do command -v $$t >/dev/null 2>&1 || exit 1; done) \
		&& [ -x /usr/lib/cni/bridge ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing $(SYSTEM_PACKAGES) (apt)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(SYSTEM_PACKAGES) >/dev/null; \
	else echo "note: some of $(SYSTEM_TOOLS) not found; the tests that need them will be skipped (sudo apt-get install -y $(SYSTEM_PACKAGES))"; fi

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

# The real-node tests' training image builds in the background while the other tests run (for
# minutes it waits mostly on PyPI and the disk: torch's wheels, the layer commits, a multi-GB
# export); their own build waits for it (a lock in kube_image_base.py) and finds it made, or
# builds again itself after a failure. Only as root with buildah and debootstrap, as they need.
# --durations: the slowest tests at the end of the output, to see where the suite's time goes.
IMAGE_LOG ?= /tmp/trainmaster-image-build.log
unit: $(STAMP) system-deps torchx-venv kube-build
	@if [ "$$(id -u)" = 0 ] && command -v buildah >/dev/null && command -v debootstrap >/dev/null; then \
		echo "building the training image in the background (log: $(IMAGE_LOG))"; \
		nohup $(BIN)/python controlplane/kube_image.py build > $(IMAGE_LOG) 2>&1 & fi
	$(BIN)/pytest -q --durations=25

# The trn1 stack (stacks/trn1.txt): torch 2.9 + torch_xla 2.9 (the Neuron 2.29.1 DLC's), on the
# CPU, every other dependency at pyproject's floor. The tests marked `stacks` run there: real
# jobs with checkpoints, a killed worker, resume, precompile, a custom script's safety net, the
# checkpoint writer's tests (docs/architecture.md, "Stacks").
TRN1_VENV ?= .venv-trn1
TRN1_STAMP := $(TRN1_VENV)/.trainmaster-installed
$(TRN1_STAMP): pyproject.toml stacks/trn1.txt
	[ -x $(TRN1_VENV)/bin/python ] || $(PYTHON) -m venv $(TRN1_VENV)
	$(TRN1_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(TRN1_VENV)/bin/python -m pip install --quiet -c stacks/trn1.txt torch torch_xla -e ".[test]"
	$(TRN1_VENV)/bin/python $(call HAS_TORCH,2.9.0) || { echo "error: $(TRN1_VENV) does not hold torch 2.9.0" >&2; exit 1; }
	touch $(TRN1_STAMP)

stacks: $(TRN1_STAMP) system-deps
	$(TRN1_VENV)/bin/pytest -q -m stacks

test: lint unit stacks

# The fast loop while you change code: lint, then the tests of the packages your uncommitted
# change touches (tests/changed.py; BASE=main for a branch's whole change), the multi-process,
# control-plane and stacks tests left out (`make test` runs everything).
BASE ?= HEAD
check: lint
	@paths="$$($(BIN)/python -m tests.changed --base $(BASE))"; \
	if [ -z "$$paths" ]; then echo "no change against $(BASE): nothing to test"; \
	else echo "pytest $$paths"; $(BIN)/pytest -q -m "not slow and not kube and not realnodes" $$paths \
		|| [ $$? -eq 5 ]; fi  # 5: every test there is a slow one

# The whole local flow on the built-in corpus: shards, a 2-node job with c10d rendezvous,
# checkpoints, metrics, TensorBoard events, and a summary with the commands to look further.
demo: $(STAMP)
	rm -rf $(DEMO_DIR)
	$(BIN)/trainmaster demo --dir $(DEMO_DIR)

clean:
	rm -rf $(VENV) $(TRN1_VENV) $(TORCHX_VENV) $(DEMO_DIR) .pytest_cache .mypy_cache .ruff_cache
