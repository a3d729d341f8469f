"""``simfloat attribute``: the main job. Seeded inputs rounded to the format, :func:`attribute` over the
plans, the console table, and the PNG + CSVs in the output folder. Options are declared in
:mod:`simfloat.cli`."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ANALYSIS", "DEFAULTS", "QUICK", "inputs", "run"]

#: The embedded default job (seq 2048, head dim 128, bf16, triton-bf16 and all-bf16 vs their baselines).
DEFAULTS = dict(seq=2048, head_dim=128, batch=1, heads=1, format="bf16", block_m=64, block_n=64, rows=None,
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
    """Run the job described by the parsed options: check the analysis extra and ``--out`` first, print the
    header (inputs, plans, then the number of runs) at once, show progress from the first run, print the table
    and write PNG, CSVs and summary.txt."""
    try:
        return _run(args)
    except (ValueError, TypeError, ImportError) as err:
        print(f"simfloat attribute: error: {err}", file=sys.stderr)
        return 2


#: What the job needs beyond numpy and numba (the ``analysis`` extra): tables, the plot, the progress bar.
ANALYSIS = ("pandas", "matplotlib", "tqdm")


def _check_analysis() -> None:
    import importlib

    missing = []
    for name in ANALYSIS:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ImportError(f"needs {', '.join(ANALYSIS)} (missing: {', '.join(missing)}): "
                          "pip install 'simfloat[analysis]'")


def _out_dir(path: str) -> Path:
    """The output folder, created and checked writable before any work."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {path}: exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as err:
        raise ValueError(f"--out {path}: cannot create or write the output folder: "
                         f"{err.strerror or err}") from None
    return out


class _Progress:
    """attribute's progress callback: the number of runs on stdout once known, then a tqdm bar on stderr."""

    def __init__(self) -> None:
        self.bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            from tqdm import tqdm

            print(f"{total} distinct kernel runs", flush=True)
            self.bar = tqdm(total=total, desc="kernel runs", unit="run", file=sys.stderr, leave=False)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    _check_analysis()
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
    baseline = _baseline_arg(args.baseline)
    from simfloat.attribution import baseline_plan_for

    pairs = {p: baseline_plan_for(p, baseline).name for p in plans}  # unknown plans and pairings stop here
    kv_heads = heads if getattr(args, "kv_heads", None) is None else int(args.kv_heads)
    from simfloat.attention._inputs import kv_group

    try:  # grouped-query attention: --kv-heads must divide --heads
        kv_group(heads, kv_heads)
    except ValueError as err:
        raise ValueError(f"--kv-heads {kv_heads} with --heads {heads}: {err}") from None
    out = _out_dir(args.out)
    shape_q, shape_kv = (batch, heads, seq, d), (batch, kv_heads, seq_k, d)
    evaluated = "all query rows" if rows is None or rows >= seq else f"{rows} of {seq} query rows"
    head = (f"simfloat attribute: {args.dist} inputs rounded to {fmt}, seed {args.seed}; q {shape_q}, k and v "
            f"{shape_kv}, {evaluated}{', causal' if args.causal else ''}; plans {', '.join(plans)} (baselines: "
            + ", ".join(f"{a}->{b}" for a, b in pairs.items()) + ")")
    print(head, flush=True)
    q, k, v = inputs(shape_q, shape_kv, args.dist, fmt, args.seed)
    import simfloat.attribution  # looked up at call time (tests replace it)

    progress = _Progress()
    try:
        res = simfloat.attribution.attribute(q, k, v, plans, baseline=baseline, block_m=bm, block_n=bn,
                                             causal=args.causal, tiles=tiles, block_ns=block_ns, rows=rows,
                                             trace_rows=args.trace_rows, progress=progress,
                                             bounds=getattr(args, "bounds", False))
    finally:
        progress.close()
    table = res.table()
    res.to_csv(out)
    png = res.plot(out / "attribution.png")
    elapsed = time.perf_counter() - t0
    tail = f"\n\nwall time {elapsed:.1f} s"
    (out / "summary.txt").write_text(head + "\n" + table + tail + "\n")
    print(table + tail)
    print(f"wrote {png}, {out}/*.csv, {out / 'summary.txt'}")
    return 0
