"""Run a module as a program while sampling every thread's stack (a poor man's py-spy):
`python -m bench.sampler <module> [args...]`, with $TESSERA_SAMPLE_OUT naming the report
file written at exit. Each sample counts the function on top of each busy thread (self)
and every function on its stack (total); idle waits (select, locks, sleeps) are skipped.
"""

from __future__ import annotations

import atexit
import collections
import os
import runpy
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

INTERVAL_S = 0.005
"""5 ms between samples: about 1% of one core for the sampler itself."""
IDLE = frozenset(
    {"wait", "select", "poll", "accept", "sleep", "_wait_for_tstate_lock", "readinto", "recv_into"}
)
"""Functions a thread waits in: samples stopped there say nothing about the work."""


def _where(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_filename.rsplit('/', 2)[-2:][-1]}:{code.co_name}"


def thread_cpu() -> dict[str, float]:
    """utime + stime of each live Python thread (by name; same names summed), in seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for thread in threading.enumerate():
        tid = thread.native_id
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        name = thread.name.rstrip("0123456789_-") or thread.name
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


class Sampler:
    def __init__(self) -> None:
        self.self_counts: collections.Counter[str] = collections.Counter()
        self.total_counts: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self.me = threading.get_ident()
        self.cpu_at_reset: dict[str, float] = {}

    def loop(self) -> None:
        while True:
            time.sleep(INTERVAL_S)
            for ident, frame in sys._current_frames().items():
                if ident == self.me or frame.f_code.co_name in IDLE:
                    continue
                self.samples += 1
                self.self_counts[_where(frame)] += 1
                seen = set()
                f: FrameType | None = frame
                while f is not None:
                    where = _where(f)
                    if where not in seen:
                        seen.add(where)
                        self.total_counts[where] += 1
                    f = f.f_back

    def reset(self) -> None:
        """Forget what was sampled so far (start-up), to sample only what follows."""
        self.self_counts.clear()
        self.total_counts.clear()
        self.samples = 0
        self.cpu_at_reset = thread_cpu()

    def report(self, path: str) -> None:
        lines = [f"{self.samples} busy samples every {INTERVAL_S * 1000:.0f} ms", ""]
        lines.append("CPU seconds by thread since the reset:")
        now = thread_cpu()
        spent = {k: v - self.cpu_at_reset.get(k, 0.0) for k, v in now.items()}
        lines += [f"{v:9.2f} {k}" for k, v in sorted(spent.items(), key=lambda kv: -kv[1])]
        lines += ["", "self:"]
        lines += [f"{n:7d} {w}" for w, n in self.self_counts.most_common(40)]
        lines += ["", "total:"]
        lines += [f"{n:7d} {w}" for w, n in self.total_counts.most_common(60)]
        with open(path, "w") as out:
            out.write("\n".join(lines) + "\n")


def main() -> None:
    module, *args = sys.argv[1:]
    out = os.environ.get("TESSERA_SAMPLE_OUT", "sample.txt")
    sampler = Sampler()
    thread = threading.Thread(target=sampler.loop, daemon=True)
    thread.start()
    sampler.me = thread.ident or 0
    atexit.register(sampler.report, out)
    signal.signal(signal.SIGUSR1, lambda *_: sampler.report(out))
    signal.signal(signal.SIGUSR2, lambda *_: sampler.reset())
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
