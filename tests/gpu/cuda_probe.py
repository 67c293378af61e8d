"""What a CUDA program sees, run as its own process: a stand-in for a container's workload.

Prints one JSON object (the last line of its output):
- whether CUDA is usable, the GPUs it enumerates (UUID, multiprocessor count) and, per GPU,
  the free and total memory CUDA reports (an isolation layer reports its limit as total);
- for each size asked with --alloc-mib, whether a buffer that large could be allocated and
  written;
- with --largest CAP, the largest single buffer (64 MiB steps, up to CAP MiB) on each GPU,
  the error the first refused size gave, and whether a small buffer still works after it
  (a layer must refuse with CUDA's out-of-memory error, not end the process);
- with --compute SECONDS, the rate of a compute-bound loop (bf16 matrix products) in
  TFLOP/s per one-second window, after --warmup seconds or, with --start-at, from that
  wall-clock time (so that several probes measure the same seconds), holding --hold-mib
  MiB meanwhile (with --fill, the largest buffer found); with --linger, it then keeps its
  context that many seconds more;
- with --paths graph,cooperative,nosync, the same kind of rate for each other way work
  reaches the GPU, one after the other (--compute windows each, after --warmup seconds):
  the loop's four products captured in a CUDA graph and replayed (cudaGraphLaunch), a
  compute-bound kernel launched cooperatively (CuPy: cuLaunchCooperativeKernel), and the
  products launched back to back with one synchronisation per window;
- with --costs SECONDS, what a layer costs a program: tiny kernel launches per second and
  1 MiB allocate-and-free pairs per second (cudaMalloc/cudaFree), over that many seconds.

The container: --dev-nodes replaces /dev with a fresh read-only tmpfs holding only the
listed device nodes (as a runtime builds a container's /dev: run as root, the CUDA library
creates a node it misses, which the device cgroup stops in a container and the read-only
/dev stops here); --mounts applies a plan's tmpfs mounts; --private-tmp gives it a /tmp of
its own; --env is the plan's environment. All of that needs its own mount namespace
(`unshare --mount`); the probe sets the namespace up, then re-executes itself with the
environment, so that a preloaded library (LD_PRELOAD) sees only the CUDA program.

Needs PyTorch with CUDA; the GPU checks run it with the interpreter that has it.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
import time
from typing import Any

# what a container runtime gives every container besides the devices a plugin adds
RUNTIME_DEVICES = [
    ("/dev/null", 1, 3),
    ("/dev/zero", 1, 5),
    ("/dev/full", 1, 7),
    ("/dev/random", 1, 8),
    ("/dev/urandom", 1, 9),
    ("/dev/tty", 5, 0),
]
MIB = 1 << 20
STEP_MIB = 64
MATRIX = 8192
"""bf16 products of this size take about 1.5 ms on an H100 or H200: long enough to be
compute-bound, short enough for a layer that throttles launches to act many times a
second."""


def private_dev(nodes: list[dict[str, Any]]) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", "/dev"], check=True)
    wanted = [(p, ma, mi, 0o666) for p, ma, mi in RUNTIME_DEVICES]
    wanted += [(n["path"], n["major"], n["minor"], n.get("file_mode", 0o666)) for n in nodes]
    for path, major, minor, mode in wanted:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
        os.chmod(path, mode)
    subprocess.run(["mount", "-o", "remount,ro", "/dev"], check=True)


def apply_mounts(mounts: list[dict[str, Any]]) -> None:
    """The plan's tmpfs mounts; a bind mount of a host path to the same path is already
    in place here."""
    for m in mounts:
        if m["type"] == "tmpfs":
            os.makedirs(m["destination"], exist_ok=True)
            options = ",".join(m.get("options", []))
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", options, "tmpfs", m["destination"]], check=True
            )
        elif m["source"] != m["destination"]:
            raise SystemExit(f"cannot stand in for mount {m}")


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def _try_alloc(torch: Any, mib: int, device: int) -> str:
    try:
        buf = torch.empty(mib * MIB, dtype=torch.uint8, device=f"cuda:{device}")
        buf.fill_(7)
        torch.cuda.synchronize(device)
        ok = int(buf[-1].item()) == 7
        del buf
        return "ok" if ok else "wrong value"
    except Exception as exc:
        return _error(exc)
    finally:
        torch.cuda.empty_cache()


def largest(torch: Any, cap_mib: int, device: int) -> dict[str, Any]:
    """The largest buffer (a multiple of STEP_MIB) that allocates, by bisection."""
    low, high = 0, cap_mib // STEP_MIB + 1  # low fits (0 trivially), high does not (assumed)
    refused = ""
    if _try_alloc(torch, high * STEP_MIB, device) == "ok":
        return {"largest_mib": high * STEP_MIB, "capped": True}
    while high - low > 1:
        mid = (low + high) // 2
        answer = _try_alloc(torch, mid * STEP_MIB, device)
        if answer == "ok":
            low = mid
        else:
            high, refused = mid, answer
    refused = refused or _try_alloc(torch, high * STEP_MIB, device)
    return {
        "largest_mib": low * STEP_MIB,
        "refused_mib": high * STEP_MIB,
        "refused_with": refused,
        "small_after": _try_alloc(torch, 256, device),
    }


def compute(torch: Any, args: argparse.Namespace) -> dict[str, Any]:
    a = torch.randn(MATRIX, MATRIX, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(MATRIX, MATRIX, device="cuda", dtype=torch.bfloat16)
    held = (
        torch.empty(args.hold_mib * MIB, dtype=torch.uint8, device="cuda")
        if args.hold_mib
        else None
    )
    if held is not None:
        held.fill_(1)
    flops = 2 * MATRIX**3
    start = args.start_at or (time.time() + args.warmup)
    late = max(0.0, time.time() - start)
    while time.time() < start:
        torch.mm(a, b)
        torch.cuda.synchronize()
    windows: list[float] = []
    for _ in range(int(args.compute)):
        t0 = time.perf_counter()
        n = 0
        while time.perf_counter() - t0 < 1.0:
            for _ in range(4):
                torch.mm(a, b)
            torch.cuda.synchronize()
            n += 4
        windows.append(n * flops / (time.perf_counter() - t0) / 1e12)
    out: dict[str, Any] = {"tflops": windows, "late_s": round(late, 2)}
    if args.linger:
        time.sleep(args.linger)
    del held
    return out


def _windows(
    args: argparse.Namespace, step: Any, flops_per_step: float, sync: Any
) -> dict[str, Any]:
    """TFLOP/s per one-second window of `step` (synchronised by `sync` at each window's
    end, and by `step` itself where it synchronises), after args.warmup seconds of it; and
    the wall-clock time the windows started (the check samples the clock over them)."""
    until = time.time() + args.warmup
    while time.time() < until:
        step()
    sync()
    start = time.time()
    windows: list[float] = []
    for _ in range(int(args.compute)):
        t0 = time.perf_counter()
        n = 0
        while time.perf_counter() - t0 < 1.0:
            step()
            n += 1
        sync()
        windows.append(n * flops_per_step / (time.perf_counter() - t0) / 1e12)
    return {"tflops": windows, "start": start}


COOPERATIVE_KERNEL = r"""
#include <cooperative_groups.h>
extern "C" __global__ void spin(float *out, int rounds) {
    float a = threadIdx.x * 1e-3f, b = 1.0001f, c = 0.9999f;
    for (int r = 0; r < rounds; r++) {
        #pragma unroll 16
        for (int i = 0; i < 256; i++) { a = a * b + c; c = c * b + a * 1e-7f; }
    }
    cooperative_groups::this_grid().sync();  /* only a cooperative launch may do this */
    if (a + c == 12345.0f) out[blockIdx.x] = a;
}
"""
COOPERATIVE_ROUNDS = 2000
"""About 2 ms per launch on an H100 or H200 (one 1,024-thread block per SM)."""


def paths(torch: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The rate of each other launch path (module docstring), TFLOP/s per window."""
    a = torch.randn(MATRIX, MATRIX, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(MATRIX, MATRIX, device="cuda", dtype=torch.bfloat16)
    flops = 2 * MATRIX**3
    out: dict[str, Any] = {}
    for path in args.paths.split(","):
        try:
            if path == "graph":
                graph = torch.cuda.CUDAGraph()
                torch.mm(a, b)
                torch.cuda.synchronize()
                with torch.cuda.graph(graph):
                    for _ in range(4):
                        torch.mm(a, b)

                def replay(graph: Any = graph) -> None:
                    graph.replay()
                    torch.cuda.synchronize()

                out[path] = _windows(args, replay, 4 * flops, torch.cuda.synchronize)
            elif path == "nosync":
                out[path] = _windows(args, lambda: torch.mm(a, b), flops, torch.cuda.synchronize)
            elif path == "cooperative":
                out[path] = _cooperative(args)
            else:
                out[path] = {"error": f"unknown path {path}"}
        except Exception as exc:
            out[path] = {"error": _error(exc)}
    return out


def _cooperative(args: argparse.Namespace) -> dict[str, Any]:
    import cupy  # type: ignore[import-not-found]

    kernel = cupy.RawKernel(COOPERATIVE_KERNEL, "spin", enable_cooperative_groups=True)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    out = cupy.zeros(sms, dtype=cupy.float32)
    threads = 1024
    flops = sms * threads * COOPERATIVE_ROUNDS * 256 * 4.0  # two FMAs of two flops each

    def launch() -> None:
        kernel((sms,), (threads,), (out, cupy.int32(COOPERATIVE_ROUNDS)))
        cupy.cuda.Device().synchronize()

    return _windows(args, launch, flops, cupy.cuda.Device().synchronize)


def costs(seconds: float) -> dict[str, Any]:
    """Tiny kernel launches per second and 1 MiB cudaMalloc/cudaFree pairs per second,
    through CuPy (its RawKernel launches with cuLaunchKernel; its runtime.malloc is a plain
    cudaMalloc, where PyTorch's caching allocator would hand back a cached block)."""
    import cupy

    kernel = cupy.RawKernel('extern "C" __global__ void nop(int *p) {}', "nop")
    buf = cupy.zeros(1, dtype=cupy.int32)

    def launch() -> None:
        kernel((1,), (1,), (buf,))

    def alloc() -> None:
        cupy.cuda.runtime.free(cupy.cuda.runtime.malloc(MIB))

    out: dict[str, Any] = {}
    for name, step in (("launches_per_s", launch), ("allocations_per_s", alloc)):
        for _ in range(200):  # warm: the module's load, the first allocation
            step()
        cupy.cuda.Device().synchronize()
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            for _ in range(100):
                step()
            n += 100
        cupy.cuda.Device().synchronize()
        out[name] = n / (time.perf_counter() - t0)
    return out


def container(args: argparse.Namespace) -> None:
    """Become the container: namespace set-up, then this probe again with its environment."""
    if args.dev_nodes is not None:
        private_dev(json.loads(args.dev_nodes))
    if args.private_tmp:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", "/tmp"], check=True)
    if args.mounts:
        apply_mounts(json.loads(args.mounts))
    env = dict(os.environ, **json.loads(args.env or "{}"))
    argv = [sys.executable, os.path.abspath(__file__), "--inside", *args.rest]
    sys.stdout.flush()
    os.execve(sys.executable, argv, env)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dev-nodes", help="JSON list of {path, major, minor, file_mode}")
    parser.add_argument("--mounts", help="JSON list of the plan's mounts")
    parser.add_argument("--private-tmp", action="store_true")
    parser.add_argument("--env", help="JSON object: the plan's environment")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--alloc-mib", type=int, action="append", default=[])
    parser.add_argument("--largest", type=int, default=0, metavar="CAP_MIB")
    parser.add_argument("--compute", type=float, default=0, metavar="SECONDS")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--start-at", type=float, default=0.0)
    parser.add_argument("--hold-mib", type=int, default=0)
    parser.add_argument(
        "--fill", action="store_true", help="with --largest: hold the largest buffer found"
    )
    parser.add_argument("--linger", type=float, default=0.0)
    parser.add_argument("--paths", default="", help="graph,cooperative,nosync")
    parser.add_argument("--costs", type=float, default=0.0, metavar="SECONDS")
    args, _ = parser.parse_known_args()
    contained = args.dev_nodes is not None or args.mounts or args.private_tmp or args.env
    if contained and not args.inside:
        skip = {"--dev-nodes", "--mounts", "--env"}
        rest: list[str] = []
        it = iter(sys.argv[1:])
        for word in it:
            if word in skip:
                next(it)
            elif word != "--private-tmp":
                rest.append(word)
        args.rest = rest
        container(args)
    out: dict[str, Any] = {"pid": os.getpid()}
    out["env"] = {
        k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "NVIDIA_", "LD_PRELOAD"))
    }
    if args.inside or args.dev_nodes is not None:
        out["dev"] = sorted(os.listdir("/dev"))
    try:
        import torch  # type: ignore[import-not-found]

        out["available"] = bool(torch.cuda.is_available())
        count = torch.cuda.device_count() if out["available"] else 0
        props = [torch.cuda.get_device_properties(i) for i in range(count)]
        out["uuids"] = [str(p.uuid) for p in props]
        out["sms"] = [int(p.multi_processor_count) for p in props]
        out["memory_mib"] = [
            [v // MIB for v in torch.cuda.mem_get_info(i)] for i in range(count)
        ]  # [free, total] per GPU
        out["alloc"] = {str(mib): _try_alloc(torch, mib, 0) for mib in args.alloc_mib}
        if args.largest:
            out["largest"] = [largest(torch, args.largest, i) for i in range(count)]
            if args.fill:
                args.hold_mib = out["largest"][0]["largest_mib"]
        if args.costs:
            try:
                out["costs"] = costs(args.costs)
            except Exception as exc:
                out["costs"] = {"error": _error(exc)}
        if args.paths:
            out["paths"] = paths(torch, args)
        elif args.compute:
            out["compute"] = compute(torch, args)
        elif args.hold_mib:
            held = torch.empty(args.hold_mib * MIB, dtype=torch.uint8, device="cuda")
            held.fill_(1)
            torch.cuda.synchronize()
            out["held_mib"] = args.hold_mib
            print(json.dumps({"holding": args.hold_mib}), flush=True)
            time.sleep(args.linger)
            del held
        if args.inside or args.dev_nodes is not None:
            out["dev-after"] = sorted(os.listdir("/dev"))
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
