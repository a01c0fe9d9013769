"""Scoring policies. Importing this package registers every policy (filters, scores, pickers) in the registry."""

from . import baselines, burst, fit, fragmentation, noise, thermal, topology
from .config import PolicyConfig
from .framework import Explanation, FilterOutcome, Framework

__all__ = [
    "Explanation",
    "FilterOutcome",
    "Framework",
    "PolicyConfig",
    "baselines",
    "burst",
    "fit",
    "fragmentation",
    "noise",
    "thermal",
    "topology",
]
