"""RDMA NICs from sysfs (`/sys/class/infiniband`) and netlink (pyroute2).

What sysfs gives, per RDMA device (`<root>/class/infiniband/<ibdev>`):

- `device` links to the PCI function; its name is the bus ID; `device/physfn` exists on an
  SR-IOV virtual function (VFs are listed under their physical function, not on their own);
- `ports/<n>/state` reads like `4: ACTIVE`;
- `device/net/<netdev>` names the function's network interfaces;
- `device/virtfn<k>` links to the k-th VF's PCI function;
- `<root>/class/infiniband_verbs/uverbs<N>/ibdev` names the RDMA device whose user verbs
  device is `/dev/infiniband/uverbs<N>`; the inventory's `uverbsMinor` is that N.

Netlink adds what sysfs may lack inside a container: interfaces whose parent device is the
NIC's PCI function (IFLA_PARENT_DEV_NAME) and their operational state, and the VF table
(IFLA_VFINFO_LIST: VF number, MAC, link state). pyroute2 is imported only when a sysfs NIC
exists, because it costs about 20 MB of resident memory.

A NIC whose sysfs entry is broken is skipped with an InventoryError naming the file and the
field; the others, and the GPUs, are still served.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from deviceplugin.sysfs import Sysfs
from tessera.errors import InventoryError
from tessera.model import RdmaNic, RdmaVf, normalize_bus_id

log = logging.getLogger(__name__)

_UVERBS = re.compile(r"^uverbs(\d+)$")
_VIRTFN = re.compile(r"^virtfn(\d+)$")
_PORT_STATE = re.compile(r"^\s*\d+\s*:\s*([A-Z_]+)\s*$")


@dataclass(frozen=True)
class VfLink:
    vf: int
    mac: str = ""
    link_state: str = ""


@dataclass(frozen=True)
class LinkInfo:
    """One network interface as netlink reports it."""

    ifname: str
    operstate: str = ""
    parent_bus_id: str = ""
    """The PCI function the interface belongs to, when the kernel reports it (5.x+)."""
    vfs: tuple[VfLink, ...] = ()


class LinkSource(Protocol):
    def links(self) -> Iterable[LinkInfo]: ...


@dataclass
class NicDiscovery:
    nics: list[RdmaNic] = field(default_factory=list)
    errors: list[InventoryError] = field(default_factory=list)
    links: dict[str, LinkInfo] = field(default_factory=dict)
    """Netlink's view of the NICs' interfaces, by name (empty without netlink)."""


def _attr(msg: Any, name: str) -> Any:
    try:
        return msg.get_attr(name)
    except Exception:  # pyroute2 raises various errors for absent or odd attributes
        return None


def _vf_links(vfinfo: Any) -> tuple[VfLink, ...]:
    out: list[VfLink] = []
    if vfinfo is None:
        return ()
    try:
        infos = vfinfo.get_attrs("IFLA_VF_INFO")
    except Exception:
        return ()
    for info in infos:
        mac_attr = _attr(info, "IFLA_VF_MAC") or {}
        state_attr = _attr(info, "IFLA_VF_LINK_STATE") or {}
        vf = mac_attr.get("vf", state_attr.get("vf"))
        if vf is None:
            continue
        state = state_attr.get("link_state")
        names = {0: "auto", 1: "enable", 2: "disable"}
        out.append(
            VfLink(
                vf=int(vf),
                mac=str(mac_attr.get("mac", "")),
                link_state=names.get(state, "") if isinstance(state, int) else "",
            )
        )
    return tuple(out)


def link_info_from_message(msg: Any) -> LinkInfo | None:
    """A LinkInfo from one pyroute2 RTM_NEWLINK message (None without a name)."""
    name = _attr(msg, "IFLA_IFNAME")
    if not name:
        return None
    parent = _attr(msg, "IFLA_PARENT_DEV_NAME") or ""
    bus = _attr(msg, "IFLA_PARENT_DEV_BUS_NAME") or ""
    parent_bus_id = ""
    if parent and bus == "pci":
        try:
            parent_bus_id = normalize_bus_id(str(parent))
        except ValueError:
            parent_bus_id = ""
    return LinkInfo(
        ifname=str(name),
        operstate=str(_attr(msg, "IFLA_OPERSTATE") or ""),
        parent_bus_id=parent_bus_id,
        vfs=_vf_links(_attr(msg, "IFLA_VFINFO_LIST")),
    )


class Pyroute2Links:
    """Netlink link dump through pyroute2 (RTM_GETLINK with the VF table)."""

    RTEXT_FILTER_VF = 1

    def links(self) -> list[LinkInfo]:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            messages = ipr.link("dump", ext_mask=self.RTEXT_FILTER_VF)
        return [info for info in map(link_info_from_message, messages) if info is not None]


def parse_port_state(text: str) -> str | None:
    """`4: ACTIVE` -> `ACTIVE`; None when the text has another shape."""
    m = _PORT_STATE.match(text)
    return m.group(1) if m else None


class SysfsRdma:
    """Discovers RDMA NICs under a sysfs root and re-reads their port states."""

    def __init__(
        self,
        sysfs: Sysfs,
        links: LinkSource | None = None,
        link_source_factory: Callable[[], LinkSource] | None = Pyroute2Links,
    ) -> None:
        """`links`: a netlink source to use; else one is made by `link_source_factory` (pass
        None to go without netlink) the first time a NIC is found."""
        self.sysfs = sysfs
        self._links = links
        self._factory = link_source_factory

    @property
    def class_dir(self) -> Path:
        return self.sysfs.root / "class" / "infiniband"

    def _ibdev_dir(self, ibdev: str) -> Path:
        return self.class_dir / ibdev

    def _uverbs_map(self) -> dict[str, int]:
        """ibdev name -> N of /dev/infiniband/uverbsN."""
        out: dict[str, int] = {}
        verbs = self.sysfs.root / "class" / "infiniband_verbs"
        if not verbs.is_dir():
            return out
        for entry in sorted(verbs.iterdir()):
            m = _UVERBS.match(entry.name)
            if not m:
                continue
            try:
                ibdev = (entry / "ibdev").read_text().strip()
            except OSError:
                continue
            if ibdev:
                out[ibdev] = int(m.group(1))
        return out

    def _uverbs_of(self, ibdev: str, pci_dir: Path, uverbs: Mapping[str, int]) -> int:
        if ibdev in uverbs:
            return uverbs[ibdev]
        local = pci_dir / "infiniband_verbs"
        found = sorted(
            int(m.group(1))
            for m in (_UVERBS.match(p.name) for p in _listdir(local))
            if m is not None
        )
        if len(found) == 1:
            return found[0]
        raise InventoryError(
            str(self.sysfs.root / "class" / "infiniband_verbs"),
            "uverbs",
            f"no uverbs device names {ibdev}",
        )

    def port_states(self, ibdev: str) -> tuple[str, ...]:
        """Every port's state, in port order; raises InventoryError when unreadable."""
        ports = self._ibdev_dir(ibdev) / "ports"
        numbers = sorted(int(p.name) for p in _listdir(ports) if p.name.isdigit())
        if not numbers:
            raise InventoryError(str(ports), "ports", "no ports")
        states = []
        for n in numbers:
            path = ports / str(n) / "state"
            text = self.sysfs.read_text(path, "state")
            state = parse_port_state(text)
            if state is None:
                raise InventoryError(str(path), "state", f"want '<n>: <STATE>', got {text!r}")
            states.append(state)
        return tuple(states)

    def _pci_dir(self, ibdev: str) -> Path:
        link = self._ibdev_dir(ibdev) / "device"
        if not link.exists():
            raise InventoryError(str(link), "device", "missing (no PCI function)")
        return Path(os.path.realpath(link))

    @staticmethod
    def _bus_id(pci_dir: Path, where: Path) -> str:
        try:
            return normalize_bus_id(pci_dir.name)
        except ValueError:
            raise InventoryError(
                str(where), "device", f"does not point at a PCI function: {pci_dir}"
            ) from None

    @staticmethod
    def _netdev(pci_dir: Path) -> str:
        names = sorted(p.name for p in _listdir(pci_dir / "net"))
        return names[0] if names else ""

    def _vfs(
        self, pf_dir: Path, uverbs: Mapping[str, int], errors: list[InventoryError]
    ) -> list[RdmaVf]:
        vfs: list[RdmaVf] = []
        numbered = sorted(
            (int(m.group(1)), p)
            for p in _listdir(pf_dir)
            if (m := _VIRTFN.match(p.name)) is not None
        )
        for _, link in numbered:
            vf_dir = Path(os.path.realpath(link))
            try:
                bus = self._bus_id(vf_dir, link)
                ibdevs = sorted(p.name for p in _listdir(vf_dir / "infiniband"))
                if not ibdevs:
                    log.debug("VF %s has no RDMA device (driver not bound); skipped", bus)
                    continue
                vfs.append(
                    RdmaVf(
                        pci_bus_id=bus,
                        ibdev=ibdevs[0],
                        uverbs_minor=self._uverbs_of(ibdevs[0], vf_dir, uverbs),
                        netdev=self._netdev(vf_dir),
                    )
                )
            except InventoryError as exc:
                errors.append(exc)
        return vfs

    def _links_by_parent(self) -> dict[str, list[LinkInfo]]:
        if self._links is None and self._factory is not None:
            try:
                self._links = self._factory()
            except Exception as exc:  # netlink is optional: sysfs alone still works
                log.warning("netlink unavailable, using sysfs only: %s", exc)
                self._factory = None
        if self._links is None:
            return {}
        try:
            infos = list(self._links.links())
        except Exception as exc:
            log.warning("netlink link dump failed, using sysfs only: %s", exc)
            return {}
        by_parent: dict[str, list[LinkInfo]] = {}
        for info in infos:
            if info.parent_bus_id:
                by_parent.setdefault(info.parent_bus_id, []).append(info)
        return by_parent

    def discover_nics(self) -> tuple[list[RdmaNic], list[InventoryError]]:
        """The NicSource view of `discover()`."""
        found = self.discover()
        return found.nics, found.errors

    def discover(self) -> NicDiscovery:
        """Every RDMA NIC (physical function) with its VFs; broken entries become errors."""
        result = NicDiscovery()
        names = sorted(p.name for p in _listdir(self.class_dir))
        if not names:
            return result
        uverbs = self._uverbs_map()
        by_parent = self._links_by_parent()
        for ibdev in names:
            try:
                pci_dir = self._pci_dir(ibdev)
                if (pci_dir / "physfn").exists():
                    continue  # a VF: listed under its physical function
                bus = self._bus_id(pci_dir, self._ibdev_dir(ibdev) / "device")
                location = self.sysfs.pci_location(bus)
                netdev = self._netdev(pci_dir)
                links = by_parent.get(bus, [])
                if not netdev and links:
                    netdev = sorted(link.ifname for link in links)[0]
                for link in links:
                    result.links[link.ifname] = link
                nic = RdmaNic(
                    ibdev=ibdev,
                    pci_bus_id=bus,
                    uverbs_minor=self._uverbs_of(ibdev, pci_dir, uverbs),
                    netdev=netdev,
                    port_states=self.port_states(ibdev),
                    vfs=tuple(self._vfs(pci_dir, uverbs, result.errors)),
                ).placed(location)
            except InventoryError as exc:
                result.errors.append(exc)
                continue
            result.nics.append(nic)
        return result


def _listdir(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError:
        return []


def port_health(states: tuple[str, ...]) -> tuple[bool, str]:
    """A NIC is healthy when it has ports and every one is ACTIVE."""
    if not states:
        return False, "no ports"
    bad = [f"port {i + 1} {s}" for i, s in enumerate(states) if s != "ACTIVE"]
    return (not bad), ", ".join(bad)
