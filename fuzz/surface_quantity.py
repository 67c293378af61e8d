"""Quantities as pod authors write them, through the pod parser (tessera.request.parse_pod):
mutated valid quantities and crafted ones (huge exponents and digit strings, inf/nan, big
integers) in device, CPU, memory and overhead fields.

A crash is any exception but RequestError, a RequestError that does not name the container
and resource of a container field, or a parse slower than SLOW_SECONDS.
"""

from __future__ import annotations

import math
import random
from typing import Any, Final

from fuzz.common import INTERESTING, Tally, mutate, watched
from tessera import resources as rn
from tessera.errors import RequestError
from tessera.request import parse_pod

SLOW_SECONDS: Final = 1.0
"""Parsing one pod's quantities takes microseconds; a second means work grew with the input
(the reported 1e999999 took 25-51 s)."""

VALID = ["100m", "1.5Gi", "2", "1e3", "80", "40Gi", "0.5", "16", "1k", "100", "2E", "3Mi"]
RESOURCES = [rn.GPU, rn.GPU_CORE, rn.GPU_MEMORY, rn.GPU_MEMORY_RATIO, rn.RDMA, "cpu", "memory"]
CRAFTED: list[Any] = [
    "1e999999",
    "1e-999999",
    "9" * 100_000,
    "1" + "0" * 4300,
    "0." + "0" * 5000 + "1",
    "1e18",
    "1E",
    "1Ei" * 20,
    math.inf,
    -math.inf,
    math.nan,
    1e308,
    2**64,
    -(2**70),
    10**5000,
    True,
    None,
    [],
    {},
    "",
    " ",
    "\u0661\u0662",  # Arabic-Indic digits: str.isdigit() says yes
    "\u0661e5",
]


def _value(rng: random.Random) -> Any:
    if rng.random() < 0.3:
        return rng.choice(CRAFTED)
    raw = rng.choice(VALID).encode()
    for _ in range(rng.randrange(1, 4)):
        raw = mutate(raw, rng) if rng.random() < 0.8 else raw + rng.choice(INTERESTING)
    return raw.decode("utf-8", errors="replace")


def run(n: int, seed: int) -> Tally:
    rng = random.Random(seed)
    tally = Tally("quantity")
    for _ in range(n):
        resource = rng.choice(RESOURCES)
        value = _value(rng)
        overhead = rng.random() < 0.1
        pod: dict[str, Any] = {
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {}}}]},
        }
        if overhead:
            pod["spec"]["overhead"] = {rng.choice(["cpu", "memory"]): value}
        else:
            pod["spec"]["containers"][0]["resources"]["limits"][resource] = value
        with watched(tally, (resource, value), SLOW_SECONDS):
            try:
                parse_pod(pod)
            except RequestError as exc:
                if not overhead and (exc.container != "main" or exc.resource != resource):
                    tally.fail("crashes", f"RequestError names {exc.container}/{exc.resource}")
    return tally
