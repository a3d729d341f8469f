"""Compiling: a notice when simfloat's kernels are first compiled, and a clock of the time spent compiling.

numba compiles a kernel on its first call and keeps the machine code in its on-disk cache; only a miss compiles
(and only a miss fires numba's ``numba:compile`` event, which this module listens to). The first miss of a
simfloat kernel in a process prints :data:`NOTICE` on stderr at once, once (set :data:`QUIET_ENV` to ``1`` to
silence it). :func:`compile_seconds` counts the seconds spent in outermost compilations so far (any numba
function's, on any thread: numba compiles under one lock), so that progress bars can leave them out of their
rates (:class:`BarClock`): a run that compiled says nothing about how long the next runs take.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from numba.core import event

__all__ = ["NOTICE", "QUIET_ENV", "BarClock", "compile_seconds", "install"]

NOTICE = (
    "simfloat: compiling simfloat's kernels for this CPU (first run only; later runs load them from numba's cache) ..."
)
#: Set to 1 to silence :data:`NOTICE`.
QUIET_ENV = "SIMFLOAT_QUIET_COMPILE"


def _ours(ev: event.Event) -> bool:
    disp = ev.data.get("dispatcher") if isinstance(ev.data, dict) else None
    mod = getattr(getattr(disp, "py_func", None), "__module__", "") or ""
    return mod == "simfloat" or mod.startswith("simfloat.")


class _Clock(event.Listener):
    """The listener: the depth of nested compilations, the seconds of finished outermost ones, the notice."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.since = 0.0  # start of the ongoing outermost compilation
        self.total = 0.0
        self.noticed = False

    def on_start(self, ev: event.Event) -> None:
        with self.lock:
            self.depth += 1
            if self.depth == 1:
                self.since = time.perf_counter()
            say = not self.noticed and _ours(ev) and os.environ.get(QUIET_ENV, "") in ("", "0")
            if say:
                self.noticed = True
        if say:
            _say(NOTICE)

    def on_end(self, ev: event.Event) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth == 0:
                self.total += time.perf_counter() - self.since

    def seconds(self) -> float:
        with self.lock:
            ongoing = time.perf_counter() - self.since if self.depth > 0 else 0.0
            return self.total + ongoing


def _say(text: str) -> None:
    """``text`` on stderr, above any tqdm bar that is up (tqdm.write keeps the bar whole)."""
    tq = sys.modules.get("tqdm")
    if tq is not None and hasattr(tq, "tqdm"):
        tq.tqdm.write(text, file=sys.stderr)
    else:
        print(text, file=sys.stderr, flush=True)


_CLOCK = _Clock()
_installed = False


def install() -> None:
    """Listen to numba's compile events (idempotent; done when :mod:`simfloat._jit` is imported)."""
    global _installed
    if not _installed:
        event.register("numba:compile", _CLOCK)
        _installed = True


def compile_seconds() -> float:
    """Seconds this process has spent compiling numba functions so far (an ongoing compilation included)."""
    return _CLOCK.seconds()


class BarClock:
    """Updates a tqdm bar so that its rate, hence its ETA, leaves out the time spent compiling.

    tqdm's rate is a moving average of (runs done) / (seconds since its last print); before each update, the
    seconds compiled since the previous one are moved out of that interval (the bar's elapsed time stays the
    wall time).
    """

    def __init__(self, bar: Any) -> None:
        self.bar = bar
        self.seen = compile_seconds()

    def update(self, n: int = 1, compiled: float = 0.0) -> None:
        """``bar.update(n)`` with the compile time since the last update taken out of the rate: this process's,
        plus ``compiled`` seconds spent elsewhere (a sweep's worker processes)."""
        now = compile_seconds()
        spent, self.seen = now - self.seen + max(0.0, compiled), now
        if spent > 0.0 and hasattr(self.bar, "last_print_t"):
            self.bar.last_print_t = min(self.bar.last_print_t + spent, self.bar._time())
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()
