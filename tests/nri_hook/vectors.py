"""The captured containerd <-> plugin sessions in tests/vectors/nri-wire.

Tests that need them use the `sessions` fixture (conftest.py), which fails when the
directory is absent: every clone carries them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from tests.vectors import NRI_WIRE, require

VECTORS = NRI_WIRE


@dataclass(frozen=True)
class Session:
    path: Path

    @property
    def name(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}"

    @property
    def version(self) -> str:
        return self.path.parent.name

    @cached_property
    def index(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads((self.path / "index.json").read_text())
        return loaded

    def stream(self, direction: str) -> bytes:
        return (self.path / f"{direction}.bin").read_bytes()

    def chunks(self, direction: str) -> list[bytes]:
        """The socket reads as recorded (read boundaries, not protocol boundaries)."""
        data = self.stream(direction)
        return [
            data[c["offset"] : c["offset"] + c["length"]]
            for c in self.index["chunks"]
            if c["dir"] == direction
        ]

    def messages(self, direction: str | None = None) -> list[dict[str, Any]]:
        return [m for m in self.index["messages"] if direction is None or m["dir"] == direction]

    def body(self, message: dict[str, Any]) -> bytes:
        """The ttrpc message body (the Request/Response envelope)."""
        return (self.path / "messages" / str(message["file"])).read_bytes()

    def nri_payload(self, message: dict[str, Any]) -> bytes:
        return (self.path / "messages" / str(message["nri_file"])).read_bytes()

    def oracle(self, message: dict[str, Any]) -> dict[str, Any]:
        name = message["file"].removesuffix(".bin") + ".go.json"
        loaded: dict[str, Any] = json.loads((self.path / "messages" / name).read_text())
        return loaded

    def ttrpc_frame(self, message: dict[str, Any]) -> bytes:
        return bytes.fromhex(message["ttrpc_header_hex"]) + self.body(message)


def all_sessions() -> list[Session]:
    found = [Session(p) for p in sorted(require(VECTORS).glob("*/session-*")) if p.is_dir()]
    if not found:
        raise AssertionError(f"no captured NRI sessions under {VECTORS}")
    return found
