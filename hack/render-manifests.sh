#!/usr/bin/env bash
# Renders manifests/kelvin.yaml from helm/kelvin with the chart's default values (release "kelvin", namespace
# "kelvin-system") but operator.webhook.tls.external=true, preceded by the Namespace, and the chart's CRDs into
# manifests/kelvin-crds.yaml (beside OUTPUT: <OUTPUT without .yaml>-crds.yaml). Two files because one `kubectl apply`
# cannot create a CRD and an object of its kind: kubectl maps every object before applying any, so the
# ClusterKopfPeering fails on a fresh cluster (docs/install.md gives the steps; tests/e2e/test_install.py runs them).
# CI re-renders both and fails when one is out of date
# (tests/deploy/test_manifests.py). Usage: hack/render-manifests.sh [OUTPUT]   (HELM=/path/to/helm to pick a binary)
#
# The output holds no key material (operator.webhook.tls.external=true): after applying it, hack/webhook-cert.sh makes
# the webhook's CA and key on your machine, stores them in the Secret the operator mounts and sets the caBundle.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-manifests/kelvin.yaml}"
crds_out="${out%.yaml}-crds.yaml"
helm="${HELM:-}"
if [ -z "$helm" ]; then
  if [ -x .ci/tools/bin/helm ]; then helm=.ci/tools/bin/helm; else helm=helm; fi
fi
release=kelvin
namespace=kelvin-system
tmp="$(mktemp)"
tmp_crds="$(mktemp)"
trap 'rm -f "$tmp" "$tmp_crds"' EXIT
app_version="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' helm/kelvin/Chart.yaml)"
apply_steps="kubectl apply --server-side -f manifests/kelvin-crds.yaml, kubectl wait --for=condition=Established -f manifests/kelvin-crds.yaml, kubectl apply --server-side -f manifests/kelvin.yaml, then hack/webhook-cert.sh -n ${namespace} (docs/install.md)"
{
  echo "# kelvin ${app_version}: the CRDs of helm/kelvin (crds/), written by hack/render-manifests.sh."
  echo "# Do not edit: change the chart and re-run the script. Install: ${apply_steps}."
  "$helm" show crds helm/kelvin
} > "$tmp_crds"
{
  echo "# kelvin ${app_version}: rendered from helm/kelvin with its default values by hack/render-manifests.sh,"
  echo "# except operator.webhook.tls.external=true: no webhook key or CA in this file (the TLS Secret is made at install)."
  echo "# Do not edit: change the chart and re-run the script. Install: ${apply_steps}."
  echo "---"
  echo "apiVersion: v1"
  echo "kind: Namespace"
  echo "metadata:"
  echo "  name: ${namespace}"
  echo "  labels:"
  echo "    pod-security.kubernetes.io/enforce: restricted"
  echo "    pod-security.kubernetes.io/audit: restricted"
  echo "    pod-security.kubernetes.io/warn: restricted"
  "$helm" template "$release" helm/kelvin --namespace "$namespace" --skip-crds --set operator.webhook.tls.external=true
} > "$tmp"
mkdir -p "$(dirname "$out")"
mv "$tmp_crds" "$crds_out"
mv "$tmp" "$out"
trap - EXIT
echo "wrote $crds_out $out"
