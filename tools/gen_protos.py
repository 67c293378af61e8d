"""Generate the Python stubs for every .proto under protos/.

The stubs are build outputs, never committed (.gitignore): `make protos` writes them for a
checkout and setup.py's build step for a wheel, so they cannot drift from their protos.

Only the kubelet protos are gRPC services; NRI and ttrpc use our own ttrpc transport, so
they get message stubs (and type stubs) but no gRPC service stubs.
"""

from __future__ import annotations

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


def main() -> int:
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        _generate(out)
        fresh = _generated_files(out)
        for rel in set(_generated_files(ROOT)) - set(fresh):
            (ROOT / rel).unlink()
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
