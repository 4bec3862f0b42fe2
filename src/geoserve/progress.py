"""Progress reporting for the CLI: a bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import time
from typing import TextIO


def _clock(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    """Reports patches done out of a total, with patches/s and an ETA.

    On a TTY it redraws one bar line; elsewhere (logs, CI, pipes) it prints a plain line at
    most every ``interval`` seconds, and always a last one when done.
    """

    def __init__(self, total: int, stream: TextIO, *, tty: bool, interval: float = 2.0) -> None:
        self.total = max(total, 0)
        self.stream = stream
        self.tty = tty
        self.interval = interval
        self.start = time.perf_counter()
        self._last = -1.0
        self.done = 0

    def update(self, done: int, *, final: bool = False) -> None:
        """Record ``done`` patches; draw if due."""
        self.done = min(done, self.total)
        now = time.perf_counter()
        if not final and not self.tty and now - self._last < self.interval:
            return
        self._last = now
        elapsed = max(now - self.start, 1e-9)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        pct = 100 * self.done / self.total if self.total else 100.0
        if self.tty:
            width = 30
            fill = int(width * pct / 100)
            bar = "#" * fill + "." * (width - fill)
            self.stream.write(
                f"\r[{bar}] {self.done}/{self.total} patches  {rate:.1f}/s  ETA {_clock(eta)}"
            )
            if final:
                self.stream.write("\n")
        else:
            self.stream.write(
                f"progress: {self.done}/{self.total} patches ({pct:.0f}%), {rate:.1f} patches/s, "
                f"ETA {eta:.0f} s\n"
            )
        self.stream.flush()
