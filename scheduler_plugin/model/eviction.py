"""What evicting a pod would cost, read from the pod object: the facts preemption weighs (pure data, no I/O).

* ``kelvin.dev/evictable: "false"``: never a victim;
* ``kelvin.dev/gang``: the pod is one member of a gang (a multi-pod job); evicting one member stops them all;
* when its work started (``kelvin.dev/gpu-assigned-at``, else ``status.startTime``) and when it last saved a
  checkpoint (``kelvin.dev/checkpoint-done``): the work since the later of the two is what an eviction loses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import annotations as ann
from .times import parse_time


@dataclass(frozen=True, slots=True)
class EvictionFacts:
    evictable: bool = True
    gang: str | None = None
    started_at: float | None = None
    """Unix time the pod's work started (bind time, else the pod's start time); ``None`` when unknown."""
    checkpoint_at: float | None = None
    """Unix time of the pod's last saved checkpoint (``kelvin.dev/checkpoint-done``); ``None`` when none."""
    labels: tuple[tuple[str, str], ...] = ()
    """The pod's labels (what a PodDisruptionBudget's selector matches), sorted."""

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)

    def progress_since(self) -> float | None:
        """Unix time since which the pod's work is not saved: its last checkpoint, else its start (``None`` when
        neither is known). A checkpoint older than the start (an annotation copied from another pod) does not
        count."""
        if self.checkpoint_at is not None and (self.started_at is None or self.checkpoint_at >= self.started_at):
            return self.checkpoint_at
        return self.started_at


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def eviction_facts(pod: Mapping[str, Any]) -> EvictionFacts:
    """The facts of a pod (API JSON). Values that do not parse count as absent: a malformed checkpoint time is no
    checkpoint, an empty gang name no gang."""
    meta = _mapping(pod.get("metadata"))
    annotations = _mapping(meta.get("annotations"))
    status = _mapping(pod.get("status"))
    labels = _mapping(meta.get("labels"))
    gang = annotations.get(ann.GANG)
    started = parse_time(annotations.get(ann.GPU_ASSIGNED_AT))
    if started is None:
        started = parse_time(status.get("startTime"))
    return EvictionFacts(
        evictable=str(annotations.get(ann.EVICTABLE, "")).strip().lower() != "false",
        gang=gang.strip() if isinstance(gang, str) and gang.strip() else None,
        started_at=started,
        checkpoint_at=parse_time(annotations.get(ann.CHECKPOINT_DONE)),
        labels=tuple(sorted((k, v) for k, v in labels.items() if isinstance(k, str) and isinstance(v, str))),
    )
