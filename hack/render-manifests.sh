#!/usr/bin/env bash
# Renders manifests/kelvin.yaml from helm/kelvin with the chart's default values (release "kelvin", namespace
# "kelvin-system") but operator.webhook.tls.external=true, CRDs included, preceded by the Namespace. CI re-renders it and fails when the file is out of date
# (tests/deploy/test_manifests.py). Usage: hack/render-manifests.sh [OUTPUT]   (HELM=/path/to/helm to pick a binary)
#
# The output holds no key material (operator.webhook.tls.external=true): after applying it, hack/webhook-cert.sh makes
# the webhook's CA and key on your machine, stores them in the Secret the operator mounts and sets the caBundle.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-manifests/kelvin.yaml}"
helm="${HELM:-}"
if [ -z "$helm" ]; then
  if [ -x .ci/tools/bin/helm ]; then helm=.ci/tools/bin/helm; else helm=helm; fi
fi
release=kelvin
namespace=kelvin-system
tmp="$(mktemp)"
trap 'rm -f "$tmp"' EXIT
{
  echo "# kelvin $(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' helm/kelvin/Chart.yaml): rendered from helm/kelvin with its default values by hack/render-manifests.sh,"
  echo "# except operator.webhook.tls.external=true: no webhook key or CA in this file (the TLS Secret is made at install)."
  echo "# Do not edit: change the chart and re-run the script. Apply with: kubectl apply --server-side -f manifests/kelvin.yaml"
  echo "# (CRDs first: if the ClusterKopfPeering is rejected as unknown, apply the file a second time.)"
  echo "# Then make the webhook certificate (this file holds no key): hack/webhook-cert.sh -n ${namespace}"
  echo "---"
  echo "apiVersion: v1"
  echo "kind: Namespace"
  echo "metadata:"
  echo "  name: ${namespace}"
  echo "  labels:"
  echo "    pod-security.kubernetes.io/enforce: restricted"
  echo "    pod-security.kubernetes.io/audit: restricted"
  echo "    pod-security.kubernetes.io/warn: restricted"
  "$helm" template "$release" helm/kelvin --namespace "$namespace" --include-crds --set operator.webhook.tls.external=true
} > "$tmp"
mkdir -p "$(dirname "$out")"
mv "$tmp" "$out"
trap - EXIT
echo "wrote $out"
