#!/usr/bin/env bash
# Build kube-apiserver, kube-scheduler and etcd from the pinned Go modules in gomod/
# into a cache outside the checkout, once per version. Prints the bin directory.
#   HARNESS_CACHE  cache root (default: $HOME/.cache/mthreads-harness)
#   MTSCHED_K8S_VERSION  another Kubernetes release than gomod/k8s pins (e.g. v1.30.14): built on demand from a
#                  module made for it beside the cache (k8s.io/kubernetes and its staging modules at that release),
#                  with the pinned etcd; never by default, so CI builds the pinned release only
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tool=build-binaries
. "$here/gobuild.sh"
k8s_ver=$(pinned k8s.io/kubernetes "$here/gomod/k8s/go.mod")
etcd_ver=$(pinned go.etcd.io/etcd/server/v3 "$here/gomod/etcd/go.mod")
[ -n "$k8s_ver" ] && [ -n "$etcd_ver" ] || { echo "$tool: cannot read pinned versions" >&2; exit 1; }
pinned_out="$cache/k8s-$k8s_ver-etcd-$etcd_ver"
k8s_ver=${MTSCHED_K8S_VERSION:-$k8s_ver}
[[ "$k8s_ver" =~ ^v1\.[0-9]+\.[0-9]+$ ]] || { echo "$tool: MTSCHED_K8S_VERSION=$k8s_ver is not v1.MINOR.PATCH" >&2; exit 1; }
out="$cache/k8s-$k8s_ver-etcd-$etcd_ver"
if [ -x "$out/kube-apiserver" ] && [ -x "$out/kube-scheduler" ] && [ -x "$out/etcd" ]; then
  echo "$out"; exit 0
fi
begin "$out" "the control plane"
minor=$(echo "$k8s_ver" | cut -d. -f2)
mod="$here/gomod/k8s"
if [ "$out" != "$pinned_out" ]; then
  # k8s.io/kubernetes requires its staging modules (k8s.io/api, ...) at v0.0.0: each is replaced by its
  # release of the same minor and patch, as gomod/k8s/go.mod does for the pinned one
  mod="$cache/gomod-k8s-$k8s_ver"
  mkdir -p "$mod"
  log "making the build module for $k8s_ver in $mod"
  gomod=$(cd "$mod" && go mod download -json "k8s.io/kubernetes@$k8s_ver" | awk -F'"' '/"GoMod":/ {print $4}')
  [ -f "$gomod" ] || { echo "$tool: cannot download k8s.io/kubernetes $k8s_ver" >&2; exit 1; }
  {
    printf 'module mthreads-harness/k8sbin\n\ngo 1.26.0\n\ngodebug default=go1.26\n\n'
    printf 'tool (\n\tk8s.io/kubernetes/cmd/kube-apiserver\n\tk8s.io/kubernetes/cmd/kube-scheduler\n)\n\n'
    printf 'require k8s.io/kubernetes %s\n\n' "$k8s_ver"
    grep -E '^\s*k8s\.io/[a-z0-9-]+ v0\.0\.0$' "$gomod" | awk -v v="v0.${k8s_ver#v1.}" '{print "replace " $1 " => " $1 " " v}'
  } > "$mod/go.mod"
  (cd "$mod" && go mod tidy 2>&1) >&2
  if [ -x "$pinned_out/etcd" ] && [ ! -x "$out.tmp/etcd" ]; then
    cp "$pinned_out/etcd" "$out.tmp/etcd"
  fi
fi
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
    (cd "$mod" && go build -v -trimpath -ldflags "$ldf" -o "$out.tmp/$bin" "k8s.io/kubernetes/cmd/$bin" 2>&1) \
      | progress "$bin" >&2
  fi
done
"$out.tmp/kube-apiserver" --version >&2
finish "$out"
echo "$out"
