#!/usr/bin/env bash
# Installs what the e2e suite's kubelet node (tests/e2e/kubelet.py, docs/e2e.md "The kubelet node") runs, from
# Debian: containerd (with ctr and containerd-shim-runc-v2), runc, containernetworking-plugins (/usr/lib/cni/loopback)
# and busybox-static (a statically linked /bin/busybox: the node's images are built from it; Debian's `busybox` is
# dynamically linked and is replaced). Idempotent: installs only when one is missing, so a re-run does nothing.
#
# What it needs: a Debian-based system (apt-get) and root, as the kubelet node itself. Without them it says so and
# goes on; the kubelet node's tests then fail under CI=true and skip with the reason elsewhere. The Debian containerd
# service is never used (the fixture runs a containerd of its own, with its own config, socket and folders).
set -euo pipefail

have_all() {
  command -v containerd >/dev/null 2>&1 && command -v ctr >/dev/null 2>&1 \
    && command -v containerd-shim-runc-v2 >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 \
    && [ -x /usr/lib/cni/loopback ] && [ -x /bin/busybox ] \
    && ! ldd /bin/busybox >/dev/null 2>&1  # ldd succeeds only on a dynamically linked binary
}

if have_all; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    containerd runc containernetworking-plugins busybox-static >/dev/null
  have_all || { echo "install-kubelet-node: installed, but a tool is still missing" >&2; exit 1; }
else
  echo "install-kubelet-node: the e2e kubelet node needs root on a Debian-based system (apt-get) for containerd," \
    "runc, containernetworking-plugins and busybox-static: install them yourself; until then its tests fail" \
    "under CI=true and skip otherwise" >&2
fi
