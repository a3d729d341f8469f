"""Attribution of the backward pass's gradient error: where dQ, dK, dV's deviation from the fp64 golden gradients
comes from, per backward op (isolation and ablation), for the forward's contribution (O and lse) and per tile.

For a backward plan ``P`` (``triton-<fmt>``, ``all-<fmt>``, ...) and its forward plan, per tile (block_m, block_n):

* ``full``: the low-precision forward (O, m, l), then the backward under ``P``;
* ``forward``: the low-precision forward's O and lse, every backward op in fp64 (the forward's share, delta from
  the stored O included);
* ``isolation/<op>``: the fp64 forward and the fp64 backward with only ``op`` as in ``P``;
* ``ablation/<op>``: the low-precision forward and ``P`` with only ``op`` in fp64.

The fp64 plans take ``P``'s ``exp2``/``contract`` flags (so that lse has ``P``'s units); the golden gradients
are the fp64 plan's (within 1e-12 of float64 autograd). Each deviation is the max and the rms of
|grad - golden| over all elements, relative to max |golden|.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simfloat.accumulate import Sequential
from simfloat.attention import backward_plan, flash, flash_backward, lse_from_stats, plan
from simfloat.attention.plan import FLASH_BACKWARD_OPS, BackwardPlan, Plan

__all__ = ["BWD_ATTRIBUTION_OPS", "attribute_backward", "forward_plan_for", "run_cli", "write_backward"]

#: the ops attributed (the scalar ops and the five dots; ``softmax`` is the baseline's only)
BWD_ATTRIBUTION_OPS = FLASH_BACKWARD_OPS
_DOTS = ("qk", "dv", "dp", "dk", "dq")
_FP64_DOT = Sequential("float64", product_fmt="float64")


def forward_plan_for(bp: BackwardPlan) -> Plan:
    """The forward plan whose (O, m, l) the backward plan consumes: the preset of the same name (a derived
    plan's base name), else fp64 with the backward plan's exp2/contract flags."""
    base = bp.name.rstrip("*")
    try:
        return plan(base)
    except ValueError:
        return plan("fp64").replace(exp2=bp.exp2, contract=bp.contract, name=f"fp64({base})")


def _fp64_like(bp: BackwardPlan) -> BackwardPlan:
    return backward_plan("fp64").replace(exp2=bp.exp2, contract=bp.contract, name=f"fp64[{bp.name}]")


def _fp64_entry(op: str) -> object:
    return _FP64_DOT if op in _DOTS else "float64"


def _dev(grads: Sequence[np.ndarray], golden: Sequence[np.ndarray]) -> dict[str, float]:
    out = {}
    for name, g, w in zip(("dq", "dk", "dv"), grads, golden, strict=True):
        ref = float(np.abs(w).max()) or 1.0
        e = np.abs(g - w)
        out[f"{name}_max"] = float(e.max() / ref)
        out[f"{name}_rms"] = float(np.sqrt(np.mean(e * e)) / ref)
    return out


def _tile_rows(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray,
    bp: BackwardPlan,
    fp: Plan,
    g64: BackwardPlan,
    f64: Plan,
    ops: Sequence[str],
    bm: int,
    bn: int,
    causal: bool,
) -> list[dict[str, Any]]:
    kw: dict[str, Any] = dict(block_m=bm, block_n=bn, causal=causal)
    rows: list[dict[str, Any]] = []

    def forward(p: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        o, m, l = flash(q, k, v, plan=p, return_stats=True, **kw)  # noqa: E741
        return o, m, l

    st64, st_lp = forward(f64), forward(fp)
    golden = flash_backward(q, k, v, st64[0], do, lse_from_stats(st64[1], st64[2], plan=g64), plan=g64, **kw)

    def add(kind: str, op: str, st: tuple[np.ndarray, np.ndarray, np.ndarray], p: BackwardPlan) -> None:
        lse = lse_from_stats(st[1], st[2], plan=p)  # the lse op is the backward plan's (D3)
        grads = flash_backward(q, k, v, st[0], do, lse, plan=p, **kw)
        rows.append(dict(block_m=bm, block_n=bn, kind=kind, op=op, **_dev(grads, golden)))

    add("full", "", st_lp, bp)
    add("forward", "", st_lp, g64)
    for op in ops:
        add("isolation", op, st64, g64.replace(**{op: getattr(bp, op)}))
        add("ablation", op, st_lp, bp.replace(**{op: _fp64_entry(op)}))
    return rows


def attribute_backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray,
    *,
    plan_: BackwardPlan | str = "triton-bf16",
    tiles: Sequence[tuple[int, int]] = ((64, 64),),
    causal: bool = False,
    ops: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Isolation and ablation of every backward op, and the forward's share, per tile (see the module docstring).

    Args:
        q, k, v, do: (..., seq, head_dim) float arrays in the input format (rounded first).
        plan_: the backward plan or preset name.
        tiles: (block_m, block_n) pairs, used by the forward and the backward alike.
        causal: top-left aligned causal mask.
        ops: the ops to attribute (default :data:`BWD_ATTRIBUTION_OPS`).

    Returns:
        One dict per (tile, kind, op): ``block_m, block_n, kind`` (full / forward / isolation / ablation),
        ``op``, and ``dq_max, dq_rms, dk_max, dk_rms, dv_max, dv_rms`` (relative to max |golden|).

    Raises:
        ValueError: an unknown op; errors of :func:`simfloat.attention.flash_backward`.
    """
    bp = backward_plan(plan_)
    fp = forward_plan_for(bp)
    g64 = _fp64_like(bp)
    f64 = plan("fp64").replace(exp2=bp.exp2, contract=bp.contract, name="fp64*")
    ops = list(BWD_ATTRIBUTION_OPS if ops is None else ops)
    unknown = [o for o in ops if o not in BWD_ATTRIBUTION_OPS]
    if unknown:
        raise ValueError(f"unknown backward ops {unknown}; known: {', '.join(BWD_ATTRIBUTION_OPS)}")
    rows: list[dict[str, Any]] = []
    for bm, bn in tiles:
        rows += _tile_rows(q, k, v, do, bp, fp, g64, f64, ops, bm, bn, causal)
    return rows


def write_backward(rows: Sequence[dict[str, Any]], out: str | Path, title: str = "") -> tuple[Path, Path]:
    """``backward_attribution.csv`` and ``backward_attribution.png`` (isolation and ablation per op, dQ/dK/dV
    max deviation, first tile; full and forward-only deviation per tile) into ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(list(rows))
    csv_path = out / "backward_attribution.csv"
    df.to_csv(csv_path, index=False)
    first = df[(df.block_m == df.block_m.iloc[0]) & (df.block_n == df.block_n.iloc[0])]
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.5))
    for i, kind in enumerate(("isolation", "ablation")):
        part = first[first.kind == kind]
        x = np.arange(len(part))
        for j, g in enumerate(("dq", "dk", "dv")):
            ax[i].bar(x + (j - 1) * 0.27, part[f"{g}_max"], 0.27, label=g)
        ax[i].set_xticks(x, part.op, rotation=60, fontsize=8)
        ax[i].set_yscale("log")
        ax[i].set_title(
            f"{kind}: max deviation / max |golden| (tile {int(first.block_m.iloc[0])}x{int(first.block_n.iloc[0])})",
            fontsize=9,
        )
        ax[i].legend(fontsize=8)
    for kind, style in (("full", "o-"), ("forward", "s--")):
        part = df[df.kind == kind]
        labels = [f"{a}x{b}" for a, b in zip(part.block_m, part.block_n, strict=True)]
        for g in ("dq", "dk", "dv"):
            ax[2].plot(labels, part[f"{g}_max"], style, label=f"{g} {kind}")
    ax[2].set_yscale("log")
    ax[2].set_title("vs tiles: full plan, and the forward's share alone", fontsize=9)
    ax[2].legend(fontsize=7, ncol=2)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    png = out / "backward_attribution.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return csv_path, png


def run_cli(args: Any) -> int:
    """``simfloat attribute --pass backward``: seeded inputs (and dO) as the forward job, the first ``--plan``
    (default triton-<format>) as a backward plan, ``--tiles`` (default the forward job's); writes the CSV and PNG
    into ``--out`` and prints the table."""
    from simfloat.attribution.cli import _out_dir, _pick, inputs

    seq = int(_pick(args, "seq"))
    seq_k = int(args.seq_k) if args.seq_k is not None else seq
    d = int(_pick(args, "head_dim"))
    batch, heads = int(_pick(args, "batch")), int(_pick(args, "heads"))
    fmt = str(_pick(args, "format"))
    name = (args.plan or [f"triton-{fmt}"])[0]
    tiles = list(_pick(args, "tiles"))
    out = _out_dir(args.out)
    q, k, v = inputs((batch, heads, seq, d), (batch, heads, seq_k, d), args.dist, fmt, args.seed)
    do = inputs((batch, heads, seq, d), (1,), "normal", fmt, args.seed + 1)[0]
    head = (
        f"simfloat attribute --pass backward: {args.dist} inputs in {fmt}, seed {args.seed}, q {q.shape}, "
        f"k and v {k.shape}, plan {name}, tiles {tiles}{', causal' if args.causal else ''}"
    )
    print(head, flush=True)
    rows = attribute_backward(q, k, v, do, plan_=name, tiles=tiles, causal=bool(args.causal))
    csv_path, png = write_backward(rows, out, head)
    lines = [head, f"{'tile':>9} {'kind':>9} {'op':>10} {'dq_max':>9} {'dk_max':>9} {'dv_max':>9}"]
    for r in rows:
        lines.append(
            f"{r['block_m']:>4}x{r['block_n']:<4} {r['kind']:>9} {r['op']:>10} {r['dq_max']:9.2e} "
            f"{r['dk_max']:9.2e} {r['dv_max']:9.2e}"
        )
    text = "\n".join(lines)
    (out / "backward_summary.txt").write_text(text + "\n")
    print(text)
    print(f"wrote {csv_path}, {png}, {out / 'backward_summary.txt'}")
    return 0
