"""Where the e2e suite finds its Kubernetes binaries: the cache of ``hack/build-kube.sh`` (which owns the pinned
version), etcd on PATH (Debian's etcd-server)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "hack" / "build-kube.sh"
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")


class MissingBinaries(Exception):
    """What is missing, and how to get it."""


@dataclass(frozen=True)
class KubeBinaries:
    bin_dir: Path
    etcd: Path
    kubectl: Path

    def __getitem__(self, name: str) -> Path:
        return self.bin_dir / name

    @property
    def version(self) -> str:
        """The pinned release, the name of the cache folder (``.../<version>/bin``)."""
        return self.bin_dir.parent.name


def bin_dir() -> Path:
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-bin-dir"], capture_output=True, text=True, check=True, timeout=30
    )
    return Path(out.stdout.strip())


def find() -> KubeBinaries:
    """The binaries, or :class:`MissingBinaries` naming each missing one and ``bash hack/build-kube.sh``."""
    directory = bin_dir()
    missing = [name for name in CONTROL_PLANE if not os.access(directory / name, os.X_OK)]
    etcd = shutil.which("etcd")
    if etcd is None:
        missing.append("etcd (Debian package etcd-server)")
    # kubectl of the same release when it was built; else one within the supported skew (checked by the caller)
    kubectl = directory / "kubectl"
    if not os.access(kubectl, os.X_OK):
        local = ROOT / ".ci" / "tools" / "bin" / "kubectl"
        kubectl = local if local.exists() else Path(shutil.which("kubectl") or directory / "kubectl")
    if not os.access(kubectl, os.X_OK):
        missing.append("kubectl")
    if missing:
        raise MissingBinaries(
            f"e2e needs {', '.join(missing)} of Kubernetes {directory.parent.name} in {directory}: "
            f"run `bash hack/build-kube.sh` first"
        )
    assert etcd is not None
    return KubeBinaries(bin_dir=directory, etcd=Path(etcd), kubectl=kubectl)
