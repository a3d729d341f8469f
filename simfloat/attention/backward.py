"""The attention backward pass under a precision plan: flash (FA2, mirroring
``simfloat_gpu/kernels/flash_attention_bwd.py``) and
torch's eager autograd of the baseline.

:func:`flash_backward` follows the Triton kernels' steps (their module docstring: D1..D3, B1..B9, Q1..Q4,
E1..E3); ``op(x)`` is x rounded once into op's format (:class:`~simfloat.attention.backward_plan.BackwardPlan`):

* D2 ``delta_i = delta(... delta(delta(o_i0 do_i0) + delta(o_i1 do_i1)) ...)``, left to right from 0;
  D3 ``lse_i = lse(m_i + lse(log2 l_i))`` (natural log without ``exp2``), :func:`lse_from_stats`;
* per key tile (block_n keys) and per query tile (block_m rows) in increasing order, from the first tile with
  a row that sees one of the keys when causal: for every row i and visible key j,
  B2 ``s_ij = qk(q_i . k_j)``, B4 ``p_ij = exp(exp2(scale(fma(s_ij, qk_scale, -lse_i))))``,
  B6 ``dp_ij = dp(do_i . v_j)``, B7 ``ds_ij = ds(p_ij * ds(dp_ij - delta_i))``, B8 ``ds_ij = ds_cast(ds_ij)``;
  masked pairs have p = ds = 0;
* B5 ``dv_j = dv(dv_j + sum_i p(p_ij) do_i)`` and B9 ``dk_j = dk(dk_j + sum_i ds_ij q_i)`` over the block_m rows
  of each query tile (one MMA per tile, rows past seq_q zero), Q4 ``dq_i = dq(dq_i + sum_j ds_ij k_j)`` over the
  block_n keys of each key tile (keys past seq_k zero), each with the accumulator entering the model;
  with ``plan.dq_accumulation == "atomic"`` (FlashAttention-2/3's atomicAdd of dQ) instead Q4a
  ``c_it = dq(sum_{j in tile t} ds_ij k_j)`` from zero per key tile t the row's query tile visits, then Q4b
  ``dq_i = dq_atomic(dq_i + c_it)`` from 0 over those key tiles in ``plan.dq_order`` (per (lead, query tile));
* E1/E3 ``dk_j = grad(grad_scale(dk_j * sm_scale))``, ``dq_i`` likewise, E2 ``dv_j = grad(dv_j)``.
* G1 grouped-query attention (k, v with ``kv_heads`` heads, q with ``heads = group * kv_heads``; query head h
  reads key/value head ``h // group``, :func:`simfloat.attention._inputs.kv_group`): dK and dV of a key/value
  head and key tile run B5/B9 over the group's query heads ``h = kv * group + g`` in increasing g, each over its
  query tiles in increasing order, in the one accumulator (no separate reduction, E1/E2 once at the end); dQ
  and delta are per query head as above.

The kernels recompute P and dS twice (the dK/dV and the dQ passes), with the same ops on the same operands, so
the emulator computes them once per (key tile, query tile) and feeds all three gradients: each gradient still
accumulates in the kernel's order. Dots run on the vector engine's row kernels (``row_mma``),
element-wise ops on the lane roundings of :mod:`simfloat._lanes` (the scalar ops where a format has no lane
form); leading indices (batch, heads) run on all threads, bitwise identical for any thread count.

:func:`baseline_backward` is what torch's eager autograd of ``softmax(scale * q @ k^T) @ v`` computes in a
format under a ``pytorch-<fmt>`` plan (see its docstring for the op order it models).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from simfloat._jit import record_of
from simfloat._parallel import run_rows
from simfloat.attention._backward_inputs import check, flat, lse_from_stats, prescaled_k, scale_of
from simfloat.attention._baseline_backward import baseline_backward
from simfloat.attention._build import check_engine
from simfloat.attention._dq_order import diag_of, dq_orders, seen_of
from simfloat.attention._inputs import block, check_input_format, from_layout, to_layout
from simfloat.attention._masks import NO_MASK, KeyMask, MaskSpec, resolve_mask
from simfloat.attention.backward_plan import BackwardPlan, backward_plan
from simfloat.attention.reference import backward as ref
from simfloat.attention.reference.backward import BACKWARD_STATES, TRACED_BACKWARD_OPS
from simfloat.attention.vector.backward import run as run_vector
from simfloat.rounding import round as _round
from simfloat.trace import Tracer

__all__ = ["BACKWARD_STATES", "TRACED_BACKWARD_OPS", "baseline_backward", "flash_backward", "lse_from_stats"]


def flash_backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    o: np.ndarray,
    do: np.ndarray,
    lse: np.ndarray,
    *,
    plan: BackwardPlan | str = "triton-bf16",
    block_m: int = 64,
    block_n: int = 64,
    block_m2: int | None = None,
    block_n2: int | None = None,
    causal: bool = False,
    scale: float | None = None,
    return_delta: bool = False,
    engine: str | None = None,
    trace: Tracer | None = None,
    layout: str = "bhsd",
    seed: int | None = None,
    attn_mask: np.ndarray | None = None,
    key_lengths: object = None,
    window: tuple[int, int] | None = None,
    causal_align: str = "top-left",
    empty_rows: str = "zero",
) -> tuple[np.ndarray, ...]:
    """Emulated FA2 backward: (dq, dk, dv) of ``softmax(scale * q @ k^T [mask]) @ v`` under a backward plan.

    Args:
        q: (..., seq_q, head_dim); k: (..., seq_k, head_dim); v: (..., seq_k, head_dim_v) float32/float64, in the
            kernel's input format (round them first). Leading dims must be equal for all five arrays, but for
            k's and v's head axis (the third from last), whose size ``kv_heads`` may divide q's ``heads``
            (grouped-query / multi-query attention: step G1 of the module docstring).
        o: (..., seq_q, head_dim_v) the forward's output as stored (input format or fp32: delta from fp32 O).
        do: (..., seq_q, head_dim_v) gradient of the output (input format).
        lse: (..., seq_q) the forward's log-sum-exp (log2 units with ``plan.exp2``): :func:`lse_from_stats` of
            the forward's (m, l).
        plan: a :class:`~simfloat.attention.backward_plan.BackwardPlan` or preset name (default ``"triton-bf16"``).
        block_m, block_n: the kernels' query / key tiles (any positive ints): the dK/dV kernel's (the Triton
            tutorial's BLOCK_M1, BLOCK_N1), and the dQ kernel's unless given below.
        block_m2, block_n2: the dQ kernel's query / key tiles (the tutorial's BLOCK_M2, BLOCK_N2); None: block_m,
            block_n. They decide the key tiles of Q4's MMAs, the causal query tile's last key tile and, with
            ``plan.dq_order``, the order of those tiles.
        causal: top-left aligned mask. scale: softmax scale (default 1/sqrt(head_dim)).
        return_delta: also return delta = rowsum(dO * O) ((..., seq_q)).
        engine: ``"vector"`` (default: the row kernels) or ``"reference"`` (the scalar ops and ``dot_acc`` per
            output: the test oracle). Both give the same bits. None: vector, reference when tracing.
        trace: a :class:`simfloat.Tracer`, or None. Traced calls run on the reference engine and return the
            same bits. The run (kernel ``"flash_backward"``) holds, per (lead, query tile, key tile), the local
            error of every op of :data:`TRACED_BACKWARD_OPS` (its result minus the float64 result of the same
            operation on the same operands; an MMA step's reference is its float64 dot from the same
            accumulator) and the drift of the dq, dk, dv accumulators after each tile step from a float64 shadow
            of the same dataflow (same inputs, o and lse; P, dP, delta, dS and every dot in float64), unscaled.
            Key tile -1 holds D2 (delta, at the row's query tile) and the epilogue E1..E3 with the final
            gradients' drift (dq at the row's query tile, dk and dv at query tile 0).
        layout: ``"bhsd"`` or ``"bshd"`` (q, k, v, o, do and the gradients (..., seq, heads, head_dim), as
            flash-attn; lse and delta stay (..., heads, seq_q)).
        seed: a plan with ``dq_order="seeded"`` only: the seed of the atomic dQ adds' order (one permutation of
            the key tiles per (lead, query tile), ``numpy.random.default_rng(seed)``; None: 0). Two seeds are
            two runs of a nondeterministic kernel: dQ may differ, dK and dV do not.
        attn_mask, key_lengths, window, causal_align: the forward's mask (:func:`~simfloat.attention.flash`):
            masked pairs have p = ds = 0 (B3: ``where`` for a bool mask; an additive mask is added to the
            scaled scores as in the forward, then lse is subtracted: ``scale(z - lse)``); the structured masks
            decide the query tiles a key tile walks (dK, dV) and the key tiles a query tile walks (dQ).
        empty_rows: rows that see no key: ``"raise"`` names the first; ``"zero"`` (they add nothing: dq of the
            row 0, as baseline_backward's and SDPA's safe softmax) or ``"nan"`` (dq of the row NaN, and dk, dv of
            its lead's key/value head NaN, SDPA's math). Their lse may be -inf (the forward's, through
            :func:`lse_from_stats`) or any finite value; a row that sees a key must have a finite lse.

    Returns:
        (dq, dk, dv) float64 arrays of q's, k's, v's shapes holding values of ``plan.grad``'s format; with
        ``return_delta``, (dq, dk, dv, delta).

    Warns:
        InputFormatWarning: q, k, v or do not values of the plan's input format.

    Raises:
        TypeError, ValueError: bad arrays, shapes, dtypes (each named), block sizes, scale or plan; k or v heads
            that do not divide q's (named); an ``lse``
            that does not belong to these inputs under this plan (a row's recomputed P does not sum to about 1:
            the lse of another plan, scale, mask or inputs); a seed with a plan whose dQ order is not seeded; a
            ``dq_order`` that does not fit the key tiles.
    """
    pl = backward_plan(plan)
    _check_seed(seed, pl)
    q, k, v, o, do = (from_layout(x, layout, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (o, "o"), (do, "do")))
    qa, ka, va, oa, da, group, la = check(q, k, v, o, do, lse)
    check_input_format({"q": qa, "k": ka, "v": va, "do": da}, pl, stacklevel=3)
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    tiles = _tiles_of(pl, block_m, block_n, block_m2, block_n2)
    if trace is not None and not isinstance(trace, Tracer):
        raise TypeError(f"trace must be a simfloat.Tracer or None, got {type(trace).__name__}")
    which = check_engine(engine, trace is not None)
    sc = scale_of(scale, qa.shape[-1])
    qf, kf, vf, of, dof = (flat(x, x.shape[:-2]) for x in (qa, ka, va, oa, da))
    if pl.scale_at == "k":  # the host's K pre-scaled by scale / ln 2 (the Triton tutorial's arg_k)
        kf = prescaled_k(kf, sc, pl)
    n_lead, seq_q, seq_k = qf.shape[0], qf.shape[1], kf.shape[1]
    mask = {"attn_mask": attn_mask, "key_lengths": key_lengths, "window": window, "causal_align": causal_align}
    spec = _mask_spec(pl, qa.shape[:-2], seq_q, seq_k, bool(causal), empty_rows, mask)
    lf = _lse_rows(la, qf.shape[:2], spec)
    order = _order(pl, seed, spec, tiles, bool(causal), n_lead, seq_q, seq_k)
    mk = NO_MASK if spec is None else spec.mask
    out = _Grads.zeros(qf, kf, vf)
    if which == "reference":
        shape = (qa.shape[:-2], bool(causal), group, sc)
        _run_reference(pl, trace, tiles, shape, (qf, kf, vf, of, dof, lf), out, order, mk)
    else:
        run_vector(pl, pl.params(sc), qf, kf, vf, of, dof, lf, *out, tiles, bool(causal), order, mk)
    _check_row_sums(out.psum, spec, pl)
    _empty_rows_nan(out, spec, group)
    grads = tuple(to_layout(g.reshape(x.shape), layout) for g, x in ((out.dq, qa), (out.dk, ka), (out.dv, va)))
    if return_delta:
        return grads + (out.delta.reshape(qa.shape[:-1]),)
    return grads


class _Tiles(NamedTuple):
    """The kernels' tiles: the dK/dV kernel's (bm, bn), the dQ kernel's (bm2, bn2); ``walk``: Q4 is a pass of its
    own over the dQ kernel's tiles (atomic dQ, a dQ order other than forward, or dQ tiles other than (bm, bn))."""

    bm: int
    bn: int
    bm2: int
    bn2: int
    walk: bool


class _Grads(NamedTuple):
    """What the engines fill in place: delta (L, Sq) (D2), dq (L, Sq, D), dk (Lk, Sk, D), dv (Lk, Sk, Dv), and
    psum (L, Sq), each row's sum of the recomputed P (the lse check); L query leads, Lk key/value leads."""

    delta: np.ndarray
    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    psum: np.ndarray

    @staticmethod
    def zeros(qf: np.ndarray, kf: np.ndarray, vf: np.ndarray) -> _Grads:
        (n_lead, seq_q, d), (n_kv_lead, seq_k, dvd) = qf.shape, vf.shape
        return _Grads(
            np.zeros((n_lead, seq_q)),
            np.zeros((n_lead, seq_q, d)),
            np.zeros((n_kv_lead, seq_k, d)),
            np.zeros((n_kv_lead, seq_k, dvd)),
            np.zeros((n_lead, seq_q)),
        )


def _check_seed(seed: int | None, pl: BackwardPlan) -> None:
    """A seed is a non-negative int, for a plan whose dQ order is seeded."""
    if seed is None:
        return
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise TypeError(f"seed must be a non-negative int or None, got {seed!r}")
    if pl.dq_order != "seeded":
        raise ValueError(
            f"seed is for plans with dq_order='seeded' (atomic dQ in a random order); plan {pl.name!r} has "
            f"dq_accumulation={pl.dq_accumulation!r}, dq_order={pl.dq_order!r}"
        )


def _tiles_of(pl: BackwardPlan, block_m: int, block_n: int, block_m2: int | None, block_n2: int | None) -> _Tiles:
    """The checked tiles (the dQ kernel's default to the dK/dV kernel's) and whether dQ walks on its own."""
    bm, bn = block(block_m, "block_m"), block(block_n, "block_n")
    bm2 = bm if block_m2 is None else block(block_m2, "block_m2")
    bn2 = bn if block_n2 is None else block(block_n2, "block_n2")
    walk = pl.dq_accumulation == "atomic" or pl.dq_order != "forward" or (bm2, bn2) != (bm, bn)
    return _Tiles(bm, bn, bm2, bn2, walk)


def _mask_spec(
    pl: BackwardPlan,
    lead: tuple[int, ...],
    seq_q: int,
    seq_k: int,
    causal: bool,
    empty_rows: str,
    mask: dict[str, Any],
) -> MaskSpec | None:
    """B3's mask as the forward resolves it (an additive mask rounded into the scale op's format); None: none."""
    return resolve_mask(
        lead=lead,
        seq_q=seq_q,
        seq_k=seq_k,
        causal=causal,
        empty_rows=empty_rows,
        fmt_round=lambda a: np.asarray(_round(a, pl.scale.fmt, pl.scale.mode), dtype=np.float64),
        **mask,
    )


def _lse_rows(la: np.ndarray, shape: tuple[int, ...], spec: MaskSpec | None) -> np.ndarray:
    """lse as (L, Sq) float64; the forward's -inf of a row that sees no key (it adds nothing, its lse is
    unused) becomes 0, a -inf at a row that sees keys is an error."""
    lf = np.ascontiguousarray(la, dtype=np.float64).reshape(shape)
    inf_rows = lf == -np.inf
    if not np.any(inf_rows):
        return lf
    seen = ~inf_rows if spec is None else ~inf_rows | spec.empty
    if not seen.all():
        idx = np.unravel_index(int(np.argmin(seen)), lf.shape)
        raise ValueError(
            f"lse is -inf at row {tuple(map(int, idx))}, which sees keys: only a row that sees no key "
            "(under causal and the masks) may have lse -inf"
        )
    return np.where(inf_rows, 0.0, lf)


def _order(
    pl: BackwardPlan,
    seed: int | None,
    spec: MaskSpec | None,
    tiles: _Tiles,
    causal: bool,
    n_lead: int,
    seq_q: int,
    seq_k: int,
) -> np.ndarray:
    """Q4's key tiles per (lead, dQ query tile) in the plan's order (:func:`~simfloat.attention._dq_order.
    dq_orders`; a masked call's tiles per lead)."""
    bm2, bn2, mk = tiles.bm2, tiles.bn2, NO_MASK if spec is None else spec.mask
    seen_lt = diag_lt = None
    if spec is not None and tiles.walk:  # per lead and query tile: the key tiles seen, the first diagonal one
        n_qt = -(-seq_q // bm2)
        grid = [(b, t) for b in range(n_lead) for t in range(n_qt)]
        seen_lt = np.array([seen_of(mk, causal, b, t, bm2, bn2, seq_k) for b, t in grid], dtype=np.int64)
        diag_lt = np.array([diag_of(mk, causal, b, t, bm2, bn2) for b, t in grid], dtype=np.int64)
        seen_lt, diag_lt = seen_lt.reshape(n_lead, n_qt), diag_lt.reshape(n_lead, n_qt)
    seed_ = 0 if seed is None else int(seed)
    return dq_orders(pl, seed_, n_lead, seq_q, seq_k, bm2, bn2, causal, seen_lt, tiles.walk, diag_lt)


def _run_reference(
    pl: BackwardPlan,
    trace: Tracer | None,
    tiles: _Tiles,
    shape: tuple[tuple[int, ...], bool, int, float],
    xs: tuple[np.ndarray, ...],
    out: _Grads,
    order: np.ndarray,
    mk: KeyMask,
) -> None:
    """The reference engine's run (traced or not): D2, then the dK/dV pass and Q4, E1..E3 into ``out``.
    ``shape``: (lead, causal, group, scale); ``xs``: the flattened (q, k, v, o, do, lse)."""
    lead, causal, group, sc = shape
    qf, kf, vf, of, dof, lf = xs
    pp = pl.params(sc)
    n_lead, seq_q = qf.shape[:2]
    n_kv_lead, seq_k = kf.shape[:2]
    if n_lead * seq_q:
        run_rows(ref.delta_units, n_lead * seq_q, of, dof, out.delta, pp.delta)
    tr = None
    if trace is not None:
        n_qt, n_kv = -(-seq_q // tiles.bm), -(-seq_k // tiles.bn)
        tr = trace._start(
            "flash_backward",
            pl.name,
            TRACED_BACKWARD_OPS,
            n_lead,
            n_qt,
            n_kv,
            states=BACKWARD_STATES,
            lead=lead,
            block_m=tiles.bm,
            block_n=tiles.bn,
            causal=causal,
            scale=sc,
        )
    # the float64 shadow's multipliers: B4's qk_scale, E1's, E3's, B7's
    sh = {
        "scores": (sc * math.log2(math.e) if pl.exp2 else sc, sc, sc, 1.0),
        "ds": (sc * math.log2(math.e) if pl.exp2 else sc, 1.0, 1.0, sc),
        "k": (1.0, sc, math.log(2.0), 1.0),
    }[pl.scale_at]
    if n_kv_lead:
        geo = ref.Geometry(tiles.bm, tiles.bn, causal, group, tiles.bm2, tiles.bn2, tiles.walk, seq_q, seq_k)
        ins = ref.Inputs(qf, kf, vf, dof, of, lf, out.delta, order, mk, pp.ex2_tab)
        run_rows(ref.units, n_kv_lead, ins, out, record_of(pp, skip=("ex2_tab",)), geo, tr, sh)


def _check_row_sums(psum: np.ndarray, spec: MaskSpec | None, pl: BackwardPlan) -> None:
    """Every row that sees a key sums its recomputed P to about 1, else lse belongs to other inputs."""
    bad = ~((psum > 0.5) & (psum < 2.0))
    if spec is not None:  # a row that sees no key sums no P
        bad &= ~spec.empty
    if psum.shape[1] and np.any(bad):
        idx = np.unravel_index(int(np.argmax(bad)), psum.shape)
        raise ValueError(
            f"lse does not belong to these inputs under plan {pl.name!r}: row {tuple(map(int, idx))}'s "
            f"recomputed P sums to {psum[idx]:.6g}, not about 1 (an lse of another plan, scale, mask "
            "or inputs; compute it with lse_from_stats from this forward's m and l)"
        )


def _empty_rows_nan(out: _Grads, spec: MaskSpec | None, group: int) -> None:
    """``empty_rows="nan"``: dq of a row that sees no key NaN, and dk, dv of its key/value head (SDPA's math)."""
    if spec is None or spec.empty_rows != "nan" or not spec.empty.any():
        return
    n_kv_lead = out.dk.shape[0]
    out.dq[spec.empty] = np.nan
    kv_bad = spec.empty.any(axis=1).reshape(n_kv_lead, group if n_kv_lead else 1).any(axis=1)
    out.dk[kv_bad] = np.nan
    out.dv[kv_bad] = np.nan
