"""Counting what the fragmentation score memo computes (shared by the policy and extender tests)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_plugin.policies.fragmentation.score_memo import ScoreMemo


def count_score_computations(mp: pytest.MonkeyPatch) -> list[int]:
    """Patch :meth:`ScoreMemo.scores` (through ``mp``) to record how many rows each ``compute`` call was asked for;
    what ``compute`` returns is passed on unchanged. Returns the list it appends to."""
    computed: list[int] = []
    real = ScoreMemo.scores

    def counting(self: ScoreMemo, key: Any, f: Any, r: Any, w: Any, extra: Any, compute: Any, *a: Any) -> Any:
        def counted(sel: Any) -> Any:
            computed.append(len(sel))
            return compute(sel)

        return real(self, key, f, r, w, extra, counted, *a)

    mp.setattr(ScoreMemo, "scores", counting)
    return computed
