"""Installing kelvin on the loopback cluster: the README's manifests install exactly as docs/install.md gives it, and
chart renders applied server-side with strict field validation."""

from __future__ import annotations

import re
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


def documented_manifest_install(doc: Path = INSTALL_DOC) -> list[list[str]]:
    """The kubectl commands of docs/install.md's install without Helm, in order: the paragraph that starts with
    "Without Helm" up to the next heading, from its fenced code lines and its inline code alike."""
    text = doc.read_text()
    start = text.find("Without Helm")
    if start < 0:
        raise AssertionError(f"{doc}: no 'Without Helm' install paragraph")
    end = text.find("\n#", start)
    section = text[start : end if end > 0 else len(text)]
    commands: list[list[str]] = []
    in_fence = False
    for line in section.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            code = line.split(" #", 1)[0].strip()
            if code.startswith("kubectl "):
                commands.append(shlex.split(code))
        else:
            commands.extend(shlex.split(m) for m in re.findall(r"`(kubectl [^`]+)`", line))
    if not commands:
        raise AssertionError(f"{doc}: the 'Without Helm' paragraph gives no kubectl command")
    return commands


@dataclass(frozen=True)
class Step:
    argv: list[str]
    returncode: int
    output: str


def run_documented(cluster: LoopbackCluster, commands: list[list[str]]) -> list[Step]:
    """Run each command as written (kubectl's default --validate=strict: the API server's fieldValidation=Strict),
    from the repository root, against the admin kubeconfig; stop at the first failure, as a shell would."""
    steps = []
    for argv in commands:
        assert argv[0] == "kubectl", argv
        proc = subprocess.run(
            [str(cluster.bins.kubectl), f"--kubeconfig={cluster.admin_kubeconfig}", *argv[1:]],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        steps.append(Step(argv, proc.returncode, proc.stdout + proc.stderr))
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
