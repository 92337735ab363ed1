#!/usr/bin/env bash
# Builds the local control plane's binaries from the Go module proxy with the ordinary go command:
# etcd, kube-apiserver, kube-controller-manager, Volcano's three managers and kwok; and for the
# real nodes (kube.py up --real-nodes N): kubelet, kube-proxy, CoreDNS, and the two static
# programs the nodes' local images are made of (pause, nettest).
#
# Each binary comes from a wrapper module under controlplane/ whose go.mod pins the upstream
# version and whose go.sum is committed, so a build is reproducible. The binaries go to a cache
# folder outside the repository, keyed by those versions, the Go version and a hash of the
# wrapper modules: a second run finds them there and only says so (seconds), a version bump
# builds into a new folder and never mixes binaries of two versions.
#
# Usage: controlplane/build.sh [--bin-dir | --tidy | binary...]
#   --bin-dir   print the folder the binaries are (or would be) in, build nothing
#   --tidy      regenerate the wrapper modules' go.mod/go.sum (after changing a version)
#   binary...   build only these (default: all that are missing)
# Environment: TRAINMASTER_KUBE_CACHE (default ~/.cache/trainmaster-kube), GO, GOFLAGS.
set -euo pipefail
# The whole script is one function, read before it runs: bash reads a script as it executes
# it, and a build takes minutes, long enough for a `git pull` to change this file under it.
main() {
    HERE=$(cd "$(dirname "$0")" && pwd)
    if [ -z "${GO:-}" ]; then GO=$(command -v go || echo /usr/local/go/bin/go); fi
    command -v "$GO" >/dev/null || { echo "no Go toolchain ($GO): install Go >= 1.26 or set GO" >&2; exit 1; }
    export GOFLAGS="${GOFLAGS:--buildvcs=false}" CGO_ENABLED=0  # static binaries, as upstream builds them
    export GOTOOLCHAIN=local  # every module here builds with the installed Go; never download another

    # The version each wrapper module requires, read from its go.mod (the one place it is written).
    required() { sed -n "s|^\(require\)\{0,1\}[[:space:]]*$2 \(v[^ ]*\).*|\2|p" "$HERE/$1/go.mod"; }
    ETCD_VERSION=$(required etcd go.etcd.io/etcd/server/v3)
    KUBE_VERSION=$(required kubernetes k8s.io/kubernetes)
    VOLCANO_VERSION=$(required volcano volcano.sh/volcano)
    KWOK_VERSION=$(required kwok sigs.k8s.io/kwok)
    COREDNS_VERSION=$(required coredns github.com/coredns/coredns)

    go_version=$("$GO" env GOVERSION)
    # every wrapper module's go.mod and go.sum (pause and nettest need no go.sum) and main.go
    modules_hash=$(cat "$HERE"/*/go.mod "$HERE"/*/go.sum "$HERE"/*/main.go "$0" | sha256sum | cut -c1-10)
    KEY="k8s-$KUBE_VERSION.etcd-$ETCD_VERSION.volcano-$VOLCANO_VERSION.kwok-$KWOK_VERSION"
    KEY+=".coredns-$COREDNS_VERSION.$go_version.$modules_hash"
    CACHE=${TRAINMASTER_KUBE_CACHE:-$HOME/.cache/trainmaster-kube}
    BIN_DIR=$CACHE/$KEY/bin
    if [ "${1:-}" = "--bin-dir" ]; then echo "$BIN_DIR"; exit 0; fi

    # What upstream's hack/lib/version.sh stamps: Volcano and the controller manager read the API
    # server's /version (gitVersion, gitMajor, gitMinor), and component-base derives the emulated
    # version from it; an unstamped build says v0.0.0-master and confuses both.
    kube_minor=${KUBE_VERSION#v1.}; kube_minor=${kube_minor%%.*}
    kube_ldflags="-s -w"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        kube_ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$kube_minor"
        kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    done
    volcano_ldflags="-s -w -X volcano.sh/volcano/pkg/version.Version=$VOLCANO_VERSION"
    kwok_ldflags="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
    kwok_ldflags+=" -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=$KUBE_VERSION"

    # binary  wrapper-module  package  ldflags
    TARGETS=(
        "etcd                    etcd        .                                              -s -w"
        "kube-apiserver          kubernetes  k8s.io/kubernetes/cmd/kube-apiserver           $kube_ldflags"
        "kube-controller-manager kubernetes  k8s.io/kubernetes/cmd/kube-controller-manager  $kube_ldflags"
        "vc-webhook-manager      volcano     volcano.sh/volcano/cmd/webhook-manager         $volcano_ldflags"
        "vc-controller-manager   volcano     volcano.sh/volcano/cmd/controller-manager      $volcano_ldflags"
        "vc-scheduler            volcano     volcano.sh/volcano/cmd/scheduler               $volcano_ldflags"
        "kwok                    kwok        sigs.k8s.io/kwok/cmd/kwok                      $kwok_ldflags"
        "kubelet                 kubernetes  k8s.io/kubernetes/cmd/kubelet                  $kube_ldflags"
        "kube-proxy              kubernetes  k8s.io/kubernetes/cmd/kube-proxy               $kube_ldflags"
        "coredns                 coredns     .                                              -s -w"
        "pause                   pause       .                                              -s -w"
        "nettest                 nettest     .                                              -s -w"
    )

    # Volcano v1.15.1 requires volcano.sh/apis v1.15.1 and replaces it with its staging copy
    # (staging/src/volcano.sh/apis), a nested module that Volcano's own zip leaves out; the proxy does
    # not serve volcano.sh/apis v1.15.1. The nearest served version, v1.14.0, differs from v1.15.1's
    # types by one constant (QueueAllocationGateKey; the rest is regenerated comments and informers),
    # so the wrapper module is built from a copy in the cache with ./apis = v1.14.0 + that constant.
    APIS_VERSION=v1.14.0
    APIS_SUM=h1:Rf8wzGFmgzbyg85GO0CxapDDEk/VM3D7QbjbI/sH+OQ=  # checked again on every copy
    prepare_volcano() {
        local src=$CACHE/src/volcano-apis-$APIS_VERSION json dir  # go.mod, go.sum and apis/
        if [ ! -f "$src/apis/go.mod" ]; then
            json=$(cd "$HERE/volcano" && "$GO" mod download -json "volcano.sh/apis@$APIS_VERSION")
            [[ $json == *"\"Sum\": \"$APIS_SUM\""* ]] || { echo "volcano.sh/apis@$APIS_VERSION: unexpected checksum" >&2; exit 1; }
            dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")
            mkdir -p "$src" && rm -rf "$src/apis.tmp" && cp -r "$dir" "$src/apis.tmp"
            chmod -R u+w "$src/apis.tmp"
            cat >"$src/apis.tmp/pkg/apis/scheduling/v1beta1/labels_v1_15.go" <<'GO'
    package v1beta1

    // QueueAllocationGateKey as volcano.sh/apis v1.15.1 (Volcano's staging copy) declares it.
    const QueueAllocationGateKey = GroupName + "/queue-allocation-gate"
GO
            mv "$src/apis.tmp" "$src/apis"
        fi
        cp "$HERE"/volcano/go.{mod,sum} "$src"/
        echo "$src"
    }

    # --tidy: after a version bump, regenerate the wrappers' go.sum (and the Kubernetes replaces).
    if [ "${1:-}" = "--tidy" ]; then
        "$HERE/kubernetes/replaces.sh"
        for module in etcd kubernetes kwok coredns; do (cd "$HERE/$module" && "$GO" mod tidy); done
        src=$(prepare_volcano) && (cd "$src" && "$GO" mod tidy) && cp "$src"/go.{mod,sum} "$HERE/volcano/"
        echo "tidied; the cache key changes with the go.sum files: run build.sh again"; exit 0
    fi

    start=$SECONDS
    mkdir -p "$BIN_DIR"
    echo "control-plane binaries: $BIN_DIR"
    built=0
    for target in "${TARGETS[@]}"; do
        read -r name module pkg ldflags <<<"$target"
        if [ $# -gt 0 ] && [[ " $* " != *" $name "* ]]; then continue; fi
        if [ -x "$BIN_DIR/$name" ]; then echo "  $name: built"; continue; fi
        dir=$HERE/$module
        if [ "$module" = volcano ]; then dir=$(prepare_volcano); fi
        echo "  $name: building $pkg (elapsed $((SECONDS - start))s) ..."
        t0=$SECONDS
        (cd "$dir" && "$GO" build -trimpath -ldflags "$ldflags" -o "$BIN_DIR/.$name.tmp" "$pkg")
        mv "$BIN_DIR/.$name.tmp" "$BIN_DIR/$name"  # only a complete binary ever has the real name
        echo "  $name: done in $((SECONDS - t0))s"
        built=$((built + 1))
    done

    # Upstream's data files that kube.py applies, copied from the same module zips: Volcano's CRDs
    # (the job controller's informers wait for JobFlow's too), scheduler configuration and webhook
    # configurations (the installer's, one file), kwok's stages.
    SHARE=$CACHE/$KEY/share
    if [ ! -f "$SHARE/.complete" ]; then
        moddir() { (cd "$1" && "$GO" mod download -json "$2") | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p'; }
        vc=$(moddir "$(prepare_volcano)" "volcano.sh/volcano@$VOLCANO_VERSION")
        kw=$(moddir "$HERE/kwok" "sigs.k8s.io/kwok@$KWOK_VERSION")
        rm -rf "$SHARE" && mkdir -p "$SHARE/volcano/crd" "$SHARE/kwok"
        chart=$vc/installer/helm/chart/volcano  # the CRDs its installer applies: Volcano's and JobFlow's
        cp "$chart"/crd/bases/*.yaml "$chart"/charts/jobflow/crd/bases/*.yaml "$SHARE/volcano/crd/"
        cp "$chart/config/volcano-scheduler.conf" "$SHARE/volcano/"
        awk 'BEGIN { RS = "\n---" } /\nkind: (Mutating|Validating)WebhookConfiguration/ { print "---" $0 }' \
            "$vc/installer/volcano-development.yaml" >"$SHARE/volcano/webhooks.yaml"
        for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
                 pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
            cp "$kw/kustomize/stage/$f.yaml" "$SHARE/kwok/"
        done
        chmod -R u+w "$SHARE" && touch "$SHARE/.complete"
        echo "  data files: $SHARE"
    fi
    echo "built $built binaries in $((SECONDS - start))s"
}
main "$@"
