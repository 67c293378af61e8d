"""Wire bytes captured from real kube-scheduler, kubelet and containerd (see README.md).

Tests reach them through `require`, which fails (never skips) when a folder is missing:
every clone carries them, so their absence is a broken checkout, not an optional extra.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent
EXTENDER = ROOT / "extender"
DEVICEPLUGIN = ROOT / "deviceplugin"
NRI_WIRE = ROOT / "nri-wire"


class MissingVectorsError(AssertionError):
    """A captured-vector folder is absent: the checkout is incomplete."""


def require(folder: Path) -> Path:
    """`folder`, or a test failure naming it when it is not there."""
    if not folder.is_dir() or not any(folder.iterdir()):
        raise MissingVectorsError(
            f"captured vectors missing at {folder} (see tests/vectors/README.md)"
        )
    return folder
