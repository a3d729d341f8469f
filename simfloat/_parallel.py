"""Run an njit(nogil) kernel over row ranges on a thread pool.

Numba's prange cannot take the nested NamedTuples that describe formats, accumulation models and plans, so
drivers that need them are serial njit functions over ``[lo, hi)`` ranges, released from the GIL and spread over
threads here. Every output element is computed by exactly one call with fixed inputs, so results are bitwise
identical whatever the thread count or the split. The thread count follows ``numba.set_num_threads``.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numba

__all__ = ["run_rows"]


def run_rows(kernel: Callable[..., None], n_rows: int, *args: object, min_rows: int = 1) -> None:
    """Call ``kernel(lo, hi, *args)`` over a partition of ``range(n_rows)``, in parallel."""
    threads = max(1, min(numba.get_num_threads(), n_rows // max(1, min_rows)))
    if threads == 1 or n_rows <= 1:
        kernel(0, n_rows, *args)
        return
    parts = min(n_rows, threads * 4)  # a few parts per thread balance uneven rows (causal masks)
    bounds = [n_rows * i // parts for i in range(parts + 1)]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        futures = [pool.submit(kernel, bounds[i], bounds[i + 1], *args) for i in range(parts)]
        for f in futures:
            f.result()
