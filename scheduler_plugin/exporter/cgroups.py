"""Which pod a process belongs to: ``/proc/<pid>/cgroup`` for the pod UID, ``/var/log/pods`` for its name.

The exporter sees host pids from NVML, so it must run with ``hostPID: true`` and read the host's ``/proc``. The
cgroup path names the pod UID under every layout kubelet produces:

- cgroup v1, cgroupfs driver: ``11:memory:/kubepods/burstable/pod<uid>/<container-id>``
- cgroup v1/v2, systemd driver: ``0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice/
  cri-containerd-<id>.scope`` (``crio-<id>.scope`` for CRI-O, ``docker-<id>.scope`` for dockershim)
- cgroup v2, cgroupfs driver: ``0::/kubepods/besteffort/pod<uid>/<container-id>``
- nested (kind, k3s): ``/kubelet.slice/kubelet-kubepods.slice/...``, and containerd's
  ``.../kubepods-pod<uid>.slice:cri-containerd:<id>``

Kubelet names each pod's log directory ``/var/log/pods/<namespace>_<name>_<uid>``; namespace and pod names cannot
contain ``_``, so the split is unambiguous. Mount it read-only to get names; without it only the UID is known.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

_POD_UID = re.compile(
    r"kubepods[^\n]*?pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})"
)


def pod_uid_from_cgroup(text: str) -> str | None:
    """The pod UID in the content of a ``/proc/<pid>/cgroup`` file, or ``None`` for a process outside any pod."""
    for line in text.splitlines():
        match = _POD_UID.search(line)
        if match:
            return match.group(1).replace("_", "-").lower()
    return None


def pod_uid_for_pid(proc_root: Path, pid: int) -> str | None:
    """The pod UID of host process ``pid`` (``None`` when it has exited or is not in a pod)."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    return pod_uid_from_cgroup(text)


class PodDirectory:
    """Pod UID -> (namespace, name), from kubelet's log directories. Relisted when an unknown UID is asked for."""

    def __init__(self, pods_dir: Path | None, min_relist_s: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self._dir = pods_dir
        self._min_relist_s = min_relist_s
        self._clock = clock
        self._names: dict[str, tuple[str, str]] = {}
        self._listed_at: float | None = None

    def lookup(self, uid: str) -> tuple[str, str] | None:
        if self._dir is None:
            return None
        found = self._names.get(uid)
        now = self._clock()
        if found is None and (self._listed_at is None or now - self._listed_at >= self._min_relist_s):
            self._relist()
            self._listed_at = now
            found = self._names.get(uid)
        return found

    def _relist(self) -> None:
        assert self._dir is not None
        names: dict[str, tuple[str, str]] = {}
        try:
            entries = list(self._dir.iterdir())
        except OSError:
            entries = []
        for entry in entries:
            parts = entry.name.split("_")
            if len(parts) == 3 and all(parts):
                names[parts[2].lower()] = (parts[0], parts[1])
        self._names = names
