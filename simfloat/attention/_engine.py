"""The vectorized attention engine: flash (FA2 / FA1 / lazy rescaling), tile by tile, and baseline attention, row
by row.

Same dataflow, op for op and bit for bit, as the reference kernels (``_tile`` of
:mod:`simfloat.attention.reference.forward` and :mod:`simfloat.attention.baseline`'s ``_units``;
:mod:`simfloat.attention.flash` lists the steps T1..T14), but
shaped so that the work vectorizes: flash takes a q tile's rows together, their scores against a key tile are
one call of the multi-row kernel ``rows_mma`` (the innermost loop runs over keys) and their
P.V one call over the head dimension; the baseline's rows call ``row_mma``; the element-wise
ops (scale, exp, the casts, rescaling, normalization) are loops
of the branch-free lane functions of :mod:`simfloat._lanes`. Ops whose format or mode has no lane form take the
reference's scalar ops in the same loops. Running state (m_i, l_i, alpha) and the sequential row sum stay
scalar, as in the kernel.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from simfloat._jit import jit, ljit
from simfloat._lanes import (
    Lane,
    ladd,
    ladd_f32,
    ladd_ne,
    ldiv,
    ldiv_f32,
    ldiv_ne,
    lfma,
    lfma_f32,
    lfma_ne,
    lmul,
    lmul_f32,
    lmul_ne,
    lround,
    lround_f32,
    lround_ne,
    pow2_of,
)
from simfloat.accumulate._rows import MMA, Rows, row_mma, rows_mma, rows_work, work
from simfloat.attention._kernels import add, div, exp, exp2, exp2_hw, fma, fmax, mul, rnd, row_sum, sub
from simfloat.hardware import ex2_approx_f32, tl_sum_mma_f32

__all__ = ["KEY_CHUNK", "Engine", "Lanes", "Operands", "baseline_units", "flash_units", "row_keys", "tile_span"]

_NINF = -np.inf


class Lanes(NamedTuple):
    """The lane form of every scalar op of a plan (see :func:`simfloat._lanes.lane`)."""

    scale: Lane
    exp: Lane
    m_i: Lane
    alpha: Lane
    l_ij: Lane  # the additions of the in-tile row sum (a chunked model's inner ones)
    l_i: Lane
    acc: Lane
    p: Lane
    normalize: Lane
    out: Lane
    softmax: Lane


class Engine(NamedTuple):
    """Everything a row needs besides its operands.

    Attributes:
        pp: the plan's :class:`~simfloat.attention.plan.PlanParams` (scalar ops, flags, scale).
        ln: :class:`Lanes`.
        qk, pv: the dots as :class:`~simfloat.accumulate._rows.MMA` records.
        fma_exact: ``s * qk_scale`` is exact in float64 (the contracted scale op may use lane form).
        l_native32: the row sum's additions are float32 additions (l_ij's in float32 with nearest-even, and
            the summed values float32 values): done as such.
        bm, bn: tile sizes (clamped to the sequences; baseline: bn is the K^T tile width); causal; wn: warps
            along the keys of the measured tl.sum layout (from the requested block_m); seq_k: keys.
    """

    pp: object
    ln: Lanes
    qk: MMA
    pv: MMA
    fma_exact: bool
    l_native32: bool
    bm: int
    bn: int
    causal: bool
    wn: int
    seq_k: int


class Operands(NamedTuple):
    """Operands and their alignment weights (:func:`simfloat.accumulate._rows.operand_powers`), per lead index.

    Attributes:
        q: (L, Sq, D) queries (in the qk model's input format). eq: their weights.
        kt: (L * n_tiles, D, bn) keys, transposed tile by tile (contiguous along the keys, zero-padded).
            ekt: their weights.
        v: flash: (L * n_tiles, bn, Dv) values tile by tile, zero-padded; baseline: (L, Sk, Dv). ev: weights.
        kt32, ekt32, v32, ev32: ``kt``, ``v`` and their weights in the float32 forms of their dots
            (:func:`simfloat.accumulate._rows.operand32`); else one empty matrix per tile.
    """

    q: np.ndarray
    eq: np.ndarray
    kt: np.ndarray
    ekt: np.ndarray
    v: np.ndarray
    ev: np.ndarray
    kt32: np.ndarray
    ekt32: np.ndarray
    v32: np.ndarray
    ev32: np.ndarray


# -- element-wise ops over a row segment ---------------------------------------------------------------------


@jit
def _cast(x, lo, n, r, o):
    """x[lo:lo+n] = op(x[lo:lo+n]) (a cast)."""
    if r.f32:
        for j in range(lo, lo + n):
            x[j] = lround_f32(x[j])
    elif r.fast and r.mode == 0:
        for j in range(lo, lo + n):
            x[j] = lround_ne(x[j], r)
    elif r.fast:
        for j in range(lo, lo + n):
            x[j] = lround(x[j], r)
    else:
        for j in range(lo, lo + n):
            x[j] = rnd(x[j], o)


@jit
def _scale_by(x, n, w, r, o):
    """x[:n] = op(x[:n] * w)."""
    if r.f32:
        for j in range(n):
            x[j] = lmul_f32(x[j], w)
    elif r.fast and r.mode == 0:
        for j in range(n):
            x[j] = lmul_ne(x[j], w, r)
    elif r.fast:
        for j in range(n):
            x[j] = lmul(x[j], w, r)
    else:
        for j in range(n):
            x[j] = mul(x[j], w, o)


@jit
def _divide(x, n, d, r, o):
    """x[:n] = op(x[:n] / d)."""
    if r.f32:
        for j in range(n):
            x[j] = ldiv_f32(x[j], d)
    elif r.fast and r.mode == 0:
        for j in range(n):
            x[j] = ldiv_ne(x[j], d, r)
    elif r.fast:
        for j in range(n):
            x[j] = ldiv(x[j], d, r)
    else:
        for j in range(n):
            x[j] = div(x[j], d, o)


@jit
def _weights_of(x, w, n, emin):
    """Alignment weights of x[:n] (operand_powers for values of formats within 2**+-900: zeros 0, inf/NaN
    inf)."""
    for j in range(n):
        v = x[j]
        p = pow2_of(v)
        w[j] = 0.0 if v == 0.0 else max(p, emin)


@jit
def _exp_of(x, n, e, r, o, tab):
    """x[:n] = op(exp2(x)) (``e``: exp2, else exp); ``tab`` non-empty: the measured ex2.approx.ftz.f32."""
    if not r.fast:
        for j in range(n):
            x[j] = (exp2_hw(x[j], o, tab) if tab.size > 0 else exp2(x[j], o)) if e else exp(x[j], o)
        return
    if e and tab.size > 0:
        for j in range(n):
            x[j] = ex2_approx_f32(x[j], tab, True)
    elif e:
        for j in range(n):
            x[j] = math.exp2(x[j])
    else:
        for j in range(n):
            x[j] = math.exp(x[j])
    if r.f32:  # the rounding, vectorized apart from the libm calls
        for j in range(n):
            x[j] = lround_f32(x[j])
    elif r.mode == 0:
        for j in range(n):
            x[j] = lround_ne(x[j], r)
    else:
        for j in range(n):
            x[j] = lround(x[j], r)


@jit
def _seq_sum(x, n, r, o, native32):
    """op(... op(op(x0 + x1) + x2) ...) from 0, left to right."""
    s = 0.0
    if native32:
        s32 = np.float32(0.0)
        for j in range(n):
            s32 = s32 + np.float32(x[j])
        return np.float64(s32)
    if r.fast:
        for j in range(n):
            s = ladd(s, x[j], r)
    else:
        for j in range(n):
            s = add(s, x[j], o)
    return s


@ljit
def _row_sum_ij(p, nv, eng):
    """T8: the in-tile row sum of p[:nv] under the plan's l_ij model and sum order."""
    pp, ln = eng.pp, eng.ln
    # the kernel's tree runs over the whole tile (p = 0 past nv: set by the caller), as the reference's: a lane
    # whose first value is p_j and whose next is a padding zero rounds p_j into l_ij's format. Over nv alone the
    # bits are the same only when that rounding is exact: float32 additions of float32 values
    if pp.sum_order != 0:
        if eng.l_native32:  # fp32 nearest-even on fp32 values: the native addition, zeros change nothing
            return tl_sum_mma_f32(p, nv, eng.wn)
        return row_sum(p, eng.bn, pp.l_ij, 1, eng.wn)
    c = pp.l_ij_chunk
    if c == 0:
        return _seq_sum(p, nv, ln.l_ij, pp.l_ij, eng.l_native32)
    s = 0.0
    for c0 in range(0, nv, c):
        s = add(s, _seq_sum(p[c0:], min(c, nv - c0), ln.l_ij, pp.l_ij, eng.l_native32), pp.l_ij_out)
    return s


@jit
def _row_max(x, lo, n):
    m = _NINF
    for j in range(lo, lo + n):
        m = fmax(m, x[j])
    return m


# -- flash -----------------------------------------------------------------------------------------------------

KEY_CHUNK = 256  # keys per K^T tile in the baseline layout


class FlashScratch(NamedTuple):
    s: np.ndarray  # (bm, bn) scores of the q tile's rows against one key tile
    p: np.ndarray  # (bm, bn) P of that tile
    pin: np.ndarray  # (bm, bn) P as the P.V dot reads it (its input format)
    ep: np.ndarray  # (bm, bn) its alignment weights
    acc: np.ndarray  # (bm, dv): the q tile's accumulators
    m: np.ndarray  # (bm,) running maxima
    l: np.ndarray  # (bm,) running row sums  # noqa: E741
    l_new: np.ndarray  # (bm,) the row sums after this key tile (FA1's per-step division)
    rs: Rows


@jit
def _scaled(x, s, nv, qs, m_sub, contract, fma_exact, r, o):
    """T6: x[:nv] = scale(fma(s, qk_scale, -m_sub)) (or scale(scale(s * qk_scale) - m_sub))."""
    if contract:
        if fma_exact and r.f32:
            for jj in range(nv):
                x[jj] = lfma_f32(s[jj], qs, -m_sub)
        elif fma_exact and r.fast and r.mode == 0:
            for jj in range(nv):
                x[jj] = lfma_ne(s[jj], qs, -m_sub, r)
        elif fma_exact and r.fast:
            for jj in range(nv):
                x[jj] = lfma(s[jj], qs, -m_sub, r)
        else:
            for jj in range(nv):
                x[jj] = fma(s[jj], qs, -m_sub, o)
    elif r.f32:
        for jj in range(nv):
            x[jj] = ladd_f32(lmul_f32(s[jj], qs), -m_sub)
    elif r.fast and r.mode == 0:
        for jj in range(nv):
            x[jj] = ladd_ne(lmul_ne(s[jj], qs, r), -m_sub, r)
    elif r.fast:
        for jj in range(nv):
            x[jj] = ladd(lmul(s[jj], qs, r), -m_sub, r)
    else:
        for jj in range(nv):
            x[jj] = sub(mul(s[jj], qs, o), m_sub, o)


@ljit
def _scores(x, s, nv, m_sub, eng):
    """T6, T7: x[:nv] = exp(scale(fma(s, qk_scale, -m_sub)))."""
    pp, ln = eng.pp, eng.ln
    _scaled(x, s, nv, pp.qk_scale, m_sub, pp.contract, eng.fma_exact, ln.scale, pp.scale)
    _exp_of(x, nv, pp.exp2, ln.exp, pp.exp, pp.ex2_tab)


@jit
def _tie_shifted(mx, s, nv, pp):
    """T4 with ``Plan.tie_shift``: the tile max ``mx`` as shifted when two or more of s[:nv] tie it (see Plan)."""
    thr = sub(mx, pp.tie_tol, pp.scale)
    n = 0
    for jj in range(nv):
        if mul(s[jj], pp.qk_scale, pp.scale) >= thr:
            n += 1
    if n < 2:
        return mx
    if mx > 0.0:
        return mul(mx, pp.tie_beta, pp.m_i)
    return 0.0 if mx < 0.0 else mx


@ljit
def _flash_row(r, nv, eng, sc):
    """T4..T12 for row r of the q tile against the key tile whose scores are sc.s[r, :nv] (the keys the row may
    see): the new running max, P (sc.p[r], and its dot operand form sc.pin[r] / weights sc.ep[r]), the row sum,
    alpha, acc[r] rescaled; sc.m/l[r] updated, sc.l_new[r] the new row sum."""
    pp, ln = eng.pp, eng.ln
    bn = eng.bn
    dv = sc.acc.shape[1]
    s, p, pin, ep = sc.s[r], sc.p[r], sc.pin[r], sc.ep[r]
    acc = sc.acc[r]
    m_i, l_i = sc.m[r], sc.l[r]
    smax = _row_max(s, 0, nv)
    m_new = m_i  # T4
    if smax != _NINF:
        mx = mul(smax, pp.qk_scale, pp.scale)
        if pp.tie:
            mx = _tie_shifted(mx, s, nv, pp)
        m_new = fmax(m_i, mx)
        if m_new != m_i:
            m_new = rnd(m_new, pp.m_i)
    rescale = True
    if pp.lazy:
        if m_i == _NINF:
            rescale = m_new > _NINF
        else:
            rescale = sub(m_new, m_i, pp.m_i) > pp.threshold
        if not rescale:
            m_new = m_i
    m_sub = 0.0 if m_new == _NINF else m_new  # T5
    _scores(p, s, nv, m_sub, eng)  # T6, T7
    for jj in range(nv, bn):
        p[jj] = 0.0
    l_ij = _row_sum_ij(p, nv, eng)  # T8
    alpha = 1.0  # T9
    if rescale:
        if m_i == _NINF:
            alpha = 0.0
        else:
            dm = sub(m_i, m_sub, pp.alpha)
            alpha = exp2_hw(dm, pp.alpha, pp.ex2_tab) if pp.exp2 else exp(dm, pp.alpha)
    if pp.contract:  # T10
        l_new = fma(l_i, alpha, l_ij, pp.l_i)
    else:
        l_new = add(mul(l_i, alpha, pp.l_i), l_ij, pp.l_i)
    wgt = alpha  # T11
    if pp.per_step:
        wgt = mul(l_i, alpha, pp.acc)
    _scale_by(acc, dv, wgt, ln.acc, pp.acc)
    _cast(p, 0, nv, ln.p, pp.p)  # T12
    if eng.pv.in_round:  # the dot's operand format (tf32 tensor cores read fp32 P truncated)
        for jj in range(bn):
            pin[jj] = lround(p[jj], eng.pv.inp)
        src = pin
    else:
        src = p
    if eng.pv.align_sum:
        _weights_of(src, ep, bn, eng.pv.opnd_emin)
    sc.m[r] = m_new  # T14 (the P.V dot, T13, does not read them)
    sc.l[r] = l_new
    sc.l_new[r] = l_new


@ljit
def tile_span(jt, r1, bn, seq_k, causal):
    """Key tile jt of a q tile whose rows end at r1: its first key j0, its end jv, and how many of its keys the
    tile's last (widest) row sees."""
    j0 = jt * bn
    jv = min(j0 + bn, seq_k)
    top = min(jv, r1) if causal else jv
    return j0, jv, max(0, top - j0)


@ljit
def row_keys(i, j0, jv, causal):
    """How many keys of [j0, jv) query row i sees."""
    return max(0, (min(jv, i + 1) if causal else jv) - j0)


@jit
def _flash_tile(b, r0, r1, jt, xs, eng, sc):
    """T2..T14 for the rows [r0, r1) of a q tile of lead b against key tile jt: their scores in one call of the
    multi-row dot (each key tile element loaded once serves several rows), T4..T12 row by row, then their P.V in
    one call. Every row's bits are those of a row-at-a-time walk: a row's outputs depend only on its own
    steps, and a causal row's scores past its last key are computed but never read."""
    pp, ln = eng.pp, eng.ln
    bn, seq_k = eng.bn, eng.seq_k
    dv = xs.v.shape[2]
    g = r1 - r0
    tile = b * (xs.kt.shape[0] // xs.q.shape[0]) + jt
    j0, jv, n_top = tile_span(jt, r1, bn, seq_k, eng.causal)
    s = sc.s
    for r in range(g):  # T2, T3: the scores of the keys the rows may see
        for jj in range(n_top):
            s[r, jj] = 0.0
    kt, ekt, kt32, ekt32 = xs.kt[tile], xs.ekt[tile], xs.kt32[tile], xs.ekt32[tile]
    rows_mma(xs.q[b, r0:r1], xs.eq[b, r0:r1], kt, ekt, kt32, ekt32, s, g, n_top, eng.qk, sc.rs)
    for r in range(g):
        _flash_row(r, row_keys(r0 + r, j0, jv, eng.causal), eng, sc)
    src = sc.pin if eng.pv.in_round else sc.p
    rows_mma(src, sc.ep, xs.v[tile], xs.ev[tile], xs.v32[tile], xs.ev32[tile], sc.acc, g, dv, eng.pv, sc.rs)  # T13
    if pp.per_step:
        for r in range(g):
            l_new = sc.l_new[r]
            _divide(sc.acc[r], dv, 1.0 if l_new == 0.0 else l_new, ln.normalize, pp.normalize)


@jit
def flash_units(lo, hi, xs, out, m_out, l_out, eng):
    """Work units ``[lo, hi)``: unit u is (lead index u // n_q_tiles, q tile u % n_q_tiles). As in the kernel,
    a q tile's rows meet the key tiles one at a time (the tile's K^T and V stay in cache for all its rows)."""
    pp, ln = eng.pp, eng.ln
    bm, bn, seq_k = eng.bm, eng.bn, eng.seq_k
    seq_q, dv = out.shape[1], out.shape[2]
    n_qt = (seq_q + bm - 1) // bm
    sc = FlashScratch(
        np.zeros((bm, bn)),
        np.zeros((bm, bn)),
        np.zeros((bm, bn)),
        np.zeros((bm, bn)),
        np.zeros((bm, dv)),
        np.empty(bm),
        np.empty(bm),
        np.empty(bm),
        rows_work(bm, max(bn, dv)),
    )
    for u in range(lo, hi):
        b = u // n_qt
        t = u - b * n_qt
        r0, r1 = t * bm, min(seq_q, (t + 1) * bm)
        kv_hi = min((t + 1) * bm, seq_k) if eng.causal else seq_k
        n_kv = (kv_hi + bn - 1) // bn
        for r in range(r1 - r0):
            sc.m[r] = _NINF
            sc.l[r] = 0.0
            for d in range(dv):
                sc.acc[r, d] = 0.0
        for jt in range(n_kv):
            _flash_tile(b, r0, r1, jt, xs, eng, sc)
        for i in range(r0, r1):
            acc, l_i = sc.acc[i - r0], sc.l[i - r0]
            o = out[b, i]
            for d in range(dv):
                o[d] = acc[d]
            if not pp.per_step:  # E1
                _divide(o, dv, 1.0 if l_i == 0.0 else l_i, ln.normalize, pp.normalize)
            _cast(o, 0, dv, ln.out, pp.out)  # E2
            m_out[b, i] = sc.m[i - r0]
            l_out[b, i] = l_i


# -- baseline --------------------------------------------------------------------------------------------------


@jit
def baseline_units(lo, hi, xs, out, eng):
    """Rows ``[lo, hi)`` of the flattened (lead, query) grid: full scores, softmax, P.V (see baseline.py)."""
    pp, ln = eng.pp, eng.ln
    seq_q, dv = out.shape[1], out.shape[2]
    seq_k = eng.seq_k
    width = eng.bn
    n_ch = xs.kt.shape[0] // xs.q.shape[0]
    s, pin, ep = np.zeros(n_ch * width), np.zeros(seq_k), np.zeros(seq_k)
    w = work(max(width, dv, seq_k, xs.q.shape[2]))  # its float32 form's rows: up to seq_k (P.V) or D (Q.K^T)
    no = seq_k < 0
    for r in range(lo, hi):
        b = r // seq_q
        i = r - b * seq_q
        jv = min(seq_k, i + 1) if eng.causal else seq_k
        for c in range(n_ch):
            lo_c = c * width
            n = min(width, jv - lo_c)
            if n <= 0:
                break
            sv = s[lo_c : lo_c + width]
            for j in range(n):
                sv[j] = 0.0
            t = b * n_ch + c
            row_mma(xs.q[b, i], xs.eq[b, i], xs.kt[t], xs.ekt[t], xs.kt32[t], xs.ekt32[t], sv, n, eng.qk, w)
        _scale_by(s, jv, pp.sm_scale, ln.scale, pp.scale)
        _cast(s, 0, jv, ln.softmax, pp.softmax)
        m = _row_max(s, 0, jv)
        # softmax(s - m), one rounding; `no` a runtime False, not the literal: the helpers compile once, as flash's
        _scaled(s, s, jv, 1.0, m, no, no, ln.softmax, pp.softmax)
        _exp_of(s, jv, no, ln.softmax, pp.softmax, pp.ex2_tab[:0])
        tot = _seq_sum(s, jv, ln.softmax, pp.softmax, False)
        _divide(s, jv, 1.0 if tot == 0.0 else tot, ln.softmax, pp.softmax)
        for j in range(jv, seq_k):
            s[j] = 0.0
        src = s[:seq_k]
        if eng.pv.in_round:
            for j in range(seq_k):
                pin[j] = lround(s[j], eng.pv.inp)
            src = pin
        if eng.pv.align_sum:
            _weights_of(src, ep, seq_k, eng.pv.opnd_emin)
        o = out[b, i]
        for d in range(dv):
            o[d] = 0.0
        row_mma(src, ep, xs.v[b], xs.ev[b], xs.v32[b], xs.ev32[b], o, dv, eng.pv, w)
        _cast(o, 0, dv, ln.out, pp.out)
