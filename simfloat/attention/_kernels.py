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
from simfloat.accumulate import _fused_step
from simfloat.hardware import ex2_approx_f32
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
    the mma accumulator layout with ``warps_n`` warps along the row (simfloat.hardware): lane t of warp w sums
    its columns 8w + 2t + 8*warps_n*r (and + 1) left to right, then the lane butterfly (xor 2, xor 1):
    (s0 + s2) + (s1 + s3), then the warp butterfly likewise (2 warps: w0 + w1; 4: (w0 + w2) + (w1 + w3))."""
    if order == 0:
        s = 0.0
        for j in range(n):
            s = add(s, p[j], o)
        return s
    nw = max(1, min(warps_n, (n + 7) // 8))
    period = 8 * warps_n
    lw = np.zeros(4)
    for w in range(nw):
        lt = np.zeros(4)
        for t in range(4):
            s = 0.0
            first = True
            for base in range(8 * w + 2 * t, n, period):
                for c in range(base, min(base + 2, n)):
                    if first:
                        s = p[c]
                        first = False
                    else:
                        s = add(s, p[c], o)
            lt[t] = s
        lw[w] = add(add(lt[0], lt[2], o), add(lt[1], lt[3], o), o)
    if nw == 1:
        return lw[0]
    if nw == 2:
        return add(lw[0], lw[1], o)
    return add(add(lw[0], lw[2], o), add(lw[1], lw[3], o), o)


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
