"""The public :func:`round`: an array (or real numbers) rounded element by element, in parallel chunks, by the
bit kernel where it applies and by :func:`~simfloat.rounding.round_exact` elsewhere."""

from __future__ import annotations

from typing import cast

import numpy as np
from numba import prange

from simfloat._jit import jit, pjit
from simfloat.formats import FloatFormat
from simfloat.rounding._bits import _bit_params, _round_chunk_bits
from simfloat.rounding._exact import _ZERO, TAIL0, overflow_value, quiet_nan, rand_bits, round_exact
from simfloat.rounding._inputs import checked_seed, fits_float32, real_input, resolve_format
from simfloat.rounding._modes import RoundingMode, mode_code

_CHUNK = 65536  # elements per parallel task; results never depend on it


@jit
def _round_chunk_exact(x, out, lo, p, mode, seed):
    """Elements lo.. of the flat input through :func:`round_exact` (stochastic rounding, and formats the bit
    kernel below does not cover); the stochastic bits are indexed by the flat position."""
    if mode == RoundingMode.STOCHASTIC:
        for i in range(x.size):
            rb = rand_bits(seed, np.uint64(lo + i))
            out[i] = quiet_nan(round_exact(np.float64(x[i]), TAIL0, p, RoundingMode.STOCHASTIC, rb))
    else:
        for i in range(x.size):
            out[i] = quiet_nan(round_exact(np.float64(x[i]), TAIL0, p, mode, _ZERO))


@pjit
def _round_flat(x, out, c, p, mode, seed):
    """Round the flat array ``x`` into ``out`` in parallel chunks: with the bit kernel when ``c.ok``,
    else with round_exact (one driver for both: each parallel driver costs seconds of compilation)."""
    n = x.size
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for ch in prange(nchunks):
        lo = ch * _CHUNK
        hi = min(n, lo + _CHUNK)
        if c.ok:
            _round_chunk_bits(x[lo:hi], out[lo:hi], c)
        else:
            _round_chunk_exact(x[lo:hi], out[lo:hi], lo, p, mode, seed)


def round(  # noqa: A001 - the public name mirrors numpy's verb
    x: object,
    fmt: str | FloatFormat,
    mode: str | RoundingMode | int = "nearest_even",
    *,
    seed: int | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Round every element of ``x`` into ``fmt`` with ``mode``, once, from its exact value.

    Args:
        x: a float32 or float64 array of any shape and memory layout, a float16 array or an ml_dtypes array
            (bfloat16, float8_*, float6_*, float4_*; widened exactly to float32 and treated as float32 input),
            or real numbers: a Python or NumPy int or float (long double included; not bool), a
            :class:`fractions.Fraction`, or a (nested) list or tuple of these (not strings). Numbers float64
            cannot hold (ints beyond 2**53, long doubles, Fractions) are rounded from their exact value, never
            through float64 first; stochastic rounding sees them as their nearest float64 plus a tail known to a
            quarter of float64's ulp, as it sees the exact results of :mod:`simfloat.ops`. Arrays of other
            dtypes (integer, long double, bool, strings, ml_dtypes' int4/int2) are rejected.
        fmt: target format (:class:`FloatFormat` or name such as ``"bf16"``).
        mode: rounding mode name, :class:`RoundingMode` or its int value.
        seed: seed of stochastic rounding (reproducible: element ``i`` in C order always draws the same bits);
            ``None`` draws a fresh seed. Ignored by the other modes.
        out: optional writable output array of the result's shape and dtype (may be ``x`` itself).

    Returns:
        An ndarray shaped like ``x`` (0-d for a scalar) whose values are all representable in ``fmt``. It is
        float32 when ``x`` is a float32 (or float16 / ml_dtypes) array or NumPy float32 scalar and every value
        of ``fmt`` is a float32 (as :mod:`simfloat.ops` decides), float64 otherwise: float32 input into
        ``"e11m7"`` or ``"float64"`` gives float64, since the rounded values (2**128 from float32's largest
        value) need not be float32 numbers. NaN inputs give quiet NaNs with their sign and payload (a
        signalling NaN is quieted, as IEEE 754's convertFormat does), in every mode and also for formats without
        a NaN code (they have no code for it; simfloat never turns a NaN into a number). Overflow follows
        ``fmt.overflow`` and IEEE's rules per mode.

    Raises:
        TypeError: ``x`` is neither an array of the dtypes above nor real numbers (bools and strings are not),
            ``out`` is not an array of the result's shape and dtype, or ``seed`` is not an int.
        ValueError: unknown format or mode, or ``out`` is read-only.
    """
    f = resolve_format(fmt)
    m = int(mode_code(mode))
    arr, inexact, _ = real_input("x", x)
    dtype = np.dtype(np.float32 if arr.dtype == np.float32 and fits_float32(f) else np.float64)
    if out is not None:
        if not isinstance(out, np.ndarray) or out.dtype != dtype or out.shape != arr.shape:
            raise TypeError(f"out must be a numpy array of shape {arr.shape} and dtype {dtype} (the result's)")
        if not out.flags.writeable:
            raise ValueError("out is read-only")
    useed = checked_seed(seed)

    if arr.dtype != dtype:  # float32 into a format float32 cannot hold: exact conversion (quiets NaNs)
        with np.errstate(invalid="ignore"):
            src = arr.astype(dtype)
    else:  # stochastic bits are indexed in C order, so layout never changes results
        src = np.ascontiguousarray(arr)
    direct = out is not None and out.flags.c_contiguous and (out is src or not np.shares_memory(out, src))
    dst = cast(np.ndarray, out) if direct else np.empty(arr.shape, dtype=dtype)
    flat = dst.reshape(-1)
    p = f.params
    _round_flat(src.reshape(-1), flat, _bit_params(f, dtype, m), p, m, useed)
    for e in inexact:  # the numbers float64 cannot hold, from their exact split
        head = float(src.flat[e.index])
        if e.beyond:
            flat[e.index] = overflow_value(head < 0.0, p, m)
        else:
            rbits = np.uint64(rand_bits(useed, np.uint64(e.index)) if m == RoundingMode.STOCHASTIC else 0)
            flat[e.index] = round_exact(head, e.tail, p, m, rbits)
    if out is not None and dst is not out:
        np.copyto(out, dst)
        return out
    return dst
