"""``kelvin demo``: the extender on a simulated fleet, with pods streamed through it over HTTP as kube-scheduler would.

* :mod:`.scenario`: what runs: the fleet (part-full, with poorly cooled nodes already hot), the pod mix and its
  seeded stream, the GPU-blind baseline policy.
* :mod:`.driver`: how it runs: the extender in-process under uvicorn on a free loopback port, each pod through
  ``/filter``, ``/prioritize`` and ``/bind`` on the demo's own clock, pods finishing after their lifetime.
* :mod:`.summary`: what it shows: the live table, the end-of-run figures of kelvin and the baseline side by side, and
  why pods were refused (grouped by the typed reasons' needs).

Repeatable: the same seed gives the same numbers (the stream is drawn up front, the clock is simulated).
"""

from __future__ import annotations

from .driver import run_demo

__all__ = ["run_demo"]
