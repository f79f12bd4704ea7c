#!/usr/bin/env bash
# Build kube-apiserver, kube-scheduler and etcd from the pinned Go modules in gomod/
# into a cache outside the checkout, once per version. Prints the bin directory.
#   HARNESS_CACHE  cache root (default: $HOME/.cache/mthreads-harness)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# Versions come from the pinned modules, so bumping go.mod is the whole upgrade.
k8s_ver=$(grep -E '^\s*k8s.io/kubernetes v' "$here/gomod/k8s/go.mod" | awk '{print $2}')
etcd_ver=$(grep -E '^\s*go.etcd.io/etcd/server/v3 v' "$here/gomod/etcd/go.mod" | awk '{print $2}')
[ -n "$k8s_ver" ] && [ -n "$etcd_ver" ] || { echo "build-binaries: cannot read pinned versions" >&2; exit 1; }
cache=${HARNESS_CACHE:-$HOME/.cache/mthreads-harness}
out="$cache/k8s-$k8s_ver-etcd-$etcd_ver"
if [ -x "$out/kube-apiserver" ] && [ -x "$out/kube-scheduler" ] && [ -x "$out/etcd" ]; then
  echo "$out"; exit 0
fi
command -v go >/dev/null || { echo "build-binaries: Go 1.26+ is needed to build the control plane" >&2; exit 1; }
mkdir -p "$out.tmp"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
minor=$(echo "$k8s_ver" | cut -d. -f2)
start=$(date +%s)
log() { echo "[build-binaries +$(( $(date +%s) - start ))s] $*" >&2; }
# `go build -v` names each package it compiles (cache hits are silent): count them as progress,
# pass anything else (compiler errors) through. pipefail keeps go's exit status.
progress() {
  awk -v what="$1" -v start="$start" '
    /^[A-Za-z0-9._~\/-]+$/ { n++; if (n % 200 == 0) printf "[build-binaries +%ds] %s: %d packages compiled\n", systime() - start, what, n; next }
    { print }
    END { printf "[build-binaries +%ds] %s: go build ended (%d packages compiled)\n", systime() - start, what, n }'
}
if [ ! -x "$out.tmp/etcd" ]; then
  log "building etcd $etcd_ver (first run only)"
  (cd "$here/gomod/etcd" && go build -v -trimpath -ldflags "-s -w" -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3 2>&1) \
    | progress etcd >&2
fi
ldf="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_ver -X k8s.io/component-base/version.gitMajor=1"
ldf="$ldf -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
ldf="$ldf -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z -X k8s.io/client-go/pkg/version.gitVersion=$k8s_ver"
for bin in kube-scheduler kube-apiserver; do
  if [ ! -x "$out.tmp/$bin" ]; then
    log "building $bin $k8s_ver (first run only; ~10-25 min on 2 cores for both)"
    (cd "$here/gomod/k8s" && go build -v -trimpath -ldflags "$ldf" -o "$out.tmp/$bin" "k8s.io/kubernetes/cmd/$bin" 2>&1) \
      | progress "$bin" >&2
  fi
done
"$out.tmp/kube-apiserver" --version >&2
rm -rf "$out" && mv "$out.tmp" "$out"
log "done: $out ($(du -sh "$out" | cut -f1))"
echo "$out"
