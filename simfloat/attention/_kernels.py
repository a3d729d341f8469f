"""Scalar njit operations for the attention kernels: each rounds its exact result once into an op's format.

Every function takes the op as an :class:`~simfloat.attention.plan.OpParams` (format parameters + mode). The
arithmetic is the floor's (:mod:`simfloat.ops._scalar`: exact before the one rounding, IEEE 754's special values
and signs of zero, every float64 operand); these are its workers with the op's format and mode filled in.
exp/exp2 are :mod:`simfloat.ops`' scalar exp/exp2: correctly rounded (libm's value where it decides the
rounding, else a double-double), so no CPU's libm changes a bit; float64 targets get libm's value. ``-inf`` is
never passed here: the
kernels treat it as the "no key seen yet" sentinel.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from simfloat._jit import jit, ljit, record_of
from simfloat.hardware import ex2_approx_f32, mma_tree_sum
from simfloat.ops._elementary import exp2_scalar, exp_scalar, log_scalar
from simfloat.ops._scalar import add_scalar, div_scalar, fma_scalar, mul_scalar, sub_scalar
from simfloat.rounding import round_exact
from simfloat.rounding._exact import TAIL0

__all__ = [
    "add",
    "host_mul",
    "host_rnd",
    "div",
    "dot64",
    "exp",
    "exp2",
    "exp2_hw",
    "fma",
    "fmax",
    "kv_tile",
    "log",
    "mul",
    "rnd",
    "row_sum",
    "sub",
]

_Z = np.uint64(0)


@jit
def rnd(x, o):
    """``x`` rounded into the op's format (a cast)."""
    return round_exact(x, TAIL0, o.p, o.mode, _Z)


def host_rnd(x: float, o: Any) -> float:
    """:func:`rnd` called from Python (a plan's constants), with the op (an ``OpParams``) as the numpy record the
    kernels are passed it in (:func:`simfloat._jit.record_of`): both run one compilation of the scalar ops."""
    return float(rnd(float(x), record_of(o)))


def host_mul(a: float, b: float, o: Any) -> float:
    """:func:`mul` called from Python, as :func:`host_rnd`."""
    return float(mul(float(a), float(b), record_of(o)))


@jit
def add(a, b, o):
    """round(a + b)."""
    return add_scalar(a, b, o.p, o.mode, _Z)


@jit
def sub(a, b, o):
    """round(a - b)."""
    return sub_scalar(a, b, o.p, o.mode, _Z)


@jit
def mul(a, b, o):
    """round(a * b)."""
    return mul_scalar(a, b, o.p, o.mode, _Z)


@jit
def div(a, b, o):
    """round(a / b)."""
    return div_scalar(a, b, o.p, o.mode, _Z)


@jit
def fma(a, b, c, o):
    """round(a * b + c), one rounding."""
    return fma_scalar(a, b, c, o.p, o.mode, _Z)


@jit
def exp(x, o):
    """round(e**x), correctly rounded (``simfloat.ops``' exp: the libm value where it decides the rounding, else
    a double-double), so that no CPU's libm changes a bit."""
    return exp_scalar(x, o.p, o.mode, _Z)


@jit
def exp2(x, o):
    """round(2**x), correctly rounded (as :func:`exp`)."""
    return exp2_scalar(x, o.p, o.mode, _Z)


@jit
def log(x, o):
    """round(ln x), correctly rounded (``simfloat.ops``' log; log(0) = -inf)."""
    return log_scalar(x, o.p, o.mode, _Z)


@jit
def kv_tile(pos, n_kv, t, bm, bn, causal, order):
    """The key tile a q tile ``t`` (rows of ``bm``) walks at step ``pos`` of its ``n_kv`` tiles (``bn`` keys each)
    in ``order`` (``Plan.kv_order``: 0 forward, 1 reverse, 2 diagonal first: with ``causal``, the tiles some row
    of the q tile masks in part, i.e. whose last key is past the tile's first row, in forward order, then the
    rest from tile 0)."""
    if order == 1:
        return n_kv - 1 - pos
    if order == 2 and causal:
        d0 = n_kv
        for jt in range(n_kv):
            if jt * bn + bn - 1 > t * bm:
                d0 = jt
                break
        return d0 + pos if pos < n_kv - d0 else pos - (n_kv - d0)
    return pos


@jit
def exp2_hw(x, o, tab):
    """round(2**x) (``tab`` empty), else round(ex2.approx.ftz.f32(x)) with the measured table
    (simfloat.hardware)."""
    if tab.size == 0:
        return exp2(x, o)
    return rnd(ex2_approx_f32(x, tab, True), o)


_LOG2E = math.log2(math.e)


@ljit
def exp_op(x, o, pp, tab):
    """T7 / T9's exponential into op ``o`` as the plan computes it: exp2 (``pp.exp2``; ex2.approx.ftz with
    the table ``tab``, a FlashParams' ``ex2_tab``), tl.exp (``pp.exp_tl``: ``o(exp2(o(x * o(log2 e))))``, the
    H200's ex2.approx not flushed), else ``o(e**x)``. ``pp``: a FlashParams or its record (both engines' loops
    call it)."""
    if pp.exp2:
        return exp2_hw(x, o, tab)
    if pp.exp_tl:
        t = mul(x, rnd(_LOG2E, o), o)
        if tab.size == 0:
            return exp2(t, o)
        return rnd(ex2_approx_f32(t, tab, False), o)
    return exp(x, o)


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
