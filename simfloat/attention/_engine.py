"""The vectorized engine's baseline attention (row by row) and the element-wise helpers every vector loop shares
(the forward flash loop is :mod:`simfloat.attention.vector.forward`).

Same dataflow, op for op and bit for bit, as the reference kernel (:mod:`simfloat.attention.baseline`'s
``_units``), but shaped so that the work vectorizes: each row's scores are one call of the row kernel
``row_mma``; the element-wise ops (scale, exp, the casts, normalization) are loops of the branch-free lane
functions of :mod:`simfloat._lanes`. Ops whose format or mode has no lane form take the reference's scalar ops
in the same loops.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from simfloat._jit import jit, kjit, ljit
from simfloat._lanes import (
    Lane,
    ladd,
    ladd_f32,
    ladd_ne,
    lane_of,
    ldiv,
    ldiv_f32,
    ldiv_ne,
    lfma,
    lfma_f32,
    lfma_ne,
    libm_unsure,
    lmul,
    lmul_f32,
    lmul_ne,
    lround,
    lround_f32,
    lround_ne,
    pow2_of,
)
from simfloat.accumulate._rows import row_mma, work
from simfloat.attention._kernels import add, div, exp, exp2, exp2_hw, fma, fmax, mul, rnd, sub
from simfloat.attention._masks import DENSE_ADD, NO_MASK, KeyMask, key_masked, visible_keys
from simfloat.hardware import ex2_approx_f32
from simfloat.rounding import RoundingMode

__all__ = ["KEY_CHUNK", "Engine", "Lanes", "Operands", "baseline_units", "row_keys", "tile_span"]

_NINF = -np.inf


class Lanes(NamedTuple):
    """The lane form (see :func:`simfloat._lanes.lane`) of the baseline's scalar ops."""

    scale: Lane
    softmax: Lane
    out: Lane
    opmath: Lane  # the scale multiply before its cast (Plan.opmath; else float32, unused)


class Engine(NamedTuple):
    """Everything a baseline row needs besides its operands.

    Attributes:
        pp: the plan's :class:`~simfloat.attention.plan.PlanParams` (scalar ops, flags, scale).
        ln: :class:`Lanes`.
        qk, pv: the dots as :class:`~simfloat.accumulate._rows.MMA` records.
        bn: the K^T tile width; causal; seq_k: keys.
        no_tab: an empty ex2 table of the plans' tables' type (the baseline's exp is correctly rounded).

    ``pp``, ``ln``, ``qk`` and ``pv`` are numpy records (:func:`simfloat._jit.record_of`; ``pp`` without its
    table): numba passes each as one pointer.
    """

    pp: object  # (numpy records, see above)
    ln: object
    qk: object
    pv: object
    bn: int
    causal: bool
    seq_k: int
    no_tab: np.ndarray


class Operands(NamedTuple):
    """Operands and their alignment weights (:func:`simfloat.accumulate._rows.operand_powers`), per lead index.

    Attributes:
        q: (L, Sq, D) queries (in the qk model's input format). eq: their weights.
        kt: (L * n_tiles, D, bn) keys, transposed tile by tile (contiguous along the keys, zero-padded).
            ekt: their weights.
        v: (L, Sk, Dv) values. ev: their weights.
        kt32, ekt32, v32, ev32: ``kt``, ``v`` and their weights in the float32 forms of their dots
            (:func:`simfloat.accumulate._rows.operand32`); else one empty matrix per tile.
        mk: the call's :class:`~simfloat.attention._masks.KeyMask` (``NO_MASK``: none beyond ``causal``).
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
    mk: KeyMask = NO_MASK


# -- element-wise ops over a row segment ---------------------------------------------------------------------


# Each op over a row comes in the forms of its lane (:func:`lane_form`: float32, nearest-even lanes, lanes of the
# other modes, the scalar ops): a loop that takes the op as a kernel (the forward's Steps) is passed the one form
# its plan needs and compiles that form alone. The other loops (the baseline, the backward) call the op itself,
# which branches on the lane at run time over the same loops written out once more: numba inlining the four forms
# into it instead compiled 3 s longer for a first baseline (measured side by side).
F32, NE, LANE, SCALAR = 0, 1, 2, 3


def lane_form(lane: Any) -> int:
    """The form of the lane ``lane`` (a numpy record, :func:`simfloat._jit.record_of`): F32, NE, LANE or SCALAR,
    as the dispatchers below choose it."""
    if lane["f32"]:
        return F32
    if lane["fast"]:
        return NE if lane["mode"] == RoundingMode.NEAREST_EVEN else LANE
    return SCALAR


@kjit
def _cast_f32(x, lo, n, lane, o):
    for j in range(lo, lo + n):
        x[j] = lround_f32(x[j])


@kjit
def _cast_ne(x, lo, n, lane, o):
    r = lane_of(lane)  # (a record's fields, read once)
    for j in range(lo, lo + n):
        x[j] = lround_ne(x[j], r)


@kjit
def _cast_lane(x, lo, n, lane, o):
    r = lane_of(lane)
    for j in range(lo, lo + n):
        x[j] = lround(x[j], r)


@kjit
def _cast_scalar(x, lo, n, lane, o):
    for j in range(lo, lo + n):
        x[j] = rnd(x[j], o)


CAST_FORMS = (_cast_f32, _cast_ne, _cast_lane, _cast_scalar)


@jit
def _cast(x, lo, n, lane, o):
    """x[lo:lo+n] = op(x[lo:lo+n]) (a cast)."""
    r = lane_of(lane)  # (a record's fields, read once)
    if r.f32:
        for j in range(lo, lo + n):
            x[j] = lround_f32(x[j])
    elif r.fast and r.mode == RoundingMode.NEAREST_EVEN:
        for j in range(lo, lo + n):
            x[j] = lround_ne(x[j], r)
    elif r.fast:
        for j in range(lo, lo + n):
            x[j] = lround(x[j], r)
    else:
        for j in range(lo, lo + n):
            x[j] = rnd(x[j], o)


@kjit
def _scale_by_f32(x, n, w, lane, o):
    for j in range(n):
        x[j] = lmul_f32(x[j], w)


@kjit
def _scale_by_ne(x, n, w, lane, o):
    r = lane_of(lane)
    for j in range(n):
        x[j] = lmul_ne(x[j], w, r)


@kjit
def _scale_by_lane(x, n, w, lane, o):
    r = lane_of(lane)
    for j in range(n):
        x[j] = lmul(x[j], w, r)


@kjit
def _scale_by_scalar(x, n, w, lane, o):
    for j in range(n):
        x[j] = mul(x[j], w, o)


SCALE_BY_FORMS = (_scale_by_f32, _scale_by_ne, _scale_by_lane, _scale_by_scalar)


@jit
def _scale_by(x, n, w, lane, o):
    """x[:n] = op(x[:n] * w)."""
    r = lane_of(lane)  # (a record's fields, read once)
    if r.f32:
        for j in range(n):
            x[j] = lmul_f32(x[j], w)
    elif r.fast and r.mode == RoundingMode.NEAREST_EVEN:
        for j in range(n):
            x[j] = lmul_ne(x[j], w, r)
    elif r.fast:
        for j in range(n):
            x[j] = lmul(x[j], w, r)
    else:
        for j in range(n):
            x[j] = mul(x[j], w, o)


@kjit
def _divide_f32(x, n, d, lane, o):
    for j in range(n):
        x[j] = ldiv_f32(x[j], d)


@kjit
def _divide_ne(x, n, d, lane, o):
    r = lane_of(lane)
    for j in range(n):
        x[j] = ldiv_ne(x[j], d, r)


@kjit
def _divide_lane(x, n, d, lane, o):
    r = lane_of(lane)
    for j in range(n):
        x[j] = ldiv(x[j], d, r)


@kjit
def _divide_scalar(x, n, d, lane, o):
    for j in range(n):
        x[j] = div(x[j], d, o)


DIVIDE_FORMS = (_divide_f32, _divide_ne, _divide_lane, _divide_scalar)


@jit
def _divide(x, n, d, lane, o):
    """x[:n] = op(x[:n] / d)."""
    r = lane_of(lane)  # (a record's fields, read once)
    if r.f32:
        for j in range(n):
            x[j] = ldiv_f32(x[j], d)
    elif r.fast and r.mode == RoundingMode.NEAREST_EVEN:
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
def _exp_of(x, n, e, lane, o, tab):
    """x[:n] = op(exp2(x)) (``e``: exp2, else exp); ``tab`` non-empty: the measured ex2.approx.ftz.f32."""
    r = lane_of(lane)  # (a record's fields, read once)
    if not r.fast:
        for j in range(n):
            x[j] = (exp2_hw(x[j], o, tab) if tab.size > 0 else exp2(x[j], o)) if e else exp(x[j], o)
        return
    if e and tab.size > 0:
        for j in range(n):
            x[j] = ex2_approx_f32(x[j], tab, True)
    elif e:  # libm, unless its value is too close to a rounding boundary to decide (then correctly rounded)
        for j in range(n):
            xj = x[j]
            y = math.exp2(xj)
            x[j] = exp2(xj, o) if libm_unsure(y, r) else y
    else:
        for j in range(n):
            xj = x[j]
            y = math.exp(xj)
            x[j] = exp(xj, o) if libm_unsure(y, r) else y
    if r.f32:  # the rounding, vectorized apart from the libm calls (a value of the format rounds to itself)
        for j in range(n):
            x[j] = lround_f32(x[j])
    elif r.mode == RoundingMode.NEAREST_EVEN:
        for j in range(n):
            x[j] = lround_ne(x[j], r)
    else:
        for j in range(n):
            x[j] = lround(x[j], r)


@jit
def _seq_sum(x, n, lane, o, native32):
    """op(... op(op(x0 + x1) + x2) ...) from 0, left to right."""
    r = lane_of(lane)  # (a record's fields, read once)
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
def _row_max(x, lo, n):
    m = _NINF
    for j in range(lo, lo + n):
        m = fmax(m, x[j])
    return m


# -- flash tiles (the vector forward loop) ---------------------------------------------------------------------

KEY_CHUNK = 256  # keys per K^T tile in the baseline layout


@kjit
def _scaled_f32(x, s, nv, qs, m_sub, contract, fma_exact, lane, o):
    """:func:`_scaled` of a float32 lane (``contract``: its fused multiply-add gives the op's bits)."""
    if contract:
        for jj in range(nv):
            x[jj] = lfma_f32(s[jj], qs, -m_sub)
    else:
        for jj in range(nv):
            x[jj] = ladd_f32(lmul_f32(s[jj], qs), -m_sub)


@kjit
def _scaled_ne(x, s, nv, qs, m_sub, contract, fma_exact, lane, o):
    """:func:`_scaled` of a lane rounding to nearest-even (as :func:`_scaled_f32`)."""
    r = lane_of(lane)  # (a record's fields, read once)
    if contract:
        for jj in range(nv):
            x[jj] = lfma_ne(s[jj], qs, -m_sub, r)
    else:
        for jj in range(nv):
            x[jj] = ladd_ne(lmul_ne(s[jj], qs, r), -m_sub, r)


@kjit
def _scaled_lane(x, s, nv, qs, m_sub, contract, fma_exact, lane, o):
    """:func:`_scaled` of a lane of another rounding mode (as :func:`_scaled_f32`)."""
    r = lane_of(lane)
    if contract:
        for jj in range(nv):
            x[jj] = lfma(s[jj], qs, -m_sub, r)
    else:
        for jj in range(nv):
            x[jj] = ladd(lmul(s[jj], qs, r), -m_sub, r)


@kjit
def _scaled_scalar(x, s, nv, qs, m_sub, contract, fma_exact, lane, o):
    """:func:`_scaled` by the scalar ops: an op without a lane form, or a fused multiply-add the lanes do not give
    exactly (the same bits as the lanes where they apply)."""
    if contract:
        for jj in range(nv):
            x[jj] = fma(s[jj], qs, -m_sub, o)
    else:
        for jj in range(nv):
            x[jj] = sub(mul(s[jj], qs, o), m_sub, o)


@jit
def _scaled(x, s, nv, qs, m_sub, contract, fma_exact, lane, o):
    """T6: x[:nv] = scale(fma(s, qk_scale, -m_sub)) (or scale(scale(s * qk_scale) - m_sub))."""
    r = lane_of(lane)  # (a record's fields, read once)
    if contract:
        if fma_exact and r.f32:
            for jj in range(nv):
                x[jj] = lfma_f32(s[jj], qs, -m_sub)
        elif fma_exact and r.fast and r.mode == RoundingMode.NEAREST_EVEN:
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
    elif r.fast and r.mode == RoundingMode.NEAREST_EVEN:
        for jj in range(nv):
            x[jj] = ladd_ne(lmul_ne(s[jj], qs, r), -m_sub, r)
    elif r.fast:
        for jj in range(nv):
            x[jj] = ladd(lmul(s[jj], qs, r), -m_sub, r)
    else:
        for jj in range(nv):
            x[jj] = sub(mul(s[jj], qs, o), m_sub, o)


def scaled_form(lane: Any, contract: bool, fma_exact: bool) -> Any:
    """:func:`_scaled`'s form for a loop whose op has the lane ``lane`` (a numpy record), for a plan that fuses
    (``contract``) with or without an exact lane fma: the choice of the dispatcher, made once."""
    if contract and not fma_exact:
        return _scaled_scalar
    return SCALED_FORMS[lane_form(lane)]


SCALED_FORMS = (_scaled_f32, _scaled_ne, _scaled_lane, _scaled_scalar)


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
        k_lo, jv = visible_keys(xs.mk, eng.causal, b, i, seq_k)
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
        if pp.opmath_on:  # torch's tensor * scale: computed in the opmath type, then cast
            _scale_by(s, jv, pp.sm_scale, ln.opmath, pp.opmath)
            _cast(s, 0, jv, ln.scale, pp.scale)
        else:
            _scale_by(s, jv, pp.sm_scale, ln.scale, pp.scale)
        mk = xs.mk
        if mk.dense == DENSE_ADD:  # torch's scores + attn_mask (in the opmath type, then cast)
            for j in range(jv):
                bv = mk.bias[mk.bmap[b], i, j]
                s[j] = rnd(add(s[j], bv, pp.opmath), pp.scale) if pp.opmath_on else add(s[j], bv, pp.scale)
        _cast(s, 0, jv, ln.softmax, pp.softmax)
        if mk.on:  # masked keys: -inf
            for j in range(jv):
                if key_masked(mk, b, i, j, k_lo):
                    s[j] = _NINF
        m = _row_max(s, 0, jv)
        # softmax(s - m), one rounding; `no` a runtime False, not the literal: the helpers compile once, as flash's
        _scaled(s, s, jv, 1.0, m, no, no, ln.softmax, pp.softmax)
        _exp_of(s, jv, no, ln.softmax, pp.softmax, eng.no_tab)
        if mk.on:  # masked keys: P = 0
            for j in range(jv):
                if key_masked(mk, b, i, j, k_lo):
                    s[j] = 0.0
        tot = _seq_sum(s, jv, ln.softmax, pp.softmax, False)
        _divide(s, jv, 1.0 if tot == 0.0 else tot, ln.softmax, pp.softmax)
        for j in range(jv, seq_k):
            s[j] = 0.0
        src = s[:seq_k]
        if eng.pv.in_round:
            inp = lane_of(eng.pv.inp)  # (a record's lane, read once)
            for j in range(seq_k):
                pin[j] = lround(s[j], inp)
            src = pin
        if eng.pv.align_sum:
            _weights_of(src, ep, seq_k, eng.pv.opnd_emin)
        o = out[b, i]
        for d in range(dv):
            o[d] = 0.0
        row_mma(src, ep, xs.v[b], xs.ev[b], xs.v32[b], xs.ev32[b], o, dv, eng.pv, w)
        _cast(o, 0, dv, ln.out, pp.out)
