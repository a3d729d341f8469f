"""Throughput of simfloat.round against ml_dtypes and a plain copy, measured in one run.

Every figure is a round trip x -> format -> x's dtype over N elements (standard normal data), in G elements/s,
best of R repeats (the three contenders interleaved), into preallocated outputs (no allocation or page
faults in the timed region):

* ``simfloat``: ``simfloat.round(x, fmt, out=y)``.
* ``ml_dtypes``: ``np.copyto(t, x, casting="unsafe"); np.copyto(y, t)`` with ``t`` of the ml_dtypes/numpy type
  (what ``x.astype(bfloat16).astype(x.dtype)`` does, minus the allocations). float16 uses numpy's float16.
  float64 inputs go through float32 in ml_dtypes (double rounding), so that row compares unequal work.
* ``copy``: ``np.copyto(y, x)``, the memory-bandwidth limit.

Single-threaded (numba.set_num_threads(1)) and with all numba threads. ml_dtypes and numpy casts are
single-threaded whatever the setting.

Usage: python benchmarks/bench_round.py [--n 16777216] [--repeats 7]
"""

from __future__ import annotations

import argparse
import time

import ml_dtypes
import numba
import numpy as np

import simfloat

CASES = [  # (label, input dtype, simfloat format, ml_dtypes/numpy type)
    ("f32->bf16", np.float32, "bfloat16", ml_dtypes.bfloat16),
    ("f32->fp16", np.float32, "float16", np.float16),
    ("f32->e4m3", np.float32, "float8_e4m3fn", ml_dtypes.float8_e4m3fn),
    ("f64->bf16", np.float64, "bfloat16", ml_dtypes.bfloat16),
    ("f64->fp16", np.float64, "float16", np.float16),
]


def best_times(fns: list, repeats: int) -> list[float]:
    """Best wall time of each function, the functions interleaved repeat by repeat so that a change in machine
    load hits all of them alike."""
    for fn in fns:
        fn()  # warm up (compilation, first touch)
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1 << 24, help="elements per array")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    n = args.n
    rng = np.random.default_rng(0)
    base = rng.standard_normal(n)
    all_threads = numba.config.NUMBA_NUM_THREADS
    print(f"N = {n}, best of {args.repeats}; numba threads: 1 and {all_threads}; G elem/s (round trip)")
    print(f"{'case':<11}{'threads':>8}{'simfloat':>10}{'ml_dtypes':>11}{'copy':>8}{'sf/ml':>8}{'sf/copy':>9}")
    with np.errstate(over="ignore", invalid="ignore"):
        for label, dt, fmt, mdt in CASES:
            x = base.astype(dt)
            y = np.empty_like(x)
            t = np.empty(n, dtype=mdt)

            def run_ml(x=x, y=y, t=t):
                np.copyto(t, x, casting="unsafe")
                np.copyto(y, t, casting="unsafe")

            for threads in (1, all_threads):
                numba.set_num_threads(threads)
                times = best_times(
                    [
                        lambda x=x, y=y, fmt=fmt: simfloat.round(x, fmt, out=y),
                        run_ml,
                        lambda x=x, y=y: np.copyto(y, x),
                    ],
                    args.repeats,
                )
                g = [n / tt / 1e9 for tt in times]
                print(
                    f"{label:<11}{threads:>8}{g[0]:>10.3f}{g[1]:>11.3f}{g[2]:>8.3f}"
                    f"{g[0] / g[1]:>8.2f}{g[0] / g[2]:>9.2f}"
                )
            numba.set_num_threads(all_threads)


if __name__ == "__main__":
    main()
