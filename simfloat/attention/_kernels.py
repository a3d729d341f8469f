"""Scalar njit operations for the attention kernels: each rounds its exact result once into an op's format.

Every function takes the op as an :class:`~simfloat.attention.plan.OpParams` (format parameters + mode).
Sums, products, quotients and FMAs are exact before the one rounding (error-free transformations and
:func:`~simfloat.rounding.sticky`); exp/exp2 round libm's float64 value (within about half a float64 ulp
of the true value), so the result is the correctly rounded one except when that value lies within a float64
ulp of a rounding boundary of the target format (probability ~2**-29 for fp32; float64 targets get libm's
value). ``-inf`` is never passed here: the kernels treat it as the "no key seen yet" sentinel.
"""

from __future__ import annotations

import math

import numpy as np

from simfloat._jit import fma64, jit
from simfloat.accumulate.scalar import _fused_step
from simfloat.hardware import ex2_approx_f32, mma_tree_sum
from simfloat.rounding import round_exact, sticky

__all__ = ["add", "div", "dot64", "exp", "exp2", "exp2_hw", "fma", "fmax", "mul", "rnd", "row_sum", "sub"]

_Z = np.uint64(0)


@jit
def rnd(x, o):
    """``x`` rounded into the op's format (a cast)."""
    return round_exact(x, 0, o.p, o.mode, _Z)


@jit
def add(a, b, o):
    """round(a + b)."""
    s = a + b
    if s - s != 0.0:  # inf/NaN
        return rnd(s, o)
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return round_exact(s, sticky(s, e), o.p, o.mode, _Z)


@jit
def sub(a, b, o):
    """round(a - b)."""
    return add(a, -b, o)


@jit
def mul(a, b, o):
    """round(a * b)."""
    r = a * b
    if r - r != 0.0 or r == 0.0:
        return rnd(r, o)
    return round_exact(r, sticky(r, fma64(a, b, -r)), o.p, o.mode, _Z)


@jit
def div(a, b, o):
    """round(a / b): the residual a - r*b is exact, its sign (times b's) is the tail's sign; never a tie."""
    r = a / b
    if r - r != 0.0 or r == 0.0:
        return rnd(r, o)
    res = fma64(-r, b, a)
    d = 0 if res == 0.0 else (1 if (res > 0.0) == (b > 0.0) else -1)
    return round_exact(r, d, o.p, o.mode, _Z)


@jit
def fma(a, b, c, o):
    """round(a * b + c), one rounding."""
    return _fused_step(c, a, b, o.p, o.mode)


@jit
def exp(x, o):
    """round(e**x)."""
    return rnd(math.exp(x), o)


@jit
def exp2(x, o):
    """round(2**x)."""
    return rnd(math.exp2(x), o)


@jit
def exp2_hw(x, o, tab):
    """round(2**x) (``tab`` empty), else round(ex2.approx.ftz.f32(x)) with the measured table
    (simfloat.hardware)."""
    if tab.size == 0:
        return exp2(x, o)
    return rnd(ex2_approx_f32(x, tab, True), o)


@jit
def row_sum(p, n, o, order, warps_n):
    """sum of p[:n], each addition rounded by ``o``. order 0: left to right. order 1: the H200's tl.sum over
    the mma accumulator layout with ``warps_n`` warps along the row (:func:`simfloat.hardware.mma_tree_sum`)."""
    if order == 0:
        s = 0.0
        for j in range(n):
            s = add(s, p[j], o)
        return s
    return mma_tree_sum(p, n, warps_n, add, o)


@jit
def dot64(a, b, c):
    """c + sum a[k]*b[k] as a plain float64 loop (the tracer's reference for dots)."""
    for j in range(a.shape[0]):
        c += a[j] * b[j]
    return c


@jit
def fmax(a, b):
    """max propagating NaN (from either side)."""
    if a != a or b != b:
        return a + b
    return a if a >= b else b
