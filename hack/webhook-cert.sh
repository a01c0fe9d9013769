#!/usr/bin/env bash
# The operator's webhook certificate for kelvin installed without Helm (manifests/kelvin.yaml, rendered with
# operator.webhook.tls.external=true, so that it holds no key): makes a CA and a serving certificate for the webhook
# Service here with openssl, stores them in the Secret the operator pods mount (they wait for it before starting), and
# writes the CA into every webhook's caBundle in the Mutating- and ValidatingWebhookConfiguration. The key goes
# nowhere but into that Secret. Run it once after `kubectl apply`; run it again any time (it keeps an existing Secret
# and only re-writes the caBundle, which `kubectl apply` of the manifest never removes), or with --renew to replace
# the certificate (the operator pods are restarted to load it).
#
# Usage: hack/webhook-cert.sh [--namespace kelvin-system] [--fullname kelvin] [--days 3650] [--renew]
#   --fullname: the chart's fullname (the release name "kelvin" in manifests/kelvin.yaml): the Service and webhook
#   configurations are <fullname>-webhook, the Secret <fullname>-webhook-tls, the Deployment <fullname>-operator.
#   KUBECTL=/path/to/kubectl picks the binary.
set -euo pipefail
namespace=kelvin-system
fullname=kelvin
days=3650
renew=false
while [ $# -gt 0 ]; do
  case "$1" in
    -n | --namespace) namespace="$2"; shift 2 ;;
    --fullname) fullname="$2"; shift 2 ;;
    --days) days="$2"; shift 2 ;;
    --renew) renew=true; shift ;;
    -h | --help) sed -n '2,16p' "$0" | cut -c3-; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
kubectl="${KUBECTL:-kubectl}"
service="${fullname}-webhook"
secret="${service}-tls"
dns="${service}.${namespace}.svc"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
umask 077

b64() { base64 < "$1" | tr -d '\n'; }

ca_b64=""
if [ "$renew" = false ]; then
  ca_b64="$("$kubectl" -n "$namespace" get secret "$secret" -o 'jsonpath={.data.ca\.crt}' 2>/dev/null || true)"
fi
if [ -n "$ca_b64" ]; then
  echo "secret ${namespace}/${secret} exists: keeping it (--renew replaces it)"
else
  # a CA (EC P-256) and a serving certificate signed by it, for the names the API server may use
  openssl ecparam -name prime256v1 -genkey -noout -out "$work/ca.key"
  openssl req -x509 -new -key "$work/ca.key" -sha256 -days "$days" -subj "/CN=${service}-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$work/ca.crt"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$work/tls.key"
  openssl req -new -key "$work/tls.key" -subj "/CN=${dns}" -out "$work/tls.csr"
  printf '%s\n' \
    "subjectAltName=DNS:${service},DNS:${service}.${namespace},DNS:${dns},DNS:${dns}.cluster.local" \
    "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth" \
    > "$work/ext.cnf"
  openssl x509 -req -in "$work/tls.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" -CAcreateserial -sha256 \
    -days "$days" -extfile "$work/ext.cnf" -out "$work/tls.crt" 2>/dev/null
  cat > "$work/secret.yaml" <<EOF
apiVersion: v1
kind: Secret
metadata:
  name: ${secret}
  namespace: ${namespace}
  labels:
    app.kubernetes.io/name: kelvin
    app.kubernetes.io/part-of: kelvin
    app.kubernetes.io/component: operator
type: kubernetes.io/tls
data:
  ca.crt: $(b64 "$work/ca.crt")
  tls.crt: $(b64 "$work/tls.crt")
  tls.key: $(b64 "$work/tls.key")
EOF
  "$kubectl" apply -f - < "$work/secret.yaml"
  ca_b64="$(b64 "$work/ca.crt")"
fi

for kind in mutatingwebhookconfiguration validatingwebhookconfiguration; do
  count="$("$kubectl" get "$kind" "$service" -o 'jsonpath={range .webhooks[*]}x{end}')"
  if [ -z "$count" ]; then
    echo "error: $kind/$service has no webhooks: apply manifests/kelvin.yaml first" >&2
    exit 1
  fi
  patch=""
  for i in $(seq 0 $((${#count} - 1))); do
    patch="${patch:+$patch,}{\"op\":\"add\",\"path\":\"/webhooks/$i/clientConfig/caBundle\",\"value\":\"$ca_b64\"}"
  done
  "$kubectl" patch "$kind" "$service" --type=json -p "[$patch]"
done

if [ "$renew" = true ]; then
  "$kubectl" -n "$namespace" rollout restart "deployment/${fullname}-operator"
fi
echo "webhook certificate ready: secret ${namespace}/${secret}, caBundle set on ${service}"
