"""njit kernels of the quantized (INT8 / FP8) flash attention emulator (:mod:`simfloat.attention.quantized`):
the quantizers, and the scalar reference engine (``engine="reference"``: the test oracle of the vectorized
:mod:`simfloat.attention._quant_engine`, and the kernel traces are recorded in).

Three parts:

* fast dot products: exact integer dots (``qk``/``pv`` on INT8 codes), a plain float64 loop (fp64 plans) and a
  specialization of :class:`~simfloat.accumulate.BlockFMA` for operands whose products are exact in float64
  (every 8/16-bit format). Each returns bit for bit what :func:`simfloat.accumulate.dot_acc` returns for the
  same model; anything else goes to ``dot_acc`` itself.
* the element-wise quantizer (:func:`quant_elems`) and the fixed-scale P quantizer (:func:`p_quant`).
* the per-row flash loop (:func:`units`), op for op as ``simfloat_gpu/kernels/int8_attention.py`` /
``simfloat_gpu/kernels/fp8_attention.py``
  document it (see :mod:`simfloat.attention.quantized` for the step list), with optional tracing.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from simfloat._jit import bits_f64, f64_bits, fma64, jit
from simfloat.accumulate.models import AccParams
from simfloat.accumulate.scalar import _accumulate, _exponent, dot_acc, dot_scaled_acc, product_exponent
from simfloat.attention._kernels import add, div, dot64, exp, exp2, fma, fmax, mul, rnd, sub
from simfloat.attention._specs import OpParams
from simfloat.rounding import round_scalar
from simfloat.trace import STATES, record

__all__ = [
    "QUANT_OPS",
    "QParams",
    "block_p_codes",
    "dot3",
    "fixed_codes",
    "p_quant",
    "quant_elems",
    "scales_from_amax",
    "units",
]

_NINF = -np.inf
_Z = np.uint64(0)

#: Ops of a :class:`~simfloat.attention.Plan` with quantizers, in kernel order (the tracer's op names; defined here,
#: beside the kernels that index by them, and re-exported by quant_plan).
QUANT_OPS = (
    "rotate",
    "k_smooth",
    "q_smooth",
    "q_delta",
    "q_quant",
    "k_quant",
    "v_quant",
    "qk",
    "dequant",
    "scale",
    "exp",
    "m_i",
    "alpha",
    "l_i",
    "acc",
    "p_quant",
    "pv",
    "pv_dequant",
    "normalize",
    "out",
)
# op indices (positions in QUANT_OPS: each constant is its op's name in capitals) and state indices (in
# simfloat.trace.STATES), looked up by name
(
    ROTATE,
    K_SMOOTH,
    Q_SMOOTH,
    Q_DELTA,
    Q_QUANT,
    K_QUANT,
    V_QUANT,
    QK,
    DEQUANT,
    SCALE,
    EXP,
    M_I,
    ALPHA,
    L_I,
    ACC,
    P_QUANT,
    PV,
    PV_DEQUANT,
    NORMALIZE,
    OUT,
) = (
    QUANT_OPS.index(n)
    for n in (
        "rotate",
        "k_smooth",
        "q_smooth",
        "q_delta",
        "q_quant",
        "k_quant",
        "v_quant",
        "qk",
        "dequant",
        "scale",
        "exp",
        "m_i",
        "alpha",
        "l_i",
        "acc",
        "p_quant",
        "pv",
        "pv_dequant",
        "normalize",
        "out",
    )
)
S_M, S_L, S_ACC, S_OUT = (STATES.index(n) for n in ("m_i", "l_i", "acc", "out"))

# dot kinds (DOT_SCALED: a block-scaled MMA model on codes and per-element block scales)
DOT_INT, DOT_BLOCK, DOT_GENERIC, DOT_F64, DOT_SCALED = range(5)
# quantizer kinds / code rounding rules / pv update modes
# K_FFLOAT: float codes with a fixed scale 1/qmax; K_BLOCK: block-scaled codes (NVFP4/MX), optionally after a
# per-row first-level scale (SageAttention3's two-level P)
K_NONE, K_INT, K_FLOAT, K_FFLOAT, K_BLOCK = range(5)
R_NEAREST_EVEN, R_NEAREST_AWAY, R_TOWARD_ZERO, R_HALF_UP, R_HALF_UP_UNFUSED = range(5)
PV_SEPARATE, PV_INTO_ACC, PV_SCALED, PV_TWO_LEVEL = range(4)
# where Q smoothing's correction delta_s enters the scores: none, the qk MMA's initial accumulator, or added to
# the dequantized score (in the dequant op's format)
DELTA_NONE, DELTA_MMA, DELTA_SCORES = range(3)


class QParams(NamedTuple):
    """A :class:`~simfloat.attention.Plan` with quantizers flattened for njit code, with the call's scale."""

    qk: AccParams
    pv: AccParams
    qk_kind: int
    pv_kind: int
    dequant: OpParams
    scale: OpParams
    exp: OpParams
    m_i: OpParams
    alpha: OpParams
    l_i: OpParams
    acc: OpParams
    pv_dequant: OpParams
    normalize: OpParams
    out: OpParams
    p_kind: int  # K_NONE, K_INT (fixed scale 1/p_qmax), K_FLOAT (cast), K_FFLOAT (float codes, scale 1/p_qmax)
    p_pre: bool
    p_pre_op: OpParams
    p_arith: OpParams
    p_code: OpParams  # float kind: the code format and its rounding
    p_qmax: float
    p_rule: int
    exp2: bool
    contract: bool
    consistent: bool
    folded: bool
    pv_mode: int
    qk_scale: float
    qk_scale64: float
    p_two_level: bool  # K_BLOCK: a per-row first-level scale arith(rowmax / p_qmax) before the blocks
    p_block: int  # K_BLOCK: keys per block scale
    p_scale_op: OpParams  # K_BLOCK: the block scale's format (saturating) and rounding
    p_elem_op: OpParams  # K_BLOCK: the element format (saturating) and rounding
    p_target: float  # K_BLOCK: the block scale is scale_op(amax / p_target)
    p_scale_zero: float  # K_BLOCK: the scale of an all-zero block (the scale format's least nonnegative value)
    delta_mode: int  # DELTA_NONE, DELTA_MMA, DELTA_SCORES: Q smoothing's correction
    p_shift: float  # K_BLOCK with a fixed first level: scale(log2 qmax) taken off m in P's exponent (else 0)


# ---------------------------------------------------------------------------------------------------------
# dots
# ---------------------------------------------------------------------------------------------------------


@jit
def _pow2(k):
    """2**k for |k| <= 1000 (exact, from bits)."""
    return bits_f64(np.uint64(k + 1023) << np.uint64(52))


@jit
def _expo(x):
    """floor(log2 |x|) of a nonzero finite float64."""
    e = np.int64((f64_bits(x) >> np.uint64(52)) & np.uint64(0x7FF))
    if e == 0:
        return _exponent(x)
    return e - 1023


@jit
def _block3(A, a0, a1, B, b0, b1, c, ap):
    """The BlockFMA model of :mod:`simfloat.accumulate` (unchunked, no input format) on the exact float64
    products, without its per-product ldexp; non-finite values and extreme exponents continue in the
    generic code from the current block."""
    n = A.shape[2]
    lo = 0
    while lo < n:
        hi = min(n, lo + ap.block)
        if c - c != 0.0:
            return _accumulate(A[a0, a1], B[b0, b1], c, lo, n, ap)
        emax = np.int64(-100000)
        if c != 0.0:
            emax = _expo(c)
        for k in range(lo, hi):
            ak = A[a0, a1, k]
            bk = B[b0, b1, k]
            pk = ak * bk
            if pk - pk != 0.0:
                return _accumulate(A[a0, a1], B[b0, b1], c, lo, n, ap)
            if pk != 0.0:
                e = product_exponent(ak, bk, pk, ap) if ap.align_sum else _expo(pk)
                if e > emax:
                    emax = e
        if emax == -100000:
            c = round_scalar(c + 0.0, ap.acc_p, ap.acc_mode, _Z)
        else:
            q = emax - ap.frac_bits
            if q - 60 < -1000 or q > 1000:
                return _accumulate(A[a0, a1], B[b0, b1], c, lo, n, ap)
            inv = _pow2(-q)  # exact scaling
            total = np.int64(0)
            if c != 0.0:
                total += np.int64(c * inv)  # conversion truncates toward zero, as math.trunc
            for k in range(lo, hi):
                total += np.int64((A[a0, a1, k] * B[b0, b1, k]) * inv)
            if total == 0:
                c = 0.0
            else:
                val = np.float64(total) * _pow2(q)
                c = round_scalar(val, ap.acc_p, ap.acc_mode, _Z)
        lo = hi
    return c


@jit
def dot3(A, a0, a1, B, b0, b1, c, ap, kind):
    """``c + A[a0, a1, :] . B[b0, b1, :]`` under the model ``ap``, bit for bit as
    :func:`simfloat.accumulate.dot_acc`, by the fast path ``kind`` chosen in Python (no array views: numba's
    reference counting of views costs more than a short dot):

    * DOT_INT: integer codes (exact model): an int64 sum, exact (|sum| < 2**53);
    * DOT_F64: the float64 loop of the ``EXACT`` model;
    * DOT_BLOCK: :func:`_block3`;
    * DOT_GENERIC: ``dot_acc`` itself.
    """
    n = A.shape[2]
    if kind == DOT_INT:
        s = np.int64(0)
        for k in range(n):
            s += np.int64(A[a0, a1, k]) * np.int64(B[b0, b1, k])
        return c + np.float64(s)
    if kind == DOT_F64:
        for k in range(n):
            c = c + A[a0, a1, k] * B[b0, b1, k]
        return c
    if kind == DOT_BLOCK:
        return _block3(A, a0, a1, B, b0, b1, c, ap)
    return dot_acc(A[a0, a1], B[b0, b1], c, ap)


# ---------------------------------------------------------------------------------------------------------
# quantizers
# ---------------------------------------------------------------------------------------------------------


@jit
def _int_code(y, qmax, rule):
    if rule == R_NEAREST_EVEN:
        r = np.rint(y)
    elif rule == R_NEAREST_AWAY:
        r = math.floor(abs(y) + 0.5)
        r = r if y >= 0.0 else -r
    else:  # toward zero
        r = float(math.trunc(y))
    return min(max(r, -qmax), qmax)


@jit
def quant_elems(x, scale, codes, kind, arith, code_op, qmax, rule):
    """Codes of the flat arrays ``x`` (already cast by the quantizer's ``pre``) with per-element ``scale``:
    ``y = arith(x / scale)``; INT: ``clamp(round_rule(y), +-qmax)``; FLOAT: ``code_op(clamp(y, +-qmax))``
    (with qmax <= 0: no clamp, the cast's own overflow policy)."""
    for e in range(x.shape[0]):
        xe = x[e]
        y = div(xe, scale[e], arith)
        if kind == K_INT:
            codes[e] = _int_code(y, qmax, rule)
        else:
            if qmax > 0.0:
                y = min(max(y, -qmax), qmax)
            codes[e] = rnd(y, code_op)


@jit
def scales_from_amax(amax, out, qmax, arith):
    """``arith(amax / qmax)``, 1.0 for an all-zero group (the kernels' Q3 / F2)."""
    for g in range(amax.shape[0]):
        out[g] = 1.0 if amax[g] == 0.0 else div(amax[g], qmax, arith)


@jit
def p_quant(p, pp):
    """P's code: K_INT: ``t = pre(p)``; half_up ``trunc(arith(t * qmax + 0.5))`` (one rounding, the kernel's
    fma16), half_up_unfused ``trunc(arith(arith(t * qmax) + 0.5))``, else ``round_rule(arith(t * qmax))``;
    K_FLOAT: ``code(p)``; K_FFLOAT: ``code(clamp(arith(t * qmax), +-qmax))``; K_NONE: p."""
    if pp.p_kind == K_NONE:
        return p
    t = rnd(p, pp.p_pre_op) if pp.p_pre else p
    if pp.p_kind == K_FLOAT:
        return rnd(t, pp.p_code)
    if pp.p_kind == K_FFLOAT:
        return _float_code(t, pp.p_qmax, pp.p_arith, pp.p_code)
    if pp.p_rule == R_HALF_UP or pp.p_rule == R_HALF_UP_UNFUSED:
        if pp.p_rule == R_HALF_UP:
            y = fma(t, pp.p_qmax, 0.5, pp.p_arith)
        else:  # the reference code as written: (p * 127) + 0.5, two roundings
            y = add(mul(t, pp.p_qmax, pp.p_arith), 0.5, pp.p_arith)
        r = float(math.trunc(y))
        return min(max(r, -pp.p_qmax), pp.p_qmax)
    return _int_code(mul(t, pp.p_qmax, pp.p_arith), pp.p_qmax, pp.p_rule)


@jit
def fixed_codes(x, codes, arith, qmax, rule):
    """Fixed-scale integer codes (scale 1/qmax) of the flat array x, as :func:`p_quant` computes them."""
    for e in range(x.shape[0]):
        if rule == R_HALF_UP:
            codes[e] = min(max(float(math.trunc(fma(x[e], qmax, 0.5, arith))), -qmax), qmax)
        elif rule == R_HALF_UP_UNFUSED:
            y = add(mul(x[e], qmax, arith), 0.5, arith)
            codes[e] = min(max(float(math.trunc(y)), -qmax), qmax)
        else:
            codes[e] = _int_code(mul(x[e], qmax, arith), qmax, rule)


@jit
def _float_code(t, qmax, arith, code_op):
    """A fixed-scale float code: ``code_op(clamp(arith(t * qmax), +-qmax))``."""
    return rnd(min(max(mul(t, qmax, arith), -qmax), qmax), code_op)


@jit
def fixed_float_codes(x, codes, arith, code_op, qmax):
    """Fixed-scale float codes (scale 1/qmax) of the flat array x, as :func:`p_quant` computes them."""
    for e in range(x.shape[0]):
        codes[e] = _float_code(x[e], qmax, arith, code_op)


@jit
def block_p_codes(p, n, codes, scales, pp):
    """P's block-scaled quantizer (K_BLOCK) on ``p[:n]`` of one row's key tile; returns the first-level scale.

    Two-level (``pp.p_two_level``, SageAttention3): ``s1 = arith(max(p) / qmax)`` (1 for an all-zero row),
    ``t = arith(p / s1)``; else ``s1 = 1``, ``t = p``. Then per block of ``pp.p_block`` keys (from the tile's
    first key): ``X = scale_op(amax / target)`` (the exact quotient rounded once, saturating; an all-zero block
    gets ``p_scale_zero``) and ``code = elem_op(t / X)`` (rounded once, saturating; 0 where X is 0), as
    :func:`simfloat.quantize_block` does. Writes ``codes[:len]`` and ``scales[:len]`` (each key's block scale;
    keys n.. get code 0), so that ``p ~ codes * scales * s1``."""
    s1 = 1.0
    if pp.p_two_level:
        pmax = 0.0
        for j in range(n):
            pmax = max(pmax, abs(p[j]))
        if pmax != 0.0:
            s1 = div(pmax, pp.p_qmax, pp.p_arith)
    for j in range(n):
        codes[j] = div(p[j], s1, pp.p_arith) if pp.p_two_level else p[j]
    for j in range(n, codes.shape[0]):
        codes[j] = 0.0
    g = pp.p_block
    for lo in range(0, codes.shape[0], g):
        hi = min(codes.shape[0], lo + g)
        amax = 0.0
        for j in range(lo, hi):
            amax = max(amax, abs(codes[j]))
        x = pp.p_scale_zero if amax == 0.0 else div(amax, pp.p_target, pp.p_scale_op)
        for j in range(lo, hi):
            scales[j] = x
            codes[j] = div(codes[j], x, pp.p_elem_op) if x > 0.0 else 0.0
    return s1


@jit
def _dot(A, a0, a1, SA, B, b0, b1, SB, c, ap, kind):
    """:func:`dot3`, or for DOT_SCALED the block-scaled model on codes ``A``/``B`` with per-element scales
    ``SA``/``SB`` (indexed as the codes)."""
    if kind == DOT_SCALED:
        return dot_scaled_acc(A[a0, a1], B[b0, b1], SA[a0, a1], SB[b0, b1], c, ap)
    return dot3(A, a0, a1, B, b0, b1, c, ap, kind)


@jit
def _sdot64(A, a0, a1, SA, B, b0, b1, SB, scaled):
    """The exact (float64) value of a dot for traces: with block scales where ``scaled``."""
    if not scaled:
        return dot64(A[a0, a1], B[b0, b1], 0.0)
    t = 0.0
    for k in range(A.shape[2]):
        t += (A[a0, a1, k] * SA[a0, a1, k]) * (B[b0, b1, k] * SB[b0, b1, k])
    return t


@jit
def _p_value(c, pp):
    """The value a P code stands for (float64, for traces)."""
    return c / pp.p_qmax if pp.p_kind == K_INT or pp.p_kind == K_FFLOAT else c


# ---------------------------------------------------------------------------------------------------------
# the flash loop
# ---------------------------------------------------------------------------------------------------------


@jit
def _ex(x, pp):
    return math.exp2(x) if pp.exp2 else math.exp(x)


@jit
def _shadow(b, t, jt, j0, nv, bn, m_lp, l_lp, acc_lp, vs_fin, ms, ls, accs, q64, k64, v64, i, pp, tr, ps):
    """One key tile of the float64 shadow on the unquantized inputs (exact softmax scale), then the drift of
    the emulated state (m in the kernel's units, l and acc relative to each run's own running max)."""
    smax = _NINF
    for jj in range(nv):
        ps[jj] = dot64(q64[b, i], k64[b, j0 + jj], 0.0) * pp.qk_scale64
        smax = fmax(smax, ps[jj])
    m_new = fmax(ms, smax)
    m_sub = 0.0 if m_new == _NINF else m_new
    lij = 0.0
    for jj in range(nv):
        ps[jj] = _ex(ps[jj] - m_sub, pp)
        lij += ps[jj]
    alpha = 0.0 if ms == _NINF else _ex(ms - m_sub, pp)
    l_new = ls * alpha + lij
    for d in range(accs.shape[0]):
        a = accs[d] * alpha
        for jj in range(nv):
            a += ps[jj] * v64[b, j0 + jj, d]
        accs[d] = a
        record(tr[1], b, t, jt, S_ACC, acc_lp[d] * vs_fin[d] - a, a)
    if m_new != _NINF:
        record(tr[1], b, t, jt, S_M, m_lp - m_new, m_new)
    record(tr[1], b, t, jt, S_L, l_lp - l_new, l_new)
    return m_new, l_new


@jit
def _tile(b, t, i, jt, m_i, l_i, qss, acc, s, p, pc, pc3, psc, psc3, qc, qs, qb, kc, ks, kb, vt, vs, vb, ds, pp,
          causal, seq_k, tr):  # fmt: skip
    """One key tile for row i (steps T1..T20 / T1..T12 of the Triton kernels); returns (m_i, l_i, number of
    visible keys, first key). ``vt`` is (lead * n_kv_tiles, head_dim, block_n): V's codes, tile-transposed;
    ``pc3`` is ``pc`` as (1, 1, block_n). ``qb``, ``kb``, ``vb`` (laid out as ``qc``, ``kc``, ``vt``) and
    ``psc`` (``psc3``) are the per-element block scales of block-scaled dots (DOT_SCALED). ``ds`` is
    (lead, n_q_tiles, n_kv_tiles * block_n): Q smoothing's correction delta_s per q tile and key."""
    bn = s.shape[0]
    vrow = b * ((seq_k + bn - 1) // bn) + jt
    j0 = jt * bn
    jv = min(j0 + bn, seq_k)
    if causal:
        jv = min(jv, i + 1)
    nv = max(0, jv - j0)
    sscale = qss
    if pp.folded:  # FP8 T2: s_scale = qs_scale * k_scale (per key tile)
        sscale = mul(qss, ks[b, j0], pp.scale)
        if tr is not None:
            record(tr[0], b, t, jt, SCALE, sscale - qss * ks[b, j0], qss * ks[b, j0])
    smax = _NINF
    for jj in range(nv):  # scores (INT8 T2..T5 / FP8 T3)
        c0 = ds[b, t, j0 + jj] if pp.delta_mode == DELTA_MMA else 0.0  # SageAttention3: delta_s into the MMA
        x = _dot(qc, b, i, qb, kc, b, j0 + jj, kb, c0, pp.qk, pp.qk_kind)
        if tr is not None:
            ex = c0 + _sdot64(qc, b, i, qb, kc, b, j0 + jj, kb, pp.qk_kind == DOT_SCALED)
            record(tr[0], b, t, jt, QK, x - ex, ex)
        if not pp.folded:
            y = mul(x, qs[b, i], pp.dequant)
            z = mul(y, ks[b, j0 + jj], pp.dequant)
            if tr is not None:
                record(tr[0], b, t, jt, DEQUANT, y - x * qs[b, i], x * qs[b, i])
                record(tr[0], b, t, jt, DEQUANT, z - y * ks[b, j0 + jj], y * ks[b, j0 + jj])
            x = z
            if pp.delta_mode == DELTA_SCORES:  # Q smoothing's correction on the dequantized score
                y = add(x, ds[b, t, j0 + jj], pp.dequant)
                if tr is not None:
                    record(tr[0], b, t, jt, DEQUANT, y - (x + ds[b, t, j0 + jj]), x + ds[b, t, j0 + jj])
                x = y
        s[jj] = x
        smax = fmax(smax, x)
    m_new = m_i  # T7 / T5
    if smax != _NINF:
        mx = mul(smax, sscale, pp.scale)
        if tr is not None:
            record(tr[0], b, t, jt, SCALE, mx - smax * sscale, smax * sscale)
        m_new = fmax(m_i, mx)
        if m_new != m_i:
            y = rnd(m_new, pp.m_i)
            if tr is not None:
                record(tr[0], b, t, jt, M_I, y - m_new, m_new)
            m_new = y
    m_sub = 0.0 if m_new == _NINF else m_new
    m_x = m_sub  # the shift in P's exponent
    if pp.p_shift != 0.0:  # SageAttention3's kernel: P scaled onto [0, qmax] by the shift, t = qmax * p
        m_x = sub(m_sub, pp.p_shift, pp.scale)
        if tr is not None:
            record(tr[0], b, t, jt, SCALE, m_x - (m_sub - pp.p_shift), m_sub - pp.p_shift)
    for jj in range(nv):  # T9, T10 / T7, T8
        sj = s[jj]
        if pp.contract:
            x = fma(sj, sscale, -m_x, pp.scale)
            if tr is not None:
                ex = fma64(sj, sscale, -m_x)
                record(tr[0], b, t, jt, SCALE, x - ex, ex)
        else:
            y = mul(sj, sscale, pp.scale)
            x = sub(y, m_x, pp.scale)
            if tr is not None:
                record(tr[0], b, t, jt, SCALE, y - sj * sscale, sj * sscale)
                record(tr[0], b, t, jt, SCALE, x - (y - m_x), y - m_x)
        pj = exp2(x, pp.exp) if pp.exp2 else exp(x, pp.exp)
        if tr is not None:
            ex = _ex(x, pp)
            record(tr[0], b, t, jt, EXP, pj - ex, ex)
        p[jj] = pj
    alpha = 0.0  # T11 / T9
    if m_i != _NINF:
        dm = sub(m_i, m_sub, pp.alpha)
        alpha = exp2(dm, pp.alpha) if pp.exp2 else exp(dm, pp.alpha)
        if tr is not None:
            record(tr[0], b, t, jt, ALPHA, dm - (m_i - m_sub), m_i - m_sub)
            record(tr[0], b, t, jt, ALPHA, alpha - _ex(dm, pp), _ex(dm, pp))
    s1 = 1.0  # P's first-level (per-row) scale of a two-level block quantizer
    if pp.p_kind == K_BLOCK:
        s1 = block_p_codes(p, nv, pc, psc, pp)
        if pp.pv_kind != DOT_SCALED:  # a dot without block scales takes the values (exact products)
            for jj in range(bn):
                pc[jj] = pc[jj] * psc[jj]
                psc[jj] = 1.0
        if tr is not None:
            for jj in range(nv):
                record(tr[0], b, t, jt, P_QUANT, pc[jj] * psc[jj] * s1 - p[jj], p[jj])
    else:
        for jj in range(nv):  # P quantization (INT8 T12..T14 / FP8 T10)
            c = p_quant(p[jj], pp)
            pc[jj] = c
            if tr is not None:
                record(tr[0], b, t, jt, P_QUANT, _p_value(c, pp) - p[jj], p[jj])
        for jj in range(nv, bn):
            pc[jj] = 0.0
    l_ij = 0.0  # T15
    if pp.consistent and pp.p_kind == K_INT:
        isum = 0.0
        for jj in range(nv):
            isum += pc[jj]  # exact: integers < 2**53
        l_ij = div(isum, pp.p_qmax, pp.l_i)
        if tr is not None:
            record(tr[0], b, t, jt, L_I, l_ij - isum / pp.p_qmax, isum / pp.p_qmax)
    else:
        src = pc if pp.consistent else p
        for jj in range(nv):
            y = add(l_ij, src[jj], pp.l_i)
            if tr is not None:
                record(tr[0], b, t, jt, L_I, y - (l_ij + src[jj]), l_ij + src[jj])
            l_ij = y
    if pp.contract:  # T16
        l_new = fma(l_i, alpha, l_ij, pp.l_i)
        if tr is not None:
            ex = fma64(l_i, alpha, l_ij)
            record(tr[0], b, t, jt, L_I, l_new - ex, ex)
    else:
        y = mul(l_i, alpha, pp.l_i)
        l_new = add(y, l_ij, pp.l_i)
        if tr is not None:
            record(tr[0], b, t, jt, L_I, y - l_i * alpha, l_i * alpha)
            record(tr[0], b, t, jt, L_I, l_new - (y + l_ij), y + l_ij)
    for d in range(acc.shape[0]):  # INT8 T17..T19 / half-INT8 T17, T18 / FP8 T9, T11
        if pp.pv_mode == PV_TWO_LEVEL:  # a fresh P.V per key tile, added to the fp32 accumulator
            pv = _dot(pc3, 0, 0, psc3, vt, vrow, d, vb, 0.0, pp.pv, pp.pv_kind)
            if tr is not None:
                ex = _sdot64(pc3, 0, 0, psc3, vt, vrow, d, vb, pp.pv_kind == DOT_SCALED)
                record(tr[0], b, t, jt, PV, pv - ex, ex)
            if pp.p_kind == K_BLOCK and pp.p_two_level:  # SageAttention3: P's per-row scale folded back
                y = mul(pv, s1, pp.pv_dequant)
                if tr is not None:
                    record(tr[0], b, t, jt, PV_DEQUANT, y - pv * s1, pv * s1)
                pv = y
            if pp.contract:
                a = fma(acc[d], alpha, pv, pp.acc)
                if tr is not None:
                    ex = fma64(acc[d], alpha, pv)
                    record(tr[0], b, t, jt, ACC, a - ex, ex)
            else:
                a0 = mul(acc[d], alpha, pp.acc)
                a = add(a0, pv, pp.acc)
                if tr is not None:
                    record(tr[0], b, t, jt, ACC, a0 - acc[d] * alpha, acc[d] * alpha)
                    record(tr[0], b, t, jt, ACC, a - (a0 + pv), a0 + pv)
            acc[d] = a
        elif pp.pv_mode == PV_SEPARATE:
            pv = dot3(pc3, 0, 0, vt, vrow, d, 0.0, pp.pv, pp.pv_kind)
            y = mul(pv, vs[b, jt, d], pp.pv_dequant)
            if tr is not None:
                ex = dot64(pc, vt[vrow, d], 0.0)
                record(tr[0], b, t, jt, PV, pv - ex, ex)
                record(tr[0], b, t, jt, PV_DEQUANT, y - pv * vs[b, jt, d], pv * vs[b, jt, d])
            if pp.p_kind == K_INT or pp.p_kind == K_FFLOAT:
                z = div(y, pp.p_qmax, pp.pv_dequant)
                if tr is not None:
                    record(tr[0], b, t, jt, PV_DEQUANT, z - y / pp.p_qmax, y / pp.p_qmax)
                y = z
            if pp.contract:
                a = fma(acc[d], alpha, y, pp.acc)
                if tr is not None:
                    ex = fma64(acc[d], alpha, y)
                    record(tr[0], b, t, jt, ACC, a - ex, ex)
            else:
                a0 = mul(acc[d], alpha, pp.acc)
                a = add(a0, y, pp.acc)
                if tr is not None:
                    record(tr[0], b, t, jt, ACC, a0 - acc[d] * alpha, acc[d] * alpha)
                    record(tr[0], b, t, jt, ACC, a - (a0 + y), a0 + y)
            acc[d] = a
        else:
            a0 = mul(acc[d], alpha, pp.acc)
            if tr is not None:
                record(tr[0], b, t, jt, ACC, a0 - acc[d] * alpha, acc[d] * alpha)
            if pp.pv_mode == PV_INTO_ACC:
                a = dot3(pc3, 0, 0, vt, vrow, d, a0, pp.pv, pp.pv_kind)
                if tr is not None:
                    ex = dot64(pc, vt[vrow, d], a0)
                    record(tr[0], b, t, jt, PV, a - ex, ex)
            else:
                pv = dot3(pc3, 0, 0, vt, vrow, d, 0.0, pp.pv, pp.pv_kind)
                a = fma(pv, vs[b, jt, d], a0, pp.pv_dequant)
                if tr is not None:
                    ex = dot64(pc, vt[vrow, d], 0.0)
                    record(tr[0], b, t, jt, PV, pv - ex, ex)
                    ex = fma64(pv, vs[b, jt, d], a0)
                    record(tr[0], b, t, jt, PV_DEQUANT, a - ex, ex)
            acc[d] = a
    return m_new, l_new, nv, j0


@jit
def units(lo, hi, qc, qs, qb, kc, ks, kb, vt, vs, vb, ds, out, m_out, l_out, pp, geo, tr, q64, k64, v64):
    """Work units ``[lo, hi)``: unit u is (lead index u // n_q_tiles, q tile u % n_q_tiles). ``qb``, ``kb``,
    ``vb``: block scales of block-scaled dots; ``ds``: Q smoothing's correction (see :func:`_tile`; unused
    otherwise)."""
    bm, bn, causal, seq_k = geo
    seq_q, dv = qc.shape[1], vt.shape[1]
    n_qt = (seq_q + bm - 1) // bm
    n_kv_all = (seq_k + bn - 1) // bn
    s, p, pc, ps, psc = np.empty(bn), np.empty(bn), np.empty(bn), np.empty(bn), np.ones(bn)
    pc3 = pc.reshape((1, 1, bn))
    psc3 = psc.reshape((1, 1, bn))
    acc, accs, vs_fin = np.empty(dv), np.empty(dv), np.ones(dv)
    for u in range(lo, hi):
        b = u // n_qt
        t = u - b * n_qt
        kv_hi = min((t + 1) * bm, seq_k) if causal else seq_k
        n_kv = (kv_hi + bn - 1) // bn
        epi = pp.pv_mode == PV_INTO_ACC or pp.pv_mode == PV_TWO_LEVEL  # scales applied once, at the end
        p_fixed = pp.p_kind == K_INT or pp.p_kind == K_FFLOAT
        l_unit = pp.p_qmax if pp.p_shift != 0.0 else 1.0  # a fixed P shift scales l and acc by qmax (for traces)
        if epi:
            for d in range(dv):
                vs_fin[d] = vs[b, 0, d] / pp.p_qmax if p_fixed or pp.p_shift != 0.0 else vs[b, 0, d]
        for i in range(t * bm, min(seq_q, (t + 1) * bm)):
            qss = pp.qk_scale
            if pp.folded:  # FP8 K2: qs_scale = qk_scale * q_scale (per q tile)
                qss = mul(pp.qk_scale, qs[b, i], pp.scale)
                if tr is not None:
                    record(tr[0], b, t, 0, SCALE, qss - pp.qk_scale * qs[b, i], pp.qk_scale * qs[b, i])
            m_i, l_i, ms, ls = _NINF, 0.0, _NINF, 0.0
            acc[:] = 0.0
            accs[:] = 0.0
            for jt in range(n_kv):
                m_i, l_i, nv, j0 = _tile(
                    b, t, i, jt, m_i, l_i, qss, acc, s, p, pc, pc3, psc, psc3, qc, qs, qb, kc, ks, kb, vt, vs, vb, ds,
                    pp, causal, seq_k, tr,
                )  # fmt: skip
                if tr is not None:
                    ms, ls = _shadow(
                        b, t, jt, j0, nv, bn, m_i, l_i / l_unit, acc, vs_fin, ms, ls, accs, q64, k64, v64, i, pp, tr,
                        ps,
                    )  # fmt: skip
            l_div = 1.0 if l_i == 0.0 else l_i  # E1, E2
            ls_div = 1.0 if ls == 0.0 else ls
            for d in range(dv):
                a = acc[d]
                if epi:  # FP8 per-tensor E1 / two-level: V's descale once (then P's fixed scale)
                    y = mul(a, vs[b, 0, d], pp.pv_dequant)
                    if tr is not None:
                        record(tr[0], b, t, n_kv_all, PV_DEQUANT, y - a * vs[b, 0, d], a * vs[b, 0, d])
                    a = y
                    if p_fixed:
                        y = div(a, pp.p_qmax, pp.pv_dequant)
                        if tr is not None:
                            record(tr[0], b, t, n_kv_all, PV_DEQUANT, y - a / pp.p_qmax, a / pp.p_qmax)
                        a = y
                o = div(a, l_div, pp.normalize)
                y = rnd(o, pp.out)
                out[b, i, d] = y
                if tr is not None:
                    record(tr[0], b, t, n_kv_all, NORMALIZE, o - a / l_div, a / l_div)
                    record(tr[0], b, t, n_kv_all, OUT, y - o, o)
                    os = accs[d] / ls_div
                    record(tr[1], b, t, n_kv_all, S_OUT, y - os, os)
            m_out[b, i] = m_i
            l_out[b, i] = l_i
