"""Generate the Python stubs for every .proto under protos/third_party/.

The .proto files describe other projects' wire formats, so they live apart from tessera's
own code, under protos/third_party/ (its README names each upstream). protoc sees that
folder as `protos/`, so a file there named kubelet/deviceplugin/v1beta1/api.proto becomes
the module protos.kubelet.deviceplugin.v1beta1.api_pb2, registered under the file name
protos/kubelet/deviceplugin/v1beta1/api.proto: the import paths and descriptors do not
depend on where the sources are kept.

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
PACKAGE = "protos"
PROTO_DIR = ROOT / PACKAGE / "third_party"
GRPC_SERVICE_DIRS = ("kubelet/",)
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def _proto_files() -> list[Path]:
    """Each source's path below PROTO_DIR."""
    return sorted(p.relative_to(PROTO_DIR) for p in PROTO_DIR.rglob("*.proto"))


def _generate(out_dir: Path) -> None:
    from grpc_tools import protoc

    well_known = str(resources.files("grpc_tools") / "_proto")
    for proto in _proto_files():
        args = [
            "grpc_tools.protoc",
            # virtual=disk: the sources are seen (and named in descriptors) as protos/...
            f"-I{PACKAGE}={PROTO_DIR}",
            f"-I{well_known}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
        ]
        if proto.as_posix().startswith(GRPC_SERVICE_DIRS):
            args.append(f"--grpc_python_out={out_dir}")
        args.append(f"{PACKAGE}/{proto.as_posix()}")
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {proto}")


def _generated_files(base: Path) -> dict[Path, Path]:
    found: dict[Path, Path] = {}
    for suffix in GENERATED_SUFFIXES:
        for path in (base / PACKAGE).rglob(f"*{suffix}"):
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
