"""Fragmentation policy (FGD class): place a pod where it increases the fleet's fragmentation the least.

Definitions (Weng et al., "Beware of Fragmentation", USENIX ATC '23):

* The *target workload* M is a distribution over pod shapes m = (cpu, per-GPU thousandths, GPU count, allowed
  models) with probabilities p_m.
* A node's fragmentation for shape m, F_n(m), in thousandths of a GPU: every free GPU share of the node if m asks for
  no GPU, if m's model list excludes the node, or if m does not fit the node at all (CPU, or fewer than ``count`` GPUs
  each with at least m's share free); otherwise only the free shares of the GPUs individually too small for m.
* F_n(M) = sum_m p_m F_n(m). Placing a pod changes it by dF = F_n'(M) - F_n(M); FGD prefers the smallest dF.

Two scorers share that maths:

* ``fgd`` is the paper's scorer exactly (used as a baseline and to validate the simulator):
  ``int(100 * sigmoid(-dF / 1000))``, truncated; a shared-GPU pod tries each GPU that fits and keeps the best,
  ties to the lowest GPU index.
* ``fragmentation`` is kelvin's: the same quantised gradient (the quantisation is what makes FGD work: placements
  within a step are equal, instead of chasing noise), computed over a memory-aware F (a typical pod must also find
  its host memory; FGD checks CPU only), against a workload it learns from the requests it sees; inside the node
  it breaks ties by the raw dF, then the tightest GPU, instead of the lowest index. Two additions look past FGD's
  one-pod horizon:

  - **packing plan** (``packingPlan``, :mod:`.packing`): shared pods are ranked first by how far their placement
    strays from the optimal fractional packing of the workload's shares (the reduced cost of the arc-flow LP), so a
    0.32 share does not take the gap a 0.47 share would fill to 0.94;
  - **CPU stranding** (``strandingWeight``): dF is increased by the GPU a node can no longer feed with its free CPU at
    the workload's CPU-per-GPU ratio (:func:`stranded`; an increase only, never a credit: :func:`stranding_penalty`).
    FGD sees CPU only as a cliff, once a node's CPU is below a shape's request; by then the node's remaining GPUs are
    lost. The term fades out, for every pod, when the fleet as a whole lacks the CPU to feed its free GPUs and the
    CPU-only pods that arrive with them (:func:`cpu_surplus_factor`): then every node strands and steering pods only
    moves the loss. (Kept on for CPU-only
    pods, it spread them over the CPU-rich nodes until every node was just short of CPU, where the lumpy GPU pods no
    longer fit: 0.8 point more GPUs unallocated with 2.5 times the trace's CPU-only demand.)
  - **live scarcity** (``scarcity``, :mod:`.scarcity`): each shape's probability in F is multiplied by how few of
    the fleet's free GPUs can still host it now, so the last homes of a rare shape cost more than one of many homes
    of a common one.

Everything is vectorised over candidate (node, GPU) placements: one call scores 5,000 nodes x 8 GPUs.

The target workload comes from the cycle state (``ctx.state``, key :data:`WORKLOAD_KEY`) when the caller supplies one
(the simulator computes it from the trace); otherwise from the plugin's :class:`WorkloadEstimator`, a histogram of
the pods that arrived, seeded with a default mix, which forgets older pods only when a test on the counts finds the
recent mix changed. Scoring, picking and
explaining only read the estimator; it learns in one explicit step, the plugin's ``observe`` (called by
``Framework.observe``, once per arriving pod; :func:`learn` for callers without a framework).

The package: :mod:`.workload` (shapes, the workload, the estimator), :mod:`.gradient` (the measure F, the placements
and their dF, stranding), :mod:`.scarcity` (live scarcity weights of the shapes), :mod:`.plugin` (the arguments and
the ``fragmentation`` / ``fgd`` plugins).
"""

from .gradient import (
    Placements,
    best_per_row,
    cpu_surplus_factor,
    eligible_gpus,
    fgd_value,
    node_fragmentation,
    placements,
    quantised,
    stranded,
    stranding_change,
    stranding_penalty,
)
from .plugin import (
    SCORED_KEY,
    SURPLUS_KEY,
    WORKLOAD_KEY,
    FgdPolicy,
    FragmentationArgs,
    FragmentationBase,
    FragmentationPolicy,
    learn,
)
from .workload import (
    DEFAULT_CONFIDENCE_Z,
    DEFAULT_COVERAGE,
    DEFAULT_DRIFT_SIGNIFICANCE,
    DEFAULT_DRIFT_WINDOW_PODS,
    DEFAULT_LEVELS,
    DEFAULT_MAX_SHAPES,
    DEFAULT_PRIOR_WEIGHT,
    DEFAULT_REFERENCE_GPU_MEMORY,
    DEFAULT_SHAPES,
    DEFAULT_STRANDING_WEIGHT,
    MAX_SHAPE_CPU_MILLI,
    MAX_SHAPE_HOST_MEMORY,
    PodShape,
    Workload,
    WorkloadEstimator,
    bounded_request,
    drift_pvalue,
    shape_of,
    upper_bound_factors,
    workload_of,
)

__all__ = [
    "DEFAULT_CONFIDENCE_Z",
    "DEFAULT_COVERAGE",
    "DEFAULT_DRIFT_SIGNIFICANCE",
    "DEFAULT_DRIFT_WINDOW_PODS",
    "DEFAULT_LEVELS",
    "DEFAULT_MAX_SHAPES",
    "DEFAULT_PRIOR_WEIGHT",
    "DEFAULT_REFERENCE_GPU_MEMORY",
    "DEFAULT_SHAPES",
    "DEFAULT_STRANDING_WEIGHT",
    "MAX_SHAPE_CPU_MILLI",
    "MAX_SHAPE_HOST_MEMORY",
    "SCORED_KEY",
    "SURPLUS_KEY",
    "WORKLOAD_KEY",
    "FgdPolicy",
    "FragmentationArgs",
    "FragmentationBase",
    "FragmentationPolicy",
    "Placements",
    "PodShape",
    "Workload",
    "WorkloadEstimator",
    "best_per_row",
    "bounded_request",
    "cpu_surplus_factor",
    "drift_pvalue",
    "eligible_gpus",
    "fgd_value",
    "learn",
    "node_fragmentation",
    "placements",
    "quantised",
    "shape_of",
    "stranded",
    "stranding_change",
    "stranding_penalty",
    "upper_bound_factors",
    "workload_of",
]
