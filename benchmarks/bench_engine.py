"""Speed of the vectorized emulation engine, as ratios measured in one run (the machine may be shared).

Prints, each as the best of ``--repeats`` interleaved timings:

* ``simfloat.matmul`` multiply-adds per second on one thread for the sm90 tensor-core presets (bf16, fp16,
  e4m3) and a sequential fp32 FMA loop, with the speed-up over the scalar reference (``dot_acc`` per output);
* flash attention, seq ``--seq`` (4096), head dim ``--head-dim`` (128), one head, one thread, for the plans
  ``triton-bf16``, ``h200-bf16``, ``triton-bf16`` with ``qk``/``pv`` = ``Sequential("float32")``, and the
  INT8 ``int8-reference`` scheme, each as a ratio to numpy's float32 attention in the same run;
* the speed-up of ``triton-bf16`` on all cores over one thread (goal >= 0.8 x cores);
* float32 -> e4m3 rounding into an existing buffer against ``np.copyto``;
* with ``--more``: the FP8 and FP4 flash presets (``fp8-e4m3``, ``sage3-fp4``) and the backward of
  ``triton-bf16`` against its forward (``return_stats=True``), each on the same inputs.

``--cpu-time`` times the one-thread figures by the process's CPU time instead of the wall clock: on a machine
shared with other jobs the wall clock counts the time the scheduler gives to others (the all-cores line stays
on the wall clock).

    python benchmarks/bench_engine.py [--seq 4096] [--head-dim 128] [--repeats 3] [--quick] [--cpu-time] [--more]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

# numpy's BLAS on one thread: the comparison is per core (set before numpy loads its BLAS)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numba  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import simfloat as sf  # noqa: E402
from simfloat.accumulate import Sequential, matmul, tensor_core  # noqa: E402
from simfloat.attention import flash, flash_backward, int8_flash, lse_from_stats, plan  # noqa: E402

_clock = time.perf_counter


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = _clock()
        fn()
        best = min(best, _clock() - t)
    return best


def _timed_wall(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _numpy_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    s = (q @ k.T) * np.float32(1.0 / np.sqrt(q.shape[-1]))
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return p @ v


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="seq 1024, one repeat (a smoke run)")
    ap.add_argument("--cpu-time", action="store_true", help="one-thread figures by process CPU time (a shared machine)")
    ap.add_argument("--more", action="store_true", help="also FP8 / FP4 presets and backward / forward")
    args = ap.parse_args(argv)
    global _clock
    if args.cpu_time:
        _clock = time.process_time
    if args.quick:
        args.seq, args.repeats = 1024, 1
    if args.seq < 1 or args.head_dim < 1 or args.repeats < 1:
        ap.error("--seq, --head-dim and --repeats must be >= 1")
    cores = numba.config.NUMBA_NUM_THREADS
    g = np.random.default_rng(0)
    clock = "process CPU time" if args.cpu_time else "wall clock"
    print(f"numpy {np.__version__}, numba {numba.__version__}, {cores} cores; best of {args.repeats} ({clock})")

    numba.set_num_threads(1)
    print("\nmatmul (one thread): M=128, K=1024, N=512")
    for name, model, fmt in (
        ("sm90 bf16", tensor_core("sm90", "bf16"), "bf16"),
        ("sm90 fp16", tensor_core("sm90", "fp16"), "fp16"),
        ("sm90 e4m3", tensor_core("sm90", "e4m3"), "e4m3"),
        ("sequential fp32", Sequential("float32"), "bf16"),
    ):
        a = sf.round(g.standard_normal((128, 1024)), fmt)
        b = sf.round(g.standard_normal((1024, 512)), fmt)
        matmul(a[:4], b, acc=model)
        matmul(a[:1], b[:, :8], acc=model, engine="reference")  # compile the reference outside its timing
        t = _best(lambda: matmul(a, b, acc=model), args.repeats)  # noqa: B023
        ref = _best(lambda: matmul(a[:4], b[:, :64], acc=model, engine="reference"), 1) * (128 / 4) * (512 / 64)  # noqa: B023
        print(f"  {name:16s} {a.size * b.shape[1] / t:9.3g} multiply-adds/s   ({ref / t:5.1f}x the scalar reference)")

    n, d = args.seq, args.head_dim
    q, k, v = (sf.round(g.standard_normal((1, n, d)), "bf16") for _ in range(3))
    q32, k32, v32 = (x[0].astype(np.float32) for x in (q, k, v))
    seq32 = plan("triton-bf16").replace(qk=Sequential("float32"), pv=Sequential("float32"), name="seq-fp32")
    runs = {
        "triton-bf16": lambda: flash(q, k, v, plan="triton-bf16"),
        "h200-bf16": lambda: flash(q, k, v, plan="h200-bf16"),
        "qk/pv Sequential(fp32)": lambda: flash(q, k, v, plan=seq32),
        "int8-reference": lambda: int8_flash(q, k, v),
    }
    if args.more:
        runs["fp8-e4m3"] = lambda: flash(q, k, v, plan="fp8-e4m3")
        runs["sage3-fp4"] = lambda: flash(q, k, v, plan="sage3-fp4")
    small = [x[:, :256] for x in (q, k, v)]
    for name in runs:  # compile outside the timings
        if name == "int8-reference":
            int8_flash(*small)
        elif name in ("fp8-e4m3", "sage3-fp4"):
            flash(*small, plan=name)
        else:
            flash(*small, plan=seq32 if name.startswith("qk") else name)
    _numpy_attention(q32, k32, v32)  # its first call pays the page faults of its seq x seq buffers
    t_np = _best(lambda: _numpy_attention(q32, k32, v32), args.repeats)
    print(f"\nflash, seq {n}, head dim {d}, one head, one thread; numpy fp32 attention {t_np:.3f} s")
    times = {}
    for name, fn in runs.items():
        times[name] = _best(fn, args.repeats)
        print(f"  {name:24s} {times[name]:8.2f} s   {times[name] / t_np:7.1f}x numpy")

    if args.more:
        do = sf.round(g.standard_normal(q.shape), "bf16")
        o, m_i, l_i = flash(q, k, v, plan="triton-bf16", return_stats=True)
        lse = lse_from_stats(m_i, l_i, plan="triton-bf16")
        o = sf.round(o, "bf16")
        o_s, m_s, l_s = flash(*small, plan="triton-bf16", return_stats=True)  # compile outside the timings
        lse_s = lse_from_stats(m_s, l_s, plan="triton-bf16")
        flash_backward(*small, sf.round(o_s, "bf16"), do[:, :256], lse_s, plan="triton-bf16")
        t_f = _best(lambda: flash(q, k, v, plan="triton-bf16", return_stats=True), args.repeats)
        t_b = _best(lambda: flash_backward(q, k, v, o, do, lse, plan="triton-bf16"), args.repeats)
        print(f"  backward triton-bf16     {t_b:8.2f} s   {t_b / t_f:7.2f}x its forward ({t_f:.2f} s)")

    numba.set_num_threads(cores)
    t_all = _timed_wall(runs["triton-bf16"], args.repeats)
    print(
        f"\ntriton-bf16 on {cores} threads: {t_all:.2f} s, speed-up {times['triton-bf16'] / t_all:.2f} "
        f"({times['triton-bf16'] / t_all / cores:.2f} x cores)"
    )

    numba.set_num_threads(1)
    x = g.standard_normal(1 << 24).astype(np.float32)
    out = np.empty_like(x)
    sf.round(x[:1024], "e4m3", out=out[:1024])
    t_r = _best(lambda: sf.round(x, "e4m3", out=out), args.repeats)
    t_c = _best(lambda: np.copyto(out, x), args.repeats)
    print(
        f"\nfloat32 -> e4m3 into out= (2**24 elements, one thread): {x.size / t_r / 1e9:.2f} G elem/s, "
        f"{t_c / t_r:.2f}x np.copyto"
    )


if __name__ == "__main__":
    main()
