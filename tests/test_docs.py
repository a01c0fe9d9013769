"""The user docs say what the code does: commands name files that exist, messages and defaults are the real ones,
policy keys are camelCase, no references to the project's issue tracker, and the benchmarks print what the README says
they print."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kelvin_operator.settings import OperatorConfig
from pydantic import BaseModel
from typer.testing import CliRunner

from scheduler_plugin.cli import app
from scheduler_plugin.policies import Framework, PolicyConfig
from scheduler_plugin.policies.keys import _models_in, camel
from scheduler_plugin.policies.plugins import PRODUCTION
from scheduler_plugin.policies.registry import PolicyConfigError
from scheduler_plugin.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
USER_DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "helm" / "kelvin" / "README.md"]


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n#", start + len(heading))
    return text[start : end if end != -1 else len(text)]


def _code_block(text: str) -> str:
    m = re.search(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S)
    assert m, "no code block"
    return m.group(1)


def _commands(block: str) -> Iterator[list[str]]:
    """Each command of a shell block, continuation lines joined, the trailing comment dropped."""
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words:
            yield words


# -- README -----------------------------------------------------------------------------------------------------------


def _tour() -> list[list[str]]:
    return list(_commands(_code_block(_section((ROOT / "README.md").read_text(), "## A tour without a cluster"))))


def _paths(words: list[str]) -> list[str]:
    return [w for w in words[2:] if not w.startswith("-") and re.search(r"/|\.(ya?ml|csv|json)$", w)]


def test_readme_tour_commands_exist_and_name_files_that_exist() -> None:
    commands = _tour()
    assert len(commands) >= 5
    runner = CliRunner()
    for words in commands:
        assert words[0] == "kelvin", words
        assert runner.invoke(app, [words[1], "--help"]).exit_code == 0, f"no command kelvin {words[1]}"
        for w in _paths(words):
            if not w.startswith("../shared/"):  # README.md, Test data: not in the repository
                assert (ROOT / w).is_file(), f"README tour: {' '.join(words)} names {w}, which does not exist"


def test_readme_tour_names_shared_files_that_exist(traces_dir: Path) -> None:
    shared = [w for words in _tour() for w in _paths(words) if w.startswith("../shared/")]
    assert shared
    for w in shared:
        assert w.startswith("../shared/traces/openb/"), w  # the only shared folder the tour uses
        assert (traces_dir / w.removeprefix("../shared/traces/openb/")).is_file(), f"README tour names {w}"


def test_every_benchmark_the_readme_lists_prints_its_load_average() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "each script prints the load average it ran under" in readme
    benches = sorted(set(re.findall(r"`(bench/[a-z_]+\.py)`", _section(readme, "### Benchmarks"))))
    assert len(benches) >= 5
    silent = [b for b in benches if not re.search(r"load_line\(|getloadavg\(", (ROOT / b).read_text())]
    assert not silent, f"these do not print the load average: {silent}"


# -- docs/ ------------------------------------------------------------------------------------------------------------


def test_user_docs_cite_no_issue_numbers() -> None:
    """An issue number means nothing to a reader of the public docs."""
    found = [
        f"{doc.relative_to(ROOT)}:{n}: {line.strip()}"
        for doc in USER_DOCS
        for n, line in enumerate(doc.read_text().splitlines(), 1)
        if re.search(r"\bissue \d+|\bthe issue's\b|\bissue #\d+", line, re.I)
    ]
    assert not found, "\n".join(found)


def _policy_field_names() -> set[str]:
    """Python names of every field of the policy file's models whose key (camelCase) is spelled differently."""
    seen: set[type[BaseModel]] = set()
    names: set[str] = set()

    def walk(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, info in model.model_fields.items():
            names.add(name)
            sub, _ = _models_in(info.annotation)
            if sub is not None:
                walk(sub)

    walk(PolicyConfig)
    walk(OperatorConfig)
    for kind in ("score", "picker"):
        for name in PRODUCTION.names(kind):
            walk(PRODUCTION.lookup(kind, name).args_model)
    # settings (KELVIN_* env, documented by their field names) are not policy keys
    return {n for n in names if camel(n) != n} - set(Settings.model_fields)


def test_policy_keys_in_the_docs_are_camel_case() -> None:
    """`webhook.mps_label` is not a key anyone should write (it loads with a warning): the docs teach `mpsLabel`.
    Lines that explain the old spelling are exempt; metrics.md is Prometheus names and labels (snake_case)."""
    snake = _policy_field_names()
    assert {"interval_s", "mps_label", "busy_utilization", "timeout_s"} <= snake
    found = []
    for doc in USER_DOCS:
        if doc.name == "metrics.md":
            continue
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            if "spell" in line:
                continue
            for token in re.findall(r"`([^`\s]+)`", line):
                if any(seg in snake for seg in re.split(r"[.:=]", token)):
                    found.append(f"{doc.relative_to(ROOT)}:{n}: `{token}`")
    assert not found, "old snake_case policy keys in the docs:\n" + "\n".join(found)


@pytest.mark.slow
def test_configuration_md_examples_print_what_it_shows(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    block = re.search(r"^```console\n(.*?)^```", doc, re.M | re.S)
    assert block
    lines = block.group(1).splitlines()
    (tmp_path / "bad.yaml").write_text("scoring:\n  thermal: {weight: -1}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KELVIN_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "operator")])
    checked = 0
    for i, line in enumerate(lines):
        if not line.startswith("$ "):
            continue
        words = shlex.split(line[2:])
        run_env = dict(env)
        while "=" in words[0]:
            k, v = words.pop(0).split("=", 1)
            run_env[k] = v
        assert words[:2] == ["kelvin", "extender"], line
        cmd = [sys.executable, "-c", "from scheduler_plugin.cli import app; app()", *words[1:]]
        proc = subprocess.run(cmd, cwd=tmp_path, env=run_env, capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 2, proc.stderr
        assert (proc.stdout + proc.stderr).strip().splitlines()[-1] == lines[i + 1], line
        checked += 1
    assert checked >= 2


def test_configuration_md_gives_the_real_default_weights() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith("| `scoring.<policy>.weight`"))
    shown = {name: float(w) for name, w in re.findall(r"([a-z-]+) ([0-9.]+)", row.split("|")[2])}
    assert shown == {name: sc.weight for name, sc in PolicyConfig().scoring.items()}


def test_policies_md_gives_the_real_unknown_policy_message() -> None:
    doc = (ROOT / "docs" / "policies.md").read_text()
    shown = re.search(r"`(scoring\.thermall: unknown score policy [^`]*)`", doc)
    assert shown
    with pytest.raises(PolicyConfigError) as exc:
        Framework.from_config(PolicyConfig.from_mapping({"scoring": {"thermall": {"weight": 1}}}))
    assert shown.group(1) == str(exc.value)


# -- the chart's README -----------------------------------------------------------------------------------------------


def test_chart_readme_defaults_and_pod_security_match_the_chart() -> None:
    readme = (ROOT / "helm" / "kelvin" / "README.md").read_text()
    values = yaml.safe_load((ROOT / "helm" / "kelvin" / "values.yaml").read_text())
    row = next(line for line in readme.splitlines() if line.startswith("| `scheduler.extender.managedResources`"))
    shown = re.findall(r"`([^`]+)`", row.split("|")[2])
    assert shown == [r["name"] for r in values["scheduler"]["extender"]["managedResources"]]
    security = _section(readme, "## Pod security")
    assert "device plugin" in security and "uid 0" in security and "privileged" in security
    daemonset = (ROOT / "helm" / "kelvin" / "templates" / "deviceplugin" / "daemonset.yaml").read_text()
    assert "runAsUser: 0" in daemonset  # what the section describes
