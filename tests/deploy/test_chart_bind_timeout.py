"""The extender's bind deadline follows kube-scheduler's extender httpTimeout (one second below it)."""

from __future__ import annotations

import pytest
from deploy_helpers import Render, one, pod_spec

from scheduler_plugin.settings import Settings


def _bind_timeout(render: Render, *sets: str) -> str | None:
    dep = one(render(None, *sets), "Deployment", "scheduler")
    (extender,) = [c for c in pod_spec(dep)["containers"] if c["name"] == "extender"]
    env = {e["name"]: e.get("value") for e in extender["env"]}
    return env.get("KELVIN_BIND_TIMEOUT_S")


@pytest.mark.parametrize(
    ("http_timeout", "want"),
    [
        (None, "4"),  # the chart's default httpTimeout, 5s
        ("12s", "11"),
        ("2.5s", "1.5"),
        ("1s", "0.5"),  # too short to leave a second: half of it
        ("90s", "60"),  # bind_timeout_s is at most 60
        ("1m", None),  # not plain seconds: the extender's default (4 s)
        ("1500ms", None),
    ],
)
def test_bind_timeout_is_one_second_below_the_http_timeout(
    render: Render, http_timeout: str | None, want: str | None
) -> None:
    sets = () if http_timeout is None else (f"scheduler.extender.httpTimeout={http_timeout}",)
    got = _bind_timeout(render, *sets)
    assert got == want
    if got is not None:
        assert Settings(bind_timeout_s=float(got)).bind_timeout_s == float(got)  # a value the extender accepts
