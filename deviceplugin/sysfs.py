"""Where a PCI device sits: NUMA node, PCIe root complex and nearest PCIe switch, from sysfs.

`/sys/bus/pci/devices/<bus id>` is a link into `/sys/devices/`, and the resolved path is the
device's PCIe ancestry, e.g.

    /sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0
                 root complex  root port  switch up     switch down  the GPU

The root complex is the `pciDDDD:BB` component. The nearest switch is identified by its
upstream port: the closest ancestor whose PCIe capability says "upstream switch port" (read
from the `config` file; the first 64 bytes are world-readable, the capability list usually
needs root). When no ancestor's capability can be read, the shape of the path decides: after
the root port, switch ports come in upstream/downstream pairs, so with at least a root port
and one pair above the device, the grandparent is the nearest switch's upstream port.

The sysfs root is configurable so tests build fake trees in temporary directories. Every
problem is an InventoryError naming the file and the field.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tessera.errors import InventoryError
from tessera.model import PciDevice, normalize_bus_id

_ROOT_COMPLEX = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")
_BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")

PCIE_CAP_ID = 0x10
PORT_TYPE_ROOT = 0x4
PORT_TYPE_UPSTREAM = 0x5
PORT_TYPE_DOWNSTREAM = 0x6


def pcie_port_type(config: bytes) -> int | None:
    """The device/port type field of the PCI Express capability, or None if not readable."""
    if len(config) < 0x40:
        return None
    status = config[0x06] | (config[0x07] << 8)
    if not status & 0x10:  # no capability list
        return None
    pointer = config[0x34] & 0xFC
    for _ in range(48):  # the list cannot be longer; guards against loops
        if pointer < 0x40 or pointer + 4 > len(config):
            return None
        cap_id, following = config[pointer], config[pointer + 1] & 0xFC
        if cap_id == PCIE_CAP_ID:
            flags = config[pointer + 2] | (config[pointer + 3] << 8)
            return (flags >> 4) & 0xF
        pointer = following
    return None


class Sysfs:
    """Reads under a sysfs root (default /sys)."""

    def __init__(self, root: str | Path = "/sys") -> None:
        self.root = Path(root)

    def pci_device_dir(self, bus_id: str) -> Path:
        return self.root / "bus" / "pci" / "devices" / bus_id

    def read_text(self, path: Path, field: str) -> str:
        try:
            return path.read_text().strip()
        except OSError as exc:
            raise InventoryError(str(path), field, f"cannot read: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise InventoryError(str(path), field, "not text") from None

    def read_int(self, path: Path, field: str, base: int = 10) -> int:
        text = self.read_text(path, field)
        try:
            return int(text, base)
        except ValueError:
            raise InventoryError(str(path), field, f"not an integer: {text!r}") from None

    def numa_node(self, device_dir: Path) -> int:
        """The `numa_node` of a PCI device directory; -1 when the platform has none."""
        path = device_dir / "numa_node"
        if not path.exists():
            return -1
        value = self.read_int(path, "numa_node")
        if value < -1:
            raise InventoryError(str(path), "numa_node", f"out of range: {value}")
        return value

    def _port_type(self, device_dir: Path) -> int | None:
        try:
            return pcie_port_type((device_dir / "config").read_bytes())
        except OSError:
            return None

    def pci_location(self, bus_id: str) -> PciDevice:
        """NUMA node, root complex and nearest switch of the PCI device `bus_id`."""
        try:
            bdf = normalize_bus_id(bus_id)
        except ValueError as exc:
            raise InventoryError(str(self.pci_device_dir(bus_id)), "pciBusId", str(exc)) from None
        link = self.pci_device_dir(bdf)
        if not link.exists():
            raise InventoryError(str(link), "pciBusId", f"no PCI device {bdf} in sysfs")
        real = Path(os.path.realpath(link))
        parts = real.parts
        roots = [i for i, p in enumerate(parts) if _ROOT_COMPLEX.match(p)]
        if not roots:
            raise InventoryError(
                str(link), "pcieRoot", f"resolved path {real} has no pciDDDD:BB component"
            )
        root_at = roots[-1]
        chain = [i for i in range(root_at + 1, len(parts)) if _BDF.match(parts[i])]
        if not chain or chain[-1] != len(parts) - 1 or normalize_bus_id(parts[-1]) != bdf:
            raise InventoryError(
                str(link), "pciBusId", f"resolved path {real} does not end in device {bdf}"
            )
        # the ancestors' directories, nearest first
        dirs = [Path(*parts[: i + 1]) for i in reversed(chain[:-1])]
        switch = ""
        types = [self._port_type(d) for d in dirs]
        if any(t is not None for t in types):
            for d, t in zip(dirs, types, strict=True):
                if t == PORT_TYPE_UPSTREAM:
                    switch = normalize_bus_id(d.name)
                    break
        elif len(dirs) >= 3:
            switch = normalize_bus_id(dirs[1].name)
        return PciDevice(
            pci_bus_id=bdf,
            numa_node=self.numa_node(real),
            pcie_root=parts[root_at],
            pcie_switch=switch,
        )
