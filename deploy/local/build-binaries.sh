#!/usr/bin/env bash
# Build kube-apiserver, kube-scheduler and etcd from the pinned Go modules in gomod/
# into a cache outside the checkout, once per version. Prints the bin directory.
#   HARNESS_CACHE  cache root (default: $HOME/.cache/mthreads-harness)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tool=build-binaries
. "$here/gobuild.sh"
k8s_ver=$(pinned k8s.io/kubernetes "$here/gomod/k8s/go.mod")
etcd_ver=$(pinned go.etcd.io/etcd/server/v3 "$here/gomod/etcd/go.mod")
[ -n "$k8s_ver" ] && [ -n "$etcd_ver" ] || { echo "$tool: cannot read pinned versions" >&2; exit 1; }
out="$cache/k8s-$k8s_ver-etcd-$etcd_ver"
if [ -x "$out/kube-apiserver" ] && [ -x "$out/kube-scheduler" ] && [ -x "$out/etcd" ]; then
  echo "$out"; exit 0
fi
begin "$out" "the control plane"
minor=$(echo "$k8s_ver" | cut -d. -f2)
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
finish "$out"
echo "$out"
