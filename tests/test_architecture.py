"""Import contracts between kelvin's packages, read from the source with :mod:`ast` (nothing is imported).

* ``scheduler_plugin.model`` imports nothing of ours outside ``model``: it is the plain data everything else shares.
* ``scheduler_plugin.policies`` never imports ``telemetry``, ``extender``, ``simulator``, ``deviceplugin``,
  ``exporter`` nor the operator: scoring is pure and sees a snapshot, never where it came from.
* ``scheduler_plugin`` never imports ``kelvin_operator``: the operator builds on the extender's packages, not the
  other way round.

Every import counts, wherever it sits (module level, inside a function, under ``TYPE_CHECKING``, ``__import__`` of a
constant name). Today's exceptions are in :data:`ALLOWED`, each with its reason; an entry that no longer matches an
import fails the test too, so the list can only shrink.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = (ROOT / "scheduler_plugin", ROOT / "operator" / "kelvin_operator")

POLICIES_NEVER_IMPORT = ("telemetry", "extender", "simulator", "deviceplugin", "exporter", "operator")

#: (importing module, imported module) -> why it is allowed for now. Remove an entry with the import it names.
ALLOWED: dict[tuple[str, str], str] = {
    ("scheduler_plugin.policies.framework", "scheduler_plugin.telemetry.ledger"): (
        "the framework owns the assumed-allocation ledger (it applies its overlay and records binds); where the "
        "ledger lives is part of issue 15's redesign of per-snapshot and cycle state"
    ),
    ("scheduler_plugin.cli", "kelvin_operator.cli"): (
        "the one `kelvin` console script registers the `kelvin operator` subcommand; the registration moves out of "
        "scheduler_plugin with issue 15's explicit command registry"
    ),
}


@dataclass(frozen=True, slots=True)
class Import:
    importer: str
    imported: str
    where: str  # path:line

    def __str__(self) -> str:
        return f"{self.where}: {self.importer} imports {self.imported}"


def module_name(path: Path) -> tuple[str, bool]:
    """The dotted name of a source file (``operator/`` is a plain folder) and whether it is a package's ``__init__``."""
    rel = path.relative_to(ROOT).with_suffix("").parts
    if rel[0] == "operator":
        rel = rel[1:]
    is_package = rel[-1] == "__init__"
    return ".".join(rel[:-1] if is_package else rel), is_package


def imports_of(path: Path) -> Iterator[Import]:
    """Every module ``path`` imports, relative imports resolved; ``from a import b`` yields ``a`` and ``a.b`` (``b``
    may be a submodule)."""
    name, is_package = module_name(path)
    package = name.split(".") if is_package else name.split(".")[:-1]
    rel = path.relative_to(ROOT)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        where = f"{rel}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(name, alias.name, where)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield Import(name, target, where)
            for alias in node.names:
                yield Import(name, f"{target}.{alias.name}", where)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "__import__"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield Import(name, node.args[0].value, where)


def all_imports() -> list[Import]:
    files = sorted(p for src in SOURCES for p in src.rglob("*.py") if "v1beta1" not in p.parts)  # generated stubs
    assert files, f"no sources under {SOURCES}"
    return [imp for f in files for imp in imports_of(f)]


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def broken_contract(imp: Import) -> str | None:
    """The contract ``imp`` breaks, or None."""
    ours = within(imp.imported, "scheduler_plugin") or within(imp.imported, "kelvin_operator")
    if within(imp.importer, "scheduler_plugin.model") and ours and not within(imp.imported, "scheduler_plugin.model"):
        return "model imports nothing of ours outside model"
    if within(imp.importer, "scheduler_plugin.policies"):
        banned = [f"scheduler_plugin.{p}" for p in POLICIES_NEVER_IMPORT] + ["kelvin_operator"]
        if any(within(imp.imported, b) for b in banned):
            return "policies never import telemetry, extender, simulator, deviceplugin, exporter or the operator"
    if within(imp.importer, "scheduler_plugin") and within(imp.imported, "kelvin_operator"):
        return "scheduler_plugin never imports kelvin_operator"
    return None


def allowed_key(imp: Import) -> tuple[str, str] | None:
    """The :data:`ALLOWED` entry covering ``imp`` (the imported module or a name imported from it)."""
    for importer, imported in ALLOWED:
        if imp.importer == importer and within(imp.imported, imported):
            return importer, imported
    return None


def test_the_scan_sees_relative_imports() -> None:
    """The resolution the contracts rely on: ``from ..telemetry.ledger import X`` in policies/framework.py is
    ``scheduler_plugin.telemetry.ledger``; ``from . import annotations`` in model/request.py stays in model."""
    framework = {i.imported for i in imports_of(ROOT / "scheduler_plugin" / "policies" / "framework.py")}
    assert "scheduler_plugin.telemetry.ledger.AssumedLedger" in framework
    request = {i.imported for i in imports_of(ROOT / "scheduler_plugin" / "model" / "request.py")}
    assert "scheduler_plugin.model.annotations" in request


@pytest.mark.parametrize(
    ("imp", "contract"),
    [
        (Import("scheduler_plugin.model.gpu", "scheduler_plugin.policies.base", "x"), "model imports nothing"),
        (Import("scheduler_plugin.model", "kelvin_operator.pods", "x"), "model imports nothing"),
        (Import("scheduler_plugin.policies.fit", "scheduler_plugin.telemetry.cache", "x"), "policies never"),
        (Import("scheduler_plugin.policies", "scheduler_plugin.exporter.nvml", "x"), "policies never"),
        (Import("scheduler_plugin.simulator.engine", "kelvin_operator.planner", "x"), "scheduler_plugin never"),
        (Import("scheduler_plugin.policies.fit", "scheduler_plugin.model.gpu", "x"), None),
        (Import("scheduler_plugin.policies.config", "scheduler_plugin.operator_settings", "x"), None),
        (Import("scheduler_plugin.model.gpu", "numpy", "x"), None),
        (Import("kelvin_operator.planner", "scheduler_plugin.policies.thermal", "x"), None),
    ],
)
def test_contract_rules(imp: Import, contract: str | None) -> None:
    found = broken_contract(imp)
    assert (found is None) if contract is None else (found is not None and found.startswith(contract))


def test_import_contracts_hold() -> None:
    broken = [f"{imp} ({why})" for imp in all_imports() if (why := broken_contract(imp)) and not allowed_key(imp)]
    assert not broken, "import contracts broken:\n" + "\n".join(broken)


def test_every_allowed_exception_is_still_needed() -> None:
    """An entry whose import is gone is removed from :data:`ALLOWED`, so that it cannot come back unnoticed."""
    used = {key for imp in all_imports() if broken_contract(imp) and (key := allowed_key(imp))}
    stale = sorted(set(ALLOWED) - used)
    assert not stale, f"ALLOWED entries that match no import any more (remove them): {stale}"
