"""What the demo shows: the live table while pods stream, the end-of-run figures (kelvin and the GPU-blind baseline
side by side) and why pods were refused.

The figures: pods placed and refused, pods refused although the fleet had enough free GPUs in total
(fragmentation), GPUs stranded (free capacity too small for the smallest pod of the mix), placements on hot nodes and
GPU-minutes the placed pods spent on thermally throttling GPUs. Refusals are grouped by the typed reasons themselves
(:meth:`Rejection.need`, what the pod needed), each group shown with the node that came nearest
(:meth:`Rejection.nearness`) and its own words.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from ..model import GIB, MILLI_PER_GPU, THERMAL_THROTTLE_MASK, Snapshot
from ..policies.base import Rejection
from .scenario import HOT_MARGIN_C, SMALLEST_REQUEST_BYTES


@dataclass(slots=True)
class Row:
    """One pod of the run as the tables show it."""

    n: int
    pod: str
    shape: str
    node: str | None = None
    gpus: str = ""
    score: int | None = None
    temp: float | None = None
    hot: bool = False
    candidates: int = 0
    note: str = ""
    demand: float = 0.0
    """GPUs the pod asks for (a memory-pool share counts as its share of one GPU)."""
    fragmented: bool = False
    """Refused although the fleet had as many whole GPUs free as the pod needs, only not on one node."""
    ms: float = 0.0


@dataclass(slots=True)
class Refusals:
    """Why pods were refused: per pod, the most common need among its nodes' rejections, with the node that came
    nearest as the example."""

    reasons: Counter[str] = field(default_factory=Counter)
    """Need -> pods refused for it."""
    examples: dict[str, str] = field(default_factory=dict)
    """Need -> the first pod's example (``node: reason``)."""

    def record(self, rejected: Mapping[str, Rejection]) -> str:
        """Count one refused pod (``rejected``: node -> its rejection, in the extender's order); return its note."""
        why = Counter(rej.need() for rej in rejected.values())
        if not why:
            self.reasons["no nodes"] += 1
            return "no nodes"
        top = why.most_common(1)[0][0]
        alike = [(node, rej) for node, rej in sorted(rejected.items()) if rej.need() == top]
        node, rej = max(alike, key=lambda nr: nr[1].nearness())  # the node that came nearest (the first of equals)
        note = f"{node}: {rej.reason}"
        self.reasons[top] += 1
        self.examples.setdefault(top, note)
        return note


@dataclass(slots=True)
class DemoSummary:
    pods: int
    placed: int
    placed_gpus: float
    """GPUs' worth of pods placed (a memory-pool share counts as its share of one GPU)."""
    failed: int
    failed_fragmented: int
    failure_reasons: Counter[str]
    failure_examples: dict[str, str]
    hot_placements: int
    throttled_gpu_minutes: float
    stranded_gpus: int
    stranded_bytes: int
    free_whole_gpus: int
    throttling_gpus: int
    pods_throttled: int
    finished: int
    elapsed_s: float
    p50_ms: float
    p99_ms: float
    rows: list[Row] = field(default_factory=list)

    def headline(self) -> dict[str, float]:
        """The numbers the demo is about (same seed, same numbers): for the comparison and for tests."""
        return {
            "placed": self.placed,
            "placed_gpus": round(self.placed_gpus, 1),
            "refused": self.failed,
            "refused_fragmented": self.failed_fragmented,
            "stranded_gpus": self.stranded_gpus,
            "hot_placements": self.hot_placements,
            "throttled_gpu_minutes": round(self.throttled_gpu_minutes, 1),
        }


def fleet_state(snap: Snapshot) -> tuple[int, int, int, int]:
    """(stranded GPUs, stranded bytes, whole free GPUs, GPUs thermally throttling) of a snapshot."""
    a = snap.arrays
    partial = a.gpu_present & (a.free_milli > 0) & (a.free_milli < MILLI_PER_GPU)
    stranded = partial & (a.free_mem < SMALLEST_REQUEST_BYTES)
    whole = a.gpu_present & (a.free_milli >= MILLI_PER_GPU)
    throttling = a.gpu_present & ((a.throttle & THERMAL_THROTTLE_MASK) != 0)
    return int(stranded.sum()), int(a.free_mem[stranded].sum()), int(whole.sum()), int(throttling.sum())


def throttled_gpus_of(snap: Snapshot, prefix: str = "") -> int:
    """GPUs thermally throttling that run a pod whose key starts with ``prefix`` (each GPU counted once)."""
    n = 0
    for nd in snap.nodes:
        hot = {g.index for g in nd.gpus if g.throttle_reasons & THERMAL_THROTTLE_MASK}
        if hot:
            used = {i for a in nd.assignments if a.pod_key.startswith(prefix) for i in a.gpu_indices}
            n += len(hot & used)
    return n


def pods_throttled(snap: Snapshot, prefix: str = "") -> int:
    """Pods (whose key starts with ``prefix``) with at least one GPU thermally throttling: jobs running slower now."""
    n = 0
    for nd in snap.nodes:
        hot = {g.index for g in nd.gpus if g.throttle_reasons & THERMAL_THROTTLE_MASK}
        if hot:
            n += sum(1 for a in nd.assignments if a.pod_key.startswith(prefix) and hot.intersection(a.gpu_indices))
    return n


def live_table(rows: list[Row], pods: int, finished: int, snap: Snapshot, elapsed: float) -> Group:
    """The live view: the run's counts so far and the last pods, one line each."""
    placed = sum(1 for r in rows if r.node)
    failed = len(rows) - placed
    hot = sum(1 for r in rows if r.hot)
    stranded, _, whole, thr = fleet_state(snap)
    head = (
        f"[b]{len(rows)}/{pods}[/b] pods  placed [green]{placed}[/]  refused [red]{failed}[/]  "
        f"on hot nodes [yellow]{hot}[/]  finished {finished}   fleet: {whole} whole GPUs free, "
        f"{stranded} stranded, {thr} throttling   {elapsed:.1f}s"
    )
    t = Table(expand=True, show_edge=False, pad_edge=False)
    t.add_column("pod", no_wrap=True, min_width=8)
    t.add_column("request", no_wrap=True, min_width=12)
    t.add_column("node", no_wrap=True, min_width=11)
    t.add_column("gpus", no_wrap=True, max_width=15)
    for col, width in (("score", 5), ("°C", 3), ("fits", 4), ("ms", 5)):
        t.add_column(col, justify="right", no_wrap=True, min_width=width)
    t.add_column("note", no_wrap=True, overflow="ellipsis", ratio=1)
    for r in rows[-18:]:
        temp = "" if r.temp is None else (f"[yellow]{r.temp:.0f}[/]" if r.hot else f"{r.temp:.0f}")
        t.add_row(
            f"job-{r.n:04d}",
            escape(r.shape),
            r.node or "[red]unschedulable[/]",
            r.gpus,
            "" if r.score is None else str(r.score),
            temp,
            str(r.candidates),
            f"{r.ms:.1f}",
            escape(r.note),
        )
    return Group(Panel(head, title="kelvin demo: simulated fleet, real HTTP"), t)


def _summary_rows(s: DemoSummary) -> list[tuple[str, str]]:
    return [
        ("pods streamed", str(s.pods)),
        ("placed", f"[green]{s.placed}[/]"),
        ("GPUs' worth of pods placed (a memory share counts as its part of a GPU)", f"[green]{s.placed_gpus:.0f}[/]"),
        ("refused (no feasible node)", f"[red]{s.failed}[/]"),
        ("  of which refused with enough whole GPUs free fleet-wide (fragmentation)", f"[red]{s.failed_fragmented}[/]"),
        (
            "GPUs stranded at the end (partly used, < 10 GiB free)",
            f"{s.stranded_gpus} ({s.stranded_bytes / GIB:.0f} GiB)",
        ),
        (
            f"placements on hot nodes (a GPU throttling or within {HOT_MARGIN_C:g} °C of slowdown)",
            f"[yellow]{s.hot_placements}[/]",
        ),
        ("GPU-minutes of placed pods on thermally throttling GPUs", f"[yellow]{s.throttled_gpu_minutes:.0f}[/]"),
        ("placed pods on thermally throttling GPUs at the end", str(s.pods_throttled)),
        ("whole GPUs free at the end", str(s.free_whole_gpus)),
        ("pods finished during the run", str(s.finished)),
        ("round-trip p50 / p99 (filter+prioritize+bind)", f"{s.p50_ms:.1f} / {s.p99_ms:.1f} ms"),
        ("elapsed", f"{s.elapsed_s:.1f} s"),
    ]


def print_summary(s: DemoSummary, console: Console, baseline: DemoSummary | None = None) -> None:
    t = Table(title="kelvin demo summary", show_header=baseline is not None)
    t.add_column("")
    t.add_column("kelvin", justify="right")
    if baseline is not None:
        t.add_column("GPU-blind baseline", justify="right")
        for (what, mine), (_, theirs) in zip(_summary_rows(s), _summary_rows(baseline), strict=True):
            t.add_row(what, mine, theirs)
    else:
        for what, mine in _summary_rows(s):
            t.add_row(what, mine)
    console.print(t)
    if baseline is not None:
        console.print(
            "baseline: the same pods and fleet, random feasible node and GPUs, no thermal or hot-node filters"
        )
    if s.failure_reasons:
        console.print("[b]why pods were refused under kelvin[/b] (most common reason per pod, with an example):")
        for reason, n in s.failure_reasons.most_common(5):
            example = s.failure_examples.get(reason, reason)
            console.print(f"  {n:4d}  {escape(reason)}  [dim](e.g. {escape(example)})[/dim]")
