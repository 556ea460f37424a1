"""Progress reporting for long loads: the one place that decides whether a bar is shown.

Every loader takes ``progress`` with one meaning:

- ``None`` (automatic): a tqdm bar on stderr, but only when stderr is a terminal and only once the
  load has run longer than ``pystrom.defaults.progress_delay`` seconds (2 by default), so short
  loads, pipes, log files and notebooks stay quiet;
- ``True``: a bar from the start, wherever stderr goes (you asked for it);
- ``False``: nothing;
- a callable: called with the running total (rows or bytes, as the loader says), no bar.

Loaders report running totals (not increments) from any thread; :class:`Reporter` serialises them.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import IO, Any

from ._settings import defaults
from .errors import InvalidArgumentError

__all__ = ["Reporter", "reporter", "check_progress"]


def check_progress(progress: Any) -> None:
    """Raise the user-facing error for a ``progress`` argument that is none of the accepted kinds."""
    if progress is None or isinstance(progress, bool) or callable(progress):
        return
    raise InvalidArgumentError(
        f"progress must be None (automatic), True, False or a callable; got {type(progress).__name__}"
    )


class Reporter:
    """Receives running totals; forwards them to a callback and/or a tqdm bar. Closing is idempotent."""

    def __init__(self, callback: Callable[[int], Any] | None = None, bar: Any = None):
        self._callback = callback
        self._bar = bar
        self._lock = threading.Lock()
        self._done = 0

    @property
    def active(self) -> bool:
        """Whether reporting does anything (loaders may skip work when it does not)."""
        return self._callback is not None or self._bar is not None

    @property
    def bar(self) -> Any:
        """The tqdm bar, or None."""
        return self._bar

    def __call__(self, done: int) -> None:
        with self._lock:
            if done < self._done:  # totals only grow; a stale report from a slower thread is dropped
                return
            step, self._done = done - self._done, done
            if self._bar is not None and step:
                self._bar.update(step)
            if self._callback is not None:
                self._callback(done)

    def close(self) -> None:
        with self._lock:
            bar, self._bar = self._bar, None
        if bar is not None:
            bar.close()  # a bar never shown (the load ended within the delay) prints nothing

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def reporter(
    progress: Any,
    *,
    unit: str,
    desc: str,
    total: int | None = None,
    stream: IO[str] | None = None,
) -> Reporter:
    """The :class:`Reporter` for a loader's ``progress`` argument (see the module docstring).

    ``unit`` is ``"rows"`` or ``"B"`` (bytes, shown as KiB/MiB/GiB); ``stream`` defaults to the
    current ``sys.stderr``.
    """
    check_progress(progress)
    if progress is False:
        return Reporter()
    if callable(progress):
        return Reporter(callback=progress)
    stream = sys.stderr if stream is None else stream
    if stream is None or (progress is None and not _is_terminal(stream)):
        return Reporter()
    from tqdm import tqdm  # only when a bar may be shown: keeps `import pystrom` light

    bar = tqdm(
        total=total,
        desc=desc,
        unit=unit if unit == "B" else f" {unit}",  # "2.50k rows", but "2.00MB"
        unit_scale=True,
        unit_divisor=1024 if unit == "B" else 1000,
        file=stream,
        delay=defaults.progress_delay if progress is None else 0.0,
        dynamic_ncols=_is_terminal(stream),
        disable=False,
        leave=True,
    )
    return Reporter(bar=bar)
