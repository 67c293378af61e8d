"""Generated files are ignored and untracked, never both tracked and ignored.

A file that is tracked and matched by .gitignore goes stale silently: edits to it still
show, regenerating it churns the history, and a fresh clone disagrees with a built one.
Skipped outside a git checkout (an unpacked source archive has no index to check).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# what `make protos`, `pip install -e .` and the tools write into a checkout
GENERATED = [
    "protos/kubelet/deviceplugin/v1beta1/api_pb2.py",
    "protos/kubelet/deviceplugin/v1beta1/api_pb2.pyi",
    "protos/kubelet/deviceplugin/v1beta1/api_pb2_grpc.py",
    "protos/nri/api_pb2.py",
    "protos/ttrpc/ttrpc_pb2.pyi",
    "protos/.stubs-stamp",
    "tessera.egg-info/PKG-INFO",
    ".venv",  # the virtualenv, or a link to one
    "build/lib/tessera/__init__.py",
    "tessera/__pycache__/model.cpython-311.pyc",
    ".mypy_cache/3.11/cache.db",
    ".hypothesis/examples/x",
]


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False, timeout=60
    )


@pytest.fixture(scope="module", autouse=True)
def _checkout() -> None:
    if shutil.which("git") is None or _git("rev-parse", "--is-inside-work-tree").returncode:
        pytest.skip("not a git checkout")


def test_no_tracked_file_is_ignored() -> None:
    listed = _git("ls-files", "--ignored", "--cached", "--exclude-standard")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == []


@pytest.mark.parametrize("path", GENERATED)
def test_each_generated_file_is_ignored_and_untracked(path: str) -> None:
    assert _git("check-ignore", "--quiet", "--no-index", path).returncode == 0, path
    assert _git("ls-files", "--error-unmatch", path).returncode != 0, f"{path} is tracked"
