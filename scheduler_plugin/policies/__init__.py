"""Scoring policies: the plugin contracts, the framework that runs them, and the explicit registry of their names
(:mod:`.plugins`)."""

from .config import PolicyConfig
from .framework import Explanation, FilterOutcome, Framework

__all__ = ["Explanation", "FilterOutcome", "Framework", "PolicyConfig"]
