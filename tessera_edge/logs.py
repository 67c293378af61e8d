"""One log format for every tessera program (operators parse them the same way).

`--log-format json` writes one object per line: `time` (UTC, milliseconds), `level`,
`logger`, `msg`, any `extra=` fields of the call, and `error` with the traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any, TextIO

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LEVELS = ("debug", "info", "warning", "error")
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD:
                doc[key] = value
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


def add_log_flags(group: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    group.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="text lines, or one JSON object per line (time, level, logger, msg, fields). "
        "Default: %(default)s.",
    )
    group.add_argument(
        "--log-level",
        choices=LEVELS,
        default="info",
        help="least severe messages to log. Default: %(default)s.",
    )


def setup_logging(fmt: str, level: str, path: str = "", stream: TextIO | None = None) -> None:
    """Send every log record to `path` (a file), or `stream` (default stderr)."""
    handler: logging.Handler = (
        logging.FileHandler(path) if path else logging.StreamHandler(stream or sys.stderr)
    )
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
