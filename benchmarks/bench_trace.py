"""Cost of tracing: emulated flash attention with and without a Tracer (target: traced <= 2x untraced).

Run: python benchmarks/bench_trace.py [--seq 512] [--heads 4] [--dim 64] [--plans triton-bf16,all-bf16,fp64]
Each timing is the best of --repeat runs after a compile warm-up; the ratio is printed per plan.
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np

import simfloat as sf
from simfloat.attention import flash
from simfloat.trace import Tracer


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--plans", default="triton-bf16,all-bf16,fp64")
    a = ap.parse_args()
    g = np.random.default_rng(0)
    q, k, v = (sf.round(g.standard_normal((a.heads, a.seq, a.dim)), "bf16") for _ in range(3))
    print(
        f"flash attention, {a.heads} heads x {a.seq} x {a.seq}, head_dim {a.dim}, causal={a.causal}, "
        f"{numba.get_num_threads()} threads"
    )
    for name in a.plans.split(","):
        flash(q[:1, :64], k[:1, :64], v[:1, :64], plan=name)  # compile / load both variants
        flash(q[:1, :64], k[:1, :64], v[:1, :64], plan=name, trace=Tracer())
        off = _best(lambda name=name: flash(q, k, v, plan=name, causal=a.causal), a.repeat)
        on = _best(lambda name=name: flash(q, k, v, plan=name, causal=a.causal, trace=Tracer()), a.repeat)
        print(f"  {name:14s} untraced {off:7.3f} s   traced {on:7.3f} s   ratio {on / off:5.2f}")


if __name__ == "__main__":
    main()
