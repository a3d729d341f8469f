"""FP8 attention error against sequence length: single-level vs two-level P.V accumulation.

The sm90 FP8 tensor core keeps about 13 fraction bits in its accumulator (``tensor_core("sm90", "e4m3")``:
blocks of 32 products, e8m13 results). A kernel that passes its running output into the MMA
(``tl.dot(p, v, acc)``, FlashAttention-3's FP8 path: ``pv_update="into_acc"``) rounds that running sum to
13 bits every 32 keys, over the whole sequence; one that starts each key tile's P.V from zero and adds it to an
fp32 accumulator (``pv_update="separate"`` or ``"scaled"``: two-level accumulation, as SageAttention2 and the
fixed FA3) rounds only within a tile. Every number here comes from simfloat's quantized-flash emulator
(:func:`simfloat.attention.quant_flash`), against float64 attention on the same fp16 inputs.

Methods (Q, K, V fp16 inputs; P cast to e4m3 without a scale; fp32 softmax state):

* ``FA3 per-tensor, single-level``: the ``fp8-e4m3`` preset (one scale per tensor, acc into the MMA);
* ``FA3 per-tensor, two-level``: the same with ``pv_update="separate"``;
* ``FA3 per-block Q/K, single-level``: per-tile Q/K scales, per-tensor V, acc into the MMA;
* ``FA3 per-block, two-level``: the ``fp8-e4m3-block`` preset (per-tile Q/K/V scales, ``"scaled"``);
* ``Sage2, single-level`` / ``two-level``: the ``sage2-int8-fp8-single`` / ``sage2-int8-fp8`` presets
  (SageAttention2's INT8 QK^T: K smoothed by its mean key in the plan's ``k_smooth`` op, Q INT8 per warp of
  32 rows, K INT8 per key tile, exact integer QK^T; V e4m3 per channel, P e4m3 with the fixed scale 1/448;
  P.V into the MMA or two-level).
* ``Sage3 FP4, two-level``: the ``sage3-fp4`` preset (SageAttention3's FP4 attention: K smoothed, Q, K, V
  NVFP4, P two-level (per-row fp32 scale onto [0, 448 * 6], then NVFP4), both products on the Blackwell nvf4
  MMA model, each key tile's P.V from zero). It runs up to ``sage3_max_seq`` (the smoke configuration keeps it
  short).
* ``fp16 flash``: the ``fp16-flash`` preset (the fp16 Triton flash kernel), for scale.

Rows: query rows are independent in non-causal attention, so each problem evaluates ``--tiles`` whole query
tiles of ``block_m`` rows (spread over the sequence, always including the tile holding Q's largest |value|):
every per-tensor and per-tile scale is then the one the full problem uses, and the rows computed are bit for
bit the rows the full problem gives. Keys are never subsampled.

Run ``python experiments/fp8_long_context.py`` (default: seq 1k..32k, head dim 128) or ``--smoke`` (seconds).
Results: ``experiments/results/fp8_long_context.{csv,md,png}``, rows appended as each problem finishes; a rerun
computes only the (problem, method) rows the CSV lacks.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from collections.abc import Callable

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from experiments.int8_error import INPUTS, make_inputs, metrics, reference64  # noqa: E402
from simfloat.attention import Plan, quant_flash, quant_plan  # noqa: E402
from simfloat.attention.quantized import Quant  # noqa: E402

__all__ = ["METHODS", "main", "methods", "query_tiles", "run_problem"]

SEED = 20261201
RESULTS = os.path.join(_ROOT, "experiments", "results")
FULL = {
    "seqs": (1024, 2048, 4096, 8192, 16384, 32768),
    "head_dim": 128,
    "tiles": 2,
    "block_m": 128,
    "block_n": 128,
    "sage3_max_seq": 32768,
}
SMOKE = {"seqs": (64, 128), "head_dim": 32, "tiles": 1, "block_m": 32, "block_n": 32, "sage3_max_seq": 64}
_INTS = ("seq", "head_dim", "rows")
#: methods run up to cfg["sage3_max_seq"] only (block-scaled FP4)
CAPPED = ("Sage3 FP4, two-level",)


def methods() -> dict[str, Plan]:
    """Method name -> its plan (a Plan with quantizers)."""
    fp32 = "float32"
    e4m3 = "float8_e4m3fn"
    fa3 = quant_plan("fp8-e4m3")
    blk = Quant("float", "per-block", fmt=e4m3, pre=fp32)
    tens = Quant("float", "per-tensor", fmt=e4m3, pre=fp32)
    return {
        "FA3 per-tensor, single-level": fa3,
        "FA3 per-tensor, two-level": fa3.replace(name="fp8-e4m3-two-level", pv_update="separate"),
        "FA3 per-block Q/K, single-level": fa3.replace(name="fp8-e4m3-qkblock", q_quant=blk, k_quant=blk, v_quant=tens),
        "FA3 per-block, two-level": quant_plan("fp8-e4m3-block"),
        "Sage2, single-level": quant_plan("sage2-int8-fp8-single"),
        "Sage2, two-level": quant_plan("sage2-int8-fp8"),
        "Sage3 FP4, two-level": quant_plan("sage3-fp4"),
        "fp16 flash": quant_plan("fp16-flash"),
    }


METHODS = tuple(methods())


def query_tiles(q: np.ndarray, block_m: int, tiles: int) -> np.ndarray:
    """Row indices of ``tiles`` whole query tiles, evenly spread, including the tile holding max |q|."""
    n_tiles = -(-q.shape[0] // block_m)
    chosen = {int(t) for t in np.linspace(0, n_tiles - 1, tiles).round()}
    chosen.add(int(np.unravel_index(np.abs(q).argmax(), q.shape)[0]) // block_m)
    rows = [np.arange(t * block_m, min((t + 1) * block_m, q.shape[0])) for t in sorted(chosen)]
    return np.concatenate(rows)


def _field(key: str, value: str) -> str | int | float:
    """A CSV field as its type."""
    if key in ("input", "method", "plan"):
        return value
    return int(value) if key in _INTS else float(value)


def todo(n: int, cfg: dict) -> tuple[str, ...]:
    """The methods that run at sequence length n."""
    return tuple(m for m in METHODS if m not in CAPPED or n <= cfg["sage3_max_seq"])


def run_problem(
    kind: str, n: int, cfg: dict, log: Callable[[str], None], only: tuple[str, ...] | None = None
) -> list[dict]:
    """The methods (all, or ``only``) on one (input kind, seq) problem: a row of metrics per method."""
    d, bm, bn = cfg["head_dim"], cfg["block_m"], cfg["block_n"]
    q, k, v = make_inputs(kind, n, d, seed=SEED)
    rows_idx = query_tiles(q, bm, cfg["tiles"])
    qs = q[rows_idx]
    ref = reference64(qs, k, v)
    out = []
    for name, pl in methods().items():
        if only is not None and name not in only:
            continue
        t0 = time.perf_counter()
        o = quant_flash(qs, k, v, plan=pl, block_m=bm, block_n=bn)
        row = {"input": kind, "seq": n, "head_dim": d, "rows": len(rows_idx), "method": name, "plan": pl.name}
        row |= metrics(o, ref)
        row["rel_l1"] = float(np.abs(np.asarray(o, np.float64) - ref).sum() / np.abs(ref).sum())
        row["seconds"] = round(time.perf_counter() - t0, 2)
        out.append(row)
        log(f"  {kind:<8} seq {n:>6} {name:<34} rmse {row['rmse']:.3e} rel_l1 {row['rel_l1']:.3e} ({row['seconds']} s)")
    return out


def _markdown(rows: list[dict], cfg: dict) -> str:
    import pandas as pd

    df = pd.DataFrame(rows)
    lines = [
        "# FP8 attention error vs sequence length (simfloat emulation)",
        "",
        f"head dim {cfg['head_dim']}, tiles {cfg['block_m']}x{cfg['block_n']}, {cfg['tiles']}+ query tiles per "
        "problem (bit for bit the full problem's rows), keys all. Relative L1 error against float64 attention.",
        "",
    ]
    for kind in INPUTS:
        sub = df[df.input == kind]
        if sub.empty:
            continue
        piv = sub.pivot(index="seq", columns="method", values="rel_l1")[[m for m in METHODS if m in set(sub.method)]]
        lines += [f"## {kind}", "", "| seq | " + " | ".join(piv.columns) + " |", "|---" * (len(piv.columns) + 1) + "|"]
        for seq, r in piv.iterrows():
            lines.append(f"| {seq} | " + " | ".join(f"{x:.2e}" if x == x else "-" for x in r.values) + " |")
        lines.append("")
    return "\n".join(lines)


def _plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    df = pd.DataFrame(rows)
    fig, axes = plt.subplots(1, len(INPUTS), figsize=(5 * len(INPUTS), 4), sharey=False)
    for ax, kind in zip(np.atleast_1d(axes), INPUTS, strict=True):
        sub = df[df.input == kind]
        for m in METHODS:
            s = sub[sub.method == m].sort_values("seq")
            if not s.empty:
                style = "-" if "two-level" in m else ("--" if "single" in m else ":")
                ax.plot(s.seq, s.rel_l1, style, marker="o", ms=3, label=m)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(kind)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("relative L1 error vs float64")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, str]:
    """Run the experiment; returns the paths written. Options: ``--smoke``, ``--out DIR``, ``--max-seq N``,
    ``--quiet``. Rows are appended to the CSV as each problem finishes; a rerun skips finished problems."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (seconds)")
    ap.add_argument("--out", default=RESULTS, help="results folder (default experiments/results)")
    ap.add_argument("--max-seq", type=int, default=None, help="stop at this sequence length")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    cfg = dict(SMOKE if args.smoke else FULL)
    if args.max_seq is not None:
        cfg["seqs"] = tuple(s for s in cfg["seqs"] if s <= args.max_seq)
    log: Callable[[str], None] = (lambda m: None) if args.quiet else (lambda m: print(m, flush=True))
    os.makedirs(args.out, exist_ok=True)
    stem = "fp8_long_context_smoke" if args.smoke else "fp8_long_context"
    paths = {k: os.path.join(args.out, f"{stem}.{k}") for k in ("csv", "md", "png")}
    rows: list[dict] = []
    if os.path.exists(paths["csv"]):
        with open(paths["csv"]) as f:
            rows = [{k: _field(k, v) for k, v in r.items()} for r in csv.DictReader(f)]
    done = {(r["input"], int(r["seq"]), r["method"]) for r in rows if int(r["head_dim"]) == cfg["head_dim"]}
    t_all = time.perf_counter()
    try:
        for n in cfg["seqs"]:
            for kind in INPUTS:
                missing = tuple(m for m in todo(n, cfg) if (kind, n, m) not in done)
                if not missing:
                    continue
                log(f"[{kind} seq {n}] ({time.perf_counter() - t_all:.0f} s)")
                new = run_problem(kind, n, cfg, log, only=missing)
                write_header = not os.path.exists(paths["csv"])
                with open(paths["csv"], "a", newline="") as f:
                    w = csv.DictWriter(f, fieldnames=list(new[0]))
                    if write_header:
                        w.writeheader()
                    w.writerows(new)
                rows += new
    except KeyboardInterrupt:
        log(f"interrupted: {len(rows)} rows kept in {paths['csv']}")
    if rows:
        with open(paths["md"], "w") as f:
            f.write(_markdown(rows, cfg))
        _plot(rows, paths["png"])
    log(f"done in {time.perf_counter() - t_all:.0f} s: {', '.join(os.path.relpath(p) for p in paths.values())}")
    return paths


if __name__ == "__main__":
    main()
    sys.exit(0)
