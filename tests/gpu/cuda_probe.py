"""What a CUDA program sees, run as its own process (a stand-in for a container's workload).

Prints one JSON object: whether CUDA is usable, the GPUs it enumerates (UUID and
multiprocessor count), and for each size asked with --alloc-mib whether a device buffer of
that many MiB could be allocated and written. With --dev-nodes it first replaces /dev with a
fresh tmpfs holding only the listed device nodes, read-only (it must run in its own mount
namespace, `unshare --mount`), as a container runtime builds a container's /dev: run as
root, the CUDA driver library creates a device node it misses, which the device cgroup
stops in a container and the read-only /dev stops here.

Needs PyTorch with CUDA; the GPU checks run it with the interpreter that has it.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
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


def private_dev(nodes: list[dict[str, Any]]) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", "/dev"], check=True)
    wanted = [(p, ma, mi, 0o666) for p, ma, mi in RUNTIME_DEVICES]
    wanted += [(n["path"], n["major"], n["minor"], n.get("file_mode", 0o666)) for n in nodes]
    for path, major, minor, mode in wanted:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
        os.chmod(path, mode)
    subprocess.run(["mount", "-o", "remount,ro", "/dev"], check=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dev-nodes", help="JSON list of {path, major, minor, file_mode}")
    parser.add_argument("--alloc-mib", type=int, action="append", default=[])
    args = parser.parse_args()
    out: dict[str, Any] = {}
    if args.dev_nodes is not None:
        private_dev(json.loads(args.dev_nodes))
        out["dev"] = sorted(os.listdir("/dev"))
    try:
        import torch  # type: ignore[import-not-found]

        out["available"] = bool(torch.cuda.is_available())
        count = torch.cuda.device_count() if out["available"] else 0
        props = [torch.cuda.get_device_properties(i) for i in range(count)]
        out["uuids"] = [str(p.uuid) for p in props]
        out["sms"] = [int(p.multi_processor_count) for p in props]
        allocs: dict[str, str] = {}
        for mib in args.alloc_mib:
            try:
                buf = torch.empty(mib * 1024 * 1024, dtype=torch.uint8, device="cuda")
                buf.fill_(7)
                torch.cuda.synchronize()
                allocs[str(mib)] = "ok" if int(buf[-1].item()) == 7 else "wrong value"
                del buf
                torch.cuda.empty_cache()
            except Exception as exc:
                allocs[str(mib)] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        out["alloc"] = allocs
        if args.dev_nodes is not None:
            out["dev-after"] = sorted(os.listdir("/dev"))
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
