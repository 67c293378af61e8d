"""What a fuzz surface reports, and the seeded generators that surfaces share."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def watched(tally: Tally, what: object, slow_s: float) -> Iterator[None]:
    """One input through the surface: counts it, and counts as a crash any exception that
    leaves the block (the surface's own typed errors are caught inside it) or a block that
    takes longer than `slow_s` (unbounded work). `what` is the input, described on a crash."""
    tally.inputs += 1
    started = time.monotonic()
    try:
        yield
    except Exception as exc:  # the point of the run: anything else is a crash
        tally.fail("crashes", f"{type(exc).__name__}: {exc} on {_short(what)}")
        return
    elapsed = time.monotonic() - started
    if elapsed > slow_s:
        tally.fail("crashes", f"{elapsed:.1f} s on {_short(what)}")


def _short(what: object) -> str:
    """The start of repr(what), which only a crash pays for (hostile inputs are large)."""
    try:
        return repr(what)[:120]
    except ValueError:  # an int past Python's 4300-digit str() limit
        return f"<{type(what).__name__} too large to print>"


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
