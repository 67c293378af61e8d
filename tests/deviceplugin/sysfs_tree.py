"""Builds fake sysfs trees in a temporary directory, shaped like the real one: devices under
`devices/pciDDDD:BB/...`, links from `bus/pci/devices`, `class/infiniband` and
`class/infiniband_verbs`."""

from __future__ import annotations

import os
from pathlib import Path

from deviceplugin.sysfs import PCIE_CAP_ID


def pcie_config(port_type: int) -> bytes:
    """256 bytes of config space: a power-management capability, then PCI Express."""
    config = bytearray(256)
    config[0x06] = 0x10  # status: capability list present
    config[0x34] = 0x40
    config[0x40], config[0x41] = 0x01, 0x50  # PM capability, next at 0x50
    config[0x50], config[0x51] = PCIE_CAP_ID, 0x00
    flags = (port_type << 4) | 0x2
    config[0x52], config[0x53] = flags & 0xFF, flags >> 8
    return bytes(config)


class SysfsTree:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _link(self, link: Path, target: Path) -> None:
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            os.symlink(os.path.relpath(target, link.parent), link)

    def add_pci(
        self,
        chain: list[str],
        root_complex: str = "pci0000:15",
        numa: int | str | None = 0,
        port_types: dict[str, int] | None = None,
    ) -> Path:
        """Create the functions in `chain` (root port first, the device last); the device dir."""
        path = self.root / "devices" / root_complex
        for bdf in chain:
            path = path / bdf
            path.mkdir(parents=True, exist_ok=True)
            self._link(self.root / "bus" / "pci" / "devices" / bdf, path)
            if numa is not None and not (path / "numa_node").exists():
                (path / "numa_node").write_text(f"{numa}\n")
            if port_types and bdf in port_types:
                (path / "config").write_bytes(pcie_config(port_types[bdf]))
        return path

    def add_ib(
        self,
        ibdev: str,
        pci_dir: Path,
        ports: list[str] | None = None,
        uverbs: int | None = None,
        netdevs: list[str] | None = None,
    ) -> Path:
        dev = pci_dir / "infiniband" / ibdev
        dev.mkdir(parents=True)
        self._link(dev / "device", pci_dir)
        for n, state in enumerate(["4: ACTIVE"] if ports is None else ports, start=1):
            (dev / "ports" / str(n)).mkdir(parents=True)
            (dev / "ports" / str(n) / "state").write_text(state + "\n")
        self._link(self.root / "class" / "infiniband" / ibdev, dev)
        if uverbs is not None:
            verbs = pci_dir / "infiniband_verbs" / f"uverbs{uverbs}"
            verbs.mkdir(parents=True)
            (verbs / "ibdev").write_text(ibdev + "\n")
            self._link(self.root / "class" / "infiniband_verbs" / f"uverbs{uverbs}", verbs)
        for name in netdevs or []:
            (pci_dir / "net" / name).mkdir(parents=True)
        return dev

    def add_vf(self, pf_dir: Path, k: int, vf_dir: Path) -> None:
        self._link(pf_dir / f"virtfn{k}", vf_dir)
        self._link(vf_dir / "physfn", pf_dir)
