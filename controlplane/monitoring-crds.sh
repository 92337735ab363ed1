#!/usr/bin/env bash
# The prometheus-operator CRDs (PodMonitor, PrometheusRule) that `cluster plan`'s monitoring
# objects are checked against on the local control plane (tests/controlplane/test_monitoring.py),
# from the operator's module zip on the Go module proxy, at the version the pinned
# kube-prometheus-stack chart deploys (src/trainmaster/cluster/versions.py, the one place it is
# written). Copied once into the cache: TRAINMASTER_KUBE_CACHE (default ~/.cache/trainmaster-kube).
# Prints the folder that holds them.
set -euo pipefail
main() {
    HERE=$(cd "$(dirname "$0")" && pwd)
    if [ -z "${GO:-}" ]; then GO=$(command -v go || echo /usr/local/go/bin/go); fi
    export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:--buildvcs=false}"
    VERSION=$(sed -n 's/^PROMETHEUS_OPERATOR_VERSION: Final = "\(v[^"]*\)"$/\1/p' \
        "$HERE/../src/trainmaster/cluster/versions.py")
    [ -n "$VERSION" ] || { echo "no PROMETHEUS_OPERATOR_VERSION in versions.py" >&2; exit 1; }
    OUT=${TRAINMASTER_KUBE_CACHE:-$HOME/.cache/trainmaster-kube}/prometheus-operator-$VERSION
    if [ ! -f "$OUT/.complete" ]; then
        module=github.com/prometheus-operator/prometheus-operator@$VERSION
        dir=$(cd "$HERE/kwok" && "$GO" mod download -json "$module" \
            | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
        [ -n "$dir" ] || { echo "could not download $module" >&2; exit 1; }
        rm -rf "$OUT" && mkdir -p "$OUT"
        for kind in podmonitors prometheusrules; do
            cp "$dir/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$OUT/"
        done
        chmod -R u+w "$OUT" && touch "$OUT/.complete"
    fi
    echo "$OUT"
}
main "$@"
