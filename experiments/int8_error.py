"""Error table of INT8 (INT-FlashAttention) and FP8 (FlashAttention-3 style) attention, emulated bit for bit.

Every row is computed by simfloat's emulator of the Triton kernel it names (simfloat_gpu/kernels/int8_attention.py,
simfloat_gpu/kernels/fp8_attention.py, simfloat_gpu/kernels/flash_attention.py: cross-validated bit for bit under
simfloat_gpu.interpreter.faithful()),
on one attention problem of ``batch * heads`` independent heads (each drawn with its own seed) per input
distribution, sequence length and head dim: seq 1024 and 2048 with every method, 4096 to 16384 with INT8 and
FA3's FP8 or INT8 alone (``FULL["long"]``: the emulation's cost grows as seq**2):

* inputs (Q, K, V all drawn alike, then cast to fp16, the kernels' input dtype): ``normal`` N(0, 1);
  ``uniform`` U[0, 1) (INT-FlashAttention's accuracy test); ``outlier`` N(0, 1) + N(0, 10**2) *
  Bernoulli(0.001) (FlashAttention-3's, "N(0, 100)" read as variance 100);
* references: float64 attention on the same fp16 inputs, and fp16 standard attention (simfloat's baseline
  plan ``pytorch-fp16``: fp32-accumulated matmuls rounded to fp16, softmax in fp32, P cast to fp16; computed
  here by a vectorized copy of that plan, equal to ``simfloat.attention.baseline(plan="pytorch-fp16")`` bit
  for bit);
* metrics (:func:`simfloat.metrics.error_metrics`): MRE = mean |out - ref| / (|ref| + 1e-5) over all elements
  and over the last 4 elements only (the INT-FlashAttention code's variant), RMSE, max |out - ref|, cosine
  similarity; and mean/std of |out - ref|, relative L1, SNR in dB;
* attribution: for the INT8 and FP8 plans, each quantizer alone (``Plan.isolate``: everything else
  exact), all quantizers with exact arithmetic (``arith_fp64``) and the full plan with one dot's accumulation
  made exact (``Plan.ablate``), RMSE against float64.

Run ``python experiments/int8_error.py`` (the full table) or ``--smoke`` (seconds).
Results: ``experiments/results/int8_error.{csv,md,png}`` and ``int8_attribution.csv``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from simfloat._jit import jit  # noqa: E402
from simfloat._parallel import run_rows  # noqa: E402
from simfloat.attention import EXACT, QUANTIZERS, fp8_flash, int8_flash, quant_flash, quant_plan  # noqa: E402
from simfloat.attention import _kernels as _k  # noqa: E402
from simfloat.attention.plan import OpParams, plan  # noqa: E402
from simfloat.formats import format as sformat  # noqa: E402
from simfloat.rounding import round as sround  # noqa: E402

__all__ = [
    "INPUTS",
    "LONG_METHODS",
    "METHODS",
    "fp16_standard_attention",
    "make_heads",
    "make_inputs",
    "main",
    "metrics",
    "reference64",
]

SEED = 0
LONG_METHODS = ("INT8 (reference)", "FP8 e4m3 per-block + incoherent (FA3)")
#: "configs": (seq, head_dim, batch * heads) run with every method; "long": (seq, head_dim, batch * heads,
#: methods) run with a subset (the emulation's cost grows as seq**2)
FULL = {
    "configs": ((1024, 128, 4), (2048, 128, 2)),
    "long": (
        (4096, 128, 2, LONG_METHODS),
        (8192, 64, 2, ("INT8 (reference)",)),
        (16384, 64, 1, ("INT8 (reference)",)),
    ),
    "attribution_seq": 1024,
    "attribution_dim": 128,
}
SMOKE = {
    "configs": ((96, 32, 2),),
    "long": ((128, 32, 2, LONG_METHODS),),
    "attribution_seq": 96,
    "attribution_dim": 32,
}
INPUTS = ("normal", "uniform", "outlier")
RESULTS = os.path.join(_ROOT, "experiments", "results")


# ---------------------------------------------------------------------------------------------------------
# inputs and references
# ---------------------------------------------------------------------------------------------------------


def make_inputs(kind: str, n: int, d: int, seed: int = SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q, K, V of shape (n, d), float32 arrays holding fp16 values."""
    if kind not in INPUTS:
        raise ValueError(f"unknown input kind {kind!r}; known: {INPUTS}")
    rng = np.random.default_rng([seed, n, d, INPUTS.index(kind)])
    out = []
    for _ in range(3):
        if kind == "normal":
            x = rng.standard_normal((n, d))
        elif kind == "uniform":
            x = rng.random((n, d))
        else:
            x = rng.standard_normal((n, d)) + rng.normal(0.0, 10.0, (n, d)) * (rng.random((n, d)) < 0.001)
        out.append(x.astype(np.float16).astype(np.float32))
    return out[0], out[1], out[2]


def make_heads(kind: str, heads: int, n: int, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q, K, V of shape (heads, n, d): head h is ``make_inputs(kind, n, d, seed=SEED + h)``."""
    per = [make_inputs(kind, n, d, seed=SEED + h) for h in range(heads)]
    q, k, v = (np.stack([x[i] for x in per]) for i in range(3))
    return q, k, v


def reference64(q: np.ndarray, k: np.ndarray, v: np.ndarray, rows: int = 2048) -> np.ndarray:
    """softmax(q k^T / sqrt(d)) v in float64 for (..., n, d) arrays, ``rows`` query rows at a time."""
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    out = np.empty(q64.shape[:-1] + (v64.shape[-1],))
    kt = np.swapaxes(k64, -1, -2)
    for r in range(0, q64.shape[-2], rows):
        s = (q64[..., r : r + rows, :] @ kt) / math.sqrt(q.shape[-1])
        p = np.exp(s - s.max(-1, keepdims=True))
        out[..., r : r + rows, :] = (p / p.sum(-1, keepdims=True)) @ v64
    return out


@jit
def _std_rows(lo, hi, q, kt, v, out, sm16, o16, o32):  # type: ignore[no-untyped-def]
    """Rows [lo, hi) of the pytorch-fp16 baseline plan (fp16 inputs: every product is exact in fp32, so the
    plan's fused fp32 steps are plain float32 additions; loops vectorize over independent outputs)."""
    d, n_k = kt.shape
    dv = v.shape[1]
    acc = np.empty(n_k, np.float32)
    x = np.empty(n_k, np.float32)
    o = np.empty(dv, np.float32)
    for i in range(lo, hi):
        acc[:] = 0.0
        for kk in range(d):  # qk: Sequential fp32 from 0, k in order
            a = q[i, kk]
            for j in range(n_k):
                acc[j] = acc[j] + a * kt[kk, j]
        m = -np.inf
        for j in range(n_k):  # outer fp16 rounding, scale in fp16, softmax input cast (fp32, exact)
            s16 = _k.rnd(np.float64(acc[j]), o16)
            y = _k.mul(s16, sm16, o16)
            x[j] = np.float32(y)
            m = max(m, y)
        m32 = np.float32(m)
        tot = np.float32(0.0)
        for j in range(n_k):  # e = fp32(exp(fp32(x - m))); row sum in key order
            dj = x[j] - m32
            e = np.float32(_k.exp(np.float64(dj), o32))
            x[j] = e
            tot = tot + e
        if tot == 0.0:
            tot = np.float32(1.0)
        o[:] = 0.0
        for j in range(n_k):  # P = fp32(e / l), read as fp16 by the fp32-accumulated P.V
            pj = np.float32(_k.rnd(np.float64(x[j] / tot), o16))
            for c in range(dv):
                o[c] = o[c] + pj * v[j, c]
        for c in range(dv):
            out[i, c] = _k.rnd(np.float64(o[c]), o16)


def fp16_standard_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``simfloat.attention.baseline(q, k, v, plan="pytorch-fp16")`` (non-causal, default scale), vectorized:
    the same roundings in the same order, for inputs holding fp16 values (2-D (seq, d) arrays)."""
    for x in (q, k, v):
        if not np.array_equal(sround(np.asarray(x, np.float64), "float16"), x):
            raise ValueError("fp16_standard_attention needs inputs holding fp16 values")
    scale = 1.0 / math.sqrt(q.shape[-1])
    sm16 = plan("pytorch-fp16").params(scale).sm_scale
    o16 = OpParams(sformat("float16").params, 0)
    o32 = OpParams(sformat("float32").params, 0)
    q32 = np.ascontiguousarray(q, np.float32)
    kt = np.ascontiguousarray(np.asarray(k, np.float32).T)
    v32 = np.ascontiguousarray(v, np.float32)
    out = np.empty((q.shape[0], v.shape[1]))
    run_rows(_std_rows, q.shape[0], q32, kt, v32, out, sm16, o16, o32, min_rows=16)
    return out


def metrics(out: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """:func:`simfloat.metrics.error_metrics` over all elements (flattened), under this table's column names:
    ``mre_all``, ``mre_last4``, ``rmse``, ``max_abs``, ``cos`` (cosine similarity), then ``mean_abs``,
    ``std_abs``, ``rel_l1`` and ``snr_db``."""
    from simfloat.metrics import error_metrics

    m = error_metrics(out, ref)
    return {
        "mre_all": m["mre"],
        "mre_last4": m["mre_last4"],
        "rmse": m["rmse"],
        "max_abs": m["max_abs"],
        "cos": m["cos_sim"],
        "mean_abs": m["mean_abs"],
        "std_abs": m["std_abs"],
        "rel_l1": m["rel_l1"],
        "snr_db": m["snr_db"],
    }


# ---------------------------------------------------------------------------------------------------------
# the rows
# ---------------------------------------------------------------------------------------------------------


def _bf16(x: np.ndarray) -> np.ndarray:
    return sround(x, "bfloat16")


Method = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
#: name -> (function of (q, k, v), the quantized preset or None, incoherent)
METHODS: dict[str, tuple[Method, str | None, bool]] = {
    "INT8 (reference)": (lambda q, k, v: int8_flash(q, k, v, plan="int8-reference"), "int8-reference", False),
    "INT8 (consistent row sum)": (
        lambda q, k, v: int8_flash(q, k, v, plan="int8-consistent"),
        "int8-consistent",
        False,
    ),
    "half-INT8": (lambda q, k, v: int8_flash(q, k, v, plan="half-int8"), "half-int8", False),
    "FP8 e4m3 per-tensor": (lambda q, k, v: fp8_flash(q, k, v, fmt="e4m3"), "fp8-e4m3", False),
    "FP8 e5m2 per-tensor": (lambda q, k, v: fp8_flash(q, k, v, fmt="e5m2"), "fp8-e5m2", False),
    "FP8 e4m3 per-block": (lambda q, k, v: fp8_flash(q, k, v, scaling="per-block"), "fp8-e4m3-block", False),
    "FP8 e4m3 per-tensor + incoherent": (lambda q, k, v: fp8_flash(q, k, v, incoherent=True), "fp8-e4m3", True),
    "FP8 e4m3 per-block + incoherent (FA3)": (
        lambda q, k, v: fp8_flash(q, k, v, scaling="per-block", incoherent=True),
        "fp8-e4m3-block",
        True,
    ),
    "FP8 e5m2 no scaling": (lambda q, k, v: fp8_flash(q, k, v, fmt="e5m2", scaling="none"), "fp8-e5m2-unscaled", False),
    "FP16 flash (triton-fp16)": (lambda q, k, v: quant_flash(q, k, v, plan="fp16-flash"), None, False),
    "BF16 flash (triton-bf16)": (
        lambda q, k, v: quant_flash(_bf16(q), _bf16(k), _bf16(v), plan="bf16-flash"),
        None,
        False,
    ),
}
ATTRIBUTED = (
    "INT8 (reference)",
    "half-INT8",
    "FP8 e4m3 per-tensor",
    "FP8 e4m3 per-block",
    "FP8 e4m3 per-block + incoherent (FA3)",
    "FP8 e5m2 no scaling",
)


def _table(cfg: dict, log: Callable[[str], None], save: Callable[[list[dict]], None]) -> list[dict]:
    """Every configuration's rows; ``save`` gets the rows so far after each problem."""
    rows: list[dict] = []
    runs = [(n, d, h, tuple(METHODS)) for n, d, h in cfg["configs"]] + list(cfg["long"])
    for n, d, heads, methods in runs:
        for kind in INPUTS:
            q, k, v = make_heads(kind, heads, n, d)
            t0 = time.perf_counter()
            r64 = reference64(q, k, v)
            r16 = np.stack([fp16_standard_attention(q[h], k[h], v[h]) for h in range(heads)])
            base = {"input": kind, "seq": n, "head_dim": d, "heads": heads}
            rows.append(
                {
                    **base,
                    "method": "FP16 standard (pytorch-fp16)",
                    "reference": "fp64",
                    **metrics(r16, r64),
                    "seconds": time.perf_counter() - t0,
                }
            )
            for name in methods:
                t = time.perf_counter()
                out = METHODS[name][0](q, k, v)
                dt = time.perf_counter() - t
                for ref_name, ref in (("fp64", r64), ("fp16-standard", r16)):
                    rows.append({**base, "method": name, "reference": ref_name, **metrics(out, ref), "seconds": dt})
            log(f"{kind:8s} seq {n:5d} d {d:3d} x{heads}: {time.perf_counter() - t0:6.1f} s")
            save(rows)
    return rows


def _attribution(cfg: dict, log: Callable[[str], None]) -> list[dict]:
    rows = []
    n, d = cfg["attribution_seq"], cfg["attribution_dim"]
    for kind in INPUTS:
        q, k, v = make_inputs(kind, n, d)
        r64 = reference64(q, k, v)
        t0 = time.perf_counter()
        for name in ATTRIBUTED:
            _, preset, incoherent = METHODS[name]
            assert preset is not None
            pl = quant_plan(preset)
            variants = [("full plan", pl), ("quantizers only (fp64 arithmetic)", pl.arith_fp64())]
            variants += [(f"only {op}", pl.isolate(op)) for op in QUANTIZERS if getattr(pl, op).quantizes]
            variants += [
                (f"full plan, exact {op} accumulation", pl.ablate(op))
                for op in ("qk", "pv")
                if getattr(pl, op) != EXACT
            ]
            for label, p in variants:
                out = quant_flash(q, k, v, plan=p, incoherent=incoherent)
                rows.append(
                    {"input": kind, "seq": n, "head_dim": d, "method": name, "variant": label, **metrics(out, r64)}
                )
        log(f"attribution {kind:8s} seq {n} d {d}: {time.perf_counter() - t0:6.1f} s")
    return rows


# ---------------------------------------------------------------------------------------------------------
# outputs
# ---------------------------------------------------------------------------------------------------------


def _fmt(x: float) -> str:
    return "-" if x != x else f"{x:.2e}"


def _markdown(table, attr, cfg: dict, seconds: float) -> str:  # type: ignore[no-untyped-def]
    import pandas as pd

    shapes = ", ".join(f"{n}/{d} x{h}" for n, d, h in cfg["configs"])
    longs = "; ".join(f"{n}/{d} x{h}: {', '.join(m)}" for n, d, h, m in cfg["long"])
    lines = [
        "# INT8 / FP8 attention error (simfloat emulation)",
        "",
        f"seeds: head h of a problem uses seed {SEED} + h; seq/head_dim x batch*heads: {shapes} (every "
        f"method); {longs} (and the FP16 standard reference); total run time {seconds:.0f} s. Generated by "
        "experiments/int8_error.py.",
        "",
    ]
    t64 = table[table["reference"] == "fp64"]
    for metric, title in (("rmse", "RMSE vs float64"), ("mre_all", "MRE (all elements) vs float64")):
        lines += [f"## {title}", ""]
        piv = t64.pivot_table(index="method", columns=["input", "seq", "head_dim", "heads"], values=metric, sort=False)
        cols = [f"{i} {s}/{d} x{h}" for i, s, d, h in piv.columns]
        lines += ["| method | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
        for method, row in piv.iterrows():
            lines.append(f"| {method} | " + " | ".join(_fmt(x) for x in row.values) + " |")
        lines.append("")
    # the INT-FlashAttention comparison: uniform inputs, FP16 standard reference, INT8 vs FP8 (e5m2 unscaled)
    lines += ["## INT-FlashAttention's comparison (uniform inputs, reference fp16 standard attention)", ""]
    u = table[(table["input"] == "uniform") & (table["reference"] == "fp16-standard")]
    lines += [
        "| seq/d | method | MRE last 4 | MRE all | RMSE | MRE all below FP8 e5m2 no scaling's by |",
        "|---|---|---|---|---|---|",
    ]
    for (s, d), g in u.groupby(["seq", "head_dim"], sort=True):
        if not (g["method"] == "FP8 e5m2 no scaling").any():
            continue
        fp8 = g[g["method"] == "FP8 e5m2 no scaling"]["mre_all"].iloc[0]
        for method in (
            "INT8 (reference)",
            "INT8 (consistent row sum)",
            "half-INT8",
            "FP8 e5m2 no scaling",
            "FP8 e4m3 per-tensor",
            "FP16 flash (triton-fp16)",
        ):
            r = g[g["method"] == method].iloc[0]
            lines.append(
                f"| {s}/{d} | {method} | {_fmt(r['mre_last4'])} | {_fmt(r['mre_all'])} | "
                f"{_fmt(r['rmse'])} | {100 * (1 - r['mre_all'] / fp8):.0f}% |"
            )
    lines.append("")
    n, d, _ = cfg["configs"][-1]
    lines += [
        f"## INT8 (reference) error below each FP8 variant's: 1 - RMSE_INT8 / RMSE_FP8 (seq {n}, d {d}, vs float64)",
        "",
    ]
    big = t64[(t64["seq"] == n) & (t64["head_dim"] == d)]
    fp8 = [m for m in dict.fromkeys(big["method"]) if m.startswith("FP8")]
    lines += ["| input | " + " | ".join(fp8) + " |", "|---|" + "---|" * len(fp8)]
    for kind in INPUTS:
        g = big[big["input"] == kind].set_index("method")["rmse"]
        lines.append(
            f"| {kind} | " + " | ".join(f"{100 * (1 - g['INT8 (reference)'] / g[m]):.0f}%" for m in fp8) + " |"
        )
    lines.append("")
    lines += [
        f"## Attribution (seq {cfg['attribution_seq']}, head dim {cfg['attribution_dim']}): RMSE vs "
        "float64 of each quantizer alone",
        "",
    ]
    piv = attr.pivot_table(index=["method", "variant"], columns="input", values="rmse", sort=False)
    lines += ["| method | variant | " + " | ".join(piv.columns) + " |", "|---|---|" + "---|" * len(piv.columns)]
    for (method, variant), row in piv.iterrows():
        lines.append(f"| {method} | {variant} | " + " | ".join(_fmt(x) for x in row.values) + " |")
    lines.append("")
    lines += [
        "Full metrics (MRE all / last 4, RMSE, max abs, cosine; both references; run time per row): "
        "int8_error.csv and int8_attribution.csv."
    ]
    del pd
    return "\n".join(lines) + "\n"


def _plot(table, attr, cfg: dict, path: str) -> None:  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n, d, heads = cfg["configs"][-1]
    t = table[(table["reference"] == "fp64") & (table["seq"] == n) & (table["head_dim"] == d)]
    methods = list(dict.fromkeys(t["method"]))
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(18, 6.5), gridspec_kw={"width_ratios": [1.1, 1]})
    x = np.arange(len(methods))
    for i, kind in enumerate(INPUTS):
        vals = [t[(t["method"] == m) & (t["input"] == kind)]["rmse"].iloc[0] for m in methods]
        ax0.bar(x + (i - 1) * 0.27, vals, 0.27, label=kind)
    ax0.set_xticks(x, methods, rotation=60, ha="right", fontsize=8)
    ax0.set_yscale("log")
    ax0.set_ylabel("RMSE vs float64")
    ax0.set_title(f"seq {n}, head dim {d}, batch*heads {heads}")
    ax0.legend()
    a = attr[attr["input"] == "outlier"]
    labels = list(dict.fromkeys(a["variant"]))
    meths = list(dict.fromkeys(a["method"]))
    xx = np.arange(len(meths))
    w = 0.8 / len(labels)
    for i, lab in enumerate(labels):
        vals = [
            float(a[(a["method"] == m) & (a["variant"] == lab)]["rmse"].iloc[0])
            if ((a["method"] == m) & (a["variant"] == lab)).any()
            else np.nan
            for m in meths
        ]
        ax1.bar(xx + (i - (len(labels) - 1) / 2) * w, vals, w, label=lab)
    ax1.set_xticks(xx, meths, rotation=30, ha="right", fontsize=8)
    ax1.set_yscale("log")
    ax1.set_ylim(bottom=1e-6)  # half-INT8's V "quantizer" (an fp16 cast of fp16 inputs) is exact
    ax1.set_ylabel("RMSE vs float64")
    ax1.set_title(f"attribution, outlier inputs (seq {cfg['attribution_seq']}, d {cfg['attribution_dim']})")
    ax1.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, str]:
    """Run the experiment; returns the paths written.

    Options: ``--smoke`` (tiny sizes, seconds), ``--out DIR`` (default experiments/results), ``--quiet``.
    """
    import pandas as pd

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (a few seconds), for tests")
    ap.add_argument("--out", default=RESULTS, help="output directory")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--replot", action="store_true", help="redraw the PNG from the CSVs of an earlier run")
    args = ap.parse_args(argv)
    cfg = SMOKE if args.smoke else FULL
    if args.replot:
        stem = os.path.join(args.out, "int8_error_smoke" if args.smoke else "int8_error")
        png = stem + ".png"
        attr = pd.read_csv(stem.replace("error", "attribution") + ".csv")
        _plot(pd.read_csv(stem + ".csv"), attr, cfg, png)
        return {"png": png}
    log = (lambda s: None) if args.quiet else (lambda s: print(s, flush=True))
    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    stem = "int8_error_smoke" if args.smoke else "int8_error"
    partial = os.path.join(args.out, f"{stem}.partial.csv")
    table = pd.DataFrame(_table(cfg, log, lambda rows: pd.DataFrame(rows).to_csv(partial, index=False)))
    os.remove(partial)
    attr = pd.DataFrame(_attribution(cfg, log))
    seconds = time.perf_counter() - t0
    paths = {
        "csv": os.path.join(args.out, f"{stem}.csv"),
        "md": os.path.join(args.out, f"{stem}.md"),
        "png": os.path.join(args.out, f"{stem}.png"),
        "attribution": os.path.join(args.out, f"{stem.replace('error', 'attribution')}.csv"),
    }
    table.to_csv(paths["csv"], index=False, float_format="%.6e")
    attr.to_csv(paths["attribution"], index=False, float_format="%.6e")
    with open(paths["md"], "w") as f:
        f.write(_markdown(table, attr, cfg, seconds))
    _plot(table, attr, cfg, paths["png"])
    log(f"done in {seconds:.0f} s: " + ", ".join(paths.values()))
    return paths


if __name__ == "__main__":
    main()
