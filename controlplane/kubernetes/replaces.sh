#!/usr/bin/env bash
# Regenerates the replace directives of this wrapper module from k8s.io/kubernetes's own go.mod.
#
# k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/client-go, ...) at v0.0.0
# and replaces them with ./staging/src/..., which only works inside its own repository. Every
# staging module is also published on its own as v0.<minor>.<patch>, so a module that depends on
# k8s.io/kubernetes vX.Y.Z must replace each of them by v0.Y.Z. The list is read from upstream's
# go.mod, not kept by hand, so that a version bump (KUBE_VERSION) cannot miss a new staging module.
#
# Usage: controlplane/kubernetes/replaces.sh [vX.Y.Z]   (then: go mod tidy)
set -euo pipefail
cd "$(dirname "$0")"
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
version=${1:-$(sed -n 's/^\(require\)\{0,1\}[[:space:]]*k8s\.io\/kubernetes \(v[^ ]*\).*/\2/p' go.mod)}
[ -n "$version" ] || { echo "no k8s.io/kubernetes version given or required in go.mod" >&2; exit 1; }
staging=v0.${version#v1.}  # v1.35.4 -> v0.35.4

gomod=$("$GO" mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
[ -f "$gomod" ] || { echo "cannot read k8s.io/kubernetes@$version's go.mod" >&2; exit 1; }

# Drop the replaces this script wrote before, then add one per "=> ./staging/..." line upstream.
for old in $("$GO" mod edit -json | sed -n 's/.*"Path": "\(k8s\.io\/[^"]*\)".*/\1/p' | sort -u); do
    "$GO" mod edit -dropreplace="$old"
done
count=0
for mod in $(awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$gomod"); do
    "$GO" mod edit -replace="$mod=$mod@$staging"
    count=$((count + 1))
done
"$GO" mod edit -require="k8s.io/kubernetes@$version"
echo "replaced $count staging modules with $staging (from k8s.io/kubernetes@$version's go.mod)"
