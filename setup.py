"""Wheel builds generate the protobuf stubs first: they are build outputs, not committed."""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tools import gen_protos


class BuildPyWithProtos(build_py):
    """Writes protos/**/*_pb2*.py(i) before the modules and package data are collected."""

    def run(self) -> None:
        gen_protos.main()
        super().run()


setup(cmdclass={"build_py": BuildPyWithProtos})
