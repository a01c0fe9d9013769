"""Scoring policies: the plugin contracts, the framework that runs them, and the explicit registry of their names
(:mod:`.plugins`)."""

from .framework import Explanation, FilterOutcome, Framework
from .policy_file import PolicyConfig

__all__ = ["Explanation", "FilterOutcome", "Framework", "PolicyConfig"]
