"""attribute(): run every plan variant an attribution needs once (deduplicated), then tabulate deviations."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from simfloat.attention import FLASH_OPS, Plan
from simfloat.attention import plan as _plan
from simfloat.attention._inputs import (
    InputFormatWarning,
    check_layout,
    from_layout,
    input_format,
    kv_repeats,
    not_representable,
    operand,
)
from simfloat.attention.tiling import resolve_tiles
from simfloat.attribution._deviation import LITERATURE, METRICS, deviation, literature
from simfloat.attribution._estimate import Estimate
from simfloat.attribution._extras import need
from simfloat.attribution._plans import (
    ablation_plan,
    baseline_plan_for,
    isolation_plan,
    reference_plan,
)
from simfloat.attribution._request import Request
from simfloat.attribution._result import Attribution
from simfloat.attribution._runner import AttributionInterrupted, Runner
from simfloat.attribution._tables import bounds_table, frames, tabulate
from simfloat.attribution.captured import SdpaCall, load_capture

__all__ = [
    "LITERATURE",
    "METRICS",
    "AttributionInterrupted",
    "attribute",
    "default_block_ns",
    "default_tiles",
    "deviation",
    "literature",
    "select_rows",
]


def default_tiles(block_m: int = 64, block_n: int = 64) -> list[tuple[int, int]]:
    """The tile grid of the tile study: block_m and block_n each halved and doubled, plus the default."""
    out = {(block_m, block_n)}
    for bm in (max(1, block_m // 2), block_m * 2):
        for bn in (max(1, block_n // 2), block_n * 2):
            out.add((bm, bn))
    return sorted(out)


def default_block_ns(seq_k: int, smallest: int = 16) -> list[int]:
    """block_n values of the rescaling-steps study: powers of two from ``smallest`` up to the first that
    covers all keys in one block (one step)."""
    out = [smallest]
    while out[-1] < seq_k:
        out.append(out[-1] * 2)
    return out


def positive_count(x: object, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1:
        raise ValueError(f"{what} must be a positive int, got {x!r}")
    return int(x)


def select_rows(seq_q: int, rows: int | Sequence[int] | None) -> np.ndarray | None:
    """The query rows evaluated: None (all), ``rows`` evenly spaced ones (first and last included), or the
    given indices. Rows are independent in both kernels (without a causal mask), so a row's output is the same
    bits whichever other rows are computed with it."""
    if rows is None:
        return None
    if isinstance(rows, (int, np.integer)) and not isinstance(rows, bool):
        r = positive_count(rows, "rows")
        if r >= seq_q:
            return None
        return np.unique(np.linspace(0, seq_q - 1, r).round().astype(np.int64))
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence | np.ndarray):
        raise TypeError(f"rows must be None, an int or a sequence of row indices, got {type(rows).__name__}")
    idx = np.asarray(rows, dtype=np.int64).ravel()
    if idx.size == 0 or idx.min() < 0 or idx.max() >= seq_q:
        raise ValueError(f"row indices must be non-empty and within [0, {seq_q}), got {list(rows)[:8]}")
    return np.unique(idx)


def _plans(p: object) -> list[Plan]:
    items = [p] if isinstance(p, (str, Plan)) else list(p)  # type: ignore[call-overload]  # not iterable: list() raises TypeError
    if not items:
        raise ValueError("attribute needs at least one plan")
    out = [_plan(x) for x in items]
    for p in out:
        if p.quantized:
            raise ValueError(
                f"plan {p.name!r} has quantizers: attribute studies the float flash plans (triton-<fmt>, "
                "h200-<fmt>, all-<fmt>, fp64 or a plan of another name); a plan with quantizers derives its "
                "isolation and ablation plans itself (Plan.isolate, Plan.ablate), to run with flash()"
            )
        if "flash" not in p.kernels():
            raise ValueError(
                f"plan {p.name!r} is a plan of the baseline kernel (torch's eager attention); "
                "attribute studies flash plans (triton-<fmt>, h200-<fmt>, all-<fmt>, fp64 or a plan of "
                f"another name): pass {p.name!r} as baseline= (CLI: --baseline)"
            )
    names = [x.name for x in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"plan names must be distinct (tables are keyed by name), repeated: {dup}")
    return out


def _tiles(tiles: object, d: int) -> list[tuple[int, int]]:
    if isinstance(tiles, (str, bytes)) or not isinstance(tiles, Sequence):
        raise TypeError(f"tiles must be a sequence of (block_m, block_n) pairs, got {type(tiles).__name__}")
    out = []
    for t in tiles:
        if isinstance(t, str):  # a tile rule, e.g. "fa1:M=98304"
            out.append(resolve_tiles(t, d))
            continue
        if isinstance(t, bytes) or not isinstance(t, Sequence) or len(t) != 2:
            raise ValueError(f"each tile must be a (block_m, block_n) pair or a rule such as 'fa1:M=98304', got {t!r}")
        out.append((positive_count(t[0], "block_m"), positive_count(t[1], "block_n")))
    return list(dict.fromkeys(out))


def attribute_inputs(
    q: object, k: object, v: object, causal: object, scale: object, call: object, heads: object, layout: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any, float | None, SdpaCall | None]:
    """attribute()'s operands: arrays (in ``layout``), or a recorded call (an :class:`SdpaCall`, or a capture
    file's path and ``call``), whose causal mask and scale are the call's. ``heads``: query heads to keep."""
    rec = None
    if isinstance(q, (str, os.PathLike)):
        with load_capture(q) as cap:
            rec = cap[0 if call is None else call]  # type: ignore[index]
    elif isinstance(q, SdpaCall):
        if call is not None and call != q.index:
            raise ValueError(f"call={call} but q is call {q.index} of its capture")
        rec = q
    elif call is not None:
        raise TypeError("call= picks a call of a capture file: pass the file's path (or an SdpaCall) as q")
    if rec is None:
        check_layout(layout)
        q, k, v = (from_layout(x, layout, n) for x, n in ((q, "q"), (k, "k"), (v, "v")))
        if heads is not None:
            arrays = [x for x in (q, k, v) if isinstance(x, np.ndarray)]
            if len(arrays) == 3:
                sel = SdpaCall(0, "", "", "", *arrays).select_heads(heads)  # type: ignore[arg-type]
                q, k, v = sel.q, sel.k, sel.v
        return q, k, v, causal, scale, None  # type: ignore[return-value]
    if k is not None or v is not None:
        raise TypeError("with a recorded call as q, leave k and v out: they are the call's")
    if layout != "bhsd":
        raise ValueError("a recorded call is in torch's layout: leave layout='bhsd'")
    rec.check()
    if causal and not rec.causal:
        raise ValueError(f"causal=True, but {rec.describe()} had no causal mask")
    if scale is not None and scale != rec.scale:
        raise ValueError(f"scale={scale}, but {rec.describe()} had scale {rec.scale}")
    rec = rec.select_heads(heads)  # type: ignore[arg-type]
    return rec.q, rec.k, rec.v, rec.causal, rec.scale, rec


def _rounding_note(plans: list[Plan], q: np.ndarray, k: np.ndarray, v: np.ndarray) -> dict[str, tuple[str, int]]:
    """Per plan whose input format does not hold the operands: (that format, how many values it changes); each
    such format warned about once (:class:`~simfloat.attention.InputFormatWarning`)."""
    out: dict[str, tuple[str, int]] = {}
    counted: dict[str, int] = {}
    for p in plans:
        fmt = input_format(p)
        if fmt is None:
            continue
        if fmt not in counted:
            counted[fmt] = sum(not_representable(x, fmt) for x in (q, k, v))
            if counted[fmt]:
                names = ", ".join(x.name for x in plans if input_format(x) == fmt)
                warnings.warn(
                    f"q, k, v hold {counted[fmt]} of {q.size + k.size + v.size} values that are not {fmt} values "
                    f"(the input format of {names}): attribute rounds them into {fmt} for those plans, as the "
                    f"kernel's caller does, and reports that rounding's own error (the input_rounding table; the "
                    f"other tables hold the kernel's error on the rounded inputs)",
                    InputFormatWarning,
                    stacklevel=3,
                )
        if counted[fmt]:
            out[p.name] = (fmt, counted[fmt])
    return out


def _dense_mask(
    q: np.ndarray,
    k: np.ndarray,
    causal: object,
    attn_mask: object,
    key_lengths: object,
    window: object,
    causal_align: object,
) -> np.ndarray | None:
    """A masked call's mask as one (..., seq_q, seq_k) array every run takes as ``attn_mask``: the visible keys
    (bool), or with an additive mask its values with -inf where a row sees no key; None without a mask."""
    from simfloat.attention._masks import DENSE_ADD, resolve_mask
    from simfloat.rounding import round as _round

    if attn_mask is None and key_lengths is None and window is None and causal_align == "top-left":
        return None
    # the kernels' leading dims: q's heads (grouped-query k, v have fewer), broadcast with the batch dims
    lead = np.broadcast_shapes(q.shape[:-3], k.shape[:-3]) + q.shape[-3:-2] if q.ndim > 2 else ()
    spec = resolve_mask(
        lead=lead,
        seq_q=q.shape[-2],
        seq_k=k.shape[-2],
        causal=bool(causal),
        attn_mask=attn_mask,
        key_lengths=key_lengths,
        window=window,
        causal_align=causal_align,
        fmt_round=lambda a: np.asarray(_round(a, "float64"), dtype=np.float64),
    )
    if spec is None:
        return None
    shape = lead + (q.shape[-2], k.shape[-2])
    if spec.mask.dense != DENSE_ADD:
        return spec.visible.reshape(shape).copy()
    return np.where(spec.visible, spec.mask.bias[spec.mask.bmap], -np.inf).reshape(shape)


def attribute(
    q: np.ndarray | SdpaCall | str | os.PathLike[str],
    k: np.ndarray | None = None,
    v: np.ndarray | None = None,
    plan: Plan | str | Sequence[Plan | str] = "triton-bf16",
    *,
    baseline: object = None,
    block_m: int = 64,
    block_n: int = 64,
    causal: bool = False,
    scale: float | None = None,
    ops: Sequence[str] = FLASH_OPS,
    tiles: Sequence[tuple[int, int]] | None = None,
    block_ns: Sequence[int] | None = None,
    rows: int | Sequence[int] | None = None,
    trace: bool = True,
    trace_rows: int | None = 64,
    progress: bool | Callable[[int, int], None] = False,
    workers: int | None = None,
    bounds: bool = False,
    layout: str = "bhsd",
    call: int | None = None,
    heads: Sequence[int] | None = None,
    estimate: bool | Callable[[Estimate], None] = False,
    attn_mask: np.ndarray | None = None,
    key_lengths: object = None,
    window: tuple[int, int] | None = None,
    causal_align: str = "top-left",
) -> Attribution:
    """Where a flash attention plan's deviation from the float64 golden output comes from.

    The golden output is the *baseline* kernel under the ``fp64`` plan (Golden et al.). For each plan:

    * isolation: only one op in the plan's precision, all others float64 (:func:`isolation_plan`);
    * ablation: only one op raised to float64 (:func:`ablation_plan`);
    * tiles: deviation per (block_m, block_n); steps: per block_n at block_m, i.e. per number of rescaling
      steps ``ceil(seq_k / block_n)`` at the fixed sequence length;
    * flash vs baseline: the plan's flash output and its paired baseline plan's output
      (:func:`baseline_plan_for`), each against the golden one;
    * per kv block (``trace``): the traced run's local error per op and kv block, and the state drift;
    * input rounding: for a plan whose input format (``triton-bf16``: bf16) does not hold the inputs (fp32
      activations), the inputs are rounded into it as the kernel's caller would (with an
      :class:`~simfloat.attention.InputFormatWarning`); every table above is then the kernel's error on the
      rounded inputs (against their golden output), and ``input_rounding`` adds the rounding's own error
      (golden of the rounded inputs against golden of the inputs as given) and the total (the kernel on the
      rounded inputs against the golden of the inputs as given).

    Isolation and ablation keep the plan's algorithm flags (exp2, FMA contraction, normalization, lazy
    rescaling, exp2 implementation, row-sum order: every :class:`Plan` field that is not an op): "all ops
    float64" is :func:`reference_plan`, which is as close to the golden output as float64 arithmetic allows,
    except for what the flags themselves approximate (the hardware ex2 of ``exp2_impl="h200"``). Every
    distinct run is made once (plans equal in every field but their names share it).

    Args:
        q, k, v: (..., seq, head_dim) float arrays, as for :func:`simfloat.attention.flash`; or, as ``q`` alone,
            a recorded call (:class:`~simfloat.attribution.SdpaCall`) or the path of a
            :func:`simfloat.torch.capture_sdpa` file (then ``call`` picks the call, default 0): its q, k, v,
            causal mask and scale.
        plan: a flash plan or preset name, or a sequence of them (distinct names).
        baseline: the baseline plan for the comparison: None (:data:`BASELINE_PAIRS` by plan name), a plan or
            name for all plans, or a mapping {flash plan name: baseline plan}.
        block_m, block_n: the tiles of the isolation, ablation, flash-vs-baseline and traced runs.
        causal, scale: as for :func:`simfloat.attention.flash` (a recorded call's own).
        ops: the ops to attribute (default all of ``FLASH_OPS``).
        tiles: (block_m, block_n) pairs of the tile study, or tile rules such as ``"fa1:M=98304"``
            (:func:`simfloat.attention.tiling.resolve_tiles`, for q's head dim; default :func:`default_tiles`;
            ``()`` skips it).
        block_ns: block_n values of the steps study at ``block_m`` (default :func:`default_block_ns`; ``()``
            skips it).
        rows: query rows to evaluate: None (all), an int (that many, evenly spaced) or row indices. Every
            kernel computes each row independently, so this gives those rows' exact outputs at a fraction of
            the cost; the metrics are then over those rows. Not with ``causal``.
        trace: add a traced default-tile run of each plan (per-kv-block tables). Tracing runs on the scalar
            reference engine, so it covers ``trace_rows`` of the evaluated rows: that many evenly spaced; with
            ``causal`` the first ones (whose masks are those of the full run), at least ``4 * block_n`` of
            them so that they reach four kv blocks; None: all of them.
        progress: ``True``: a tqdm bar on stderr, up before the first run; or a callable
            ``progress(done, total)``, called with ``done = 0`` once the distinct runs are known (before the
            first one starts) and after every run.
        workers: kernel runs made concurrently (default: numba's thread count); results do not depend on it.
        bounds: add the ``bounds`` table: per isolated op and per output (flash plan, paired baseline) the
            worst-case and probabilistic error bounds of :mod:`simfloat.bounds` next to the measured error
            and their ratio (:func:`simfloat.bounds.attribution_bounds`).
        layout: ``"bhsd"`` or ``"bshd"`` (flash-attn's (..., seq, heads, head_dim)) operands; the tables do not
            depend on it.
        call: with a capture file as ``q``: the index of the call to attribute.
        heads: query heads to keep (indices on the head axis; a key/value head goes with each, as grouped-query
            attention maps them); None: all.
        estimate: True or a callable ``estimate(Estimate)``: before the first run, time each kind of run on a
            small slice of the inputs and predict the whole job (:class:`Estimate`, kept in
            ``meta["estimate_s"]``); the callable hears it first (and may raise to stop before any run).
        attn_mask, key_lengths, window, causal_align: a mask, as for :func:`simfloat.attention.flash`, on
            every run (golden, isolation, ablation, tiles, traced rows); a row that sees no key gives 0. Every
            run takes it as each row's dense mask (the bits of the structured mask: skipped tiles are exact
            no-ops), so ``rows`` may be used with it. Not with ``bounds``.

    Returns:
        An :class:`Attribution` (DataFrames ``isolation, ablation, tiles, steps, flash_vs_baseline, by_block,
        state_by_block, input_rounding``; ``plot()``, ``to_csv()``, ``table()``).

    Raises:
        ValueError, TypeError: bad plans, ops, tiles, rows, baseline pairing, or kernel arguments (NaN or
            infinite values in q, k or v are named with their first index).
        NotImplementedError: a recorded call with options the emulator does not model (named).
        AttributionInterrupted: Ctrl-C during the kernel runs (a KeyboardInterrupt holding the finished runs).

    Warns:
        InputFormatWarning: inputs that a plan's input format does not hold (they are rounded, see above).
    """
    pd = need("pandas", "attribute")  # before any work: the tables are DataFrames
    req = _request(  # every argument checked before any run
        q,
        k,
        v,
        plan,
        baseline,
        block_m,
        block_n,
        causal,
        scale,
        ops,
        tiles,
        block_ns,
        rows,
        trace_rows,
        progress,
        layout,
        call,
        heads,
        (attn_mask, key_lengths, window, causal_align),
        bounds,
    )
    rounding = _rounding_note(req.plans, req.q, req.k, req.v)  # plans whose input format does not hold q, k, v
    run, keys = _schedule(req, rounding, trace)  # every distinct run the tables need
    est = _estimate(run, estimate, progress, req.seq_q)  # estimate=: predicted before any run
    run.run(progress, _workers(workers))
    tables = tabulate(run, req, keys, rounding)  # the rows of every table
    bound_table = bounds_table(pd, run, req, keys) if bounds else None
    return frames(pd, tables, _meta(run, req, rounding, trace, layout, est), bound_table)


def _request(
    q: object,
    k: object,
    v: object,
    plan: object,
    baseline: object,
    block_m: int,
    block_n: int,
    causal: object,
    scale: object,
    ops: Sequence[str],
    tiles: object,
    block_ns: Sequence[int] | None,
    rows: int | Sequence[int] | None,
    trace_rows: int | None,
    progress: object,
    layout: str,
    call: int | None,
    heads: Sequence[int] | None,
    masking: tuple[object, object, object, object] = (None, None, None, "top-left"),
    bounds: bool = False,
) -> Request:
    """Check every argument before any run (in this order: the operands, the plans,
    progress, ops, tiles, the operands' shapes and values, causal, rows)."""
    q, k, v, causal, scale, rec = attribute_inputs(q, k, v, causal, scale, call, heads, layout)
    plans = _plans(plan)
    if not (isinstance(progress, bool) or callable(progress)):
        raise TypeError(f"progress must be a bool or a callable progress(done, total), got {type(progress).__name__}")
    ops = list(ops)
    if not ops:
        raise ValueError("ops must name at least one op")
    for op in ops:
        if op not in FLASH_OPS:
            raise ValueError(f"unknown op {op!r}; flash ops: {', '.join(FLASH_OPS)}")
    bm, bn = positive_count(block_m, "block_m"), positive_count(block_n, "block_n")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, np.ndarray) or x.ndim < 2:
            raise TypeError(f"{name} must be a numpy array of shape (..., seq, head_dim)")
    q, k, v = (operand(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v")))  # NaN or inf: named by the caller's index
    kv_repeats(q.shape, k.shape, "k"), kv_repeats(q.shape, v.shape, "v")  # heads that do not divide: before any run
    seq_q, seq_k = q.shape[-2], k.shape[-2]
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    sel = select_rows(seq_q, rows)
    if sel is not None and causal:
        raise ValueError(
            "rows (a subset of query rows) cannot be used with causal=True: a causal row's keys "
            "depend on its position; use rows=None"
        )
    tile_list = default_tiles(bm, bn) if tiles is None else _tiles(tiles, int(np.shape(q)[-1]))
    bns = default_block_ns(seq_k) if block_ns is None else [positive_count(b, "block_n") for b in block_ns]
    pairs = {p.name: baseline_plan_for(p, baseline) for p in plans}
    t_sel = _traced_rows(seq_q if sel is None else len(sel), trace_rows, bool(causal), bn)
    dense = _dense_mask(q, k, causal, *masking)
    if dense is not None and bounds:
        raise ValueError("bounds=True does not model masks: leave attn_mask, key_lengths and window out")
    if dense is not None and sel is not None:
        dense = dense[..., sel, :]
    return Request(
        q,
        k,
        v,
        bool(causal),
        scale,
        rec,
        plans,
        ops,
        bm,
        bn,
        sel,
        tile_list,
        list(dict.fromkeys(bns)),
        pairs,
        t_sel,
        dense,
    )


def _traced_rows(n_eval: int, trace_rows: int | None, causal: bool, bn: int) -> np.ndarray:
    """The evaluated rows the traced run covers: ``trace_rows`` of them evenly spaced (causal: the first ones, a
    subset's mask would not be the full run's, enough to reach 4 kv blocks); None: all."""
    if trace_rows is not None:
        trace_rows = positive_count(trace_rows, "trace_rows")
    if trace_rows is None or trace_rows >= n_eval:
        return np.arange(n_eval)
    if causal:
        return np.arange(min(n_eval, max(trace_rows, 4 * bn)))
    return np.unique(np.linspace(0, n_eval - 1, trace_rows).round().astype(np.int64))


def _schedule(req: Request, rounding: dict[str, tuple[str, int]], trace: bool) -> tuple[Runner, dict[str, Any]]:
    """Every run the tables need, keyed per plan (the runner makes each distinct one once)."""
    qs = req.q if req.sel is None else req.q[..., req.sel, :]
    run = Runner(qs, req.k, req.v, req.causal, req.scale, req.mask)
    run.need_golden()
    bm, bn = req.bm, req.bn
    keys: dict[str, Any] = {}
    for p in req.plans:
        var = run.variant(rounding[p.name][0]) if p.name in rounding else None
        if var is not None:
            run.need_golden(var)
        keys[p.name] = dict(
            variant=var,
            main=run.need("flash", p, bm, bn, variant=var),
            traced=run.need("flash", p, bm, bn, trace_rows=req.t_sel, variant=var) if trace else None,
            ref=run.need("flash", reference_plan(p), bm, bn, variant=var),
            base=run.need("baseline", req.pairs[p.name], variant=var),
            iso={op: run.need("flash", isolation_plan(p, op), bm, bn, variant=var) for op in req.ops},
            abl={op: run.need("flash", ablation_plan(p, op), bm, bn, variant=var) for op in req.ops},
            tiles={t: run.need("flash", p, *t, variant=var) for t in req.tile_list},
            steps={b: run.need("flash", p, bm, b, variant=var) for b in req.bns},
        )
    return run, keys


def _estimate(run: Runner, estimate: object, progress: object, seq_q: int) -> Estimate | None:
    """With ``estimate``: time each kind of run on a slice and predict the job, before any run."""
    if not estimate:
        return None
    if not (estimate is True or callable(estimate)):
        raise TypeError(f"estimate must be a bool or a callable estimate(Estimate), got {type(estimate).__name__}")
    if callable(progress):  # the number of runs first (as run() would), then the estimate, then the runs
        progress(0, len(run.jobs))
    est = run.estimate(seq_q)
    if callable(estimate):
        estimate(est)
    return est


def _meta(
    run: Runner,
    req: Request,
    rounding: dict[str, tuple[str, int]],
    trace: bool,
    layout: str,
    est: Estimate | None,
) -> dict[str, Any]:
    """The attribution's settings and totals (``Attribution.meta``)."""
    sel, q, k, v = req.sel, req.q, req.k, req.v
    golden0 = run.out(run.golden[None])
    return dict(
        shape_q=tuple(q.shape),
        shape_k=tuple(k.shape),
        shape_v=tuple(v.shape),
        seq_q=req.seq_q,
        seq_k=req.seq_k,
        rows=req.seq_q if sel is None else len(sel),
        row_indices=None if sel is None else sel.tolist(),
        block_m=req.bm,
        block_n=req.bn,
        trace_rows=len(req.t_sel) if trace else 0,
        causal=req.causal,
        scale=req.scale,
        plans=[p.name for p in req.plans],
        baselines={a: b.name for a, b in req.pairs.items()},
        runs=len(run.jobs),
        kernel_seconds=sum(j["seconds"] for j in run.jobs.values()),
        golden_rms=float(np.sqrt(np.mean(np.square(golden0)))) if golden0.size else math.nan,
        layout=layout,
        call=None if req.rec is None else req.rec.meta(),
        input_rounding={a: f for a, (f, _) in rounding.items()},
        estimate_s=None if est is None else est.seconds,
        **{"pass": "forward"},
    )


def _workers(workers: int | None) -> int:
    if workers is None:
        import numba

        return numba.get_num_threads()
    return positive_count(workers, "workers")
