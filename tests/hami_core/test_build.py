"""`make hami-core`'s steps that need no HAMi-core source: refusing a source without the
pinned commit, applying patches inside a checkout, the configuration header, the source
list, reading ELF files."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from pathlib import Path

import pytest

from tools import hami_core


def _git(cwd: Path, *args: str) -> None:
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
    )
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


def test_a_missing_source_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere"
    assert hami_core.main(["build", "--source", str(missing), "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == f"make hami-core: HAMI_CORE_SRC={missing}: no such directory\n"


def test_a_source_without_the_pinned_commit_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "HAMi-core"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "README.md").write_text("not the pinned commit\n")
    _git(repo, "add", "README.md")
    _git(repo, "commit", "-qm", "other")
    out = tmp_path / "out"
    assert hami_core.main(["build", "--source", str(repo), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"does not hold Project-HAMi/HAMi-core commit {hami_core.COMMIT}" in err
    assert not (out / "x86_64").exists()


def test_a_folder_that_is_no_git_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(hami_core.BuildError, match="is not a git directory or checkout"):
        hami_core.git_dir(tmp_path)


def test_patches_apply_to_a_build_folder_inside_a_checkout(tmp_path: Path) -> None:
    """In a checkout, `git apply` run in a subfolder skips paths outside it without a word;
    the build folder sits in tessera's checkout, so the patches must still land."""
    _git(tmp_path, "init", "-q")
    tree = tmp_path / "build" / "src"
    (tree / "src").mkdir(parents=True)
    (tree / "src" / "a.c").write_text("int a = 1;\n")
    patch = tmp_path / "0001.patch"
    patch.write_text(
        "diff --git a/src/a.c b/src/a.c\n--- a/src/a.c\n+++ b/src/a.c\n"
        "@@ -1 +1 @@\n-int a = 1;\n+int a = 2;\n"
    )
    hami_core.apply_patches(tree, [patch])
    assert (tree / "src" / "a.c").read_text() == "int a = 2;\n"
    with pytest.raises(hami_core.BuildError, match=r"0001.patch does not apply"):
        hami_core.apply_patches(tree, [patch])


def test_the_configuration_turns_on_the_interception(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "static_config.h.in").write_text(
        "#cmakedefine MULTIPROCESS_LIMIT_ENABLE\n#cmakedefine MEMORY_LIMIT_DEBUG\n"
        "#cmakedefine DLSYM_HOOK_ENABLE\n#cmakedefine HOOK_MEMINFO_ENABLE\n"
        "#cmakedefine HOOK_NVML_ENABLE\nextern size_t GIT_HASH_@GIT_HASH@;\n"
    )
    hami_core.write_config(tmp_path, tmp_path / "config")
    text = (tmp_path / "config" / "static_config.h").read_text()
    assert set(re.findall(r"^#define (\w+)$", text, re.M)) == set(hami_core.ENABLED)
    assert "/* #undef MEMORY_LIMIT_DEBUG */" in text
    assert f"GIT_HASH_{hami_core.COMMIT[:7]};" in text


def test_the_sources_are_the_ones_cmake_lists(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "cuda").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text(
        "add_subdirectory(cuda)\nset(LIBVGPU vgpu)\n"
        "add_library(${LIBVGPU} SHARED libvgpu.c utils.c $<TARGET_OBJECTS:cuda_mod>)\n"
    )
    (src / "cuda" / "CMakeLists.txt").write_text(
        "add_library(cuda_mod OBJECT context.c hook.c memory.c hook.c)\n"
    )
    assert hami_core.library_sources(tmp_path) == [
        src / "libvgpu.c",
        src / "utils.c",
        src / "cuda" / "context.c",
        src / "cuda" / "hook.c",
        src / "cuda" / "memory.c",
    ]


def test_elf_files_are_read_for_their_machine_and_glibc_needs(tmp_path: Path) -> None:
    shell = Path(os.path.realpath("/bin/sh"))
    machines = {"x86_64": 62, "aarch64": 183}
    if platform.machine() in machines:
        assert hami_core.elf_machine(shell) == machines[platform.machine()]
    not_elf = tmp_path / "libvgpu.so"
    not_elf.write_bytes(b"#!/bin/sh\n" * 4)
    assert hami_core.elf_machine(not_elf) == 0
    needed = hami_core.glibc_needed(shell)
    here = os.confstr("CS_GNU_LIBC_VERSION") or ""
    if here.startswith("glibc "):
        ours = tuple(int(p) for p in here.split()[1].split("."))
        assert needed and tuple(int(p) for p in needed.split(".")) <= ours
    assert "libc.so.6" in hami_core.needed_libraries(shell)


def test_every_patch_is_explained_beside_it() -> None:
    patches = sorted(hami_core.PATCHES.glob("*.patch"))
    assert patches
    readme = (hami_core.PATCHES.parent / "README.md").read_text()
    for patch in patches:
        assert patch.name in readme
        assert hami_core.COMMIT in patch.read_text()  # written against the pinned commit
    assert len(patches) <= hami_core.PATCH_LEVEL
