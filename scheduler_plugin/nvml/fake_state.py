"""A state file for the fake backend (``kelvin exporter --fake --fake-state-file PATH``): tests and demos change the
fake GPUs of a running exporter by rewriting one YAML (or JSON) file. Fake only: the real NVML backend has no such
option.

The file says what differs from the fake's own start-up state, per GPU index, with ``all`` applied first::

    gpus:
      all: {busy: false}                  # every GPU idle: no process, idle temperature, clocks and power
      "2": {temperature: 91, throttleReasons: [HW_THERMAL_SLOWDOWN], smClockMhz: 1100}
      "5":
        memoryUsed: 10Gi                  # memory in use besides the processes' (driver, contexts)
        processes: [{pid: 4242, used: 30Gi, podUid: 6f1c..., namespace: ml, pod: trainer-0}]

It is declarative: each reading starts again from the start-up state, so a key removed (or the file removed) puts
that GPU back as it started. :class:`FakeStateFile` checks the file every ``interval_s`` (0.2 s) and applies a change
atomically (the fake's GPU list is swapped in one assignment, so a scrape sees the old or the new state of a GPU). A
file that cannot be read or is invalid at start-up is an error naming the file and the field
(:class:`FakeStateError`); later, a bad version is logged and the last good state kept. Write it atomically
(a temporary file renamed over it) so that the exporter never reads half a file.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from .. import yamlfile
from ..model import ThrottleReason
from ..model.quantity import QuantityError, parse_bytes
from ..settings import error_message
from ..textfile import TextFileError, read_text
from .fake import FakeGpu, FakeNvml, FakeProcess, set_busy

log = logging.getLogger(__name__)


class FakeStateError(ValueError):
    """A state file that cannot be used; the message names the file and the field."""


def _bytes(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("must be a byte quantity such as 20Gi or 1073741824, not a boolean")
    try:
        return parse_bytes(value)
    except (QuantityError, TypeError) as exc:
        raise ValueError(str(exc)) from None


Bytes = Annotated[int, BeforeValidator(_bytes), Field(ge=0)]


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True, allow_inf_nan=False
    )


class ProcessState(_Model):
    """A process holding GPU memory; with ``podUid`` the exporter attributes it to that pod."""

    pid: int = Field(ge=1, le=2**31 - 1)
    used: Bytes
    pod_uid: str | None = None
    namespace: str = "default"
    pod: str = ""


class GpuState(_Model):
    """What one GPU reports instead of its start-up values (each field optional)."""

    busy: bool | None = None
    """``false``: idle (no process, idle temperature, clocks and power); ``true``: running the fake's training pod."""
    temperature: int | None = Field(None, ge=0, le=200)
    memory_temperature: int | None = Field(None, ge=0, le=200)
    throttle_reasons: list[str] | None = None
    """Names of ``ThrottleReason`` (``HW_THERMAL_SLOWDOWN``...); ``[]`` is none."""
    sm_clock_mhz: int | None = Field(None, ge=0, le=10_000)
    utilization_percent: int | None = Field(None, ge=0, le=100)
    power_watts: float | None = Field(None, ge=0, le=10_000)
    memory_used: Bytes | None = None
    processes: list[ProcessState] | None = None

    @field_validator("throttle_reasons")
    @classmethod
    def _known_reasons(cls, names: list[str] | None) -> list[str] | None:
        known = ThrottleReason.__members__
        for name in names or ():
            if name not in known:
                raise ValueError(f"unknown throttle reason {name!r}; known: {', '.join(known)}")
        return names


class FakeState(_Model):
    """The whole file: per-GPU overrides keyed by GPU index (as text) or ``all``."""

    gpus: dict[str, GpuState] = Field(default_factory=dict)

    @field_validator("gpus")
    @classmethod
    def _keys(cls, gpus: dict[str, GpuState]) -> dict[str, GpuState]:
        for key in gpus:
            if key != "all" and not (key.isascii() and key.isdigit()):
                raise ValueError(f"key {key!r} must be a GPU index (0, 1, ...) or 'all'")
        return gpus


def parse_state(data: Any, source: str) -> FakeState:
    """:class:`FakeState` from loaded YAML; :class:`FakeStateError` naming ``source`` and each bad field."""
    if data is None:
        return FakeState()
    if not isinstance(data, dict):
        raise FakeStateError(f"{source}: must be a mapping at the top level, got {type(data).__name__}")
    try:
        return FakeState.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {error_message(e)}" for e in exc.errors()
        )
        raise FakeStateError(f"{source}: {problems}") from None


def load_state(path: Path) -> FakeState:
    """The state in ``path``; an absent file is the empty state (the fake as it started)."""
    if not path.exists():
        return FakeState()
    try:
        data = yamlfile.safe_load(read_text(path, "fake state file"))
    except TextFileError as exc:
        raise FakeStateError(str(exc)) from None
    except yaml.YAMLError as exc:
        raise FakeStateError(f"{path}: not valid YAML ({yamlfile.describe(exc)})") from None
    return parse_state(data, str(path))


def _idle(gpu: FakeGpu) -> FakeGpu:
    """``gpu`` with no process and the idle values of a fresh :class:`FakeGpu` (identity and counters kept)."""
    fresh = FakeGpu(index=gpu.index, spec=gpu.spec, uuid=gpu.uuid, bus_id=gpu.bus_id, numa_node=gpu.numa_node)
    dynamic = (
        "memory_used_bytes",
        "temperature_celsius",
        "memory_temperature_celsius",
        "throttle_reasons",
        "sm_clock_mhz",
        "utilization_percent",
        "memory_utilization_percent",
        "power_milliwatts",
    )
    return dataclasses.replace(gpu, processes=[], **{name: getattr(fresh, name) for name in dynamic})


def _override(gpu: FakeGpu, state: GpuState, fake: FakeNvml) -> FakeGpu:
    if state.busy is False:
        gpu = _idle(gpu)
    elif state.busy is True and not gpu.processes:
        gpu = _idle(gpu)
        set_busy(gpu, fake.training_process(gpu.index))
    changes: dict[str, Any] = {}
    if state.temperature is not None:
        changes["temperature_celsius"] = state.temperature
    if state.memory_temperature is not None:
        changes["memory_temperature_celsius"] = state.memory_temperature
    if state.throttle_reasons is not None:
        mask = 0
        for name in state.throttle_reasons:
            mask |= int(ThrottleReason[name])
        changes["throttle_reasons"] = mask
    if state.sm_clock_mhz is not None:
        changes["sm_clock_mhz"] = state.sm_clock_mhz
    if state.utilization_percent is not None:
        changes["utilization_percent"] = state.utilization_percent
    if state.power_watts is not None:
        changes["power_milliwatts"] = round(state.power_watts * 1000)
    if state.memory_used is not None:
        changes["memory_used_bytes"] = state.memory_used
    if state.processes is not None:
        changes["processes"] = [
            FakeProcess(pid=p.pid, used_bytes=p.used, pod_uid=p.pod_uid, namespace=p.namespace, pod=p.pod)
            for p in state.processes
        ]
    return dataclasses.replace(gpu, **changes)


def applied(baseline: list[FakeGpu], state: FakeState, fake: FakeNvml, source: str = "state") -> list[FakeGpu]:
    """The GPUs of ``baseline`` (untouched) with ``state`` applied: ``all`` first, then each index.
    :class:`FakeStateError` for an index the fake does not have."""
    for key in state.gpus:
        if key != "all" and int(key) >= len(baseline):
            raise FakeStateError(f"{source}: gpus.{key}: the fake has GPUs 0..{len(baseline) - 1}")
    out = []
    for gpu in copy.deepcopy(baseline):
        for key in ("all", str(gpu.index)):
            if key in state.gpus:
                gpu = _override(gpu, state.gpus[key], fake)
        out.append(gpu)
    return out


_Stamp = tuple[int, int, int] | None


def _stamp(path: Path) -> _Stamp:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class FakeStateFile:
    """Keeps ``fake`` in the state ``path`` describes; :meth:`start` watches the file in a daemon thread."""

    def __init__(
        self,
        path: Path,
        fake: FakeNvml,
        *,
        on_change: Callable[[], None] | None = None,
        interval_s: float = 0.2,
    ) -> None:
        self.path = path
        self.fake = fake
        self.interval_s = interval_s
        self._on_change = on_change
        self._baseline = copy.deepcopy(fake.gpus)
        self._stamp: _Stamp = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reload(strict=True)

    @property
    def baseline(self) -> list[FakeGpu]:
        return self._baseline

    def reload(self, *, strict: bool = False) -> bool:
        """Apply the file if it changed since the last look; True when applied. ``strict``: raise
        :class:`FakeStateError` for a bad file (start-up); else log it and keep the last good state."""
        stamp = _stamp(self.path)
        if stamp == self._stamp and not strict:
            return False
        self._stamp = stamp
        try:
            gpus = applied(self._baseline, load_state(self.path), self.fake, str(self.path))
        except FakeStateError as exc:
            if strict:
                raise
            log.error("fake state file ignored, the last good state is kept: %s", exc)
            return False
        self.fake.gpus = gpus
        log.info("fake state applied from %s", self.path)
        if self._on_change is not None:
            self._on_change()
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fake-state-file", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.reload()
            except Exception:  # never let the watcher die: the exporter must keep serving
                log.exception("fake state file %s: reload failed", self.path)


def describe(state: FakeState) -> Mapping[str, Any]:
    """The state as the file's camelCase mapping (for writers: tests, demos)."""
    return state.model_dump(by_alias=True, exclude_none=True)
