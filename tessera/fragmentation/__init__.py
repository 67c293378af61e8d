"""Fragmentation-aware placement, tessera's default policy.

The measure follows Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing
Workloads with Fragmentation Gradient Descent" (USENIX ATC 2023): given the workload the
cluster expects (a distribution over pod classes), the fragment of a node is the idle GPU
compute that a pod drawn from that distribution could not use, in expectation. For one
class the fragment is all the node's idle GPU when the class does not fit the node at all
(too few suitable GPUs, or too little host CPU / memory left), and otherwise the idle
compute on the GPUs that cannot take one of its GPUs (the partial leftovers).

With the classes grouped by their GPU shape g (GPU count k_g, per-GPU compute and memory),
the expected fragment of a node is

    F = P * idle - sum_g W_g * [cnt_g >= k_g] * usable_g

where `idle` is the node's free GPU compute, P the total weight of GPU classes, `cnt_g` and
`usable_g` the number and free compute of GPUs that could take a GPU of shape g, and W_g
the weight of the classes of shape g whose host CPU and memory still fit. That form makes a
whole cluster cheap to evaluate with array operations (`FragmentMeasure`).

`FragmentationPolicy` places a pod where the expected fragment grows least (the gradient
step of the paper), keeps host CPU and memory in step with the GPUs they must feed,
fills equally good nodes in a fixed order, and learns the distribution online from the
pods it is asked to place (`OnlineWorkload`), starting from a prior.
docs/fragmentation.md has the design and the measurements.
"""

from tessera.fragmentation.measure import FragmentMeasure
from tessera.fragmentation.policy import FragmentationPolicy, squash
from tessera.fragmentation.shape_cache import ShapeCache
from tessera.fragmentation.workload import (
    DEFAULT_PRIOR,
    GpuShape,
    OnlineWorkload,
    PodClass,
    Workload,
)

__all__ = [
    "DEFAULT_PRIOR",
    "FragmentMeasure",
    "FragmentationPolicy",
    "GpuShape",
    "OnlineWorkload",
    "PodClass",
    "ShapeCache",
    "Workload",
    "squash",
]
