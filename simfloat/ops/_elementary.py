"""exp, exp2 and log rounded once into a format: libm first, a double-double evaluation where libm cannot
decide.

Accuracy contract, for an input ``x`` (any float64) and a format ``p``:

* Formats with at most 51 fraction bits (every format but float64-precision ones): the result is the correct
  rounding of the exact ``exp(x)``/``exp2(x)``/``log(x)`` in every deterministic mode whenever the exact value
  is farther than ``2**-97`` (relative) from a rounding boundary of the format (a midpoint for the nearest
  modes, a grid point for the directed modes and round-to-odd). How: the libm float64 value ``y`` (trusted to
  be within 2 float64 ulps; glibc documents less than 1) is widened to ``y*(1 +- 2**-50)``; when both ends
  round alike the result is that rounding. Otherwise a double-double evaluation (relative error below
  ``2**-100``, checked in the tests against mpmath) is widened by ``2**-97`` and decides the same way; if even
  that interval straddles a boundary, the double-double value itself is rounded (a case that never occurred in
  a scan of 2**26 random float32 inputs per function and mode, nor in the exhaustive bf16/fp16 tests). For
  ``|x| < 2**-55``, exp(x) and 2**x are ``1 + t`` with ``|t|`` below the tail classes of
  :func:`~simfloat.rounding.round_exact`, so the sign of ``x`` decides exactly. Verified exhaustively over all
  bf16 and fp16 inputs (into their own format and float32, every mode) against mpmath.
* Exact cases are exact: ``exp(+-0) = 1``, ``exp2(n) = 2**n`` for integers ``n`` (also when ``2**n`` is
  subnormal or beyond the format), ``log(1) = +0``. No other float64 input has a representable result.
* Stochastic rounding always takes the double-double route: it sees the value as
  :func:`~simfloat.rounding.round_exact` sees an exact one (float64 head plus the tail's class), so its
  up-probability is that of the exact value up to ``2**-100`` relative.
* Formats with 52 fraction bits (float64): faithful only -- the libm value, rounded into the format (for
  float64 that is libm's result whatever the mode), for results in float64's normal range; subnormal and
  overflowing results take the double-double route.

Special values: exp(-inf) = +0, exp(+inf) = +inf, log(+-0) = -inf, log(x < 0) = NaN, log(+inf) = +inf; NaN in,
NaN out; a format without infinities applies its overflow policy to an infinite result.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from simfloat._eft import dd_add, dd_add_d, dd_div, dd_mul, fast_two_sum, split, two_prod, two_sum
from simfloat._jit import jit
from simfloat.formats import FormatParams
from simfloat.ops._scalar import overflow_value, round_scaled
from simfloat.rounding import RoundingMode, round_exact, sticky
from simfloat.rounding._exact import TAIL0

__all__ = ["exp_scalar", "exp2_scalar", "log_scalar", "exp_dd", "exp2_dd", "log_dd"]


def _ln2_fraction(bits: int = 320) -> Fraction:
    """ln 2 = sum_{k>=1} 1 / (k 2**k), to about ``bits - 9`` bits (integer arithmetic)."""
    one = 1 << bits
    total = sum(one // (k << k) for k in range(1, bits + 1))
    return Fraction(total, one)


def _dd(x: Fraction) -> tuple[float, float]:
    hi = float(x)
    return hi, float(x - Fraction(hi))


_LN2 = _ln2_fraction()
_L1 = float(Fraction(math.floor(_LN2 * (1 << 40)), 1 << 40))  # 40 significant bits: k * _L1 exact for |k| < 2**13
_L2 = float(_LN2 - Fraction(_L1))
_L3 = float(_LN2 - Fraction(_L1) - Fraction(_L2))
_LN2_HI, _LN2_LO = _dd(_LN2)
_INV_LN2 = float(1 / _LN2)
_SQRT_HALF = math.sqrt(0.5)

# exp: Taylor coefficients 1/n!, n = 0..24 (|r| <= 0.36: the first omitted term is below 2**-119).
_EXP_N = 24
_EXP_DD_FROM = 14  # terms n > 14 in plain float64 (their sum is below 2**-62)
_EXP_C = np.array([_dd(Fraction(1, math.factorial(n))) for n in range(_EXP_N + 1)])
# log: atanh series sum w**n / (2n + 1), n = 0..22 (w = z*z <= 0.0295: the first omitted term is below
# 2**-112).
_LOG_N = 22
_LOG_DD_FROM = 10  # terms n > 10 in plain float64 (their sum is below 2**-56)
_LOG_C = np.array([_dd(Fraction(1, 2 * n + 1)) for n in range(_LOG_N + 1)])

# |x| below this: exp(x) and 2**x are 1 + t with 0 < |t| < 2**-54, strictly inside half an ulp of 1 above
# and a quarter ulp below (the classes round_exact takes), so the tail's sign is the whole answer.
_TINY = 2.0**-55
_REL_LIBM = 2.0**-50  # libm bracket: 4 float64 ulps at the bottom of a binade
_REL_DD = 2.0**-97  # double-double bracket: 8x the error bound


@jit
def _exp_poly(rh: float, rl: float) -> tuple[float, float]:
    """exp(rh + rl) for ``|rh + rl| <= 0.36`` as a normalized double-double (Taylor, Horner)."""
    t = _EXP_C[_EXP_N, 0]
    for n in range(_EXP_N - 1, _EXP_DD_FROM, -1):
        t = t * rh + _EXP_C[n, 0]
    ph, pl = t, 0.0
    for n in range(_EXP_DD_FROM, -1, -1):
        ph, pl = dd_mul(ph, pl, rh, rl)
        ph, pl = dd_add(ph, pl, _EXP_C[n, 0], _EXP_C[n, 1])
    return ph, pl


@jit
def exp_dd(x: float) -> tuple[float, float, int]:
    """``exp(x) = (h + lo) * 2**k`` with ``(h, lo)`` a normalized double-double, relative error below
    ``2**-100``; for finite ``-1100 < x < 800``."""
    k = int(math.floor(x * _INV_LN2 + 0.5))
    rh, rl = two_sum(x, -(k * _L1))  # k * _L1 is exact
    ph, pl = two_prod(float(k), _L2)
    rh, rl = dd_add(rh, rl, -ph, -pl)
    rh, rl = dd_add_d(rh, rl, -(k * _L3))
    h, lo = _exp_poly(rh, rl)
    return h, lo, k


@jit
def exp2_dd(x: float) -> tuple[float, float, int]:
    """``2**x = (h + lo) * 2**k`` as :func:`exp_dd`, for finite ``|x| < 2**52``."""
    k = int(math.floor(x + 0.5))
    r = x - k  # exact
    ph, pl = two_prod(r, _LN2_HI)
    ph, pl = fast_two_sum(ph, pl + r * _LN2_LO)
    h, lo = _exp_poly(ph, pl)
    return h, lo, k


@jit
def log_dd(x: float) -> tuple[float, float]:
    """``log(x)`` as a normalized double-double, relative error below ``2**-100``, for finite ``x > 0``.

    ``x = m * 2**e`` with ``m`` in [sqrt(1/2), sqrt(2)); ``log(m) = 2 atanh(z)``, ``z = (m-1)/(m+1)``
    (``m - 1`` is exact, so the relative accuracy holds next to ``x = 1`` too).
    """
    m, e = split(x)
    if m > 2.0 * _SQRT_HALF:
        m *= 0.5
        e += 1
    dh, dl = two_sum(m, 1.0)
    zh, zl = dd_div(m - 1.0, 0.0, dh, dl)
    wh, wl = dd_mul(zh, zl, zh, zl)
    t = _LOG_C[_LOG_N, 0]
    for n in range(_LOG_N - 1, _LOG_DD_FROM, -1):
        t = t * wh + _LOG_C[n, 0]
    sh, sl = t, 0.0
    for n in range(_LOG_DD_FROM, -1, -1):
        sh, sl = dd_mul(sh, sl, wh, wl)
        sh, sl = dd_add(sh, sl, _LOG_C[n, 0], _LOG_C[n, 1])
    lh, ll = dd_mul(zh, zl, sh, sl)
    lh *= 2.0
    ll *= 2.0
    if e == 0:
        return lh, ll
    fe = float(e)
    ah, al = two_prod(fe, _L2)
    ah, al = dd_add_d(ah, al, fe * _L1)  # fe * _L1 is exact
    ah, al = dd_add_d(ah, al, fe * _L3)
    return dd_add(ah, al, lh, ll)


@jit
def _round_dd(h: float, lo: float, k: int, p: FormatParams, mode: int, rbits: np.uint64) -> float:
    """Round ``(h + lo) * 2**k`` (a double-double approximation of a transcendental value, relative error
    below ``2**-100``) into ``p``: decided by the ends of ``(h + lo)(1 +- 2**-97)``, else by the value
    itself."""
    if mode != RoundingMode.STOCHASTIC:
        eps = abs(h) * _REL_DD
        s1, e1 = two_sum(h, lo - eps)
        r1 = round_scaled(s1, sticky(s1, e1), k, p, mode, rbits)
        s2, e2 = two_sum(h, lo + eps)
        r2 = round_scaled(s2, sticky(s2, e2), k, p, mode, rbits)
        if r1 == r2 or (r1 != r1 and r2 != r2):
            return r1
    return round_scaled(h, sticky(h, lo), k, p, mode, rbits)


@jit
def _libm_decides(y: float, p: FormatParams, mode: int, rbits: np.uint64) -> tuple[bool, float]:
    """Whether every value within ``y(1 +- 2**-50)`` rounds alike (then: to what)."""
    if mode == RoundingMode.STOCHASTIC:
        return False, 0.0
    if p.mantissa_bits >= 52:
        return True, round_exact(y, TAIL0, p, mode, rbits)
    w = abs(y) * _REL_LIBM
    r1 = round_exact(y - w, TAIL0, p, mode, rbits)
    r2 = round_exact(y + w, TAIL0, p, mode, rbits)
    return r1 == r2 or (r1 != r1 and r2 != r2), r1


@jit
def exp_scalar(x: float, p: FormatParams, mode: int, rbits: np.uint64) -> float:
    """``exp(x)`` rounded once into ``p`` (see the module docstring for the accuracy contract)."""
    if x != x:
        return round_exact(x, TAIL0, p, mode, rbits)
    if x == 0.0:
        return round_exact(1.0, TAIL0, p, mode, rbits)
    if abs(x) < _TINY:
        return round_exact(1.0, 1 if x > 0.0 else -1, p, mode, rbits)
    if x > 711.0:
        if x == np.inf:
            return round_exact(x, TAIL0, p, mode, rbits)
        return overflow_value(False, p, mode)
    if x < -746.0:
        if x == -np.inf:
            return round_exact(0.0, TAIL0, p, mode, rbits)
        return round_exact(0.0, TAIL0 + 1, p, mode, rbits)  # 0 < exp(x) < 2**-1076
    if x > -708.0 and x < 709.0:
        ok, r = _libm_decides(math.exp(x), p, mode, rbits)
        if ok:
            return r
    h, lo, k = exp_dd(x)
    return _round_dd(h, lo, k, p, mode, rbits)


@jit
def exp2_scalar(x: float, p: FormatParams, mode: int, rbits: np.uint64) -> float:
    """``2**x`` rounded once into ``p`` (exact for integer ``x``; see the module docstring)."""
    if x != x:
        return round_exact(x, TAIL0, p, mode, rbits)
    if x >= 1025.0:
        if x == np.inf:
            return round_exact(x, TAIL0, p, mode, rbits)
        return overflow_value(False, p, mode)
    if x < -1100.0:
        if x == -np.inf:
            return round_exact(0.0, TAIL0, p, mode, rbits)
        return round_exact(0.0, TAIL0 + 1, p, mode, rbits)
    if x == math.floor(x):
        return round_scaled(1.0, TAIL0, int(x), p, mode, rbits)
    if abs(x) < _TINY:
        return round_exact(1.0, 1 if x > 0.0 else -1, p, mode, rbits)
    if x > -1020.0 and x < 1023.0:
        ok, r = _libm_decides(math.exp2(x), p, mode, rbits)
        if ok:
            return r
    h, lo, k = exp2_dd(x)
    return _round_dd(h, lo, k, p, mode, rbits)


@jit
def log_scalar(x: float, p: FormatParams, mode: int, rbits: np.uint64) -> float:
    """``log(x)`` (natural) rounded once into ``p`` (see the module docstring)."""
    if x != x or x < 0.0:
        return round_exact(np.nan, TAIL0, p, mode, rbits)
    if x == 0.0:
        return round_exact(-np.inf, TAIL0, p, mode, rbits)
    if x == np.inf:
        return round_exact(x, TAIL0, p, mode, rbits)
    if x == 1.0:
        return round_exact(0.0, TAIL0, p, mode, rbits)
    ok, r = _libm_decides(math.log(x), p, mode, rbits)
    if ok:
        return r
    h, lo = log_dd(x)
    return _round_dd(h, lo, TAIL0, p, mode, rbits)
