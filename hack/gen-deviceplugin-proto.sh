#!/usr/bin/env bash
# Regenerate the Python modules of the kubelet device-plugin API (v1beta1) from
# scheduler_plugin/deviceplugin/v1beta1/api.proto. Needs grpcio-tools (pip install grpcio-tools).
# tests/deviceplugin/test_proto.py checks that the committed modules match this script's output.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-.}"
"${PYTHON:-python}" -m grpc_tools.protoc -I. \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  scheduler_plugin/deviceplugin/v1beta1/api.proto
