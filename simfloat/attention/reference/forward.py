"""The forward flash loop of the reference engine: one scalar loop for every plan (see
:mod:`simfloat.attention.flash` for the float dataflow's steps, :mod:`simfloat.attention.quantized` for the
quantizers'); each optional step is chosen by a field of :class:`~simfloat.attention._flash_params.FlashParams`.

Per query row i and key tile jt: the scores (T2, T3; quantizers: the codes' dot, then the scores' dequant or
the folded scales, Q smoothing's delta_s), the running max (T4, the tie shift, lazy rescaling; T5), the shifted
exponentials (T6, T7), alpha (T9), P's cast or quantizer (T12), the row sum l_ij (T8: sequential, chunked, the
tl.sum tree or the quantized P's exact integer sum), l_i (T10), then the accumulator (T11, T13) in one of the
P.V update forms, and the epilogue (E1, E2; quantizers: V's descale).

Tracing goes through one hook, :func:`~simfloat.attention.reference._trace.rec` (a no-op when ``tr`` is None,
which numba prunes: ``tr`` stays a plain argument), and the float64 shadow through one call,
:func:`~simfloat.attention.reference._shadow.shadow`: each op records its result and the float64 value of the
same operation on the same inputs under a logical op (``R_*``) at ``at`` = (lead, q tile, key tile), which the
trace record maps to the plan's tracer column (``FLASH_OPS`` or ``QUANT_OPS``; :func:`trace_columns`). The exact
values that cost a dot or an exponential are computed only when tracing. The records: :class:`Operands`
(:mod:`~simfloat.attention.reference._operands`), :class:`Trace` (:mod:`~simfloat.attention.reference._trace`),
a key tile's :class:`Step`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from simfloat._jit import fma64, jit, ljit, record_of
from simfloat._parallel import run_rows
from simfloat.attention._flash_params import ARRAYS, FlashParams
from simfloat.attention._kernels import (
    add,
    div,
    dot64,
    exp_op,
    fma,
    fmax,
    kv_tile,
    log,
    mul,
    rnd,
    row_sum,
    sub,
)
from simfloat.attention._masks import DENSE_ADD, key_masked, visible_keys, visible_tiles
from simfloat.attention._quant_kernels import (
    DELTA_MMA,
    DELTA_SCORES,
    DOT_SCALED,
    K_BLOCK,
    K_FFLOAT,
    K_INT,
    PV_INTO_ACC,
    PV_SEPARATE,
    PV_TWO_LEVEL,
    block_p_codes,
    dot3,
    p_quant,
    p_value,
    sdot,
    sdot64,
)
from simfloat.attention.reference._operands import Operands, float_operands, key_rows, v_tiles
from simfloat.attention.reference._shadow import shadow
from simfloat.attention.reference._trace import (
    LOGICAL_OPS,
    R_ACC,
    R_ALPHA,
    R_DEQUANT,
    R_EXP,
    R_L_I,
    R_L_IJ,
    R_M_I,
    R_NORMALIZE,
    R_OUT,
    R_P,
    R_PV,
    R_PV_DEQUANT,
    R_QK,
    R_SCALE,
    S_OUT,
    Trace,
    exp64,
    rec,
    srec,
    trace_columns,
)
from simfloat.hardware import ex2_poly_f32

__all__ = ["LOGICAL_OPS", "Operands", "Trace", "float_operands", "key_rows", "run", "trace_columns", "units", "v_tiles"]

_NINF = -np.inf
_LOG2E = math.log2(math.e)
# The scratch's one row (P as a (1, 1, block_n) matrix), a range's start, key tile 0: an int64, not the literal 0
# (numba compiles a function once per literal argument: the P.V dots would compile again beside the scores').
_ROW0 = np.int64(0)


class _Scratch(NamedTuple):
    s: np.ndarray  # (block_n,) scores
    p: np.ndarray  # (block_n,) P
    pc: np.ndarray  # (block_n,) P's codes (cast)
    pc3: np.ndarray  # pc as (1, 1, block_n)
    psc: np.ndarray  # (block_n,) P's block scales
    psc3: np.ndarray
    ss: np.ndarray  # (block_n,) the exact scores (float shadow)
    ps: np.ndarray  # (block_n,) the shadow's P
    acc: np.ndarray  # (dv,)
    accs: np.ndarray  # (dv,) the shadow's accumulator
    vs_fin: np.ndarray  # (dv,) the epilogue's V scale (quantized shadow)
    lse: np.ndarray  # (1,) the lse form's running lse_i (Plan.state="lse")
    mr: np.ndarray  # (1,) the row's unscaled running max (Plan.alpha_raw)


class Step(NamedTuple):
    """What one key tile left (:func:`_tile`), which the float64 shadow follows: the row's m_i and l_i after it,
    the keys seen (``nv`` from ``j0``), whether it rescaled (lazy rescaling) and whether T4's tie shift fired."""

    m_i: float
    l_i: float
    nv: int
    j0: int
    rescale: bool
    tied: bool


@ljit
def _dequant_score(o, pp, tr, at, i, key, x):
    """Quantizers, ``score_scaling="scores"``: ``dequant(dequant(x * q_scale) * k_scale)`` (+ delta_s)."""
    b, t, _ = at
    y = mul(x, o.qs[b, i], pp.dequant)
    z = mul(y, o.ks[b, key], pp.dequant)
    rec(tr, at, R_DEQUANT, y, x * o.qs[b, i])
    rec(tr, at, R_DEQUANT, z, y * o.ks[b, key])
    if pp.delta_mode == DELTA_SCORES:  # Q smoothing's correction on the dequantized score
        y = add(z, o.ds[b, t, key], pp.dequant)
        rec(tr, at, R_DEQUANT, y, z + o.ds[b, t, key])
        return y
    return z


@jit
def _raw_alpha_arg(r_old, r_new, sscale, pp, tr, at):
    """FA3/4's alpha argument from the unscaled maxima: ``alpha(alpha(r_old - r_new) * sscale)``."""
    x = sub(r_old, r_new, pp.alpha)
    y = mul(x, sscale, pp.alpha)
    rec(tr, at, R_ALPHA, x, r_old - r_new)
    rec(tr, at, R_ALPHA, y, x * sscale)
    return y


@jit
def _tie_shift(s, nv, mx, sscale, pp, tr, at):
    """Plan.tie_shift: count the keys tied with the tile max, shift the max if two or more; (max, tied)."""
    thr = sub(mx, pp.tie_tol, pp.scale)
    n_tied = 0
    for jj in range(nv):
        if s[jj] == _NINF:  # a masked key (it could not tie a finite max)
            continue
        y = mul(s[jj], sscale, pp.scale)
        rec(tr, at, R_SCALE, y, s[jj] * sscale)
        if y >= thr:
            n_tied += 1
    if n_tied < 2:
        return mx, False
    if mx > 0.0:
        y = mul(mx, pp.tie_beta, pp.m_i)
        rec(tr, at, R_M_I, y, mx * pp.tie_beta)
        return y, True
    return (0.0 if mx < 0.0 else mx), True


@jit
def _p_codes(w, nv, pp, tr, at):
    """T12: P's cast or quantizer into ``w.pc`` (block scales into ``w.psc``; keys nv.. get 0); returns a two-level
    block quantizer's per-row scale (else 1)."""
    p, pc, psc = w.p, w.pc, w.psc
    if pp.p_kind == K_BLOCK:
        s1 = block_p_codes(p, nv, pc, psc, pp)
        if pp.pv_kind != DOT_SCALED:  # a dot without block scales takes the values (exact products)
            for jj in range(pc.shape[0]):
                pc[jj] = pc[jj] * psc[jj]
                psc[jj] = 1.0
        for jj in range(nv):
            rec(tr, at, R_P, pc[jj] * psc[jj] * s1, p[jj])
        return s1
    for jj in range(nv):
        c = p_quant(p[jj], pp)
        pc[jj] = c
        if tr is not None:
            rec(tr, at, R_P, p_value(c, pp), p[jj])
    for jj in range(nv, pc.shape[0]):
        pc[jj] = 0.0
    return 1.0


@jit
def _seq(p, lo, hi, o, tr, at):
    """T8's sequential sum of p[lo:hi] from 0, each addition rounded by ``o``."""
    s = 0.0
    for jj in range(lo, hi):
        y = add(s, p[jj], o)
        rec(tr, at, R_L_IJ, y, s + p[jj])
        s = y
    return s


@jit
def _tile_sum(w, nv, pp, tr, at, wn):
    """T8: l_ij, the in-tile row sum of P (the quantized P's with ``consistent``)."""
    if pp.consistent and pp.p_kind == K_INT:  # integer codes: the exact sum (< 2**53), then / qmax
        isum = 0.0
        for jj in range(nv):
            isum += w.pc[jj]
        l_ij = div(isum, pp.p_qmax, pp.l_ij)
        rec(tr, at, R_L_IJ, l_ij, isum / pp.p_qmax)
        return l_ij
    src = w.pc if pp.consistent else w.p
    if pp.sum_order != 0:  # the plan's tree order over the whole tile (masked / padded p are 0)
        l_ij = row_sum(src, src.shape[0], pp.l_ij, pp.sum_order, wn)
        if tr is not None:
            ex = 0.0
            for jj in range(nv):
                ex += src[jj]
            rec(tr, at, R_L_IJ, l_ij, ex)
        return l_ij
    if pp.l_ij_chunk == 0:
        return _seq(src, _ROW0, nv, pp.l_ij, tr, at)
    l_ij = 0.0
    for c0 in range(0, nv, pp.l_ij_chunk):
        cs = _seq(src, c0, min(nv, c0 + pp.l_ij_chunk), pp.l_ij, tr, at)
        y = add(l_ij, cs, pp.l_ij_out)
        rec(tr, at, R_L_IJ, y, l_ij + cs)
        l_ij = y
    return l_ij


@ljit
def _acc_update(a, alpha, y, pp, tr, at):
    """``acc(fma(a, alpha, y))`` (``contract``), else ``acc(acc(a * alpha) + y)``."""
    if pp.contract:
        r = fma(a, alpha, y, pp.acc)
        rec(tr, at, R_ACC, r, fma64(a, alpha, y))
        return r
    a0 = mul(a, alpha, pp.acc)
    r = add(a0, y, pp.acc)
    rec(tr, at, R_ACC, a0, a * alpha)
    rec(tr, at, R_ACC, r, a0 + y)
    return r


@ljit
def _pv_quant(o, w, pp, tr, at, vrow, d, alpha, s1):
    """T11, T13 in the quantized P.V forms other than ``into_acc``: channel d's new accumulator."""
    b, _, jt = at
    acc = w.acc
    if pp.pv_mode == PV_TWO_LEVEL:  # a fresh P.V per key tile, added to the fp32 accumulator
        pv = sdot(w.pc3, _ROW0, _ROW0, w.psc3, o.vt, vrow, d, o.vb, 0.0, pp.pv, pp.pv_kind)
        if tr is not None:
            rec(tr, at, R_PV, pv, sdot64(w.pc3, _ROW0, _ROW0, w.psc3, o.vt, vrow, d, o.vb, pp.pv_kind == DOT_SCALED))
        if pp.p_kind == K_BLOCK and pp.p_two_level:  # SageAttention3: P's per-row scale folded back
            y = mul(pv, s1, pp.pv_dequant)
            rec(tr, at, R_PV_DEQUANT, y, pv * s1)
            pv = y
        return _acc_update(acc[d], alpha, pv, pp, tr, at)
    vs = o.vs[b, jt, d]
    if pp.pv_mode == PV_SEPARATE:
        pv = dot3(w.pc3, _ROW0, _ROW0, o.vt, vrow, d, 0.0, pp.pv, pp.pv_kind)
        y = mul(pv, vs, pp.pv_dequant)
        if tr is not None:
            rec(tr, at, R_PV, pv, dot64(w.pc, o.vt[vrow, d], 0.0))
        rec(tr, at, R_PV_DEQUANT, y, pv * vs)
        if pp.p_kind == K_INT or pp.p_kind == K_FFLOAT:
            z = div(y, pp.p_qmax, pp.pv_dequant)
            rec(tr, at, R_PV_DEQUANT, z, y / pp.p_qmax)
            y = z
        return _acc_update(acc[d], alpha, y, pp, tr, at)
    a0 = mul(acc[d], alpha, pp.acc)  # PV_SCALED
    rec(tr, at, R_ACC, a0, acc[d] * alpha)
    pv = dot3(w.pc3, _ROW0, _ROW0, o.vt, vrow, d, 0.0, pp.pv, pp.pv_kind)
    a = fma(pv, vs, a0, pp.pv_dequant)
    if tr is not None:
        rec(tr, at, R_PV, pv, dot64(w.pc, o.vt[vrow, d], 0.0))
        rec(tr, at, R_PV_DEQUANT, a, fma64(pv, vs, a0))
    return a


@ljit
def _biased(o, pp, tr, at, i, key, x, ex, sscale):
    """T3 with an additive mask: ``scale(fma(qk, qk_scale, bias'))`` (``contract``), else
    ``scale(scale(qk * qk_scale) + bias')``, with ``bias' = scale(bias * scale(log2 e))`` under exp2 (else the
    bias), the bias a value of the scale op's format; returns it and its float64 value."""
    b = at[0]
    bv = o.mk.bias[o.mk.bmap[b], i, key]
    b2, b64 = bv, bv
    if pp.exp2:
        b2 = mul(bv, rnd(_LOG2E, pp.scale), pp.scale)
        b64 = bv * _LOG2E
        rec(tr, at, R_SCALE, b2, bv * rnd(_LOG2E, pp.scale))
    if pp.contract:
        y = fma(x, sscale, b2, pp.scale)
        rec(tr, at, R_SCALE, y, fma64(x, sscale, b2))
    else:
        z = mul(x, sscale, pp.scale)
        y = add(z, b2, pp.scale)
        rec(tr, at, R_SCALE, z, x * sscale)
        rec(tr, at, R_SCALE, y, z + b2)
    return y, ex * pp.qk_scale64 + b64


@jit
def _scores(o, w, pp, tr, at, i, j0, nv, sscale, lo):
    """T2, T3: the tile's scores into ``w.s`` (the exact ones into ``w.ss`` when tracing); their max. Keys
    the mask drops (``lo``: the row's first visible key) get -inf (T3's ``where``); an additive mask's scores
    are the scaled and biased ones (:func:`_biased`)."""
    b, t, _ = at
    smax = _NINF
    for jj in range(nv):
        if o.mk.on and key_masked(o.mk, b, i, j0 + jj, lo):
            w.s[jj] = _NINF
            w.ss[jj] = _NINF
            continue
        c0 = o.ds[b, t, j0 + jj] if pp.delta_mode == DELTA_MMA else 0.0  # SageAttention3: delta_s into the MMA
        x = sdot(o.qc, b, i, o.qb, o.kc, b, j0 + jj, o.kb, c0, pp.qk, pp.qk_kind)
        if tr is not None:
            ex = sdot64(o.qc, b, i, o.qb, o.kc, b, j0 + jj, o.kb, pp.qk_kind == DOT_SCALED)
            if pp.quantized:
                ex = c0 + ex
            w.ss[jj] = ex
            rec(tr, at, R_QK, x, ex)
        if pp.scores_dequant:
            x = _dequant_score(o, pp, tr, at, i, j0 + jj, x)
        if o.mk.dense == DENSE_ADD:
            x, w.ss[jj] = _biased(o, pp, tr, at, i, j0 + jj, x, w.ss[jj], sscale)
        w.s[jj] = x
        smax = fmax(smax, x)
    return smax


@jit
def _tile(o, w, pp, tr, geo, at, i, m_i, l_i, qss):
    """T2..T14 for row ``i`` and key tile ``jt`` of ``at`` = (lead b, q tile t, jt); returns the :class:`Step`.
    ``qss``: the row's score scale (folded: ``qk_scale * q_scale``, else qk_scale)."""
    b, t, jt = at
    bm, bn, causal, seq_k, wn = geo
    vrow = b * ((seq_k + bn - 1) // bn) + jt
    j0 = jt * bn
    lo, hi = visible_keys(o.mk, causal, b, i, seq_k)  # the row's keys [lo, hi) (keys < lo: masked in _scores)
    jv = min(j0 + bn, hi)
    nv = max(0, jv - j0)
    s, p, acc = w.s, w.p, w.acc
    sscale = qss
    if pp.folded:  # FP8 T2: s_scale = qs_scale * k_scale (per key tile)
        sscale = mul(qss, o.ks[b, j0], pp.scale)
        rec(tr, at, R_SCALE, sscale, qss * o.ks[b, j0])
    smax = _scores(o, w, pp, tr, at, i, j0, nv, sscale, lo)
    if o.mk.dense == DENSE_ADD:  # the scores are scaled already
        sscale = 1.0
    m_base = w.lse[0] if pp.lse else m_i  # the lse form: m_ij = max(lse_i, rowmax)
    m_new = m_base  # T4
    tied = False  # T4's tie shift fired (the shadow takes the same decision)
    r_old = w.mr[0]  # alpha_raw: the unscaled running max
    r_new = fmax(r_old, smax) if smax != _NINF else r_old
    if smax != _NINF:
        mx = mul(smax, sscale, pp.scale)
        rec(tr, at, R_SCALE, mx, smax * sscale)
        if pp.tie:
            mx, tied = _tie_shift(s, nv, mx, sscale, pp, tr, at)
        m_new = fmax(m_base, mx)
        if m_new != m_base:
            y = rnd(m_new, pp.m_i)
            rec(tr, at, R_M_I, y, m_new)
            m_new = y
    rescale = True
    if pp.lazy:
        if m_i == _NINF:
            rescale = m_new > _NINF
        elif pp.alpha_raw:  # FA4: keep the max while d = (r_old - r_new) * scale >= -threshold
            rescale = not (_raw_alpha_arg(r_old, r_new, sscale, pp, tr, at) >= -pp.threshold)
        else:
            dm = sub(m_new, m_i, pp.m_i)
            rec(tr, at, R_M_I, dm, m_new - m_i)
            rescale = dm > pp.threshold
        if not rescale:
            m_new = m_i
            r_new = r_old
    w.mr[0] = r_new
    m_sub = 0.0 if m_new == _NINF else m_new  # T5
    m_x = m_sub  # the shift in P's exponent
    if pp.p_shift != 0.0:  # SageAttention3's kernel: P scaled onto [0, qmax] by the shift, t = qmax * p
        m_x = sub(m_sub, pp.p_shift, pp.scale)
        rec(tr, at, R_SCALE, m_x, m_sub - pp.p_shift)
    fused = pp.contract and not (pp.diag_plain and causal and j0 + bn - 1 > t * bm)  # T6 in one rounding
    for jj in range(nv):  # T6, T7
        sj = s[jj]
        if o.mk.on and sj == _NINF and key_masked(o.mk, b, i, j0 + jj, lo):  # p = 0 (exp2(-inf))
            p[jj] = 0.0
            continue
        if fused:
            x = fma(sj, sscale, -m_x, pp.scale)
            rec(tr, at, R_SCALE, x, fma64(sj, sscale, -m_x))
        else:
            y = mul(sj, sscale, pp.scale)
            x = sub(y, m_x, pp.scale)
            rec(tr, at, R_SCALE, y, sj * sscale)
            rec(tr, at, R_SCALE, x, y - m_x)
        if o.ex2_poly.size > 0 and o.ex2_poly[jj] != 0:  # FA4: the software exp2 at this key position
            pj = rnd(ex2_poly_f32(x), pp.exp)
        else:
            pj = exp_op(x, pp.exp, pp, o.ex2_tab)
        if tr is not None:
            rec(tr, at, R_EXP, pj, exp64(x, pp))
        p[jj] = pj
    for jj in range(nv, bn):
        p[jj] = 0.0
    alpha = 1.0  # T9
    if rescale:
        if m_i == _NINF:
            alpha = 0.0
        else:
            if pp.alpha_raw:  # FA3/4: exp2(alpha(alpha(r_old - r_new) * scale))
                dm = _raw_alpha_arg(r_old, r_new, sscale, pp, tr, at)
            else:
                dm = sub(m_i, m_sub, pp.alpha)
                rec(tr, at, R_ALPHA, dm, m_i - m_sub)
            alpha = exp_op(dm, pp.alpha, pp, o.ex2_tab)
            if tr is not None:
                rec(tr, at, R_ALPHA, alpha, exp64(dm, pp))
    s1 = _p_codes(w, nv, pp, tr, at)  # T12
    l_ij = _tile_sum(w, nv, pp, tr, at, wn)  # T8
    if pp.lse:  # T10, the lse form: l_i = exp(lse_i - m_ij) + l_ij, lse_i = m_ij + log(l_i)
        l_new = _lse_update(o, w, pp, tr, at, m_new, m_sub, l_ij)
    elif pp.contract:  # T10
        l_new = fma(l_i, alpha, l_ij, pp.l_i)
        rec(tr, at, R_L_I, l_new, fma64(l_i, alpha, l_ij))
    else:
        y = mul(l_i, alpha, pp.l_i)
        l_new = add(y, l_ij, pp.l_i)
        rec(tr, at, R_L_I, y, l_i * alpha)
        rec(tr, at, R_L_I, l_new, y + l_ij)
    if pp.pv_mode != PV_INTO_ACC:  # the quantized P.V forms
        for d in range(acc.shape[0]):
            acc[d] = _pv_quant(o, w, pp, tr, at, vrow, d, alpha, s1)
        return Step(m_new, l_new, nv, j0, rescale, tied)
    sc = alpha  # T11: acc(acc * alpha); FA1: acc(acc * acc(l_old * alpha))
    if pp.per_step:
        sc = mul(l_i, alpha, pp.acc)
        rec(tr, at, R_ACC, sc, l_i * alpha)
    elif pp.pv_acc:  # an accumulator held in pv_acc's format: acc(acc * pv_acc(alpha))
        sc = rnd(alpha, pp.pv_acc_op)
        rec(tr, at, R_ACC, sc, alpha)
    l_div = 1.0 if l_new == 0.0 else l_new
    for d in range(acc.shape[0]):  # T13: tl.dot(p, v, acc) (+ FA1 normalization)
        a0 = mul(acc[d], sc, pp.acc)
        rec(tr, at, R_ACC, a0, acc[d] * sc)
        y = dot3(w.pc3, _ROW0, _ROW0, o.vt, vrow, d, a0, pp.pv, pp.pv_kind)
        if tr is not None:
            rec(tr, at, R_PV, y, dot64(w.pc, o.vt[vrow, d], a0))
        if pp.per_step:
            z = div(y, l_div, pp.normalize)
            rec(tr, at, R_NORMALIZE, z, y / l_div)
            y = z
        acc[d] = y
    return Step(m_new, l_new, nv, j0, rescale, tied)


@jit
def _lse_update(o, w, pp, tr, at, m_new, m_sub, l_ij):
    """T10 of the lse form: ``l_i = l_i(alpha(exp(alpha(lse_i - m_ij))) + l_ij)`` (0 for the exponential while
    lse_i is -inf), then ``lse_i = m_i(m_ij + l_i(log(l_i)))`` (lse_i stays -inf while no key was seen)."""
    lse_i = w.lse[0]
    e = 0.0
    if lse_i != _NINF:
        dl = sub(lse_i, m_sub, pp.alpha)
        e = exp_op(dl, pp.alpha, pp, o.ex2_tab)
        rec(tr, at, R_ALPHA, dl, lse_i - m_sub)
        if tr is not None:
            rec(tr, at, R_ALPHA, e, math.exp(dl))
    l_new = add(e, l_ij, pp.l_i)
    rec(tr, at, R_L_I, l_new, e + l_ij)
    if m_new != _NINF:
        lg = log(l_new, pp.l_i)
        y = add(m_sub, lg, pp.m_i)
        if tr is not None:
            rec(tr, at, R_L_I, lg, math.log(l_new))
        rec(tr, at, R_M_I, y, m_sub + lg)
        w.lse[0] = y
    return l_new


@jit
def _epilogue_descale(a, vs, pp, tr, at):
    """Quantizers, into_acc / two_level: V's descale once (then P's fixed scale)."""
    y = mul(a, vs, pp.pv_dequant)
    rec(tr, at, R_PV_DEQUANT, y, a * vs)
    if pp.p_kind == K_INT or pp.p_kind == K_FFLOAT:
        z = div(y, pp.p_qmax, pp.pv_dequant)
        rec(tr, at, R_PV_DEQUANT, z, y / pp.p_qmax)
        return z
    return y


@jit
def _scratch(bn, dv):
    pc, psc = np.empty(bn), np.ones(bn)
    return _Scratch(
        np.empty(bn),
        np.empty(bn),
        pc,
        pc.reshape((1, 1, bn)),
        psc,
        psc.reshape((1, 1, bn)),
        np.empty(bn),
        np.empty(bn),
        np.empty(dv),
        np.empty(dv),
        np.ones(dv),
        np.full(1, _NINF),
        np.empty(1),
    )


@jit
def units(lo, hi, o, pp, geo, tr, out, m_out, l_out):
    """Work units ``[lo, hi)``: unit u is (lead index u // n_q_tiles, q tile u % n_q_tiles).

    Args:
        o: the :class:`Operands`; pp: the plan's :class:`~simfloat.attention._flash_params.FlashParams` as a record
            (:func:`run`);
            geo: (block_m, block_n, causal, seq_k, warps along the keys of the tl.sum layout);
            tr: a :class:`Trace` or None.
        out: (lead, seq_q, dv); m_out, l_out: (lead, seq_q), written.
    """
    bm, bn, causal, seq_k, wn = geo
    seq_q, dv = o.qc.shape[1], o.vt.shape[1]
    n_qt = (seq_q + bm - 1) // bm
    n_kv_all = (seq_k + bn - 1) // bn
    w = _scratch(bn, dv)
    acc, accs = w.acc, w.accs
    p_fixed = pp.p_kind == K_INT or pp.p_kind == K_FFLOAT
    l_unit = pp.p_qmax if pp.p_shift != 0.0 else 1.0  # a fixed P shift scales l and acc by qmax (for traces)
    for u in range(lo, hi):
        b = u // n_qt
        t = u - b * n_qt
        jt_lo, n_kv = visible_tiles(o.mk, causal, b, t, bm, bn, seq_k)  # FA2's n_block_min / max
        if pp.v_epilogue:
            for d in range(dv):
                w.vs_fin[d] = o.vs[b, 0, d] / pp.p_qmax if p_fixed or pp.p_shift != 0.0 else o.vs[b, 0, d]
        for i in range(t * bm, min(seq_q, (t + 1) * bm)):
            qss = pp.qk_scale
            if pp.folded:  # FP8 K2: qs_scale = qk_scale * q_scale (per q tile)
                qss = mul(pp.qk_scale, o.qs[b, i], pp.scale)
                rec(tr, (b, t, _ROW0), R_SCALE, qss, pp.qk_scale * o.qs[b, i])
            m_i, l_i, ms, ls = _NINF, 0.0, _NINF, (_NINF if pp.lse else 0.0)  # lse form: ls is the shadow's lse_i
            w.lse[0] = _NINF
            w.mr[0] = _NINF
            acc[:] = 0.0
            accs[:] = 0.0
            for pos in range(n_kv):
                jt = kv_tile(pos, n_kv, t, bm, bn, causal, pp.kv_order)
                if jt < jt_lo:  # a tile no row of the q tile sees (masks: FA2's n_block_min)
                    continue
                at = (b, t, jt)
                st = _tile(o, w, pp, tr, geo, at, i, m_i, l_i, qss)
                m_i, l_i = st.m_i, st.l_i
                ms, ls = shadow(o, w, pp, tr, at, i, st, ms, ls, l_unit)
            fin = (b, t, n_kv_all)  # the epilogue's trace position
            l_div = 1.0 if l_i == 0.0 else l_i  # E1, E2
            ls_div = 1.0 if ls == 0.0 else ls
            osc = 1.0  # the lse form's o_scale = exp(m_i - lse_i)
            if pp.lse:
                if m_i != _NINF:
                    dm = sub(m_i, w.lse[0], pp.normalize)
                    osc = exp_op(dm, pp.normalize, pp, o.ex2_tab)
                    rec(tr, fin, R_NORMALIZE, dm, m_i - w.lse[0])
                    if tr is not None:
                        rec(tr, fin, R_NORMALIZE, osc, math.exp(dm))
                ls_div = 1.0 if ms == _NINF else math.exp(ls - ms)  # the shadow's l relative to its m
                l_i = 0.0 if m_i == _NINF else 1.0  # the stats: m = lse, l = 1
                m_i = w.lse[0]
            for d in range(dv):
                a = acc[d]
                if pp.v_epilogue:
                    a = _epilogue_descale(a, o.vs[b, 0, d], pp, tr, fin)
                if pp.lse:
                    x = mul(a, osc, pp.normalize)
                    rec(tr, fin, R_NORMALIZE, x, a * osc)
                elif pp.per_step:
                    x = a
                else:
                    x = div(a, l_div, pp.normalize)
                    rec(tr, fin, R_NORMALIZE, x, a / l_div)
                y = rnd(x, pp.out)
                out[b, i, d] = y
                rec(tr, fin, R_OUT, y, x)
                srec(tr, fin, S_OUT, y, accs[d] if pp.per_step else accs[d] / ls_div)
            m_out[b, i] = m_i
            l_out[b, i] = l_i


def run(
    o: Operands,
    fp: FlashParams,
    geo: tuple[int, int, int, int, int],
    tr: Trace | None,
    out: np.ndarray,
    m_out: np.ndarray,
    l_out: np.ndarray,
) -> None:
    """The reference loop over every (lead, q tile) unit: :func:`units` with the plan's params as a numpy record
    (:func:`simfloat._jit.record_of`; numba passes it as one pointer) and their arrays in the operands.

    Args:
        o: the :class:`Operands`; fp: the plan's FlashParams; geo: as :func:`units`'; tr: a :class:`Trace` or None.
        out: (lead, seq_q, dv); m_out, l_out: (lead, seq_q), written.
    """
    n_units = o.qc.shape[0] * -(-o.qc.shape[1] // geo[0])
    if n_units == 0:
        return
    o = o._replace(ex2_tab=fp.ex2_tab, ex2_poly=fp.ex2_poly)
    run_rows(units, n_units, o, record_of(fp, skip=ARRAYS), geo, tr, out, m_out, l_out)
