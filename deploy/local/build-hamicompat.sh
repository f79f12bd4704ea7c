#!/usr/bin/env bash
# Build hami-decode (gomod/hamicompat/main.go: HAMi's own allocation-record decoder and encoder, HAMi
# pinned in gomod/hamicompat/go.mod) into a cache outside the checkout, once per HAMi version and
# main.go. Prints the binary's path on stdout (progress on stderr).
#   HARNESS_CACHE  cache root (default: $HOME/.cache/mthreads-harness)
# Exit 3: the Go module proxy does not serve the pinned HAMi version (tests/deploy/test_hami_decoder.py
# then says so instead of checking against HAMi's live code).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tool=build-hamicompat
. "$here/gobuild.sh"
mod="$here/gomod/hamicompat"
hami=github.com/Project-HAMi/HAMi
ver=$(pinned "$hami" "$mod/go.mod")
[ -n "$ver" ] || { echo "$tool: cannot read the pinned HAMi version" >&2; exit 1; }
sum=$(cat "$mod/main.go" "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -c1-12)
out="$cache/hami-decode-$ver-$sum"
if [ -x "$out/hami-decode" ]; then
  echo "$out/hami-decode"; exit 0
fi
begin "$out" "hami-decode (HAMi's decoder)"
if ! err=$(cd "$mod" && go mod download "$hami" 2>&1); then
  echo "$err" >&2
  if grep -qE '403 Forbidden|404 Not Found|410 Gone|not available|unknown revision' <<<"$err"; then
    echo "$tool: the Go module proxy does not serve $hami@$ver" >&2
    rm -rf "$out.tmp"; exit 3
  fi
  exit 1
fi
log "building hami-decode against HAMi $ver (first run only; ~3 min on 2 cores with a cold Go cache)"
(cd "$mod" && go build -v -trimpath -ldflags "-s -w" -o "$out.tmp/hami-decode" . 2>&1) | progress hami-decode >&2
finish "$out"
echo "$out/hami-decode"
