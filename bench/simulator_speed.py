"""CPU seconds of one trace replay (``engine.run``) per policy and seed, beside the speed targets: at most 10 s per
policy and seed on the openb default trace, at most 30 s on a trace variant (``simulator/variants.py``).

Process time, not wall time: the box it runs on is shared, and a loaded box stretches wall time but not much the CPU
a run takes. Each run builds a fresh policy; the trace is read and prepared once (not counted: reading takes about
0.3 s). The first run of a process also pays the imports its policy needs in the run (kelvin's packing plan imports
scipy's LP solver when the policy is built, outside the timed run: 0.5-1.5 s by the box's load).

Each row ends with a digest of the run's whole trajectory (every arrival's allocation and failure, and the final
fleet's free capacity), so that two versions of the code can be checked to place every pod alike.

Usage::

    python bench/simulator_speed.py                                    # kelvin, fgd, best-fit; seed 42; full size
    python bench/simulator_speed.py --policies kelvin --seeds 42-44
    python bench/simulator_speed.py --variant model-constrained@0.33 --scale 4
    python bench/simulator_speed.py --policies kelvin --target 0.3 --profile /tmp/kelvin.prof
    python bench/simulator_speed.py --policies kelvin --time policies.noise:NoiseScore.score,simulator.engine:pick

``--time`` adds up the process time spent in each named function (``module:function`` or ``module:Class.method``,
modules under ``scheduler_plugin``; a function imported by name is timed where it is called from, e.g.
``simulator.engine:rank``). cProfile charges every Python call (the full-size kelvin replay takes four to five times
as long under it), so it overweights what makes many small calls; a few timers leave the run at its own speed.

The trace is read from ../shared/traces/openb (``--traces``; $KELVIN_SHARED_DIR moves ../shared).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import hashlib
import importlib
import inspect
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from harness import SHARED, load_line, openb_default

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scheduler_plugin.simulator.engine import RunResult, prepare, run  # noqa: E402
from scheduler_plugin.simulator.policies import POLICIES, build_policy  # noqa: E402
from scheduler_plugin.simulator.protocol import DEFAULT_TARGET  # noqa: E402
from scheduler_plugin.simulator.variants import FAMILIES, thinned, variant  # noqa: E402

#: CPU seconds one replay may take (issue 17, target 5).
TARGET_DEFAULT_S = 10.0
TARGET_VARIANT_S = 30.0


def parse_seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def parse_variant(text: str) -> tuple[str, float]:
    family, _, level = text.partition("@")
    if family not in FAMILIES:
        raise SystemExit(f"error: --variant: unknown family {family!r} (known: {', '.join(FAMILIES)})")
    try:
        return family, float(level) if level else FAMILIES[family].levels[-1]
    except ValueError:
        raise SystemExit(f"error: --variant: level {level!r} is not a number") from None


def digest(result: RunResult) -> str:
    """A short hash of the run's trajectory and final fleet: equal digests, equal placements."""
    h = hashlib.sha256()
    arrays: list[np.ndarray[Any, Any]] = [result.arrived_pct, result.alloc_pct, result.failed]
    if result.fleet is not None:
        f = result.fleet
        arrays += [f.free_milli, f.free_mem, f.assigned_milli, f.tenants, f.cpu_free, f.mem_free_host]
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:12]


def timed(specs: str) -> dict[str, float]:
    """Wrap each function of ``specs`` (comma-separated ``module:function`` or ``module:Class.method``, modules under
    ``scheduler_plugin``) in a timer; the process seconds spent in each, added up as the runs go (by label)."""
    spent: dict[str, float] = {}
    for spec in filter(None, (x.strip() for x in specs.split(","))):
        module, _, name = spec.partition(":")
        *path, attr = name.split(".")
        try:
            owner: Any = importlib.import_module(f"scheduler_plugin.{module}")
            for part in path:
                owner = getattr(owner, part)
            raw = inspect.getattr_static(owner, attr)
        except (ImportError, AttributeError):
            raise SystemExit(f"error: --time: {spec!r} names no function") from None
        spent[spec] = 0.0
        if isinstance(raw, (staticmethod, classmethod)):  # wrapped inside, then the same kind of descriptor again
            setattr(owner, attr, type(raw)(_timer(raw.__func__, spec, spent)))
        elif callable(raw):
            setattr(owner, attr, _timer(raw, spec, spent))
        else:
            raise SystemExit(f"error: --time: {spec!r} names no function")
    return spent


def _timer(fn: Callable[..., Any], label: str, spent: dict[str, float]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] += time.process_time() - t0

    return wrapper


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default="kelvin,fgd,best-fit", help="comma-separated (default kelvin,fgd,best-fit)")
    ap.add_argument("--seeds", default="42", help="e.g. 42 or 42-44 or 42,45 (default 42)")
    ap.add_argument("--traces", type=Path, default=SHARED / "traces" / "openb", help="folder of the openb trace")
    ap.add_argument("--variant", help="a variant family and level, e.g. model-constrained@0.33 (default: none)")
    ap.add_argument("--variant-seed", type=int, default=42, help="seed the variant is built with (default 42)")
    ap.add_argument("--scale", type=int, default=1, help="every K-th node and pod (default 1: full size)")
    ap.add_argument("--target", type=float, default=DEFAULT_TARGET, help="arrivals stop at this share of capacity")
    ap.add_argument(
        "--profile", type=Path, help="write a cProfile of each run to PATH-<policy>-<seed> (e.g. /tmp/run.prof)"
    )
    ap.add_argument("--time", default="", help="functions to time in the runs, e.g. policies.noise:NoiseScore.score")
    args = ap.parse_args(argv)
    spent = timed(args.time)

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in policies:
        if p not in POLICIES:
            raise SystemExit(f"error: --policies: unknown policy {p!r} (known: {', '.join(POLICIES)})")
    if args.scale < 1:
        raise SystemExit(f"error: --scale must be at least 1, got {args.scale}")
    seeds = parse_seeds(args.seeds)
    trace = openb_default(args.traces)
    trace = thinned(trace, args.scale)
    what = "openb default trace"
    goal = TARGET_DEFAULT_S
    if args.variant:
        family, level = parse_variant(args.variant)
        trace = variant(trace, family, level, seed=args.variant_seed)
        what = f"variant {family}@{level:g} (built with seed {args.variant_seed})"
        goal = TARGET_VARIANT_S
    if args.scale > 1:
        what += f", every {args.scale}th node and pod"
    prep = prepare(trace)
    print(f"{what}: {len(trace.nodes)} nodes, {len(trace.pods)} pods; arrivals to {100 * args.target:g} %")
    print(load_line())
    print(f"{'policy':<22} {'seed':>5} {'CPU s':>8} {'wall s':>8} {'target':>7}  {'arrivals':>8}  trajectory")
    for seed in seeds:
        for name in policies:
            policy = build_policy(name, seed)
            out = None
            prof = cProfile.Profile(time.process_time) if args.profile else None
            cpu0, wall0 = time.process_time(), time.perf_counter()
            if prof is not None:
                prof.enable()
            result = run(prep, policy, seed, target=args.target)
            if prof is not None:
                prof.disable()
                out = args.profile.with_name(f"{args.profile.stem}-{name}-{seed}{args.profile.suffix}")
                prof.dump_stats(str(out))
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            mark = "ok" if cpu <= goal else "MISS"
            print(
                f"{name:<22} {seed:>5} {cpu:>8.2f} {wall:>8.2f} {goal:>5.0f} {mark:<4} {len(result.arrived_pct):>6}"
                f"  {digest(result)}" + (f"  profile {out}" if prof is not None else "")
            )
            for label, seconds in spent.items():
                print(f"    {label:<68} {seconds:>7.2f} s ({100 * seconds / max(cpu, 1e-9):.0f} %)")
                spent[label] = 0.0
    print(load_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
