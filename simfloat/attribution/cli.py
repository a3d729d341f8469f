"""``simfloat attribute``: the main job. Seeded inputs rounded to the format, :func:`attribute` over the
plans, the console table, and the PNG + CSVs in the output folder. Options are declared in
:mod:`simfloat.cli`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["DEFAULTS", "QUICK", "inputs", "run"]

#: The embedded default job (seq 2048, head dim 128, bf16, triton-bf16 and all-bf16 vs their baselines).
DEFAULTS = dict(seq=2048, head_dim=128, batch=1, heads=1, format="bf16", block_m=64, block_n=64, rows=64,
                tiles=[(32, 64), (128, 64), (64, 128), (128, 128)], block_ns=[16, 32, 64, 128, 256, 2048])
#: --quick: small sizes, for tests and a first look (a few seconds).
QUICK = dict(seq=80, head_dim=16, batch=1, heads=2, format="bf16", block_m=16, block_n=16, rows=None,
             tiles=[(8, 16), (16, 32)], block_ns=[8, 16, 32, 80])


def inputs(shape_q: tuple[int, ...], shape_kv: tuple[int, ...], dist: str, fmt: str,
           seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded q, k, v rounded (nearest-even) into ``fmt``.

    ``normal``: N(0, 1); ``uniform``: U[0, 1) (torch.rand, as INT-FlashAttention's accuracy test);
    ``outlier``: N(0, 1) + N(0, 100) * Bernoulli(0.001) (FlashAttention-3's FP8 test; N(0, 100) has variance
    100, i.e. standard deviation 10).
    """
    import simfloat as sf

    g = np.random.default_rng(seed)

    def draw(shape: tuple[int, ...]) -> np.ndarray:
        if dist == "normal":
            x = g.standard_normal(shape)
        elif dist == "uniform":
            x = g.random(shape)
        elif dist == "outlier":
            x = g.standard_normal(shape) + 10.0 * g.standard_normal(shape) * (g.random(shape) < 0.001)
        else:
            raise ValueError(f"unknown distribution {dist!r}; choose normal, uniform or outlier")
        return sf.round(x, fmt)

    return draw(shape_q), draw(shape_kv), draw(shape_kv)


def _pick(args: argparse.Namespace, name: str) -> object:
    value = getattr(args, name, None)
    if value is not None:
        return value
    return (QUICK if args.quick else DEFAULTS)[name]


def _baseline_arg(items: list[str] | None) -> object:
    if not items:
        return None
    pairs: dict[str, str] = {}
    single = None
    for it in items:
        if "=" in it:
            a, b = it.split("=", 1)
            if not a or not b:
                raise ValueError(f"--baseline takes FLASH_PLAN=BASELINE_PLAN or BASELINE_PLAN, got {it!r}")
            pairs[a] = b
        else:
            single = it
    if single is not None and pairs:
        raise ValueError("--baseline: give either one plan for all or FLASH_PLAN=BASELINE_PLAN pairs, "
                         "not both")
    return single if single is not None else pairs


def run(args: argparse.Namespace) -> int:
    """Run the job described by the parsed options; print the table; write PNG, CSVs and summary.txt."""
    try:
        return _run(args)
    except (ValueError, TypeError) as err:
        print(f"simfloat attribute: error: {err}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from simfloat.attribution import attribute

    t0 = time.perf_counter()
    seq = int(_pick(args, "seq"))  # type: ignore[call-overload]
    seq_k = int(args.seq_k) if args.seq_k is not None else seq
    d = int(_pick(args, "head_dim"))  # type: ignore[call-overload]
    batch, heads = int(_pick(args, "batch")), int(_pick(args, "heads"))  # type: ignore[call-overload]
    fmt = str(_pick(args, "format"))
    plans = args.plan or [f"triton-{fmt}", f"all-{fmt}"]
    rows = args.rows if args.rows is not None else (None if args.causal else _pick(args, "rows"))
    if rows == "all":
        rows = None
    if rows is not None and args.causal:
        raise ValueError("--rows cannot be combined with --causal (a causal row's keys depend on its "
                         "position)")
    bm, bn = int(_pick(args, "block_m")), int(_pick(args, "block_n"))  # type: ignore[call-overload]
    tiles = _pick(args, "tiles")
    block_ns = args.block_ns if args.block_ns is not None else [
        b for b in _pick(args, "block_ns") if b <= seq_k] or [seq_k]  # type: ignore[attr-defined]
    if args.block_ns is None and max(block_ns) < seq_k:
        block_ns.append(seq_k)  # always include the single-step (one kv block) point
    q, k, v = inputs((batch, heads, seq, d), (batch, heads, seq_k, d), args.dist, fmt, args.seed)
    res = attribute(q, k, v, plans, baseline=_baseline_arg(args.baseline), block_m=bm, block_n=bn,
                    causal=args.causal, tiles=tiles, block_ns=block_ns, rows=rows, progress=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    head = (f"simfloat attribute: {args.dist} inputs rounded to {fmt}, seed {args.seed}; "
            f"plans {', '.join(plans)} (baselines: "
            + ", ".join(f"{a}->{b}" for a, b in res.meta["baselines"].items()) + ")")
    text = head + "\n" + res.table()
    res.to_csv(out)
    png = res.plot(out / "attribution.png")
    elapsed = time.perf_counter() - t0
    text += f"\n\nwall time {elapsed:.1f} s"
    (out / "summary.txt").write_text(text + "\n")
    print(text)
    print(f"wrote {png}, {out}/*.csv, {out / 'summary.txt'}")
    return 0
