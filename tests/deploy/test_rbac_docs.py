"""The RBAC the docs list is what the chart renders: install.md's table of every kelvin role, operator.md's
ClusterRole table (grants compared as (apiGroup, resource, verb) sets; resourceNames are not compared)."""

from __future__ import annotations

import re

from deploy_helpers import ROOT, Doc, Render, by_kind

Grant = tuple[str, str, str]
CODE = re.compile(r"`([^`]*)`")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _grants(group_cell: str, resources_cell: str, verbs_cell: str) -> set[Grant]:
    groups = [g.strip('"') for g in CODE.findall(group_cell)]
    return {(g, r, v) for g in groups for r in CODE.findall(resources_cell) for v in CODE.findall(verbs_cell)}


def _rendered(docs: list[Doc]) -> dict[tuple[str, str], set[Grant]]:
    out: dict[tuple[str, str], set[Grant]] = {}
    for kind in ("ClusterRole", "Role"):
        for d in by_kind(docs, kind):
            out[(kind, d["metadata"]["name"])] = {
                (g, r, v)
                for rule in d["rules"]
                for g in rule["apiGroups"]
                for r in rule["resources"]
                for v in rule["verbs"]
            }
    return out


def install_table() -> dict[tuple[str, str], set[Grant]]:
    text = (ROOT / "docs" / "install.md").read_text()
    table: dict[tuple[str, str], set[Grant]] = {}
    for line in text.splitlines():
        m = re.match(r"\s*\| (ClusterRole|Role) `([^`]+)` \|", line)
        if m:
            _, groups, resources, verbs, _why = _cells(line)
            table.setdefault((m.group(1), m.group(2)), set()).update(_grants(groups, resources, verbs))
    return table


def operator_table() -> set[Grant]:
    text = (ROOT / "docs" / "operator.md").read_text()
    section = text.split("ClusterRole for the operator's ServiceAccount:", 1)[1]
    rows = [ln for ln in section.splitlines()[2:] if ln.startswith("| `")]
    grants: set[Grant] = set()
    for line in rows:
        groups, resources, verbs, _why = _cells(line)
        grants |= _grants(groups, resources, verbs)
    return grants


def test_install_md_lists_the_charts_roles(render: Render) -> None:
    rendered = _rendered(render(None, "devicePlugin.enabled=true"))  # every role: source scrape is the default
    documented = install_table()
    assert documented, "no RBAC table found in docs/install.md"
    assert documented == rendered


def test_install_md_table_parses_what_it_shows() -> None:
    extender = install_table()[("ClusterRole", "kelvin-extender")]
    assert extender == {
        ("", "pods", "get"),
        ("", "pods", "list"),
        ("", "pods/binding", "create"),
        ("policy", "poddisruptionbudgets", "list"),
        ("", "nodes", "list"),
    }


def test_operator_md_lists_the_operators_cluster_role(render: Render) -> None:
    rendered = _rendered(render())[("ClusterRole", "kelvin-operator")]
    documented = operator_table()
    assert ("", "events", "patch") in documented
    assert documented == rendered
