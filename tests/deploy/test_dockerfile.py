"""The image holds every package its programs import: a package the Dockerfile does not COPY
is silently left out of `pip install .`, and the program fails only when it starts."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

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
