"""Long work off the main thread, so that Ctrl-C stops a command at once.

Python handles SIGINT (Ctrl-C) in the main thread, between bytecodes; a numba kernel that runs for a minute
delays the ``KeyboardInterrupt`` by that minute. :func:`run_jobs` runs the calls on daemon threads and keeps the
main thread waiting in short polls, so the ``KeyboardInterrupt`` is raised there within a poll: no further call
starts, the calls already running finish in their threads (their results are dropped), and being daemon threads
they do not hold up the interpreter's exit. The commands catch it, keep what was finished and exit with 130.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

__all__ = ["call_interruptibly", "run_command", "run_jobs"]

T = TypeVar("T")
R = TypeVar("R")

#: Seconds between the main thread's checks for a finished call (and so for a pending Ctrl-C).
POLL_S = 0.1
#: the name of :func:`run_jobs`'s threads, before their number
_JOB_THREAD = "simfloat-job-"


def run_jobs(
    fn: Callable[[T], R], items: Iterable[T], workers: int = 1, on_done: Callable[[int, int], None] | None = None
) -> list[R]:
    """``[fn(item) for item in items]``, ``workers`` calls at a time on daemon threads.

    Args:
        fn: the call; it must release the GIL for the calls to overlap (numba ``nogil`` kernels do).
        items: its arguments.
        workers: calls running at once (at least 1).
        on_done: called in the calling thread as ``on_done(index, finished)`` after each call returns
            (``finished``: how many have so far).

    Returns:
        The results, in the order of ``items``.

    Raises:
        KeyboardInterrupt: Ctrl-C while waiting, within :data:`POLL_S` seconds; no further call starts.
        Exception: the first exception of a call (no further call starts).
    """
    items = list(items)
    todo: queue.SimpleQueue[tuple[int, T]] = queue.SimpleQueue()
    for i, item in enumerate(items):
        todo.put((i, item))
    done: queue.SimpleQueue[tuple[int, Any, BaseException | None]] = queue.SimpleQueue()
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            try:
                i, item = todo.get_nowait()
            except queue.Empty:
                return
            try:
                done.put((i, fn(item), None))
            except BaseException as exc:  # handed to the waiting thread, which re-raises it
                done.put((i, None, exc))

    for w in range(max(1, min(int(workers), len(items)))):
        threading.Thread(target=work, name=f"{_JOB_THREAD}{w}", daemon=True).start()
    results: list[Any] = [None] * len(items)
    try:
        for finished in range(1, len(items) + 1):
            while True:
                try:
                    i, value, exc = done.get(timeout=POLL_S)
                    break
                except queue.Empty:
                    continue
            if exc is not None:
                raise exc
            results[i] = value
            if on_done is not None:
                on_done(i, finished)
    finally:
        stop.set()
    return results


def call_interruptibly(fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    """``fn(*args, **kwargs)`` on a daemon thread, the calling thread free for Ctrl-C (see :func:`run_jobs`).

    Raises:
        KeyboardInterrupt: Ctrl-C while it runs (the call itself finishes in its thread, unseen).
    """
    return run_jobs(lambda _: fn(*args, **kwargs), [None])[0]


def run_command(call: Callable[[], int], name: str) -> int:
    """The exit status of a console command (``simfloat <sub>``, ``simfloat-gpu <sub>``): ``call()``'s, or 130
    after a Ctrl-C outside the work the command keeps (``<name>: interrupted`` on stderr, no traceback). With
    130 and a call still running on a :func:`run_jobs` thread, which cannot be stopped and would hold the exit
    (numba's parallel runtime waits for it), the process leaves at once: everything is written by then."""
    try:
        code = int(call())
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr, flush=True)
        code = 130
    if code == 130 and any(t.name.startswith(_JOB_THREAD) and t.is_alive() for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    return code
