#!/usr/bin/env bash
# Builds the Kubernetes binaries the e2e suite (tests/e2e/) runs, from the Go module proxy, and makes sure etcd is
# installed. Idempotent and safe to re-run: binaries already in the cache are reused, nothing is rebuilt.
#
#   bash hack/build-kube.sh            # kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl
#   bash hack/build-kube.sh kube-apiserver kube-scheduler      # just these
#   bash hack/build-kube.sh --print-bin-dir                    # where the binaries are (or will be)
#
# How: a scratch Go module (in the cache, never in this clone) requires k8s.io/kubernetes $KUBE_VERSION and replaces
# every k8s.io/* staging module (the release's own go.mod maps them to ./staging/src/...) by its published v0.Y.Z;
# then `go build k8s.io/kubernetes/cmd/<component>`. Binaries go to
#   ${XDG_CACHE_HOME:-$HOME/.cache}/kelvin/kubernetes/$KUBE_VERSION/bin
# each built into a temporary folder and renamed into place, so an interrupted build never leaves a broken binary.
# Go 1.26 is required (a Go 1.27 build of Kubernetes 1.36 was seen to break /openapi/v2); GOTOOLCHAIN=local so Go
# never downloads another toolchain. etcd comes from Debian's etcd-server (installed here when missing and root).
# The CRDs of the Prometheus Operator and cert-manager (for the chart's optional objects) are copied from their Go
# modules into .../$KUBE_VERSION/crds.
#
# Environment: KUBE_VERSION (default below), KELVIN_KUBE_CACHE (overrides the cache root),
#              KELVIN_BUILD_JOBS (go build -p, default 2), KELVIN_SKIP_ETCD=1 (don't check etcd).
set -euo pipefail
# Everything runs from main, called on the last line: bash reads a script as it runs, so an edit of this file
# during a (long) build must not change what the running build executes.
main() {

KUBE_VERSION="${KUBE_VERSION:-v1.36.3}"
PROMETHEUS_OPERATOR_VERSION=v0.85.0
CERT_MANAGER_VERSION=v1.21.2
cache_root="${KELVIN_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kelvin/kubernetes}"
version_dir="$cache_root/$KUBE_VERSION"
bin_dir="$version_dir/bin"
jobs="${KELVIN_BUILD_JOBS:-2}"
all_components=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)

log() { printf 'build-kube: %s\n' "$*" >&2; }
die() { printf 'build-kube: error: %s\n' "$*" >&2; exit 1; }

if [ "${1:-}" = "--print-bin-dir" ]; then
  echo "$bin_dir"
  exit 0
fi

components=("$@")
[ ${#components[@]} -gt 0 ] || components=("${all_components[@]}")
for c in "${components[@]}"; do
  case " ${all_components[*]} " in
    *" $c "*) ;;
    *) die "unknown component '$c' (known: ${all_components[*]})" ;;
  esac
done
case "$KUBE_VERSION" in
  v1.[0-9]*.[0-9]*) ;;
  *) die "KUBE_VERSION must look like v1.Y.Z, got '$KUBE_VERSION'" ;;
esac
staging_version="v0.${KUBE_VERSION#v1.}"

ensure_etcd() {
  [ "${KELVIN_SKIP_ETCD:-0}" = 1 ] && return 0
  if command -v etcd >/dev/null 2>&1; then return 0; fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing etcd-server (Debian)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
    # the package may start a system etcd on :2379; the e2e suite runs its own on free ports
    if command -v service >/dev/null 2>&1; then service etcd stop >/dev/null 2>&1 || true; fi
  else
    die "etcd is missing: install Debian's etcd-server (apt-get install etcd-server) as root"
  fi
  command -v etcd >/dev/null 2>&1 || die "etcd still missing after installing etcd-server"
}

# Third-party CRDs that the chart's optional objects need (ServiceMonitor, PrometheusRule; cert-manager's Issuer and
# Certificate): the upstream files, from the projects' Go modules, so the e2e install applies every render for real.
ensure_crds() {
  local crd_dir="$version_dir/crds" tmp_crds
  [ -f "$crd_dir/.complete" ] && return 0
  command -v go >/dev/null 2>&1 || die "go is missing: install Go 1.26"
  tmp_crds="$(mktemp -d "$version_dir/crds.tmp.XXXXXX")"
  local spec module file dir
  for spec in \
    "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml" \
    "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml" \
    "github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION deploy/crds/cert-manager.io_issuers.yaml" \
    "github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION deploy/crds/cert-manager.io_clusterissuers.yaml" \
    "github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION deploy/crds/cert-manager.io_certificates.yaml"; do
    module="${spec%% *}"
    file="${spec#* }"
    dir="$(GOFLAGS= GOTOOLCHAIN=local go mod download -json "$module" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    [ -n "$dir" ] && [ -f "$dir/$file" ] || { rm -rf "$tmp_crds"; die "no $file in $module"; }
    cp "$dir/$file" "$tmp_crds/"
  done
  echo "prometheus-operator $PROMETHEUS_OPERATOR_VERSION, cert-manager $CERT_MANAGER_VERSION" >"$tmp_crds/.complete"
  rm -rf "$crd_dir"
  mv "$tmp_crds" "$crd_dir"
}

missing=()
for c in "${components[@]}"; do
  [ -x "$bin_dir/$c" ] || missing+=("$c")
done

ensure_etcd
mkdir -p "$version_dir"
ensure_crds
if [ ${#missing[@]} -eq 0 ]; then
  log "Kubernetes $KUBE_VERSION binaries present in $bin_dir (${components[*]})"
  exit 0
fi

command -v go >/dev/null 2>&1 || die "go is missing: install Go 1.26"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false"
go_version="$(go env GOVERSION)"
case "$go_version" in
  go1.26|go1.26.*) ;;
  *) die "Go 1.26 is required to build Kubernetes $KUBE_VERSION, found $go_version" ;;
esac

module_dir="$version_dir/module"
mkdir -p "$module_dir" "$bin_dir"
cd "$module_dir"
if [ ! -f go.sum ] || ! grep -q "^k8s.io/kubernetes $KUBE_VERSION " go.sum; then
  log "resolving k8s.io/kubernetes $KUBE_VERSION from $(go env GOPROXY)"
  # the release's own go.mod, through the module proxy: its replace block lists the staging modules
  kube_mod="$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
  [ -n "$kube_mod" ] && [ -f "$kube_mod" ] || die "could not download the go.mod of k8s.io/kubernetes@$KUBE_VERSION"
  go_directive="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$kube_mod")"
  # staging modules are the replace targets ./staging/src/k8s.io/<name>; replace only those the release requires
  # (e.g. sample-cli-plugin is replaced but neither required nor published)
  mapfile -t staging < <(awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$kube_mod")
  [ ${#staging[@]} -gt 0 ] || die "no staging replace directives found in $kube_mod"
  {
    echo "// generated by kelvin hack/build-kube.sh: builds Kubernetes $KUBE_VERSION from the module proxy"
    echo "module kelvin.dev/kube-build"
    echo
    echo "go ${go_directive:-1.26.0}"
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    echo "replace ("
    for m in "${staging[@]}"; do
      if grep -qE "^[[:space:]]+$m v0\.0\.0( |$)" "$kube_mod"; then echo "	$m => $m $staging_version"; fi
    done
    echo ")"
  } >go.mod
  rm -f go.sum
  pkgs=()
  for c in "${all_components[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  go get "${pkgs[@]/%/@$KUBE_VERSION}" || die "go get of k8s.io/kubernetes@$KUBE_VERSION failed (see above)"
fi

# version stamps, as Kubernetes' hack/lib/version.sh sets them
commit="$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^[[:space:]]*"Hash": "\(.*\)",$/\1/p' | head -1)"
minor="${KUBE_VERSION#v1.}"
minor="${minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  [ -z "$commit" ] || ldflags+=" -X $pkg.gitCommit=$commit"
done

tmp_bin="$(mktemp -d "$version_dir/bin.tmp.XXXXXX")"
trap 'rm -rf "$tmp_bin"' EXIT
pkgs=()
for c in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
log "building ${missing[*]} ($KUBE_VERSION, $go_version, -p $jobs) into $bin_dir"
start=$(date +%s)
nice -n 10 go build -p "$jobs" -trimpath -ldflags "$ldflags" -o "$tmp_bin/" "${pkgs[@]}" \
  || die "go build of ${missing[*]} failed (see above)"
for c in "${missing[@]}"; do
  [ -x "$tmp_bin/$c" ] || die "go build produced no $c"
  mv -f "$tmp_bin/$c" "$bin_dir/$c"
done
log "built ${missing[*]} in $(($(date +%s) - start)) s"
"$bin_dir/${missing[0]}" --version 2>/dev/null || "$bin_dir/${missing[0]}" version --client 2>/dev/null || true
}

main "$@"
