"""Error-free transformations, double-double arithmetic and exact power-of-two scaling (njit scalar helpers).

Every function here is exact or has a stated error bound and never raises. Notation: ``u = 2**-53``; a
double-double (dd) is an unevaluated pair ``hi + lo`` with ``|lo| <= ulp(hi)/2``.

* :func:`two_sum` (Knuth, 6 flops, any order of magnitudes) and :func:`fast_two_sum` (Dekker, needs
  ``exponent(a) >= exponent(b)`` or ``a == 0``) return ``(s, e)`` with ``s = RN(a + b)`` and ``a + b = s + e``
  exactly, also for subnormal operands, as long as nothing overflows.
* :func:`two_prod` returns ``(p, e)`` with ``p = RN(a*b)``, ``a*b = p + e`` exactly when ``e`` is
  representable, which holds whenever ``|a*b| >= 2**-969`` (``e`` is a multiple of ``ulp(a)*ulp(b) >=
  |a*b|*2**-106``).
* dd arithmetic follows Joldes, Muller, Popescu, "Tight and rigorous error bounds for basic building blocks of
  double-word arithmetic" (ACM TOMS 2017): :func:`dd_add` (AccurateDWPlusDW, relative error <= 3u**2 +
  13u**3), :func:`dd_mul` (DWTimesDW3 with FMA, <= 4u**2), :func:`dd_div` (three-quotient long division, ~<=
  4u**2).
"""

from __future__ import annotations

import numpy as np

from simfloat._jit import bits_f64, f64_bits, fma64, jit

__all__ = [
    "two_sum",
    "fast_two_sum",
    "two_prod",
    "dd_add",
    "dd_add_d",
    "dd_mul",
    "dd_mul_d",
    "dd_div",
    "pow2",
    "exponent",
    "scale",
    "split",
    "next_away",
]

_EXP_MASK = np.uint64(0x7FF)
_FRAC_MASK = np.uint64((1 << 52) - 1)
_SIGN_EXP_CLEAR = np.uint64(0x800FFFFFFFFFFFFF)
_ONE = np.uint64(1)


@jit
def two_sum(a: float, b: float) -> tuple[float, float]:
    """``(s, e)``: ``s = RN(a + b)``, ``s + e == a + b`` exactly (no overflow)."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


@jit
def fast_two_sum(a: float, b: float) -> tuple[float, float]:
    """``(s, e)`` as :func:`two_sum`, valid when ``|a| >= |b|`` (more precisely exponent(a) >=
    exponent(b))."""
    s = a + b
    e = b - (s - a)
    return s, e


@jit
def two_prod(a: float, b: float) -> tuple[float, float]:
    """``(p, e)``: ``p = RN(a*b)``, ``p + e == a*b`` exactly when ``|a*b| >= 2**-969`` and ``p`` is finite."""
    p = a * b
    return p, fma64(a, b, -p)


@jit
def dd_add(ah: float, al: float, bh: float, bl: float) -> tuple[float, float]:
    """Double-double sum (AccurateDWPlusDW), relative error below ``3*2**-106 + 13*2**-159``."""
    sh, sl = two_sum(ah, bh)
    th, tl = two_sum(al, bl)
    c = sl + th
    vh, vl = fast_two_sum(sh, c)
    w = tl + vl
    return fast_two_sum(vh, w)


@jit
def dd_add_d(ah: float, al: float, b: float) -> tuple[float, float]:
    """Double-double plus double (DWPlusFP), relative error below ``2*2**-106``."""
    sh, sl = two_sum(ah, b)
    v = al + sl
    return fast_two_sum(sh, v)


@jit
def dd_mul(ah: float, al: float, bh: float, bl: float) -> tuple[float, float]:
    """Double-double product (DWTimesDW3), relative error below ``4*2**-106``."""
    ch, cl1 = two_prod(ah, bh)
    tl0 = al * bl
    tl1 = fma64(ah, bl, tl0)
    cl2 = fma64(al, bh, tl1)
    cl3 = cl1 + cl2
    return fast_two_sum(ch, cl3)


@jit
def dd_mul_d(ah: float, al: float, b: float) -> tuple[float, float]:
    """Double-double times double (DWTimesFP3), relative error below ``2*2**-106``."""
    ch, cl1 = two_prod(ah, b)
    cl3 = fma64(al, b, cl1)
    return fast_two_sum(ch, cl3)


@jit
def dd_div(ah: float, al: float, bh: float, bl: float) -> tuple[float, float]:
    """Double-double quotient by long division with three partial quotients (the QD library's accurate
    division); each step removes ~53 bits, the result's relative error is a few ``2**-106``."""
    q1 = ah / bh
    ph, pl = dd_mul_d(bh, bl, q1)
    rh, rl = dd_add(ah, al, -ph, -pl)
    q2 = rh / bh
    ph, pl = dd_mul_d(bh, bl, q2)
    rh, rl = dd_add(rh, rl, -ph, -pl)
    q3 = rh / bh
    qh, ql = fast_two_sum(q1, q2)
    return dd_add_d(qh, ql, q3)


@jit
def pow2(q: int | np.int64) -> float:
    """``2.0**q`` exactly, for ``-1074 <= q <= 1023`` (built from bits)."""
    if q >= -1022:
        return bits_f64(np.uint64(q + 1023) << np.uint64(52))
    return bits_f64(_ONE << np.uint64(q + 1074))


@jit
def exponent(x: float) -> int | np.int64:
    """``floor(log2(|x|))`` of a finite nonzero ``x``, subnormals included."""
    b = f64_bits(x)
    expo = np.int64((b >> np.uint64(52)) & _EXP_MASK)
    if expo != 0:
        return expo - 1023
    frac = b & _FRAC_MASK
    n = 0  # bit length of the fraction
    while frac != np.uint64(0):
        frac >>= _ONE
        n += 1
    return n - 1075


@jit
def scale(x: float, k: int | np.int64) -> float:
    """``x * 2**k`` computed in steps of at most ``2**+-1000``: exact whenever the result is a normal number
    or ``k >= 0`` and nothing overflows (the caller's guarantee); the last step rounds otherwise."""
    while k > 1000:
        x *= pow2(1000)
        k -= 1000
    while k < -1000:
        x *= pow2(-1000)
        k += 1000
    return x * pow2(k)


@jit
def split(x: float) -> tuple[float, int | np.int64]:
    """``(m, e)`` with ``x == m * 2**e`` and ``1 <= |m| < 2``, for finite nonzero ``x`` (subnormals
    included)."""
    e = exponent(x)
    b = f64_bits(x)
    if ((b >> np.uint64(52)) & _EXP_MASK) == np.uint64(0):
        x = x * pow2(64)  # subnormal: normalize first (exact)
        b = f64_bits(x)
    m = bits_f64((b & _SIGN_EXP_CLEAR) | (np.uint64(1023) << np.uint64(52)))
    return m, e


@jit
def next_away(x: float, direction: int) -> float:
    """The float64 next to the finite ``x`` in ``direction`` (+1: toward +inf, -1: toward -inf)."""
    if x == 0.0:
        return pow2(-1074) if direction > 0 else -pow2(-1074)
    b = f64_bits(x)
    if (x > 0.0) == (direction > 0):
        return bits_f64(b + _ONE)
    return bits_f64(b - _ONE)
