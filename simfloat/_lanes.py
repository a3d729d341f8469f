"""Branch-free rounding of exact results, for loops that LLVM vectorizes across independent outputs.

:func:`simfloat.rounding.round_exact` decides every case with branches; a loop calling it runs one element at a
time. The functions here give the same bits with selects only, for the formats and modes where that is possible
(:attr:`Lane.fast`): every mode but stochastic, formats whose scaling constants are normal float64 numbers and
whose precision leaves float64 two spare bits (mantissa_bits <= 50). float64 itself under round-to-nearest-even is
:attr:`Lane.native`: the float64 operation's own result is the answer. Callers check ``fast`` (or ``native``)
once per loop and use the general scalar path otherwise.

How: a float64 ``x`` with ``e = clamp(floor(log2 |x|), emin, emax + 1)`` is scaled by ``2**(m - e)`` (exact),
rounded to an integer by ``trunc / ceil / floor`` (or the away / odd rules) and scaled back; nearest-even is
``(x + M) - M`` with ``M = 1.5 * 2**(e - m + 52)``, whose ulp is the target's quantum (the hardware's own
ties-to-even addition does the rounding), with the sign of x restored for zero results; overflow,
infinite inputs, flush-to-zero and the sign of zero are selects. Exponents are handled as powers of two in
float64 (``2**e`` is ``x`` with its fraction bits masked off), never as integers: AVX2 has no vector
conversion between int64 and float64, so integer exponents would keep these loops scalar.

An exact value given as ``s + e`` (TwoSum, TwoProduct) is first folded into one float64 rounded to odd, which
then rounds like the exact value in every mode because the target keeps at most 51 bits (round-to-odd double
rounding).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from simfloat._jit import bits_f64, f64_bits, fma64, ljit
from simfloat.formats import FloatFormat
from simfloat.rounding import RoundingMode, overflow_value

__all__ = [
    "LIBM_ULPS",
    "Lane",
    "lane",
    "lane_of",
    "libm_unsure",
    "ladd",
    "ldiv",
    "lfma",
    "lmul",
    "lround",
    "lround_exact",
    "lround_exact_ne",
    "lround_exact_f32",
    "lround_f32",
    "ladd_f32",
    "lmul_f32",
    "lfma_f32",
    "ldiv_f32",
    "ladd_ne",
    "lmul_ne",
    "lfma_ne",
    "ldiv_ne",
    "lround_ne",
    "lround_rz",
    "lround_rz_f32",
    "rz_f32",
    "pow2_of",
    "recip_pow2",
    "ro_fold",
]

_B52 = np.uint64(52)
_ONE = np.uint64(1)
_EXP_MASK = np.uint64(0x7FF0000000000000)
_RECIP = np.uint64(2046) << _B52
_LANE_MODES = frozenset(m for m in RoundingMode if m != RoundingMode.STOCHASTIC)  # the modes with a fast lane


class Lane(NamedTuple):
    """A format and a rounding mode as the branch-free kernels need them (see :func:`lane`)."""

    fast: bool  # the branch-free functions give round_exact's bits (native lanes included)
    native: bool  # float64 with nearest-even: the float64 result needs no rounding
    m: int  # mantissa bits
    emin: int
    top: float  # 2**(emax + 1): larger values overflow whatever the rounding
    two_m: float  # 2**m
    two_neg_m: float  # 2**-m
    magic: float  # 1.5 * 2**(52 - m): nearest-even rounding as (x + M) - M with M = magic * 2**e
    mode: int
    max_value: float
    ovf_pos: float  # what a finite value beyond the format becomes
    ovf_neg: float
    inf_pos: float  # what +-inf becomes
    inf_neg: float
    ftz: bool  # no subnormals: results below 2**emin flush to zero
    tiny: float
    unsigned_zero: bool  # no -0 code
    f32: bool  # IEEE float32 under nearest-even: the hardware's own conversion to float32 rounds (see lround_f32)


@ljit
def lane_of(r):
    """The lane ``r`` as a :class:`Lane` value: a loop over arrays then keeps its numbers in registers. A lane
    passed in a numpy record (:func:`simfloat._jit.record_of`) is read from memory, and the compiler, unable to
    tell it from the arrays the loop writes, would read it again at every element (and not vectorize)."""
    return Lane(
        r.fast,
        r.native,
        r.m,
        r.emin,
        r.top,
        r.two_m,
        r.two_neg_m,
        r.magic,
        r.mode,
        r.max_value,
        r.ovf_pos,
        r.ovf_neg,
        r.inf_pos,
        r.inf_neg,
        r.ftz,
        r.tiny,
        r.unsigned_zero,
        r.f32,
    )


@functools.cache
def lane(fmt: FloatFormat, mode: int) -> Lane:
    """The :class:`Lane` record of ``fmt`` under rounding ``mode`` (a :class:`~simfloat.rounding.RoundingMode` or
    its value); made once per (format, mode)."""
    p = fmt.params
    m, emin, emax = fmt.mantissa_bits, fmt.emin, fmt.emax
    native = m == 52 and emin == -1022 and mode == RoundingMode.NEAREST_EVEN and p.has_inf
    fast = native or (
        fmt.signed
        and fmt.zero  # unsigned / zero-less formats (block scales) take round_exact's NaN rules
        and m <= 50
        and mode in _LANE_MODES
        and emin - m >= -1022
        and m - emin <= 1023
        and emax + 1 - m <= 1023
        and m - emax - 1 >= -1022
        and emax + 1 + 53 - m <= 1023  # the nearest-even constant 1.5 * 2**(emax + 1 - m + 52) is finite
    )
    if p.has_inf:
        inf_pos, inf_neg = np.inf, -np.inf
    elif p.overflow == 1:
        inf_pos = inf_neg = np.nan
    else:
        inf_pos, inf_neg = p.max_value, -p.max_value
    return Lane(
        bool(fast),
        bool(native),
        m,
        emin,
        float(2.0 ** min(emax + 1, 1023)),
        float(2.0**m),
        float(2.0**-m),
        float(1.5 * 2.0 ** (52 - m)),
        int(mode),
        p.max_value,
        float(overflow_value(False, p, int(mode))),
        float(overflow_value(True, p, int(mode))),
        inf_pos,
        inf_neg,
        not p.subnormals,
        float(2.0**emin),
        not p.neg_zero,
        bool(
            fast
            and mode == RoundingMode.NEAREST_EVEN
            and (m, emin, emax) == (23, -126, 127)
            and p.subnormals
            and p.has_inf
            and p.neg_zero
            and fmt.signed
        ),
    )


@ljit
def _pow2(k):
    """2**k for -1022 <= k <= 1023, from bits."""
    return bits_f64(np.uint64(k + 1023) << _B52)


@ljit
def pow2_of(x):
    """2**floor(log2 |x|) for a normal float64 x: x with its sign and fraction cleared (0 for zeros and float64
    subnormals, inf for inf and NaN)."""
    return bits_f64(f64_bits(x) & _EXP_MASK)


@ljit
def recip_pow2(p):
    """1 / p for a power of two p whose reciprocal is a normal float64, by integer subtraction of bits (cheaper
    than a division, which has no fast vector form)."""
    return bits_f64(_RECIP - f64_bits(p))


#: a libm result this close to a rounding boundary of a lane's format (in its own float64 ulps) is not trusted:
#: glibc's exp and exp2 are within 1 ulp, and which variant runs depends on the CPU (with or without FMA)
LIBM_ULPS = 4
_ABS_MASK = np.uint64(0x7FFFFFFFFFFFFFFF)


@ljit
def libm_unsure(y, r):
    """Whether rounding ``y``, a libm result within 1 float64 ulp of the true value, into the lane's format may
    give another value than rounding the true value: ``y`` is within :data:`LIBM_ULPS` of its ulps of a rounding
    boundary of the format (a midpoint under the nearest modes, a value of the format under the directed ones),
    or outside the range where that test holds (0, float64 subnormals, inf, NaN, below a flushing format's
    smallest normal). Then the caller computes the correctly rounded value (``simfloat.ops``' scalar path), so
    the result does not depend on the CPU's libm. Native lanes keep the libm value and are never unsure."""
    if r.native:
        return False
    b = f64_bits(y) & _ABS_MASK
    be = np.int64(b >> _B52)
    if be == 0 or be == 0x7FF:
        return True
    e = be - 1023
    if r.ftz and e < r.emin:
        return True
    k = 52 - r.m + max(0, r.emin - e)  # the bits of y's significand the rounding discards
    if k > 52:
        return True
    low = np.int64(b & ((np.uint64(1) << np.uint64(k)) - np.uint64(1)))
    if r.mode == RoundingMode.NEAREST_EVEN or r.mode == RoundingMode.NEAREST_AWAY:
        d = np.abs(low - (np.int64(1) << np.int64(k - 1)))
    else:
        d = min(low, (np.int64(1) << np.int64(k)) - low)
    return d <= LIBM_ULPS


@ljit
def _finish(v, x, r):
    """``v``, the rounding of ``x`` to the format's grid, with the format's rules applied as selects: native
    lanes keep x; overflow, flush-to-zero, unsigned zero and infinite inputs."""
    v = x if r.native else v
    av = np.abs(v)
    ovf = r.ovf_neg if v < 0.0 else r.ovf_pos
    v = ovf if av > r.max_value else v
    flushed = v * 0.0
    v = flushed if r.ftz & (av < r.tiny) else v
    v = v + 0.0 if r.unsigned_zero else v
    inf = r.inf_neg if x < 0.0 else r.inf_pos
    return inf if (np.abs(x) == np.inf) & (not r.native) else v


@ljit
def lround(x, r):
    """``x`` rounded into the lane's format and mode: round_exact(x, 0, ...) for ``r.fast`` lanes.

    Straight-line code: every mode's candidate is computed and the lane's is selected (a branch on the mode
    inside a loop would keep LLVM from vectorizing it)."""
    big = min(max(pow2_of(x), r.tiny), r.top)  # 2**e, e = clamp(floor(log2 |x|), emin, emax + 1)
    mg = big * r.magic
    t_ne = np.copysign((x + mg) - mg, x)  # nearest-even: M = 1.5 * 2**(e - m + 52) has ulp 2**(e - m)
    y = x * (r.two_m * recip_pow2(big))  # exact: the quotient of two powers of two is a normal float64
    t0 = np.trunc(y)
    sgn = np.copysign(1.0, y)
    h = t0 * 0.5
    away = t0 + sgn if np.abs(y) - np.abs(t0) >= 0.5 else t0  # |y| - trunc|y| is exact
    odd = t0 + sgn if (t0 != y) & (h == np.trunc(h)) else t0  # truncate, then make the last bit 1 if inexact
    mode = r.mode
    t = t0  # toward zero
    t = np.ceil(y) if mode == RoundingMode.UP else t
    t = np.floor(y) if mode == RoundingMode.DOWN else t
    t = away if mode == RoundingMode.NEAREST_AWAY else t
    t = odd if mode == RoundingMode.ODD else t
    v = t * (big * r.two_neg_m)
    v = t_ne if mode == RoundingMode.NEAREST_EVEN else v
    return _finish(v, x, r)


@ljit
def lround_ne(x, r):
    """:func:`lround` for a lane whose mode is nearest-even (fewer operations: callers dispatch on the mode
    outside their loops)."""
    big = min(max(pow2_of(x), r.tiny), r.top)
    mg = big * r.magic
    v = np.copysign((x + mg) - mg, x)
    return _finish(v, x, r)


@ljit
def lround_rz(x, r):
    """:func:`lround` for a lane whose mode is toward zero (fewer operations: callers dispatch on the mode
    outside their loops)."""
    big = min(max(pow2_of(x), r.tiny), r.top)
    v = np.trunc(x * (r.two_m * recip_pow2(big))) * (big * r.two_neg_m)
    return _finish(v, x, r)


_HIGH35 = np.uint64(((1 << 64) - 1) ^ ((1 << 29) - 1))  # a float64 less its fraction bits below float32's 23
_F32_MAX = float(np.finfo(np.float32).max)


@ljit
def rz_f32(r):
    """Whether the lane is IEEE float32 (subnormals, inf, -0) rounding toward zero: :func:`lround_rz_f32` gives
    its bits."""
    return (
        r.fast
        and not r.native
        and r.mode == RoundingMode.TOWARD_ZERO
        and r.m == 23
        and r.emin == -126
        and r.top == 2.0**128
        and r.max_value == _F32_MAX
        and not r.ftz
        and not r.unsigned_zero
        and r.ovf_pos == _F32_MAX
        and r.ovf_neg == -_F32_MAX
        and r.inf_pos == np.inf
        and r.inf_neg == -np.inf
    )


@ljit
def lround_rz_f32(x):
    """:func:`lround_rz` for a lane of which :func:`rz_f32` holds, in fewer operations: in float32's normal range
    the rounding clears the float64 fraction bits below float32's 23 (an integer and), below it truncates to a
    multiple of 2**-149; beyond float32's largest value the largest (toward zero), inf and NaN as they are."""
    ax = np.abs(x)
    v = bits_f64(f64_bits(x) & _HIGH35)
    v = v if ax >= 2.0**-126 else np.trunc(x * 2.0**149) * 2.0**-149
    v = np.copysign(_F32_MAX, x) if ax > _F32_MAX else v
    return x if (ax == np.inf) | (x != x) else v


@ljit
def ro_fold(s, e):
    """The exact value ``s + e`` (``|e| <= ulp(s) / 2``) rounded to odd at float64 precision."""
    b = f64_bits(s)
    up = (e > 0.0) == (s > 0.0)
    nb = b + _ONE if up else b - _ONE
    return bits_f64(nb) if (e != 0.0) & ((b & _ONE) == np.uint64(0)) else s


@ljit
def add_tail(a, b, s):
    """The exact ``a + b - s`` for ``s = fl(a + b)`` (TwoSum); 0 for an infinite sum (its rounding is that of
    inf; NaN tails are NaN anyway)."""
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return 0.0 if np.abs(s) == np.inf else e


@ljit
def mul_tail(a, b, p):
    """The exact ``a * b - p`` for ``p = fl(a * b)`` (the FMA residual); 0 for infinite or zero products."""
    e = fma64(a, b, -p)
    return 0.0 if (np.abs(p) == np.inf) | (p == 0.0) else e


@ljit
def div_tail(a, b, q):
    """A value whose sign is that of ``a / b - q`` for ``q = fl(a / b)`` (the residual ``a - q*b``, exact, with
    b's sign folded in; the quotient is never exactly half an ulp from q), 0 when q is exact or not finite."""
    res = fma64(-q, b, a)
    return 0.0 if (res == 0.0) | (np.abs(q) == np.inf) | (q == 0.0) | (q != q) else (res if b > 0.0 else -res)


@ljit
def lround_exact(s, e, r):
    """The exact value ``s + e`` (``s = fl(s + e)``) rounded once: round_exact(s, sticky(s, e), ...)."""
    if r.native:
        return s
    return lround(ro_fold(s, e), r)


@ljit
def ladd(a, b, r):
    """round(a + b), one rounding (TwoSum). An exact zero sum is +0 but under rounding down, where IEEE 754 makes
    it -0: there the sum is formed as ``-((-a) + (-b))``, the same value otherwise (round-to-nearest is
    symmetric), a select rather than a branch."""
    s = a + b
    s = -((-a) + (-b)) if r.mode == RoundingMode.DOWN else s
    return lround_exact(s, add_tail(a, b, s), r)


@ljit
def lmul(a, b, r):
    """round(a * b), one rounding (the FMA residual is the product's exact tail)."""
    p = a * b
    return lround_exact(p, mul_tail(a, b, p), r)


@ljit
def lfma(a, b, c, r):
    """round(a * b + c), one rounding, for operands whose product is exact in float64 (<= 26-bit significands,
    e.g. any float32 values): the caller guarantees it."""
    return ladd(a * b, c, r)


@ljit
def ldiv(a, b, r):
    """round(a / b): the sign of the exact residual ``a - q*b`` says on which side of ``q`` the quotient lies
    (never exactly half an ulp away)."""
    q = a / b
    return lround_exact(q, div_tail(a, b, q), r)


# -- the same for nearest-even lanes (callers dispatch on the mode outside their loops) -------------------------


@ljit
def lround_f32(x):
    """:func:`lround_ne` for an IEEE float32 lane (``Lane.f32``): the hardware's float64 -> float32 conversion
    rounds (nearest-even, gradual underflow, overflow to inf: the format's own rules); a NaN stays that NaN,
    quieted. Callers dispatch on ``r.f32`` outside their loops."""
    return np.float64(np.float32(x)) if x == x else x + 0.0


@ljit
def lround_exact_f32(s, e):
    """:func:`lround_exact_ne` for an IEEE float32 lane: round-to-odd at float64 precision, then the hardware's
    conversion (53 >= 24 + 2 bits: the double rounding is exact)."""
    return lround_f32(ro_fold(s, e))


@ljit
def ladd_f32(a, b):
    """:func:`ladd` for an IEEE float32 lane with nearest-even."""
    s = a + b
    return lround_exact_f32(s, add_tail(a, b, s))


@ljit
def lmul_f32(a, b):
    """:func:`lmul` for an IEEE float32 lane with nearest-even."""
    p = a * b
    return lround_exact_f32(p, mul_tail(a, b, p))


@ljit
def lfma_f32(a, b, c):
    """:func:`lfma` for an IEEE float32 lane with nearest-even."""
    return ladd_f32(a * b, c)


@ljit
def ldiv_f32(a, b):
    """:func:`ldiv` for an IEEE float32 lane with nearest-even."""
    q = a / b
    return lround_exact_f32(q, div_tail(a, b, q))


@ljit
def lround_exact_ne(s, e, r):
    """:func:`lround_exact` for a nearest-even lane."""
    if r.native:
        return s
    return lround_ne(ro_fold(s, e), r)


@ljit
def ladd_ne(a, b, r):
    """:func:`ladd` for a nearest-even lane."""
    s = a + b
    return lround_exact_ne(s, add_tail(a, b, s), r)


@ljit
def lmul_ne(a, b, r):
    """:func:`lmul` for a nearest-even lane."""
    p = a * b
    return lround_exact_ne(p, mul_tail(a, b, p), r)


@ljit
def lfma_ne(a, b, c, r):
    """:func:`lfma` for a nearest-even lane."""
    return ladd_ne(a * b, c, r)


@ljit
def ldiv_ne(a, b, r):
    """:func:`ldiv` for a nearest-even lane."""
    q = a / b
    return lround_exact_ne(q, div_tail(a, b, q), r)
