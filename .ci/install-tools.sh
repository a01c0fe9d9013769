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
