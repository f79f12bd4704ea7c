#!/usr/bin/env bash
# Build promql-check (promql/main.go: Prometheus's own PromQL parser, pinned in promql/go.mod) into a
# cache outside the checkout, once per version. Prints the binary's path on stdout (progress on stderr).
#   HARNESS_CACHE  cache root (default: $HOME/.cache/mthreads-harness)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ver=$(grep -E '^require github.com/prometheus/prometheus v' "$here/promql/go.mod" | awk '{print $3}')
[ -n "$ver" ] || { echo "build-promql-check: cannot read the pinned version" >&2; exit 1; }
sum=$(cat "$here/promql/main.go" "$here/promql/go.sum" | sha256sum | cut -c1-12)
cache=${HARNESS_CACHE:-$HOME/.cache/mthreads-harness}
out="$cache/promql-check-$ver-$sum"
if [ -x "$out/promql-check" ]; then
  echo "$out/promql-check"; exit 0
fi
command -v go >/dev/null || { echo "build-promql-check: Go 1.26+ is needed" >&2; exit 1; }
mkdir -p "$out.tmp"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
echo "[build-promql-check] building the PromQL parser of prometheus $ver (first run only)" >&2
(cd "$here/promql" && go build -trimpath -ldflags "-s -w" -o "$out.tmp/promql-check" .) >&2
rm -rf "$out" && mv "$out.tmp" "$out"
echo "$out/promql-check"
