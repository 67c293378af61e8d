"""`Rounds`: the timer thread of the scheduler's batching writers (Events, NodeDevices status)."""

from __future__ import annotations

import logging
import threading
from typing import ClassVar


class Rounds:
    """Runs `one_round()` every `interval` seconds on a daemon thread, from `start()` until
    `stop()`; a round that fails is logged and the next one runs as planned. A subclass
    calls `_init_rounds()` before `start()`."""

    interval: float
    ROUNDS: ClassVar[str]
    """What runs the rounds: names the thread and the log line of a failed round."""

    def _init_rounds(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def one_round(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        name = self.ROUNDS.replace(" ", "-")
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.one_round()
            except Exception:
                # logged as the subclass's module logs
                logging.getLogger(type(self).__module__).exception("%s round failed", self.ROUNDS)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
