"""njit pieces of the quantized (INT8 / FP8 / FP4) flash attention emulator (:mod:`simfloat.attention.quantized`):
the quantizers and the fast dots, shared by the reference loop (:mod:`simfloat.attention.reference.forward`) and
the vector one (:mod:`simfloat.attention.vector.forward`).

Three parts:

* fast dot products: exact integer dots (``qk``/``pv`` on INT8 codes), a plain float64 loop (fp64 plans) and a
  specialization of :class:`~simfloat.accumulate.BlockFMA` for operands whose products are exact in float64
  (every 8/16-bit format). Each returns bit for bit what :func:`simfloat.accumulate.dot_acc` returns for the
  same model; anything else goes to ``dot_acc`` itself.
* the element-wise quantizer (:func:`quant_elems`) and the fixed-scale P quantizer (:func:`p_quant`).
* P's block quantizer per key tile (:func:`block_p_codes`), the dots on block-scaled codes (:func:`sdot`) and
  their exact values for traces (:func:`sdot64`, :func:`p_value`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from simfloat._jit import bits_f64, f64_bits, jit
from simfloat.accumulate.models import AccParams
from simfloat.accumulate.scalar import accumulate_range, dot_acc, dot_scaled_acc, exponent_of, product_exponent
from simfloat.attention._kernels import add, div, dot64, fma, mul, rnd
from simfloat.attention._specs import OpParams
from simfloat.rounding import round_scalar

__all__ = [
    "QUANT_OPS",
    "QParams",
    "block_p_codes",
    "dot3",
    "fixed_codes",
    "p_quant",
    "quant_elems",
    "p_value",
    "scales_from_amax",
    "sdot",
    "sdot64",
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
# op indices (positions in QUANT_OPS: each constant is its op's name in capitals), looked up by name
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
        return exponent_of(x)
    return e - 1023


@jit
def _block3(A, a0, a1, B, b0, b1, c, ap):
    """The BlockFMA model of :mod:`simfloat.accumulate` (unchunked, no input format) on the exact float64
    products, without its per-product ldexp; non-finite values and extreme exponents continue in the
    generic code from the current block."""
    n = A.shape[2]
    lo = np.int64(0)  # not the literal 0: numba would compile accumulate_range for it too
    while lo < n:
        hi = min(n, lo + ap.block)
        if c - c != 0.0:
            return accumulate_range(A[a0, a1], B[b0, b1], c, lo, n, ap)
        emax = np.int64(-100000)
        if c != 0.0:
            emax = _expo(c)
        for k in range(lo, hi):
            ak = A[a0, a1, k]
            bk = B[b0, b1, k]
            pk = ak * bk
            if pk - pk != 0.0:
                return accumulate_range(A[a0, a1], B[b0, b1], c, lo, n, ap)
            if pk != 0.0:
                e = product_exponent(ak, bk, pk, ap) if ap.align_sum else _expo(pk)
                if e > emax:
                    emax = e
        if emax == -100000:
            c = round_scalar(c + 0.0, ap.acc_p, ap.acc_mode, _Z)
        else:
            q = emax - ap.frac_bits
            if q - 60 < -1000 or q > 1000:
                return accumulate_range(A[a0, a1], B[b0, b1], c, lo, n, ap)
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
def sdot(A, a0, a1, SA, B, b0, b1, SB, c, ap, kind):
    """:func:`dot3`, or for DOT_SCALED the block-scaled model on codes ``A``/``B`` with per-element scales
    ``SA``/``SB`` (indexed as the codes)."""
    if kind == DOT_SCALED:
        return dot_scaled_acc(A[a0, a1], B[b0, b1], SA[a0, a1], SB[b0, b1], c, ap)
    return dot3(A, a0, a1, B, b0, b1, c, ap, kind)


@jit
def sdot64(A, a0, a1, SA, B, b0, b1, SB, scaled):
    """The exact (float64) value of a dot for traces: with block scales where ``scaled``."""
    if not scaled:
        return dot64(A[a0, a1], B[b0, b1], 0.0)
    t = 0.0
    for k in range(A.shape[2]):
        t += (A[a0, a1, k] * SA[a0, a1, k]) * (B[b0, b1, k] * SB[b0, b1, k])
    return t


@jit
def p_value(c, pp):
    """The value a P code stands for (float64, for traces)."""
    return c / pp.p_qmax if pp.p_kind == K_INT or pp.p_kind == K_FFLOAT else c
