"""Installing kelvin on the loopback cluster: the README's manifests install exactly as docs/install.md gives it, and
chart renders applied server-side with strict field validation."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.e2e.cluster import LoopbackCluster
from tests.e2e.kubebin import ROOT

INSTALL_DOC = ROOT / "docs" / "install.md"
KOPF_CRDS = ("clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev")
#: Every optional part of the chart on (tests/e2e/all-options-values.yaml).
ALL_OPTIONS_VALUES = Path(__file__).with_name("all-options-values.yaml")


def documented_manifest_install(doc: Path = INSTALL_DOC) -> list[str]:
    """The commands of docs/install.md's install without Helm, in order: the lines of the fenced code in the paragraph
    that starts with "Without Helm", up to the next heading (trailing ``# comments`` dropped)."""
    text = doc.read_text()
    start = text.find("Without Helm")
    if start < 0:
        raise AssertionError(f"{doc}: no 'Without Helm' install paragraph")
    end = text.find("\n#", start)
    section = text[start : end if end > 0 else len(text)]
    commands: list[str] = []
    in_fence = False
    for line in section.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        code = line.split(" #", 1)[0].strip()
        if in_fence and code and not code.startswith("#"):
            commands.append(code)
    if not commands:
        raise AssertionError(f"{doc}: the 'Without Helm' paragraph gives no command")
    return commands


@dataclass(frozen=True)
class Step:
    command: str
    returncode: int
    output: str

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.command)


def run_documented(cluster: LoopbackCluster, commands: list[str]) -> list[Step]:
    """Run each command as written, with bash, from the repository root, against the admin kubeconfig, with the pinned
    release's kubectl first on PATH (kubectl's default --validate=strict: the API server's fieldValidation=Strict);
    stop at the first failure, as ``set -e`` would."""
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.admin_kubeconfig),
        "PATH": f"{cluster.bins.kubectl.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBECTL": str(cluster.bins.kubectl),
    }
    steps = []
    for command in commands:
        proc = subprocess.run(
            ["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False
        )
        steps.append(Step(command, proc.returncode, proc.stdout + proc.stderr))
        if proc.returncode != 0:
            break
    return steps


def helm_template(
    helm: str, release: str, namespace: str, out: Path, values: Sequence[Path] = (), api_versions: Sequence[str] = ()
) -> Path:
    """The chart rendered without its CRDs (crds/: applied on their own, shared by every release)."""
    argv = [helm, "template", release, str(ROOT / "helm" / "kelvin"), "--namespace", namespace]
    for v in values:
        argv += ["-f", str(v)]
    for a in api_versions:
        argv += ["--api-versions", a]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    out.write_text(proc.stdout)
    return out
