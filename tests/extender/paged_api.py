"""A fake Kubernetes API answering one list in pages, and a settable clock: for the extender's background listers
(:class:`scheduler_plugin.extender.periodic_list.PeriodicList`)."""

from __future__ import annotations

from typing import Any

from scheduler_plugin.kubeapi import KubeError


class PagedApi:
    """Answers the list at ``path`` in pages of ``page`` (or fails with ``error``)."""

    def __init__(self, path: str, items: list[dict[str, Any]], page: int = 2) -> None:
        self.path, self.items, self.page, self.calls = path, items, page, 0
        self.error: KubeError | None = None

    async def get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        assert path == self.path
        self.calls += 1
        if self.error is not None:
            raise self.error
        at = int((params or {}).get("continue") or 0)
        nxt = at + self.page
        meta = {"continue": str(nxt)} if nxt < len(self.items) else {}
        return {"items": self.items[at:nxt], "metadata": meta}


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t
