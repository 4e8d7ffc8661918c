"""A minimal terminal progress bar on stderr (no dependency; silent when stderr is not a terminal).

Edge boards often run headless over SSH or under systemd: the bar draws only on a TTY, and a final line is
always printed by the caller instead, so logs stay clean.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """``with ProgressBar(total, "trials") as bar: bar.update(n, note)``."""

    def __init__(self, total: int, label: str = "", *, stream: TextIO | None = None, width: int = 28,
                 min_interval_s: float = 0.1, enabled: bool | None = None) -> None:
        self.total = max(1, int(total))
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.min_interval_s = min_interval_s
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.done = 0
        self._t0 = time.perf_counter()
        self._last_draw = 0.0

    def update(self, done: int, note: str = "") -> None:
        self.done = min(int(done), self.total)
        now = time.perf_counter()
        if not self.enabled or (now - self._last_draw < self.min_interval_s and self.done < self.total):
            return
        self._last_draw = now
        filled = int(self.width * self.done / self.total)
        bar = "#" * filled + "-" * (self.width - filled)
        elapsed = now - self._t0
        self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total} {elapsed:5.1f}s {note}"[:160].ljust(80))
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * 80 + "\r")
            self.stream.flush()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
