"""The vectorized attention engine: flash (FA2 / FA1 / lazy rescaling) and baseline attention, row by row.

Same dataflow, op for op and bit for bit, as the reference kernels (:mod:`simfloat.attention.flash`'s
``_tile`` and :mod:`simfloat.attention.baseline`'s ``_units``, whose docstrings list the steps T1..T14), but
shaped so that the work vectorizes: a query row's scores against all the keys it may see are one call of the
row kernel :func:`simfloat._mma.row_mma` (the innermost loop runs over keys), each key tile's P.V is one call
over the head dimension, and the element-wise ops (scale, exp, the casts, rescaling, normalization) are loops
of the branch-free lane functions of :mod:`simfloat._lanes`. Ops whose format or mode has no lane form take the
reference's scalar ops in the same loops. Running state (m_i, l_i, alpha) and the sequential row sum stay
scalar, as in the kernel.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from simfloat._jit import jit
from simfloat._lanes import Lane, ladd, ldiv, lfma, lmul, lround, pow2_of
from simfloat._mma import MMA, Work, row_mma, work
from simfloat.attention._kernels import add, div, exp, exp2, exp2_hw, fma, fmax, mul, rnd, row_sum, sub
from simfloat.hardware import ex2_approx_f32

__all__ = ["Engine", "Lanes", "Operands", "flash_units", "baseline_units"]

_NINF = -np.inf


class Lanes(NamedTuple):
    """The lane form of every scalar op of a plan (see :func:`simfloat._lanes.lane`)."""

    scale: Lane
    exp: Lane
    m_i: Lane
    alpha: Lane
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
        qk, pv: the dots as :class:`~simfloat._mma.MMA` records.
        fma_exact: ``s * qk_scale`` is exact in float64 (the contracted scale op may use lane form).
        l_native32: the row sum's additions are float32 additions (l_i in float32 with nearest-even, and the
            summed values float32 values): done as such.
        bm, bn: tile sizes (bn clamped to the padded key length); causal; wn: warps along the keys of the
            measured tl.sum layout (from the requested block_m).
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


class Operands(NamedTuple):
    """Operands and their alignment weights (:func:`simfloat._mma.operand_powers`), per lead index.

    Attributes:
        q: (L, Sq, D) queries (in the qk model's input format). eq: their weights.
        kt: (L, D, Sk) keys, transposed (contiguous along the keys). ekt: their weights.
        v: flash: (L * n_kv_tiles, bn, Dv) values tile by tile, zero-padded; baseline: (L, Sk, Dv). ev: weights.
    """

    q: np.ndarray
    eq: np.ndarray
    kt: np.ndarray
    ekt: np.ndarray
    v: np.ndarray
    ev: np.ndarray


# -- element-wise ops over a row segment ---------------------------------------------------------------------


@jit
def _cast(x, lo, n, r, o):  # type: ignore[no-untyped-def]
    """x[lo:lo+n] = op(x[lo:lo+n]) (a cast)."""
    if r.fast:
        for j in range(lo, lo + n):
            x[j] = lround(x[j], r)
    else:
        for j in range(lo, lo + n):
            x[j] = rnd(x[j], o)


@jit
def _scale_by(x, n, w, r, o):  # type: ignore[no-untyped-def]
    """x[:n] = op(x[:n] * w)."""
    if r.fast:
        for j in range(n):
            x[j] = lmul(x[j], w, r)
    else:
        for j in range(n):
            x[j] = mul(x[j], w, o)


@jit
def _divide(x, n, d, r, o):  # type: ignore[no-untyped-def]
    """x[:n] = op(x[:n] / d)."""
    if r.fast:
        for j in range(n):
            x[j] = ldiv(x[j], d, r)
    else:
        for j in range(n):
            x[j] = div(x[j], d, o)


@jit
def _weights_of(x, w, n, emin):  # type: ignore[no-untyped-def]
    """Alignment weights of x[:n] (operand_powers for values of formats within 2**+-900: zeros 0, inf/NaN
    inf)."""
    for j in range(n):
        v = x[j]
        p = pow2_of(v)
        w[j] = 0.0 if v == 0.0 else max(p, emin)


@jit
def _exp_of(x, n, e, r, o, tab):  # type: ignore[no-untyped-def]
    """x[:n] = op(exp2(x)) (``e``: exp2, else exp); ``tab`` non-empty: the measured ex2.approx.ftz.f32."""
    if e:
        if tab.size > 0:
            for j in range(n):
                x[j] = exp2_hw(x[j], o, tab) if not r.fast else lround(ex2_approx_f32(x[j], tab, True), r)
        elif r.fast:
            for j in range(n):
                x[j] = lround(math.exp2(x[j]), r)
        else:
            for j in range(n):
                x[j] = exp2(x[j], o)
    else:
        if r.fast:
            for j in range(n):
                x[j] = lround(math.exp(x[j]), r)
        else:
            for j in range(n):
                x[j] = exp(x[j], o)


@jit
def _seq_sum(x, n, r, o, native32):  # type: ignore[no-untyped-def]
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


@jit
def _row_max(x, lo, n):  # type: ignore[no-untyped-def]
    m = _NINF
    for j in range(lo, lo + n):
        m = fmax(m, x[j])
    return m


# -- flash -----------------------------------------------------------------------------------------------------


class FlashScratch(NamedTuple):
    s: np.ndarray  # scores of the row (seq_k)
    p: np.ndarray  # P of a tile (bn)
    pin: np.ndarray  # P as the P.V dot reads it (its input format)
    ep: np.ndarray  # its weights
    acc: np.ndarray  # (dv,)
    w: Work


@jit
def _scores(x, s, lo, nv, m_sub, eng):  # type: ignore[no-untyped-def]
    """T6, T7: s[lo:lo+nv] -> P into eng's scratch p[:nv] (scale(fma(s, qk_scale, -m_sub)), then exp)."""
    pp, ln = eng.pp, eng.ln
    qs = pp.qk_scale
    if pp.contract:
        if eng.fma_exact and ln.scale.fast:
            for jj in range(nv):
                x[jj] = lfma(s[lo + jj], qs, -m_sub, ln.scale)
        else:
            for jj in range(nv):
                x[jj] = fma(s[lo + jj], qs, -m_sub, pp.scale)
    elif ln.scale.fast:
        for jj in range(nv):
            x[jj] = ladd(lmul(s[lo + jj], qs, ln.scale), -m_sub, ln.scale)
    else:
        for jj in range(nv):
            x[jj] = sub(mul(s[lo + jj], qs, pp.scale), m_sub, pp.scale)
    _exp_of(x, nv, pp.exp2, ln.exp, pp.exp, pp.ex2_tab)


@jit
def _flash_row(b, i, n_kv, xs, out, m_out, l_out, eng, sc):  # type: ignore[no-untyped-def]
    """T2..T14 for query row i of lead b over key tiles [0, n_kv), then E1, E2."""
    pp, ln = eng.pp, eng.ln
    bn = eng.bn
    seq_k = xs.kt.shape[2]
    dv = xs.v.shape[2]
    s, p, pin, ep, acc, w = sc.s, sc.p, sc.pin, sc.ep, sc.acc, sc.w
    kv_hi = min(n_kv * bn, seq_k)
    for j in range(kv_hi):  # T2, T3: the row's scores (keys the kernel masks are computed, never used)
        s[j] = 0.0
    row_mma(xs.q[b, i], xs.eq[b, i], xs.kt[b], xs.ekt[b], s, kv_hi, eng.qk, w)
    m_i, l_i = _NINF, 0.0
    for d in range(dv):
        acc[d] = 0.0
    n_tiles = xs.v.shape[0] // out.shape[0]
    for jt in range(n_kv):
        j0 = jt * bn
        jv = min(j0 + bn, seq_k)
        if eng.causal:
            jv = min(jv, i + 1)
        nv = max(0, jv - j0)
        smax = _row_max(s, j0, nv)
        m_new = m_i  # T4
        if smax != _NINF:
            mx = mul(smax, pp.qk_scale, pp.scale)
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
        _scores(p, s, j0, nv, m_sub, eng)  # T6, T7
        for jj in range(nv, bn):
            p[jj] = 0.0
        if pp.sum_order == 0:  # T8
            l_ij = _seq_sum(p, nv, ln.l_i, pp.l_i, eng.l_native32)
        else:  # zeros past nv leave the tree's value unchanged (x + 0 = x), so the tree runs over nv only
            l_ij = row_sum(p, nv, pp.l_i, pp.sum_order, eng.wn)
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
        tile = b * n_tiles + jt
        row_mma(src, ep, xs.v[tile], xs.ev[tile], acc, dv, eng.pv, w)  # T13
        if pp.per_step:
            _divide(acc, dv, 1.0 if l_new == 0.0 else l_new, ln.normalize, pp.normalize)
        m_i = m_new  # T14
        l_i = l_new
    o = out[b, i]
    for d in range(dv):
        o[d] = acc[d]
    if not pp.per_step:  # E1
        _divide(o, dv, 1.0 if l_i == 0.0 else l_i, ln.normalize, pp.normalize)
    _cast(o, 0, dv, ln.out, pp.out)  # E2
    m_out[b, i] = m_i
    l_out[b, i] = l_i


@jit
def flash_units(lo, hi, xs, out, m_out, l_out, eng):  # type: ignore[no-untyped-def]
    """Work units ``[lo, hi)``: unit u is (lead index u // n_q_tiles, q tile u % n_q_tiles)."""
    bm, bn = eng.bm, eng.bn
    seq_q, seq_k, dv = out.shape[1], xs.kt.shape[2], out.shape[2]
    n_qt = (seq_q + bm - 1) // bm
    width = max(seq_k, dv, bn)
    sc = FlashScratch(np.empty(seq_k + bn), np.zeros(bn), np.zeros(bn), np.zeros(bn), np.empty(dv), work(width))
    for u in range(lo, hi):
        b = u // n_qt
        t = u - b * n_qt
        kv_hi = min((t + 1) * bm, seq_k) if eng.causal else seq_k
        n_kv = (kv_hi + bn - 1) // bn
        for i in range(t * bm, min(seq_q, (t + 1) * bm)):
            _flash_row(b, i, n_kv, xs, out, m_out, l_out, eng, sc)


# -- baseline --------------------------------------------------------------------------------------------------


@jit
def baseline_units(lo, hi, xs, out, eng):  # type: ignore[no-untyped-def]
    """Rows ``[lo, hi)`` of the flattened (lead, query) grid: full scores, softmax, P.V (see baseline.py)."""
    pp, ln = eng.pp, eng.ln
    seq_q, seq_k, dv = out.shape[1], xs.kt.shape[2], out.shape[2]
    width = max(seq_k, dv)
    s, pin, ep = np.empty(seq_k), np.zeros(seq_k), np.zeros(seq_k)
    w = work(width)
    for r in range(lo, hi):
        b = r // seq_q
        i = r - b * seq_q
        jv = min(seq_k, i + 1) if eng.causal else seq_k
        for j in range(jv):
            s[j] = 0.0
        row_mma(xs.q[b, i], xs.eq[b, i], xs.kt[b], xs.ekt[b], s, jv, eng.qk, w)
        _scale_by(s, jv, pp.sm_scale, ln.scale, pp.scale)
        _cast(s, 0, jv, ln.softmax, pp.softmax)
        m = _row_max(s, 0, jv)
        if ln.softmax.fast:
            for j in range(jv):
                s[j] = lround(math.exp(ladd(s[j], -m, ln.softmax)), ln.softmax)
        else:
            for j in range(jv):
                s[j] = exp(sub(s[j], m, pp.softmax), pp.softmax)
        tot = _seq_sum(s, jv, ln.softmax, pp.softmax, False)
        _divide(s, jv, 1.0 if tot == 0.0 else tot, ln.softmax, pp.softmax)
        for j in range(jv, seq_k):
            s[j] = 0.0
        src = s
        if eng.pv.in_round:
            for j in range(seq_k):
                pin[j] = lround(s[j], eng.pv.inp)
            src = pin
        if eng.pv.align_sum:
            _weights_of(src, ep, seq_k, eng.pv.opnd_emin)
        o = out[b, i]
        for d in range(dv):
            o[d] = 0.0
        row_mma(src, ep, xs.v[b], xs.ev[b], o, dv, eng.pv, w)
        _cast(o, 0, dv, ln.out, pp.out)
