"""`make hami-core`: HAMi-core's `libvgpu.so` as tessera ships it.

From a HAMi-core git directory or checkout (`--source`), for each of x86_64 and aarch64:
the pinned upstream commit is exported into a fresh build folder (its tree checked against
the pinned tree), tessera's patches (deploy/hami-core/patches, in order) are applied, and
the library is compiled with the options of HAMi-core's own build script: the interception
switched on (DLSYM_HOOK_ENABLE, MULTIPROCESS_LIMIT_ENABLE, HOOK_MEMINFO_ENABLE,
HOOK_NVML_ENABLE) and its Debug flags (`-g`, no optimisation, default visibility, so that
every hook is exported; the Release flags hide them and the library then limits nothing).
The compiler is Zig's C compiler, which links against the glibc of GLIBC_TARGET whatever
glibc this machine has; CUDA's and NVML's headers come from NVIDIA's PyPI packages (the
`hami` extra). Out: `<out>/<arch>/libvgpu.so` and its stamp `<out>/<arch>/libvgpu.json`
(docs/isolation.md, "HAMi-core").

    python -m tools.hami_core build --source DIR [--out build/hami-core] [--arch ARCH ...]
    python -m tools.hami_core show [--out build/hami-core]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection
from elftools.elf.sections import SymbolTableSection

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = "Project-HAMi/HAMi-core"
COMMIT = "8f3a89c67b037d8fdfe6c4cd4d8c4f0cd6504811"
"""The upstream commit tessera builds (2026-06-30)."""
TREE = "8c2b30b24576904936bc06c9c6efbafa83c10979"
"""That commit's tree: a source whose commit carries another tree is refused."""
PATCHES = ROOT / "deploy" / "hami-core" / "patches"
PATCH_LEVEL = 2
"""Raised whenever deploy/hami-core/patches changes (the stamp's `+tessera.N`)."""
GLIBC_TARGET = "2.17"
"""The glibc the library is linked against: CentOS 7's, the oldest aarch64 has. The
library is preloaded into workload containers, so it is the images' glibc that counts."""
ARCHES = {"x86_64": 62, "aarch64": 183}
"""Architecture -> ELF e_machine (EM_X86_64, EM_AARCH64)."""
ENABLED = (
    "DLSYM_HOOK_ENABLE",
    "MULTIPROCESS_LIMIT_ENABLE",
    "HOOK_MEMINFO_ENABLE",
    "HOOK_NVML_ENABLE",
)
"""The build switches HAMi-core's build.sh turns on; without them nothing is intercepted."""
COMPILE_FLAGS = ("-fPIC", "-g", "-O0", "-D_GNU_SOURCE", "-Wall", "-fno-sanitize=all")
"""CMake's Debug flags for the library (-g, no -O, no -fvisibility=hidden). Zig's C compiler
adds the undefined-behaviour sanitizer to unoptimised builds by default; HAMi-core's own
(gcc) build has none, hence -fno-sanitize=all."""
DRIVER_LIBRARIES = {"cuda": "libcuda.so.1", "nvidia-ml": "libnvidia-ml.so.1"}
"""What the library links against (-lcuda -lnvidia-ml), by soname: the driver's, present
in every container the NVIDIA runtime gives a GPU. Linked here against empty stand-ins
carrying those sonames, so the library names them as the upstream build does."""
HOOKS = ("cuLaunchKernel", "cuMemAlloc_v2", "nvmlDeviceGetMemoryInfo", "cuGraphLaunch", "dlsym")
"""Entry points a working library exports (a sample: the launch, allocation, NVML and
dlsym hooks)."""


class BuildError(Exception):
    """A build that cannot go on; its message is one line for the operator."""


@dataclass(frozen=True)
class Toolchain:
    zig: tuple[str, ...]
    cuda_include: Path


def toolchain() -> Toolchain:
    """Zig's C compiler and the CUDA/NVML headers, from the `hami` extra."""
    try:
        import ziglang  # noqa: F401
    except ImportError as exc:
        raise BuildError("ziglang is not installed (pip install -e '.[hami]')") from exc
    return Toolchain((sys.executable, "-m", "ziglang", "cc"), cuda_include())


def cuda_include() -> Path:
    """The include folder of NVIDIA's PyPI packages holding cuda.h and nvml.h."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        for folder in sorted(Path(base).glob("*/include")):
            if (folder / "cuda.h").is_file() and (folder / "nvml.h").is_file():
                return folder
    raise BuildError("no cuda.h and nvml.h from nvidia-cuda-runtime / nvidia-nvml-dev (.[hami])")


# --- the source ---------------------------------------------------------------------------


def _git(git_dir: Path, *args: str) -> bytes:
    done = subprocess.run(
        ["git", "--git-dir", str(git_dir), *args], capture_output=True, check=False, timeout=300
    )
    if done.returncode != 0:
        raise BuildError(f"git {' '.join(args)}: {done.stderr.decode().strip()[:300]}")
    return done.stdout


def git_dir(source: Path) -> Path:
    """The git directory of a checkout, or a bare git directory itself."""
    if not source.is_dir():
        raise BuildError(f"HAMI_CORE_SRC={source}: no such directory")
    done = subprocess.run(
        ["git", "-C", str(source), "rev-parse", "--absolute-git-dir"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if done.returncode != 0:
        raise BuildError(f"HAMI_CORE_SRC={source} is not a git directory or checkout")
    return Path(done.stdout.strip())


def export_source(source: Path, dest: Path) -> None:
    """The pinned commit's files into `dest` (emptied first), after checking its tree."""
    gd = git_dir(source)
    try:
        _git(gd, "cat-file", "-e", f"{COMMIT}^{{commit}}")
    except BuildError:
        raise BuildError(
            f"HAMI_CORE_SRC={source} does not hold {UPSTREAM} commit {COMMIT}"
        ) from None
    tree = _git(gd, "rev-parse", f"{COMMIT}^{{tree}}").decode().strip()
    if tree != TREE:
        raise BuildError(f"commit {COMMIT} in {source} has tree {tree}, not {TREE}")
    archive = _git(gd, "archive", "--format=tar", COMMIT)
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")


def apply_patches(tree: Path, patches: Sequence[Path]) -> None:
    """Each patch, in order, then checked as applied (it must now reverse cleanly). Git
    must not find a repository above `tree` (the build folder may sit in a checkout): in
    one, `git apply` would skip every path outside the current folder, silently."""
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tree.parent))
    for patch in patches:
        for check in ([], ["--reverse", "--check"]):
            done = subprocess.run(
                ["git", "apply", "--whitespace=nowarn", *check, str(patch)],
                cwd=tree,
                env=env,
                capture_output=True,
                text=True,
                check=False,
                timeout=60,
            )
            if done.returncode != 0:
                what = "is not applied" if check else "does not apply"
                raise BuildError(f"{patch.name} {what}: {done.stderr.strip()[:300]}")


def write_config(tree: Path, config: Path) -> None:
    """config/static_config.h as CMake's configure_file writes it for build.sh's options."""
    text = (tree / "src" / "static_config.h.in").read_text()
    text = re.sub(
        r"^#cmakedefine (\w+)$",
        lambda m: f"#define {m[1]}" if m[1] in ENABLED else f"/* #undef {m[1]} */",
        text,
        flags=re.M,
    )
    text = text.replace("@GIT_HASH@", COMMIT[:7]).replace("@GIT_BRANCH@", "tessera")
    config.mkdir(parents=True, exist_ok=True)
    (config / "static_config.h").write_text(text)


def library_sources(tree: Path) -> list[Path]:
    """The C files of libvgpu.so, as src/CMakeLists.txt and its object libraries list them."""
    objects: dict[str, list[Path]] = {}
    for cmake in (tree / "src").rglob("CMakeLists.txt"):
        for name, files in re.findall(r"add_library\((\w+) OBJECT ([^)]*)\)", cmake.read_text()):
            objects[name] = [cmake.parent / f for f in files.split()]
    top = (tree / "src" / "CMakeLists.txt").read_text()
    found = re.search(r"add_library\(\$\{LIBVGPU\} SHARED ([^)]*)\)", top)
    if found is None:
        raise BuildError("src/CMakeLists.txt no longer adds the vgpu library as expected")
    sources: list[Path] = []
    for word in found[1].split():
        target = re.fullmatch(r"\$<TARGET_OBJECTS:(\w+)>", word)
        sources += objects[target[1]] if target else [tree / "src" / word]
    return list(dict.fromkeys(sources))  # the cuda object library names hook.c twice


# --- compiling ----------------------------------------------------------------------------


def _run(command: Sequence[str], cwd: Path) -> None:
    done = subprocess.run(
        list(command), cwd=cwd, capture_output=True, text=True, check=False, timeout=900
    )
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-12:]
        raise BuildError(f"{command[-1]}: " + " | ".join(last))


def build_arch(tools: Toolchain, tree: Path, config: Path, work: Path, arch: str) -> Path:
    """Compile and link libvgpu.so for `arch` in `work`; returns the library's path."""
    cc = [*tools.zig, "-target", f"{arch}-linux-gnu.{GLIBC_TARGET}"]
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    includes = ["-I", str(tools.cuda_include), "-I", str(tree / "src"), "-I", str(config)]

    def compile_one(source: Path) -> Path:
        obj = work / (source.relative_to(tree).as_posix().replace("/", "_") + ".o")
        _run([*cc, "-c", *COMPILE_FLAGS, *includes, "-o", str(obj), str(source)], tree)
        return obj

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        objects = list(pool.map(compile_one, library_sources(tree)))
    stub = work / "stub.c"
    stub.write_text("void tessera_driver_stub(void) {}\n")
    for name, soname in DRIVER_LIBRARIES.items():
        out = work / f"lib{name}.so"
        _run([*cc, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(out), str(stub)], work)
    library = work / "libvgpu.so"
    link = [*cc, "-shared", "-fPIC", "-g", "-fno-sanitize=all", "-Wl,-soname,libvgpu.so"]
    link += [*map(str, objects), "-Wl,--no-as-needed", "-L", str(work)]
    link += [f"-l{name}" for name in DRIVER_LIBRARIES] + ["-lpthread", "-ldl"]
    _run([*link, "-o", str(library)], work)
    return library


# --- what was built -----------------------------------------------------------------------


def elf_machine(path: Path) -> int:
    """The ELF header's e_machine (62 x86_64, 183 aarch64); 0 for a file that is not ELF."""
    with path.open("rb") as f:
        head = f.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return 0
    return int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")


def glibc_needed(path: Path) -> str:
    """The highest GLIBC_x.y version the library's symbol references need ("" if none)."""
    versions: list[tuple[int, ...]] = []
    with path.open("rb") as f:
        for section in ELFFile(f).iter_sections():
            if isinstance(section, GNUVerNeedSection):
                for _, auxiliaries in section.iter_versions():
                    for aux in auxiliaries:
                        found = re.fullmatch(r"GLIBC_(\d+(?:\.\d+)+)", aux.name)
                        if found:
                            versions.append(tuple(int(p) for p in found[1].split(".")))
    return ".".join(map(str, max(versions))) if versions else ""


def exported_functions(path: Path) -> set[str]:
    """Functions the library defines in its dynamic symbol table."""
    with path.open("rb") as f:
        symbols = ELFFile(f).get_section_by_name(".dynsym")
        if not isinstance(symbols, SymbolTableSection):
            return set()
        return {
            s.name
            for s in symbols.iter_symbols()
            if s["st_info"]["type"] == "STT_FUNC" and s["st_shndx"] != "SHN_UNDEF"
        }


def needed_libraries(path: Path) -> list[str]:
    with path.open("rb") as f:
        dynamic = ELFFile(f).get_section_by_name(".dynamic")
        if not isinstance(dynamic, DynamicSection):
            return []
        return [str(t.needed) for t in dynamic.iter_tags("DT_NEEDED")]  # type: ignore[attr-defined]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stamp(library: Path, arch: str) -> dict[str, str]:
    """The version stamp written beside the library (docs/isolation.md)."""
    return {
        "layer": "hami-core",
        "upstream": UPSTREAM,
        "commit": COMMIT,
        "version": f"{COMMIT[:7]}+tessera.{PATCH_LEVEL}",
        "arch": arch,
        "glibc": glibc_needed(library),
        "sha256": sha256(library),
    }


def install(library: Path, out: Path, arch: str) -> dict[str, str]:
    """`<out>/<arch>/libvgpu.so`, then its stamp, each written beside and renamed in."""
    target = out / arch
    target.mkdir(parents=True, exist_ok=True)
    if elf_machine(library) != ARCHES[arch]:
        raise BuildError(f"{library} is not an {arch} ELF file")
    missing = [h for h in HOOKS if h not in exported_functions(library)]
    if missing:
        raise BuildError(f"{library} does not export {', '.join(missing)}")
    shutil.copyfile(library, target / "libvgpu.so.new")
    os.replace(target / "libvgpu.so.new", target / "libvgpu.so")
    stamped = stamp(target / "libvgpu.so", arch)
    (target / "libvgpu.json.new").write_text(json.dumps(stamped, indent=2) + "\n")
    os.replace(target / "libvgpu.json.new", target / "libvgpu.json")
    return stamped


def build(source: Path, out: Path, arches: Sequence[str]) -> list[dict[str, str]]:
    work = out / "work"
    upstream, patched = work / "upstream", work / "src"
    export_source(source, upstream)
    tools = toolchain()
    shutil.rmtree(patched, ignore_errors=True)
    shutil.copytree(upstream, patched)
    apply_patches(patched, sorted(PATCHES.glob("*.patch")))
    write_config(patched, work / "config")
    stamps = []
    for arch in arches:
        started = time.monotonic()
        library = build_arch(tools, patched, work / "config", work / arch, arch)
        stamped = install(library, out, arch)
        size = (out / arch / "libvgpu.so").stat().st_size
        print(
            f"hami-core: {out / arch / 'libvgpu.so'}: {arch}, {size:,} bytes, "
            f"glibc >= {stamped['glibc']}, {stamped['version']} "
            f"({time.monotonic() - started:.1f} s)",
            flush=True,
        )
        stamps.append(stamped)
    return stamps


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.hami_core", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build_cmd = sub.add_parser("build", help="build libvgpu.so for each architecture")
    build_cmd.add_argument("--source", required=True, type=Path, help="HAMi-core git dir")
    build_cmd.add_argument("--out", type=Path, default=ROOT / "build" / "hami-core")
    build_cmd.add_argument("--arch", action="append", choices=sorted(ARCHES))
    show = sub.add_parser("show", help="print the stamps of what was built")
    show.add_argument("--out", type=Path, default=ROOT / "build" / "hami-core")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build(args.source.resolve(), args.out.resolve(), args.arch or sorted(ARCHES))
        else:
            for arch in sorted(ARCHES):
                path = args.out / arch / "libvgpu.json"
                print(path.read_text().strip() if path.is_file() else f"{arch}: not built")
    except BuildError as exc:
        print(f"make hami-core: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
