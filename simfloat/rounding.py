"""Exact rounding of float32/float64 values into any :class:`~simfloat.formats.FloatFormat`, in every mode.

The scalar worker :func:`round_exact` rounds a value given as an unevaluated pair ``s + e`` (the output of an
error-free transformation such as TwoSum or TwoProduct, ``|e| <= ulp(s)/2``), so the arithmetic in
:mod:`simfloat.ops` rounds its *exact* result once. Plain rounding of a float64 is the case ``e == 0``. float64
inputs are rounded directly from their bits, never through float32 (ml_dtypes and torch convert float64 -> float32
-> target and so double-round).

How it works: the float64 ``s = m * 2**ex`` (``m`` its 53-bit integer significand) and the sign of ``e`` are folded
into one integer ``M = 4*m + d`` at a grid four times finer than float64's, with ``d = +-2`` when ``e`` is exactly
half an ulp of ``s`` and ``d = +-1`` when it is strictly between 0 and half an ulp. An odd ``M`` thus stands for
"strictly between two grid points" (round-to-odd at 55 bits); since every target format keeps at most 53 bits,
the target grid is at least 4 times coarser, so the bits of ``M`` below the target quantum decide every mode
exactly: they are below, at or above the midpoint, and zero or not (the sticky bit).
"""

from __future__ import annotations

import enum
import os

import numpy as np
from numba import prange

from simfloat._jit import bits_f64, f64_bits, jit, pjit
from simfloat.formats import FloatFormat, FormatParams
from simfloat.formats import format as _format

__all__ = [
    "RoundingMode",
    "mode_code",
    "round",
    "round_exact",
    "round_scalar",
    "sticky",
    "rand_bits",
]


class RoundingMode(enum.IntEnum):
    """IEEE 754 rounding-direction attributes plus round-to-odd and stochastic rounding.

    The integer values are what njit kernels receive.
    """

    NEAREST_EVEN = 0  #: roundTiesToEven
    NEAREST_AWAY = 1  #: roundTiesToAway
    TOWARD_ZERO = 2  #: roundTowardZero (truncation)
    UP = 3  #: roundTowardPositive
    DOWN = 4  #: roundTowardNegative
    ODD = 5  #: round to odd (truncate, then set the last bit if inexact)
    STOCHASTIC = 6  #: round up with probability equal to the discarded fraction


_MODE_NAMES = {m.name.lower(): m for m in RoundingMode} | {
    "rne": RoundingMode.NEAREST_EVEN,
    "nearest": RoundingMode.NEAREST_EVEN,
    "rna": RoundingMode.NEAREST_AWAY,
    "rz": RoundingMode.TOWARD_ZERO,
    "rtz": RoundingMode.TOWARD_ZERO,
    "truncate": RoundingMode.TOWARD_ZERO,
    "ru": RoundingMode.UP,
    "rd": RoundingMode.DOWN,
    "sr": RoundingMode.STOCHASTIC,
}


def mode_code(mode: str | RoundingMode) -> RoundingMode:
    """Normalize a rounding mode given as a name (``"nearest_even"``, ``"rz"``, ...) or enum member.

    Raises:
        ValueError: unknown name.
        TypeError: neither a string nor a RoundingMode.
    """
    if isinstance(mode, RoundingMode):
        return mode
    if isinstance(mode, str):
        key = mode.strip().lower().replace("-", "_")
        if key in _MODE_NAMES:
            return _MODE_NAMES[key]
        raise ValueError(f"unknown rounding mode {mode!r}; known: {', '.join(m.name.lower() for m in RoundingMode)}")
    raise TypeError(f"rounding mode must be a string or RoundingMode, got {type(mode).__name__}")


_SIGN = np.uint64(1 << 63)
_FRAC_MASK = np.uint64((1 << 52) - 1)
_HIDDEN = np.uint64(1 << 52)
_ONE = np.uint64(1)
_ZERO = np.uint64(0)


@jit
def _pow2(q: int) -> float:
    """2**q for -1074 <= q <= 1023, built from bits (exact, and cheaper than ldexp)."""
    if q >= -1022:
        return bits_f64(np.uint64(q + 1023) << np.uint64(52))
    return bits_f64(_ONE << np.uint64(q + 1074))


@jit
def sticky(s: float, e: float) -> int:
    """Classify the tail ``e`` of an exact value ``s + e`` (``|e| <= ulp(s)/2``, as TwoSum returns it).

    Returns +-2 when ``e`` is exactly half an ulp of ``s`` (a tie at float64 precision), +-1 when it is strictly
    between 0 and half an ulp, 0 when ``e == 0``; the sign is the sign of ``e``.
    """
    if e == 0.0:
        return 0
    expo = np.int64(f64_bits(abs(s)) >> np.uint64(52))
    if expo <= 1:  # ulp(s) = 2**-1074: half an ulp is not a float64, so e is strictly inside
        return 1 if e > 0.0 else -1
    half_ulp = _pow2(expo - 1076)  # half of ulp(s) = 2**(E-52), E = expo - 1023
    mag = 2 if abs(e) == half_ulp else 1
    return mag if e > 0.0 else -mag


@jit
def _overflow(neg: bool, p: FormatParams, mode: int) -> float:
    """The value an overflowing result takes: IEEE gives infinity for nearest modes and for directed rounding
    away from zero, the largest finite value otherwise; the format's policy replaces infinity."""
    to_inf = (
        mode == 0
        or mode == 1
        or mode == 6
        or (mode == 3 and not neg)
        or (mode == 4 and neg)
    )
    if to_inf:
        if p.overflow == 0:
            r = np.inf
        elif p.overflow == 1:
            return np.nan
        else:
            r = p.max_value
    else:
        r = p.max_value
    return -r if neg else r


@jit
def round_exact(s: float, d: int, p: FormatParams, mode: int, rbits: np.uint64) -> float:
    """Round the exact value ``s + tail`` into format ``p`` with rounding ``mode``, once.

    Args:
        s: float64 head of the exact value.
        d: the tail's class from :func:`sticky` (0 for a plain float64; +-1 strictly inside half an ulp of ``s``,
            +-2 exactly half an ulp). With ``s == 0`` a nonzero ``d`` means a value of that sign below 2**-1075.
        p: the target format's :class:`FormatParams`.
        mode: a :class:`RoundingMode` value.
        rbits: 64 uniform random bits, used only by stochastic rounding.

    Returns:
        The rounded value as float64 (exactly representable in the format), NaN for NaN input and for overflow
        or infinity under a NaN policy.
    """
    if s != s:
        return s
    if s == np.inf or s == -np.inf:
        neg_inf = s < 0.0
        if p.has_inf:
            return s
        if p.overflow == 1:
            return np.nan
        return -p.max_value if neg_inf else p.max_value
    sb = f64_bits(s)
    neg = (sb & _SIGN) != _ZERO
    if s == 0.0:
        if d == 0:
            return s if p.neg_zero else 0.0
        neg = d < 0
    expo = np.int64((sb >> np.uint64(52)) & np.uint64(0x7FF))
    frac = sb & _FRAC_MASK
    if expo == 0:  # float64 subnormal (or zero with a tail): uniform grid of 2**-1074
        m = frac
        ex = np.int64(-1074)
        e_val = np.int64(-1023)  # below every format's emin, so the target grid is its subnormal grid
    else:
        m = frac | _HIDDEN
        ex = expo - 1075
        e_val = expo - 1023
    dm = -d if (neg and s != 0.0) else (d if s != 0.0 else abs(d))  # tail in the direction of |s|
    if dm < 0 and frac == _ZERO and expo != 0:
        e_val -= 1  # s is a power of two and the exact value lies just below it, in the binade under s
    big_m = (m << np.uint64(2)) + np.uint64(dm) if dm >= 0 else (m << np.uint64(2)) - np.uint64(-dm)
    q = max(e_val, p.emin) - p.mantissa_bits  # exponent of the target's quantum at this magnitude
    shift = q - (ex - 2)  # >= 2: every format is at least as coarse as float64, M is 4x finer
    if shift >= 64:
        kept = _ZERO
        rem = big_m
        half_cmp = -1  # M < 2**55 < half: strictly below the midpoint
    else:
        ush = np.uint64(shift)
        kept = big_m >> ush
        rem = big_m & ((_ONE << ush) - _ONE)
        half = _ONE << np.uint64(shift - 1)
        half_cmp = 0 if rem == half else (1 if rem > half else -1)
    if rem != _ZERO:
        if mode == 0:
            if half_cmp > 0 or (half_cmp == 0 and (kept & _ONE) == _ONE):
                kept += _ONE
        elif mode == 1:
            if half_cmp >= 0:
                kept += _ONE
        elif mode == 3:
            if not neg:
                kept += _ONE
        elif mode == 4:
            if neg:
                kept += _ONE
        elif mode == 5:
            kept |= _ONE
        elif mode == 6:
            # P(up) = rem / 2**shift, compared against 64 uniform bits; resolution 2**-64.
            if shift <= 64:
                thr = rem << np.uint64(64 - shift)
            else:
                thr = rem >> np.uint64(shift - 64)
            if rbits < thr:
                kept += _ONE
        # mode 2 (toward zero): truncation, nothing to add
    r = np.float64(kept) * _pow2(q)  # kept <= 2**53 and the product is representable: exact
    if r > p.max_value:
        return _overflow(neg, p, mode)
    if not p.subnormals and r != 0.0 and r < _pow2(p.emin):
        r = 0.0  # flush-to-zero of subnormal results, as FTZ hardware does
    if neg:
        if r == 0.0 and not p.neg_zero:
            return 0.0
        return -r
    return r


@jit
def round_scalar(x: float, p: FormatParams, mode: int, rbits: np.uint64) -> float:
    """Round one float64 into format ``p`` (see :func:`round_exact`)."""
    return round_exact(x, 0, p, mode, rbits)


@jit
def rand_bits(seed: np.uint64, counter: np.uint64) -> np.uint64:
    """64 random bits for element ``counter`` of a stream: splitmix64 of ``seed + counter * golden``.

    Counter-based, so stochastic rounding gives the same bits whatever the thread count or chunking.
    """
    z = seed + (counter + _ONE) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@pjit
def _round_flat(x, out, p, mode, seed):  # type: ignore[no-untyped-def]
    n = x.size
    nchunks = (n + 65535) // 65536
    for c in prange(nchunks):
        lo = c * 65536
        hi = min(n, lo + 65536)
        for i in range(lo, hi):
            rb = rand_bits(seed, np.uint64(i)) if mode == 6 else _ZERO
            out[i] = round_exact(np.float64(x[i]), 0, p, mode, rb)


def _resolve_format(fmt: str | FloatFormat) -> FloatFormat:
    f = _format(fmt)
    if f.emin - f.mantissa_bits < -1074 or f.emax > 1023:
        raise ValueError(f"format {f.name} has values outside float64's range; simfloat computes in float64")
    return f


def round(  # noqa: A001 - the public name mirrors numpy's verb
    x: np.ndarray,
    fmt: str | FloatFormat,
    mode: str | RoundingMode = "nearest_even",
    *,
    seed: int | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Round every element of ``x`` into ``fmt`` with ``mode``; return an array of ``x``'s dtype.

    Args:
        x: float32 or float64 array of any shape and memory layout.
        fmt: target format (:class:`FloatFormat` or name such as ``"bf16"``).
        mode: rounding mode name or :class:`RoundingMode`.
        seed: seed of stochastic rounding (reproducible: element ``i`` in C order always draws the same bits);
            ``None`` draws a fresh seed. Ignored by the other modes.
        out: optional output array of ``x``'s shape and dtype (may be ``x`` itself).

    Returns:
        Array shaped like ``x`` whose values are all representable in ``fmt``. NaN inputs stay NaN, also for
        formats without a NaN code (they have no code for it; simfloat never turns a NaN into a number).
        Overflow follows ``fmt.overflow`` and IEEE's rules per mode.

    Raises:
        TypeError: ``x`` is not a float32/float64 array, or ``out`` does not match it.
        ValueError: unknown format or mode.
    """
    f = _resolve_format(fmt)
    m = mode_code(mode)
    if not isinstance(x, np.ndarray):
        if isinstance(x, (float, int, list, tuple, np.floating)):
            x = np.asarray(x, dtype=np.float64)
        else:
            raise TypeError(f"x must be a float32 or float64 numpy array, got {type(x).__name__}")
    if x.dtype not in (np.float32, np.float64):
        raise TypeError(f"x must have dtype float32 or float64, got {x.dtype}")
    if out is not None:
        if not isinstance(out, np.ndarray) or out.dtype != x.dtype or out.shape != x.shape:
            raise TypeError("out must be a numpy array with the shape and dtype of x")
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little")
    elif not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
    useed = np.uint64(int(seed) % (1 << 64))

    src = np.ascontiguousarray(x)  # stochastic bits are indexed in C order, so layout never changes results
    direct = out is not None and out.flags.c_contiguous and (out is x or not np.shares_memory(out, x))
    if direct:
        dst = out
    else:
        dst = np.empty(x.shape, dtype=x.dtype)
    _round_flat(src.reshape(-1), dst.reshape(-1), f.params, int(m), useed)
    if out is not None and dst is not out:
        np.copyto(out, dst)
        return out
    return dst
