"""The float64 shadow of the reference forward loop (traced runs only): after each key tile the emulated loop
took (its :class:`~simfloat.attention.reference.forward.Step`), the same dataflow in float64 from the same
inputs (the lse form's, a float plan's with the same lazy and tie-shift decisions, or a quantized plan's on the
unquantized inputs), then the drift of the emulated state from it through :func:`srec`. :func:`shadow` is the
loop's one call, pruned when there is no trace.
"""

from __future__ import annotations

import math

import numpy as np

from simfloat._jit import fma64, jit
from simfloat.attention._kernels import dot64, fmax
from simfloat.attention._masks import DENSE_ADD
from simfloat.attention.reference._trace import S_ACC, S_L, S_M, exp64, srec

_NINF = -np.inf
_LOG2E = math.log2(math.e)


@jit
def _shadow_lse(o, w, pp, tr, at, st, ms, lses):
    """One key tile of the float64 shadow of the lse form (same dataflow in float64) after the emulated
    :class:`Step` ``st``, then the state drift (m_i, and l_i relative to m_ij); returns the shadow's (m_i,
    lse_i)."""
    b, j0, nv, m_lp, l_lp = at[0], st.j0, st.nv, st.m_i, st.l_i
    ss, ps, accs = w.ss, w.ps, w.accs
    sc64 = 1.0 if o.mk.dense == DENSE_ADD else pp.qk_scale64  # an additive mask's scores are scaled
    smax = _NINF
    for jj in range(nv):
        smax = fmax(smax, ss[jj])
    m_new = lses if smax == _NINF else fmax(lses, smax * sc64)
    m_sub = 0.0 if m_new == _NINF else m_new
    lij = 0.0
    for jj in range(nv):
        ps[jj] = math.exp(ss[jj] * sc64 - m_sub)
        lij += ps[jj]
    alpha = 0.0 if ms == _NINF else math.exp(ms - m_sub)
    l_new = (0.0 if lses == _NINF else math.exp(lses - m_sub)) + lij
    for d in range(accs.shape[0]):
        a = accs[d] * alpha
        for jj in range(nv):
            a += ps[jj] * o.v64[b, j0 + jj, d]
        accs[d] = a
        srec(tr, at, S_ACC, w.acc[d], a)
    if m_new != _NINF:
        srec(tr, at, S_M, m_lp, m_new)
        lses = m_sub + math.log(l_new)
    srec(tr, at, S_L, l_lp, l_new)
    return m_new, lses


@jit
def _shadow_float(o, w, pp, tr, at, st, ms, ls, unit):
    """One key tile of the float64 shadow of a plan without quantizers after the emulated :class:`Step` ``st``
    (same dataflow, same lazy and tie-shift decisions), then the state drift (``unit``: the factor
    ``2**p_offset`` the emulated l and acc carry; masked keys: score -inf; an additive mask's scores are scaled)."""
    b, j0, nv, rescale, tied, m_lp, l_lp = at[0], st.j0, st.nv, st.rescale, st.tied, st.m_i, st.l_i / unit
    ss, ps, accs = w.ss, w.ps, w.accs
    sc64 = 1.0 if o.mk.dense == DENSE_ADD else pp.qk_scale64
    smax = _NINF
    for jj in range(nv):
        smax = fmax(smax, ss[jj])
    mx = smax * sc64
    if tied:
        mx = mx * pp.tie_beta if mx > 0.0 else (0.0 if mx < 0.0 else mx)
    m_new = fmax(ms, mx) if rescale else ms
    m_sub = 0.0 if m_new == _NINF else m_new
    lij = 0.0
    for jj in range(nv):
        x = fma64(ss[jj], sc64, -m_sub) if pp.contract else ss[jj] * sc64 - m_sub
        ps[jj] = exp64(x, pp)
        lij += ps[jj]
    alpha = 1.0
    if rescale:
        alpha = 0.0 if ms == _NINF else exp64(ms - m_sub, pp)
    l_new = fma64(ls, alpha, lij) if pp.contract else ls * alpha + lij
    sc = ls * alpha if pp.per_step else alpha
    l_div = 1.0 if l_new == 0.0 else l_new
    for d in range(accs.shape[0]):
        a = accs[d] * sc
        for jj in range(nv):
            a += ps[jj] * o.v64[b, j0 + jj, d]
        accs[d] = a / l_div if pp.per_step else a
        srec(tr, at, S_ACC, w.acc[d] / unit, accs[d])
    if m_new != _NINF:
        srec(tr, at, S_M, m_lp, m_new)
    srec(tr, at, S_L, l_lp, l_new)
    return m_new, l_new


@jit
def _shadow_quant(o, w, pp, tr, at, i, st, ms, ls, unit):
    """One key tile of a quantized plan's float64 shadow on the unquantized inputs (exact softmax scale) after
    the emulated :class:`Step` ``st`` (``unit``: as :func:`_shadow_float`), then the drift of the emulated state
    (m in the kernel's units, l and acc relative to each run's own running max). Masked keys (the -inf scores
    :func:`_scores` left in ``w.ss``) get -inf; an additive mask adds its bias (in log2 units under exp2)."""
    b, j0, nv, m_lp, l_lp = at[0], st.j0, st.nv, st.m_i, st.l_i / unit
    ps, accs = w.ps, w.accs
    smax = _NINF
    for jj in range(nv):
        if o.mk.on and w.ss[jj] == _NINF:
            ps[jj] = _NINF
            continue
        ps[jj] = dot64(o.q64[b, i], o.k64[b, j0 + jj], 0.0) * pp.qk_scale64
        if o.mk.dense == DENSE_ADD:
            bv = o.mk.bias[o.mk.bmap[b], i, j0 + jj]
            ps[jj] += bv * _LOG2E if pp.exp2 else bv
        smax = fmax(smax, ps[jj])
    m_new = fmax(ms, smax)
    m_sub = 0.0 if m_new == _NINF else m_new
    lij = 0.0
    for jj in range(nv):
        ps[jj] = exp64(ps[jj] - m_sub, pp)
        lij += ps[jj]
    alpha = 0.0 if ms == _NINF else exp64(ms - m_sub, pp)
    l_new = ls * alpha + lij
    for d in range(accs.shape[0]):
        a = accs[d] * alpha
        for jj in range(nv):
            a += ps[jj] * o.v64[b, j0 + jj, d]
        accs[d] = a
        srec(tr, at, S_ACC, w.acc[d] * w.vs_fin[d], a)
    if m_new != _NINF:
        srec(tr, at, S_M, m_lp, m_new)
    srec(tr, at, S_L, l_lp, l_new)
    return m_new, l_new


@jit
def shadow(o, w, pp, tr, at, i, st, ms, ls, unit):
    """The float64 shadow's key tile after the emulated :class:`Step` ``st`` (:func:`_shadow_lse`,
    :func:`_shadow_quant` or :func:`_shadow_float`), from its running (m, l) ``ms``, ``ls`` (the lse form: its
    lse_i); returns the new ones (unchanged when ``tr`` is None: no shadow runs)."""
    if tr is not None:
        if pp.lse:
            return _shadow_lse(o, w, pp, tr, at, st, ms, ls)
        if pp.quantized:
            return _shadow_quant(o, w, pp, tr, at, i, st, ms, ls, unit)
        return _shadow_float(o, w, pp, tr, at, st, ms, ls, unit)
    return ms, ls
