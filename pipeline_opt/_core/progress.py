"""A dependency-free progress bar for long steps (dataset generation, profiling, tuning trials).

It draws on stderr only when stderr is a terminal (or when forced) and logs a line at the end
otherwise, so CI logs and notebooks stay readable.
"""

from __future__ import annotations

import sys
import time

from pipeline_opt._core.log import get_logger

log = get_logger("progress")


class ProgressBar:
    """``update(n)`` / ``set_postfix(text)`` / ``close()``; a no-op when disabled."""

    def __init__(self, total: int | None, desc: str = "", enabled: bool = True, stream=None) -> None:
        self.total = total
        self.desc = desc
        self.n = 0
        self.postfix = ""
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.interactive = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self._start = time.monotonic()
        self._last_draw = 0.0

    def update(self, n: int = 1) -> None:
        self.n += n
        self._draw()

    def set_postfix(self, text: str) -> None:
        self.postfix = text
        self._draw(force=True)

    def _line(self) -> str:
        elapsed = time.monotonic() - self._start
        if self.total:
            frac = min(1.0, self.n / self.total)
            filled = int(frac * 24)
            bar = "#" * filled + "-" * (24 - filled)
            core = f"{self.desc} [{bar}] {self.n}/{self.total}"
        else:
            core = f"{self.desc} {self.n}"
        tail = f" {elapsed:5.1f}s"
        return core + tail + (f"  {self.postfix}" if self.postfix else "")

    def _draw(self, force: bool = False) -> None:
        if not self.interactive:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < 0.1 and self.n != self.total:
            return
        self._last_draw = now
        self.stream.write("\r" + self._line()[:160].ljust(100))
        self.stream.flush()

    def close(self) -> None:
        if self.interactive:
            self.stream.write("\r" + self._line()[:160].ljust(100) + "\n")
            self.stream.flush()
        elif self.enabled:
            log.info("%s", self._line())


def progress_bar(total: int | None, desc: str = "", enabled: bool = True) -> ProgressBar:
    """Create a :class:`ProgressBar`."""
    return ProgressBar(total=total, desc=desc, enabled=enabled)
