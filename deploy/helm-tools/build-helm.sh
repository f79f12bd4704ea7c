#!/usr/bin/env bash
# Build the helm v3 CLI from the pinned Go module in gomod/ into a cache outside the checkout,
# once per version. Prints the path of the helm binary on stdout (progress goes to stderr).
#   HARNESS_CACHE  cache root (default: $HOME/.cache/mthreads-harness)
# Mirrors deploy/local/build-binaries.sh: bumping gomod/go.mod (go get -tool helm.sh/helm/v3/cmd/helm@vX.Y.Z)
# is the whole upgrade.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
helm_ver=$(grep -E '^\s*helm.sh/helm/v3 v' "$here/gomod/go.mod" | awk '{print $2}')
client_go=$(grep -E '^\s*k8s.io/client-go v' "$here/gomod/go.mod" | awk '{print $2}')
[ -n "$helm_ver" ] && [ -n "$client_go" ] || { echo "build-helm: cannot read pinned versions" >&2; exit 1; }
cache=${HARNESS_CACHE:-$HOME/.cache/mthreads-harness}
out="$cache/helm-$helm_ver"
if [ -x "$out/helm" ]; then
  echo "$out/helm"; exit 0
fi
command -v go >/dev/null || { echo "build-helm: Go 1.26+ is needed to build helm" >&2; exit 1; }
mkdir -p "$out.tmp"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
start=$(date +%s)
log() { echo "[build-helm +$(( $(date +%s) - start ))s] $*" >&2; }
progress() {
  awk -v what="$1" -v start="$start" '
    /^[A-Za-z0-9._~\/-]+$/ { n++; if (n % 200 == 0) printf "[build-helm +%ds] %s: %d packages compiled\n", systime() - start, what, n; next }
    { print }
    END { printf "[build-helm +%ds] %s: go build ended (%d packages compiled)\n", systime() - start, what, n }'
}
# The same ldflags as helm's Makefile: version, and the default Kubernetes version that
# `helm template` / `helm lint` assume (client-go v0.X.Y -> Kubernetes 1.X).
k8s_minor=$(echo "$client_go" | cut -d. -f2)
ldf="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_ver -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
ldf="$ldf -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$k8s_minor"
ldf="$ldf -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$k8s_minor"
log "building helm $helm_ver (first run only; a few minutes on 2 cores)"
(cd "$here/gomod" && go build -v -trimpath -ldflags "$ldf" -o "$out.tmp/helm" helm.sh/helm/v3/cmd/helm 2>&1) \
  | progress helm >&2
"$out.tmp/helm" version --short >&2
rm -rf "$out" && mv "$out.tmp" "$out"
log "done: $out ($(du -sh "$out" | cut -f1))"
echo "$out/helm"
