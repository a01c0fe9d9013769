"""Every ``kelvin`` command off a terminal (CI logs, pipes): one-line errors, unwrapped tables, plain usage errors,
choices and defaults that say what they are, bad files named instead of tracebacks."""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.core
import typer.main
from typer.testing import CliRunner

import scheduler_plugin
from scheduler_plugin.cli import app
from scheduler_plugin.console import UNWRAPPED_WIDTH, LogLevel, console
from scheduler_plugin.simulator.simulated_fleet import FleetSpec, FleetSpecError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
runner = CliRunner()
NOT_UTF8 = b"scoring:\n  thermal: {weight: 1}  # \xff\xfe caf\xe9\n"

NODES_CSV = "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,2,T4\nn1,64000,262144,4,V100M32\n"
PODS_CSV = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,4000,8192,1,1000,\np1,2000,4096,1,500,\n"


def kelvin(
    *argv: str, env: dict[str, str] | None = None, timeout: float = 120, unset: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """``python -m scheduler_plugin.cli`` with stdin, stdout and stderr all pipes (no terminal anywhere), without the
    environment variables named in ``unset``."""
    full_env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'operator'}", **(env or {})}
    for name in unset:
        full_env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "scheduler_plugin.cli", *argv],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=ROOT,
    )


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES_CSV)
    pods.write_text(PODS_CSV)
    return nodes, pods


# -- item 1: nothing wraps or truncates off a terminal ------------------------------------------------------------


def test_console_off_a_terminal_never_wraps() -> None:
    c = console()  # pytest's captured stdout is not a terminal
    assert c.width == UNWRAPPED_WIDTH and c.soft_wrap


@pytest.mark.slow
@pytest.mark.parametrize("force_color", [None, "1"])
def test_errors_are_one_line_and_tables_whole_when_piped(
    trace: tuple[Path, Path], tmp_path: Path, force_color: str | None
) -> None:
    nodes, _ = trace
    deep = tmp_path / ("a-rather-long-directory-name-" * 4) / "and-another-long-one"
    deep.mkdir(parents=True)
    bad = deep / "pods-with-a-bad-cell.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1,x,1000\n")
    env = {"FORCE_COLOR": force_color} if force_color else {}
    res = kelvin("simulate", "--nodes", str(nodes), "--pods", str(bad), "--no-progress", env=env)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert lines == [f"error: {bad}: row 2, column 'num_gpu': 'x' is not an integer"], res.stderr

    nodes, pods = trace
    out = tmp_path / "out"
    ok = kelvin("simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd", "--no-progress",
                "--out", str(out), env=env)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    header = next(line for line in ok.stdout.splitlines() if "policy" in line and "seeds" in line)
    for col in ("alloc @100 %", "unallocated @100 %", "first failure (arrived %)", "s/run"):
        assert col in header, header  # on one line: no column squeezed or cut
    assert f"curve: {out / 'curve.csv'}  plot: {out / 'curve.png'}" in ok.stdout


def test_usage_errors_are_plain_lines_when_piped() -> None:
    res = kelvin("simulate", "--no-such-flag")
    assert res.returncode == 2
    assert "No such option: --no-such-flag" in res.stderr
    assert "╭" not in res.stderr and "│" not in res.stderr, res.stderr


# -- item 11: --log-level ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["extender", "exporter", "operator", "device-plugin"])
def test_log_level_is_a_choice(command: str) -> None:
    # in a subprocess with a timeout: were the level accepted, the command would serve until stopped
    # (the extra option would stop the command too, were the level taken)
    extra = {"operator": ("--metrics-port", "0"), "device-plugin": ("--socket-dir", "/nonexistent")}
    res = kelvin(command, "--log-level", "LOUD", *extra.get(command, ("--port", "0")), timeout=60)
    assert res.returncode == 2, res.stderr
    assert "'LOUD' is not one of 'debug', 'info', 'warning', 'error', 'critical'" in res.stderr
    assert "Traceback" not in res.stderr
    if command == "extender":  # any case: WARNING is taken, and the (bad) port is what stops it
        ok = runner.invoke(app, [command, "--log-level", "WARNING"], env={"KELVIN_PORT": "70000"})
        assert ok.exit_code == 2 and "port (KELVIN_PORT)" in ok.output and "LOUD" not in ok.output, ok.output


# -- item 11: unknown fleet model --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["extender", "--fleet-model", "Z9000", "--port", "0"], {}),
        (["extender", "--port", "0"], {"KELVIN_FLEET_MODEL": "Z9000"}),
        (["explain", str(EXAMPLES[0]), "gpu-node-1"], {"KELVIN_FLEET_MODEL": "Z9000"}),
    ],
)
def test_unknown_fleet_model_is_refused_naming_the_known_ones(argv: list[str], env: dict[str, str]) -> None:
    # in a subprocess with a timeout: were the model accepted, the extender would serve until stopped
    res = kelvin(*argv, env=env, timeout=60)
    assert res.returncode == 2, res.stderr
    assert "unknown GPU model 'Z9000'" in res.stderr and "H100-SXM-80GB" in res.stderr and "L40S" in res.stderr


def test_fleet_spec_knows_its_models() -> None:
    with pytest.raises(FleetSpecError, match=r"groups\.0\.model: .*unknown GPU model 'Z9000'; known models: H100"):
        FleetSpec.uniform(4, model="Z9000")
    assert FleetSpec.uniform(4, model="h200-sxm-141gb").groups[0].model == "H200"


# -- item 11: simulate --thermal --policy ---------------------------------------------------------------------------


def test_thermal_refuses_a_policy_it_does_not_run() -> None:
    res = runner.invoke(app, ["simulate", "--thermal", "--policy", "bogus", "--no-progress"])
    assert res.exit_code == 2
    assert (
        "'bogus' is not a thermal-scenario policy; with --thermal use default, kelvin-no-thermal, kelvin" in res.output
    )


# -- item 11: files that are not UTF-8 ---------------------------------------------------------------------------


def test_non_utf8_files_are_named(tmp_path: Path, trace: tuple[Path, Path]) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(NOT_UTF8)
    problem = f"{bad}: not UTF-8 text (byte 0xff at offset 35)"
    nodes, pods = trace
    cases = [
        ["extender", "--policy-file", str(bad)],
        ["extender", "--fleet-file", str(bad)],
        ["operator", "--policy-file", str(bad)],
        ["explain", str(bad), "gpu-node-1"],
        [
            "explain",
            str(ROOT / "manifests/examples/latency-sensitive-pod.yaml"),
            "gpu-node-1",
            "--policy-file",
            str(bad),
        ],
        ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy-file", str(bad), "--no-progress"],
    ]
    for argv in cases:
        res = runner.invoke(app, argv)
        assert res.exit_code == 2, (argv, res.output)
        assert problem in res.output and "Traceback" not in res.output, (argv, res.output)
    latin = tmp_path / "pods.csv"
    latin.write_bytes(PODS_CSV.replace("p1,", "p\xe9,").encode("latin-1"))
    res = runner.invoke(app, ["simulate", "--nodes", str(nodes), "--pods", str(latin), "--no-progress"])
    assert res.exit_code == 2
    assert f"trace file {latin}: not UTF-8 text (byte 0xe9 at offset" in res.output


# -- item 11: help shows real defaults -----------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["extender", "explain", "demo", "simulate", "exporter", "operator"])
@pytest.mark.parametrize("rich", [False, True])
def test_help_shows_no_empty_defaults(command: str, rich: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app, "rich_markup_mode", "rich" if rich else None)
    res = runner.invoke(app, [command, "--help"], env={"COLUMNS": "250", "TERMINAL_WIDTH": "250"})
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "[default: ]" not in text and "[default: None]" not in text and " . " not in text, res.output
    if command == "extender":
        for shown in (
            "env KELVIN_PORT; default 8888",
            "env KELVIN_HOST; default 127.0.0.1",
            "env KELVIN_METRICS_PORT; default 8889",
            "default H100-SXM-80GB",
        ):
            assert shown in text, res.output
    if command == "explain":
        assert "env KELVIN_FLEET_NODES; default 64" in text, res.output


# -- item 11: explain reads multi-document files -------------------------------------------------------------------


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_explain_reads_every_example(example: Path) -> None:
    res = runner.invoke(app, ["explain", str(example), "gpu-node-1", "--fleet-nodes", "6", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    results = data if isinstance(data, list) else [data]
    assert results and all(r["node"] == "gpu-node-1" and r["filters"] for r in results)


def test_explain_multi_document_skips_what_has_no_pod() -> None:
    f = ROOT / "manifests/examples/training-nvlink-checkpoint.yaml"
    res = runner.invoke(app, ["explain", str(f), "gpu-node-1", "--fleet-nodes", "6"])
    assert res.exit_code == 0, res.output
    assert f"note: skipping {f} document 1 (ServiceAccount nvlink-training): no pod to explain" in res.stderr
    assert f"== {f} document 6: Job nvlink-training" in res.stdout
    assert "4 whole GPUs" in res.stdout
    one = runner.invoke(app, ["explain", str(f), "gpu-node-1", "--fleet-nodes", "6", "--document", "6", "--json"])
    assert one.exit_code == 0 and json.loads(one.stdout)["request"].startswith("4 whole GPUs"), one.output
    nopod = runner.invoke(app, ["explain", str(f), "gpu-node-1", "--document", "1"])
    assert nopod.exit_code == 2 and "kind 'ServiceAccount' has no pod to explain" in nopod.output
    out_of_range = runner.invoke(app, ["explain", str(f), "gpu-node-1", "--document", "9"])
    assert out_of_range.exit_code == 2 and "has 6 document(s)" in out_of_range.output


# -- issue 14 item 30: --version, whole descriptions, human metavars, one --log-level, where credentials come from ----

LONG_RUNNING = ("extender", "exporter", "operator", "device-plugin")
CLICK_TYPE_METAVAR = re.compile(r"<(?:str|int|float|path|bool|list|tuple|datetime)\b[^>]*>")


def first_sentence(help_text: str) -> str:
    """A command's description as a command list should show it: its first paragraph up to the first full stop."""
    words = inspect.cleandoc(help_text).split("\n\n")[0].split()
    end = next((i for i, word in enumerate(words) if word.endswith(".")), len(words) - 1)
    return " ".join(words[: end + 1])


def test_version_prints_the_installed_distributions_version() -> None:
    res = kelvin("--version")
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"kelvin {importlib.metadata.version('kelvin')}\n"
    assert importlib.metadata.version("kelvin") == scheduler_plugin.__version__  # the two cannot drift apart


def test_help_shows_every_commands_whole_first_sentence_when_piped() -> None:
    res = kelvin("--help", env={"COLUMNS": "80"})  # an 80-column "terminal" is what cut them before
    assert res.returncode == 0, res.stderr
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    listed = res.stdout.split("Commands:", 1)[1].splitlines()
    for name, command in group.commands.items():
        assert command.help, name
        (line,) = [line for line in listed if line.split()[:1] == [name]]
        assert line.split(None, 1)[1] == first_sentence(command.help), line
    assert not any(line.rstrip().endswith("...") for line in listed), res.stdout


COMMANDS = ("extender", "explain", "demo", "exporter", "operator", "device-plugin", "simulate")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_a_human_metavar(command: str) -> None:
    res = runner.invoke(app, [command, "--help"])
    assert res.exit_code == 0, res.output
    # options read --port PORT, not --port <int range>; arguments are named in capitals (typer adds their type)
    assert not CLICK_TYPE_METAVAR.search(res.output.split("Options:", 1)[1]), res.output
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    for param in group.commands[command].params:
        if isinstance(param, typer.core.TyperArgument) or (
            isinstance(param, typer.core.TyperOption) and not param.is_flag
        ):
            assert param.metavar is not None and re.fullmatch(r"[A-Z][A-Z_]*", param.metavar), (command, param.name)


@pytest.mark.parametrize("command", LONG_RUNNING)
def test_log_level_is_one_option_in_lowercase_everywhere(command: str) -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    (option,) = [p for p in group.commands[command].params if p.name == "log_level"]
    assert isinstance(option, typer.core.TyperOption) and option.metavar == "LEVEL" and option.default == LogLevel.info
    res = runner.invoke(app, [command, "--help"])
    text = " ".join(res.output.split())
    assert "Log level: debug, info, warning, error or critical (any case). [default: info]" in text, res.output


def test_device_plugin_takes_the_log_level_in_any_case(tmp_path: Path) -> None:
    for level in ("warning", "WARNING", "Warning"):
        res = runner.invoke(app, ["device-plugin", "--fake", "--node-name", "n1", "--log-level", level,
                                  "--socket-dir", str(tmp_path / "none")])  # fmt: skip
        assert res.exit_code == 2 and "is not a folder" in res.output and "log" not in res.output.lower(), res.output


OFF_CLUSTER = ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KELVIN_KUBECONFIG", "KELVIN_KUBE_SERVER")


@pytest.mark.slow
def test_operator_off_cluster_points_to_kubeconfig() -> None:
    res = kelvin("operator", unset=OFF_CLUSTER, timeout=60)
    assert res.returncode == 2, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error: configuration error: not running in a cluster (KUBERNETES_SERVICE_HOST is unset)")
    assert "pass --kubeconfig PATH" in line, line


@pytest.mark.slow
def test_device_plugin_names_kubeconfig_only_when_it_was_passed(tmp_path: Path) -> None:
    args = ("device-plugin", "--fake", "--node-name", "n1", "--socket-dir", str(tmp_path))
    res = kelvin(*args, unset=OFF_CLUSTER, timeout=60)
    assert res.returncode == 2, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert "Invalid value" not in line and line.startswith("error: cannot configure the API client"), line
    assert "KUBERNETES_SERVICE_HOST is unset" in line and "pass --kubeconfig PATH" in line, line
    passed = kelvin(*args, "--kubeconfig", str(tmp_path / "missing.yaml"), unset=OFF_CLUSTER, timeout=60)
    assert passed.returncode == 2 and "Invalid value for --kubeconfig" in passed.stderr, passed.stderr
    assert "missing.yaml" in passed.stderr
