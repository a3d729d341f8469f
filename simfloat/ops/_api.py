"""Array front end of :mod:`simfloat.ops`: validation, broadcasting and the parallel njit drivers."""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from simfloat._jit import jit, pjit
from simfloat.formats import FloatFormat
from simfloat.ops._elementary import exp2_scalar, exp_scalar, log_scalar
from simfloat.ops._reduce import max_slice, sum_slice
from simfloat.ops._scalar import (
    add_scalar,
    div_scalar,
    fma_scalar,
    maximum_scalar,
    mul_scalar,
    sqrt_scalar,
    sub_scalar,
)
from simfloat.rounding import (
    RoundingMode,
    checked_seed,
    fits_float32,
    mode_code,
    quiet_nan,
    rand_bits,
    real_input,
    resolve_format,
)

__all__ = [
    "add",
    "sub",
    "mul",
    "div",
    "fma",
    "sqrt",
    "exp",
    "exp2",
    "log",
    "maximum",
    "sum",
    "max",
    "ORDERS",
]

ORDERS = ("sequential", "pairwise", "chunked", "numpy")

_BLOCK = 4096
_Z = np.uint64(0)
_BINARY = {"add": 0, "sub": 1, "mul": 2, "div": 3, "maximum": 4}
_UNARY = {"sqrt": 0, "exp": 1, "exp2": 2, "log": 3}

Mode = str | RoundingMode | int
Fmt = str | FloatFormat


@jit
def _bits(mode, seed, fixed, i):
    """Random word of element ``i``: the counter-based stream, or ``seed`` itself when ``fixed`` (used by the
    tests to pin stochastic rounding to its extremes, 0 and 2**64 - 1)."""
    if mode != RoundingMode.STOCHASTIC:
        return _Z
    return seed if fixed else rand_bits(seed, np.uint64(i))


# -- drivers -------------------------------------------------------------------------------------------------
@pjit
def _unary_driver(x, out, p, op, mode, seed, fixed):
    n = out.size
    for c in prange((n + _BLOCK - 1) // _BLOCK):
        for i in range(c * _BLOCK, min(n, (c + 1) * _BLOCK)):
            rb = _bits(mode, seed, fixed, i)
            v = x[i]
            if op == 0:
                r = sqrt_scalar(v, p, mode, rb)
            elif op == 1:
                r = exp_scalar(v, p, mode, rb)
            elif op == 2:
                r = exp2_scalar(v, p, mode, rb)
            else:
                r = log_scalar(v, p, mode, rb)
            out[i] = quiet_nan(r)


@pjit
def _binary_driver(a, b, out, p, op, mode, seed, fixed):
    n = out.size
    for c in prange((n + _BLOCK - 1) // _BLOCK):
        for i in range(c * _BLOCK, min(n, (c + 1) * _BLOCK)):
            rb = _bits(mode, seed, fixed, i)
            if op == 0:
                r = add_scalar(a[i], b[i], p, mode, rb)
            elif op == 1:
                r = sub_scalar(a[i], b[i], p, mode, rb)
            elif op == 2:
                r = mul_scalar(a[i], b[i], p, mode, rb)
            elif op == 3:
                r = div_scalar(a[i], b[i], p, mode, rb)
            else:
                r = maximum_scalar(a[i], b[i], p, mode, rb)
            out[i] = quiet_nan(r)


@pjit
def _fma_driver(a, b, c, out, p, mode, seed, fixed):
    n = out.size
    for k in prange((n + _BLOCK - 1) // _BLOCK):
        for i in range(k * _BLOCK, min(n, (k + 1) * _BLOCK)):
            rb = _bits(mode, seed, fixed, i)
            out[i] = quiet_nan(fma_scalar(a[i], b[i], c[i], p, mode, rb))


@pjit
def _sum_driver(x2, out, p, mode, order, fan_in, chunk, seed):
    rows, n = x2.shape
    span = np.uint64(4 * n + 4)
    for r in prange(rows):
        out[r] = quiet_nan(sum_slice(x2[r], p, mode, order, fan_in, chunk, seed, np.uint64(r) * span))


@pjit
def _max_driver(x2, out):
    for r in prange(x2.shape[0]):
        out[r] = quiet_nan(max_slice(x2[r]))


# -- validation ----------------------------------------------------------------------------------------------
def _mode(mode: Mode) -> int:
    """A mode name, RoundingMode or its int value (as simfloat.round takes it)."""
    return int(mode_code(mode))


def _operand(name: str, x: object) -> tuple[np.ndarray, bool | None]:
    """(float64 array, is_float32) -- is_float32 None for Python numbers and lists (they do not vote on the
    dtype). The same inputs as simfloat.round, except that a number float64 cannot hold is a ValueError: the
    ops take their operands exactly, as float64."""
    arr, inexact, is32 = real_input(name, x)
    if inexact:
        v = repr(inexact[0].value)
        v = v if len(v) <= 40 else v[:18] + "..." + v[-18:]
        raise ValueError(
            f"{name} holds {v}, which is not a float64 number; the ops take their operands exactly as float64 "
            "(round it first, e.g. simfloat.round(value, 'float64'))"
        )
    with np.errstate(invalid="ignore"):  # converting a signalling NaN quiets it
        return arr.astype(np.float64, copy=False), is32


def _out_dtype(f: FloatFormat, votes: list[bool | None]) -> type:
    cast = [v for v in votes if v is not None]
    if cast and all(cast) and fits_float32(f):
        return np.float32
    return np.float64


def _elementwise(names: tuple[str, ...], args: tuple[object, ...], fmt: Fmt, mode: Mode, seed: int | None):
    f = resolve_format(fmt)
    m = _mode(mode)
    ops = [_operand(nm, x) for nm, x in zip(names, args, strict=True)]
    try:
        shape = np.broadcast_shapes(*(a.shape for a, _ in ops))
    except ValueError:
        shapes = ", ".join(f"{nm}{a.shape}" for nm, (a, _) in zip(names, ops, strict=True))
        raise ValueError(f"operands cannot be broadcast together: {shapes}") from None
    flat = [np.ascontiguousarray(np.broadcast_to(a, shape)).reshape(-1) for a, _ in ops]
    out = np.empty(shape, dtype=np.float64)
    return f, m, flat, out, _out_dtype(f, [v for _, v in ops]), checked_seed(seed)


def _finish(out: np.ndarray, dtype: type) -> np.ndarray:
    return out if dtype is np.float64 else out.astype(np.float32)


_DOC_COMMON = """
    Operands broadcast like numpy's; each may be a float32/float64 array or NumPy scalar, a float16 or ml_dtypes
    array (bfloat16, float8_*, float6_*, float4_*: widened exactly to float32, and then float32 operands), or
    real numbers as :func:`simfloat.round` takes them (Python or NumPy ints and floats, Fractions, lists of
    them; not bools or strings), used exactly as float64: a number float64 cannot hold (an int beyond 2**53, a
    long double) is an error, never rounded first. The result is float32 when every array or NumPy scalar
    operand is float32 (or float16 / ml_dtypes) and every value of ``fmt`` is a float32 (so the cast is
    exact), float64 otherwise; it is always an ndarray (0-d for
    scalar operands). NaN results are quiet NaNs, also for signalling NaN operands.

    Args:
        fmt: target format (:class:`~simfloat.formats.FloatFormat` or a name such as ``"bf16"``).
        mode: rounding mode name, :class:`~simfloat.rounding.RoundingMode` or its int value.
        seed: seed of stochastic rounding; element ``i`` of the broadcast result (C order) draws
            ``rand_bits(seed, i)``, so results do not depend on threads. ``None`` draws a fresh seed.

    Raises:
        TypeError: an operand is not an array of those dtypes (or real numbers), or ``seed`` is not an int.
        ValueError: unknown format or mode, an operand float64 cannot hold, or shapes that do not broadcast.
"""


def _binary(op: str, a: object, b: object, fmt: Fmt, mode: Mode, seed: int | None) -> np.ndarray:
    f, m, (fa, fb), out, dtype, useed = _elementwise(("a", "b"), (a, b), fmt, mode, seed)
    _binary_driver(fa, fb, out.reshape(-1), f.params, _BINARY[op], m, useed, False)
    return _finish(out, dtype)


def _unary(op: str, x: object, fmt: Fmt, mode: Mode, seed: int | None) -> np.ndarray:
    f, m, (fx,), out, dtype, useed = _elementwise(("x",), (x,), fmt, mode, seed)
    _unary_driver(fx, out.reshape(-1), f.params, _UNARY[op], m, useed, False)
    return _finish(out, dtype)


def add(a: object, b: object, fmt: Fmt, mode: Mode = "nearest_even", *, seed: int | None = None) -> np.ndarray:
    """``a + b`` computed exactly and rounded once into ``fmt``."""
    return _binary("add", a, b, fmt, mode, seed)


def sub(a: object, b: object, fmt: Fmt, mode: Mode = "nearest_even", *, seed: int | None = None) -> np.ndarray:
    """``a - b`` computed exactly and rounded once into ``fmt``."""
    return _binary("sub", a, b, fmt, mode, seed)


def mul(a: object, b: object, fmt: Fmt, mode: Mode = "nearest_even", *, seed: int | None = None) -> np.ndarray:
    """``a * b`` computed exactly and rounded once into ``fmt``."""
    return _binary("mul", a, b, fmt, mode, seed)


def div(a: object, b: object, fmt: Fmt, mode: Mode = "nearest_even", *, seed: int | None = None) -> np.ndarray:
    """``a / b`` computed exactly and rounded once into ``fmt`` (x/0 is +-inf, 0/0 NaN, as IEEE says)."""
    return _binary("div", a, b, fmt, mode, seed)


def maximum(a: object, b: object, fmt: Fmt, mode: Mode = "nearest_even", *, seed: int | None = None) -> np.ndarray:
    """IEEE 754-2019 ``maximum`` (NaN propagating, -0 < +0), rounded into ``fmt`` (exact for its values)."""
    return _binary("maximum", a, b, fmt, mode, seed)


def fma(
    a: object, b: object, c: object, fmt: Fmt, mode: Mode = "nearest_even", *, seed: int | None = None
) -> np.ndarray:
    """``a*b + c`` computed exactly and rounded once into ``fmt`` (a fused multiply-add in ``fmt``)."""
    f, m, (fa, fb, fc), out, dtype, useed = _elementwise(("a", "b", "c"), (a, b, c), fmt, mode, seed)
    _fma_driver(fa, fb, fc, out.reshape(-1), f.params, m, useed, False)
    return _finish(out, dtype)


def sqrt(x: object, fmt: Fmt, mode: Mode = "nearest_even", *, seed: int | None = None) -> np.ndarray:
    """``sqrt(x)`` correctly rounded into ``fmt`` (sqrt(-0) = -0, negative -> NaN)."""
    return _unary("sqrt", x, fmt, mode, seed)


def exp(x: object, fmt: Fmt, mode: Mode = "nearest_even", *, seed: int | None = None) -> np.ndarray:
    """``exp(x)`` rounded into ``fmt``: correctly rounded for formats below float64 precision, faithful (libm)
    for float64; see :mod:`simfloat.ops._elementary` for the exact contract."""
    return _unary("exp", x, fmt, mode, seed)


def exp2(x: object, fmt: Fmt, mode: Mode = "nearest_even", *, seed: int | None = None) -> np.ndarray:
    """``2**x`` rounded into ``fmt`` (exact for integers; otherwise as :func:`exp`)."""
    return _unary("exp2", x, fmt, mode, seed)


def log(x: object, fmt: Fmt, mode: Mode = "nearest_even", *, seed: int | None = None) -> np.ndarray:
    """Natural ``log(x)`` rounded into ``fmt`` (as :func:`exp`; log(0) = -inf, log(x < 0) = NaN)."""
    return _unary("log", x, fmt, mode, seed)


for _fn in (add, sub, mul, div, maximum, fma, sqrt, exp, exp2, log):
    _fn.__doc__ = (_fn.__doc__ or "") + "\n" + _DOC_COMMON


def _axis_rows(name: str, x: object, axis: int | None) -> tuple[np.ndarray, bool | None, tuple[int, ...]]:
    """(rows x n float64 C-contiguous, is_float32, result shape)."""
    arr, is32 = _operand(name, x)
    if axis is None:
        return np.ascontiguousarray(arr.reshape(1, -1)), is32, ()
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be an int or None, got {type(axis).__name__}")
    if arr.ndim == 0:
        raise ValueError("x must have at least one dimension to reduce along an axis (or pass axis=None)")
    ax = int(axis)
    if not -arr.ndim <= ax < arr.ndim:
        raise ValueError(f"axis {ax} is out of bounds for an array of {arr.ndim} dimension(s)")
    moved = np.moveaxis(arr, ax, -1)
    shape = moved.shape[:-1]
    return np.ascontiguousarray(moved).reshape(math.prod(shape), moved.shape[-1]), is32, shape


def sum(  # noqa: A001 - the public name mirrors numpy's
    x: object,
    fmt: Fmt,
    mode: Mode = "nearest_even",
    *,
    axis: int | None = -1,
    order: str = "sequential",
    fan_in: int = 2,
    chunk: int = 32,
    seed: int | None = None,
) -> np.ndarray:
    """Sum along ``axis`` with every partial sum rounded into ``fmt``, in an explicit association order.

    Orders (exact shapes in :mod:`simfloat.ops._reduce`): ``"sequential"`` left to right; ``"pairwise"`` a
    tree over groups of ``fan_in`` adjacent values, level by level (``fan_in=2``, power-of-two length: the
    balanced binary tree); ``"chunked"`` sequential within chunks of ``chunk`` then over the chunk sums;
    ``"numpy"`` numpy's pairwise summation, bit-identical to ``np.sum`` of a contiguous float32 array for
    float32/RNE. Elements are rounded into ``fmt`` as they are loaded (the identity for values of ``fmt``); an
    empty sum is +0.

    Args:
        x: float32/float64 array. axis: the axis to reduce (``None``: all elements, C order).
        fmt, mode: target format and rounding mode. fan_in: group size of ``"pairwise"`` (>= 2). chunk: chunk
            length of ``"chunked"`` (>= 1). seed: stochastic rounding seed; row ``r`` of the reduction uses
            counters ``[r*(4n+4), (r+1)*(4n+4))`` (see :mod:`simfloat.ops._reduce`).

    Returns:
        ``x``'s shape without ``axis``; float32 when ``x`` is float32 and ``fmt`` fits float32, else float64.

    Raises:
        TypeError: bad ``x``/``axis``/``fan_in``/``chunk``/``seed`` types. ValueError: unknown order, format
            or mode, axis out of range, ``fan_in < 2`` or ``chunk < 1``.
    """
    f = resolve_format(fmt)
    m = _mode(mode)
    if not isinstance(order, str) or order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    for nm, v, lo in (("fan_in", fan_in, 2), ("chunk", chunk, 1)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{nm} must be an int, got {type(v).__name__}")
        if v < lo:
            raise ValueError(f"{nm} must be >= {lo}, got {v}")
    rows, is32, shape = _axis_rows("x", x, axis)
    useed = checked_seed(seed)
    out = np.empty(rows.shape[0], dtype=np.float64)
    _sum_driver(rows, out, f.params, m, ORDERS.index(order), int(fan_in), int(chunk), useed)
    return _finish(out.reshape(shape), _out_dtype(f, [is32]))


def max(x: object, axis: int | None = -1) -> np.ndarray:  # noqa: A001 - the public name mirrors numpy's
    """IEEE ``maximum`` reduction along ``axis``: NaN if any element is NaN, -0 < +0; no rounding.

    Returns ``x``'s shape without ``axis``, with ``x``'s dtype (float32 for float16 / ml_dtypes arrays, float64
    for Python numbers).

    Raises:
        TypeError: ``x`` not float32/float64 (or float16 / ml_dtypes, widened to float32). ValueError: an empty
            reduction, axis out of range.
    """
    rows, is32, shape = _axis_rows("x", x, axis)
    if rows.shape[1] == 0:
        raise ValueError("zero-size reduction: maximum has no identity")
    out = np.empty(rows.shape[0], dtype=np.float64)
    _max_driver(rows, out)
    return _finish(out.reshape(shape), np.float32 if is32 else np.float64)
