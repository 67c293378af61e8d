"""Generate the Python stubs for every .proto under protos/.

The stubs are committed so that the package installs from git without a code generator;
`--check` regenerates into a scratch directory and fails if the committed stubs differ,
which keeps the two from drifting apart.

Only the kubelet protos are gRPC services; NRI and ttrpc use our own ttrpc transport, so
they get message stubs (and type stubs) but no gRPC service stubs.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"
GRPC_SERVICE_DIRS = ("protos/kubelet",)
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def _proto_files() -> list[Path]:
    return sorted(p.relative_to(ROOT) for p in PROTO_DIR.rglob("*.proto"))


def _generate(out_dir: Path) -> None:
    from grpc_tools import protoc

    well_known = str(resources.files("grpc_tools") / "_proto")
    for proto in _proto_files():
        args = [
            "grpc_tools.protoc",
            f"-I{ROOT}",
            f"-I{well_known}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
        ]
        if str(proto).startswith(GRPC_SERVICE_DIRS):
            args.append(f"--grpc_python_out={out_dir}")
        args.append(str(ROOT / proto))
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {proto}")


def _generated_files(base: Path) -> dict[Path, Path]:
    found: dict[Path, Path] = {}
    for suffix in GENERATED_SUFFIXES:
        for path in (base / "protos").rglob(f"*{suffix}"):
            found[path.relative_to(base)] = path
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed stubs are stale")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        _generate(out)
        fresh = _generated_files(out)
        current = _generated_files(ROOT)
        if args.check:
            stale = sorted(
                str(rel)
                for rel in set(fresh) | set(current)
                if rel not in fresh
                or rel not in current
                or not filecmp.cmp(fresh[rel], current[rel], shallow=False)
            )
            if stale:
                print("generated stubs are out of date; run `make protos`:", *stale, sep="\n  ")
                return 1
            print(f"{len(fresh)} generated stubs are up to date")
            return 0
        for rel in set(current) - set(fresh):
            current[rel].unlink()
        for rel, path in fresh.items():
            target = ROOT / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        for package_dir in {(ROOT / rel).parent for rel in fresh}:
            init = package_dir
            while init != ROOT:
                (init / "__init__.py").touch(exist_ok=True)
                init = init.parent
    return 0


if __name__ == "__main__":
    sys.exit(main())
