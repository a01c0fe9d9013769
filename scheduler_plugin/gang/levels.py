"""The ``gang:`` section of the policy file: the topology levels gangs are planned over, innermost first.

Each level names a node label whose value is the node's domain at that level (nodes with the same value share it)::

    gang:
      levels:
        - name: clique          # NVLink domain (GB200 NVL72 and the like)
          label: nvidia.com/gpu.clique
        - name: rack
          label: kelvin.dev/rack
        - name: zone
          label: topology.kubernetes.io/zone
      goodThermalQuality: 0.5
      minThermalQuality: 0.2

Levels are validated at load: names and labels unique, labels valid Kubernetes label keys, ``node`` and ``cluster``
reserved (a node is always its own innermost domain, the cluster the outermost one). A node without a level's label
is its own domain at that level.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

#: Level names kelvin defines itself: every node is its own ``node`` domain and the whole fleet one ``cluster``.
RESERVED_LEVELS = ("node", "cluster")

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")

DEFAULT_GOOD_THERMAL_QUALITY = 0.5
DEFAULT_MIN_THERMAL_QUALITY = 0.2


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a valid Kubernetes label key (``prefix/name``), or ``None`` when it is."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _LABEL_PREFIX.match(prefix)):
        return f"{key!r}: the prefix must be a DNS subdomain (lower case, at most 253 characters)"
    if not _LABEL_NAME.match(name):
        return (
            f"{key!r}: the name must be 1-63 characters of letters, digits, '-', '_' or '.', alphanumeric at both ends"
        )
    return None


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True, allow_inf_nan=False
    )


class TopologyLevel(_Model):
    name: str
    """How gangs name the level (``kelvin.dev/gang-topology: required=rack``)."""
    label: str
    """The node label whose value is the node's domain at this level."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"{v!r} must be a lower-case DNS label (a-z, 0-9, '-')")
        if v in RESERVED_LEVELS:
            raise ValueError(f"{v!r} is reserved: every node is its own 'node' domain and the fleet one 'cluster'")
        return v

    @field_validator("label")
    @classmethod
    def _label(cls, v: str) -> str:
        problem = label_key_problem(v)
        if problem is not None:
            raise ValueError(problem)
        return v


class GangPolicy(_Model):
    levels: tuple[TopologyLevel, ...] = ()
    """Topology levels, innermost first (an NVLink domain, a rack, a zone)."""
    good_thermal_quality: float = Field(DEFAULT_GOOD_THERMAL_QUALITY, ge=0, le=1)
    """A gang's thermal quality is its worst member's (0..1, the thermal policy's per-GPU quality: headroom below
    slowdown now and under load). Among the domains that fit, those whose gang quality reaches this are preferred;
    best fit decides among them."""
    min_thermal_quality: float = Field(DEFAULT_MIN_THERMAL_QUALITY, ge=0, le=1)
    """A node whose thermal quality is below this never takes a member: with the default thermal policy, 0.2 is a GPU
    predicted to settle within 3 °C of its slowdown under load (a poorly cooled node that would throttle), or one
    without a temperature reading. One such member would be the straggler of the whole gang."""
    max_domains_tried: int = Field(8, ge=1, le=1000)
    """How many of the best-fitting domains of a level are planned in full before one is chosen."""

    @model_validator(mode="after")
    def _unique(self) -> GangPolicy:
        for what in ("name", "label"):
            seen: set[str] = set()
            for lv in self.levels:
                v = getattr(lv, what)
                if v in seen:
                    raise ValueError(f"levels: {what} {v!r} appears twice; each level needs its own")
                seen.add(v)
        return self

    @property
    def level_names(self) -> tuple[str, ...]:
        """Every level a gang may name, innermost first: ``node``, the configured ones, ``cluster``."""
        return ("node", *(lv.name for lv in self.levels), "cluster")
