"""Gangs: multi-pod jobs placed all at once in the tightest topology domain (docs/jobs.md).

``readers`` finds a pod's gang, ``config`` is the policy file's ``gang:`` section (topology levels), ``topology``
maps nodes to domains, ``planner`` plans a whole gang with the extender's framework (import it from there: it needs
the policies, which read this package's config).
"""

from .levels import GangPolicy, TopologyLevel
from .readers import GangError, GangRef, TopologyAsk, read_gang
from .topology import Domains, build_domains

__all__ = [
    "Domains",
    "GangError",
    "GangPolicy",
    "GangRef",
    "TopologyAsk",
    "TopologyLevel",
    "build_domains",
    "read_gang",
]
