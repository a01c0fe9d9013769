"""The ``kelvin`` command line. Each subcommand lives with the part it runs; this file only wires them up."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

import typer
from kelvin_operator.cli import operator

from . import __version__
from .console import help_settings, markup_mode
from .deviceplugin.cli import device_plugin
from .exporter.cli import exporter
from .extender.cli import demo, explain, extender
from .simulator.cli import simulate

app = typer.Typer(
    name="kelvin",
    help="kelvin: GPU-aware scheduling for Kubernetes (extender, exporter, operator, simulator).",
    no_args_is_help=True,
    add_completion=False,
    # rich boxes on a terminal; plain, unwrapped usage errors when piped or captured (CI logs)
    rich_markup_mode=markup_mode(),
    # off a terminal, help is not wrapped or cut at 80 columns: every command's first sentence whole
    context_settings=help_settings(),
)


def kelvin_version() -> str:
    """The installed distribution's version (``importlib.metadata``); the source tree's when not installed."""
    try:
        return version("kelvin")
    except PackageNotFoundError:
        return f"{__version__} (not installed)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"kelvin {kelvin_version()}")
        raise typer.Exit()


@app.callback()
def _main(
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print kelvin's version and exit."),
    ] = False,
) -> None:
    pass


# Registration: one line per subcommand, each defined next to the code it runs.
app.command("exporter")(exporter)
app.command("extender")(extender)
app.command("explain")(explain)
app.command("demo")(demo)
app.command("operator")(operator)
app.command("device-plugin")(device_plugin)
app.command("simulate")(simulate)

if __name__ == "__main__":  # python -m scheduler_plugin.cli
    app()
