"""Golden et al. (arXiv 2405.02803) claim 1-4, reproduced under explicit precision placements.

Claims: at BF16 flash attention deviates from the FP64 golden output (FP64 *baseline* attention) about 10x
more than baseline attention does (max |O - O_golden|); the gap shrinks with more mantissa bits; at fixed
tiles the deviation grows with the sequence length; larger tiles deviate less.

Golden et al. do not say which ops run in low precision, so every placement is explicit here:

* ``all-<fmt>``: every op and every stored value in <fmt> (dots accumulate sequentially in <fmt>): the running
  state (m, l, acc, alpha) is stored in low precision; baseline: ``all-<fmt>`` too.
* ``state-<fmt>``: the Triton kernel (``triton-<fmt>``) but with the state m_i, l_i, alpha, acc stored in
  <fmt>: each tile's P.V is a tensor-core dot from zero, added once into the <fmt> accumulator; baseline:
  ``pytorch-<fmt>``.
* ``triton-<fmt>``: the real kernel, fp32 state, P and the output in <fmt>; baseline: ``pytorch-<fmt>``
  (fp32 matmul accumulation rounded once into <fmt>, softmax in fp32).

Inputs: N(0, 1) rounded to <fmt>, one fixed seed per sequence length (the same draw for every format), head
dim 64, 64x64 tiles (the tile sweep: bf16 at N=2048). Each kernel computes every query row independently (no
causal mask), so ``--rows R`` evaluates R evenly spaced rows exactly; every metric is over those rows x
head dim.

Writes ``golden_flash_vs_baseline.csv`` (seq sweep), ``golden_tiles.csv`` (tile sweep) and
``golden_flash_vs_baseline.png`` into ``--out`` (default: experiments/results/). ``--smoke``: a tiny run.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
FORMATS = ("bf16", "fp16", "fp32")
PLACEMENTS = ("all", "state", "triton")
FULL = dict(
    seqs=(256, 512, 1024, 2048, 4096),
    d=64,
    block=64,
    rows=None,
    tile_seq=2048,
    formats=FORMATS,
    tiles=((16, 16), (32, 32), (64, 64), (128, 128), (256, 256), (64, 16), (16, 64), (128, 32), (32, 128)),
)
SMOKE = dict(
    seqs=(32, 64), d=16, block=16, rows=None, tile_seq=64, formats=("bf16", "fp32"), tiles=((8, 8), (16, 16), (32, 8))
)
_BIG = 1 << 40  # one chunk: the tile's dot from zero, then one rounding into the accumulator's format


def plans(placement: str, fmt: str) -> tuple:
    """(flash plan, baseline plan) of a placement and format."""
    from simfloat.accumulate import Chunked
    from simfloat.attention import plan

    if placement == "all":
        return plan(f"all-{fmt}"), plan(f"all-{fmt}")
    tri = plan(f"triton-{fmt}")
    if placement == "triton":
        return tri, plan(f"pytorch-{fmt}")
    if placement == "state":
        f = tri.p.fmt  # the low-precision format (triton-fp32 has fp32 everywhere: the same plan)
        pv = tri.pv if f.name == "float32" else Chunked(_BIG, tri.pv, outer_fmt=f)
        st = tri.replace(name=f"state-{fmt}", m_i=f, l_ij=f, l_i=f, alpha=f, acc=f, pv=pv)  # l_ij: in-tile sum in f
        return st, plan(f"pytorch-{fmt}")
    raise ValueError(f"unknown placement {placement!r}")


def _inputs(seq: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    g = np.random.default_rng([seed, seq])
    return g.standard_normal((seq, d)), g.standard_normal((seq, d)), g.standard_normal((seq, d))


def _placements(fmt: str) -> list[str]:
    return [p for p in PLACEMENTS if not (p == "state" and fmt == "fp32")]  # state-fp32 is triton-fp32


def _jobs(cfg: dict) -> dict[tuple, tuple]:
    """Every distinct kernel run: key -> (kernel, plan, seq, fmt, block_m, block_n)."""
    jobs: dict[tuple, tuple] = {}
    block, ts = cfg["block"], cfg["tile_seq"]
    for seq in cfg["seqs"]:
        for fmt in cfg["formats"]:
            jobs[("golden", seq, fmt)] = ("baseline", "fp64", seq, fmt, 0, 0)
            for pl in _placements(fmt):
                fp, bp = plans(pl, fmt)
                jobs[("flash", seq, fmt, pl, block, block)] = ("flash", fp, seq, fmt, block, block)
                jobs[("baseline", seq, fmt, pl)] = ("baseline", bp, seq, fmt, 0, 0)
    jobs.setdefault(("golden", ts, "bf16"), ("baseline", "fp64", ts, "bf16", 0, 0))
    for pl in _placements("bf16"):
        fp, bp = plans(pl, "bf16")
        jobs.setdefault(("baseline", ts, "bf16", pl), ("baseline", bp, ts, "bf16", 0, 0))
        for bm, bn in cfg["tiles"]:
            jobs.setdefault(("flash", ts, "bf16", pl, bm, bn), ("flash", fp, ts, "bf16", bm, bn))
    return jobs


def run(cfg: dict, seed: int, workers: int, progress: bool) -> tuple:
    """The seq sweep and the tile sweep as DataFrames."""
    import pandas as pd

    import simfloat as sf
    from simfloat.attention import baseline, flash
    from simfloat.attribution import deviation, select_rows

    jobs = _jobs(cfg)
    raw = {seq: _inputs(seq, cfg["d"], seed) for seq in sorted({j[2] for j in jobs.values()})}

    def one(item: tuple) -> tuple:
        key, (kernel, pl, seq, fmt, bm, bn) = item
        q, k, v = (sf.round(x, fmt) for x in raw[seq])  # the same draw, rounded to each format
        sel = select_rows(seq, cfg["rows"])
        qs = q if sel is None else q[sel]
        if kernel == "flash":
            return key, flash(qs, k, v, plan=pl, block_m=bm, block_n=bn)
        return key, baseline(qs, k, v, plan=pl)

    work = sorted(jobs.items(), key=lambda kv: -kv[1][2])  # longest first: better load balance
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(work), desc="golden experiment", unit="run", file=sys.stderr, delay=2.0)
    out: dict[tuple, np.ndarray] = {}
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:  # kernels release the GIL
        for key, o in pool.map(one, work):
            out[key] = o
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()

    def dev(key: tuple) -> dict[str, float]:
        return deviation(out[key], out[("golden", key[1], key[2])])

    block, ts = cfg["block"], cfg["tile_seq"]
    seq_rows = []
    for seq in cfg["seqs"]:
        for fmt in cfg["formats"]:
            for pl in _placements(fmt):
                fp, bp = plans(pl, fmt)
                head = dict(
                    format=fmt,
                    placement=pl,
                    seq=seq,
                    flash_plan=fp.name,
                    baseline_plan=bp.name,
                    block_m=block,
                    block_n=block,
                    steps=-(-seq // block),
                )
                seq_rows.append(_row(head, dev(("flash", seq, fmt, pl, block, block)), dev(("baseline", seq, fmt, pl))))
    tile_rows = []
    for pl in _placements("bf16"):
        fp, bp = plans(pl, "bf16")
        b = dev(("baseline", ts, "bf16", pl))
        for bm, bn in cfg["tiles"]:
            head = dict(
                format="bf16",
                placement=pl,
                seq=ts,
                flash_plan=fp.name,
                baseline_plan=bp.name,
                block_m=bm,
                block_n=bn,
                steps=-(-ts // bn),
            )
            tile_rows.append(_row(head, dev(("flash", ts, "bf16", pl, bm, bn)), b))
    return pd.DataFrame(seq_rows), pd.DataFrame(tile_rows)


def _row(head: dict[str, object], f: dict[str, float], b: dict[str, float]) -> dict[str, object]:
    row = dict(head)
    for name, dd in (("flash", f), ("baseline", b)):
        for m, x in dd.items():
            row[f"{name}_{m}"] = x
    row["ratio_max"] = f["max_abs"] / b["max_abs"] if b["max_abs"] > 0 else float("nan")
    row["ratio_rms"] = f["rms"] / b["rms"] if b["rms"] > 0 else float("nan")
    return row


def plot(seq_df: object, tile_df: object, path: Path, title: str) -> Path:
    """Top: max deviation vs N per format (flash solid, baseline dotted, one colour per placement); bottom:
    the flash/baseline ratio vs N, the ratio vs mantissa bits at the largest N, and bf16 deviation vs
    tiles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"all": "tab:orange", "state": "tab:green", "triton": "tab:blue"}
    fmts = list(dict.fromkeys(seq_df["format"]))
    fig, axes = plt.subplots(2, max(3, len(fmts)), figsize=(16, 9.5))
    for ax, fmt in zip(axes[0], fmts, strict=False):
        for pl in PLACEMENTS:
            g = seq_df[(seq_df["format"] == fmt) & (seq_df["placement"] == pl)]
            if not len(g):
                continue
            ax.plot(g["seq"], g["flash_max_abs"], marker="o", color=colors[pl], label=f"flash {g['flash_plan'].iat[0]}")
            if pl == "state":  # the same baseline (pytorch-<fmt>) as triton's: drawn once
                continue
            ax.plot(
                g["seq"],
                g["baseline_max_abs"],
                marker="s",
                mfc="none",
                ls=":",
                color=colors[pl],
                label=f"baseline {g['baseline_plan'].iat[0]}",
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(f"sequence length N ({seq_df['block_m'].iat[0]}x{seq_df['block_n'].iat[0]} tiles)")
        ax.set_ylabel("max |O - O_fp64|")
        ax.set_title(f"{fmt}: max deviation vs N")
        ax.legend(fontsize=7)
    ax = axes[1, 0]
    for fmt, ls in zip(fmts, ("-", "--", "-."), strict=False):
        for pl in PLACEMENTS:
            g = seq_df[(seq_df["format"] == fmt) & (seq_df["placement"] == pl)]
            if len(g):
                ax.plot(g["seq"], g["ratio_max"], marker="o", ls=ls, color=colors[pl], label=f"{pl}-{fmt}")
    ax.axhline(1, color="k", lw=0.8)
    ax.axhline(10, color="gray", lw=0.8, ls=":", label="Golden et al.: ~10x (bf16)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("max dev flash / max dev baseline")
    ax.set_title("Flash / baseline ratio vs N")
    ax.legend(fontsize=7, ncol=2)
    ax = axes[1, 1]
    big = seq_df[seq_df["seq"] == seq_df["seq"].max()]
    bits = {"bf16": 8, "fp16": 11, "fp32": 24}
    for pl in PLACEMENTS:
        g = big[big["placement"] == pl]
        if len(g):
            ax.plot([bits[f] for f in g["format"]], g["ratio_max"], marker="o", color=colors[pl], label=pl)
    ax.axhline(1, color="k", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(list(bits.values()), [f"{f} ({b})" for f, b in bits.items()])
    ax.set_xlabel("format (significand bits)")
    ax.set_ylabel("max dev flash / max dev baseline")
    ax.set_title(f"Ratio vs precision at N={int(big['seq'].max())}")
    ax.legend(fontsize=7)
    ax = axes[1, 2]
    tiles = dict.fromkeys(zip(tile_df["block_m"], tile_df["block_n"], strict=True))
    labels = [f"{bm}x{bn}" for bm, bn in tiles]
    for pl in PLACEMENTS:
        g = tile_df[tile_df["placement"] == pl]
        xs = [labels.index(f"{bm}x{bn}") for bm, bn in zip(g["block_m"], g["block_n"], strict=True)]
        ax.plot(xs, g["flash_max_abs"], marker="o", ls="none", color=colors[pl], label=f"flash {pl}-bf16")
        if pl != "state":  # state's baseline is triton's
            ax.axhline(
                g["baseline_max_abs"].iat[0],
                color=colors[pl],
                ls=":",
                lw=1,
                label=f"baseline {g['baseline_plan'].iat[0]}",
            )
    ax.set_xticks(range(len(labels)), labels, rotation=45)
    ax.set_yscale("log")
    ax.set_xlabel("tile block_m x block_n")
    ax.set_ylabel("max |O - O_fp64|")
    ax.set_title(f"bf16, N={int(tile_df['seq'].iat[0])}: deviation vs tiles")
    ax.legend(fontsize=7)
    for extra in axes[0, len(fmts) :]:
        extra.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="golden_flash_vs_baseline.py")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (seconds), for the test suite")
    ap.add_argument("--out", type=Path, default=HERE / "results", help="output folder (default experiments/results)")
    ap.add_argument("--rows", type=int, help="query rows evaluated per run, evenly spaced (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2, help="kernel runs in parallel (default 2)")
    args = ap.parse_args(argv)
    cfg = dict(SMOKE if args.smoke else FULL)
    if args.rows is not None:
        cfg["rows"] = args.rows
    t0 = time.perf_counter()
    seq_df, tile_df = run(cfg, args.seed, args.workers, progress=not args.smoke)
    args.out.mkdir(parents=True, exist_ok=True)
    seq_df.to_csv(args.out / "golden_flash_vs_baseline.csv", index=False)
    tile_df.to_csv(args.out / "golden_tiles.csv", index=False)
    rows = cfg["rows"] or "all"
    png = plot(
        seq_df,
        tile_df,
        args.out / "golden_flash_vs_baseline.png",
        f"Flash vs baseline attention vs the fp64 golden output (N(0,1) inputs, d={cfg['d']}, "
        f"{rows} query rows per run, seed {args.seed})",
    )
    elapsed = time.perf_counter() - t0
    cols = ["format", "placement", "seq", "flash_max_abs", "baseline_max_abs", "ratio_max", "ratio_rms"]
    print(seq_df[cols].to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    tcols = ["placement", "block_m", "block_n", "steps", "flash_max_abs", "flash_rms", "ratio_max"]
    print(tile_df[tcols].to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    print(f"wall time {elapsed:.0f} s; wrote {png} and CSVs in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
