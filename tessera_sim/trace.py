"""Read the openb traces (node list and pod list CSV files) and turn them into core objects.

The files are read where they lie (their terms do not allow copying them into the
repository). Every problem is reported with the file, the line and the column.

- Node list columns: sn, cpu_milli, memory_mib, gpu, model.
- Pod list columns: name, cpu_milli, memory_mib, num_gpu, gpu_milli, and optionally
  gpu_spec ('|'-separated allowed models, empty = any) and others, which are ignored.

A pod with num_gpu = 1 and gpu_milli < 1000 asks for that share of one GPU (compute and
memory: `tessera.dev/gpu` = gpu_milli / 10 percent); any other GPU pod asks for num_gpu
whole GPUs.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from tessera import resources as rn
from tessera.errors import InputError
from tessera.model import Gpu, NodeInventory
from tessera.request import PodRequest, parse_pod

GPU_MEMORY_MIB: dict[str, int] = {
    "P100": 16 * 1024,
    "T4": 16 * 1024,
    "V100M16": 16 * 1024,
    "V100M32": 32 * 1024,
    "A10": 24 * 1024,
    # G1-G3 are undisclosed models; the paper's simulator assumes 10, 20 and 30 GB.
    "G1": 10000,
    "G2": 20000,
    "G3": 30000,
}
"""GPU memory per openb model (public sizes; an assumption for the undisclosed G models)."""
DEFAULT_GPU_MEMORY_MIB = 16 * 1024
"""For a model not listed above."""


class TraceError(InputError, ValueError):
    """A malformed trace file; the message names the file, line and column."""

    def __init__(self, path: Path | str, line: int, column: str | None, problem: str) -> None:
        where = f"{path}:{line}" + (f": column {column!r}" if column else "")
        super().__init__(f"{where}: {problem}")
        self.path = str(path)
        self.line = line
        self.column = column


@dataclass(frozen=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str

    @property
    def gpu_memory_mib(self) -> int:
        return GPU_MEMORY_MIB.get(self.model, DEFAULT_GPU_MEMORY_MIB)

    def inventory(self) -> NodeInventory:
        """One NUMA-less node whose GPUs all have this model and no NVLink."""
        mem = self.gpu_memory_mib
        gpus = tuple(
            Gpu(
                uuid=f"{self.name}-gpu{i}",
                index=i,
                minor=i,
                model=self.model,
                memory_mib=mem,
                pci_bus_id=f"0000:{(i + 1) % 256:02x}:00.0",
            )
            for i in range(self.gpus)
        )
        return NodeInventory(self.name, gpus)


@dataclass(frozen=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()

    @property
    def is_share(self) -> bool:
        return self.num_gpu == 1 and 0 < self.gpu_milli < 1000

    @property
    def gpu_milli_total(self) -> int:
        """GPU request in thousandths of a GPU (a share counts its share)."""
        if self.num_gpu <= 0:
            return 0
        return self.gpu_milli if self.is_share else 1000 * self.num_gpu

    def pod_dict(
        self, uid: str, memory_mode: str = "share", reference_mib: int = 0
    ) -> dict[str, Any]:
        """The pod as Kubernetes JSON with tessera's resources.

        `memory_mode` "share": the share covers compute and memory (`tessera.dev/gpu`);
        "absolute": compute share plus a fixed amount of GPU memory, the share of a
        reference GPU of `reference_mib` (the GPU-memory extension).
        """
        limits: dict[str, str] = {}
        if self.num_gpu > 0:
            if not self.is_share:
                limits[rn.GPU] = str(rn.UNITS_PER_DEVICE * self.num_gpu)
            elif memory_mode == "absolute":
                pct = self.gpu_milli // 10
                gib = max(1, math.ceil(self.gpu_milli * reference_mib / 1000 / 1024))
                limits[rn.GPU_CORE] = str(pct)
                limits[rn.GPU_MEMORY] = str(gib)
            else:
                limits[rn.GPU] = str(self.gpu_milli // 10)
        resources: dict[str, dict[str, str]] = {
            "requests": {"cpu": f"{self.cpu_milli}m", "memory": f"{self.memory_mib}Mi"},
        }
        if limits:
            resources["limits"] = limits
        annotations = {}
        if self.gpu_spec and self.num_gpu > 0:
            annotations[rn.GPU_MODEL_ANNOTATION] = ",".join(self.gpu_spec)
        return {
            "metadata": {
                "name": self.name,
                "namespace": "openb",
                "uid": uid,
                "annotations": annotations,
            },
            "spec": {"containers": [{"name": "main", "resources": resources}]},
        }

    def request(self, uid: str, memory_mode: str = "share", reference_mib: int = 0) -> PodRequest:
        return parse_pod(self.pod_dict(uid, memory_mode, reference_mib))


def _rows(path: Path, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise TraceError(path, 0, None, f"cannot open: {exc.strerror or exc}") from None
    with handle:
        reader = csv.reader(handle)
        try:
            header = next(reader)
        except StopIteration:
            raise TraceError(path, 1, None, "empty file (no header line)") from None
        header = [h.strip() for h in header]
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(
                path, 1, missing[0], f"missing column (header has: {', '.join(header)})"
            )
        for values in reader:
            line = reader.line_num
            if not values or all(not v.strip() for v in values):
                continue
            if len(values) != len(header):
                raise TraceError(
                    path, line, None, f"{len(values)} fields, the header has {len(header)}"
                )
            yield line, dict(zip(header, values, strict=True))


def _int(path: Path, line: int, row: dict[str, str], column: str, minimum: int = 0) -> int:
    raw = row[column].strip()
    try:
        value = int(raw)
    except ValueError:
        try:
            as_float = float(raw)
        except ValueError:
            raise TraceError(path, line, column, f"not a number: {raw!r}") from None
        if not as_float.is_integer():
            raise TraceError(path, line, column, f"not a whole number: {raw!r}") from None
        value = int(as_float)
    if value < minimum:
        raise TraceError(path, line, column, f"must be >= {minimum}, got {value}")
    return value


NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


T = TypeVar("T")


def _load(
    path: Path | str,
    columns: tuple[str, ...],
    kind: str,
    build: Callable[[Path, int, dict[str, str], str], T],
) -> list[T]:
    """`build(path, line, row, name)` for each data row. The name (the first column) is
    non-empty and unique in the file, and the file has at least one row."""
    path = Path(path)
    column = columns[0]
    seen: dict[str, int] = {}
    items: list[T] = []
    for line, row in _rows(path, columns):
        name = row[column].strip()
        if not name:
            raise TraceError(path, line, column, f"empty {kind} name")
        if name in seen:
            raise TraceError(path, line, column, f"duplicate {kind} {name!r} (line {seen[name]})")
        seen[name] = line
        items.append(build(path, line, row, name))
    if not items:
        raise TraceError(path, 1, None, f"no {kind}s")
    return items


def _host(path: Path, line: int, row: dict[str, str]) -> tuple[int, int]:
    """(cpu_milli, memory_mib) of a node or pod row."""
    return _int(path, line, row, "cpu_milli"), _int(path, line, row, "memory_mib")


def _node(path: Path, line: int, row: dict[str, str], name: str) -> TraceNode:
    gpus = _int(path, line, row, "gpu")
    model = row["model"].strip()
    if gpus and (not model or model.lower() == "nan"):
        raise TraceError(path, line, "model", "a node with GPUs needs a model")
    return TraceNode(name, *_host(path, line, row), gpus=gpus, model=model if gpus else "")


def _pod(path: Path, line: int, row: dict[str, str], name: str) -> TracePod:
    num_gpu = _int(path, line, row, "num_gpu")
    gpu_milli = _int(path, line, row, "gpu_milli")
    if num_gpu > 0 and not 0 < gpu_milli <= 1000:
        raise TraceError(path, line, "gpu_milli", f"must be in 1..1000, got {gpu_milli}")
    if num_gpu == 1 and gpu_milli < 1000 and gpu_milli % 10:
        raise TraceError(
            path, line, "gpu_milli", f"a share must be a multiple of 10, got {gpu_milli}"
        )
    spec_raw = row.get("gpu_spec", "").strip()
    spec = tuple(m.strip() for m in spec_raw.split("|") if m.strip() and m.strip() != "nan")
    milli = gpu_milli if num_gpu > 0 else 0
    return TracePod(name, *_host(path, line, row), num_gpu=num_gpu, gpu_milli=milli, gpu_spec=spec)


def load_nodes(path: Path | str) -> list[TraceNode]:
    return _load(path, NODE_COLUMNS, "node", _node)


def load_pods(path: Path | str) -> list[TracePod]:
    return _load(path, POD_COLUMNS, "pod", _pod)


def with_name(pod: TracePod, name: str) -> TracePod:
    return replace(pod, name=name)
