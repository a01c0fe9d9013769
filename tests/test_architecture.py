"""Import contracts between kelvin's packages: those of ``[tool.importlinter]`` in pyproject.toml (the one place they
are written; docs/architecture.md lists them), checked here with import-linter as ``lint-imports`` checks them in
.ci/run, and what import-linter cannot see: a dynamic import (``__import__`` or ``importlib.import_module`` of a
constant name), kept to ``scheduler_plugin.cli`` (the command registration).

Every contract is also shown to catch a violation: the real import graph plus one import it forbids breaks it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from copy import deepcopy
from pathlib import Path
from typing import Any

import grimp
import importlinter.api  # noqa: F401  (configures import-linter: its graph builder and contract types)
import pytest
from importlinter.application.use_cases import lint_imports, read_user_options
from importlinter.application.user_options import UserOptions
from importlinter.contracts.forbidden import ForbiddenContract

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
SOURCES = (ROOT / "scheduler_plugin", ROOT / "operator" / "kelvin_operator")
OURS = ("scheduler_plugin", "kelvin_operator")

#: Modules that may import kelvin's modules dynamically: the ``kelvin`` command registers each subcommand's module.
DYNAMIC_IMPORTERS = frozenset({"scheduler_plugin.cli"})


@pytest.fixture(scope="module")
def options() -> UserOptions:
    return read_user_options(str(PYPROJECT))


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*OURS, cache_dir=None)


def contract(options: UserOptions, contract_id: str) -> ForbiddenContract:
    found = [c for c in options.contracts_options if c.get("id") == contract_id]
    assert len(found) == 1, f"pyproject.toml has no contract with id {contract_id!r}"
    assert found[0]["type"] == "forbidden"
    return ForbiddenContract(name=found[0]["name"], session_options=options.session_options, contract_options=found[0])


def test_import_contracts_hold(options: UserOptions, capsys: pytest.CaptureFixture[str]) -> None:
    """What ``lint-imports`` runs (its report, with the chains of any broken contract, is the failure message)."""
    passed = lint_imports(str(PYPROJECT), cache_dir=None, no_logo=True)
    report = capsys.readouterr().out
    assert passed, report
    assert f"Contracts: {len(options.contracts_options)} kept, 0 broken." in report
    assert len(options.contracts_options) >= 7


@pytest.mark.parametrize(
    ("contract_id", "importer", "imported"),
    [
        ("model", "scheduler_plugin.model.gpu", "scheduler_plugin.policies.base"),
        ("model", "scheduler_plugin.model.request", "scheduler_plugin.settings"),
        ("model", "scheduler_plugin.model", "kelvin_operator.pods"),
        ("policies", "scheduler_plugin.policies.fit", "scheduler_plugin.telemetry.cache"),
        ("policies", "scheduler_plugin.policies.thermal", "scheduler_plugin.exporter.backend"),
        ("no-operator", "scheduler_plugin.simulator.engine", "kelvin_operator.planner"),
        ("telemetry", "scheduler_plugin.telemetry.cache", "scheduler_plugin.extender.service"),
        ("extender-on-top", "kelvin_operator.cli", "scheduler_plugin.extender.cli"),
        ("extender-on-top", "scheduler_plugin.telemetry.cache", "scheduler_plugin.extender.errors"),
        ("node-agents", "scheduler_plugin.exporter.collector", "scheduler_plugin.telemetry.cache"),
        ("deviceplugin", "scheduler_plugin.deviceplugin.allocation", "scheduler_plugin.exporter.collector"),
        # indirect: the policies import hotness.py; were it to import telemetry, the policies would reach it through it
        ("policies", "scheduler_plugin.hotness", "scheduler_plugin.telemetry.gate"),
    ],
)
def test_each_contract_catches_an_import_it_forbids(
    options: UserOptions, graph: grimp.ImportGraph, contract_id: str, importer: str, imported: str
) -> None:
    c = contract(options, contract_id)
    assert c.check(deepcopy(graph), verbose=False).kept  # as the tree is
    bad = deepcopy(graph)
    bad.add_import(importer=importer, imported=imported, line_number=1, line_contents=f"import {imported}")
    assert not c.check(bad, verbose=False).kept


def test_an_allowed_import_keeps_the_contract(options: UserOptions, graph: grimp.ImportGraph) -> None:
    bad = deepcopy(graph)
    bad.add_import(
        importer="scheduler_plugin.policies.fit", imported="scheduler_plugin.model.gpu", line_number=1, line_contents=""
    )
    assert contract(options, "policies").check(bad, verbose=False).kept


# -- dynamic imports: invisible to import-linter ---------------------------------------------------------------------


def module_name(path: Path) -> str:
    """The dotted name of a source file (``operator/`` is a plain folder)."""
    rel = path.relative_to(ROOT).with_suffix("").parts
    if rel[0] == "operator":
        rel = rel[1:]
    return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)


def dynamic_imports(source: str) -> Iterator[str]:
    """The constant module names ``source`` imports with ``__import__(...)`` or ``import_module(...)``."""
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
            continue
        func: Any = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name in ("__import__", "import_module") and isinstance(node.args[0].value, str):
            yield node.args[0].value


def test_dynamic_imports_are_found() -> None:
    src = "import importlib\nx = __import__('scheduler_plugin.cli', fromlist=['a'])\nimportlib.import_module('os')\n"
    assert list(dynamic_imports(src)) == ["scheduler_plugin.cli", "os"]


def test_only_the_command_registration_imports_our_modules_dynamically() -> None:
    files = sorted(p for src in SOURCES for p in src.rglob("*.py") if "v1beta1" not in p.parts)  # generated stubs
    assert files, f"no sources under {SOURCES}"
    found = {
        (module_name(f), target)
        for f in files
        for target in dynamic_imports(f.read_text(encoding="utf-8"))
        if target.split(".")[0] in OURS
    }
    elsewhere = sorted(pair for pair in found if pair[0] not in DYNAMIC_IMPORTERS)
    assert not elsewhere, f"dynamic imports import-linter cannot check (use a plain import): {elsewhere}"
