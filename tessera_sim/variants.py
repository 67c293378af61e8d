"""Variants of a trace in which a share of the GPU pods may run on certain GPU models only.

The paper's simulator ships such variants of the default openb trace (`gpuspec05` ..
`gpuspec33`): the same pods, of which 5% .. 33% of the GPU pods carry a GPU model
allow-list (33% is the share observed in the production cluster). Each variant picks its
constrained pods at random among the GPU pods, independently of the others, and gives each
one an allow-list drawn from one distribution of allow-lists (`MODEL_SETS`: the
production cluster's, as counted in the published 33% variant). We make ours the same
way, with a fixed seed per variant so a variant is one fixed trace like a file; an
allow-list is drawn again when no node could ever run the pod with it (an 8-GPU pod
limited to a model that no 8-GPU node has).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from tessera_sim.trace import TraceNode, TracePod

MODEL_SETS: tuple[tuple[tuple[str, ...], int], ...] = (
    (("T4",), 1291),
    (("G2",), 331),
    (("P100",), 279),
    (("V100M16", "V100M32"), 163),
    (("P100", "V100M16", "V100M32"), 103),
    (("G3",), 86),
    (("G2", "P100", "T4", "V100M16", "V100M32"), 39),
    (("P100", "T4", "V100M16", "V100M32"), 33),
    (("A10", "G2", "T4", "V100M16", "V100M32"), 24),
    (("V100M32",), 20),
    (("A10", "T4"), 6),
    (("P100", "V100M16"), 4),
    (("A10", "G2", "P100", "T4", "V100M16", "V100M32"), 3),
    (("T4", "V100M16", "V100M32"), 3),
    (("V100M16",), 3),
)
"""GPU model allow-lists and how many of the 2,388 constrained GPU pods of the published
33% variant carry each (duplicates within a list merged)."""

VARIANT_SEED = 2023
"""Every variant is drawn with this seed: one fixed trace per constrained share."""
_MAX_DRAWS = 64
"""Allow-lists drawn for one pod before it is left unconstrained (never reached on the
openb cluster, where every multi-GPU shape has some feasible list)."""


def feasible(pod: TracePod, models: Sequence[str], nodes: Sequence[TraceNode]) -> bool:
    """Whether some node could run the pod alone, limited to these models."""
    return any(
        n.model in models
        and n.gpus >= max(pod.num_gpu, 1)
        and n.cpu_milli >= pod.cpu_milli
        and n.memory_mib >= pod.memory_mib
        for n in nodes
    )


def constrain_models(
    pods: Sequence[TracePod],
    nodes: Sequence[TraceNode],
    share: float,
    seed: int = VARIANT_SEED,
) -> list[TracePod]:
    """The pods with `share` (0..1) of the GPU pods given a model allow-list (see the
    module doc); pods that already carry one keep it and count towards the share."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be within 0..1, got {share}")
    rng = random.Random(seed)
    gpu = [i for i, p in enumerate(pods) if p.num_gpu > 0]
    have = [i for i in gpu if pods[i].gpu_spec]
    free = [i for i in gpu if not pods[i].gpu_spec]
    want = max(0, round(share * len(gpu)) - len(have))
    chosen = rng.sample(free, min(want, len(free)))
    sets = [s for s, _ in MODEL_SETS]
    weights = [w for _, w in MODEL_SETS]
    out = list(pods)
    for i in sorted(chosen):
        pod = pods[i]
        for _ in range(_MAX_DRAWS):
            models = rng.choices(sets, weights)[0]
            if feasible(pod, models, nodes):
                out[i] = replace(pod, gpu_spec=models)
                break
    return out


def variant_name(trace: str, share: float) -> str:
    """`default` with 33% -> `default-gpuspec33`."""
    return f"{trace}-gpuspec{round(100 * share):02d}"


def cpu_heavy(pods: Sequence[TracePod], factor: float, seed: int = VARIANT_SEED) -> list[TracePod]:
    """The pods with the CPU-only pods' total CPU request scaled by `factor`: CPU-only pods
    drawn at random (with replacement) from the trace's own until their CPU request
    reaches `factor` times what the trace has (factor < 1: a random subset). With factor
    2 or more the cluster's host CPU, not its GPUs, runs out first on many nodes."""
    if factor < 0:
        raise ValueError(f"factor must not be negative, got {factor}")
    rng = random.Random(seed)
    gpu = [p for p in pods if p.num_gpu > 0]
    host = sorted((p for p in pods if p.num_gpu <= 0), key=lambda p: p.name)
    if not host:
        return list(pods)
    target = factor * sum(p.cpu_milli for p in host)
    out: list[TracePod] = []
    total = 0
    pool = list(host)
    rng.shuffle(pool)
    drawn = 0
    while total < target:
        pod = pool[drawn] if drawn < len(pool) else rng.choice(host)
        name = pod.name if drawn < len(pool) else f"{pod.name}-cpu-{drawn}"
        out.append(replace(pod, name=name))
        total += pod.cpu_milli
        drawn += 1
    return gpu + out


def cpu_variant_name(trace: str, factor: float) -> str:
    """`default` with 2.5 -> `default-cpu250`."""
    return f"{trace}-cpu{round(100 * factor):03d}"
