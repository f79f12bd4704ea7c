#!/usr/bin/env bash
# Regenerate deploy/manifests/hami.yaml, the chart rendered with its defaults for users without
# Helm (tests/deploy checks the file equals a fresh render). Run from anywhere:
#   deploy/manifests/render.sh            rewrite hami.yaml
#   deploy/manifests/render.sh --stdout   print the render instead
# HELM=/path/to/helm overrides the helm built by deploy/helm-tools/build-helm.sh.
#
# Deterministic on purpose: tls.mode=external (no certificate generated at render time: you
# create the Secret, see docs/install.md), redis.auth.existingSecret (no Redis password in a file
# anyone can read: you create that Secret too) and --kube-version pinned to the Kubernetes
# release the local control plane tests run (deploy/local/gomod/k8s/go.mod), which sets the
# kube-scheduler image tag; change that tag to your cluster's version.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
helm=${HELM:-$("$root/deploy/helm-tools/build-helm.sh")}
k8s_ver=$(grep -E '^\s*k8s.io/kubernetes v' "$root/deploy/local/gomod/k8s/go.mod" | awk '{print $2}')
[ -n "$k8s_ver" ] || { echo "render: cannot read the Kubernetes version" >&2; exit 1; }
render() {
  cat <<HEADER
# hami (mtsched) for kube-system, rendered from deploy/helm/hami with its default values and
#   --set tls.mode=external --set redis.auth.existingSecret=hami-redis-auth --kube-version $k8s_ver
# Do not edit: regenerate with deploy/manifests/render.sh. Before applying, create the Secrets
# hami-scheduler-tls (tls.crt, tls.key, ca.crt) and hami-redis-auth (password) in kube-system,
# set the kube-scheduler image tag to your cluster's version, and afterwards put ca.crt into the
# webhook's caBundle (docs/install.md, "Without Helm").
HEADER
  "$helm" template hami "$root/deploy/helm/hami" --namespace kube-system \
    --kube-version "$k8s_ver" --set tls.mode=external --set redis.auth.existingSecret=hami-redis-auth
}
if [ "${1:-}" = "--stdout" ]; then
  render
else
  render > "$here/hami.yaml.tmp"
  mv "$here/hami.yaml.tmp" "$here/hami.yaml"
  echo "wrote $here/hami.yaml" >&2
fi
