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
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np

from simfloat import ops as _ops
from simfloat._jit import fma64, jit
from simfloat._lanes import Lane, ladd, lane, lmul, lround
from simfloat._parallel import run_rows
from simfloat.accumulate import dot_acc
from simfloat.accumulate._rows import (
    MMA,
    BStack,
    b_stack,
    for_operands,
    mma,
    operand_powers,
    round_operands,
    row_mma,
    tile_of,
    work,
)
from simfloat.attention._build import check_engine, dot_output_format
from simfloat.attention._engine import _cast, _exp_of, _scale_by, _scaled, _weights_of
from simfloat.attention._inputs import block, check_input_format, check_qkv, from_layout, kv_group, operand, to_layout
from simfloat.attention._kernels import add, dot64, exp_op, fma, mul, rnd, sub
from simfloat.attention._masks import (
    DENSE_ADD,
    NO_MASK,
    KeyMask,
    key_masked,
    qtile_range,
    resolve_mask,
    row_span,
    tile_range,
)
from simfloat.attention.backward_plan import FLASH_BACKWARD_OPS, BackwardParams, BackwardPlan, backward_plan
from simfloat.attention.plan import OpSpec
from simfloat.formats import FloatFormat
from simfloat.ops import log_dd
from simfloat.rounding import round as _round
from simfloat.trace import Tracer, record

_LOG2E = math.log2(math.e)

__all__ = ["BACKWARD_STATES", "TRACED_BACKWARD_OPS", "baseline_backward", "flash_backward", "lse_from_stats"]

#: the ops a traced :func:`flash_backward` records, in the kernels' order (``lse`` is :func:`lse_from_stats`'s)
TRACED_BACKWARD_OPS = tuple(op for op in FLASH_BACKWARD_OPS if op != "lse")
#: the accumulators whose drift from the float64 shadow a traced :func:`flash_backward` records
BACKWARD_STATES = ("dq", "dk", "dv")
# op indices (positions in TRACED_BACKWARD_OPS) and state indices (in BACKWARD_STATES), looked up by name
B_DELTA, B_QK, B_SCALE, B_EXP, B_P, B_DV, B_DP, B_DS, B_DS_CAST, B_DK, B_DQ, B_GRAD_SCALE, B_GRAD = (
    TRACED_BACKWARD_OPS.index(n)
    for n in ("delta", "qk", "scale", "exp", "p", "dv", "dp", "ds", "ds_cast", "dk", "dq", "grad_scale", "grad")
)
S_DQ, S_DK, S_DV = (BACKWARD_STATES.index(n) for n in ("dq", "dk", "dv"))


class BwdLanes(NamedTuple):
    """Lane forms of the backward's element-wise ops."""

    delta: Lane
    scale: Lane
    exp: Lane
    p: Lane
    ds: Lane
    ds_cast: Lane
    grad_scale: Lane
    grad: Lane
    dq_atomic: Lane


class BwdEngine(NamedTuple):
    """What every unit of work needs besides its operands.

    Attributes:
        pp: :class:`~simfloat.attention.backward_plan.BackwardParams`. ln: :class:`BwdLanes`.
        qk, dv, dp, dk, dq: the dots as :class:`~simfloat.accumulate._rows.MMA` records.
        fma_exact: ``s * qk_scale`` is exact in float64 (the fused B4 shift may use its lane form).
        bm, bn: tile sizes; causal; seq_q, seq_k; group: query heads per key/value head (1: none shared).
        dq_order: (L, n_qt2, n_kv2) int64, when dQ walks its own tiles (``walk``): per query lead and dQ query
            tile the dQ key tiles it sees in the order of their MMAs (or atomic adds, Q4b), then the rest; else
            empty.
        mk: the call's :class:`~simfloat.attention._masks.KeyMask` (per query lead; ``NO_MASK``: none beyond
            ``causal``).
        walk: Q4 is a pass of its own over the stored dS (:func:`_dq_walk_units`): atomic dQ, a dQ order other
            than forward or dQ tiles (bm2, bn2) other than (bm, bn); else Q4 runs in the dK/dV pass.
        bm2, bn2: the dQ kernel's query / key tiles.
    """

    pp: object
    ln: BwdLanes
    qk: MMA
    dv: MMA
    dp: MMA
    dk: MMA
    dq: MMA
    fma_exact: bool
    bm: int
    bn: int
    causal: bool
    seq_q: int
    seq_k: int
    group: int
    dq_order: np.ndarray
    mk: KeyMask = NO_MASK
    walk: bool = False
    bm2: int = 64
    bn2: int = 64


class BwdOperands(NamedTuple):
    """Operands, rounded into each dot's input format, tile by tile where a dot reads tiles, with their
    alignment weights (``e*``; :func:`simfloat.accumulate._rows.operand_powers`); a dot's B operands as a
    :class:`simfloat.accumulate._rows.BStack` (with their float32 forms).

    Attributes:
        q: (L, Sq, D) rows for B2. kt: (Lk * n_kv, D, bn) K^T tiles for B2.
        do: (L, Sq, Dv) rows for B6. vt: (Lk * n_kv, Dv, bn) V^T tiles for B6.
        do_t: (L * n_qt, bm, Dv) dO tiles for B5. q_t: (L * n_qt, bm, D) Q tiles for B9.
        k_t: (Lk * n_kv2, bn2, D) K tiles for Q4 (the dQ kernel's key tiles).
        lse, delta: (L, Sq). L = Lk * group query leads, Lk key/value leads.
    """

    q: np.ndarray
    eq: np.ndarray
    kt: BStack
    do: np.ndarray
    edo: np.ndarray
    vt: BStack
    do_t: BStack
    q_t: BStack
    k_t: BStack
    lse: np.ndarray
    delta: np.ndarray


# -- njit kernels --------------------------------------------------------------------------------------------


@jit
def _delta_units(lo, hi, o, do, delta, r, op):
    """D2 for rows [lo, hi) of the flattened (lead, query) grid."""
    seq_q, d = o.shape[1], o.shape[2]
    for u in range(lo, hi):
        b = u // seq_q
        i = u - b * seq_q
        s = 0.0
        if r.fast:
            for c in range(d):
                s = ladd(s, lmul(o[b, i, c], do[b, i, c], r), r)
        else:
            for c in range(d):
                s = add(s, mul(o[b, i, c], do[b, i, c], op), op)
        delta[b, i] = s


@jit
def _ds_of(y, p, dp, n, delta, r, op):
    """B7: y[:n] = ds(p * ds(dp - delta))."""
    if r.fast:
        for j in range(n):
            y[j] = lmul(p[j], ladd(dp[j], -delta, r), r)
    else:
        for j in range(n):
            y[j] = mul(p[j], sub(dp[j], delta, op), op)


@jit
def _operand_row(x, n, mp, xin, ex):
    """x[:n] as the dot reads it (its input format) into xin[:n], with its weights in ex[:n]; returns xin."""
    if mp.in_round:
        for j in range(n):
            xin[j] = lround(x[j], mp.inp)
    else:
        for j in range(n):
            xin[j] = x[j]
    if mp.align_sum:
        _weights_of(xin, ex, n, mp.opnd_emin)
    return xin


@jit
def _epilogue(x, n, w, eng):
    """E1..E3: x[:n] = grad(grad_scale(x * w)) (w > 0: sm_scale or dq_scale), else (w = 0) grad(x)."""
    pp, ln = eng.pp, eng.ln
    if w > 0.0:
        _scale_by(x, n, w, ln.grad_scale, pp.grad_scale)
    _cast(x, 0, n, ln.grad, pp.grad)


@jit
def _mask_scores(s, nv, b, i, j0, lo, pp, mk):
    """B3: row i's masked keys get -inf; with an additive mask the scores become
    ``scale(fma(s, qk_scale, bias'))`` (``contract``; else ``scale(scale(s * qk_scale) + bias')``), ``bias' =
    scale(bias * scale(log2 e))`` under exp2, as the forward's T3."""
    l2e = rnd(_LOG2E, pp.scale)
    for jj in range(nv):
        if key_masked(mk, b, i, j0 + jj, lo):
            s[jj] = -np.inf
        elif mk.dense == DENSE_ADD:
            bv = mk.bias[mk.bmap[b], i, j0 + jj]
            b2 = mul(bv, l2e, pp.scale) if pp.exp2 else bv
            if pp.contract:
                s[jj] = fma(s[jj], pp.qk_scale, b2, pp.scale)
            else:
                s[jj] = add(mul(s[jj], pp.qk_scale, pp.scale), b2, pp.scale)


@jit
def _bwd_units(lo, hi, xs, dq, dk, dv, psum, eng, dsf):
    """Key/value lead indices [lo, hi): every key tile with the query tiles of every query head of its group
    (see the module docstring); query head ``bk * group + g`` reads key/value head ``bk``. With ``eng.walk``
    B8's dS goes to ``dsf`` (L, seq_q, seq_k), zeros on entry, and dq is left to :func:`_dq_walk_units`."""
    pp, ln, mk = eng.pp, eng.ln, eng.mk
    bm, bn, seq_q, seq_k, group = eng.bm, eng.bn, eng.seq_q, eng.seq_k, eng.group
    d, dvd = xs.q.shape[2], xs.do.shape[2]
    n_qt, n_kv = (seq_q + bm - 1) // bm, (seq_k + bn - 1) // bn
    sscale = 1.0 if mk.dense == DENSE_ADD else pp.qk_scale  # an additive mask's scores are scaled already
    s, x, dpr, y = np.zeros(bn), np.zeros(bn), np.zeros(bn), np.zeros(bn)
    yin, ey = np.zeros(bn), np.zeros(bn)
    pt, dst = np.zeros((bn, bm)), np.zeros((bn, bm))
    rin, er = np.zeros(bm), np.zeros(bm)
    dka, dva = np.zeros((bn, d)), np.zeros((bn, dvd))
    w = work(max(bn, bm, d, dvd))
    for bk in range(lo, hi):
        for g in range(group):
            for i in range(seq_q):
                for c in range(d):
                    dq[bk * group + g, i, c] = 0.0
        for jt in range(n_kv):
            j0 = jt * bn
            nk = min(bn, seq_k - j0)
            ktile = bk * n_kv + jt
            dka[:, :] = 0.0
            dva[:, :] = 0.0
            t0 = j0 // bm if eng.causal else 0
            t1 = n_qt
            for g in range(group):  # G1: the group's query heads in order, each over its query tiles
                b = bk * group + g
                if mk.on:  # the query tiles with a row that may see the key tile (the backward's m_block range)
                    t0, t1 = qtile_range(mk, eng.causal, b, jt, bm, bn, seq_q, seq_k)
                for t in range(t0, t1):
                    r0 = t * bm
                    nr = min(bm, seq_q - r0)
                    pt[:, :] = 0.0
                    dst[:, :] = 0.0
                    for r in range(nr):
                        i = r0 + r
                        nv = nk
                        if eng.causal:
                            nv = max(0, min(nk, i + 1 - j0))
                        k_lo = 0
                        if mk.on:  # the structured mask: keys [k_lo, hi)
                            k_lo, k_hi = row_span(mk, eng.causal, b, i, seq_k)
                            nv = max(0, min(nk, k_hi - j0))
                            if k_lo >= j0 + nv:
                                nv = 0
                        if nv == 0:
                            continue
                        for jj in range(nv):  # B2
                            s[jj] = 0.0
                            dpr[jj] = 0.0
                        kt, ekt, kt32, ekt32 = tile_of(xs.kt, ktile)
                        row_mma(xs.q[b, i], xs.eq[b, i], kt, ekt, kt32, ekt32, s, nv, eng.qk, w)
                        lse_i = xs.lse[b, i]
                        if mk.on:
                            _mask_scores(s, nv, b, i, j0, k_lo, pp, mk)
                        _scaled(x, s, nv, sscale, lse_i, pp.contract, eng.fma_exact, ln.scale, pp.scale)  # B4
                        if pp.exp_tl:  # tl.exp: exp2 of the product with log2 e
                            for jj in range(nv):
                                x[jj] = exp_op(x[jj], pp.exp, pp)
                        else:
                            _exp_of(x, nv, pp.exp2, ln.exp, pp.exp, pp.ex2_tab)
                        if mk.on:  # masked pairs: p = 0
                            for jj in range(nv):
                                if key_masked(mk, b, i, j0 + jj, k_lo):
                                    x[jj] = 0.0
                        tot = 0.0
                        for jj in range(nv):
                            tot += x[jj]
                        psum[b, i] += tot
                        vt, evt, vt32, evt32 = tile_of(xs.vt, ktile)
                        row_mma(xs.do[b, i], xs.edo[b, i], vt, evt, vt32, evt32, dpr, nv, eng.dp, w)  # B6
                        _ds_of(y, x, dpr, nv, xs.delta[b, i], ln.ds, pp.ds)  # B7
                        if pp.scale_ds:  # B7': dS * scale before the cast
                            _scale_by(y, nv, pp.sm_scale, ln.ds, pp.ds)
                        if mk.on:  # masked pairs: ds = 0
                            for jj in range(nv):
                                if key_masked(mk, b, i, j0 + jj, k_lo):
                                    y[jj] = 0.0
                        _cast(y, 0, nv, ln.ds_cast, pp.ds_cast)  # B8
                        _cast(x, 0, nv, ln.p, pp.p)  # B5's cast
                        for jj in range(nv):
                            pt[jj, r] = x[jj]
                            dst[jj, r] = y[jj]
                        if eng.walk:  # Q4 in its own pass, over the dQ kernel's tiles
                            for jj in range(nv):
                                dsf[b, i, j0 + jj] = y[jj]
                            continue
                        for jj in range(nv, bn):
                            y[jj] = 0.0
                        a = _operand_row(y, bn, eng.dq, yin, ey)  # Q4
                        k_t, ek_t, k_t32, ek_t32 = tile_of(xs.k_t, ktile)
                        row_mma(a, ey, k_t, ek_t, k_t32, ek_t32, dq[b, i], d, eng.dq, w)
                    qtile = b * n_qt + t
                    do_t, edo_t, do_t32, edo_t32 = tile_of(xs.do_t, qtile)
                    q_t, eq_t, q_t32, eq_t32 = tile_of(xs.q_t, qtile)
                    for jj in range(nk):  # B5, B9: one MMA per key over the tile's rows
                        a = _operand_row(pt[jj], bm, eng.dv, rin, er)
                        row_mma(a, er, do_t, edo_t, do_t32, edo_t32, dva[jj], dvd, eng.dv, w)
                        a = _operand_row(dst[jj], bm, eng.dk, rin, er)
                        row_mma(a, er, q_t, eq_t, q_t32, eq_t32, dka[jj], d, eng.dk, w)
            for jj in range(nk):  # E1, E2
                _epilogue(dka[jj], d, 0.0 if pp.scale_ds else pp.sm_scale, eng)
                _epilogue(dva[jj], dvd, 0.0, eng)
                for c in range(d):
                    dk[bk, j0 + jj, c] = dka[jj, c]
                for c in range(dvd):
                    dv[bk, j0 + jj, c] = dva[jj, c]
        if eng.walk:  # Q4 and E3 in _dq_walk_units
            continue
        for g in range(group):
            for i in range(seq_q):  # E3
                _epilogue(dq[bk * group + g, i], d, 0.0 if pp.scale_ds else pp.dq_scale, eng)


@jit
def _tiles_seen(t, bm, bn, seq_k, causal):
    """The key tiles query tile t visits (a prefix of them when causal)."""
    n_kv = (seq_k + bn - 1) // bn
    if not causal:
        return n_kv
    return min(n_kv, ((t + 1) * bm + bn - 1) // bn)


@jit
def _dq_walk_units(lo, hi, dsf, k_t, dq, eng):
    """Q4 as a pass of its own for query leads [lo, hi), over the dQ kernel's tiles (bm2, bn2): row i of dQ
    query tile t walks the key tiles ``eng.dq_order[b, t, :n]`` (n: the tiles it sees), each an MMA of its dS
    row (``dsf`` (L, seq_q, seq_k)) with the K tile (``k_t``): in-MMA ``dq_i = dq(dq_i + sum_j ds_ij k_j)``
    (tiles before the first the query tile walks are skipped), or atomic Q4a ``c = dq(sum_j ds_ij k_j)`` from
    zero then Q4b ``dq_i = dq_atomic(dq_i + c)``; then E3. Compiled only when a call uses it."""
    pp, r, mk = eng.pp, eng.ln.dq_atomic, eng.mk
    bm2, bn2, seq_k = eng.bm2, eng.bn2, eng.seq_k
    seq_q, d = dq.shape[1], dq.shape[2]
    n_kv2 = (seq_k + bn2 - 1) // bn2
    y, yin, ey, part = np.zeros(bn2), np.zeros(bn2), np.zeros(bn2), np.zeros(d)
    w = work(max(bn2, d))
    for b in range(lo, hi):
        bk = b // eng.group
        for i in range(seq_q):
            t = i // bm2
            for c in range(d):
                dq[b, i, c] = 0.0
            jt_lo, n_seen = 0, _tiles_seen(t, bm2, bn2, seq_k, eng.causal)
            if mk.on:
                jt_lo, n_seen = tile_range(mk, eng.causal, b, t, bm2, bn2, seq_k)
            for u in range(n_seen):
                jt = eng.dq_order[b, t, u]
                if jt < jt_lo and not pp.atomic:
                    continue
                j0 = jt * bn2
                nk = min(bn2, seq_k - j0)
                for jj in range(nk):
                    y[jj] = dsf[b, i, j0 + jj]
                for jj in range(nk, bn2):
                    y[jj] = 0.0
                a = _operand_row(y, bn2, eng.dq, yin, ey)
                kt, ekt, kt32, ekt32 = tile_of(k_t, bk * n_kv2 + jt)
                if not pp.atomic:
                    row_mma(a, ey, kt, ekt, kt32, ekt32, dq[b, i], d, eng.dq, w)
                    continue
                for c in range(d):
                    part[c] = 0.0
                row_mma(a, ey, kt, ekt, kt32, ekt32, part, d, eng.dq, w)  # Q4a
                if r.fast:  # Q4b
                    for c in range(d):
                        dq[b, i, c] = ladd(dq[b, i, c], part[c], r)
                else:
                    for c in range(d):
                        dq[b, i, c] = add(dq[b, i, c], part[c], pp.dq_atomic)
            _epilogue(dq[b, i], d, 0.0 if pp.scale_ds else pp.dq_scale, eng)


@jit
def _ref_units(lo, hi, q, k, v, do, o, lse, delta, dq, dk, dv, psum, pp, geo, tr, sh, order, mk):
    """The scalar reference (test oracle) for key/value lead indices [lo, hi) and the query heads of their
    groups: every value by the scalar ops and ``dot_acc`` per output, the dots over the kernels' zero-padded
    tiles, in the kernels' order (G1: dK and dV of a key/value head over the group's query heads in order, each
    over its query tiles).

    With a tracer's arrays ``tr`` (local, state), it also records each op's local error at (lead, query tile,
    key tile) and runs a float64 shadow of the same dataflow from the same inputs (``sh``: the float64
    qk_scale and softmax scale), recording the drift of the dq, dk and dv accumulators from it after every
    tile step; key tile ``n_kv`` (``-1`` in the frames) holds D2 and the epilogue E1..E3. A dK/dV step is
    recorded at the query lead it reads; the dK/dV epilogue at the group's first query lead. ``order``: as
    :attr:`BwdEngine.dq_order` (atomic dQ: a step is a key tile's contribution and its add). ``mk``: the
    call's :class:`~simfloat.attention._masks.KeyMask` (masked pairs: p = ds = 0). ``geo``: (bm, bn, causal,
    group, bm2, bn2, walk), bm2 and bn2 the dQ kernel's tiles, ``walk`` as :attr:`BwdEngine.walk` (a dQ step is
    recorded at the tile of the (bm, bn) grid that holds its first row and key)."""
    bm, bn, causal, group, bm2, bn2, walk = geo
    seq_q, d = q.shape[1], q.shape[2]
    seq_k, dvd = v.shape[1], v.shape[2]
    n_qt, n_kv = (seq_q + bm - 1) // bm, (seq_k + bn - 1) // bn
    wk = max(n_kv * bn, ((seq_k + bn2 - 1) // bn2) * bn2)  # the keys padded to both kernels' tiles
    pm, dsm = np.zeros((group, n_qt * bm, wk)), np.zeros((group, n_qt * bm, wk))
    qp, dop = np.zeros((group, n_qt * bm, d)), np.zeros((group, n_qt * bm, dvd))
    kp = np.zeros((wk, d))
    ns = n_qt * bm if tr is not None else 1
    ps, dss, d64 = np.zeros((group, ns, wk)), np.zeros((group, ns, wk)), np.zeros(ns)
    for bk in range(lo, hi):
        pm[:, :, :] = 0.0
        dsm[:, :, :] = 0.0
        kp[:seq_k] = k[bk]
        if tr is not None:
            ps[:, :, :] = 0.0
            dss[:, :, :] = 0.0
        for g in range(group):
            b = bk * group + g
            qp[g, :seq_q] = q[b]
            dop[g, :seq_q] = do[b]
            if tr is not None:  # D2's local errors (the same ops as _ref_delta) and the shadow's delta
                for i in range(seq_q):
                    s, s64 = 0.0, 0.0
                    for c in range(o.shape[2]):
                        x = mul(o[b, i, c], do[b, i, c], pp.delta)
                        rec = o[b, i, c] * do[b, i, c]
                        record(tr[0], b, i // bm, n_kv, B_DELTA, x - rec, rec)
                        y = add(s, x, pp.delta)
                        record(tr[0], b, i // bm, n_kv, B_DELTA, y - (s + x), s + x)
                        s = y
                        s64 += o[b, i, c] * do[b, i, c]
                    d64[i] = s64
            for i in range(seq_q):
                jv = min(seq_k, i + 1) if causal else seq_k
                k_lo = 0
                if mk.on:
                    k_lo, jv = row_span(mk, causal, b, i, seq_k)
                    jv = max(0, jv)
                for j in range(jv):
                    if mk.on and key_masked(mk, b, i, j, k_lo):
                        continue
                    sc = dot_acc(q[b, i], k[bk, j], 0.0, pp.qk)  # B2
                    z, b64 = sc, 0.0
                    if mk.dense == DENSE_ADD:  # B3: the scores scaled and biased (the forward's T3)
                        bv = mk.bias[mk.bmap[b], i, j]
                        b2, b64 = bv, bv
                        if pp.exp2:
                            b2, b64 = mul(bv, rnd(_LOG2E, pp.scale), pp.scale), bv * _LOG2E
                        if pp.contract:
                            z = fma(sc, pp.qk_scale, b2, pp.scale)
                        else:
                            z = add(mul(sc, pp.qk_scale, pp.scale), b2, pp.scale)
                        x = sub(z, lse[b, i], pp.scale)
                    elif pp.contract:  # B4
                        x = fma(sc, pp.qk_scale, -lse[b, i], pp.scale)
                    else:
                        x = sub(mul(sc, pp.qk_scale, pp.scale), lse[b, i], pp.scale)
                    pv = exp_op(x, pp.exp, pp)
                    psum[b, i] += pv
                    dp = dot_acc(do[b, i], v[bk, j], 0.0, pp.dp)  # B6
                    ds = mul(pv, sub(dp, delta[b, i], pp.ds), pp.ds)  # B7
                    if pp.scale_ds:  # B7': dS * scale before the cast
                        ds = mul(ds, pp.sm_scale, pp.ds)
                    dsm[g, i, j] = rnd(ds, pp.ds_cast)  # B8
                    pm[g, i, j] = rnd(pv, pp.p)
                    if tr is not None:
                        t, jt = i // bm, j // bn
                        loc = tr[0]
                        s64 = dot64(q[b, i], k[bk, j], 0.0)
                        record(loc, b, t, jt, B_QK, sc - s64, s64)
                        xr = fma64(sc, pp.qk_scale, -lse[b, i]) if pp.contract else sc * pp.qk_scale - lse[b, i]
                        if mk.dense == DENSE_ADD:
                            xr = z - lse[b, i]
                        record(loc, b, t, jt, B_SCALE, x - xr, xr)
                        er = math.exp2(x) if pp.exp2 else math.exp(x)
                        record(loc, b, t, jt, B_EXP, pv - er, er)
                        record(loc, b, t, jt, B_P, pm[g, i, j] - pv, pv)
                        dp64 = dot64(do[b, i], v[bk, j], 0.0)
                        record(loc, b, t, jt, B_DP, dp - dp64, dp64)
                        dr = pv * (dp - delta[b, i])
                        if pp.scale_ds:
                            dr = mul(pv, sub(dp, delta[b, i], pp.ds), pp.ds) * pp.sm_scale
                        record(loc, b, t, jt, B_DS, ds - dr, dr)
                        record(loc, b, t, jt, B_DS_CAST, dsm[g, i, j] - ds, ds)
                        x64 = fma64(s64, sh[0], -lse[b, i]) if pp.contract else s64 * sh[0] - lse[b, i]
                        if mk.dense == DENSE_ADD:
                            x64 = s64 * sh[0] + b64 - lse[b, i]
                        p64 = math.exp2(x64) if pp.exp2 else math.exp(x64)
                        ps[g, i, j] = p64
                        dss[g, i, j] = p64 * (dp64 - d64[i]) * sh[3]
        b0 = bk * group
        for j in range(seq_k):  # B5, B9 over the group's query heads (G1) and their query tiles; E1, E2
            jt = j // bn
            t0 = (jt * bn) // bm if causal else 0
            for c in range(dvd):
                acc, a64 = 0.0, 0.0
                for g in range(group):
                    t_lo, t_hi = qtile_range(mk, causal, b0 + g, jt, bm, bn, seq_q, seq_k) if mk.on else (t0, n_qt)
                    for t in range(t_lo, t_hi):
                        r0, r1 = t * bm, (t + 1) * bm
                        new = dot_acc(pm[g, r0:r1, j], dop[g, r0:r1, c], acc, pp.dv)
                        if tr is not None:
                            ex = dot64(pm[g, r0:r1, j], dop[g, r0:r1, c], acc)
                            record(tr[0], b0 + g, t, jt, B_DV, new - ex, ex)
                            a64 = dot64(ps[g, r0:r1, j], dop[g, r0:r1, c], a64)
                            record(tr[1], b0 + g, t, jt, S_DV, new - a64, a64)
                        acc = new
                dv[bk, j, c] = rnd(acc, pp.grad)
                if tr is not None:
                    record(tr[0], b0, 0, n_kv, B_GRAD, dv[bk, j, c] - acc, acc)
                    record(tr[1], b0, 0, n_kv, S_DV, dv[bk, j, c] - a64, a64)
            for c in range(d):
                acc, a64 = 0.0, 0.0
                for g in range(group):
                    t_lo, t_hi = qtile_range(mk, causal, b0 + g, jt, bm, bn, seq_q, seq_k) if mk.on else (t0, n_qt)
                    for t in range(t_lo, t_hi):
                        r0, r1 = t * bm, (t + 1) * bm
                        new = dot_acc(dsm[g, r0:r1, j], qp[g, r0:r1, c], acc, pp.dk)
                        if tr is not None:
                            ex = dot64(dsm[g, r0:r1, j], qp[g, r0:r1, c], acc)
                            record(tr[0], b0 + g, t, jt, B_DK, new - ex, ex)
                            a64 = dot64(dss[g, r0:r1, j], qp[g, r0:r1, c], a64)
                            record(tr[1], b0 + g, t, jt, S_DK, new - a64, a64)
                        acc = new
                w = 0.0 if pp.scale_ds else pp.sm_scale
                dk[bk, j, c] = _ref_epilogue(acc, a64, w, pp, tr, b0, 0, n_kv, S_DK, sh[1])  # sh: see flash_backward
        wq = 0.0 if pp.scale_ds else pp.dq_scale
        for g in range(group):
            b = b0 + g
            for i in range(seq_q):  # Q4 over the key tiles; E3
                t, t2 = i // bm, i // bm2
                hi_k = min((t2 + 1) * bm2, seq_k) if causal else seq_k
                jt_lo, jt_hi = 0, (hi_k + bn2 - 1) // bn2
                if mk.on:  # the key tiles the row's dQ query tile walks
                    jt_lo, jt_hi = tile_range(mk, causal, b, t2, bm2, bn2, seq_k)
                for c in range(d):
                    acc, a64 = 0.0, 0.0
                    if walk:  # the dQ kernel's tiles in its order (atomic: tiles below jt_lo add zeros: exact)
                        tiles = (order[b, t2], jt_lo, jt_hi, bn2, bn)
                        acc, a64 = _ref_dq_walk(dsm[g, i], dss[g], kp, c, tiles, pp, tr, b, t, i)
                        dq[b, i, c] = _ref_epilogue(acc, a64, wq, pp, tr, b, t, n_kv, S_DQ, sh[2])
                        continue
                    for jt in range(jt_lo, jt_hi):
                        k0, k1 = jt * bn, (jt + 1) * bn
                        new = dot_acc(dsm[g, i, k0:k1], kp[k0:k1, c], acc, pp.dq)
                        if tr is not None:
                            ex = dot64(dsm[g, i, k0:k1], kp[k0:k1, c], acc)
                            record(tr[0], b, t, jt, B_DQ, new - ex, ex)
                            a64 = dot64(dss[g, i, k0:k1], kp[k0:k1, c], a64)
                            record(tr[1], b, t, jt, S_DQ, new - a64, a64)
                        acc = new
                    dq[b, i, c] = _ref_epilogue(acc, a64, wq, pp, tr, b, t, n_kv, S_DQ, sh[2])


@jit
def _ref_dq_walk(ds, dss, kp, c, tiles, pp, tr, b, t, i):
    """Q4 for one value ``dq[b, i, c]`` by the scalar ops over the dQ kernel's key tiles: ``tiles`` = (order,
    jt_lo, n_t, bn2, bn): the tiles ``order[:n_t]`` of width bn2, each a ``dot_acc`` over the row ``ds`` and
    column c of the padded K ``kp``: in-MMA from the accumulator (tiles below jt_lo skipped, as the kernel's
    walk starts there), or atomic (Q4a from zero, then Q4b: added into ``dq_atomic`` from 0). Traced: a step's
    local error (the contribution's and the add's together, against the float64 dot from the same
    accumulator) at (b, t, the bn-wide key tile of its first key), and the shadow (``dss[i]``, the float64 dS)
    accumulates in the same order. Returns (the sum, the shadow's)."""
    order, jt_lo, n_t, bn2, bn = tiles
    acc, a64 = 0.0, 0.0
    for u in range(n_t):
        jt = order[u]
        if jt < jt_lo and not pp.atomic:
            continue
        k0, k1 = jt * bn2, (jt + 1) * bn2
        if pp.atomic:
            part = dot_acc(ds[k0:k1], kp[k0:k1, c], 0.0, pp.dq)
            new = add(acc, part, pp.dq_atomic)
        else:
            new = dot_acc(ds[k0:k1], kp[k0:k1, c], acc, pp.dq)
        if tr is not None:
            ex = dot64(ds[k0:k1], kp[k0:k1, c], acc)
            record(tr[0], b, t, k0 // bn, B_DQ, new - ex, ex)
            a64 = dot64(dss[i, k0:k1], kp[k0:k1, c], a64)
            record(tr[1], b, t, k0 // bn, S_DQ, new - a64, a64)
        acc = new
    return acc, a64


@jit
def _ref_epilogue(acc, a64, w, pp, tr, b, t, kv, state, sm64):
    """E1/E3 for one value: ``grad(grad_scale(acc * w))`` (w = 0: ``grad(acc)``, the scale applied to dS),
    recording the ops' local errors and the final gradient's drift from the shadow's ``a64 * sm64`` at
    (b, t, kv) when tracing."""
    x = mul(acc, w, pp.grad_scale) if w > 0.0 else acc
    g = rnd(x, pp.grad)
    if tr is not None:
        if w > 0.0:
            record(tr[0], b, t, kv, B_GRAD_SCALE, x - acc * w, acc * w)
        record(tr[0], b, t, kv, B_GRAD, g - x, x)
        record(tr[1], b, t, kv, state, g - a64 * sm64, a64 * sm64)
    return g


@jit
def _ref_delta(lo, hi, o, do, delta, op):
    """D2 by the scalar ops, rows [lo, hi) of the flattened (lead, query) grid."""
    seq_q = o.shape[1]
    for u in range(lo, hi):
        b = u // seq_q
        i = u - b * seq_q
        s = 0.0
        for c in range(o.shape[2]):
            s = add(s, mul(o[b, i, c], do[b, i, c], op), op)
        delta[b, i] = s


# -- Python side ----------------------------------------------------------------------------------------------


def _seen_of(mk: KeyMask, causal: bool, b: int, t: int, bm: int, bn: int, seq_k: int) -> int:
    """The key tiles 0 .. n - 1 query tile t of lead b adds into dQ (atomic): the end of its
    :func:`~simfloat.attention._masks.tile_range` (the same rule, in Python)."""
    kv = seq_k if mk.kvlen.size == 0 else min(seq_k, int(mk.kvlen[b]))
    off = 0 if mk.off.size == 0 else int(mk.off[b])
    wr = 0 if causal else mk.wr
    hi = kv if wr < 0 else min(kv, (t + 1) * bm - 1 + off + wr + 1)
    lo = 0 if mk.wl < 0 else max(0, t * bm + off - mk.wl)
    return 0 if hi <= lo else -(-hi // bn)


def _diag_of(mk: KeyMask, causal: bool, b: int, t: int, bm: int, bn: int) -> int:
    """``dq_order="diagonal_first"`` under a mask: the first key tile that the right edge of query tile t's first
    row (the causal diagonal or the window's right bound, shifted by the alignment) masks in part, key
    ``t * bm + off + right + 1``; 0 without a right edge (all tiles in forward order). A dense mask and key
    padding have no diagonal."""
    wr = 0 if causal else mk.wr
    off = 0 if mk.off.size == 0 else int(mk.off[b])
    return 0 if wr < 0 else max(0, t * bm + off + wr + 1) // bn


def _tiles(x: np.ndarray, width: int) -> np.ndarray:
    """(L, S, C) -> (L * ceil(S / width), width, C), zero-padded past S."""
    n_lead, seq, cols = x.shape
    n = -(-seq // width)
    out = np.zeros((n_lead, n * width, cols))
    out[:, :seq] = x
    return out.reshape(n_lead * n, width, cols)


def _weights(x: np.ndarray, mp: MMA) -> np.ndarray:
    w = np.empty(x.shape)
    operand_powers(np.ascontiguousarray(x).reshape(-1), w.reshape(-1), mp.opnd_emin)
    return w


def _dq_orders(
    pl: BackwardPlan,
    seed: int | None,
    n_lead: int,
    seq_q: int,
    seq_k: int,
    bm: int,
    bn: int,
    causal: bool,
    seen_lt: np.ndarray | None = None,
    walk: bool = True,
    diag_lt: np.ndarray | None = None,
) -> np.ndarray:
    """The order of dQ's key tiles (Q4's MMAs, or the atomic adds Q4b), bm and bn the dQ kernel's tiles:
    (n_lead, n_qt, n_kv) int64, per query lead and query tile t the ``_tiles_seen(t)`` key tiles it visits in
    the plan's ``dq_order``, then the others; (0, 0, 0) when dQ does not walk on its own (``walk`` False).
    ``seen_lt``: (n_lead, n_qt) a masked call's count per lead and query tile instead (the end of its
    :func:`~simfloat.attention._masks.tile_range`); ``diag_lt``: its first diagonal key tile per lead and query
    tile (:func:`_diag_of`, for ``"diagonal_first"``).

    Raises:
        ValueError: a tuple order whose length is not the number of key tiles; a callable's result that is not
            a permutation of the tiles a query tile sees.
    """
    if not walk:
        return np.zeros((0, 0, 0), dtype=np.int64)
    n_qt, n_kv = -(-seq_q // bm), -(-seq_k // bn)
    seen = np.array([n_kv if not causal else min(n_kv, -(-((t + 1) * bm) // bn)) for t in range(n_qt)], dtype=np.int64)
    tiles = np.arange(n_kv)
    hidden = tiles[None, :] >= seen[:, None]  # (n_qt, n_kv): key tiles a query tile does not visit
    if seen_lt is not None:
        if callable(pl.dq_order) and np.any(seen_lt != seen_lt[:1]):
            raise ValueError(f"plan {pl.name!r}: a callable dq_order needs the same key tiles in every lead index")
        seen = seen_lt[0] if len(seen_lt) else seen
        hidden = tiles[None, None, :] >= seen_lt[:, :, None]  # (n_lead, n_qt, n_kv)
    order = pl.dq_order
    if order == "seeded":
        keys = np.random.default_rng(seed).random((n_lead, n_qt, n_kv))
    elif order == "forward":
        keys = np.broadcast_to(tiles.astype(np.float64), (n_lead, n_qt, n_kv)).copy()
    elif order == "reverse":
        keys = np.broadcast_to(-tiles.astype(np.float64), (n_lead, n_qt, n_kv)).copy()
    elif order == "diagonal_first":  # causal: from the first key tile row t * bm masks in part, then from 0
        diag = np.array([(t * bm + 1) // bn if causal else 0 for t in range(n_qt)])
        dg = np.broadcast_to(diag if diag_lt is None else diag_lt, (n_lead, n_qt))[:, :, None]
        keys = np.where(tiles >= dg, tiles - n_kv, tiles).astype(np.float64)
    elif isinstance(order, tuple):
        if len(order) != n_kv:
            raise ValueError(
                f"plan {pl.name!r}: dq_order {order!r} orders {len(order)} key tiles, but seq_k {seq_k} and "
                f"block_n {bn} make {n_kv}"
            )
        rank = np.empty(n_kv)
        rank[list(order)] = np.arange(n_kv)
        keys = np.broadcast_to(rank, (n_lead, n_qt, n_kv)).copy()
    else:
        keys = np.empty((n_lead, n_qt, n_kv))
        for t in range(n_qt):
            perm = [int(x) for x in order(t, int(seen[t]))]  # type: ignore[operator]  # a callable here
            if sorted(perm) != list(range(seen[t])):
                raise ValueError(
                    f"plan {pl.name!r}: dq_order({t}, {seen[t]}) must return a permutation of "
                    f"range({seen[t]}), got {perm}"
                )
            rank = np.arange(n_kv, dtype=np.float64)
            rank[perm] = np.arange(len(perm))
            keys[:, t] = rank
    if hidden.ndim == 3:
        keys[hidden] = np.inf
    else:
        keys[:, hidden] = np.inf
    return np.ascontiguousarray(np.argsort(keys, axis=-1, kind="stable"), dtype=np.int64)


def _prescaled_k(k: np.ndarray, scale: float, pl: BackwardPlan) -> np.ndarray:
    """``k_scaled(opmath(k * opmath(scale / ln 2)))`` (the product rounded once into k_scaled without opmath):
    the Triton tutorial's ``arg_k = k * (sm_scale * RCP_LN2)``, a torch multiply by a Python float."""
    c = scale * (1.0 / math.log(2.0))
    ks = pl.k_scaled
    if pl.opmath is None:
        y = _ops.mul(k, float(_round(c, ks.fmt, ks.mode)), ks.fmt, ks.mode)
    else:
        y = _round(np.asarray(_ops.mul(k, float(_round(c, pl.opmath)), pl.opmath)), ks.fmt, ks.mode)
    return np.ascontiguousarray(y, dtype=np.float64)


def _tame(f: FloatFormat) -> bool:
    return f.mantissa_bits <= 25 and f.emin - f.mantissa_bits >= -400 and f.emax <= 400


def _flat(x: np.ndarray, lead: tuple[int, ...]) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float64).reshape((math.prod(lead),) + x.shape[len(lead) :])


def _check(q: object, k: object, v: object, o: object, do: object, lse: object | None) -> tuple[Any, ...]:
    """The operands checked, then the group size (query heads per key/value head), then lse if given."""
    qa, ka, va, oa, da = (operand(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (o, "o"), (do, "do")))
    lead = qa.shape[:-2]
    for name, x in (("o", oa), ("do", da)):
        if x.shape[:-2] != lead:
            raise ValueError(f"{name} has leading dims {x.shape[:-2]} but q has {lead}: q, o, do must share them")
    group = 1
    for name, x in (("k", ka), ("v", va)):
        kl = x.shape[:-2]
        if kl == lead:
            continue
        if len(kl) != len(lead) or not lead or kl[:-1] != lead[:-1]:
            raise ValueError(
                f"{name} has leading dims {kl} but q has {lead}: k and v must share q's leading dims, but for "
                "the head axis (third from last), whose size may divide q's (grouped-query attention)"
            )
        group = kv_group(lead[-1], kl[-1], name)
    if ka.shape[:-2] != va.shape[:-2]:
        raise ValueError(f"k and v must have the same leading dims (heads), got k {ka.shape}, v {va.shape}")
    check_qkv(qa, ka, va)
    want = qa.shape[:-1] + (va.shape[-1],)
    for name, x in (("o", oa), ("do", da)):
        if x.shape != want:
            raise ValueError(f"{name} must have shape (..., seq_q, head_dim_v) = {want}, got {x.shape}")
    if lse is None:
        return qa, ka, va, oa, da, group
    la = operand_stats(lse, "lse", neg_inf=True)  # -inf: a row that sees no key (checked by the caller)
    if la.shape != qa.shape[:-1]:
        raise ValueError(f"lse must have shape (..., seq_q) = {qa.shape[:-1]}, got {la.shape}")
    return qa, ka, va, oa, da, group, la


def operand_stats(x: object, name: str, neg_inf: bool = False) -> np.ndarray:
    """A per-row statistic (lse, m, l): a finite float32/float64 numpy array (-inf allowed with ``neg_inf``:
    the forward's m and lse of a row that sees no key)."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}")
    if x.dtype not in (np.float32, np.float64):
        raise TypeError(f"{name} must have dtype float32 or float64, got {x.dtype}")
    if not np.all(np.isfinite(x) | (neg_inf & (x == -np.inf))):
        raise ValueError(f"{name} has non-finite values" + ("" if neg_inf else " (the forward of a fully masked row?)"))
    return x


def _scale_of(scale: object, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    s = float(scale)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"scale must be finite and > 0, got {s}")
    return s


def _log_rounded(x: np.ndarray, spec: OpSpec, base2: bool) -> np.ndarray:
    """log2(x) (or ln x) of positive finite values rounded once into ``spec``: the float64 log decides unless it
    lies within 2**-46 (relative) of a rounding boundary; a double-double log then decides."""
    fmt, mode = spec.fmt, spec.mode
    with np.errstate(divide="ignore"):
        y = np.log2(x) if base2 else np.log(x)
    w = np.abs(y) * 2.0**-46
    r = _round(y, fmt, mode)
    near = _round(y - w, fmt, mode) != _round(y + w, fmt, mode)
    if np.any(near):
        h2, l2 = log_dd(2.0)
        ln2 = Fraction(h2) + Fraction(l2)
        idx = np.flatnonzero(near)
        vals = []
        for i in idx:
            xi = float(x.flat[i])
            mant, ex = math.frexp(xi)
            if base2 and mant == 0.5:  # a power of two: log2 is the integer itself
                vals.append(Fraction(ex - 1))
            else:
                h, lo = log_dd(xi)
                vals.append((Fraction(h) + Fraction(lo)) / ln2 if base2 else Fraction(h) + Fraction(lo))
        r.flat[idx] = _round(vals, fmt, mode)  # Fractions are rounded once from their exact value
    return r


def lse_from_stats(m: np.ndarray, l: np.ndarray, *, plan: BackwardPlan | str) -> np.ndarray:  # noqa: E741
    """D3: the log-sum-exp the backward recomputes P from, ``lse(m + lse(log2 l))`` (``ln`` without exp2).

    Args:
        m, l: (..., seq_q) the forward's stats (``flash(..., return_stats=True)``): the running maximum (log2
            units with exp2) and the row sum relative to it, l > 0; or m -inf and l 0 (a row that saw no key:
            its lse is -inf, as the kernels store it).
        plan: the backward plan (its ``lse`` op and ``exp2`` flag).

    Returns:
        (..., seq_q) float64 array of values of the lse op's format.

    Raises:
        TypeError, ValueError: non-arrays, other dtypes, shapes that differ, non-finite m or l <= 0.
    """
    pl = backward_plan(plan)
    ma, la = operand_stats(m, "m", neg_inf=True), operand_stats(l, "l")
    if ma.shape != la.shape:
        raise ValueError(f"m and l must have one shape, got {ma.shape} and {la.shape}")
    empty = (ma == -np.inf) & (la == 0)  # a row that saw no key: the forward's m -inf, l 0
    if np.any((la <= 0) & ~empty) or np.any((ma == -np.inf) & ~empty):
        raise ValueError(
            "l must be > 0 and m finite (the stats of a row that saw a key), or m -inf with l 0 (a row that saw none)"
        )
    logs = _log_rounded(np.where(empty, 1.0, la.astype(np.float64)), pl.lse, pl.exp2)
    out = np.asarray(_ops.add(np.where(empty, 0.0, ma.astype(np.float64)), logs, pl.lse.fmt, pl.lse.mode))
    return np.where(empty, -np.inf, out).astype(np.float64)


def _lanes(pl: BackwardPlan) -> BwdLanes:
    return BwdLanes(*(lane(getattr(pl, op).fmt, int(getattr(pl, op).mode)) for op in BwdLanes._fields))


def _vector(
    pl: BackwardPlan,
    pp: BackwardParams,
    ln: BwdLanes,
    qf: np.ndarray,
    kf: np.ndarray,
    vf: np.ndarray,
    of: np.ndarray,
    dof: np.ndarray,
    lf: np.ndarray,
    delta: np.ndarray,
    dq: np.ndarray,
    dk: np.ndarray,
    dv: np.ndarray,
    psum: np.ndarray,
    tiles: tuple[int, int, int, int, bool],
    causal: bool,
    order: np.ndarray,
    mk: KeyMask = NO_MASK,
) -> None:
    """The vector engine's run: delta, then dq, dk, dv (filled in place) and the row sums of P. ``tiles``:
    (bm, bn, bm2, bn2, walk) as :class:`BwdEngine`'s."""
    bm, bn, bm2, bn2, walk = tiles
    n_lead, seq_q = qf.shape[:2]
    n_kv_lead, seq_k = kf.shape[:2]
    if n_lead * seq_q:
        run_rows(_delta_units, n_lead * seq_q, of, dof, delta, ln.delta, pp.delta)

    m_qk, m_dv, m_dp, m_dk, m_dq = (mma(getattr(pl, n)) for n in ("qk", "dv", "dp", "dk", "dq"))
    q_qk, k_qk = round_operands(qf, m_qk), round_operands(kf, m_qk)
    m_qk = for_operands(m_qk, q_qk, k_qk)
    do_dp, v_dp = round_operands(dof, m_dp), round_operands(vf, m_dp)
    m_dp = for_operands(m_dp, do_dp, v_dp)
    do_dv = round_operands(dof, m_dv)
    m_dv = for_operands(m_dv, do_dv)
    q_dk = round_operands(qf, m_dk)
    m_dk = for_operands(m_dk, q_dk)
    k_dq = round_operands(kf, m_dq)
    m_dq = for_operands(m_dq, k_dq)
    # a sequential model needs exact float64 products: P and dS (the row operands) of a wide format do not
    # guarantee them, and those dots then take the reference path per output
    m_dv = m_dv._replace(fast=False) if m_dv.fast and m_dv.exact_products and not _tame(pl.p.fmt) else m_dv
    m_dk, m_dq = (
        mp._replace(fast=False) if mp.fast and mp.exact_products and not _tame(pl.ds_cast.fmt) else mp
        for mp in (m_dk, m_dq)
    )
    kt = np.ascontiguousarray(_tiles(k_qk, bn).transpose(0, 2, 1))
    vt = np.ascontiguousarray(_tiles(v_dp, bn).transpose(0, 2, 1))
    do_t, q_t, k_t = _tiles(do_dv, bm), _tiles(q_dk, bm), _tiles(k_dq, bn2)
    m_qk, kt_s = b_stack(m_qk, kt, _weights(kt, m_qk))
    m_dp, vt_s = b_stack(m_dp, vt, _weights(vt, m_dp))
    m_dv, do_s = b_stack(m_dv, do_t, _weights(do_t, m_dv))
    m_dk, q_s = b_stack(m_dk, q_t, _weights(q_t, m_dk))
    m_dq, k_s = b_stack(m_dq, k_t, _weights(k_t, m_dq))
    xs = BwdOperands(q_qk, _weights(q_qk, m_qk), kt_s, do_dp, _weights(do_dp, m_dp), vt_s, do_s, q_s, k_s, lf, delta)
    fma_exact = _tame(dot_output_format(pl.qk)) and _tame(pl.scale.fmt)
    group = n_lead // n_kv_lead if n_kv_lead else 1
    eng = BwdEngine(
        pp,
        ln,
        m_qk,
        m_dv,
        m_dp,
        m_dk,
        m_dq,
        bool(fma_exact),
        bm,
        bn,
        causal,
        seq_q,
        seq_k,
        group,
        order,
        mk,
        walk,
        bm2,
        bn2,
    )
    # B8's dS per (query lead, row, key) when dQ walks on its own: L * seq_q * seq_k float64
    dsf = np.zeros((n_lead, seq_q, seq_k)) if walk else np.zeros((0, 0, 0))
    if n_kv_lead:
        run_rows(_bwd_units, n_kv_lead, xs, dq, dk, dv, psum, eng, dsf)
        if walk and n_lead * seq_q:
            run_rows(_dq_walk_units, n_lead, dsf, xs.k_t, dq, eng)


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
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise TypeError(f"seed must be a non-negative int or None, got {seed!r}")
        if pl.dq_order != "seeded":
            raise ValueError(
                f"seed is for plans with dq_order='seeded' (atomic dQ in a random order); plan {pl.name!r} has "
                f"dq_accumulation={pl.dq_accumulation!r}, dq_order={pl.dq_order!r}"
            )
    q, k, v, o, do = (from_layout(x, layout, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (o, "o"), (do, "do")))
    qa, ka, va, oa, da, group, la = _check(q, k, v, o, do, lse)
    check_input_format({"q": qa, "k": ka, "v": va, "do": da}, pl.name, stacklevel=3)
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    bm, bn = block(block_m, "block_m"), block(block_n, "block_n")
    bm2 = bm if block_m2 is None else block(block_m2, "block_m2")
    bn2 = bn if block_n2 is None else block(block_n2, "block_n2")
    walk = pl.dq_accumulation == "atomic" or pl.dq_order != "forward" or (bm2, bn2) != (bm, bn)
    if trace is not None and not isinstance(trace, Tracer):
        raise TypeError(f"trace must be a simfloat.Tracer or None, got {type(trace).__name__}")
    which = check_engine(engine, trace is not None)
    sc = _scale_of(scale, qa.shape[-1])
    pp = pl.params(sc)
    lead = qa.shape[:-2]
    qf, kf, vf, of, dof = (_flat(x, x.shape[:-2]) for x in (qa, ka, va, oa, da))
    lf = np.ascontiguousarray(la, dtype=np.float64).reshape(qf.shape[:2])
    n_lead, seq_q, d = qf.shape
    n_kv_lead, seq_k, dvd = vf.shape
    ln = _lanes(pl)
    if pl.scale_at == "k":  # the host's K pre-scaled by scale / ln 2 (the Triton tutorial's arg_k)
        kf = _prescaled_k(kf, sc, pl)

    delta = np.zeros((n_lead, seq_q))
    dq = np.zeros((n_lead, seq_q, d))
    dk = np.zeros((n_kv_lead, seq_k, d))
    dv = np.zeros((n_kv_lead, seq_k, dvd))
    psum = np.zeros((n_lead, seq_q))
    spec = resolve_mask(
        lead=lead,
        seq_q=seq_q,
        seq_k=seq_k,
        causal=bool(causal),
        attn_mask=attn_mask,
        key_lengths=key_lengths,
        window=window,
        causal_align=causal_align,
        empty_rows=empty_rows,
        fmt_round=lambda a: np.asarray(_round(a, pl.scale.fmt, pl.scale.mode), dtype=np.float64),
    )
    mk = NO_MASK if spec is None else spec.mask
    inf_rows = lf == -np.inf
    if np.any(inf_rows):  # the forward's lse of a row that sees no key: it adds nothing, its lse is unused
        seen = ~inf_rows if spec is None else ~inf_rows | spec.empty
        if not seen.all():
            idx = np.unravel_index(int(np.argmin(seen)), lf.shape)
            raise ValueError(
                f"lse is -inf at row {tuple(map(int, idx))}, which sees keys: only a row that sees no key "
                "(under causal and the masks) may have lse -inf"
            )
        lf = np.where(inf_rows, 0.0, lf)
    seen_lt = None
    seen_lt = diag_lt = None
    if spec is not None and walk:
        n_qt_ = -(-seq_q // bm2)
        grid = [(b, t) for b in range(n_lead) for t in range(n_qt_)]
        seen_lt = np.array([_seen_of(mk, bool(causal), b, t, bm2, bn2, seq_k) for b, t in grid], dtype=np.int64)
        diag_lt = np.array([_diag_of(mk, bool(causal), b, t, bm2, bn2) for b, t in grid], dtype=np.int64)
        seen_lt, diag_lt = seen_lt.reshape(n_lead, n_qt_), diag_lt.reshape(n_lead, n_qt_)
    order = _dq_orders(
        pl, 0 if seed is None else int(seed), n_lead, seq_q, seq_k, bm2, bn2, bool(causal), seen_lt, walk, diag_lt
    )
    if which == "reference":
        if n_lead * seq_q:
            run_rows(_ref_delta, n_lead * seq_q, of, dof, delta, pp.delta)
        tr = None
        if trace is not None:
            n_qt, n_kv = -(-seq_q // bm), -(-seq_k // bn)
            tr = trace._start(
                "flash_backward",
                pl.name,
                TRACED_BACKWARD_OPS,
                n_lead,
                n_qt,
                n_kv,
                states=BACKWARD_STATES,
                lead=lead,
                block_m=bm,
                block_n=bn,
                causal=bool(causal),
                scale=sc,
            )
        # the float64 shadow's multipliers: B4's qk_scale, E1's, E3's, B7's
        sh = {
            "scores": (sc * math.log2(math.e) if pl.exp2 else sc, sc, sc, 1.0),
            "ds": (sc * math.log2(math.e) if pl.exp2 else sc, 1.0, 1.0, sc),
            "k": (1.0, sc, math.log(2.0), 1.0),
        }[pl.scale_at]
        if n_kv_lead:
            geo = (bm, bn, bool(causal), group, bm2, bn2, walk)
            args = (qf, kf, vf, dof, of, lf, delta, dq, dk, dv, psum, pp, geo, tr, sh, order, mk)
            run_rows(_ref_units, n_kv_lead, *args)
    else:
        tiles = (bm, bn, bm2, bn2, walk)
        _vector(pl, pp, ln, qf, kf, vf, of, dof, lf, delta, dq, dk, dv, psum, tiles, bool(causal), order, mk)
    bad = ~((psum > 0.5) & (psum < 2.0))
    if spec is not None:  # a row that sees no key sums no P
        bad &= ~spec.empty
        if spec.empty_rows == "nan" and spec.empty.any():
            dq[spec.empty] = np.nan
            kv_bad = spec.empty.any(axis=1).reshape(n_kv_lead, group if n_kv_lead else 1).any(axis=1)
            dk[kv_bad] = np.nan
            dv[kv_bad] = np.nan
    if seq_q and np.any(bad):
        idx = np.unravel_index(int(np.argmax(bad)), psum.shape)
        raise ValueError(
            f"lse does not belong to these inputs under plan {pl.name!r}: row {tuple(map(int, idx))}'s "
            f"recomputed P sums to {psum[idx]:.6g}, not about 1 (an lse of another plan, scale, mask "
            "or inputs; compute it with lse_from_stats from this forward's m and l)"
        )
    out = tuple(to_layout(g.reshape(x.shape), layout) for g, x in ((dq, qa), (dk, ka), (dv, va)))
    if return_delta:
        return out + (delta.reshape(qa.shape[:-1]),)
    return out


def baseline_backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray,
    *,
    plan: BackwardPlan | str = "pytorch-bf16",
    causal: bool = False,
    scale: float | None = None,
    layout: str = "bhsd",
    attn_mask: np.ndarray | None = None,
    key_lengths: object = None,
    window: tuple[int, int] | None = None,
    causal_align: str = "top-left",
    empty_rows: str = "zero",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What eager autograd of ``softmax(scale * q @ k^T [mask]) @ v`` computes, under a backward plan.

    The op order (torch's eager kernels; ``pytorch-<fmt>``: matmuls accumulated in fp32 and rounded once):
    forward ``s = qk(q k^T)``, ``s = scale(s * scale)`` (with ``plan.opmath``: ``scale(opmath(s *
    opmath(scale)))``, as the ``grad_scale`` multiply below), ``p = p(softmax(s))`` (the softmax in its op's format:
    max, ``exp(s - max)``, sequential sum, divide, each rounded); backward ``dv = dv(p^T do)``,
    ``dp = dp(do v^T)``, ``delta_i = delta(sum_j dp_ij p_ij)`` (sequential), ``ds = ds(p * ds(dp - delta))``,
    ``ds = ds_cast(ds)``, ``ds = grad_scale(ds * scale)``, ``dq = dq(ds k)``, ``dk = dk(ds^T q)``, each gradient
    cast into ``grad``. The order of torch's vectorized row sums is not modelled (sequential here). With fewer
    key/value heads than query heads (grouped-query attention), k and v are repeated per query head
    (``repeat_interleave``, :func:`simfloat.attention._inputs.kv_group`'s mapping) and the gradient of a
    key/value head is ``grad(sum_g dk_g)``: the group's per-head gradients (each in ``grad``) summed in
    increasing head order in the ``delta`` op's format (torch's sum reduction), then cast into ``grad``.

    Args:
        q, k, v, do: as :func:`flash_backward` (no o or lse: the softmax is recomputed; k and v may have fewer
            heads than q).
        plan: backward plan or preset name (default ``"pytorch-bf16"``; ``"fp64"``, ...).
        causal, scale: as the forward. layout: ``"bhsd"`` or ``"bshd"``, as :func:`flash_backward`.
        attn_mask, key_lengths, window, causal_align, empty_rows: the forward's mask, as
            :func:`~simfloat.attention.baseline`: an additive mask rounded into the scale op's format and
            added after the scale multiply (``scale(opmath(s + mask))`` with ``plan.opmath``), masked scores
            -inf before the softmax; a row that sees no key has P = 0 (``"zero"``, torch's safe softmax) or NaN
            (``"nan"``, SDPA's math).

    Returns:
        (dq, dk, dv) float64 arrays of q's, k's, v's shapes.

    Raises:
        TypeError, ValueError: bad arrays, shapes, dtypes (named), scale or plan.
    """
    from simfloat.accumulate import matmul

    pl = backward_plan(plan)
    if pl.scale_at != "scores":
        raise ValueError(
            f"baseline_backward models torch's eager autograd (the scale on the scores); plan {pl.name!r} has "
            f"scale_at={pl.scale_at!r}, a flash_backward plan"
        )
    q, k, v, do = (from_layout(x, layout, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (do, "do")))
    qa, ka, va, _, da, group = _check(q, k, v, do, do, None)
    check_input_format({"q": qa, "k": ka, "v": va, "do": da}, pl.name, stacklevel=3)
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    sc = _scale_of(scale, qa.shape[-1])
    ops = _ops

    def r(x: np.ndarray, spec: OpSpec) -> np.ndarray:
        return np.asarray(_round(np.asarray(x, dtype=np.float64), spec.fmt, spec.mode))

    qf, kf, vf, df = (np.asarray(x, dtype=np.float64) for x in (qa, ka, va, da))
    if group > 1:  # k.repeat_interleave(group, dim=-3), v too: the gradients are summed over the group below
        kf, vf = np.repeat(kf, group, axis=-3), np.repeat(vf, group, axis=-3)
    kt = np.swapaxes(kf, -1, -2)

    def scaled(x: np.ndarray, spec: OpSpec) -> np.ndarray:
        """spec(x * scale), through the opmath format when the plan has one (torch's ``tensor * scale``)."""
        if pl.opmath is None:
            return np.asarray(ops.mul(x, float(r(np.array(sc), spec)), spec.fmt, spec.mode))
        y = ops.mul(x, float(_round(sc, pl.opmath)), pl.opmath)
        return r(np.asarray(y), spec)

    s = scaled(matmul(qf, kt, acc=pl.qk), pl.scale)
    f, mo = pl.softmax.fmt, pl.softmax.mode
    seq_q, seq_k = s.shape[-2:]
    spec = resolve_mask(
        lead=s.shape[:-2],
        seq_q=seq_q,
        seq_k=seq_k,
        causal=bool(causal),
        attn_mask=attn_mask,
        key_lengths=key_lengths,
        window=window,
        causal_align=causal_align,
        empty_rows=empty_rows,
        fmt_round=lambda a: r(a, pl.scale),
    )
    if spec is not None and spec.mask.dense == DENSE_ADD:  # torch's scores + attn_mask
        bias = spec.mask.bias[spec.mask.bmap].reshape(s.shape)
        with np.errstate(invalid="ignore"):
            if pl.opmath is None:
                s = np.asarray(ops.add(s, bias, pl.scale.fmt, pl.scale.mode))
            else:
                s = r(np.asarray(ops.add(s, bias, pl.opmath)), pl.scale)
    s = r(s, pl.softmax)
    if spec is not None:
        s = np.where(spec.visible.reshape(s.shape), s, -np.inf)
    elif causal:
        mask = np.arange(seq_k)[None, :] > np.arange(seq_q)[:, None]
        s = np.where(mask, -np.inf, s)
    mx = s.max(axis=-1, keepdims=True)
    empty = None if spec is None else spec.empty.reshape(s.shape[:-1])
    if empty is not None and spec is not None and spec.empty_rows == "zero":
        mx = np.where(empty[..., None], 0.0, mx)  # the row's P is 0 (torch's safe softmax)
    with np.errstate(invalid="ignore"):
        e = np.asarray(ops.exp(np.asarray(ops.sub(s, mx, f, mo)), f, mo))
        tot = np.asarray(ops.sum(e, f, mo, axis=-1))[..., None]
        if empty is not None and spec is not None and spec.empty_rows == "zero":
            tot = np.where(empty[..., None], 1.0, tot)
        p = r(np.asarray(ops.div(e, tot, f, mo)), pl.p)
    dv = matmul(np.swapaxes(p, -1, -2), df, acc=pl.dv)
    dp = matmul(df, np.swapaxes(vf, -1, -2), acc=pl.dp)
    prod = np.asarray(ops.mul(dp, p, pl.delta.fmt, pl.delta.mode))
    delta = np.asarray(ops.sum(prod, pl.delta.fmt, pl.delta.mode, axis=-1))[..., None]
    ds = np.asarray(ops.mul(p, np.asarray(ops.sub(dp, delta, pl.ds.fmt, pl.ds.mode)), pl.ds.fmt, pl.ds.mode))
    ds = r(ds, pl.ds_cast)
    ds = scaled(ds, pl.grad_scale)
    dq = matmul(ds, kf, acc=pl.dq)
    dk = matmul(np.swapaxes(ds, -1, -2), qf, acc=pl.dk)
    dk, dv = r(dk, pl.grad), r(dv, pl.grad)
    if group > 1:  # the repeat's backward: a sum over the group's heads (a torch sum, as delta's)
        dk, dv = (_group_sum(x, group, pl) for x in (dk, dv))
    return to_layout(r(dq, pl.grad), layout), to_layout(dk, layout), to_layout(dv, layout)


def _group_sum(x: np.ndarray, group: int, pl: BackwardPlan) -> np.ndarray:
    """(..., heads, S, D) -> (..., heads // group, S, D): ``grad(sum_g x[h * group + g])``, the sum sequential
    over g in the delta op's format (a torch sum reduction, fp32 for a half-precision tensor)."""
    y = x.reshape(x.shape[:-3] + (x.shape[-3] // group, group) + x.shape[-2:])
    tot = np.asarray(_ops.sum(np.moveaxis(y, -3, -1), pl.delta.fmt, pl.delta.mode, axis=-1))
    return np.asarray(_round(tot, pl.grad.fmt, pl.grad.mode), dtype=np.float64)
