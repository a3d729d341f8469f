"""Speed of the emulated backward pass against the emulated forward, measured in one run (one thread).

For a plan (``--plan``, default ``triton-bf16``), seq ``--seq`` (4096), head dim ``--head-dim`` (128), one head,
tiles ``--block`` (64): the best of ``--repeats`` timings of ``flash(..., return_stats=True)`` and of
``flash_backward`` (delta and lse included), compiled first on a small problem, and their ratio (goal <= 3).

    python benchmarks/bench_backward.py [--seq 4096] [--head-dim 128] [--plan triton-bf16] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numba
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import simfloat as sf  # noqa: E402
from simfloat.attention import flash, flash_backward, lse_from_stats  # noqa: E402


def _inputs(seq: int, d: int, fmt: str) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    return tuple(sf.round(rng.standard_normal((1, seq, d)), fmt) for _ in range(4))


def _run(seq: int, d: int, plan: str, block: int, fmt: str, repeats: int) -> tuple[float, float]:
    q, k, v, do = _inputs(seq, d, fmt)
    t_fwd = t_bwd = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        o, m, l = flash(q, k, v, plan=plan, block_m=block, block_n=block, return_stats=True)  # noqa: E741
        t_fwd = min(t_fwd, time.perf_counter() - t)
        t = time.perf_counter()
        lse = lse_from_stats(m, l, plan=plan)
        flash_backward(q, k, v, o, do, lse, plan=plan, block_m=block, block_n=block)
        t_bwd = min(t_bwd, time.perf_counter() - t)
    return t_fwd, t_bwd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--plan", default="triton-bf16")
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    numba.set_num_threads(1)
    fmt = {"bf16": "bfloat16", "fp16": "float16"}.get(args.plan.split("-")[-1], "float32")
    _run(args.block * 2, args.head_dim, args.plan, args.block, fmt, 1)  # compile
    t_fwd, t_bwd = _run(args.seq, args.head_dim, args.plan, args.block, fmt, args.repeats)
    print(
        f"plan {args.plan}, seq {args.seq}, head dim {args.head_dim}, tiles {args.block}, one thread, best of "
        f"{args.repeats}"
    )
    print(f"forward  {t_fwd:8.2f} s")
    print(f"backward {t_bwd:8.2f} s   ratio {t_bwd / t_fwd:.2f} (goal <= 3)")


if __name__ == "__main__":
    main()
