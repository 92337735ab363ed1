# The local Kubernetes control plane (controlplane/README.md): included by the Makefile, or
# used alone with `make -f controlplane/controlplane.mk kube-up`.
#   kube-build  build etcd, kube-apiserver, kube-controller-manager, Volcano and kwok from the
#               Go module proxy into ~/.cache/trainmaster-kube (TRAINMASTER_KUBE_CACHE); once;
#               and prometheus-operator's PodMonitor/PrometheusRule CRDs (monitoring-crds.sh)
#   kube-up     start it on 127.0.0.1 (TRAINMASTER_KUBE_DIR, default /tmp/trainmaster-kube;
#               TRAINMASTER_KUBE_NODES, TRAINMASTER_KUBE_INSTANCE_TYPE, TRAINMASTER_KUBE_PORT)
#   kube-down   stop it and remove its run dir
#   kube-test   the control-plane tests (tests/controlplane), building and starting as needed
VENV ?= .venv
BIN ?= $(VENV)/bin
KUBE_PY = $(BIN)/python controlplane/kube.py

.PHONY: kube-build kube-up kube-down kube-status kube-test

kube-build:
	bash controlplane/build.sh
	bash controlplane/monitoring-crds.sh >/dev/null

kube-up: kube-build
	$(KUBE_PY) up

kube-down:
	$(KUBE_PY) down

kube-status:
	$(KUBE_PY) status

kube-test: kube-build
	TRAINMASTER_KUBE_BUILD=1 $(BIN)/pytest -q -m kube tests/controlplane
