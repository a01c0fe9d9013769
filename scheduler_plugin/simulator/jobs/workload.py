"""Jobs: a seeded generator with a stated mix, and a CSV trace format it writes and reads.

The generator (:class:`JobMix`, defaults stated in docs/jobs.md):

* **size** (GPUs per job) drawn from ``sizes`` with probabilities ``weights``: by count most jobs take 1-8 GPUs
  (85 %), a tail 16-256 (15 %); by GPU demand the tail dominates, as in production training clusters;
* **shape**: a job of up to ``pod_gpus`` GPUs is one pod; a larger one is ``gpus / pod_gpus`` pods of ``pod_gpus``
  GPUs (one per 8-GPU node, the layout of JobSet / PyTorchJob training);
* **durations**: log-normal, median ``median_hours``, sigma ``sigma``, capped at ``max_hours``;
* **arrivals**: Poisson, at the rate that offers ``load`` times the fleet's GPU capacity (``rate_per_hour``).

CSV columns: ``name,arrival_seconds,duration_seconds,members,gpus_per_member``.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..trace import TraceError

COLUMNS = ("name", "arrival_seconds", "duration_seconds", "members", "gpus_per_member")


@dataclass(frozen=True, slots=True)
class JobSpec:
    name: str
    arrival_s: float
    duration_s: float
    """Run time when placed ideally (tightest network, no straggler)."""
    members: int
    gpus_per_member: int

    @property
    def gpus(self) -> int:
        return self.members * self.gpus_per_member


@dataclass(frozen=True, slots=True)
class JobMix:
    sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    weights: tuple[float, ...] = (0.45, 0.10, 0.12, 0.18, 0.06, 0.04, 0.03, 0.015, 0.005)
    pod_gpus: int = 8
    median_hours: float = 0.25
    sigma: float = 1.0
    max_hours: float = 12.0
    load: float = 1.0
    """Offered GPU demand as a share of the fleet's GPUs."""

    def mean_gpu_hours(self) -> float:
        """Expected GPU-hours of one job (the cap on durations ignored: it moves the mean by well under 1 %)."""
        w = np.asarray(self.weights) / sum(self.weights)
        mean_gpus = float(np.dot(w, self.sizes))
        mean_hours = self.median_hours * math.exp(self.sigma**2 / 2)
        return mean_gpus * mean_hours

    def rate_per_hour(self, capacity_gpus: int) -> float:
        return self.load * capacity_gpus / self.mean_gpu_hours()

    def describe(self, capacity_gpus: int) -> str:
        w = np.asarray(self.weights) / sum(self.weights)
        mix = ", ".join(f"{s}:{p:.1%}" for s, p in zip(self.sizes, w, strict=True))
        return (
            f"job sizes (GPUs: share of jobs) {mix}; pods of at most {self.pod_gpus} GPUs; durations log-normal, "
            f"median {self.median_hours:g} h, sigma {self.sigma:g}, cap {self.max_hours:g} h; Poisson arrivals at "
            f"{self.rate_per_hour(capacity_gpus):.0f} jobs/h (offered load {self.load:.0%} of {capacity_gpus} GPUs)"
        )


def generate(mix: JobMix, capacity_gpus: int, count: int, seed: int) -> list[JobSpec]:
    """``count`` jobs drawn from ``mix``, seeded."""
    if count < 1:
        raise ValueError("count must be at least 1")
    rng = np.random.default_rng([seed, 16])
    w = np.asarray(mix.weights, dtype=np.float64)
    sizes = rng.choice(np.asarray(mix.sizes), size=count, p=w / w.sum())
    gaps = rng.exponential(3600.0 / mix.rate_per_hour(capacity_gpus), size=count)
    arrivals = np.cumsum(gaps) - gaps[0]
    hours = np.minimum(rng.lognormal(math.log(mix.median_hours), mix.sigma, size=count), mix.max_hours)
    out = []
    for i in range(count):
        g = int(sizes[i])
        members, per = (1, g) if g <= mix.pod_gpus else (g // mix.pod_gpus, mix.pod_gpus)
        out.append(JobSpec(f"job-{i:05d}", float(arrivals[i]), float(hours[i] * 3600.0), members, per))
    return out


def write_jobs(jobs: Sequence[JobSpec], path: Path) -> None:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for j in jobs:
        w.writerow([j.name, f"{j.arrival_s:.3f}", f"{j.duration_s:.3f}", j.members, j.gpus_per_member])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(buf.getvalue(), encoding="utf-8")


def _number(path: Path, row: int, col: str, raw: str | None, *, integer: bool, lo: float) -> float:
    where = f"{path}: row {row}, column {col}"
    try:
        v = float(raw or "")
    except ValueError:
        raise TraceError(f"{where}: {raw!r} is not a number") from None
    if not math.isfinite(v) or v < lo or (integer and v != int(v)):
        kind = "an integer" if integer else "a number"
        raise TraceError(f"{where}: {raw!r} must be {kind} of at least {lo:g}")
    return v


def read_jobs(path: Path) -> list[JobSpec]:
    """Jobs from a CSV in :data:`COLUMNS` (what :func:`write_jobs` writes); errors name the file, row and column."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the job trace ({exc.strerror or exc})") from None
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise TraceError(f"{path}: missing column(s) {', '.join(missing)} (expected {','.join(COLUMNS)})")
    out = []
    for row, rec in enumerate(reader, start=2):
        name = (rec["name"] or "").strip() or f"job-{row}"
        arrival = _number(path, row, "arrival_seconds", rec["arrival_seconds"], integer=False, lo=0)
        duration = _number(path, row, "duration_seconds", rec["duration_seconds"], integer=False, lo=1)
        members = int(_number(path, row, "members", rec["members"], integer=True, lo=1))
        per = int(_number(path, row, "gpus_per_member", rec["gpus_per_member"], integer=True, lo=1))
        out.append(JobSpec(name, arrival, duration, members, per))
    if not out:
        raise TraceError(f"{path}: no jobs")
    out.sort(key=lambda j: j.arrival_s)
    return out
