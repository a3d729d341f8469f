"""Attribution of the backward pass's gradient error: where dQ, dK, dV's deviation from the fp64 golden gradients
comes from, per backward op (isolation and ablation), for the forward's contribution (O and lse) and per tile.

For a backward plan ``P`` (``triton-<fmt>``, ``all-<fmt>``, ...) and its forward plan, per tile (block_m, block_n):

* ``full``: the low-precision forward (O, m, l), then the backward under ``P``;
* ``forward``: the low-precision forward's O and lse, every backward op in fp64 (the forward's share, delta from
  the stored O included);
* ``isolation/<op>``: the fp64 forward and the fp64 backward with only ``op`` as in ``P``;
* ``ablation/<op>``: the low-precision forward and ``P`` with only ``op`` in fp64.

:func:`backward_steps` runs ``full``, ``forward`` and ``isolation/<op>`` of a few ops against the number of
rescaling steps ``ceil(seq_k / block_n)`` (the key tiles a row's online softmax passes through, which is also the
number of key tiles dQ accumulates over), in two sweeps that tell tiles from length: over block_n at the full
length (as the forward's steps study) and over the sequence length at a fixed tile (where the number of query
tiles dK and dV accumulate over, ``ceil(seq_q / block_m)``, grows too).

The fp64 plans take ``P``'s ``exp2``/``contract`` flags (so that lse has ``P``'s units); the golden gradients
are the fp64 plan's (within 1e-12 of float64 autograd). Each deviation is the max and the rms of
|grad - golden| over all elements, relative to max |golden| (``dq_max``, ``dq_rms``, ...), and the max abs, RMSE
and relative L1 of :func:`simfloat.metrics.error_metrics` (``dq_max_abs``, ``dq_rmse``, ``dq_rel_l1``, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simfloat.accumulate import Sequential
from simfloat.attention import backward_plan, flash, flash_backward, lse_from_stats, plan
from simfloat.attention.plan import FLASH_BACKWARD_OPS, BackwardPlan, Plan
from simfloat.attribution._core import _save_figure
from simfloat.metrics import error_metrics

__all__ = [
    "BWD_ATTRIBUTION_OPS",
    "STEPS_ACCUMULATING_OPS",
    "STEPS_TOP_OPS",
    "attribute_backward",
    "backward_steps",
    "default_seqs",
    "forward_plan_for",
    "run_cli",
    "steps_table",
    "top_isolated",
    "write_backward",
    "write_backward_steps",
]

#: the ops attributed (the scalar ops and the five dots; ``softmax`` is the baseline's only)
BWD_ATTRIBUTION_OPS = FLASH_BACKWARD_OPS
_DOTS = ("qk", "dv", "dp", "dk", "dq")
_FP64_DOT = Sequential("float64", product_fmt="float64")
#: how many ops of the isolation table (the largest isolated deviations) the steps study follows
STEPS_TOP_OPS = 3
#: the dots that accumulate over tiles, which the steps study follows too: dq over key tiles (the rescaling
#: steps), dk and dv over query tiles
STEPS_ACCUMULATING_OPS = ("dq", "dk", "dv")
_GRADS = ("dq", "dk", "dv")


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
        lit = error_metrics(g, w)
        for key in ("max_abs", "rmse", "rel_l1"):
            out[f"{name}_{key}"] = lit[key]
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
    ablate: bool = True,
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
        if ablate:
            add("ablation", op, st_lp, bp.replace(**{op: _fp64_entry(op)}))
    return rows


def _plans(plan_: BackwardPlan | str) -> tuple[BackwardPlan, Plan, BackwardPlan, Plan]:
    bp = backward_plan(plan_)
    f64 = plan("fp64").replace(exp2=bp.exp2, contract=bp.contract, name="fp64*")
    return bp, forward_plan_for(bp), _fp64_like(bp), f64


def _check_ops(ops: Sequence[str]) -> list[str]:
    ops = list(ops)
    unknown = [o for o in ops if o not in BWD_ATTRIBUTION_OPS]
    if unknown:
        raise ValueError(f"unknown backward ops {unknown}; known: {', '.join(BWD_ATTRIBUTION_OPS)}")
    return ops


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
    bp, fp, g64, f64 = _plans(plan_)
    ops = _check_ops(BWD_ATTRIBUTION_OPS if ops is None else ops)
    rows: list[dict[str, Any]] = []
    for bm, bn in tiles:
        rows += _tile_rows(q, k, v, do, bp, fp, g64, f64, ops, bm, bn, causal)
    return rows


def default_seqs(seq: int, block_n: int) -> list[int]:
    """Sequence lengths of the length sweep: ``block_n`` times powers of two below ``seq``, then ``seq`` itself
    (1, 2, 4, ... rescaling steps up to the full length's)."""
    out = []
    n = block_n
    while n < seq:
        out.append(n)
        n *= 2
    return [*out, seq]


def top_isolated(rows: Sequence[dict[str, Any]], n: int = STEPS_TOP_OPS) -> list[str]:
    """The ``n`` ops with the largest isolated deviation (the largest of ``dq_max, dk_max, dv_max``) at the first
    tile of :func:`attribute_backward`'s rows, largest first."""
    if not rows:
        return []
    first = (rows[0]["block_m"], rows[0]["block_n"])
    iso = [r for r in rows if r["kind"] == "isolation" and (r["block_m"], r["block_n"]) == first]
    iso.sort(key=lambda r: -max(r[f"{g}_max"] for g in _GRADS))
    return [r["op"] for r in iso[:n]]


def backward_steps(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray,
    *,
    plan_: BackwardPlan | str = "triton-bf16",
    block_m: int = 64,
    block_n: int = 64,
    block_ns: Sequence[int] | None = None,
    seqs: Sequence[int] | None = None,
    causal: bool = False,
    ops: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """The gradient deviation vs the number of rescaling steps ``ceil(seq_k / block_n)``, two ways.

    * ``sweep="block_n"``: the full inputs, ``block_m`` fixed, block_n over ``block_ns`` (the forward's steps
      study, backward): the steps change, the length and the query tiles do not;
    * ``sweep="seq"``: the first N queries and keys (q, do and k, v truncated to N rows) for N in ``seqs``, tile
      (``block_m``, ``block_n``) fixed: the steps and the query tiles grow with the length.

    Each point runs ``full``, ``forward`` and ``isolation/<op>`` for ``ops`` as :func:`attribute_backward`
    does (its golden gradients are that point's fp64 plan's).

    Args:
        q, k, v, do: (..., seq, head_dim) float arrays in the input format (rounded first).
        plan_: the backward plan or preset name.
        block_m, block_n: the fixed tile (block_m in both sweeps, block_n in the length sweep).
        block_ns: block_n values of the block_n sweep (default :func:`simfloat.attribution.default_block_ns`
            of seq_k); ``()``: no block_n sweep.
        seqs: lengths of the length sweep, each at most min(seq_q, seq_k) (default :func:`default_seqs` of
            min(seq_q, seq_k) and block_n); ``()``: no length sweep.
        causal: top-left aligned causal mask.
        ops: the ops isolated at every point (e.g. :func:`top_isolated` of an :func:`attribute_backward` run).

    Returns:
        One dict per (sweep, point, kind, op): ``sweep, seq_q, seq_k, block_m, block_n, steps`` (=
        ``ceil(seq_k / block_n)``), ``q_tiles`` (= ``ceil(seq_q / block_m)``), ``kind, op`` and the deviation
        columns of :func:`attribute_backward` (``dq_max, dq_rms, dq_max_abs, dq_rmse, dq_rel_l1``, dk, dv alike).

    Raises:
        ValueError: an unknown op, a block size that is not a positive int, a length out of range; errors of
            :func:`simfloat.attention.flash_backward`.
    """
    from simfloat.attribution._core import _positive_int, default_block_ns

    bp, fp, g64, f64 = _plans(plan_)
    ops = _check_ops(ops)
    bm, bn = _positive_int(block_m, "block_m"), _positive_int(block_n, "block_n")
    seq_q, seq_k = q.shape[-2], k.shape[-2]
    bns = default_block_ns(seq_k) if block_ns is None else [_positive_int(b, "block_n") for b in block_ns]
    longest = min(seq_q, seq_k)
    ns = default_seqs(longest, bn) if seqs is None else [_positive_int(n, "seq") for n in seqs]
    too_long = [n for n in ns if n > longest]
    if too_long:
        raise ValueError(f"seqs {too_long} exceed the inputs' length min(seq_q, seq_k) = {longest}")
    points = [("block_n", seq_q, seq_k, b) for b in bns] + [("seq", n, n, bn) for n in ns]
    rows: list[dict[str, Any]] = []
    for sweep, nq, nk, b in points:
        qs, dos = q[..., :nq, :], do[..., :nq, :]
        ks, vs = k[..., :nk, :], v[..., :nk, :]
        geo = dict(sweep=sweep, seq_q=nq, seq_k=nk, steps=-(-nk // b), q_tiles=-(-nq // bm))
        for r in _tile_rows(qs, ks, vs, dos, bp, fp, g64, f64, ops, bm, b, causal, ablate=False):
            rows.append({**geo, **r})
    return rows


def _frame_csv(rows: Sequence[dict[str, Any]], out: Path, name: str) -> tuple[Any, Path, Any]:
    """What both writers start with: pandas and matplotlib (Agg) loaded (a missing one: an ImportError naming
    the extra), ``rows`` as a DataFrame written to ``out/<name>.csv`` (folder created). Returns (the frame, the
    CSV's path, matplotlib.pyplot)."""
    from simfloat.attribution._core import _need, _pyplot

    pd = _need("pandas", f"simfloat.attribution.backward ({name})")
    plt = _pyplot(f"simfloat.attribution.backward ({name})")
    out.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(list(rows))
    csv_path = out / f"{name}.csv"
    df.to_csv(csv_path, index=False)
    return df, csv_path, plt


def _curves(df: Any) -> list[tuple[str, Any]]:
    out = []
    for kind in ("full", "forward"):
        out.append((kind, df[df.kind == kind]))
    for op in dict.fromkeys(df[df.kind == "isolation"].op):
        out.append((f"isolated {op}", df[(df.kind == "isolation") & (df.op == op)]))
    return out


def write_backward_steps(
    rows: Sequence[dict[str, Any]], out: str | Path, title: str = "", metric: str = "rel_l1"
) -> tuple[Path, Path]:
    """``backward_steps.csv`` (every row of :func:`backward_steps`) and ``backward_steps.png`` (``metric`` of dQ,
    dK, dV vs rescaling steps: one row of panels per sweep, one curve per kind/op; an op whose deviation of a
    gradient is exactly 0 (it does not touch it) is left out of that panel) into ``out``."""
    df, csv_path, plt = _frame_csv(rows, Path(out), "backward_steps")
    sweeps = list(dict.fromkeys(df.sweep)) if len(df) else []
    fig, axes = plt.subplots(max(len(sweeps), 1), 3, figsize=(16, 4.2 * max(len(sweeps), 1)), squeeze=False)
    styles = {"full": ("k", "o-"), "forward": ("tab:gray", "s--")}
    palette = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive")
    ops = [label for label, _ in _curves(df) if label not in styles]
    for i, label in enumerate(ops):  # one color per op across all panels (gray and black: full, forward)
        styles[label] = (palette[i % len(palette)], "^:")
    for i, sweep in enumerate(sweeps):
        part = df[df.sweep == sweep].sort_values("steps")
        first = part.iloc[0]
        if sweep == "block_n":
            what = f"block_n sweep: seq_q {first.seq_q}, seq_k {first.seq_k}, block_m {first.block_m}"
        else:
            what = f"length sweep: tile {first.block_m}x{first.block_n}, N = {part.seq_k.min()}..{part.seq_k.max()}"
        for j, g in enumerate(_GRADS):
            ax = axes[i][j]
            for label, c in _curves(part):
                y = c[f"{g}_{metric}"]
                if not (y > 0).any():  # an op that does not touch this gradient (exactly 0): not drawn
                    continue
                color, style = styles[label]
                ax.plot(c.steps[y > 0], y[y > 0], style, color=color, label=label)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("rescaling steps = ceil(seq_k / block_n)")
            ax.set_title(f"{g} {metric} vs rescaling steps ({what})", fontsize=8)
            ax.legend(fontsize=7)
    note = f"{metric} of each gradient against the fp64 golden one; exact zeros (an op not on that gradient) not drawn"
    fig.suptitle(f"{title}\n{note}" if title else note, fontsize=10)
    return csv_path, _save_figure(plt, fig, csv_path.with_suffix(".png"), dpi=110)


def steps_table(rows: Sequence[dict[str, Any]]) -> str:
    """The console table of :func:`backward_steps`: relative L1 and max / max |golden| per point, kind and op."""
    lines = [
        f"{'sweep':>7} {'seq':>6} {'tile':>9} {'steps':>5} {'q_tiles':>7} {'kind':>9} {'op':>10} "
        f"{'dq_rel_l1':>9} {'dk_rel_l1':>9} {'dv_rel_l1':>9} {'dq_max':>9} {'dk_max':>9} {'dv_max':>9}"
    ]
    for r in rows:
        lines.append(
            f"{r['sweep']:>7} {r['seq_k']:>6} {r['block_m']:>4}x{r['block_n']:<4} {r['steps']:>5} "
            f"{r['q_tiles']:>7} {r['kind']:>9} {r['op']:>10} "
            + " ".join(f"{r[f'{g}_rel_l1']:9.2e}" for g in _GRADS)
            + " "
            + " ".join(f"{r[f'{g}_max']:9.2e}" for g in _GRADS)
        )
    return "\n".join(lines)


def write_backward(rows: Sequence[dict[str, Any]], out: str | Path, title: str = "") -> tuple[Path, Path]:
    """``backward_attribution.csv`` and ``backward_attribution.png`` (isolation and ablation per op, dQ/dK/dV
    max deviation, first tile; full and forward-only deviation per tile) into ``out``."""
    df, csv_path, plt = _frame_csv(rows, Path(out), "backward_attribution")
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
    return csv_path, _save_figure(plt, fig, csv_path.with_suffix(".png"), dpi=110)


def run_cli(args: Any) -> int:
    """``simfloat attribute --pass backward``: seeded inputs (and dO) as the forward job, the first ``--plan``
    (default triton-<format>) as a backward plan, ``--tiles`` (default the forward job's); then the steps study
    (:func:`backward_steps`: ``--block-ns`` at ``--block-m``, ``--seqs`` at ``--block-m`` x ``--block-n``, the
    :data:`STEPS_TOP_OPS` largest isolated ops of the first tile and :data:`STEPS_ACCUMULATING_OPS`); writes the
    CSVs and PNGs into ``--out`` and prints the tables."""
    from simfloat.attribution.cli import _out_dir, _pick, inputs, steps_block_ns

    seq = int(_pick(args, "seq"))
    seq_k = int(args.seq_k) if args.seq_k is not None else seq
    d = int(_pick(args, "head_dim"))
    batch, heads = int(_pick(args, "batch")), int(_pick(args, "heads"))
    fmt = str(_pick(args, "format"))
    name = (args.plan or [f"triton-{fmt}"])[0]
    tiles = list(_pick(args, "tiles"))
    bm, bn = int(_pick(args, "block_m")), int(_pick(args, "block_n"))
    block_ns = steps_block_ns(args, seq_k)
    seqs = getattr(args, "seqs", None)
    if seqs is not None and max(seqs) > min(seq, seq_k):
        raise ValueError(f"--seqs {max(seqs)}: longer than the inputs (--seq {seq}, --seq-k {seq_k})")
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
    top = list(dict.fromkeys([*top_isolated(rows), *STEPS_ACCUMULATING_OPS]))
    steps_head = (
        f"gradient deviation vs rescaling steps = ceil(seq_k / block_n): block_n {block_ns} at block_m {bm}; "
        f"lengths {seqs if seqs is not None else 'default'} at tile {bm}x{bn}; isolated ops {top} (the largest "
        "of the first tile, and the accumulating dots); rel_l1 = sum|grad - golden| / sum|golden|, "
        "max = max|grad - golden| / max|golden|"
    )
    print(steps_head, flush=True)
    steps = backward_steps(
        q, k, v, do, plan_=name, block_m=bm, block_n=bn, block_ns=block_ns, seqs=seqs, causal=bool(args.causal), ops=top
    )
    steps_csv, steps_png = write_backward_steps(steps, out, head)
    lines += [steps_head, steps_table(steps)]
    text = "\n".join(lines)
    (out / "backward_summary.txt").write_text(text + "\n")
    print(text)
    print(f"wrote {csv_path}, {png}, {steps_csv}, {steps_png}, {out / 'backward_summary.txt'}")
    return 0
