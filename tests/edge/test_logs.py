import argparse
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera_edge.logs import add_log_flags, setup_logging


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_carry_fields_and_errors() -> None:
    stream = io.StringIO()
    setup_logging("json", "info", stream=stream)
    log = logging.getLogger("tessera.test")
    log.debug("hidden")
    log.info("placed %s", "pod-a", extra={"node": "n1"})
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["msg"] for line in lines] == ["placed pod-a", "failed"]
    assert lines[0]["node"] == "n1" and lines[0]["level"] == "info"
    assert lines[0]["time"].endswith("Z")
    assert "ValueError: boom" in lines[1]["error"]


def test_text_and_file(tmp_path: Path) -> None:
    path = tmp_path / "log"
    setup_logging("text", "warning", path=str(path))
    logging.getLogger("x").warning("careful")
    logging.getLogger().handlers[0].flush()
    assert "WARNING x: careful" in path.read_text()


def test_flags() -> None:
    parser = argparse.ArgumentParser()
    add_log_flags(parser)
    args = parser.parse_args(["--log-format", "json", "--log-level", "debug"])
    assert (args.log_format, args.log_level) == ("json", "debug")
