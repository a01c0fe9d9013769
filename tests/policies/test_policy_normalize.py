"""Properties of score normalisation (hypothesis): range, order, the all-equal case and missing data."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from scheduler_plugin.policies.base import MAX_EXTENDER_PRIORITY
from scheduler_plugin.policies.framework import Framework, WeightedScore
from scheduler_plugin.policies.normalize import minmax, unit

finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False)
anyfloat = st.one_of(finite, st.just(math.nan), st.just(math.inf), st.just(-math.inf))


@given(st.lists(anyfloat, min_size=1, max_size=50), st.booleans())
def test_minmax_in_range(xs: list[float], reverse: bool) -> None:
    out = minmax(np.array(xs), reverse=reverse)
    assert out.shape == (len(xs),)
    assert np.all((out >= 0) & (out <= MAX_EXTENDER_PRIORITY))


@given(st.lists(finite, min_size=2, max_size=50))
def test_minmax_preserves_order(xs: list[float]) -> None:
    x = np.array(xs)
    out = minmax(x)
    rev = minmax(x, reverse=True)
    for i in range(len(xs)):
        for j in range(len(xs)):
            if x[i] < x[j]:
                assert out[i] <= out[j]
                assert rev[i] >= rev[j]


@given(st.lists(finite, min_size=1, max_size=50))
def test_minmax_best_gets_max_when_finite(xs: list[float]) -> None:
    out = minmax(np.array(xs))
    assert out.max() == MAX_EXTENDER_PRIORITY


@given(finite, st.integers(min_value=1, max_value=30))
def test_minmax_all_equal_is_all_max(v: float, n: int) -> None:
    assert minmax(np.full(n, v)).tolist() == [MAX_EXTENDER_PRIORITY] * n


@given(st.lists(st.sampled_from([math.nan, -math.inf]), min_size=1, max_size=10), finite)
def test_minmax_missing_data_is_zero(missing: list[float], v: float) -> None:
    out = minmax(np.array([*missing, v]))
    assert out[:-1].tolist() == [0.0] * len(missing)
    assert out[-1] == MAX_EXTENDER_PRIORITY


@given(st.lists(anyfloat, min_size=1, max_size=50))
def test_unit_clips_and_maps_nan_to_zero(xs: list[float]) -> None:
    x = np.array(xs)
    out = unit(x)
    assert np.all((out >= 0) & (out <= MAX_EXTENDER_PRIORITY))
    assert np.all(out[np.isnan(x)] == 0)
    inside = np.isfinite(x) & (x >= 0) & (x <= 1)
    assert np.allclose(out[inside], x[inside] * MAX_EXTENDER_PRIORITY)


@given(st.lists(st.floats(min_value=0, max_value=1), min_size=2, max_size=50))
def test_unit_preserves_order(xs: list[float]) -> None:
    x = np.array(xs)
    order = np.argsort(x, kind="stable")
    assert np.all(np.diff(unit(x)[order]) >= 0)


class _Fixed:
    """A score plugin returning given normalised values (to test the framework's combination alone)."""

    name = "fixed"

    def __init__(self, values: np.ndarray) -> None:  # type: ignore[type-arg]
        self.values = values

    def score(self, *_: object) -> np.ndarray:  # type: ignore[type-arg]
        return self.values

    def normalize(self, raw: np.ndarray) -> np.ndarray:  # type: ignore[type-arg]
        return raw

    def explain(self, *_: object) -> list[str]:
        return []


@given(
    st.lists(st.tuples(st.floats(0, 10), st.floats(0, 10), st.one_of(st.floats(0, 10), st.just(math.nan))), min_size=1),
    st.floats(0, 5),
    st.floats(0, 5),
    st.floats(0, 5),
)
def test_combined_scores_are_ints_in_range(
    rows: list[tuple[float, float, float]], w1: float, w2: float, w3: float
) -> None:
    cols = np.array(rows).T
    parts = [
        (WeightedScore(f"s{i}", _Fixed(cols[i]), w), cols[i], cols[i])  # type: ignore[arg-type]
        for i, w in enumerate((w1, w2, w3))
    ]
    ints, comb = Framework._combine(parts, len(rows))
    assert ints.dtype == np.int64
    assert np.all((ints >= 0) & (ints <= 10))
    assert np.all(np.abs(ints - comb) <= 0.5 + 1e-9)


def test_finite_is_nan_to_num_and_keeps_finite_arrays_as_they_are() -> None:
    from scheduler_plugin.policies.normalize import finite

    x = np.array([0.0, 2.5, 10.0])
    assert finite(x) is x  # nothing to replace: no copy
    y = np.array([np.nan, np.inf, -np.inf, 3.0])
    assert np.array_equal(finite(y, nan=0.0, posinf=1.0, neginf=0.0), [0.0, 1.0, 0.0, 3.0])
    assert np.array_equal(finite(y), np.nan_to_num(y, nan=0.0))
