"""``kelvin exporter`` rejects bad flags with a message naming the flag (no traceback)."""

from __future__ import annotations

import socket

import typer
from typer.testing import CliRunner

from scheduler_plugin.exporter.cli import exporter


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command()(exporter)
    return app


def test_unknown_fake_model_names_the_flag_and_the_known_models() -> None:
    result = CliRunner().invoke(_app(), ["--fake", "--fake-model", "Voodoo5", "--port", "0"])
    assert result.exit_code == 2
    assert "--fake-model" in result.output and "H100-SXM-80GB" in result.output
    assert "Traceback" not in result.output


def test_out_of_range_values_are_rejected() -> None:
    assert CliRunner().invoke(_app(), ["--fake", "--fake-gpus", "17"]).exit_code == 2
    assert CliRunner().invoke(_app(), ["--port", "70000"]).exit_code == 2


def test_busy_port_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = CliRunner().invoke(_app(), ["--fake", "--host", "127.0.0.1", "--port", str(port)])
    assert result.exit_code == 2 and "cannot listen on 127.0.0.1" in result.output


def test_bad_fake_nvlink_islands_name_the_flag() -> None:
    result = CliRunner().invoke(_app(), ["--fake", "--fake-nvlink-islands", "3", "--port", "0"])
    assert result.exit_code == 2 and "--fake-nvlink-islands" in result.output and "equal islands" in result.output
    result = CliRunner().invoke(
        _app(),
        ["--fake", "--fake-model", "H100-PCIE-80GB", "--fake-nvlink-islands", "2", "--port", "0"],
        env={"COLUMNS": "300"},  # the whole message on one line of rich's box
    )
    assert result.exit_code == 2 and "--fake-nvlink-islands" in result.output and "has no NVLink" in result.output
    result = CliRunner().invoke(_app(), ["--fake-nvlink-islands", "2", "--port", "0"])
    assert result.exit_code == 2 and "give --fake too" in result.output
