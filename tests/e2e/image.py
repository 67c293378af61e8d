"""tessera's container image, made offline from this checkout and the Python running the
suite, so the shipped manifests can run on the suite's real kubelet and containerd.

deploy/Dockerfile needs a registry for its base image; this host has none. The image made
here holds what that Dockerfile's holds: a Python 3.11, tessera's runtime dependencies
(the closure of the project's requirements, no dev extras) and tessera's packages, with a
console script per program. The interpreter and every shared library it and the
dependencies' extension modules load (found with ldd) keep their host paths, so the
interpreter finds its prefix and libraries without an ld.so cache. The layer is an
uncompressed tar: containerd imports it as is.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

from tests.e2e.node import oci_archive

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "tessera"
STDLIB_SKIP = frozenset(
    {"idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages", "pydoc_data"}
)
"""Top-level stdlib folders no program uses (and site-packages, filled below); folders
named test or tests anywhere, and the static library under config-*, are left out too."""
SCRIPT = "#!{python}\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n"


def shipped_packages() -> list[str]:
    """The top-level packages `pip install .` installs (pyproject's packages.find)."""
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    include = found["packages"]["find"]["include"]
    return sorted({pattern.split(".")[0].rstrip("*") for pattern in include})


def runtime_distributions() -> list[metadata.Distribution]:
    """The installed distributions tessera needs at run time (its requirements without
    extras, and theirs, transitively)."""
    wanted = [PROJECT]
    seen: dict[str, metadata.Distribution] = {}
    while wanted:
        name = _normal(wanted.pop())
        if name in seen:
            continue
        dist = metadata.distribution(name)
        seen[name] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                wanted.append(req.name)
    return [d for n, d in seen.items() if n != _normal(PROJECT)]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _files() -> Iterator[tuple[str, Path]]:
    """(path in the image, host file) for the interpreter, stdlib, dependencies, tessera."""
    prefix = Path(sys.base_prefix)
    python = Path(sys.executable).resolve()
    yield str(python), python
    stdlib = Path(sysconfig.get_paths(vars={"base": str(prefix)})["stdlib"])
    for path in sorted(stdlib.rglob("*")):
        rel = path.relative_to(stdlib)
        if (
            path.is_file()
            and rel.parts[0] not in STDLIB_SKIP
            and not rel.parts[0].startswith("config-")
            and not {"test", "tests"} & set(rel.parts)
        ):
            yield str(path), path
    site = _site_packages()
    for dist in runtime_distributions():
        for f in dist.files or []:
            host = Path(str(dist.locate_file(f))).resolve()
            if host.is_file() and not str(f).startswith(".."):
                yield f"{site}/{f}", host
    for package in shipped_packages():
        for path in sorted((ROOT / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                yield f"{site}/{path.relative_to(ROOT)}", path


def _site_packages() -> str:
    return sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})[
        "purelib"
    ]


def _shared_libraries(elves: list[Path]) -> set[Path]:
    """Every library the dynamic loader resolves for these ELF files (ldd), and itself."""
    libs: set[Path] = set()
    for chunk in range(0, len(elves), 200):
        out = subprocess.run(
            ["ldd", *map(str, elves[chunk : chunk + 200])],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        for line in out.splitlines():
            match = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
            # libraries a wheel carries (found through its $ORIGIN run path) come with it
            if match and "site-packages" not in match.group(1):
                libs.add(Path(match.group(1)))
    return libs


def _is_elf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"\x7fELF"


def build(path: Path, tag: str, programs: dict[str, str]) -> Path:
    """An OCI image archive tagged `tag`, with a script per program in /usr/local/bin
    (`{"tessera-scheduler": "scheduler_plugin.cli:main"}`), for `ctr images import`."""
    entries = dict(_files())
    elves = [host for host in entries.values() if host.suffix == ".so" or host.name == "python3.11"]
    elves = [e for e in elves if _is_elf(e)]
    for lib in _shared_libraries(elves):
        entries.setdefault(str(lib), lib.resolve())
    python = str(Path(sys.executable).resolve())
    scripts = {
        f"/usr/local/bin/{name}": SCRIPT.format(
            python=python, module=target.split(":")[0], func=target.split(":")[1]
        ).encode()
        for name, target in programs.items()
    }
    layer = path.with_name(path.name + ".layer")
    with tarfile.open(layer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()

        def parents(name: str) -> None:
            parts = name.strip("/").split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755  # the programs run as a non-root user
                    tar.addfile(info)

        for d in ("tmp", "etc", "proc", "sys", "dev", "var/run", "run"):
            parents(d + "/.")
        for name, host in sorted(entries.items()):
            parents(name)
            info = tarfile.TarInfo(name.strip("/"))
            info.size = host.stat().st_size
            info.mode = 0o755 if host.stat().st_mode & 0o111 else 0o644
            with host.open("rb") as f:
                tar.addfile(info, f)
        for name, data in scripts.items():
            parents(name)
            info = tarfile.TarInfo(name.strip("/"))
            info.size = len(data)
            info.mode = 0o755
            tar.addfile(info, io.BytesIO(data))
    digest = hashlib.sha256()
    with layer.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    layer_desc = {
        "mediaType": "application/vnd.oci.image.layer.v1.tar",
        "digest": f"sha256:{digest.hexdigest()}",
        "size": layer.stat().st_size,
    }
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Env": [
                    "PATH=/usr/local/bin:/usr/bin:/bin",
                    "PYTHONDONTWRITEBYTECODE=1",
                    "PYTHONUNBUFFERED=1",
                    "LANG=C.UTF-8",
                ],
            },
            "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
        }
    ).encode()
    oci_archive(path, tag, config, (layer_desc, layer))
    layer.unlink()
    return path
