"""What a fuzz surface reports, and the seeded generators that surfaces share."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Tally:
    """Counts for one surface. Every count but `inputs` must end at zero."""

    surface: str
    inputs: int = 0
    crashes: int = 0
    """The component raised an unexpected exception, hung, or its process died."""
    server_errors: int = 0
    """Client input answered as our own fault (HTTP 5xx, gRPC INTERNAL/UNKNOWN, ...)."""
    forgeries: int = 0
    """Inputs that obtained devices, or a signature check, they were not entitled to."""
    examples: list[str] = field(default_factory=list)
    """A few short descriptions of failing inputs, to reproduce them."""

    def fail(self, kind: str, description: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.examples) < 5:
            self.examples.append(f"{kind}: {description[:200]}")


def mutate(data: bytes, rng: random.Random, max_len: int = 1 << 16) -> bytes:
    """One random edit of `data`: flip, insert, delete, repeat or splice bytes."""
    buf = bytearray(data)
    op = rng.randrange(6)
    pos = rng.randrange(len(buf) + 1)
    if op == 0 and buf:
        buf[min(pos, len(buf) - 1)] ^= 1 << rng.randrange(8)
    elif op == 1:
        buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
    elif op == 2 and buf:
        del buf[pos : pos + rng.randrange(1, 17)]
    elif op == 3 and buf:
        chunk = buf[pos : pos + rng.randrange(1, 33)]
        buf[pos:pos] = chunk * rng.randrange(1, 64)
    elif op == 4:
        buf[pos:pos] = rng.choice(INTERESTING)
    else:
        buf = buf[:pos]
    return bytes(buf[:max_len])


INTERESTING: tuple[bytes, ...] = (
    b"[" * 64,
    b"{" * 64,
    b"1e999999",
    b"9" * 5000,
    b"-0",
    b"NaN",
    b"Infinity",
    b"\x00",
    b"\xff\xfe",
    b'"\\ud800"',
    b"null",
    b"true",
    b"18446744073709551616",
    b"\xe9",
)
