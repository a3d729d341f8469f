"""How flash's cost grows with the sequence, and its peak resident memory (issue 32).

Time: for each seq of ``--seqs``, one head, one thread, process CPU time (best of ``--repeats``): flash of the
first ``--rows`` query rows (0: all) against all seq keys, not causal, so every query row costs the same; printed
with the time per score and scaled to all seq rows (the time a full call would take at that cost per score).

Memory (``--memory``): flash's buffers are per query row (Q's codes and weights, the output, the row
statistics) or per key (K's and V's tiles in their forms), none seq x seq, so a dense call's peak at seq N is
measured in two parts, each in a fresh process (a child of this one) without the N^2 time of the call: N query
rows against ``--rows`` keys, and ``--rows`` query rows against N keys; printed: the peak resident memory
(``getrusage``) before and after each call, its growth per query row or per key, and their sum over the
process before the call, the estimate of the dense call's peak. (A structured mask, e.g. ``window``, is no way
around the N^2 time: ``_masks.mask_of`` builds a dense seq x seq visibility array.)

    python benchmarks/bench_flash_scaling.py [--plans triton-bf16,h200-bf16] [--seqs 1024,2048,...] [--rows 512]
    python benchmarks/bench_flash_scaling.py --memory [--seqs 65536,131072] [--rows 512]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _inputs(rows: int, n: int, d: int):
    import numpy as np

    import simfloat as sf

    g = np.random.default_rng(0)
    q = sf.round(g.standard_normal((1, rows, d)), "bf16")
    k, v = (sf.round(g.standard_normal((1, n, d)), "bf16") for _ in range(2))
    return q, k, v


def _memory_child(plan: str, rows: int, n: int, d: int) -> None:
    import numba

    from simfloat.attention import flash

    numba.set_num_threads(1)
    q, k, v = _inputs(64, 256, d)
    flash(q, k, v, plan=plan)  # compile (or load) outside the figure
    q, k, v = _inputs(rows, n, d)
    before = _peak_mib()
    flash(q, k, v, plan=plan)
    print(f"{before} {_peak_mib()}")


def _child(plan: str, rows: int, n: int, d: int) -> tuple[float, float]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", plan, str(rows), str(n), "--head-dim", str(d)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(cmd, check=True, env=env, capture_output=True, text=True).stdout.split()
    return float(out[-2]), float(out[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plans", default="triton-bf16,h200-bf16")
    ap.add_argument("--seqs", default="1024,2048,4096,8192,16384,32768,65536")
    ap.add_argument("--rows", type=int, default=512, help="query rows timed (0: all)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--memory", action="store_true", help="peak resident memory per seq instead of the time")
    ap.add_argument("--child", nargs=3, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    seqs = [int(s) for s in args.seqs.split(",")]
    plans = args.plans.split(",")
    d = args.head_dim
    if args.child:
        _memory_child(args.child[0], int(args.child[1]), int(args.child[2]), d)
        return
    if args.memory:
        m = args.rows
        print(f"peak resident memory, head dim {d}, one head, one thread; a fresh process per call")
        for plan in plans:
            for n in seqs:
                b_q, a_q = _child(plan, n, m, d)  # n query rows, m keys
                b_k, a_k = _child(plan, m, n, d)  # m query rows, n keys
                print(
                    f"  {plan} seq {n}: {n} rows x {m} keys {b_q:.0f} -> {a_q:.0f} MiB "
                    f"({(a_q - b_q) * 2**20 / n:.0f} B per query row); {m} rows x {n} keys {b_k:.0f} -> {a_k:.0f} MiB "
                    f"({(a_k - b_k) * 2**20 / n:.0f} B per key); dense estimate {a_q + a_k - b_k:.0f} MiB",
                    flush=True,
                )
        print(f"load average {os.getloadavg()}")
        return

    import numba

    from simfloat.attention import flash

    numba.set_num_threads(1)
    print(f"flash, head dim {d}, one head, one thread, process CPU time, best of {args.repeats}")
    for plan in plans:
        q, k, v = _inputs(64, 256, d)
        flash(q, k, v, plan=plan)  # compile (or load) outside the timings
        for n in seqs:
            rows = min(args.rows, n) if args.rows > 0 else n
            q, k, v = _inputs(rows, n, d)
            best = float("inf")
            for _ in range(args.repeats):
                t = time.process_time()
                flash(q, k, v, plan=plan)
                best = min(best, time.process_time() - t)
            per = best / (rows * n)
            print(
                f"  {plan:12s} seq {n:6d}: {rows} rows {best:7.3f} s, {per * 1e9:6.1f} ns per score, "
                f"all {n} rows {per * n * n:8.1f} s",
                flush=True,
            )
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
