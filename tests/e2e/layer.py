"""The GPU isolation layer on an e2e node: a stand-in for HAMi-core's library, put on the
host by tessera's own installer (`tessera-isolation install`, as the NRI hook's init
container runs it), so that the node agent's probe finds the layer up.

The stand-in is a real shared object for this CPU (one C function built with `cc
-shared`), with a stamp as `make hami-core` writes one; without a C compiler it is a copy
of a shared object the Python running the suite loads. No container of the suites
loads it (their busybox is static): what matters is that the installer, the agent's probe
and the hook's mounts treat it as they would the real library.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from tessera.isolation import NodeIsolation
from tessera_edge.hami_core import Stamp, elf_problem, node_arch
from tessera_edge.host_paths import DEFAULT_HAMI_CORE_LIBRARY
from tessera_edge.layer_probe import LayerPaths, LayerProbe
from tests.e2e.controlplane import PYTHON_ENV

STAND_IN_VERSION = "e2e0000+tessera.0"
STAND_IN_COMMIT = "e2e0000" + "0" * 33
LIBRARY = DEFAULT_HAMI_CORE_LIBRARY
"""Where the shipped DaemonSets put the library on the host."""


def _shared_object(out: Path) -> None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is not None:
        source = out.with_suffix(".c")
        source.write_text("int tessera_e2e_stand_in(void) { return 0; }\n")
        subprocess.run(
            [compiler, "-shared", "-fPIC", "-o", str(out), str(source)],
            check=True,
            capture_output=True,
        )
        return
    found = sorted(Path(sysconfig.get_paths()["platstdlib"], "lib-dynload").glob("*.so"))
    assert found, "no C compiler and no shared object of this Python to stand in for HAMi-core"
    shutil.copyfile(found[0], out)


def stand_in_image(folder: Path) -> Path:
    """The image's HAMi-core folder (`/opt/tessera/hami-core` in the image): libvgpu.so and
    its stamp libvgpu.json."""
    folder.mkdir(parents=True, exist_ok=True)
    library = folder / "libvgpu.so"
    if not library.exists():
        _shared_object(library)
    data = library.read_bytes()
    arch = node_arch()
    assert elf_problem(data[:64], arch) is None, elf_problem(data[:64], arch)
    stamp = Stamp(
        version=STAND_IN_VERSION,
        commit=STAND_IN_COMMIT,
        arch=arch,
        sha256=hashlib.sha256(data).hexdigest(),
        upstream="Project-HAMi/HAMi-core",
        glibc="2.28",
    )
    (folder / "libvgpu.json").write_bytes(stamp.to_json())
    return folder


def install(image: Path, host_root: Path, library: str = LIBRARY) -> None:
    """`tessera-isolation install` from `image` onto the host seen at `host_root`; the
    layer must then probe up there, as the node agent probes it."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tessera_edge.isolation_cli",
            "install",
            f"--source={image}",
            f"--hami-core-library={library}",
            f"--host-root={host_root}",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **PYTHON_ENV},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = probe(host_root, library)
    assert found.up and found.version == STAND_IN_VERSION, (found, done.stderr)


def probe(host_root: Path, library: str = LIBRARY) -> NodeIsolation:
    """The layer as the node agent finds it with `--host-root=host_root`."""
    paths = LayerPaths("hami-core", library, "/tmp/nvidia-mps", str(host_root))
    return LayerProbe(paths).probe()
