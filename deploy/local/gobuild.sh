# Sourced (not run) by deploy/local/build-binaries.sh and deploy/helm-tools/build-helm.sh, after
# `set -euo pipefail` and with $tool set to the script's name: what both do to build pinned Go
# modules once into a cache outside the checkout.
#   HARNESS_CACHE  cache root (default: $HOME/.cache/mthreads-harness)
cache=${HARNESS_CACHE:-$HOME/.cache/mthreads-harness}
start=$(date +%s)

# pinned MODULE GO_MOD: the version GO_MOD pins MODULE at, so bumping go.mod is the whole upgrade
pinned() { grep -E "^\s*$1 v" "$2" | awk '{print $2}'; }

log() { echo "[$tool +$(( $(date +%s) - start ))s] $*" >&2; }

# `go build -v` names each package it compiles (cache hits are silent): count them as progress,
# pass anything else (compiler errors) through. pipefail keeps go's exit status.
progress() {
  awk -v tool="$tool" -v what="$1" -v start="$start" '
    /^[A-Za-z0-9._~\/-]+$/ { n++; if (n % 200 == 0) printf "[%s +%ds] %s: %d packages compiled\n", tool, systime() - start, what, n; next }
    { print }
    END { printf "[%s +%ds] %s: go build ended (%d packages compiled)\n", tool, systime() - start, what, n }'
}

# begin OUT WHAT: Go is there (else say what it is needed for), OUT.tmp exists, the build is local-only
begin() {
  command -v go >/dev/null || { echo "$tool: Go 1.26+ is needed to build $2" >&2; exit 1; }
  mkdir -p "$1.tmp"
  export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
}

# finish OUT: the complete build takes OUT's place in one step, so a half-built cache is never used
finish() {
  rm -rf "$1" && mv "$1.tmp" "$1"
  log "done: $1 ($(du -sh "$1" | cut -f1))"
}
