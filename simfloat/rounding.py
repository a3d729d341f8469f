"""Exact rounding of float32/float64 values into any :class:`~simfloat.formats.FloatFormat`, in every mode.

The scalar worker :func:`round_exact` rounds a value given as an unevaluated pair ``s + e`` (the output of an
error-free transformation such as TwoSum or TwoProduct, ``|e| <= ulp(s)/2``), so the arithmetic in
:mod:`simfloat.ops` rounds its *exact* result once. Plain rounding of a float64 is the case ``e == 0``.
float64 inputs are rounded directly from their bits, never through float32 (ml_dtypes and torch convert
float64 -> float32 -> target and so double-round).

How it works: the float64 ``s = m * 2**ex`` (``m`` its 53-bit integer significand) and the sign of ``e`` are
folded into one integer ``M = 4*m + d`` at a grid four times finer than float64's, with ``d = +-2`` when ``e``
is exactly half an ulp of ``s`` and ``d = +-1`` when it is strictly between 0 and half an ulp. An odd ``M``
thus stands for "strictly between two grid points" (round-to-odd at 55 bits); since every target format keeps
at most 53 bits, the target grid is at least 4 times coarser, so the bits of ``M`` below the target quantum
decide every mode exactly: they are below, at or above the midpoint, and zero or not (the sticky bit).
"""

from __future__ import annotations

import enum
import functools
import math
import numbers
import os
from fractions import Fraction
from typing import NamedTuple, cast

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from simfloat._jit import bits_f64, f64_bits, jit, pjit
from simfloat.formats import FloatFormat, FormatParams
from simfloat.formats import format as _format

__all__ = [
    "RoundingMode",
    "mode_code",
    "overflow_value",
    "quiet_nan",
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


def mode_code(mode: str | RoundingMode | int) -> RoundingMode:
    """Normalize a rounding mode given as a name (``"nearest_even"``, ``"rz"``, ...), enum member or the
    member's int value (``3`` is ``UP``; a Python or NumPy integer, not a bool).

    Raises:
        ValueError: unknown name or int value.
        TypeError: neither a string, a RoundingMode nor an int (bools included).
    """
    if isinstance(mode, RoundingMode):
        return mode
    known = ", ".join(f"{m.name.lower()} ({int(m)})" for m in RoundingMode)
    if isinstance(mode, str):
        key = mode.strip().lower().replace("-", "_")
        if key in _MODE_NAMES:
            return _MODE_NAMES[key]
        raise ValueError(f"unknown rounding mode {mode!r}; known: {known}")
    if isinstance(mode, (int, np.integer)) and not isinstance(mode, (bool, np.bool_)):
        try:
            return RoundingMode(int(mode))
        except ValueError:
            raise ValueError(f"unknown rounding mode {int(mode)}; known: {known}") from None
    raise TypeError(f"rounding mode must be a string, RoundingMode or its int value, got {type(mode).__name__}")


_SIGN = np.uint64(1 << 63)
_FRAC_MASK = np.uint64((1 << 52) - 1)
_HIDDEN = np.uint64(1 << 52)
_ONE = np.uint64(1)
_ZERO = np.uint64(0)
_QUIET = np.uint64(1 << 51)  # float64's quiet-NaN bit (the top fraction bit)


@jit
def _pow2(q: int | np.int64) -> float:
    """2**q for -1074 <= q <= 1023, built from bits (exact, and cheaper than ldexp)."""
    if q >= -1022:
        return bits_f64(np.uint64(q + 1023) << np.uint64(52))
    return bits_f64(_ONE << np.uint64(q + 1074))


@jit
def quiet_nan(v: float) -> float:
    """``v``, except that a signalling NaN becomes quiet (its quiet bit set, sign and payload kept)."""
    if v == v:
        return v
    return bits_f64(f64_bits(v) | _QUIET)


@jit
def sticky(s: float, e: float) -> int:
    """Classify the tail ``e`` of an exact value ``s + e`` (``|e| <= ulp(s)/2``, as TwoSum returns it).

    Returns +-2 when ``e`` is exactly half an ulp of ``s`` (a tie at float64 precision), +-1 when it is
    strictly between 0 and half an ulp, 0 when ``e == 0``; the sign is the sign of ``e``.
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
def overflow_value(neg: bool, p: FormatParams, mode: int) -> float:
    """The value an overflowing result takes: IEEE gives infinity for nearest modes and for directed rounding
    away from zero, the largest finite value otherwise; the format's policy replaces infinity."""
    to_inf = (
        mode == RoundingMode.NEAREST_EVEN
        or mode == RoundingMode.NEAREST_AWAY
        or mode == RoundingMode.STOCHASTIC
        or (mode == RoundingMode.UP and not neg)
        or (mode == RoundingMode.DOWN and neg)
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
def _round_quick(s: float, exact: bool, p: FormatParams, mode: int) -> tuple[bool, float]:
    """``(True, s + tail rounded into p)`` where a shortcut gives :func:`round_exact`'s bits, else ``(False, 0)``.

    It applies to nearest-even and toward-zero targets below float64 precision with negative values and zero,
    ``s`` a normal float64, no overflow, a result that is a code (not an unsigned format's -0), and ``s`` either
    exact or not itself a midpoint (nearest-even) or point (toward zero) of the target grid. Every point and
    midpoint of the target grid is then a float64 number (the grid keeps at most 51 bits), so none lies strictly
    between the exact value and ``s`` (within half a float64 ulp of it): ``s`` rounds like the exact value, by
    ``rint`` / ``trunc`` of ``s`` scaled to the grid's integers. About 3 ns against 25 for the general path.
    """
    if p.mantissa_bits >= 52 or not (p.signed and p.zero):
        return False, 0.0
    ex = np.int64((f64_bits(s) >> np.uint64(52)) & np.uint64(0x7FF))
    if ex == 0 or ex == 0x7FF:
        return False, 0.0
    e: int | np.int64 = ex - 1023
    if e < p.emin:
        if not p.subnormals:
            return False, 0.0
        e = p.emin
    sh = p.mantissa_bits - e  # the grid's quantum is 2**-sh
    if sh > 1000 or sh < -1000:
        return False, 0.0
    y = s * _pow2(sh)  # exact: |y| < 2**52, a normal float64 or (far below the grid) a tiny one
    if mode == RoundingMode.NEAREST_EVEN:
        r = np.rint(y)
        if not exact and abs(y - r) == 0.5:
            return False, 0.0
    else:
        r = np.trunc(y)  # keeps the sign of zero
        if not exact and r == y:
            return False, 0.0
    r = r * _pow2(-sh)
    if abs(r) > p.max_value or (r == 0.0 and not p.neg_zero):
        return False, 0.0
    return True, r


@jit
def round_exact(s: float, d: int, p: FormatParams, mode: int, rbits: np.uint64) -> float:
    """Round the exact value ``s + tail`` into format ``p`` with rounding ``mode``, once.

    Args:
        s: float64 head of the exact value.
        d: the tail's class from :func:`sticky` (0 for a plain float64; +-1 strictly inside half an ulp of
            ``s``, +-2 exactly half an ulp). With ``s == 0`` a nonzero ``d`` means a value of that sign below
            2**-1075.
        p: the target format's :class:`FormatParams`.
        mode: a :class:`RoundingMode` value.
        rbits: 64 uniform random bits, used only by stochastic rounding.

    Returns:
        The rounded value as float64 (exactly representable in the format), NaN for NaN input and for overflow
        or infinity under a NaN policy.
    """
    if mode == RoundingMode.NEAREST_EVEN or mode == RoundingMode.TOWARD_ZERO:
        ok, quick = _round_quick(s, d == 0, p, mode)
        if ok:
            return quick
    if s != s:
        return s
    if not (p.signed and p.zero):  # a format without negative values or without zero: NaN for those
        if (s < 0.0 or (s == 0.0 and d < 0)) or (s == 0.0 and d == 0 and not p.zero):
            return np.nan
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
        e_val: int | np.int64 = np.int64(-1023)  # below every format's emin, so the target grid is its subnormal grid
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
        if mode == RoundingMode.NEAREST_EVEN:
            if half_cmp > 0 or (half_cmp == 0 and (kept & _ONE) == _ONE):
                kept += _ONE
        elif mode == RoundingMode.NEAREST_AWAY:
            if half_cmp >= 0:
                kept += _ONE
        elif mode == RoundingMode.UP:
            if not neg:
                kept += _ONE
        elif mode == RoundingMode.DOWN:
            if neg:
                kept += _ONE
        elif mode == RoundingMode.ODD:
            kept |= _ONE
        elif mode == RoundingMode.STOCHASTIC:
            # P(up) = rem / 2**shift, compared against 64 uniform bits; resolution 2**-64.
            if shift <= 64:
                thr = rem << np.uint64(64 - shift)
            elif shift < 128:
                thr = rem >> np.uint64(shift - 64)
            else:
                # P(up) < 2**-64: never. (A shift by >= 64 bits is undefined in LLVM and x86 takes the count
                # mod 64, which rounded e.g. 2.0**-207 up to bf16's smallest subnormal about once in 1000.)
                thr = _ZERO
            if rbits < thr:
                kept += _ONE
        # toward zero: truncation, nothing to add
    r: float = np.float64(kept) * _pow2(q)  # kept <= 2**53 and the product is representable: exact
    if r > p.max_value:
        return overflow_value(neg, p, mode)
    if not p.subnormals and r != 0.0 and r < _pow2(p.emin):
        r = 0.0  # flush-to-zero of subnormal results, as FTZ hardware does
    if r == 0.0 and not p.zero:
        r = _pow2(p.emin)  # no zero code: the smallest value is the nearest one in every mode
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


_CHUNK = 65536  # elements per parallel task; results never depend on it


@jit
def _round_chunk_exact(x, out, lo, p, mode, seed):
    """Elements lo.. of the flat input through :func:`round_exact` (stochastic rounding, and formats the bit
    kernel below does not cover); the stochastic bits are indexed by the flat position."""
    if mode == RoundingMode.STOCHASTIC:
        for i in range(x.size):
            rb = rand_bits(seed, np.uint64(lo + i))
            out[i] = quiet_nan(round_exact(np.float64(x[i]), 0, p, RoundingMode.STOCHASTIC, rb))
    else:
        for i in range(x.size):
            out[i] = quiet_nan(round_exact(np.float64(x[i]), 0, p, mode, _ZERO))


# -- fast kernel for the deterministic modes -----------------------------------------------------------------
# The same results as round_exact with d == 0 (the tests compare both with an exact oracle), computed on the
# input's own bit pattern, int32 for float32 inputs (8 lanes per AVX2 register) and int64 for float64, with
# selects only and the mode folded into per-mode constants, so that one loop serves every mode and LLVM
# vectorizes it.
#
# Target-normal range (|x| >= 2**emin): a positive float is E * 2**F + frac as an integer (F fraction bits),
# linear in the value within a binade and continuous across binades, so rounding that *integer* to a multiple
# of 2**base (base = F - m) rounds the value; a carry out of the fraction moves to the next binade, and past
# the largest finite value up to the bit pattern of infinity, which the overflow test catches. The input
# type's own subnormals are linear too.
#
# Target-subnormal range (|x| < 2**emin, when emin is above the input type's): the target's quantum is
# 2**(emin - m) for every x, so A = trunc(|x| * 2**(F - emin)) (exact: a power-of-two scaling, then an integer
# < 2**F) puts that quantum at bit ``base`` too, with the inexact low part folded into bit 0 as a sticky bit
# (base >= 2 keeps bit 0 strictly below the half-quantum bit, so every comparison with the half stays right).
# Rounding A, with lsb = 2**base: add a mode-dependent addend, then clear the low ``base`` bits, where
#   nearest-even: lsb/2 - 1 + (bit ``base`` of A)   nearest-away: lsb/2   toward zero: 0
#   up: lsb - 1 if x > 0 else 0   down: the mirror of up
#   odd: 0, then set bit ``base`` if the low bits were not all 0.


def _to_bits_impl(typingctx, x):
    width = {types.float32: 32, types.float64: 64}.get(x)
    if width is None:
        return None
    sig = (types.int32 if width == 32 else types.int64)(x)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(width))

    return sig, codegen


def _from_bits_impl(typingctx, b, like):
    if like not in (types.float32, types.float64) or not isinstance(b, types.Integer):
        return None
    width = like.bitwidth
    sig = like(b, like)

    def codegen(context, builder, signature, args):
        v = _resize(builder, args[0], signature.args[0].bitwidth, width)
        return builder.bitcast(v, ir.FloatType() if width == 32 else ir.DoubleType())

    return sig, codegen


def _narrow_impl(typingctx, v, like):
    if like not in (types.float32, types.float64) or not isinstance(v, types.Integer):
        return None
    width = like.bitwidth
    sig = (types.int32 if width == 32 else types.int64)(v, like)

    def codegen(context, builder, signature, args):
        return _resize(builder, args[0], signature.args[0].bitwidth, width)

    return sig, codegen


def _resize(builder, v, src: int, dst: int):
    if src > dst:
        return builder.trunc(v, ir.IntType(dst))
    if src < dst:
        return builder.sext(v, ir.IntType(dst))
    return v


_to_bits = intrinsic(_to_bits_impl)  # float32 -> int32, float64 -> int64 bit pattern
_from_bits = intrinsic(_from_bits_impl)  # integer bit pattern -> float of the type of ``like``
# numba computes integer arithmetic in 64 bits; truncating every intermediate back to the input's width lets
# LLVM narrow the float32 kernel to 32-bit lanes
_narrow = intrinsic(_narrow_impl)


class _BitParams(NamedTuple):
    """Constants of the fast kernel for one (format, input dtype, mode); integers are of the input's width."""

    keep: np.integer  # ~(lsb - 1): clears the dropped bits
    lsb: np.integer  # 2**base, base = F - m fraction bits dropped
    add0: np.integer  # rounding addend: add0 + (add_lsb if A & lsb) + (add_neg if x < 0 else add_pos)
    add_lsb: np.integer
    add_pos: np.integer
    add_neg: np.integer
    odd: np.integer  # lsb for round-to-odd, else 0: set when the dropped bits are not all 0
    abs_mask: np.integer  # all bits but the sign
    inf: np.integer  # bit pattern of +inf
    tiny_bits: np.integer  # bit pattern of 2**emin
    split_bits: np.integer  # tiny_bits if has_sub else 0: |x| below it takes the scaled formula
    max_bits: np.integer  # bit pattern of the largest finite value
    ovf_pos: np.integer  # what a positive / negative overflow gives (magnitude): inf, NaN or max
    ovf_neg: np.integer
    inf_out: np.integer  # what an infinite input gives (magnitude)
    quiet: np.integer  # the quiet-NaN bit: a NaN comes out quiet, sign and payload kept
    magic_bits: np.integer  # bits of 2**F: float(k) = from_bits(magic_bits + k) - 2**F for 0 <= k <= 2**F
    zero: np.integer
    has_sub: bool  # the target's subnormal range holds normal numbers of the input type
    tiny: np.floating  # 2**emin
    up: np.floating  # 2**(F - emin), of the input's float type
    down: np.floating  # 2**(emin - F)
    magic: np.floating  # 2**F
    neg_zero: bool
    ftz: bool  # subnormal results flush to zero
    ok: bool  # False: the format and mode need round_exact (the other fields are then placeholders)


@functools.lru_cache(maxsize=1024)
def _bit_params(f: FloatFormat, dtype: np.dtype, mode: int) -> _BitParams:
    """Constants of the fast kernel for inputs of ``dtype``; ``ok`` is False when round_exact must do it."""
    fi = np.finfo(dtype)
    frac = int(fi.nmant)
    base = frac - f.mantissa_bits
    has_sub = f.emin > int(fi.minexp)
    ok = not (
        mode == RoundingMode.STOCHASTIC
        or base < 2  # bit 0 must lie strictly below the half-quantum bit (it carries the sticky bit)
        or f.mantissa_bits == 0  # bit ``base`` would be the exponent's lowest bit, not the significand parity
        or not (f.signed and f.zero)  # unsigned or zero-less formats: NaN for negatives / zero (round_exact)
        or f.emin < int(fi.minexp)
        or f.emax >= int(fi.maxexp)
        or (has_sub and frac - f.emin >= int(fi.maxexp))  # 2**(F - emin) must be a finite input-type number
    )
    if not ok:
        return _placeholder(dtype)
    return _make_bit_params(f, dtype, mode, has_sub)


@functools.cache
def _placeholder(dtype: np.dtype) -> _BitParams:
    return _make_bit_params(_format("bfloat16"), dtype, 0, False)._replace(ok=False)


def _make_bit_params(f: FloatFormat, dtype: np.dtype, mode: int, has_sub: bool) -> _BitParams:
    fi = np.finfo(dtype)
    frac, ftype, itype = int(fi.nmant), dtype.type, (np.int32 if fi.bits == 32 else np.int64)
    base = frac - f.mantissa_bits
    scale = frac - f.emin if has_sub else 0

    def bits(v: float) -> int:
        return int(np.array(v, dtype=dtype).view(itype))

    lsb = 1 << base
    half = lsb >> 1
    add0, add_lsb, add_pos, add_neg, odd = {
        RoundingMode.NEAREST_EVEN: (half - 1, 1, 0, 0, 0),
        RoundingMode.NEAREST_AWAY: (half, 0, 0, 0, 0),
        RoundingMode.TOWARD_ZERO: (0, 0, 0, 0, 0),
        RoundingMode.UP: (0, 0, lsb - 1, 0, 0),
        RoundingMode.DOWN: (0, 0, 0, lsb - 1, 0),
        RoundingMode.ODD: (0, 0, 0, 0, lsb),
    }[RoundingMode(mode)]
    inf, max_bits = bits(np.inf), bits(f.max)
    policy = {"inf": inf, "nan": bits(np.nan), "saturate": max_bits}[f.overflow]
    # IEEE: overflow gives infinity (here: the policy's value) in the nearest modes and when rounding away
    # from zero, the largest finite value when rounding toward zero (and round-to-odd never overflows)
    away_pos = mode in (RoundingMode.NEAREST_EVEN, RoundingMode.NEAREST_AWAY, RoundingMode.UP)
    away_neg = mode in (RoundingMode.NEAREST_EVEN, RoundingMode.NEAREST_AWAY, RoundingMode.DOWN)
    i = itype
    return _BitParams(
        i(~(lsb - 1)), i(lsb), i(add0), i(add_lsb), i(add_pos), i(add_neg), i(odd),
        i((1 << (fi.bits - 1)) - 1), i(inf), i(bits(f.tiny)), i(bits(f.tiny) if has_sub else 0), i(max_bits),
        i(policy if away_pos else max_bits), i(policy if away_neg else max_bits),
        i(inf if f.has_infinity else policy), i(1 << (frac - 1)), i(bits(2.0**frac)), i(0), has_sub, ftype(f.tiny),
        ftype(2.0**scale), ftype(2.0**-scale), ftype(2.0**frac), f.has_negative_zero, not f.subnormals, True,
    )  # fmt: skip


@jit
def _round_normal(x, c):
    """``x`` rounded into the format and deterministic mode described by ``c``, when ``|x| >= 2**emin`` or
    the format's emin is the input type's (then the bit formula covers everything); other ``x`` come back
    unchanged (:func:`_round_any` rounds those). Specials and overflow included."""
    u = _to_bits(x)
    a = _narrow(u & c.abs_mask, x)
    s = _narrow(u ^ a, x)
    neg = s != 0
    add = c.add0 + (0 if (a & c.lsb) == 0 else c.add_lsb) + (c.add_neg if neg else c.add_pos)
    r = _narrow(((a + add) & c.keep) | (0 if (a & ~c.keep) == 0 else c.odd), x)
    if r > c.max_bits:
        r = c.ovf_neg if neg else c.ovf_pos
    if c.ftz and r < c.tiny_bits:
        r = c.zero
    if a >= c.inf:
        r = _narrow(a | c.quiet, x) if a > c.inf else c.inf_out  # NaN: quiet, payload kept; inf: the policy
    if r == 0 and not c.neg_zero:
        s = c.zero
    return x if a < c.split_bits else _from_bits(r | s, x)


@jit
def _round_any(x, c):
    """``x`` rounded as :func:`_round_normal` does, for every ``x`` also where the format's emin is above the
    input type's: both integers to round (the bit pattern, and for ``|x| < 2**emin`` the scaled
    ``trunc(|x| * 2**(F - emin))`` with its sticky bit) are computed and one is selected, so that one rounding
    step, branch-free, serves both and the loop over elements vectorizes in a single pass."""
    u = _to_bits(x)
    a0 = _narrow(u & c.abs_mask, x)
    s = _narrow(u ^ a0, x)
    neg = s != 0
    small = a0 < c.split_bits
    y = abs(x) * c.up  # garbage (possibly inf or NaN) where not small: not selected
    t = np.trunc(y)
    k = _narrow(_to_bits(t + c.magic) - c.magic_bits, x)  # int(t), exact for t < 2**F
    a_small = _narrow(k | (0 if t == y else 1), x)  # the sticky bit: x was not a multiple of 2**(emin - F)
    a = a_small if small else a0
    add = c.add0 + (0 if (a & c.lsb) == 0 else c.add_lsb) + (c.add_neg if neg else c.add_pos)
    r = _narrow(((a + add) & c.keep) | (0 if (a & ~c.keep) == 0 else c.odd), x)
    r_small = _narrow(_to_bits((_from_bits(r + c.magic_bits, x) - c.magic) * c.down), x)  # r * 2**(emin - F)
    if r > c.max_bits:
        r = c.ovf_neg if neg else c.ovf_pos
    r = r_small if small else r
    if c.ftz and r < c.tiny_bits:
        r = c.zero
    if a0 >= c.inf:
        r = _narrow(a0 | c.quiet, x) if a0 > c.inf else c.inf_out  # NaN: quiet, payload kept; inf: the policy
    if r == 0 and not c.neg_zero:
        s = c.zero
    return _from_bits(r | s, x)


@jit
def _pass_normal(x, out, c):
    for i in range(x.size):
        out[i] = _round_normal(x[i], c)


@jit
def _pass_any(x, out, c):
    for i in range(x.size):
        out[i] = _round_any(x[i], c)


@jit
def _round_chunk_bits(x, out, c):
    """Round a contiguous chunk (``out`` may be ``x``). Values below 2**emin (target subnormals, zeros)
    need the second formula only where emin is above the input type's."""
    if c.has_sub:
        _pass_any(x, out, c)
    else:
        _pass_normal(x, out, c)


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


def resolve_format(fmt: str | FloatFormat) -> FloatFormat:
    """The format named by ``fmt`` (every FloatFormat lies within float64's range, which simfloat computes in)."""
    return _format(fmt)


def fits_float32(f: FloatFormat) -> bool:
    """Whether every value of ``f`` is a float32 (precision, exponent range and smallest quantum all fit)."""
    return f.precision <= 24 and f.emax <= 127 and f.emin - f.mantissa_bits >= -149


# -- real-number inputs (shared with simfloat.ops) -----------------------------------------------------------
_F64_MAX = float(np.finfo(np.float64).max)
_FLOAT64_EXACT = frozenset({float, np.float64, np.float32, np.float16})  # scalar types float64 holds exactly
#: ml_dtypes' floating types (by dtype name; ml_dtypes itself is never imported): every value is a float32.
_NARROW_PREFIXES = ("bfloat16", "float8_", "float6_", "float4_")


def narrow_float(dtype: np.dtype) -> bool:
    """float16 or an ml_dtypes floating dtype (bfloat16, float8_*, float6_*, float4_*): widens exactly to
    float32. Recognized by the dtype's module and name, so ml_dtypes is not imported for it."""
    if dtype == np.float16:
        return True
    return dtype.type.__module__.partition(".")[0] == "ml_dtypes" and dtype.name.startswith(_NARROW_PREFIXES)


class _Inexact(NamedTuple):
    """An input number float64 cannot hold: flat position, the number, and its exact split for round_exact."""

    index: int  # type: ignore[assignment]  # a field named like tuple.index
    value: object
    tail: int  # the class of value - head, as sticky() gives it (+-1 inside half an ulp, +-2 exactly half)
    beyond: bool  # |value| >= 2**1024 - 2**970: overflows every format (head is then +-float64 max)


def _split_rational(n: int, den: int) -> tuple[float, int, bool]:
    """``n/den`` (``den > 0``) as (head, tail class, beyond float64's range): the head is the nearest float64
    (ties to even) and the tail class that of the exact rest ``n/den - head`` (see :func:`sticky`)."""
    try:
        head = n / den  # Python's int true division is correctly rounded, subnormal results included
    except OverflowError:
        return (-_F64_MAX if n < 0 else _F64_MAX), 0, True
    rest = Fraction(n, den) - Fraction(head)
    if rest == 0:
        return head, 0, False
    mag = abs(head)
    expo = math.frexp(mag)[1] - 1 if mag >= 2.0**-1022 else -1022  # ulp(head) = 2**(expo - 52)
    cls = 2 if abs(rest) == Fraction(2) ** (expo - 53) else 1
    return head, (cls if rest > 0 else -cls), False


def _bad_type(name: str, v: object) -> TypeError:
    what = "a bool" if isinstance(v, (bool, np.bool_)) else type(v).__name__
    return TypeError(
        f"{name} must be a float32 or float64 array or real numbers (Python or NumPy ints and floats, "
        f"Fractions, lists of them), got {what}"
    )


def _split_number(name: str, v: object) -> tuple[float, int, bool]:
    """One real number as (float64 head, tail class, beyond float64's range); exact for every accepted type."""
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v[()]
    if isinstance(v, (bool, np.bool_)):
        raise _bad_type(name, v)
    if isinstance(v, (float, np.float16, np.float32, np.float64)):
        return float(v), 0, False
    if isinstance(v, np.generic) and narrow_float(v.dtype):  # an ml_dtypes scalar (bfloat16, float8_*, ...)
        return float(v), 0, False
    if isinstance(v, np.floating):  # long double
        if v == 0 or not np.isfinite(v):
            return float(v), 0, False  # signed zeros, infinities and NaN are float64 numbers
        return _split_rational(*v.as_integer_ratio())
    if isinstance(v, numbers.Integral):  # int, NumPy integers
        return _split_rational(int(v), 1)
    if isinstance(v, numbers.Rational):  # Fraction
        return _split_rational(int(v.numerator), int(v.denominator))
    raise _bad_type(name, v)


def real_input(name: str, x: object) -> tuple[np.ndarray, list[_Inexact], bool | None]:
    """Validate an array or real-number argument: ``(values, inexact, is_float32)``.

    ``values`` is ``x`` itself for a float32/float64 array, a 0-d array of its dtype for a NumPy float32/float64
    scalar, else a float64 array of the numbers (the nearest float64 where float64 cannot hold one: those are
    listed in ``inexact``). ``is_float32`` is None for Python numbers and lists, which do not vote on the dtype.
    """
    if isinstance(x, np.ndarray):
        if narrow_float(x.dtype):  # float16 / ml_dtypes: exactly float32 numbers, so taken as float32
            with np.errstate(invalid="ignore"):
                return x.astype(np.float32), [], True
        if x.dtype not in (np.float32, np.float64):
            raise TypeError(
                f"{name} must have dtype float32 or float64 (or float16, or an ml_dtypes bfloat16, "
                f"float8_*, float6_* or float4_* dtype, widened exactly to float32), got {x.dtype}"
            )
        return x, [], x.dtype == np.float32
    if isinstance(x, (np.float32, np.float64)):
        return np.asarray(x), [], isinstance(x, np.float32)
    if isinstance(x, (list, tuple)):
        obj = np.asarray(x, dtype=object)
        items, shape = obj.reshape(-1).tolist(), obj.shape
    else:
        items, shape = [x], ()
    if set(map(type, items)) <= _FLOAT64_EXACT:
        with np.errstate(invalid="ignore"):  # converting a signalling NaN quiets it
            return np.array(items, dtype=np.float64).reshape(shape), [], None
    heads = np.empty(len(items))
    inexact = []
    for i, v in enumerate(items):
        heads[i], tail, beyond = _split_number(name, v)
        if tail or beyond:
            inexact.append(_Inexact(i, v, tail, beyond))
    return heads.reshape(shape), inexact, None


def checked_seed(seed: int | None) -> np.uint64:
    if seed is None:
        return np.uint64(int.from_bytes(os.urandom(8), "little"))
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
    return np.uint64(int(seed) % (1 << 64))


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
