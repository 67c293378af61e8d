"""The image holds every package its programs import: a package the Dockerfile does not COPY
is silently left out of `pip install .`, and the program fails only when it starts."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ("deviceplugin", "scheduler_plugin", "nri_hook")
"""The three programs the image runs (the manifests pick one)."""


def _local_imports(package: str) -> set[str]:
    """Top-level packages of this repository that `package`'s modules import."""
    found: set[str] = set()
    for module in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if (ROOT / top / "__init__.py").is_file():
                    found.add(top)
    return found


def test_the_image_copies_every_package_its_programs_import() -> None:
    copied = set(re.findall(r"^COPY (\w+) ", (ROOT / "deploy" / "Dockerfile").read_text(), re.M))
    needed: set[str] = set()
    todo = list(PROGRAMS)
    while todo:
        package = todo.pop()
        if package not in needed:
            needed.add(package)
            todo += sorted(_local_imports(package))
    assert needed - copied == set()


def test_the_image_copies_every_package_pip_installs() -> None:
    """Also the packages no program imports (kubectl_tessera, the testbed): their console
    scripts are installed too, and would fail in the image."""
    from tests.e2e.image import shipped_packages

    copied = set(re.findall(r"^COPY (\w+) ", (ROOT / "deploy" / "Dockerfile").read_text(), re.M))
    assert set(shipped_packages()) - copied == set()


def test_the_base_image_names_its_python_and_debian_release() -> None:
    """The image's Python is the minor version the suite tests (its end-to-end image is
    made from the Python running it), and its Debian release is named: a floating `slim`
    tag moves to the next release, and its OpenSSL, which sets what each TLS handshake
    with kube-scheduler costs, without a change here."""
    bases = re.findall(r"^FROM (\S+)", (ROOT / "deploy" / "Dockerfile").read_text(), re.M)
    assert len(bases) == 1
    found = re.fullmatch(r"python:(\d+)\.(\d+)-slim-([a-z]+)", bases[0])
    assert found is not None, bases[0]
    assert (int(found[1]), int(found[2])) == sys.version_info[:2]
    assert found[3] not in ("bookworm", "bullseye", "buster")  # OpenSSL 3.0 or older


# --- HAMi-core's library -------------------------------------------------------------------

HAMI_CORE_RUN = re.compile(
    r"^RUN --mount=type=bind,source=build/hami-core,target=(\S+) (.*?)\n(?!\s)", re.M | re.S
)


def _hami_core_step() -> tuple[str, str]:
    """The Dockerfile's step that installs HAMi-core's library: its bind-mount target and its
    shell script (continuation lines joined as the builder joins them)."""
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    found = HAMI_CORE_RUN.search(text)
    assert found is not None, "no RUN step bind-mounting build/hami-core"
    return found[1], found[2].replace("\\\n", "")


def _run_step(
    tmp_path: Path, targetarch: str, built: tuple[str, ...]
) -> subprocess.CompletedProcess[str]:
    """The step's script with its absolute paths moved under tmp_path, as BuildKit would run
    it with TARGETARCH set and make hami-core's output for `built` bind-mounted."""
    mount, script = _hami_core_step()
    context, image = tmp_path / "context", tmp_path / "image"
    for arch in built:
        (context / arch).mkdir(parents=True)
        (context / arch / "libvgpu.so").write_text(f"{arch} library")
        (context / arch / "libvgpu.json").write_text(json.dumps({"arch": arch}))
    script = script.replace(mount, str(context)).replace("/opt/tessera", str(image / "opt/tessera"))
    return subprocess.run(
        ["sh", "-c", script],
        env={"PATH": "/usr/bin:/bin", "TARGETARCH": targetarch},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.mark.parametrize(("targetarch", "arch"), [("amd64", "x86_64"), ("arm64", "aarch64")])
def test_the_image_carries_the_hami_core_library_of_its_own_architecture(
    tmp_path: Path, targetarch: str, arch: str
) -> None:
    done = _run_step(tmp_path, targetarch, ("x86_64", "aarch64"))
    assert done.returncode == 0, done.stderr
    installed = tmp_path / "image" / "opt" / "tessera" / "hami-core"
    assert sorted(p.name for p in installed.iterdir()) == ["libvgpu.json", "libvgpu.so"]
    assert (installed / "libvgpu.so").read_text() == f"{arch} library"
    assert json.loads((installed / "libvgpu.json").read_text()) == {"arch": arch}
    assert (installed / "libvgpu.so").stat().st_mode & 0o777 == 0o644


def test_an_image_without_the_library_built_stops_with_one_line(tmp_path: Path) -> None:
    done = _run_step(tmp_path, "arm64", ("x86_64",))
    assert done.returncode == 1
    assert done.stderr == (
        "no build/hami-core/aarch64/libvgpu.so and libvgpu.json: run make hami-core first\n"
    )
    unknown = _run_step(tmp_path / "other", "riscv64", ("x86_64", "aarch64"))
    assert (unknown.returncode, unknown.stderr) == (
        1,
        "no HAMi-core library for architecture 'riscv64'\n",
    )


def test_the_architecture_comes_from_the_builder() -> None:
    """TARGETARCH is declared before the step, and the step is the image's own (after the
    single FROM), so `docker build --platform linux/arm64` gets the aarch64 library."""
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    step = text.index("RUN --mount=type=bind,source=build/hami-core")
    assert text.index("ARG TARGETARCH") < step
    assert text.index("FROM ") < text.index("ARG TARGETARCH")
