"""Where a first ``flash()`` spends its compile time: numba's compile events, per function.

Run it from outside a checkout with the tree to measure on ``PYTHONPATH`` (or installed); it uses a fresh
numba cache of its own, so every kernel compiles. Prints the call's wall and process CPU time, then the functions
by their own compile time (an event's time less its nested compilations) and their inclusive time.

    PYTHONPATH=TREE python TREE/benchmarks/compile_events.py [--plan triton-bf16] [--top 30]
"""

from __future__ import annotations

import argparse
import collections
import os
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", default="triton-bf16")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="simfloat-events-")

    import numpy as np
    from numba.core import event

    import simfloat as sf
    from simfloat.attention import flash

    g = np.random.default_rng(0)
    q, k, v = (sf.round(g.standard_normal((1, 1, 64, 16)), "bf16") for _ in range(3))
    with event.install_recorder("numba:compile") as rec:
        t, c = time.perf_counter(), time.process_time()
        flash(q, k, v, plan=args.plan)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
    print(f"{sf.__file__}: first flash(plan={args.plan!r}) {wall:.1f} s wall, {cpu:.1f} s process CPU")

    stack: list[list] = []
    incl: dict[str, float] = collections.defaultdict(float)
    own: dict[str, float] = collections.defaultdict(float)
    count: collections.Counter[str] = collections.Counter()
    for ts, ev in rec.buffer:
        disp = ev.data.get("dispatcher")
        name = f"{disp.py_func.__module__}.{disp.py_func.__qualname__}" if disp is not None else str(ev.data)
        if ev.is_start:
            stack.append([name, ts, 0.0])
            continue
        name, t0, nested = stack.pop()
        incl[name] += ts - t0
        own[name] += ts - t0 - nested
        count[name] += 1
        if stack:
            stack[-1][2] += ts - t0
    print(f"{len(incl)} functions, {sum(count.values())} compilations; seconds of wall clock:")
    print(f"{'own':>7} {'incl':>7}  n  function")
    for name, s in sorted(own.items(), key=lambda x: -x[1])[: args.top]:
        print(f"{s:7.1f} {incl[name]:7.1f} {count[name]:2d}  {name}")


if __name__ == "__main__":
    main()
