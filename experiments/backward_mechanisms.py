"""Two mechanisms of low-precision attention training error, reproduced on the emulated FA2 forward + backward.

A. "Why Low-Precision Transformer Training Fails" (arXiv 2510.04212): when several keys tie for a row's maximum,
   P is exactly 1 at each of them; with V one-signed the BF16 rounding of O = PV / l is biased, and the bias enters
   the gradient through delta = rowsum(dO * O). Inputs: the first ``t`` keys identical and aligned with every query
   (so they tie for the maximum of every row), the other keys N(0, 1), V = -(|N(0, 1)| + 0.1) (one-signed), dO
   N(0, 1), all bf16; plan triton-bf16. Per number of ties t: the mean signed error (bias) of O and of delta
   against float64, with O stored in bf16 (the kernel's default) and in fp32 ("delta from fp32 O": the forward
   plan's ``out`` in fp32), and the relative max error of dQ; and the same with the paper's fix in the forward
   (``Plan.tie_shift=2``: a tile max tied by two or more keys is doubled, so P < 1 at the ties), O in bf16.
B. "Broken Symmetry in BF16 Attention" (arXiv 2609.34272): the row sums of dS are zero in exact arithmetic, so
   dQ_i = scale * sum_j dS_ij k_j does not depend on the mean key; rounding dS to BF16 breaks the zero sum and
   leaks scale * (sum_j dS_ij) * mean(k) into dQ. Inputs: keys with a common offset (mean key of norm ~ 16),
   N(0, 1) otherwise. For triton-bf16, the same with dS kept in fp32 (``ds_cast`` ablated) and with the FMA of the
   P recomputation split in two roundings (``contract=False``): the component of the dQ error along the mean key
   (mean |c_i| with dQ_err_i . k_mean = c_i |k_mean|^2, relative to max |dQ|), before and after the rank-one
   correction dQ_i -= scale * rowsum_i * k_mean with the row sums of the emulated dS (a float64 replica of steps
   B2-B8 of the plan from the emulator's own lse and delta; it uses float32 matmuls for the scores, so it
   approximates the tensor-core dots).

Writes ``backward_ties.csv``, ``backward_leak.csv`` and ``backward_mechanisms.png`` into ``--out`` (default:
experiments/results/). ``--smoke``: a tiny run.

    python experiments/backward_mechanisms.py [--smoke] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import simfloat as sf  # noqa: E402
from simfloat.attention import backward_plan, flash, flash_backward, lse_from_stats, plan  # noqa: E402

SEED = 0
TIES = (1, 2, 4, 8, 16, 32, 64)
#: part A's forward variants: (label, O's storage format, forward plan)
VARIANTS = (
    ("delta from bf16 O", "bf16", plan("triton-bf16")),
    ("delta from fp32 O", "fp32", plan("triton-bf16").replace(out="float32")),
    ("max-shift fix, bf16 O", "bf16", plan("triton-bf16").replace(tie_shift=2.0)),
)


def _grads64(q, k, v, do, scale):
    """(o, delta, dq, dk, dv) of softmax(scale q k^T) v in float64 (numpy, no mask)."""
    s = (q @ np.swapaxes(k, -1, -2)) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = p @ v
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    delta = (do * o).sum(-1)
    ds = p * (dp - delta[..., None])
    return o, delta, scale * ds @ k, scale * np.swapaxes(ds, -1, -2) @ q, dv


def ties_inputs(t: int, n_q: int, n_k: int, d: int, rng: np.random.Generator):
    u = np.zeros(d)
    u[: d // 4] = 1.0
    q = 0.5 * u + 0.3 * rng.standard_normal((n_q, d))
    k = rng.standard_normal((n_k, d))
    k[:t] = 1.5 * u  # identical keys: exactly tied scores, the row maximum of every row
    v = -(np.abs(rng.standard_normal((n_k, d))) + 0.1)
    do = rng.standard_normal((n_q, d))
    return tuple(sf.round(x, "bf16") for x in (q, k, v, do))


def part_a(n_q: int, n_k: int, d: int, block: int) -> list[dict]:
    rows = []
    scale = 1.0 / math.sqrt(d)
    for t in TIES:
        if t >= n_k:  # every key tied: dQ is exactly 0, no relative error
            continue
        q, k, v, do = ties_inputs(t, n_q, n_k, d, np.random.default_rng([SEED, t]))
        o64, delta64, dq64, _, _ = _grads64(q, k, v, do, scale)
        for variant, o_fmt, fp in VARIANTS:
            o, m, l = flash(q, k, v, plan=fp, block_m=block, block_n=block, return_stats=True)  # noqa: E741
            lse = lse_from_stats(m, l, plan="triton-bf16")
            dq, _, _, delta = flash_backward(
                q,
                k,
                v,
                o,
                do,
                lse,
                plan=backward_plan("triton-bf16").replace(grad="float32"),
                block_m=block,
                block_n=block,
                return_delta=True,
            )
            rows.append(
                dict(
                    ties=t,
                    variant=variant,
                    o_format=o_fmt,
                    o_bias=float(np.mean(o - o64)),
                    o_bias_rel=float(np.mean(o - o64) / np.mean(np.abs(o64))),
                    delta_bias=float(np.mean(delta - delta64)),
                    delta_bias_rel=float(np.mean(delta - delta64) / np.mean(np.abs(delta64))),
                    dq_err_rel=float(np.abs(dq - dq64).max() / np.abs(dq64).max()),
                )
            )
    return rows


def _ds_rowsum(q, k, v, do, lse, delta, bp) -> np.ndarray:
    """Row sums of dS as the plan computes it (a float64 replica of B2-B8, fp32 matmul scores)."""
    pp = bp.params(1.0 / math.sqrt(q.shape[-1]))
    s = (q.astype(np.float32) @ k.astype(np.float32).T).astype(np.float64)
    x = (
        sf.round(s * pp.qk_scale - lse[:, None], "float32")
        if bp.contract
        else sf.round(sf.round(s * pp.qk_scale, "float32") - lse[:, None], "float32")
    )
    p = sf.round(np.exp2(x), "float32")
    dp = (do.astype(np.float32) @ v.astype(np.float32).T).astype(np.float64)
    ds = sf.round(p * sf.round(dp - delta[:, None], "float32"), "float32")
    ds = sf.round(ds, bp.ds_cast.fmt)
    return ds.sum(-1)


def part_b(n_q: int, n_k: int, d: int, block: int) -> list[dict]:
    rng = np.random.default_rng([SEED, 99])
    offset = np.zeros(d)
    offset[::2] = 16.0 / math.sqrt(d / 2)
    q = sf.round(rng.standard_normal((n_q, d)), "bf16")
    k = sf.round(offset + rng.standard_normal((n_k, d)), "bf16")
    v, do = (sf.round(rng.standard_normal((n, d)), "bf16") for n in (n_k, n_q))
    scale = 1.0 / math.sqrt(d)
    _, _, dq64, _, _ = _grads64(q, k, v, do, scale)
    kbar = k.mean(0)
    rows = []
    base = backward_plan("triton-bf16").replace(grad="float32")
    variants = {
        "triton-bf16": (plan("triton-bf16"), base),
        "dS in fp32": (plan("triton-bf16"), base.replace(ds_cast="float32")),
        "no FMA": (plan("triton-bf16").replace(contract=False), base.replace(contract=False)),
    }
    for name, (fp, bp) in variants.items():
        o, m, l = flash(q, k, v, plan=fp, block_m=block, block_n=block, return_stats=True)  # noqa: E741
        lse = lse_from_stats(m, l, plan=bp)
        dq, _, _, delta = flash_backward(q, k, v, o, do, lse, plan=bp, block_m=block, block_n=block, return_delta=True)
        rs = _ds_rowsum(q, k, v, do, lse, delta, bp)
        dq_fix = dq - bp.params(scale).sm_scale * rs[:, None] * kbar[None, :]
        norm = np.abs(dq64).max()
        for label, g in (("emulated", dq), ("rank-one corrected", dq_fix)):
            c = (g - dq64) @ kbar / (kbar @ kbar)
            rows.append(
                dict(
                    variant=name,
                    dq=label,
                    leak=float(np.mean(np.abs(c)) * np.linalg.norm(kbar) / norm),
                    dq_err_rel=float(np.abs(g - dq64).max() / norm),
                    ds_rowsum_mean_abs=float(np.mean(np.abs(rs))),
                )
            )
    return rows


def _write(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _plot(path: Path, a: list[dict], b: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 4, figsize=(18, 4))
    for (variant, _, _), style in zip(VARIANTS, ("o-", "s--", "^:"), strict=True):
        r = [x for x in a if x["variant"] == variant]
        ts = [x["ties"] for x in r]
        ax[0].plot(ts, [x["o_bias_rel"] for x in r], style, label=variant)
        ax[1].plot(ts, [x["delta_bias_rel"] for x in r], style, label=variant)
        ax[3].plot(ts, [x["dq_err_rel"] for x in r], style, label=variant)
    for i, title in (
        (0, "bias of O (mean signed error / mean |O|)"),
        (1, "bias of delta (relative)"),
        (3, "dQ max error / max |dQ|"),
    ):
        ax[i].set_xscale("log", base=2)
        ax[i].set_xlabel("tied maxima per row")
        ax[i].set_title(title, fontsize=9)
        ax[i].axhline(0, color="k", lw=0.5)
        ax[i].legend(fontsize=8)
    names = list(dict.fromkeys(x["variant"] for x in b))
    xs = np.arange(len(names))
    for off, label in ((-0.2, "emulated"), (0.2, "rank-one corrected")):
        ax[2].bar(
            xs + off,
            [next(x["leak"] for x in b if x["variant"] == n and x["dq"] == label) for n in names],
            0.4,
            label=label,
        )
    ax[2].set_xticks(xs, names, fontsize=8)
    ax[2].set_title("dQ error along the mean key (relative to max |dQ|)", fontsize=9)
    ax[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="a tiny run")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)
    n_q, n_k, d, block = (32, 64, 16, 16) if args.smoke else (256, 512, 64, 64)
    os.makedirs(args.out, exist_ok=True)
    a = part_a(n_q, n_k, d, block)
    b = part_b(n_q, n_k, d, block)
    _write(args.out / "backward_ties.csv", a)
    _write(args.out / "backward_leak.csv", b)
    _plot(args.out / "backward_mechanisms.png", a, b)
    for r in a + b:
        print({key: (f"{val:.3g}" if isinstance(val, float) else val) for key, val in r.items()})
    print(f"wrote {args.out}/backward_ties.csv, backward_leak.csv, backward_mechanisms.png")


if __name__ == "__main__":
    main()
