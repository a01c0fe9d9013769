"""The operator's metrics are exactly the operator section of docs/metrics.md, every series present at 0."""

from __future__ import annotations

import re
from pathlib import Path

from kelvin_operator.metrics import OperatorMetrics
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def documented() -> dict[str, str]:
    section = DOC.read_text().split("## Operator", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `(kelvin_operator_\w+)` \| (\w+) \|", section, re.M)}


def test_names_and_types_match_the_contract() -> None:
    text = generate_latest(OperatorMetrics().registry).decode()
    fams = {f.name: f.type for f in text_string_to_metric_families(text) if not f.name.endswith("_created")}
    doc = documented()
    assert doc, "no operator metrics found in docs/metrics.md"
    # the parser drops _total from counter family names
    assert {n.removesuffix("_total") for n in doc} == set(fams)
    for name, kind in doc.items():
        assert fams[name.removesuffix("_total")] == kind


def test_label_sets_preinitialised() -> None:
    text = generate_latest(OperatorMetrics().registry).decode()
    for reason in ("thermal", "noisy_neighbor", "memory_pool"):
        for result in ("evicted", "pdb_blocked", "error", "dry_run", "limited"):
            for dry in ("true", "false"):
                line = f'kelvin_operator_evictions_total{{dry_run="{dry}",reason="{reason}",result="{result}"}} 0.0'
                assert line in text
    assert 'kelvin_operator_taint_transitions_total{transition="removed"} 0.0' in text
    assert 'kelvin_operator_checkpoint_handshake_duration_seconds_count{outcome="timeout"} 0.0' in text
    assert 'kelvin_operator_pool_violations_total{kind="failed_open",mode="audit"} 0.0' in text
    assert 'kelvin_operator_webhook_requests_total{result="error",webhook="mutate"} 0.0' in text
