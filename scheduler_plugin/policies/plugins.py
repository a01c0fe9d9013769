"""The production registry: every filter, score and GPU picker a policy file may name, listed here explicitly.

To add a policy, write its module (a plugin class and a :class:`~.config.CamelModel` of its ``args``) and add one
:class:`~.registry.Registration` row below. The FGD paper's comparison policies are not here: they are the
simulator's (:mod:`scheduler_plugin.simulator.baselines`), and a policy file naming one is refused with the list of
these names.
"""

from __future__ import annotations

from .burst import BurstArgs, BurstScore
from .fit import FitFilter
from .fragmentation import FgdPolicy, FragmentationArgs, FragmentationPolicy
from .noise import NoiseArgs, NoiseScore
from .policy_file import FilterPolicy
from .priority import PriorityArgs, PriorityScore
from .registry import Registration, Registry
from .thermal import ThermalArgs, ThermalScore
from .topology import TopologyArgs, TopologyPicker, TopologyScore

PRODUCTION = Registry(
    [
        Registration(
            "filter",
            "fit",
            FilterPolicy,
            FitFilter,
            "GPU-by-GPU fit: capacity, model, size, thermal hard limits and required NVLink topology.",
        ),
        Registration(
            "score",
            "fragmentation",
            FragmentationArgs,
            FragmentationPolicy.create,
            "Expected increase of fragmentation against the learned workload (FGD class), binned; ties to best fit.",
        ),
        Registration(
            "picker",
            "fragmentation",
            FragmentationArgs,
            FragmentationPolicy.create,
            "The GPU(s) inside the node whose use raises fragmentation least, then the tightest fit.",
        ),
        Registration(
            "score",
            "fgd",
            FragmentationArgs,
            FgdPolicy.create,
            "The FGD paper's fragmentation-gradient score (baseline).",
        ),
        Registration(
            "picker",
            "fgd",
            FragmentationArgs,
            FgdPolicy.create,
            "The FGD paper's GPU choice: the first GPU with the best score.",
        ),
        Registration(
            "score",
            "topology",
            TopologyArgs,
            TopologyScore,
            "Best-connected GPU group for multi-GPU pods; keep single-GPU pods off intact connected groups.",
        ),
        Registration(
            "picker",
            "topology",
            TopologyArgs,
            TopologyPicker,
            "Pick the best-connected set of usable GPUs (NVLink first) inside the chosen node.",
        ),
        Registration(
            "score",
            "thermal",
            ThermalArgs,
            ThermalScore,
            "Headroom below the slowdown temperature, predicted from the trend; throttling penalised.",
        ),
        Registration(
            "score",
            "noise",
            NoiseArgs,
            NoiseScore,
            "Co-tenant pressure (utilisation, memory pressure, crowding, XID errors) on shared GPUs.",
        ),
        Registration(
            "score",
            "burst",
            BurstArgs,
            BurstScore,
            "Penalise nodes with many placements in the last seconds (from the assumed-allocation ledger).",
        ),
        Registration(
            "score",
            "priority",
            PriorityArgs,
            PriorityScore,
            "Place pods below protectFrom where they break fewest free NVLink groups kept for higher priorities.",
        ),
    ]
)
"""What the extender, the operator and the Helm chart's schema accept."""
