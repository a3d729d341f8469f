"""The scalar dot products of every accumulation model: one output at a time, one rounding at a time.

Each IEEE step (a fused or a rounded multiply-add, a chunk added to the outer sum) is the arithmetic floor's
(:mod:`simfloat.ops._scalar`); the tensor-core block steps align and truncate as the hardware does.

:func:`dot_acc` (and :func:`dot_scaled_acc` for block-scaled MMAs) is the reference every vector row kernel
(:mod:`simfloat.accumulate._rows`) is tested against bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

from simfloat._jit import f64_bits, jit
from simfloat.accumulate.models import ZERO_U64, AccParams
from simfloat.ops._scalar import add_scalar, fma_scalar
from simfloat.rounding import round_scalar

__all__ = ["dot_acc", "dot_scaled_acc"]


@jit
def _two_sum(a: float, b: float) -> tuple[float, float]:
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@jit
def _opnd(x: float, ap: AccParams) -> float:
    """An operand as the tensor core sees it (rounded into the input format if the model has one)."""
    if ap.round_inputs:
        return round_scalar(x, ap.in_p, ap.in_mode, ZERO_U64)
    return x


@jit
def exponent_of(x: float) -> np.int64:
    """floor(log2 |x|) of a nonzero finite float64 (subnormals included)."""
    b = f64_bits(abs(x))
    expo = np.int64(b >> np.uint64(52))
    if expo == 0:  # subnormal: position of the leading one
        frac = b
        k = np.int64(0)
        while frac > np.uint64(1):
            frac >>= np.uint64(1)
            k += 1
        return k - 1074
    return expo - 1023


@jit
def product_exponent(a, b, p, ap):
    """The exponent a nonzero product is aligned by: its own, or the sum of its operands' exponents (each at
    least ``opnd_emin``), as the tensor core's multiplier delivers it before normalization."""
    if ap.align_sum:
        return max(exponent_of(a), ap.opnd_emin) + max(exponent_of(b), ap.opnd_emin_b)
    return exponent_of(p)


@jit
def _round_sum(v, ap):
    """A block's exact nonzero sum ``v`` rounded into the accumulator format, with the model's overflow
    (``ovf_lim``: +-inf from that magnitude on) and zero-sign (``pos_zero``: +0.0 for a sum that rounds to
    zero) rules."""
    if abs(v) >= ap.ovf_lim:
        return math.copysign(np.inf, v)
    r = round_scalar(v, ap.acc_p, ap.acc_mode, ZERO_U64)
    if ap.pos_zero and r == 0.0:
        return 0.0
    return r


@jit
def _block_step(c, a, b, lo, hi, ap):
    """One tensor-core step: c and the exact products a[k]*b[k], k in [lo, hi), aligned to the largest exponent,
    truncated to F fraction bits, summed exactly, normalized and rounded once into the accumulator format."""
    special = c - c != 0.0
    emax = np.int64(-100000)
    if c != 0.0 and not special:
        emax = max(exponent_of(c), ap.acc_emin)
    elif c == 0.0:
        emax = np.int64(ap.zero_exp)
    for k in range(lo, hi):
        ak = _opnd(a[k], ap)
        bk = _opnd(b[k], ap)
        pk = ak * bk
        if pk - pk != 0.0:
            special = True
        elif pk != 0.0:
            emax = max(emax, product_exponent(ak, bk, pk, ap))
    if special:  # inf/nan anywhere: the hardware propagates like IEEE
        s = c
        for k in range(lo, hi):
            s += _opnd(a[k], ap) * _opnd(b[k], ap)
        return round_scalar(s, ap.acc_p, ap.acc_mode, ZERO_U64)
    if emax == -100000:
        return round_scalar(c + 0.0, ap.acc_p, ap.acc_mode, ZERO_U64)  # all zero: +0 unless c is -0 alone
    q = emax - ap.frac_bits  # weight of the last kept bit
    total = np.int64(0)
    # Each term becomes a signed integer multiple of 2**q, truncated toward zero (|term| / 2**q < 2**(F+2)).
    # Scaling by a power of two is exact; the products are exact (low-precision operands).
    if c != 0.0:
        total += np.int64(math.trunc(math.ldexp(c, -q)))
    for k in range(lo, hi):
        pk = _opnd(a[k], ap) * _opnd(b[k], ap)
        if pk != 0.0:
            total += np.int64(math.trunc(math.ldexp(pk, -q)))
    if total == 0:
        return 0.0
    # |total| < (block+1) * 2**(F+2) <= 2**53 for the presets: exact as float64, then one rounding.
    return _round_sum(math.ldexp(np.float64(total), q), ap)


@jit
def _scale_exp(x, emin):
    return max(exponent_of(x), emin)


@jit
def _scaled_block_step(c, a, b, sa, sb, lo, hi, ap):
    """One step of a block-scaled kind: the terms are the products a[k]*b[k]*sa[k]*sb[k] (or, with groups, the
    exact sum of each group of ``ap.group`` products times its scales), each aligned by its operands' and
    scales' exponent sum (or by its scales' alone), truncated to F bits below the largest, summed exactly with
    the accumulator and rounded once, as :func:`_block_step` does."""
    special = c - c != 0.0
    emax = np.int64(-100000)
    if c != 0.0 and not special:
        emax = max(exponent_of(c), ap.acc_emin)
    elif c == 0.0:
        emax = np.int64(ap.zero_exp)
    g = ap.group
    for k0 in range(lo, hi, g):
        for k in range(k0, min(hi, k0 + g)):
            s = sa[k] * sb[k]
            pk = a[k] * b[k] * s
            if pk - pk != 0.0 or s != s:
                special = True
            elif pk != 0.0:
                w = _scale_exp(sa[k], ap.scale_emin) + _scale_exp(sb[k], ap.scale_emin)
                if not ap.align_scale:
                    w += max(exponent_of(a[k]), ap.opnd_emin) + max(exponent_of(b[k]), ap.opnd_emin_b)
                emax = max(emax, w)
    if special:  # inf/nan anywhere (a NaN scale included): IEEE propagation
        t = c
        for k in range(lo, hi):
            t += a[k] * b[k] * (sa[k] * sb[k])
        return round_scalar(t, ap.acc_p, ap.acc_mode, ZERO_U64)
    if emax == -100000:
        return round_scalar(c + 0.0, ap.acc_p, ap.acc_mode, ZERO_U64)
    q = emax - ap.frac_bits
    total = np.int64(0)
    if c != 0.0:
        total += np.int64(math.trunc(math.ldexp(c, -q)))
    for k0 in range(lo, hi, g):
        part = 0.0
        for k in range(k0, min(hi, k0 + g)):
            pk = a[k] * b[k] * (sa[k] * sb[k])  # exact: low-precision elements, scales of <= 4 bits
            t, err = _two_sum(part, pk)
            if err != 0.0:
                raise ValueError("block-scaled group sum is not exact in float64 (elements wider than fp8?)")
            part = t
        if part != 0.0:
            total += np.int64(math.trunc(math.ldexp(part, -q)))
    if total == 0:
        return 0.0
    return _round_sum(math.ldexp(np.float64(total), q), ap)


@jit
def dot_scaled_acc(a: np.ndarray, b: np.ndarray, sa: np.ndarray, sb: np.ndarray, c: float, ap: AccParams) -> float:
    """``c + sum_k a[k]*b[k]*sa[k]*sb[k]`` under a block-scaled model (``ap.scale_block > 0``).

    Args:
        a, b: 1-D float64 arrays of K element values (of the element formats).
        sa, sb: 1-D float64 arrays of K: the scale of each element (each scale repeated over its block).
        c: incoming accumulator. ap: :class:`AccParams` of the model.

    Returns:
        The accumulated value.
    """
    n = a.shape[0]
    k = n - n  # an int64, not the literal 0: _scaled_block_step compiles once
    while k < n:
        kend = min(n, k + ap.block)
        c = _scaled_block_step(c, a, b, sa, sb, k, kend, ap)
        k = kend
    return c


@jit
def accumulate_range(a, b, c: float, lo: int, hi: int, ap: AccParams) -> float:
    if ap.kind == 0:
        for k in range(lo, hi):
            ak = _opnd(a[k], ap)
            bk = _opnd(b[k], ap)
            if ap.round_products:
                prod = round_scalar(ak * bk, ap.prod_p, ap.acc_mode, ZERO_U64)
                c = add_scalar(c, prod, ap.acc_p, ap.acc_mode, ZERO_U64)
            else:
                c = fma_scalar(ak, bk, c, ap.acc_p, ap.acc_mode, ZERO_U64)
        return c
    k = lo
    while k < hi:
        kend = min(hi, k + ap.block)
        c = _block_step(c, a, b, k, kend, ap)
        k = kend
    return c


@jit
def dot_acc(a: np.ndarray, b: np.ndarray, c: float, ap: AccParams) -> float:
    """``c + sum_k a[k]*b[k]`` under the model ``ap``.

    Args:
        a, b: 1-D float64 arrays (any stride) of equal length K; if the model has an input format each operand
            is rounded into it as it is read.
        c: incoming accumulator (already a value of the accumulator format).
        ap: :class:`AccParams` from :func:`acc_params`.

    Returns:
        The accumulated value (representable in the accumulator format, or the chunk-sum format if chunked).
    """
    n = a.shape[0]
    if ap.scale_block > 0:
        raise ValueError("a block-scaled model needs the scales: use matmul_scaled / dot_scaled_acc")
    if ap.chunk == 0:
        return accumulate_range(a, b, c, n - n, n, ap)  # an int64, not the literal 0: one compilation
    size = ap.chunk if ap.chunk > 0 else max(1, -((-n) // (-ap.chunk)))
    lo = n - n  # an int64, not the literal 0: accumulate_range compiles once
    while lo < n:
        hi = min(n, lo + size)
        part = accumulate_range(a, b, 0.0, lo, hi, ap)
        c = add_scalar(c, part, ap.outer_p, ap.outer_mode, ZERO_U64)
        lo = hi
    return c
