"""The strict YAML loader every kelvin file goes through: duplicate keys and deep nesting refused, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scheduler_plugin import yamlfile
from scheduler_plugin.kubeapi import KubeConfig, KubeError
from scheduler_plugin.simulator.simulated_fleet import FleetSpec, FleetSpecError


def problem(text: str) -> str:
    with pytest.raises(yaml.YAMLError) as exc:
        yamlfile.safe_load(text)
    return yamlfile.describe(exc.value)


def test_a_duplicate_key_is_refused_naming_its_line_and_the_first() -> None:
    assert problem("thermal: {weight: 1, weight: 50}\n") == (
        "line 1, column 22: duplicate key 'weight' (first set on line 1); a key may appear once in a mapping"
    )
    assert problem("a: 1\nb:\n  c: 2\na: 3\n").startswith("line 4, column 1: duplicate key 'a' (first set on line 1)")
    assert "duplicate key 1" in problem("{1: a, 1: b}")  # equal after construction, whatever the key's type


def test_merge_keys_may_be_overridden_and_sequences_repeat_freely() -> None:
    """``<<: *base`` then an explicit key is YAML's override, not a duplicate."""
    assert yamlfile.safe_load("base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n")["c"] == {"x": 3, "y": 2}
    assert yamlfile.safe_load("- a\n- a\n") == ["a", "a"]
    assert yamlfile.safe_load("") is None
    assert list(yamlfile.safe_load_all("a: 1\n---\na: 2\n")) == [{"a": 1}, {"a": 2}]


def test_nesting_is_bounded_without_recursing() -> None:
    ok = "[" * yamlfile.MAX_DEPTH + "]" * yamlfile.MAX_DEPTH
    assert yamlfile.safe_load(ok) is not None
    for deep in ("[" * 10_000 + "]" * 10_000, "".join("  " * i + "k:\n" for i in range(10_000))):
        assert f"nested more than {yamlfile.MAX_DEPTH} levels deep" in problem(deep)


def test_describe_is_one_line_for_every_yaml_error() -> None:
    for text in ("a: [1, 2\n", "a: b: c\n", "\t- x\n", "a: *nope\n"):
        line = problem(text)
        assert "\n" not in line and line.startswith("line "), line


def test_the_fleet_file_is_read_strictly(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("seed: 1\ngroups: [{count: 2, count: 3}]\n")
    with pytest.raises(FleetSpecError, match=r"not valid YAML \(line 2, column 21: duplicate key 'count'"):
        FleetSpec.from_yaml(path)


def test_the_kubeconfig_is_read_strictly_and_its_server_checked(tmp_path: Path) -> None:
    def kubeconfig(server: str, extra: str = "") -> Path:
        path = tmp_path / "kubeconfig"
        path.write_text(
            f"current-context: c\ncontexts: [{{name: c, context: {{cluster: k}}}}]\n"
            f"clusters: [{{name: k, cluster: {{{server}}}}}]\n{extra}"
        )
        return path

    assert KubeConfig.from_kubeconfig(kubeconfig("server: 'https://10.0.0.1:6443/'")).server == "https://10.0.0.1:6443"
    with pytest.raises(KubeError, match=r"cluster 'k': server: must be an http\(s\) URL with a host"):
        KubeConfig.from_kubeconfig(kubeconfig("server: 'not a url'"))
    with pytest.raises(KubeError, match=r"cluster 'k': server: must be an http\(s\) URL"):  # was a KeyError
        KubeConfig.from_kubeconfig(kubeconfig("insecure-skip-tls-verify: true"))
    with pytest.raises(KubeError, match=r"duplicate key 'current-context'"):
        KubeConfig.from_kubeconfig(kubeconfig("server: 'https://h'", "current-context: d\n"))
    path = tmp_path / "list"
    path.write_text("- a\n")
    with pytest.raises(KubeError, match="must be a mapping at the top level, got list"):
        KubeConfig.from_kubeconfig(path)
    with pytest.raises(KubeError, match="must not carry credentials"):
        KubeConfig.load(server="https://u:p@10.0.0.1")
