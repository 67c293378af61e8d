"""The usage example in tessera_ttrpc/README.md runs and prints what it says."""

from __future__ import annotations

import contextlib
import io
import shutil
import tempfile
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "tessera_ttrpc" / "README.md"


def test_the_readme_example_runs() -> None:
    code = README.read_text().split("```python\n", 1)[1].split("```", 1)[0]
    directory = tempfile.mkdtemp(prefix="ttrpc-", dir="/tmp")  # unix socket paths are short
    try:
        code = code.replace("/tmp/echo.sock", f"{directory}/echo.sock")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    assert out.getvalue() == "HI\n"
