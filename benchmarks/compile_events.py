"""Where a first ``flash()`` (or a first ``simfloat attribute``) spends its compile time: numba's compile events,
per function.

Run it from outside a checkout with the tree to measure on ``PYTHONPATH`` (or installed); it uses a fresh
numba cache of its own, so every kernel compiles. Prints the call's wall and process CPU time, then the functions
by their own compile time (an event's time less its nested compilations) and their inclusive time; with
``--signatures``, every function compiled for more than one signature (literal vs int64 arguments, read-only vs
writable arrays, tuples vs records: each is a compilation of its own) and those signatures.

    PYTHONPATH=TREE python TREE/benchmarks/compile_events.py [--plan triton-bf16] [--top 30]
    PYTHONPATH=TREE python TREE/benchmarks/compile_events.py --job attribute [--signatures]

``--job``: ``flash`` (default: ``flash(q, k, v, plan=PLAN)`` on a (1, 1, 64, 16) input), ``attribute`` (the
default job of ``simfloat attribute``, minutes) or ``attribute-quick`` (``simfloat attribute --quick``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", default="triton-bf16")
    ap.add_argument("--job", choices=("flash", "attribute", "attribute-quick"), default="flash")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--signatures", action="store_true", help="list the functions compiled for several signatures")
    args = ap.parse_args()
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="simfloat-events-")

    import numpy as np
    from numba.core import event

    import simfloat as sf

    if args.job == "flash":
        from simfloat.attention import flash

        g = np.random.default_rng(0)
        q, k, v = (sf.round(g.standard_normal((1, 1, 64, 16)), "bf16") for _ in range(3))
        what = f"first flash(plan={args.plan!r})"

        def call() -> None:
            flash(q, k, v, plan=args.plan)

    else:
        from simfloat.cli import main as cli

        argv = ["attribute", *(["--quick"] if args.job == "attribute-quick" else [])]
        what = f"first `simfloat {' '.join(argv)}`"

        def call() -> None:
            with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(io.StringIO()):
                rc = cli([*argv, "--out", d])
            if rc != 0:
                raise SystemExit(f"simfloat {' '.join(argv)} exited {rc}")

    with event.install_recorder("numba:compile") as rec:
        t, c = time.perf_counter(), time.process_time()
        call()
        wall, cpu = time.perf_counter() - t, time.process_time() - c
    print(f"{sf.__file__}: {what} {wall:.1f} s wall, {cpu:.1f} s process CPU")

    stack: list[list] = []
    incl: dict[str, float] = collections.defaultdict(float)
    own: dict[str, float] = collections.defaultdict(float)
    count: collections.Counter[str] = collections.Counter()
    sigs: dict[str, list[str]] = collections.defaultdict(list)
    for ts, ev in rec.buffer:
        disp = ev.data.get("dispatcher")
        name = f"{disp.py_func.__module__}.{disp.py_func.__qualname__}" if disp is not None else str(ev.data)
        if ev.is_start:
            stack.append([name, ts, 0.0, ev.data.get("args")])
            continue
        name, t0, nested, sig = stack.pop()
        incl[name] += ts - t0
        own[name] += ts - t0 - nested
        count[name] += 1
        sigs[name].append(str(sig))
        if stack:
            stack[-1][2] += ts - t0
    print(f"{len(incl)} functions, {sum(count.values())} compilations; seconds of wall clock:")
    print(f"{'own':>7} {'incl':>7}  n  function")
    for name, s in sorted(own.items(), key=lambda x: -x[1])[: args.top]:
        print(f"{s:7.1f} {incl[name]:7.1f} {count[name]:2d}  {name}")
    if args.signatures:
        print("functions compiled for several signatures (inclusive seconds, then each signature):")
        for name, s in sorted(incl.items(), key=lambda x: -x[1]):
            if count[name] > 1:
                print(f"{s:7.1f} {count[name]:2d}  {name}")
                for sig in sigs[name]:
                    print(f"              {sig[:400]}")


if __name__ == "__main__":
    main()
