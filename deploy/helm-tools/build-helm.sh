#!/usr/bin/env bash
# Build the helm v3 CLI from the pinned Go module in gomod/ into a cache outside the checkout,
# once per version. Prints the path of the helm binary on stdout (progress goes to stderr).
#   HARNESS_CACHE  cache root (default: $HOME/.cache/mthreads-harness)
# Builds as deploy/local/build-binaries.sh does (deploy/local/gobuild.sh): bumping gomod/go.mod
# (go get -tool helm.sh/helm/v3/cmd/helm@vX.Y.Z) is the whole upgrade.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tool=build-helm
. "$here/../local/gobuild.sh"
helm_ver=$(pinned helm.sh/helm/v3 "$here/gomod/go.mod")
client_go=$(pinned k8s.io/client-go "$here/gomod/go.mod")
[ -n "$helm_ver" ] && [ -n "$client_go" ] || { echo "$tool: cannot read pinned versions" >&2; exit 1; }
out="$cache/helm-$helm_ver"
if [ -x "$out/helm" ]; then
  echo "$out/helm"; exit 0
fi
begin "$out" helm
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
finish "$out"
echo "$out/helm"
