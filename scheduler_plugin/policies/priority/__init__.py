"""Priority-aware placement: keep the free NVLink groups high-priority pods need away from preemptible pods, so that
a high-priority pod finds room without preempting.

:mod:`.groups` (pure: free NVLink groups of a node and what placing GPUs there destroys), :mod:`.plugin` (the
``priority`` score and its arguments).
"""

from .plugin import PriorityArgs, PriorityScore

__all__ = ["PriorityArgs", "PriorityScore"]
