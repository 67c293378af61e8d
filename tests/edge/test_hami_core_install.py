"""HAMi-core's installer: a fresh node, an upgrade under a process that holds the old file,
an unchanged version left alone, and every bad source refused with one line, the host's
library untouched and the reason kept for the node agent."""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_edge import isolation_cli
from tessera_edge.hami_core import (
    LibraryError,
    Stamp,
    elf_problem,
    install,
    installed_stamp,
    load_source,
    node_arch,
    parse_stamp,
    read_install_error,
)
from tests.edge.layer_files import elf_library, image_folder, other_arch, stamp_for

ARCH = node_arch()
BIN = Path(sys.executable).parent


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _run_install(source: Path, host: Path) -> subprocess.CompletedProcess[str]:
    """The real console script, as the init container runs it."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
    return subprocess.run(
        [
            str(BIN / "tessera-isolation"),
            "install",
            f"--source={source}",
            "--hami-core-library=/usr/local/vgpu/libvgpu.so",
            f"--host-root={host}",
        ],
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_fresh_node_gets_the_library_and_its_stamp(tmp_path: Path) -> None:
    source, library, stamp = image_folder(tmp_path / "image", ARCH)
    host = tmp_path / "host"
    done = _run_install(source, host)
    assert done.returncode == 0, done.stderr
    installed = host / "usr/local/vgpu/libvgpu.so"
    assert installed.read_bytes() == library
    assert oct(installed.stat().st_mode & 0o777) == "0o644"
    assert parse_stamp((host / "usr/local/vgpu/libvgpu.json").read_bytes(), "x") == stamp
    assert not (host / "usr/local/vgpu/libvgpu.install-error").exists()
    assert sorted(p.name for p in installed.parent.iterdir()) == ["libvgpu.json", "libvgpu.so"]
    assert "installed HAMi-core 8f3a89c+tessera.v1" in done.stderr


def test_the_same_version_is_left_untouched(tmp_path: Path) -> None:
    source, _, _ = image_folder(tmp_path / "image", ARCH)
    host = tmp_path / "host"
    assert _run_install(source, host).returncode == 0
    lib = host / "usr/local/vgpu/libvgpu.so"
    before = (
        lib.stat().st_ino,
        lib.stat().st_mtime_ns,
        (lib.parent / "libvgpu.json").stat().st_ino,
    )
    done = _run_install(source, host)
    assert done.returncode == 0 and "already installed" in done.stderr
    after = (lib.stat().st_ino, lib.stat().st_mtime_ns, (lib.parent / "libvgpu.json").stat().st_ino)
    assert after == before  # no write, no rename


def test_an_upgrade_keeps_the_old_inode_whole_for_its_users(tmp_path: Path) -> None:
    """A running container maps the library (the dynamic loader mmaps it): after the
    upgrade its mapping and open file still read the old version, whole, while a new open
    of the path reads the new one, whole."""
    host = tmp_path / "host"
    old_source, old, _ = image_folder(tmp_path / "v1", ARCH, "v1", size=3 << 20)
    assert _run_install(old_source, host).returncode == 0
    lib = host / "usr/local/vgpu/libvgpu.so"
    with open(lib, "rb") as held, mmap.mmap(held.fileno(), 0, prot=mmap.PROT_READ) as mapped:
        old_inode = os.fstat(held.fileno()).st_ino
        new_source, new, new_stamp = image_folder(tmp_path / "v2", ARCH, "v2", size=1 << 20)
        done = _run_install(new_source, host)
        assert done.returncode == 0, done.stderr
        assert "replacing 8f3a89c+tessera.v1" in done.stderr
        assert _sha(mapped[:]) == _sha(old)  # the mapping: the old file, every byte
        held.seek(0)
        assert _sha(held.read()) == _sha(old)
        assert os.fstat(held.fileno()).st_nlink == 0  # unlinked, alive while held
        assert lib.stat().st_ino != old_inode
        assert _sha(lib.read_bytes()) == _sha(new)
    assert installed_stamp(str(lib)) == new_stamp


def test_readers_never_see_a_partial_library_while_versions_alternate(tmp_path: Path) -> None:
    """Opened at any moment of any install, the path holds one version or the other, whole."""
    lib = tmp_path / "vgpu" / "libvgpu.so"
    sources = [load_source(str(image_folder(tmp_path / v, ARCH, v)[0]), ARCH) for v in ("v1", "v2")]
    wanted = {_sha(s.library) for s in sources}
    install(sources[0], str(lib))
    seen: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            seen.append(_sha(lib.read_bytes()))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(20):
            assert install(sources[(i + 1) % 2], str(lib)).changed
    finally:
        stop.set()
        reader.join()
    assert seen and set(seen) <= wanted
    assert sorted(p.name for p in lib.parent.iterdir()) == ["libvgpu.json", "libvgpu.so"]


def _break(folder: Path, how: str) -> str:
    """Spoil the image's library or stamp; what the error must say."""
    lib, stamp = folder / "libvgpu.so", folder / "libvgpu.json"
    data = lib.read_bytes()
    if how == "truncated":
        lib.write_bytes(data[: len(data) // 2])
        return "corrupt or truncated"
    if how == "corrupt":
        lib.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
        return "corrupt or truncated"
    if how == "wrong-arch-library":
        body = elf_library(other_arch(), data[64:])
        lib.write_bytes(body)
        stamp.write_bytes(stamp_for(body, ARCH).to_json())
        return f"not this node's {ARCH}"
    if how == "wrong-arch-stamp":
        stamp.write_bytes(stamp_for(data, other_arch()).to_json())
        return f"built for {other_arch()}"
    if how == "not-elf":
        lib.write_bytes(b"#!/bin/sh\n" + data[10:])
        stamp.write_bytes(stamp_for(lib.read_bytes(), ARCH).to_json())
        return "not an ELF file"
    if how == "executable":
        body = elf_library(ARCH, data[64:], e_type=2)
        lib.write_bytes(body)
        stamp.write_bytes(stamp_for(body, ARCH).to_json())
        return "not a shared library"
    if how == "stamp-garbage":
        stamp.write_bytes(b"\x00\xffnot json")
        return "not JSON"
    if how == "stamp-missing":
        stamp.unlink()
        return "No such file"
    if how == "library-missing":
        lib.unlink()
        return "No such file"
    raise AssertionError(how)


BREAKS = (
    "truncated",
    "corrupt",
    "wrong-arch-library",
    "wrong-arch-stamp",
    "not-elf",
    "executable",
    "stamp-garbage",
    "stamp-missing",
    "library-missing",
)


@pytest.mark.parametrize("how", BREAKS)
def test_a_bad_source_is_one_line_and_the_old_library_stays(tmp_path: Path, how: str) -> None:
    host = tmp_path / "host"
    good, old, _ = image_folder(tmp_path / "v1", ARCH, "v1")
    assert _run_install(good, host).returncode == 0
    lib = host / "usr/local/vgpu/libvgpu.so"
    inode = lib.stat().st_ino
    bad, _, _ = image_folder(tmp_path / "v2", ARCH, "v2")
    says = _break(bad, how)
    done = _run_install(bad, host)
    # the node keeps serving whole GPUs: the init container must not fail
    assert done.returncode == 0
    (line,) = done.stderr.splitlines()
    assert line.startswith("tessera-isolation install: error: HAMi-core not installed at "), line
    assert says in line, line
    assert lib.stat().st_ino == inode and lib.read_bytes() == old
    assert (lib.parent / "libvgpu.install-error").read_text().strip() in line
    assert read_install_error(str(lib)) is not None
    assert not [p for p in lib.parent.iterdir() if p.name.endswith(".tmp")]
    # a good source afterwards installs and clears the reason
    assert _run_install(good, host).returncode == 0
    assert read_install_error(str(lib)) is None


def test_a_bad_source_on_a_fresh_node_installs_nothing(tmp_path: Path) -> None:
    bad, _, _ = image_folder(tmp_path / "image", ARCH)
    _break(bad, "truncated")
    host = tmp_path / "host"
    done = _run_install(bad, host)
    assert done.returncode == 0 and "corrupt or truncated" in done.stderr
    folder = host / "usr/local/vgpu"
    assert sorted(p.name for p in folder.iterdir()) == ["libvgpu.install-error"]


def test_a_host_folder_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    source, _, _ = image_folder(tmp_path / "image", ARCH)
    host = tmp_path / "host"
    (host / "usr/local").mkdir(parents=True)
    (host / "usr/local/vgpu").write_text("a file where the folder should be")
    done = _run_install(source, host)
    assert done.returncode == 0
    (line,) = done.stderr.splitlines()
    assert "HAMi-core not installed" in line and "vgpu" in line


def test_a_replaced_installed_file_is_installed_again(tmp_path: Path) -> None:
    """The stamp says v1 but the file in place is not v1's (truncated by a full disk, or
    overwritten by hand): the same version is written again."""
    source = load_source(str(image_folder(tmp_path / "image", ARCH)[0]), ARCH)
    lib = tmp_path / "vgpu" / "libvgpu.so"
    install(source, str(lib))
    lib.write_bytes(source.library[:100])
    assert installed_stamp(str(lib)) is None
    assert install(source, str(lib)).changed
    assert lib.read_bytes() == source.library


def test_bad_flags_are_one_line_and_status_2(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        isolation_cli.main(["install", "--hami-core-library=relative.so"])
    assert exc.value.code == 2


# --- the stamp's parser: whatever a file holds, a Stamp or one LibraryError --------------


def test_a_stamp_round_trips() -> None:
    stamp = stamp_for(elf_library(ARCH, b"x"), ARCH)
    assert parse_stamp(stamp.to_json(), "s") == stamp
    assert json.loads(stamp.to_json())["layer"] == "hami-core"


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"layer": "mps"}, "layer"),
        ({"arch": "riscv64"}, "arch"),
        ({"commit": "8f3a89c"}, "commit"),
        ({"sha256": "z" * 64}, "sha256"),
        ({"version": "x" * 65}, "version"),
        ({"version": "v\n1"}, "version"),
        ({"version": 7}, "version"),
        ({"glibc": ["2.28"]}, "glibc"),
    ],
)
def test_a_bad_stamp_field_is_named(change: dict[str, object], says: str) -> None:
    doc = json.loads(stamp_for(b"x", ARCH).to_json())
    doc.update(change)
    with pytest.raises(LibraryError, match=says):
        parse_stamp(json.dumps(doc).encode(), "libvgpu.json")


def test_an_oversized_stamp_is_refused_unread() -> None:
    with pytest.raises(LibraryError, match="not a stamp"):
        parse_stamp(b"{" + b" " * 5000 + b"}", "s")


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=600)
    | st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=80),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=8)
        ),
        max_leaves=20,
    ).map(lambda d: json.dumps(d).encode())
)
def test_any_bytes_are_a_stamp_or_a_library_error(raw: bytes) -> None:
    try:
        stamp = parse_stamp(raw, "s")
    except LibraryError as exc:
        assert "\n" not in str(exc)
    else:
        assert isinstance(stamp, Stamp)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_any_header_is_judged_without_an_exception(head: bytes) -> None:
    problem = elf_problem(head, ARCH)
    assert problem is None or isinstance(problem, str)
    if problem is None:
        assert head[:4] == b"\x7fELF"
