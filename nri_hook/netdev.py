"""Moving allocated RDMA VF network devices into a pod's network namespace and back.

When a sandbox starts, each VF netdev named in the pod's record is moved (and optionally
renamed) into the pod's network namespace in one netlink request. When the sandbox stops
(containerd notifies plugins before it deletes the namespace) it is moved back under its
host name. When the sandbox is removed we make sure it is back: if the namespace is gone
the kernel has already returned a physical device to the host namespace, possibly still
under its pod name, and we rename it.

The netlink socket for a pod's namespace is created by a helper thread that enters the
namespace with setns(2) (network namespaces are per thread), so the process never
forks and never leaves the host namespace. Everything here blocks; the plugin runs it in a
worker thread.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import socket
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyroute2 import IPRoute

from tessera.allocation import PodAllocation
from tessera.errors import TesseraError

log = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
NETLINK_ROUTE = 0
IFNAMSIZ = 16


class NetdevError(TesseraError):
    """A VF could not be moved; says which and why."""


@dataclass(frozen=True, slots=True)
class NetdevMove:
    host_name: str
    """The VF's name in the host namespace (from the record)."""
    pod_name: str
    """Its name inside the pod."""
    pci_bus_id: str


def plan_moves(alloc: PodAllocation, rename_prefix: str = "") -> list[NetdevMove]:
    """The VF netdevs of a pod, in record order, each once (init containers that reuse an
    app container's devices repeat its grants). With a prefix they are renamed
    <prefix>0, <prefix>1, ... inside the pod; otherwise they keep their host name."""
    moves: list[NetdevMove] = []
    seen: set[str] = set()
    for container in alloc.containers:
        for grant in container.rdma:
            for vf in grant.vfs:
                if not vf.netdev or vf.pci_bus_id in seen:
                    continue
                seen.add(vf.pci_bus_id)
                name = f"{rename_prefix}{len(moves)}" if rename_prefix else vf.netdev
                moves.append(NetdevMove(vf.netdev, name, vf.pci_bus_id))
    for move in moves:
        if len(move.pod_name) >= IFNAMSIZ:
            raise NetdevError(f"interface name {move.pod_name!r} is longer than 15 characters")
    return moves


def network_namespace(namespaces: Iterable[tuple[str, str]]) -> str | None:
    """The network namespace path among a sandbox's (type, path) namespaces; None when the
    pod shares the host's network (hostNetwork)."""
    for kind, path in namespaces:
        if kind in ("network", "net") and path:
            return path
    return None


_LIBC = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _LIBC.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def _netlink_socket_in(netns_path: str) -> socket.socket:
    """A NETLINK_ROUTE socket bound to the namespace at `netns_path`."""
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            target = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            result["error"] = exc
            return
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(target)
            try:
                result["sock"] = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_ROUTE)
            finally:
                _setns(home)
        except OSError as exc:
            result["error"] = exc
        finally:
            os.close(target)
            os.close(home)

    thread = threading.Thread(target=work, name="netns-socket")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    sock: socket.socket = result["sock"]
    return sock


@contextmanager
def _ipr(netns_path: str | None = None) -> Iterator[IPRoute]:
    if netns_path is None:
        ipr = IPRoute()
    else:
        ipr = IPRoute(fileno=_netlink_socket_in(netns_path).detach())
    try:
        yield ipr
    finally:
        ipr.close()


def _index(ipr: IPRoute, name: str) -> int | None:
    found = ipr.link_lookup(ifname=name)
    return int(found[0]) if found else None


class NetdevMover:
    """Moves netdevs between the host namespace and pod namespaces (blocking calls)."""

    def __init__(self, sysfs_root: str = "/") -> None:
        self._sysfs_net = os.path.join(sysfs_root, "sys/class/net")
        self._lock = threading.Lock()

    def move_in(self, netns_path: str, moves: list[NetdevMove]) -> None:
        """Move every VF into the namespace (renamed as planned). Already there: fine.
        On failure the ones moved so far are moved back and NetdevError is raised."""
        with self._lock:
            done: list[NetdevMove] = []
            try:
                netns_fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise NetdevError(
                    f"cannot open the pod network namespace {netns_path}: {exc.strerror}"
                ) from None
            try:
                with _ipr() as host, _ipr(netns_path) as pod:
                    for move in moves:
                        if _index(pod, move.pod_name) is not None:
                            continue
                        index = _index(host, move.host_name)
                        if index is None:
                            raise NetdevError(
                                f"VF netdev {move.host_name} ({move.pci_bus_id}) is not in "
                                "the host network namespace"
                            )
                        try:
                            host.link("set", index=index, net_ns_fd=netns_fd, ifname=move.pod_name)
                        except Exception as exc:  # pyroute2 raises NetlinkError and others
                            raise NetdevError(
                                f"cannot move VF netdev {move.host_name} ({move.pci_bus_id}) "
                                f"into {netns_path} as {move.pod_name}: {exc}"
                            ) from None
                        done.append(move)
            except NetdevError:
                if done:
                    self._move_out_locked(netns_path, done)
                raise
            finally:
                os.close(netns_fd)

    def move_out(self, netns_path: str | None, moves: list[NetdevMove]) -> list[str]:
        """Bring every VF back into the host namespace under its host name. Returns the
        problems found (empty when all are back)."""
        with self._lock:
            return self._move_out_locked(netns_path, moves)

    def _move_out_locked(self, netns_path: str | None, moves: list[NetdevMove]) -> list[str]:
        problems: list[str] = []
        pending = list(moves)
        if netns_path is not None and os.path.exists(netns_path):
            try:
                pending = self._from_namespace(netns_path, pending, problems)
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.EINVAL):
                    problems.append(f"cannot enter {netns_path}: {exc.strerror}")
        if pending:
            self._settle_in_host(pending, problems)
        return problems

    def _from_namespace(
        self, netns_path: str, moves: list[NetdevMove], problems: list[str]
    ) -> list[NetdevMove]:
        """Move back the VFs still in the pod namespace; return the others."""
        left: list[NetdevMove] = []
        host_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            with _ipr(netns_path) as pod:
                for move in moves:
                    index = _index(pod, move.pod_name)
                    if index is None:
                        left.append(move)
                        continue
                    try:
                        pod.link("set", index=index, state="down")
                        pod.link("set", index=index, net_ns_fd=host_fd, ifname=move.host_name)
                    except Exception as exc:
                        problems.append(
                            f"cannot move VF netdev {move.pod_name} ({move.pci_bus_id}) back "
                            f"from {netns_path} as {move.host_name}: {exc}"
                        )
        finally:
            os.close(host_fd)
        return left

    def _settle_in_host(self, moves: list[NetdevMove], problems: list[str]) -> None:
        """VFs not in the pod namespace: already back under their name, or returned by the
        kernel under their pod name (rename them), or nowhere to be found."""
        with _ipr() as host:
            for move in moves:
                if _index(host, move.host_name) is not None:
                    continue
                index = _index(host, move.pod_name)
                if index is None:
                    index = self._index_by_bus(host, move.pci_bus_id)
                if index is None:
                    problems.append(
                        f"VF netdev {move.host_name} ({move.pci_bus_id}) is neither in the pod "
                        "namespace nor in the host namespace"
                    )
                    continue
                try:
                    host.link("set", index=index, state="down")
                    host.link("set", index=index, ifname=move.host_name)
                except Exception as exc:
                    problems.append(
                        f"cannot rename VF netdev ({move.pci_bus_id}) back to {move.host_name}: "
                        f"{exc}"
                    )

    def _index_by_bus(self, host: IPRoute, pci_bus_id: str) -> int | None:
        try:
            names = os.listdir(self._sysfs_net)
        except OSError:
            return None
        for name in names:
            try:
                device = os.path.realpath(os.path.join(self._sysfs_net, name, "device"))
            except OSError:
                continue
            if os.path.basename(device) == pci_bus_id:
                return _index(host, name)
        return None
