"""Real network namespaces and veth interfaces standing in for RDMA VFs (root only)."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

_counter = itertools.count()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=10)


def links(netns: str | None = None) -> set[str]:
    """Interface names in the host namespace, or in the named namespace."""
    prefix = ["-n", netns] if netns else []
    out = _ip(*prefix, "-o", "link", "show").stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}


def require_netns() -> None:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("the ip command is not installed")


@dataclass
class NetLab:
    """Namespaces and fake VFs created for one test, all removed afterwards."""

    tag: str
    namespaces: list[str] = field(default_factory=list)
    vfs: list[str] = field(default_factory=list)

    def namespace(self) -> str:
        name = f"tsr-{self.tag}-{len(self.namespaces)}"
        result = _ip("netns", "add", name, check=False)
        if result.returncode != 0:
            pytest.skip(f"cannot create a network namespace: {result.stderr.strip()}")
        self.namespaces.append(name)
        return name

    def vf(self) -> str:
        """A host interface standing in for a VF netdev (a veth end; dummy when veth is
        unavailable)."""
        name = f"tv{self.tag}{len(self.vfs)}"
        peer = f"tp{self.tag}{len(self.vfs)}"
        result = _ip("link", "add", name, "type", "veth", "peer", "name", peer, check=False)
        if result.returncode != 0:
            result = _ip("link", "add", name, "type", "dummy", check=False)
            if result.returncode != 0:
                pytest.skip(f"the kernel refuses veth and dummy links: {result.stderr.strip()}")
        self.vfs.append(name)
        return name

    @staticmethod
    def path(namespace: str) -> str:
        return f"/run/netns/{namespace}"

    def remove_namespace(self, namespace: str) -> None:
        _ip("netns", "del", namespace, check=False)

    def cleanup(self) -> None:
        for namespace in self.namespaces:
            _ip("netns", "del", namespace, check=False)
        for vf in self.vfs:
            _ip("link", "del", vf, check=False)


@contextmanager
def netlab() -> Iterator[NetLab]:
    require_netns()
    lab = NetLab(tag=f"{os.getpid() % 10000}{next(_counter)}")
    try:
        yield lab
    finally:
        lab.cleanup()


def rename(old: str, new: str) -> None:
    _ip("link", "set", old, "name", new)
