"""njit scalar workers for the basic operations, each rounding its exact result once.

Every worker has the signature ``op(operands..., p, mode, rbits) -> float`` with ``p`` a
:class:`~simfloat.formats.FormatParams`, ``mode`` a :class:`~simfloat.rounding.RoundingMode` value and
``rbits`` 64 random bits (read by stochastic rounding only). Operands are float64 values (any float32 value is
one); the result is the exact real result of the operation on them, rounded once into the format and returned
as float64.

How: an error-free transformation gives the exact result as a float64 head ``s`` plus the class ``d`` of the
tail (see :func:`simfloat.rounding.sticky`), and :func:`simfloat.rounding.round_exact` rounds ``s + tail``
once. When a residual would underflow or a head would overflow in float64, the operands are first scaled by
powers of two (exact), the result is formed at the scaled exponent and :func:`round_scaled` brings it back
exactly, so the float64 exponent range never limits exactness. One documented limit remains: stochastic
rounding of an exact value beyond float64's largest finite number (only reachable for float64-range formats)
always overflows instead of rounding down to the largest finite value with some probability.
"""

from __future__ import annotations

import math

import numpy as np

from simfloat._eft import exponent, next_away, pow2, scale, split, two_prod, two_sum
from simfloat._jit import f64_bits, fma64, jit
from simfloat.formats import FormatParams
from simfloat.rounding import RoundingMode, overflow_value, round_exact, sticky
from simfloat.rounding._exact import TAIL0

__all__ = [
    "round_scaled",
    "overflow_value",
    "add_scalar",
    "sub_scalar",
    "mul_scalar",
    "div_scalar",
    "fma_scalar",
    "sqrt_scalar",
    "maximum_scalar",
    "max2",
]

_DBL_MAX = np.finfo(np.float64).max
_SIGN = np.uint64(1 << 63)
_FRAC = np.uint64((1 << 52) - 1)
_SAFE_LO = 2.0**-960  # at or above: products, quotients and square roots have exact float64 residuals
_FMA_HUGE = 2.0**1000  # at or above: the three-term sum of fma could overflow in float64
_TINY_C = 2.0**-900  # an addend of fma at or above this dwarfs a product below _SAFE_LO
_NEGLIGIBLE = 2.0**-800


@jit
def round_scaled(h: float, d: int, k: int | np.int64, p: FormatParams, mode: int, rbits: np.uint64) -> float:
    """Round the exact value ``(h + tail) * 2**k`` once, where ``d`` classifies ``tail`` against ``ulp(h)`` as
    :func:`~simfloat.rounding.sticky` does and ``h`` is finite, nonzero unless ``d == 0``, and ``h`` came from
    a round-to-nearest (so a negative tail below a power of two is at most a quarter ulp). ``|k| <= 2200``.

    Results below float64's normal range are formed at float64's subnormal grid with the exact tail class;
    results at or beyond 2**1024 are overflows.
    """
    if k == 0 or h == 0.0:
        return round_exact(h, d, p, mode, rbits)
    eh = exponent(h)
    big_e = eh + k
    if big_e >= 1024:
        return overflow_value(h < 0.0, p, mode)
    if big_e >= -1022:
        return round_exact(scale(h, k), d, p, mode, rbits)  # exact: a normal result of a power-of-two scaling
    if big_e < -1076:  # |value| < 2**-1076 * (1 + 2**-53) < 2**-1075: below half the smallest subnormal
        return round_exact(0.0 if h > 0.0 else -0.0, 1 if h > 0.0 else -1, p, mode, rbits)
    # Subnormal result: hn in [1, 2), value = (hn + tail') * 2**big_e with tail' classified by d against
    # ulp(hn).
    hn = scale(h, -eh)
    s = (hn * pow2(big_e + 100)) * pow2(-100)  # RN(hn * 2**big_e): the first product is exact
    r1 = hn - (s * pow2(100)) * pow2(-big_e - 100)  # exact: a multiple of ulp(hn) with |r1| <= half below
    half = pow2(-1075 - big_e)  # half of the subnormal quantum 2**-1074, in units of hn (a multiple of ulp(hn))
    if r1 == 0.0:
        dd = 0 if d == 0 else (1 if d > 0 else -1)
    elif abs(r1) < half:
        dd = 1 if r1 > 0.0 else -1  # |r1| <= half - ulp(hn) and |tail'| <= ulp(hn)/2: strictly inside
    else:  # |r1| == half: s came from a tie
        sg = 1 if r1 > 0.0 else -1
        if d == 0:
            dd = 2 * sg
        elif (d > 0) == (sg > 0):  # beyond the midpoint: the nearest neighbour is the next subnormal
            s = next_away(s, sg)
            dd = -sg
        else:
            dd = sg
    return round_exact(s, dd, p, mode, rbits)


@jit
def _zero_sum(a: float, b: float, mode: int) -> float:
    """The signed zero an exactly-zero sum ``a + b`` gets: IEEE says +0 in every mode but roundTowardNegative
    (-0); a sum of two zeros of one sign keeps that sign. RN hardware addition gives all but the RD rule."""
    if mode == RoundingMode.DOWN:
        return -((-a) + (-b))
    return a + b


@jit
def add_scalar(a: float, b: float, p: FormatParams, mode: int, rbits: np.uint64) -> float:
    """``a + b`` rounded once into ``p``. IEEE special values: inf - inf is NaN; an exact zero sum is +0 (-0
    when rounding down), -0 + -0 is -0."""
    s = a + b
    if not abs(s) <= _DBL_MAX:
        if abs(a) <= _DBL_MAX and abs(b) <= _DBL_MAX:  # both finite: the exact sum is beyond float64's range
            return overflow_value(s < 0.0, p, mode)
        return round_exact(s, TAIL0, p, mode, rbits)  # NaN or an infinite operand: IEEE's result is exact
    if s == 0.0:
        return round_exact(_zero_sum(a, b, mode), TAIL0, p, mode, rbits)
    if abs(a) >= abs(b):
        e = b - (s - a)  # Fast2Sum: never overflows when s does not
    else:
        e = a - (s - b)
    return round_exact(s, sticky(s, e), p, mode, rbits)


@jit
def sub_scalar(a: float, b: float, p: FormatParams, mode: int, rbits: np.uint64) -> float:
    """``a - b`` rounded once into ``p`` (``a + (-b)``, also for the signs of zeros)."""
    return add_scalar(a, -b, p, mode, rbits)


@jit
def _mul_slow(a: float, b: float, pr: float, p: FormatParams, mode: int, rbits: np.uint64) -> float:
    if pr != pr or not (abs(a) <= _DBL_MAX and abs(b) <= _DBL_MAX) or a == 0.0 or b == 0.0:
        return round_exact(pr, TAIL0, p, mode, rbits)  # NaN, infinities, exact signed zeros: IEEE's result is exact
    ma, ea = split(a)
    mb, eb = split(b)
    ph, pl = two_prod(ma, mb)  # 1 <= |ph| <= 4: exact residual
    return round_scaled(ph, sticky(ph, pl), ea + eb, p, mode, rbits)


@jit
def mul_scalar(a: float, b: float, p: FormatParams, mode: int, rbits: np.uint64) -> float:
    """``a * b`` rounded once into ``p``. IEEE special values: 0 * inf is NaN, signs multiply (also of zeros).
    Products below 2**-960 or beyond float64's range are computed on normalized significands and scaled back
    exactly (:func:`round_scaled`)."""
    pr = a * b
    apr = abs(pr)
    if apr >= _SAFE_LO and apr <= _DBL_MAX:
        e = fma64(a, b, -pr)
        return round_exact(pr, sticky(pr, e), p, mode, rbits)
    return _mul_slow(a, b, pr, p, mode, rbits)


@jit
def div_scalar(a: float, b: float, p: FormatParams, mode: int, rbits: np.uint64) -> float:
    """``a / b`` rounded once into ``p``. IEEE special values: x/0 is +-inf for x != 0, 0/0 and inf/inf are
    NaN, x/inf is a signed zero (the format's overflow policy then applies to the infinity).

    With ``q = RN(a/b)`` the remainder ``r = a - q*b`` is exact (one FMA) when ``|a| >= 2**-960`` and ``q`` is
    normal, and ``a/b = q + r/b``. The tail ``r/b`` is never exactly half an ulp of ``q``: then ``a/b`` would
    be a midpoint ``M * 2**j`` with ``M`` an odd 54-bit integer, and ``a = b * M * 2**j`` would need an odd
    significand of at least 54 bits (the odd part of ``b``'s significand times ``M``), but ``a`` has 53. Since
    ``|r/b| <= ulp(q)/2`` by rounding to nearest, the tail is strictly inside: its class is
    ``sign(r)*sign(b)``. Other finite operands are normalized to significands in [1, 2) first and scaled back
    exactly.
    """
    q = a / b
    aq = abs(q)
    aa = abs(a)
    if aq >= 2.0**-1021 and aq <= _DBL_MAX and aa >= _SAFE_LO and aa <= _DBL_MAX and abs(b) <= _DBL_MAX:
        r = fma64(-q, b, a)
        if r == 0.0:
            return round_exact(q, TAIL0, p, mode, rbits)
        return round_exact(q, 1 if (r > 0.0) == (b > 0.0) else -1, p, mode, rbits)
    if q != q or not (aa <= _DBL_MAX and abs(b) <= _DBL_MAX) or a == 0.0 or b == 0.0:
        return round_exact(q, TAIL0, p, mode, rbits)  # NaN, infinities, zeros: IEEE's result is exact
    ma, ea = split(a)
    mb, eb = split(b)
    q = ma / mb  # 1/2 < |q| < 2
    r = fma64(-q, mb, ma)
    d = 0 if r == 0.0 else (1 if (r > 0.0) == (mb > 0.0) else -1)
    return round_scaled(q, d, ea - eb, p, mode, rbits)


@jit
def sqrt_scalar(x: float, p: FormatParams, mode: int, rbits: np.uint64) -> float:
    """``sqrt(x)`` rounded once into ``p``; sqrt(-0) = -0, sqrt(x < 0) = NaN, sqrt(inf) = inf.

    ``r = RN(sqrt(x))``, the residual ``x - r*r`` is exact (one FMA) for ``x >= 2**-960`` and has the sign of
    ``sqrt(x) - r``; the tail is never half an ulp (``x`` would be the square of an odd 54-bit integer times a
    power of four, needing 107 significand bits). Smaller ``x`` is normalized first.
    """
    if x >= _SAFE_LO and x <= _DBL_MAX:
        r = math.sqrt(x)
        res = fma64(-r, r, x)
        return round_exact(r, 0 if res == 0.0 else (1 if res > 0.0 else -1), p, mode, rbits)
    if x != x or x < 0.0:
        return round_exact(np.nan, TAIL0, p, mode, rbits)
    if x == 0.0 or x > _DBL_MAX:
        return round_exact(x, TAIL0, p, mode, rbits)
    m, e = split(x)
    if e % 2 != 0:
        m *= 2.0
        e -= 1
    r = math.sqrt(m)  # m in [1, 4)
    res = fma64(-r, r, m)
    return round_scaled(r, 0 if res == 0.0 else (1 if res > 0.0 else -1), e // 2, p, mode, rbits)


@jit
def _classify3(h: float, t: float, tt: float) -> tuple[float, int]:
    """``(s, d)`` for the exact value ``h + t + tt`` (finite floats, no overflow, ``|tt|`` below a few ulps of
    the sum): ``s`` is the float64 nearest to the value and ``d`` the class of the rest, as
    :func:`~simfloat.rounding.sticky` gives it for a tail of a round-to-nearest head."""
    s, e = two_sum(h, t)
    u, uu = two_sum(e, tt)  # value = s + u + uu exactly, u = RN(u + uu); all multiples of 2**-1074
    for _ in range(4):
        if u == 0.0:
            return s, 0  # then uu == 0 too: the rest is exactly zero
        sb = f64_bits(s)
        expo = np.int64((sb >> np.uint64(52)) & np.uint64(0x7FF))
        ulp = pow2(max(expo, np.int64(1)) - 1075)
        sg = 1 if u > 0.0 else -1
        pow2_below = expo > 1 and (sb & _FRAC) == np.uint64(0) and (sg > 0) != (s > 0.0)
        # The rest against half the gap to the neighbour in its direction (a quarter ulp below a power of
        # two), compared through multiples of |u| so that 2**-1075 is never formed; |u| == half the gap is
        # decided by uu (u is RN of the rest, so the comparison of |u| carries over to the rest except at
        # equality).
        m = 4.0 * abs(u) if pow2_below else 2.0 * abs(u)
        if m < ulp:
            return s, sg
        if m == ulp:
            if uu == 0.0:
                return s, (sg if pow2_below else 2 * sg)  # below a power of two the class -1 covers the midpoint
            if (uu > 0.0) != (u > 0.0):
                return s, sg
        # The rest reaches beyond half the gap: the nearest float64 is the neighbour in the rest's direction.
        s2 = next_away(s, sg)
        gap = s2 - s
        s = s2
        u, uu = two_sum(u - gap, uu)  # u - gap is exact (Sterbenz: both about one gap)
    return s, 0  # not reached: one step always suffices for the expansions fma forms


@jit
def _fma_core(a: float, b: float, c: float) -> tuple[float, int]:
    """``(s, d)`` for ``a*b + c`` when ``|a*b| in [2**-960, 2**1000)`` (exact product residual) and
    ``|c| < 2**1000`` (no overflow in the sums): TwoProduct, then the 3-term sum ``c + ph + pl`` as an exact
    expansion ``h + t + tt`` (four TwoSums), then :func:`_classify3`."""
    ph, pl = two_prod(a, b)
    s1, e1 = two_sum(c, ph)
    s2, e2 = two_sum(e1, pl)
    h, e3 = two_sum(s1, s2)
    t, tt = two_sum(e3, e2)
    return _classify3(h, t, tt)


@jit
def fma_scalar(a: float, b: float, c: float, p: FormatParams, mode: int, rbits: np.uint64) -> float:
    """``a*b + c`` with one rounding into ``p`` (the exact sum of the exact product and ``c``).

    IEEE special values come from the hardware fma (0*inf + c is NaN, inf - inf is NaN). An exactly-zero
    result is +0 (-0 when rounding down) unless the product is an exact zero and ``c`` a zero of the same
    sign. Extreme exponents are handled by exact scaling: a product below 2**-960 next to an addend of at
    least 2**-900 is only a sticky tail of the addend; otherwise tiny operands are scaled up by 2**1100 and
    huge ones down by 2**128, and :func:`round_scaled` maps the result back exactly.
    """
    if not (abs(a) <= _DBL_MAX and abs(b) <= _DBL_MAX and abs(c) <= _DBL_MAX):
        return round_exact(fma64(a, b, c), TAIL0, p, mode, rbits)  # NaN or infinity among the operands
    if a == 0.0 or b == 0.0:
        z = a * b  # exact signed zero
        if c == 0.0:
            return round_exact(_zero_sum(z, c, mode), TAIL0, p, mode, rbits)
        return round_exact(c, TAIL0, p, mode, rbits)
    if c == 0.0:
        return mul_scalar(a, b, p, mode, rbits)
    pr = a * b
    apr = abs(pr)
    ac = abs(c)
    neg_ab = (f64_bits(a) ^ f64_bits(b)) & _SIGN != np.uint64(0)
    sab = -1 if neg_ab else 1
    k = 0
    if apr >= _FMA_HUGE or ac >= _FMA_HUGE:
        if apr < _NEGLIGIBLE:
            return round_exact(c, sab, p, mode, rbits)  # |a*b| < 2**-800 << ulp(c)/4
        if ac < _NEGLIGIBLE:  # c only decides which side of the product: a same-signed stand-in keeps the class
            c = 2.0**-200 if c > 0.0 else -(2.0**-200)
        if abs(a) >= abs(b):
            a = a * 2.0**-128
        else:
            b = b * 2.0**-128
        c = c * 2.0**-128
        if abs(a * b) >= 2.0**897:  # |a*b| >= 2**1025 > 2**1024 + |c|: overflow whatever c is
            return overflow_value(neg_ab, p, mode)
        k = 128
    elif apr < _SAFE_LO:
        if ac >= _TINY_C:
            return round_exact(c, sab, p, mode, rbits)  # |a*b| < 2**-959 < ulp(c)/4: a sticky tail of c
        if abs(a) <= abs(b):
            a = scale(a, 1100)  # the smaller factor is below 2**-480: no overflow, exact
        else:
            b = scale(b, 1100)
        c = scale(c, 1100)  # |c| < 2**-900: exact, below 2**200
        if abs(a * b) < _SAFE_LO:  # still tiny; then |c| >= 2**26 (c != 0) dwarfs it
            return round_scaled(c, sab, TAIL0 - 1100, p, mode, rbits)
        k = -1100
    s, d = _fma_core(a, b, c)
    if s == 0.0 and d == 0:
        return round_exact(-0.0 if mode == RoundingMode.DOWN else 0.0, TAIL0, p, mode, rbits)  # exact cancellation
    return round_scaled(s, d, k, p, mode, rbits)


@jit
def max2(a: float, b: float) -> float:
    """IEEE 754-2019 ``maximum`` of two float64 values, unrounded: NaN if either is NaN, and -0 < +0."""
    if a != a:
        return a
    if b != b:
        return b
    if a == b:
        return b if (f64_bits(a) & _SIGN) != np.uint64(0) else a  # equal: prefer +0 over -0
    return a if a > b else b


@jit
def maximum_scalar(a: float, b: float, p: FormatParams, mode: int, rbits: np.uint64) -> float:
    """IEEE 754-2019 ``maximum`` (NaN propagating, -0 < +0), rounded into ``p`` (exact for operands of
    ``p``)."""
    return round_exact(max2(a, b), TAIL0, p, mode, rbits)
