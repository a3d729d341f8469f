"""Figures and the claims table of the Golden et al. study, from the study's CSV.

Analogues of the paper's Figures 3-6, each a PNG with the CSV of the values plotted (mean and standard
deviation over seeds of the max deviation from the golden output):

* ``fig3_format.{png,csv}``: deviation vs format, flash (each placement) and both baselines;
* ``fig4_seq.{png,csv}``: deviation vs N at fixed FA1 tiles;
* ``fig5_tiles.{png,csv}``: deviation vs block_n (FA1 tiles from M and d);
* ``fig6_swap.{png,csv}``: FA1 tiles vs block dimensions swapped vs square tiles;
* ``claims.csv``: per placement (normalization x l_ij x rounding) and baseline, the measured ratios behind the
  four claims and whether each holds: c1 the bf16 ratio (flash max deviation / baseline's, at the largest N
  and the middle M) within 5x-20x; c2 the ratio falls bf16 > fp16 > fp32; c3 the bf16 ratio grows with N
  at every step (``flash_dev_grows_with_N``: the flash deviation itself); c4 the bf16 flash deviation falls
  with block_n at every step for each d, is larger with block_m and block_n swapped, and within 5% with
  square tiles.

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


def claims(df):  # type: ignore[no-untyped-def]
    """Per placement and baseline: the claims' ratios and verdicts (see README "Golden et al., settled")."""
    import numpy as np
    import pandas as pd

    fa1 = df[df["tiles"] == "fa1"]
    n_max, m_mid = fa1["N"].max(), sorted(fa1["M"].unique())[len(fa1["M"].unique()) // 2]
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
            t = g[(g["fmt"] == "bf16") & (g["N"] == n_max)]
            by_bn = t.groupby(["d", "block_n"])["flash_max_abs"].mean().sort_index()
            c4_tiles = all(len(s) > 1 and bool((np.diff(s.to_numpy()) < 0).all()) for _, s in by_bn.groupby(level="d"))
            sw = df[
                (df["fmt"] == "bf16")
                & (df["N"] == n_max)
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
                    "ratio_bf16": bf16,
                    "ratio_fp16": float(by_fmt.get("fp16", np.nan)),
                    "ratio_fp32": float(by_fmt.get("fp32", np.nan)),
                    "ratio_bf16_by_N": " ".join(f"{n}:{v:.2f}" for n, v in ratio_n.items()),
                    "dev_bf16_by_N": " ".join(f"{n}:{v:.2e}" for n, v in by_n.items()),
                    "dev_bf16_by_d_block_n": " ".join(f"{d}/{n}:{v:.2e}" for (d, n), v in by_bn.items()),
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
    c = [k for k in out.columns if k.startswith("c") and k[1].isdigit()]
    out["claims_held"] = out[c].sum(axis=1)
    return out


def main(argv: Iterable[str] | None = None) -> int:
    """Write the four figures, their CSVs and claims.csv; returns 0."""
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
    if not args.all_rows:
        import tomllib

        from experiments.golden.study import config_hash, expand

        with args.spec.open("rb") as fh:
            wanted = {config_hash(c) for c in expand(tomllib.load(fh))}
        df = df[df["config_hash"].isin(wanted)]
    df = df.drop_duplicates("config_hash")  # a config run twice (two loops on one CSV) counts once
    df["placement"] = df.apply(_label, axis=1)
    args.out.mkdir(parents=True, exist_ok=True)
    fa1 = df[df["tiles"] == "fa1"]
    n_max = fa1["N"].max()
    d0 = sorted(fa1["d"].unique())[0]
    ms = sorted(fa1["M"].unique())
    m_mid = ms[len(ms) // 2]
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
    # Figure 4: vs N
    f4 = _agg(fa1[(fa1["fmt"] == "bf16") & (fa1["M"] == m_mid)], ["placement", "d", "N"], cols).sort_values("N")
    f4.to_csv(args.out / "fig4_seq.csv", index=False)
    ds = sorted(f4["d"].unique())
    fig, axes = plt.subplots(1, len(ds), figsize=(6 * len(ds), 4.5), squeeze=False)
    for ax, d in zip(axes[0], ds, strict=True):
        panel(ax, f4[f4["d"] == d], "N", f"bf16 deviation vs N (d={d}, M={m_mid}, FA1 tiles)", log_x=True)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(args.out / "fig4_seq.png", dpi=120)
    plt.close(fig)
    # Figure 5: vs tile size (block_n from M and d)
    f5 = _agg(fa1[(fa1["fmt"] == "bf16") & (fa1["N"] == n_max)], ["placement", "block_n"], cols).sort_values("block_n")
    f5.to_csv(args.out / "fig5_tiles.csv", index=False)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    panel(ax, f5, "block_n", f"bf16 deviation vs block_n = ceil(M / 4d) (N={n_max})")
    ax.set_xlabel("block_n (keys per tile)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(args.out / "fig5_tiles.png", dpi=120)
    plt.close(fig)
    # Figure 6: swapped and square tiles
    sw = df[(df["fmt"] == "bf16") & (df["M"] == m_mid) & (df["rounding"] == "nearest_even")]
    f6 = _agg(sw, ["placement", "d", "N", "tiles"], cols)
    f6.to_csv(args.out / "fig6_swap.csv", index=False)
    labs = sorted(f6["placement"].unique())
    fig, axes = plt.subplots(1, len(ds), figsize=(6 * len(ds), 4.5), squeeze=False)
    for ax, d in zip(axes[0], ds, strict=True):
        g = f6[(f6["d"] == d) & (f6["N"] == n_max)]
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
        ax.set_title(f"bf16 RN, N={n_max}, d={d}, M={m_mid}: FA1 tiles vs swapped vs square", fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out / "fig6_swap.png", dpi=120)
    plt.close(fig)
    claims(df).to_csv(args.out / "claims.csv", index=False)
    print(f"figures and claims.csv written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
