"""Summarize py-spy's collapsed stacks (`py-spy record --threads --format raw`, as
`python -m bench.scale --py-spy FILE` writes them) as tables of CPU shares: by thread, by
the part of tessera-scheduler a sample is in, and the top frames (self and total).

`python -m bench.profile_table FILE [FILE...] [--top N]` prints Markdown. With native
frames py-spy must stop the process to unwind it and cannot tell a waiting thread from a
running one (this C library has no symbols for its futex waits), so every thread is
sampled; samples stopped in a wait (a lock, the GIL, poll) are dropped here, and a share
is a share of the CPU samples that remain.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

_THREAD = re.compile(r"thread \(\d+\)(?:: (?P<name>.*))?")
_DIGITS = re.compile(r"[_-]?\d+$")
_LIBC = "(libc.so"
WAIT_CALLS = frozenset(
    {
        "pthread_cond_timedwait",
        "pthread_cond_wait",
        "pthread_mutex_lock",
        "sem_clockwait",
        "sem_timedwait",
        "sem_wait",
        "poll",
        "epoll_pwait",
        "epoll_wait",
        "select",
        "nanosleep",
        "clock_nanosleep",
        "accept4",
        "PyThread_acquire_lock_timed",
        "take_gil",
    }
)
"""Functions a thread blocks in: a sample whose C-library tail is (or is called from) one
of them is a wait, not CPU."""

PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # (part, substrings of a frame that put a sample there), first match wins, leaf first
    ("record signing", ("record.py",)),
    ("JSON decode", ("boundedjson.py", "json/decoder.py", "json/__init__.py:loads")),
    ("JSON encode", ("json/encoder.py", "_dumps (", "json_body")),
    ("decision (Decider, policies)", ("cluster_decision.py", "node_placement.py", "scoring")),
    ("pod parsing", ("request.py", "pod_fields.py")),
    ("TLS", ("libssl", "libcrypto", "ssl.py", "sslproto")),
    ("HTTP client (urllib3)", ("urllib3", "http/client.py", "kube_edge/client.py")),
    ("API client on the event loop", ("loop_client.py",)),
    ("HTTP server (uvicorn, httptools)", ("uvicorn", "httptools", "protocol.py", "uvloop")),
    ("metrics", ("prometheus_client", "metrics.py")),
    ("logging", ("logging/",)),
)
"""What each part of the process matches: the leaf-most frame naming one decides."""


@dataclass
class Profile:
    samples: int = 0
    waits: int = 0
    threads: Counter[str] = field(default_factory=Counter)
    parts: Counter[str] = field(default_factory=Counter)
    self_frames: Counter[str] = field(default_factory=Counter)
    total_frames: Counter[str] = field(default_factory=Counter)


def _short(frame: str) -> str:
    """`func (path/to/module.py:123)` -> `func (module.py)`: lines of one function add up."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    module = where.rsplit(":", 1)[0].rsplit("/", 1)[-1]
    return f"{name} ({module})" if module else name


def is_wait(frames: list[str]) -> bool:
    """Whether a sample stopped in a wait: its leaf is in the C library, and that tail (or
    the first frame above it) is a blocking call."""
    at = len(frames) - 1
    if at < 0 or _LIBC not in frames[at]:
        return False
    while at >= 0:
        name = frames[at].partition(" (")[0]
        if name in WAIT_CALLS:
            return True
        if _LIBC not in frames[at]:
            return False
        at -= 1
    return False


def _part(frames: list[str]) -> str:
    for frame in reversed(frames):
        for part, marks in PARTS:
            if any(m in frame for m in marks):
                return part
    return "other (interpreter, GC, locks, the rest)"


def read(paths: list[Path]) -> Profile:
    out = Profile()
    for path in paths:
        for line in path.read_text().splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not count_text.isdigit():
                continue
            count = int(count_text)
            frames = stack.split(";")
            thread = "?"
            if frames and (m := _THREAD.fullmatch(frames[0])):
                thread = _DIGITS.sub("", m.group("name") or "unnamed")
                frames = frames[1:]
            if is_wait(frames):
                out.waits += count
                continue
            out.samples += count
            out.threads[thread] += count
            out.parts[f"{thread}: {_part(frames)}"] += count
            if frames:
                out.self_frames[_short(frames[-1])] += count
            for frame in {_short(f) for f in frames}:
                out.total_frames[frame] += count
    return out


def _rows(counter: Counter[str], total: int, top: int) -> list[str]:
    return [f"| {k} | {100 * n / total:.1f} % |" for k, n in counter.most_common(top)]


def table(profile: Profile, top: int = 25) -> list[str]:
    total = max(profile.samples, 1)
    lines = [
        f"{profile.samples} CPU samples ({profile.waits} samples in waits left out).",
        "",
        "| thread | share of CPU |",
        "|---|---|",
    ]
    lines += _rows(profile.threads, total, top)
    lines += ["", "| thread: part | share of CPU |", "|---|---|"]
    lines += _rows(profile.parts, total, top)
    lines += ["", "| frame (self) | share of CPU |", "|---|---|"]
    lines += _rows(profile.self_frames, total, top)
    lines += ["", "| frame (total: on the stack) | share of CPU |", "|---|---|"]
    lines += _rows(profile.total_frames, total, top)
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--top", type=int, default=25, help="rows per table")
    args = p.parse_args(argv)
    print("\n".join(table(read(args.files), args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
