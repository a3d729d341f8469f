"""Figures and the claims table of the Golden et al. study, from the study's CSV.

Analogues of the paper's Figures 3-6, each a PNG with the CSV of the values plotted (mean and standard
deviation over seeds of the max deviation from the golden output):

* ``fig3_format.{png,csv}``: deviation vs format, flash (each placement) and both baselines;
* ``fig4_seq.{png,csv}``: deviation vs N at fixed FA1 tiles (top) and the ratio flash / ``pytorch-<f>``
  vs N (bottom);
* ``fig5_tiles.{png,csv}``: deviation vs block_n (FA1 tiles from M and d), one panel per d;
* ``fig6_swap.{png,csv}``: FA1 tiles vs block dimensions swapped vs square tiles;
* ``claims.csv``: per placement (normalization x l_ij x rounding) and baseline, the measured ratios behind the
  four claims and whether each holds: c1 the bf16 ratio (flash max deviation / baseline's, at the largest N
  and the middle M) within 5x-20x; c2 the ratio falls bf16 > fp16 > fp32; c3 the bf16 ratio grows with N
  at every step (``flash_dev_grows_with_N``: the flash deviation itself); c4 the bf16 flash deviation falls
  with block_n at every step for each d (at ``N_tiles``, the largest N that ran every M), is larger with
  block_m and block_n swapped, and within 5% with square tiles (at ``N_swap``, the largest N that ran every
  tile shape);
* ``coverage.csv``: per N, M and tile shape, the runs in the CSV against the spec's configs (``complete``),
  so a study stopped early says which part of the grid it holds.

Only the rows of the spec's configs are used (``--spec``; an older CSV may hold more; ``--all-rows``: all).

``python -m experiments.golden.figures [--csv PATH] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLACEMENT = ["normalization", "l_ij", "rounding"]
FMTS = ["bf16", "fp16", "fp32"]


def _label(row: object) -> str:
    norm = "FA1" if row["normalization"] == "per_step" else "FA2"  # type: ignore[index]
    lij = "seq" if row["l_ij"] == "sequential" else "fp32-once"  # type: ignore[index]
    rnd = "RN" if row["rounding"] == "nearest_even" else "RZ"  # type: ignore[index]
    return f"{norm} l_ij {lij} {rnd}"


def _agg(df, keys: list[str], cols: list[str]):  # type: ignore[no-untyped-def]
    g = df.groupby(keys)[cols].agg(["mean", "std"])
    g.columns = [f"{c}_{s}" for c, s in g.columns]
    return g.reset_index()


def _largest_n_with(df, col: str, values: Iterable[object]) -> int:  # type: ignore[no-untyped-def]
    """The largest N at which the rows of ``df`` hold every one of ``values`` in column ``col`` (the largest N
    of all when none does)."""
    want = set(values)
    for n in sorted(df["N"].unique(), reverse=True):
        if want <= set(df.loc[df["N"] == n, col]):
            return int(n)
    return int(df["N"].max())


def coverage(df, configs: list[dict] | None = None):  # type: ignore[no-untyped-def]
    """Per N, M and tiles: ``runs`` (rows of ``df``), ``configs`` (of the spec; the runs when None),
    ``seeds`` (distinct seeds run) and ``complete`` (every config ran)."""
    import pandas as pd

    keys = ["N", "M", "tiles"]
    have = df.groupby(keys).agg(runs=("config_hash", "size"), seeds=("seed", "nunique"))
    if configs is None:
        want = have["runs"].rename("configs")
    else:
        want = pd.DataFrame(configs).groupby(keys).size().rename("configs")
    out = pd.concat([have, want], axis=1).fillna(0).astype(int).reset_index()
    out["complete"] = out["runs"] == out["configs"]
    return out[keys + ["runs", "configs", "seeds", "complete"]]


def claims(df):  # type: ignore[no-untyped-def]
    """Per placement and baseline: the claims' ratios and verdicts (docs/results/golden.md)."""
    import numpy as np
    import pandas as pd

    fa1 = df[df["tiles"] == "fa1"]
    n_max, m_mid = fa1["N"].max(), sorted(fa1["M"].unique())[len(fa1["M"].unique()) // 2]
    n_tiles = _largest_n_with(fa1[fa1["fmt"] == "bf16"], "M", fa1["M"].unique())
    mid = df[(df["fmt"] == "bf16") & (df["M"] == m_mid)]
    n_swap = _largest_n_with(mid, "tiles", df["tiles"].unique())
    rows = []
    for key, g in fa1.groupby(PLACEMENT):
        for base in ("pytorch", "all"):
            r = f"ratio_{base}"
            at = g[(g["N"] == n_max) & (g["M"] == m_mid)]
            by_fmt = at.groupby("fmt")[r].mean()
            bf16 = float(by_fmt.get("bf16", np.nan))
            c1 = 5.0 <= bf16 <= 20.0  # "about 10x"
            c2 = bool(by_fmt.get("bf16", np.nan) > by_fmt.get("fp16", np.nan) > by_fmt.get("fp32", np.nan))
            b = g[(g["fmt"] == "bf16") & (g["M"] == m_mid)]
            by_n = b.groupby("N")["flash_max_abs"].mean().sort_index()
            ratio_n = b.groupby("N")[r].mean().sort_index()
            c3 = bool(len(ratio_n) > 1 and (np.diff(ratio_n.to_numpy()) > 0).all())
            c3_dev = bool(len(by_n) > 1 and (np.diff(by_n.to_numpy()) > 0).all())
            t = g[(g["fmt"] == "bf16") & (g["N"] == n_tiles)]
            by_bn = t.groupby(["d", "block_n"])["flash_max_abs"].mean().sort_index()
            c4_tiles = all(len(s) > 1 and bool((np.diff(s.to_numpy()) < 0).all()) for _, s in by_bn.groupby(level="d"))
            sw = df[
                (df["fmt"] == "bf16")
                & (df["N"] == n_swap)
                & (df["M"] == m_mid)
                & (df[PLACEMENT] == pd.Series(dict(zip(PLACEMENT, key, strict=True)))).all(axis=1)
            ]
            by_t = sw.groupby("tiles")["flash_max_abs"].mean()
            c4_swap = bool("swapped" in by_t and by_t["swapped"] > by_t["fa1"])
            c4_square = bool("square" in by_t and abs(by_t["square"] / by_t["fa1"] - 1) < 0.05)
            rows.append(
                {
                    **dict(zip(PLACEMENT, key, strict=True)),
                    "baseline": base,
                    "N": int(n_max),
                    "M": int(m_mid),
                    "ratio_bf16": bf16,
                    "ratio_fp16": float(by_fmt.get("fp16", np.nan)),
                    "ratio_fp32": float(by_fmt.get("fp32", np.nan)),
                    "ratio_bf16_by_N": " ".join(f"{n}:{v:.2f}" for n, v in ratio_n.items()),
                    "dev_bf16_by_N": " ".join(f"{n}:{v:.2e}" for n, v in by_n.items()),
                    "N_tiles": n_tiles,
                    "dev_bf16_by_d_block_n": " ".join(f"{d}/{n}:{v:.2e}" for (d, n), v in by_bn.items()),
                    "N_swap": n_swap,
                    "swap_over_fa1": float(by_t["swapped"] / by_t["fa1"]) if "swapped" in by_t else np.nan,
                    "square_over_fa1": float(by_t["square"] / by_t["fa1"]) if "square" in by_t else np.nan,
                    "c1_about_10x": c1,
                    "c2_shrinks_with_mantissa": c2,
                    "c3_grows_with_N": c3,
                    "flash_dev_grows_with_N": c3_dev,
                    "c4_larger_tiles_smaller": c4_tiles,
                    "c4_swap_larger": c4_swap,
                    "c4_square_unchanged": c4_square,
                }
            )
    out = pd.DataFrame(rows)
    c = [k for k in out.columns if k[:1] == "c" and k[1:2].isdigit()]
    out["claims_held"] = out[c].sum(axis=1)
    return out


def main(argv: Iterable[str] | None = None) -> int:
    """Write the four figures, their CSVs, claims.csv and coverage.csv; returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=HERE / "results" / "golden.csv")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--spec", type=Path, default=HERE / "spec.toml", help="keep only this spec's configs")
    ap.add_argument("--all-rows", action="store_true", help="use every row of the CSV (no spec filter)")
    args = ap.parse_args(None if argv is None else list(argv))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    df = pd.read_csv(args.csv)
    configs = None
    if not args.all_rows:
        import tomllib

        from experiments.golden.study import config_hash, expand

        with args.spec.open("rb") as fh:
            configs = expand(tomllib.load(fh))
        wanted = {config_hash(c) for c in configs}
        df = df[df["config_hash"].isin(wanted)]
    df = df.drop_duplicates("config_hash")  # a config run twice (two loops on one CSV) counts once
    df["placement"] = df.apply(_label, axis=1)
    args.out.mkdir(parents=True, exist_ok=True)
    fa1 = df[df["tiles"] == "fa1"]
    n_max = fa1["N"].max()
    d0 = sorted(fa1["d"].unique())[0]
    ms = sorted(fa1["M"].unique())
    m_mid = ms[len(ms) // 2]
    n_tiles = _largest_n_with(fa1[fa1["fmt"] == "bf16"], "M", ms)
    n_swap = _largest_n_with(df[(df["fmt"] == "bf16") & (df["M"] == m_mid)], "tiles", df["tiles"].unique())
    cov = coverage(df, configs)
    cov.to_csv(args.out / "coverage.csv", index=False)
    cols = ["flash_max_abs", "pytorch_max_abs", "all_max_abs"]

    def panel(ax, data, x: str, title: str, log_x: bool = False) -> None:  # type: ignore[no-untyped-def]
        for lab, g in data.groupby("placement"):
            ax.errorbar(g[x], g["flash_max_abs_mean"], yerr=g["flash_max_abs_std"], label=lab, marker="o", capsize=2)
        cols_b = ["pytorch_max_abs_mean", "all_max_abs_mean"]
        for suffix, style in (("RN", ":"), ("RZ", "-.")):
            sub = data[data["placement"].str.endswith(suffix)]
            if len(sub):
                base = sub.groupby(x)[cols_b].mean().reset_index()
                if suffix == "RN":
                    ax.plot(base[x], base["pytorch_max_abs_mean"], "k--", label="baseline pytorch-<f> (RN)")
                ax.plot(base[x], base["all_max_abs_mean"], "k" + style, label=f"baseline all-<f> {suffix}")
        ax.set_yscale("log")
        if log_x:
            ax.set_xscale("log", base=2)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("max |O - O_golden|")

    # Figure 3: vs format
    f3 = _agg(fa1[(fa1["N"] == n_max) & (fa1["M"] == m_mid) & (fa1["d"] == d0)], ["placement", "fmt"], cols)
    f3["fmt_i"] = f3["fmt"].map({f: i for i, f in enumerate(FMTS)})
    f3 = f3.sort_values(["placement", "fmt_i"])
    f3.to_csv(args.out / "fig3_format.csv", index=False)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    panel(ax, f3, "fmt_i", f"deviation vs format (N={n_max}, d={d0}, M={m_mid}, FA1 tiles)")
    ax.set_xticks(range(len(FMTS)), FMTS)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(args.out / "fig3_format.png", dpi=120)
    plt.close(fig)
    # Figure 4: vs N (top: deviation; bottom: ratio to pytorch-<f>)
    f4_rows = fa1[(fa1["fmt"] == "bf16") & (fa1["M"] == m_mid)]
    f4 = _agg(f4_rows, ["placement", "d", "N"], cols + ["ratio_pytorch", "ratio_all"]).sort_values("N")
    f4.to_csv(args.out / "fig4_seq.csv", index=False)
    ds = sorted(f4["d"].unique())
    fig, axes = plt.subplots(2, len(ds), figsize=(6 * len(ds), 8.5), squeeze=False)
    for j, d in enumerate(ds):
        ax = axes[0][j]
        panel(ax, f4[f4["d"] == d], "N", f"bf16 deviation vs N (d={d}, M={m_mid}, FA1 tiles)", log_x=True)
        ax = axes[1][j]
        for lab, g in f4[f4["d"] == d].groupby("placement"):
            ax.errorbar(g["N"], g["ratio_pytorch_mean"], yerr=g["ratio_pytorch_std"], label=lab, marker="o", capsize=2)
        ax.axhspan(5, 20, color="0.9", zorder=0)
        ax.text(0.02, 0.03, "grey: 5x-20x (claim 1, about 10x)", transform=ax.transAxes, fontsize=7)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sorted(f4["N"].unique()), [str(n) for n in sorted(f4["N"].unique())])
        ax.set_title(f"bf16 ratio flash / pytorch-<f> vs N (d={d}, M={m_mid})", fontsize=9)
        ax.set_ylabel("flash max dev / baseline max dev")
        ax.set_xlabel("N (queries = keys)")
        axes[0][j].set_xticks(sorted(f4["N"].unique()), [str(n) for n in sorted(f4["N"].unique())])
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=7)
    fig.tight_layout(rect=(0, 0, 0.82, 1))
    fig.savefig(args.out / "fig4_seq.png", dpi=120)
    plt.close(fig)
    # Figure 5: vs tile size (block_n from M and d; one panel per d, where the block_n differ), at the largest N
    # that ran every M
    f5 = _agg(fa1[(fa1["fmt"] == "bf16") & (fa1["N"] == n_tiles)], ["placement", "d", "M", "block_n"], cols)
    f5 = f5.sort_values(["d", "block_n"])
    f5["M_i"] = f5["M"].map({m: i for i, m in enumerate(ms)})  # evenly spaced: 384 and 391 keys apart
    f5.to_csv(args.out / "fig5_tiles.csv", index=False)
    fig, axes = plt.subplots(1, len(ds), figsize=(5 * len(ds) + 2.5, 4.5), squeeze=False)
    for ax, d in zip(axes[0], ds, strict=True):
        sub = f5[f5["d"] == d]
        panel(ax, sub, "M_i", f"bf16 deviation vs block_n = ceil(M / 4d) (N={n_tiles}, d={d})")
        ticks = sub.drop_duplicates("M_i").sort_values("M_i")
        ax.set_xticks(ticks["M_i"], [f"{b}\n(M={m})" for b, m in zip(ticks["block_n"], ticks["M"], strict=True)])
        ax.set_xlabel("block_n (keys per tile)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=7)
    fig.tight_layout(rect=(0, 0, 0.79, 1))
    fig.savefig(args.out / "fig5_tiles.png", dpi=120)
    plt.close(fig)
    # Figure 6: swapped and square tiles
    sw = df[(df["fmt"] == "bf16") & (df["M"] == m_mid) & (df["rounding"] == "nearest_even")]
    f6 = _agg(sw, ["placement", "d", "N", "tiles"], cols)
    f6.to_csv(args.out / "fig6_swap.csv", index=False)
    labs = sorted(f6["placement"].unique())
    fig, axes = plt.subplots(1, len(ds), figsize=(6 * len(ds), 4.5), squeeze=False)
    for ax, d in zip(axes[0], ds, strict=True):
        g = f6[(f6["d"] == d) & (f6["N"] == n_swap)]
        for j, t in enumerate(("fa1", "swapped", "square")):
            h = g[g["tiles"] == t].set_index("placement").reindex(labs)
            ax.bar(
                [i + 0.27 * j for i in range(len(labs))],
                h["flash_max_abs_mean"],
                0.27,
                yerr=h["flash_max_abs_std"],
                label=t,
            )
        ax.set_xticks([i + 0.27 for i in range(len(labs))], labs, rotation=30, fontsize=6, ha="right")
        ax.set_yscale("log")
        ax.set_title(f"bf16 RN, N={n_swap}, d={d}, M={m_mid}: FA1 tiles vs swapped vs square", fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out / "fig6_swap.png", dpi=120)
    plt.close(fig)
    claims(df).to_csv(args.out / "claims.csv", index=False)
    part = cov[~cov["complete"]]
    if len(part):
        print(
            "partial grid (runs/configs): "
            + ", ".join(f"N={r.N} M={r.M} {r.tiles}: {r.runs}/{r.configs}" for r in part.itertuples())
        )
    print(f"figures, claims.csv and coverage.csv written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
