"""The GPU check's dry run (tests/gpu/dry_run.py), which `make gpu-bundle` runs before a
lent GPU machine is used: every plan the checks make, for each layer, without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gpu import dry_run


def test_every_share_is_planned_for_every_layer(tmp_path: Path) -> None:
    library, pipe = str(tmp_path / "libvgpu.so"), str(tmp_path / "pipe")
    made = dry_run.plans(library, pipe)
    assert {layer for layer, _, _ in made} == {"none", "hami-core", "mps"}
    assert len(made) == 3 * 8  # 30%, 100%, 40% alone, the pair, the three
    for layer, share, plan in made:
        env = dict(plan.env)
        assert any(d.path == "/dev/nvidia0" for d in plan.devices), share
        if layer == "hami-core":
            assert env["LD_PRELOAD"] == library
        elif layer == "mps":
            assert env["CUDA_MPS_PIPE_DIRECTORY"] == pipe
        else:
            assert "LD_PRELOAD" not in env and "CUDA_MPS_PIPE_DIRECTORY" not in env


def test_without_the_built_library_it_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert dry_run.main(["--library", str(tmp_path / "libvgpu.so")]) == 1
    assert capsys.readouterr().err == (
        f"dry run: no {tmp_path / 'libvgpu.so'} and stamp: run make hami-core first\n"
    )
