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
from typing import Any

import numpy as np

from simfloat.accumulate import Sequential
from simfloat.attention import backward_plan, flash, flash_backward, lse_from_stats, plan
from simfloat.attention.backward_plan import FLASH_BACKWARD_OPS, BackwardPlan
from simfloat.attention.plan import Plan
from simfloat.attribution._backward_out import steps_table, write_backward, write_backward_steps
from simfloat.attribution._result import Attribution
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
    scale: float | None = None,
    masking: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    kw: dict[str, Any] = dict(block_m=bm, block_n=bn, causal=causal, scale=scale, **(masking or {}))
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


def _deprecated_plan(plan: BackwardPlan | str, plan_: BackwardPlan | str | None) -> BackwardPlan | str:
    if plan_ is None:
        return plan
    import warnings

    warnings.warn("plan_= is now plan= (as attribute()'s)", DeprecationWarning, stacklevel=3)
    return plan_


def _operands(
    q: Any, k: Any, v: Any, do: Any, causal: bool, scale: float | None, call: int | None, heads: Any, layout: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool, float | None, Any]:
    """The backward's operands: arrays (in ``layout``), or a recorded call with its dO (as :func:`attribute`)."""
    from simfloat.attention._inputs import from_layout
    from simfloat.attribution._core import attribute_inputs

    if isinstance(q, np.ndarray) and isinstance(do, np.ndarray):
        do = from_layout(do, layout, "do")
        if heads is not None:
            from simfloat.attribution.captured import SdpaCall

            qq, kk, vv = (from_layout(x, layout, n) for x, n in ((q, "q"), (k, "k"), (v, "v")))
            sel = SdpaCall(0, "", "", "", qq, kk, vv, do).select_heads(heads)
            return sel.q, sel.k, sel.v, sel.do, causal, scale, None  # type: ignore[return-value]
    elif do is not None and not isinstance(q, np.ndarray):
        raise TypeError("with a recorded call as q, leave do out: it is the call's")
    qa, ka, va, causal, scale, rec = attribute_inputs(q, k, v, causal, scale, call, heads, layout)
    if rec is not None:
        if rec.do is None:
            raise ValueError(
                f"{rec.describe()}: no dO was recorded (run the backward pass, loss.backward(), inside the "
                "capture_sdpa block, with backward=True)"
            )
        do = rec.do
    if not isinstance(do, np.ndarray):
        raise TypeError(f"do must be a numpy array of q's shape, got {type(do).__name__}")
    return qa, ka, va, do, causal, scale, rec


def attribute_backward(
    q: Any,
    k: np.ndarray | None = None,
    v: np.ndarray | None = None,
    do: np.ndarray | None = None,
    plan: BackwardPlan | str = "triton-bf16",
    *,
    tiles: Sequence[tuple[int, int]] = ((64, 64),),
    causal: bool = False,
    scale: float | None = None,
    ops: Sequence[str] | None = None,
    layout: str = "bhsd",
    call: int | None = None,
    heads: Sequence[int] | None = None,
    steps: bool = False,
    block_m: int | None = None,
    block_n: int | None = None,
    block_ns: Sequence[int] | None = None,
    seqs: Sequence[int] | None = None,
    plan_: BackwardPlan | str | None = None,
    attn_mask: np.ndarray | None = None,
    key_lengths: object = None,
    window: tuple[int, int] | None = None,
    causal_align: str = "top-left",
) -> Attribution:
    """Isolation and ablation of every backward op, and the forward's share, per tile (see the module docstring);
    with ``steps``, the gradients against the number of rescaling steps too (:func:`backward_steps`).

    Args:
        q, k, v, do: (..., seq, head_dim) float arrays in the input format (rounded first); or, as ``q`` alone,
            a recorded call (:class:`~simfloat.attribution.SdpaCall`, with its dO) or the path of a
            :func:`simfloat.torch.capture_sdpa` file (``call`` picks the call), as for
            :func:`simfloat.attribute`.
        plan: the backward plan or preset name (``plan_=``, its former name, still works, with a
            DeprecationWarning).
        tiles: (block_m, block_n) pairs, used by the forward and the backward alike.
        causal, scale: the mask and softmax scale (a recorded call's own).
        ops: the ops to attribute (default :data:`BWD_ATTRIBUTION_OPS`).
        layout, call, heads: as for :func:`simfloat.attribute`.
        steps: add the steps study (the ``steps`` table): ``block_ns`` at ``block_m`` and ``seqs`` at
            ``block_m`` x ``block_n`` (default: the first tile; None: :func:`backward_steps`' defaults), for
            the :data:`STEPS_TOP_OPS` largest isolated ops of the first tile and :data:`STEPS_ACCUMULATING_OPS`.
        attn_mask, key_lengths, window, causal_align: a mask, as for :func:`simfloat.attention.flash` and
            :func:`simfloat.attention.flash_backward`, on every forward and backward run (golden included); a
            row that sees no key adds nothing (``empty_rows="zero"``). The steps study's length sweep takes
            the first N queries and keys as a call of their own: ``attn_mask[..., :N, :N]``, key lengths
            clipped to N (see :func:`backward_steps`).

    Returns:
        An :class:`~simfloat.attribution.Attribution` with ``meta["pass"] == "backward"``: ``isolation`` and
        ``ablation`` (per tile and op), ``tiles`` (per tile, ``kind`` full / forward), ``steps``; each row with
        ``dq_max, dq_rms, dq_max_abs, dq_rmse, dq_rel_l1`` and dk, dv alike (``*_max``, ``*_rms`` relative to
        max |golden|); ``table()``, ``to_csv()``, ``plot()``, ``plot_steps()``.

    Raises:
        ValueError: an unknown op; a recorded call without dO; errors of
            :func:`simfloat.attention.flash_backward`.
        NotImplementedError: a recorded call with options the emulator does not model (named).
    """
    import pandas as pd

    plan = _deprecated_plan(plan, plan_)
    q, k, v, do, causal, scale, rec = _operands(q, k, v, do, causal, scale, call, heads, layout)
    bp, fp, g64, f64 = _plans(plan)
    ops = _check_ops(BWD_ATTRIBUTION_OPS if ops is None else ops)
    masking = _masking(attn_mask, key_lengths, window, causal_align)
    rows: list[dict[str, Any]] = []
    tiles = list(tiles)
    for bm, bn in tiles:
        rows += _tile_rows(q, k, v, do, bp, fp, g64, f64, ops, bm, bn, bool(causal), scale=scale, masking=masking)
    df = pd.DataFrame(rows)
    df.insert(0, "plan", bp.name)
    step_rows: list[dict[str, Any]] = []
    top: list[str] = []
    sm, sn = tiles[0] if tiles else (64, 64)
    sm, sn = block_m or sm, block_n or sn
    if steps:
        top = list(dict.fromkeys([*top_isolated(rows), *STEPS_ACCUMULATING_OPS]))
        step_rows = backward_steps(
            q, k, v, do, plan=bp, block_m=sm, block_n=sn, block_ns=block_ns, seqs=seqs, causal=bool(causal),
            ops=top, scale=scale, **masking,
        )  # fmt: skip
    st = pd.DataFrame(step_rows)
    if len(st):
        st.insert(0, "plan", bp.name)
    empty = pd.DataFrame()
    meta = dict(
        shape_q=tuple(q.shape),
        shape_k=tuple(k.shape),
        shape_v=tuple(v.shape),
        seq_q=q.shape[-2],
        seq_k=k.shape[-2],
        rows=q.shape[-2],
        tiles=tiles,
        block_m=sm,
        block_n=sn,
        causal=bool(causal),
        scale=scale,
        masked=bool(masking),
        plans=[bp.name],
        forward_plan=fp.name,
        runs=len(rows),
        steps_ops=top,
        layout=layout,
        call=None if rec is None else rec.meta(),
        **{"pass": "backward"},
    )
    return Attribution(
        isolation=df[df.kind == "isolation"].reset_index(drop=True),
        ablation=df[df.kind == "ablation"].reset_index(drop=True),
        tiles=df[df.kind.isin(["full", "forward"])].reset_index(drop=True),
        steps=st,
        flash_vs_baseline=empty,
        by_block=empty,
        state_by_block=empty,
        meta=meta,
    )


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
    plan: BackwardPlan | str = "triton-bf16",
    block_m: int = 64,
    block_n: int = 64,
    block_ns: Sequence[int] | None = None,
    seqs: Sequence[int] | None = None,
    causal: bool = False,
    ops: Sequence[str] = (),
    scale: float | None = None,
    plan_: BackwardPlan | str | None = None,
    attn_mask: np.ndarray | None = None,
    key_lengths: object = None,
    window: tuple[int, int] | None = None,
    causal_align: str = "top-left",
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
        plan: the backward plan or preset name (``plan_``: its former name, deprecated).
        block_m, block_n: the fixed tile (block_m in both sweeps, block_n in the length sweep).
        block_ns: block_n values of the block_n sweep (default :func:`simfloat.attribution.default_block_ns`
            of seq_k); ``()``: no block_n sweep.
        seqs: lengths of the length sweep, each at most min(seq_q, seq_k) (default :func:`default_seqs` of
            min(seq_q, seq_k) and block_n); ``()``: no length sweep.
        causal: top-left aligned causal mask.
        ops: the ops isolated at every point (e.g. :func:`top_isolated` of an :func:`attribute_backward` run).
        scale: the softmax scale (default 1/sqrt(head_dim)).
        attn_mask, key_lengths, window, causal_align: a mask (see :func:`attribute_backward`); a point of the
            length sweep takes ``attn_mask[..., :N, :N]`` (a broadcast size-1 axis as it is) and the key lengths
            clipped to N, the window and alignment as they are.

    Returns:
        One dict per (sweep, point, kind, op): ``sweep, seq_q, seq_k, block_m, block_n, steps`` (=
        ``ceil(seq_k / block_n)``), ``q_tiles`` (= ``ceil(seq_q / block_m)``), ``kind, op`` and the deviation
        columns of :func:`attribute_backward` (``dq_max, dq_rms, dq_max_abs, dq_rmse, dq_rel_l1``, dk, dv alike).

    Raises:
        ValueError: an unknown op, a block size that is not a positive int, a length out of range; errors of
            :func:`simfloat.attention.flash_backward`.
    """
    from simfloat.attribution._core import default_block_ns, positive_count

    bp, fp, g64, f64 = _plans(_deprecated_plan(plan, plan_))
    ops = _check_ops(ops)
    bm, bn = positive_count(block_m, "block_m"), positive_count(block_n, "block_n")
    seq_q, seq_k = q.shape[-2], k.shape[-2]
    bns = default_block_ns(seq_k) if block_ns is None else [positive_count(b, "block_n") for b in block_ns]
    longest = min(seq_q, seq_k)
    ns = default_seqs(longest, bn) if seqs is None else [positive_count(n, "seq") for n in seqs]
    too_long = [n for n in ns if n > longest]
    if too_long:
        raise ValueError(f"seqs {too_long} exceed the inputs' length min(seq_q, seq_k) = {longest}")
    points = [("block_n", seq_q, seq_k, b) for b in bns] + [("seq", n, n, bn) for n in ns]
    masking = _masking(attn_mask, key_lengths, window, causal_align)
    rows: list[dict[str, Any]] = []
    for sweep, nq, nk, b in points:
        qs, dos = q[..., :nq, :], do[..., :nq, :]
        ks, vs = k[..., :nk, :], v[..., :nk, :]
        geo = dict(sweep=sweep, seq_q=nq, seq_k=nk, steps=-(-nk // b), q_tiles=-(-nq // bm))
        mk = _cut_mask(masking, nq, nk) if (nq, nk) != (seq_q, seq_k) else masking
        for r in _tile_rows(
            qs, ks, vs, dos, bp, fp, g64, f64, ops, bm, b, causal, ablate=False, scale=scale, masking=mk
        ):
            rows.append({**geo, **r})
    return rows


def _masking(attn_mask: object, key_lengths: object, window: object, causal_align: object) -> dict[str, Any]:
    """The mask keywords of a call that has one (flash's and flash_backward's names); {} without."""
    if attn_mask is None and key_lengths is None and window is None and causal_align == "top-left":
        return {}
    return dict(attn_mask=attn_mask, key_lengths=key_lengths, window=window, causal_align=causal_align)


def _cut_mask(masking: dict[str, Any], nq: int, nk: int) -> dict[str, Any]:
    """The mask of the first ``nq`` queries and ``nk`` keys: a dense mask sliced (size-1 axes as they are), key
    lengths clipped to ``nk``."""
    out = dict(masking)
    a = masking.get("attn_mask")
    if isinstance(a, np.ndarray) and a.ndim >= 2:
        out["attn_mask"] = a[..., :nq, :nk]
    lens = masking.get("key_lengths")
    if lens is not None:
        out["key_lengths"] = np.minimum(np.asarray(lens), nk)
    return out


def run_cli(args: Any) -> int:
    """``simfloat attribute --pass backward``: seeded inputs (and dO) as the forward job, or a recorded call
    (``--inputs``, with its dO), the first ``--plan`` (default triton-<format>) as a backward plan, ``--tiles``
    (default the forward job's); then the steps study (:func:`backward_steps`: ``--block-ns`` at ``--block-m``,
    ``--seqs`` at ``--block-m`` x ``--block-n``, the :data:`STEPS_TOP_OPS` largest isolated ops of the first tile
    and :data:`STEPS_ACCUMULATING_OPS`); writes the CSVs and PNGs into ``--out`` and prints the tables."""
    from simfloat.attribution.cli import captured_call, inputs, out_dir, pick_arg, steps_block_ns

    rec = captured_call(args)
    if rec is not None:
        rec.check()
        if rec.do is None:
            raise ValueError(
                f"{rec.describe()}: no dO was recorded (run loss.backward() inside the capture_sdpa block)"
            )
        q, k, v, do = rec.q, rec.k, rec.v, rec.do
        seq, seq_k = q.shape[-2], k.shape[-2]
        fmt = str(args.format or rec.input_format or pick_arg(args, "format"))
        causal, src = rec.causal, rec.describe()
    else:
        seq = int(pick_arg(args, "seq"))
        seq_k = int(args.seq_k) if args.seq_k is not None else seq
        fmt = str(pick_arg(args, "format"))
        causal, src = bool(args.causal), ""
    name = (args.plan or [f"triton-{fmt}"])[0]
    tiles = list(pick_arg(args, "tiles"))
    bm, bn = int(pick_arg(args, "block_m")), int(pick_arg(args, "block_n"))
    block_ns = steps_block_ns(args, seq_k)
    seqs = getattr(args, "seqs", None)
    if seqs is not None and max(seqs) > min(seq, seq_k):
        raise ValueError(f"--seqs {max(seqs)}: longer than the inputs (--seq {seq}, --seq-k {seq_k})")
    out = out_dir(args.out)
    if rec is None:
        d = int(pick_arg(args, "head_dim"))
        batch, heads = int(pick_arg(args, "batch")), _pick_heads(args)
        q, k, v = inputs((batch, heads, seq, d), (batch, heads, seq_k, d), args.dist, fmt, args.seed)
        do = inputs((batch, heads, seq, d), (1,), "normal", fmt, args.seed + 1)[0]
        head = (
            f"simfloat attribute --pass backward: {args.dist} inputs in {fmt}, seed {args.seed}, q {q.shape}, "
            f"k and v {k.shape}, plan {name}, tiles {tiles}{', causal' if causal else ''}"
        )
    else:
        head = f"simfloat attribute --pass backward: {src}; plan {name}, tiles {tiles}"
    print(head, flush=True)
    res = attribute_backward(
        q, k, v, do, name, tiles=tiles, causal=causal, scale=None if rec is None else rec.scale,
        steps=True, block_m=bm, block_n=bn, block_ns=block_ns, seqs=seqs,
    )  # fmt: skip
    res.meta["call"] = None if rec is None else rec.meta()
    paths = res.to_csv(out)
    png = res.plot(out / "backward_attribution.png", head)
    steps_png = res.plot_steps(out / "backward_steps.png", head)
    steps_head = (
        f"gradient deviation vs rescaling steps = ceil(seq_k / block_n): block_n {block_ns} at block_m {bm}; "
        f"lengths {seqs if seqs is not None else 'default'} at tile {bm}x{bn}; isolated ops {res.meta['steps_ops']} "
        "(the largest of the first tile, and the accumulating dots); rel_l1 = sum|grad - golden| / sum|golden|, "
        "max = max|grad - golden| / max|golden|"
    )
    table = res.table().split("\n", 1)[1]  # without the result's own header: the job's is printed
    first, _, steps = table.partition("\n\n")
    text = "\n".join([head, first, steps_head, steps])
    (out / "backward_summary.txt").write_text(text + "\n")
    print(text)
    print(f"wrote {', '.join(map(str, paths))}, {png}, {steps_png}, {out / 'backward_summary.txt'}")
    return 0


def _pick_heads(args: Any) -> int:
    from simfloat.attribution.cli import head_count

    return head_count(args)
