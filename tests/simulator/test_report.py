"""The simulator's outputs: the curve CSV read back, and a plot on which every policy's line shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler_plugin.simulator.engine import prepare, run
from scheduler_plugin.simulator.policies import build_policy
from scheduler_plugin.simulator.report import (
    CURVE_POINTS,
    line_style,
    plot_curves,
    read_curve_csv,
    write_curve_csv,
)
from scheduler_plugin.simulator.trace import load_trace


def test_curves_read_back_and_replot_without_running(small_trace: tuple[Path, Path], tmp_path: Path) -> None:
    prep = prepare(load_trace(*small_trace))
    results = [run(prep, build_policy(p, s), s) for p in ("fgd", "best-fit") for s in (1, 2)]
    write_curve_csv(results, tmp_path / "curve.csv")
    curves = read_curve_csv(tmp_path / "curve.csv")
    assert list(curves) == ["fgd", "best-fit"] and [len(c) for c in curves.values()] == [2, 2]
    assert curves["fgd"][1] == pytest.approx(results[1].curve(CURVE_POINTS), abs=1e-3)
    plot_curves(curves, tmp_path / "again.png", title="t")
    assert (tmp_path / "again.png").read_bytes()[:4] == b"\x89PNG"
    bad = tmp_path / "bad.csv"
    bad.write_text("policy,seed\nx,1\n")
    with pytest.raises(ValueError, match="not a curve file"):
        read_curve_csv(bad)


def test_every_policy_gets_its_own_pattern_and_later_ones_lie_on_top() -> None:
    """Before: one solid line style for all, so kelvin hid under kelvin-fragmentation (the same curve)."""
    n = 8
    styles = [line_style(k, n) for k in range(n)]
    assert len({(repr(s["linestyle"]), s["marker"]) for s in styles}) == n
    widths = [float(s["linewidth"]) for s in styles]  # type: ignore[arg-type]
    assert widths == sorted(widths, reverse=True) and widths[0] > widths[1] + 0.2
    assert [s["zorder"] for s in styles] == sorted({s["zorder"] for s in styles})  # type: ignore[type-var]
    first, second = (set(s["markevery"]) for s in styles[:2])  # type: ignore[call-overload]
    assert first and second and not first & second  # markers of coinciding curves fall on different points
