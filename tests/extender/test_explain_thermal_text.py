"""``kelvin explain`` on a fresh simulated fleet: the thermal lines say where each cooling figure comes from and
give the headroom to slowdown with its sign in words."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ext_helpers import pod
from typer.testing import CliRunner

from scheduler_plugin.cli import app

runner = CliRunner()


def test_explain_on_a_fresh_fleet_says_which_cooling_figures_are_assumed(tmp_path: Path) -> None:
    """Before: ``cooling 0.072 °C/W`` with no word that it is the assumed worst case of the model, not learned."""
    f = tmp_path / "pod.yaml"
    f.write_text(json.dumps(pod("one", gpus=1)))
    lines: list[str] = []
    for n in range(1, 7):
        res = runner.invoke(app, ["explain", str(f), f"gpu-node-{n}", "--fleet-nodes", "6", "--json"])
        assert res.exit_code == 0, res.output
        (thermal,) = (s for s in json.loads(res.output)["scores"] if s["policy"] == "thermal")
        lines += [r for r in thermal["reasons"] if "under load" in r]
    cooling = [re.search(r"cooling \d\.\d{3} °C/W ([^,]+)", r) for r in lines]
    where = [m.group(1) for m in cooling if m]
    assert len(where) == len(lines) > 0
    assumed = [w for w in where if w.startswith("assumed (the worst learned for its model")]
    learned = [w for w in where if re.fullmatch(r"learned from \d+ readings? under load since \d+ s ago", w)]
    assert assumed and learned and len(assumed) + len(learned) == len(where)
    assert not any(re.search(r"-\d+(\.\d)? °C (below|above)", r) for r in lines)
