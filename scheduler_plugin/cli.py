"""The ``kelvin`` command line. Each subcommand lives with the part it runs; this file only wires them up."""

from __future__ import annotations

import typer

from .console import markup_mode

app = typer.Typer(
    name="kelvin",
    help="kelvin: GPU-aware scheduling for Kubernetes (extender, exporter, operator, simulator).",
    no_args_is_help=True,
    add_completion=False,
    # rich boxes on a terminal; plain, unwrapped usage errors when piped or captured (CI logs)
    rich_markup_mode=markup_mode(),
)

# Registration: one line per subcommand, each defined next to the code it runs.
# (owners: extender/demo/explain -> scheduler_plugin/extender/cli.py; exporter -> scheduler_plugin/exporter/cli.py;
#  simulate -> scheduler_plugin/simulator/cli.py; operator -> kelvin_operator/cli.py)
app.command("exporter")(__import__("scheduler_plugin.exporter.cli", fromlist=["exporter"]).exporter)
app.command("extender")(__import__("scheduler_plugin.extender.cli", fromlist=["extender"]).extender)
app.command("explain")(__import__("scheduler_plugin.extender.cli", fromlist=["explain"]).explain)
app.command("demo")(__import__("scheduler_plugin.extender.cli", fromlist=["demo"]).demo)
app.command("operator")(__import__("kelvin_operator.cli", fromlist=["operator"]).operator)
app.command("device-plugin")(__import__("scheduler_plugin.deviceplugin.cli", fromlist=["x"]).device_plugin)
app.command("simulate")(__import__("scheduler_plugin.simulator.cli", fromlist=["simulate"]).simulate)

if __name__ == "__main__":  # python -m scheduler_plugin.cli
    app()
