"""The scalar worker every layer builds on: :func:`round_exact` rounds a value given exactly as ``s + tail`` into a
format, in every mode (how: the package docstring of :mod:`simfloat.rounding`); :func:`round_scalar` rounds one
float64; the helpers its callers share (:func:`sticky`, :func:`overflow_value`, :func:`quiet_nan`) and the
counter-based random bits of stochastic rounding (:func:`rand_bits`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from simfloat._jit import bits_f64, f64_bits, jit
from simfloat.formats import FormatParams
from simfloat.rounding._modes import RoundingMode

_SIGN = np.uint64(1 << 63)
_FRAC_MASK = np.uint64((1 << 52) - 1)
_HIDDEN = np.uint64(1 << 52)
_ONE = np.uint64(1)
_ZERO = np.uint64(0)
# 0 typed int64, not the literal 0: round_exact (and what takes a tail or an exponent) compiles once for its callers
TAIL0: Any = np.int64(0)
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
    return round_exact(x, TAIL0, p, mode, rbits)


@jit
def rand_bits(seed: np.uint64, counter: np.uint64) -> np.uint64:
    """64 random bits for element ``counter`` of a stream: splitmix64 of ``seed + counter * golden``.

    Counter-based, so stochastic rounding gives the same bits whatever the thread count or chunking.
    """
    z = seed + (counter + _ONE) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))
