"""Container images for the e2e kubelet node, built locally: no registry is reachable from the test machines.

One docker-archive (the format ``docker save`` writes, which ``ctr images import`` reads) with two images over the
same single layer, Debian's statically linked busybox (package ``busybox-static``) and its applet links:

* ``docker.io/library/busybox:e2e`` (``busybox:e2e`` in a pod spec): ``sh`` by default; pods give their command;
* ``docker.io/kelvin-e2e/pause:e2e``: ``sleep infinity``, containerd's ``sandbox_image`` (the pod sandbox's process).

The layer is deterministic (fixed owners and mtimes), so the same busybox gives the same image IDs.

    python -m tests.e2e.images.busybox OUT.tar [--busybox /bin/busybox]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import struct
import sys
import tarfile
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
IMAGE = "docker.io/library/busybox:e2e"
SANDBOX_IMAGE = "docker.io/kelvin-e2e/pause:e2e"
#: The applets the scenarios run, linked to /bin/busybox.
APPLETS = ("sh", "sleep", "env", "cat", "echo", "ls", "true", "false", "kill", "ps")
_MTIME = 1_700_000_000  # fixed: the same busybox always gives the same layer digest


def is_static(binary: Path) -> bool:
    """A 64-bit little-endian ELF without a program interpreter (PT_INTERP): it runs in an image with no libc.
    Debian's ``busybox`` package (dynamic) installs /bin/busybox too; only ``busybox-static``'s will do."""
    data = binary.read_bytes()
    if data[:6] != b"\x7fELF\x02\x01":
        return False
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    pt_interp = 3
    return all(struct.unpack_from("<I", data, phoff + i * phentsize)[0] != pt_interp for i in range(phnum))


def _member(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.linkname = link
    info.mtime = _MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def layer(busybox: Path = BUSYBOX) -> bytes:
    """The image's root filesystem as an uncompressed tar: /bin/busybox, its applet links and the empty folders a
    container runtime mounts over."""
    data = busybox.read_bytes()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for folder in ("bin", "dev", "etc", "proc", "sys", "tmp", "var", "var/run"):
            tar.addfile(_member(folder, tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755))
        tar.addfile(_member("bin/busybox", tarfile.REGTYPE, 0o755, len(data)), io.BytesIO(data))
        for applet in APPLETS:
            tar.addfile(_member(f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox"))
        passwd = b"root:x:0:0:root:/:/bin/sh\n"
        tar.addfile(_member("etc/passwd", tarfile.REGTYPE, 0o644, len(passwd)), io.BytesIO(passwd))
    return out.getvalue()


def _config(diff_id: str, entrypoint: list[str] | None, cmd: list[str]) -> bytes:
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "2023-11-14T22:13:20Z",
        "config": {"Env": ["PATH=/bin"], "Entrypoint": entrypoint, "Cmd": cmd, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "2023-11-14T22:13:20Z", "created_by": "tests/e2e/images/busybox.py"}],
    }
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def build(out: Path, busybox: Path = BUSYBOX) -> tuple[str, str]:
    """Write the docker-archive to ``out``; returns the two image references (:data:`IMAGE`, :data:`SANDBOX_IMAGE`)."""
    if not busybox.is_file():
        raise FileNotFoundError(
            f"{busybox} is missing: install Debian's busybox-static (apt-get install busybox-static)"
        )
    if not is_static(busybox):
        raise FileNotFoundError(
            f"{busybox} is not statically linked: install Debian's busybox-static instead of busybox"
        )
    rootfs = layer(busybox)
    diff_id = "sha256:" + hashlib.sha256(rootfs).hexdigest()
    layer_path = f"{diff_id.removeprefix('sha256:')}/layer.tar"
    images = {IMAGE: _config(diff_id, None, ["sh"]), SANDBOX_IMAGE: _config(diff_id, ["/bin/sleep"], ["infinity"])}
    manifest = []
    with tarfile.open(out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(_member(layer_path.split("/")[0], tarfile.DIRTYPE, 0o755))
        tar.addfile(_member(layer_path, tarfile.REGTYPE, 0o644, len(rootfs)), io.BytesIO(rootfs))
        for ref, config in images.items():
            config_path = hashlib.sha256(config).hexdigest() + ".json"
            tar.addfile(_member(config_path, tarfile.REGTYPE, 0o644, len(config)), io.BytesIO(config))
            manifest.append({"Config": config_path, "RepoTags": [ref], "Layers": [layer_path]})
        data = json.dumps(manifest).encode()
        tar.addfile(_member("manifest.json", tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
    return IMAGE, SANDBOX_IMAGE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path)
    parser.add_argument("--busybox", type=Path, default=BUSYBOX)
    args = parser.parse_args(argv)
    try:
        refs = build(args.out, args.busybox)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.out}: {', '.join(refs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
