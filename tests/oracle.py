"""Exact reference for rounding into a binary floating-point format, with Python integers only.

Independent of simfloat's code: it reads only the *fields* of a format (exponent and fraction widths, NaN
encoding, infinities, subnormals, overflow policy) and derives everything else from the bit-level encoding
rules:

* A code ``S | E | F`` (1 sign bit, ``e`` exponent bits, ``m`` fraction bits) with ``E > 0`` is ``(-1)**S *
  (2**m + F) * 2**(E - bias - m)``, and with ``E == 0`` it is ``(-1)**S * F * 2**(1 - bias - m)``. ``bias =
  2**(e-1) - 1``, one more for ``fnuz`` formats.
* ``ieee``: ``E`` all ones is infinity (``F == 0``) or NaN. ``fn``: only ``S.11..1.11..1`` is NaN. ``fnuz``:
  only the code of negative zero (``1.00..0.00..0``) is NaN. ``none``: every code is a number.

The largest finite value is found by walking the positive codes down from the top until one decodes to a
number.

Rounding (IEEE 754 with an unbounded exponent range, then overflow): with ``2**k <= |x| < 2**(k+1)`` the
quantum is ``2**(max(k, emin) - m)``; ``|x| / quantum`` is split into an integer and a remainder that the mode
resolves. A result above the largest finite value has overflowed: the nearest modes and rounding away from
zero give the overflow policy's value (infinity, NaN, or the largest finite value for ``"saturate"``);
rounding toward zero and round-to-odd give the largest finite value. Formats without subnormals round as if
they had them and then flush a subnormal result to zero of the same sign. Formats without negative zero give
+0. NaN stays NaN; an infinite input stays infinite where the format has infinities, else it becomes the
overflow policy's value.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

__all__ = [
    "MODES",
    "Spec",
    "spec",
    "decode",
    "finite_values",
    "round_ref",
    "round_ref_all",
    "bracket",
]

#: deterministic rounding modes the oracle resolves (stochastic rounding: see :func:`bracket`)
MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd")


@dataclass(frozen=True)
class Spec:
    """The oracle's own view of a format, derived from its fields."""

    ebits: int
    mbits: int
    nan: str
    has_inf: bool
    subnormals: bool
    overflow: str
    bias: int
    emin: int  # exponent of the smallest normal value
    max_code: int  # code of the largest finite value
    max_sig: int  # the largest finite value is max_sig * 2**max_exp
    max_exp: int

    @property
    def max(self) -> Fraction:
        return Fraction(self.max_sig) * Fraction(2) ** self.max_exp

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits


def _fields(fmt: Any) -> tuple[int, int, str, bool, bool, str]:
    return (
        int(fmt.exponent_bits),
        int(fmt.mantissa_bits),
        str(fmt.nan),
        bool(fmt.has_infinity),
        bool(fmt.subnormals),
        str(fmt.overflow),
    )


def _decode_fields(code: int, ebits: int, mbits: int, nan: str, bias: int) -> tuple[str, int, int, int]:
    """(kind, sign, significand, exponent) of a code; kind is "num", "inf" or "nan"; value = sig * 2**exp."""
    sign = (code >> (ebits + mbits)) & 1
    e_field = (code >> mbits) & ((1 << ebits) - 1)
    f_field = code & ((1 << mbits) - 1)
    e_top = (1 << ebits) - 1
    if nan == "ieee" and e_field == e_top:
        return ("inf" if f_field == 0 else "nan"), sign, 0, 0
    if nan == "fn" and e_field == e_top and f_field == (1 << mbits) - 1:
        return "nan", sign, 0, 0
    if nan == "fnuz" and sign == 1 and e_field == 0 and f_field == 0:
        return "nan", sign, 0, 0
    if e_field == 0:
        return "num", sign, f_field, 1 - bias - mbits
    return "num", sign, (1 << mbits) | f_field, e_field - bias - mbits


def spec(fmt: Any) -> Spec:
    """Derive bias, emin and the largest finite value from the format's fields."""
    return _spec(*_fields(fmt))


@functools.cache
def _spec(ebits: int, mbits: int, nan: str, has_inf: bool, subnormals: bool, overflow: str) -> Spec:
    bias = (1 << (ebits - 1)) - 1 + (1 if nan == "fnuz" else 0)
    code = (1 << (ebits + mbits)) - 1  # largest positive code
    if nan == "ieee":
        code -= 1 << mbits  # the whole top exponent field is inf/NaN: start below it
    while True:
        kind, _, sig, exp = _decode_fields(code, ebits, mbits, nan, bias)
        if kind == "num":
            break
        code -= 1
    return Spec(ebits, mbits, nan, has_inf, subnormals, overflow, bias, 1 - bias, code, sig, exp)


def decode(code: int, fmt: Any) -> float:
    """The value of a code as a float (NaN for NaN codes). Subnormal codes decode to their value whatever
    ``fmt.subnormals`` says (the encoding exists; a format without subnormals never produces them)."""
    s = spec(fmt)
    kind, sign, sig, exp = _decode_fields(code, s.ebits, s.mbits, s.nan, s.bias)
    if kind == "nan":
        return math.nan
    if kind == "inf":
        return -math.inf if sign else math.inf
    v = math.ldexp(float(sig), exp)
    return -v if sign else v


def finite_values(fmt: Any, *, nonnegative: bool = False) -> list[float]:
    """All distinct finite values of a format (only for formats of at most 20 bits), sorted; subnormals only
    if the format has them; zero once (as +0)."""
    s = spec(fmt)
    if s.bits > 20:
        raise ValueError("finite_values enumerates codes: at most 20-bit formats")
    out = set()
    for code in range(1 << s.bits):
        kind, sign, sig, exp = _decode_fields(code, s.ebits, s.mbits, s.nan, s.bias)
        if kind != "num" or (nonnegative and sign):
            continue
        if not s.subnormals and 0 < sig < (1 << s.mbits) and exp == 1 - s.bias - s.mbits:
            continue
        v = math.ldexp(float(sig), exp)
        out.add(-v if sign else v)
    return sorted(out)


def _exact(x: Fraction | float | int) -> tuple[bool, int, int, bool]:
    """(negative, numerator, denominator, is_negative_zero) of a finite number."""
    if isinstance(x, float):
        neg = math.copysign(1.0, x) < 0
        n, d = x.as_integer_ratio()
        return neg, abs(n), d, x == 0 and neg
    f = Fraction(x)
    return f < 0, abs(f.numerator), f.denominator, False


def _floor_log2(n: int, d: int) -> int:
    """k with 2**k <= n/d < 2**(k+1), for n, d > 0."""
    k = n.bit_length() - d.bit_length()
    if (n << max(-k, 0)) < (d << max(k, 0)):
        k -= 1
    return k


def _signed(neg: bool, sig: int, exp: int, s: Spec) -> float:
    if sig == 0:
        return -0.0 if (neg and s.nan != "fnuz") else 0.0
    v = math.ldexp(float(sig), exp)  # exact: sig < 2**53 and the exponent is in float64's range
    return -v if neg else v


def _policy(neg: bool, s: Spec) -> float:
    if s.overflow == "inf":
        return -math.inf if neg else math.inf
    if s.overflow == "nan":
        return math.nan
    return _signed(neg, s.max_sig, s.max_exp, s)


def _truncate(n: int, d: int, s: Spec) -> tuple[int, int, int, int, int]:
    """|x| = n/d > 0 as (q, k, r, den): x / 2**q = k + r/den with 0 <= r < den, q the quantum's exponent."""
    e = _floor_log2(n, d)
    q = max(e, s.emin) - s.mbits
    num = n << max(-q, 0)
    den = d << max(q, 0)
    k, r = divmod(num, den)
    return q, k, r, den, e


def round_ref(x: Fraction | float | int, fmt: Any, mode: str) -> float:
    """``x`` rounded into ``fmt`` with ``mode`` (one of :data:`MODES`), as a float (exact: every value of a
    format that fits float64 is a float64). ``x`` may be a float (NaN, infinities and signed zeros included),
    an int or a Fraction (signed zero is not expressible: 0 gives +0)."""
    if mode not in MODES:
        raise ValueError(f"oracle: unknown mode {mode!r}")
    return round_ref_all(x, fmt, (mode,))[0]


def round_ref_all(x: Fraction | float | int, fmt: Any, modes: tuple[str, ...] = MODES) -> list[float]:
    """:func:`round_ref` for several modes at once (the exact division is shared)."""
    s = spec(fmt)
    if isinstance(x, float):
        if math.isnan(x):
            return [math.nan] * len(modes)
        if math.isinf(x):
            return [x if s.has_inf else _policy(x < 0, s)] * len(modes)
    neg, n, d, _ = _exact(x)
    if n == 0:
        return [_signed(neg, 0, 0, s)] * len(modes)
    q, k0, r, den, _ = _truncate(n, d, s)
    twice = 2 * r
    out = []
    for mode in modes:
        k = k0
        if r != 0:
            if mode == "nearest_even":
                up = twice > den or (twice == den and k % 2 == 1)
            elif mode == "nearest_away":
                up = twice >= den
            elif mode == "toward_zero":
                up = False
            elif mode == "up":
                up = not neg
            elif mode == "down":
                up = neg
            elif mode == "odd":
                up = k % 2 == 0
            else:
                raise ValueError(f"oracle: unknown mode {mode!r}")
            k += up
        out.append(_finish(neg, k, q, mode, s))
    return out


def _finish(neg: bool, k: int, q: int, mode: str, s: Spec) -> float:
    """The rounded magnitude k * 2**q with overflow and flush-to-zero applied, signed."""
    # compare k * 2**q with the largest finite value max_sig * 2**max_exp
    if (k << max(q - s.max_exp, 0)) > (s.max_sig << max(s.max_exp - q, 0)):
        away = mode in ("nearest_even", "nearest_away") or (mode == "up" and not neg) or (mode == "down" and neg)
        return _policy(neg, s) if away else _signed(neg, s.max_sig, s.max_exp, s)
    if not s.subnormals and k != 0 and (k << max(q - s.emin, 0)) < (1 << max(s.emin - q, 0)):
        k = 0  # a subnormal result flushes to zero
    return _signed(neg, k, q, s)


def bracket(x: Fraction | float | int, fmt: Any) -> tuple[float, float, Fraction]:
    """For stochastic rounding of a finite ``x`` within range: ``(lo, hi, p)`` with ``lo`` the value toward
    zero, ``hi`` the next one away from zero (``lo == hi`` when ``x`` is representable) and ``p`` the exact
    probability of ``hi`` (``|x| - |lo|) / (|hi| - |lo|)``), so that ``E[result] == x``. Formats with
    subnormals only."""
    s = spec(fmt)
    if not s.subnormals:
        raise ValueError("bracket: stochastic rounding reference only for formats with subnormals")
    neg, n, d, _ = _exact(x)
    if n == 0:
        z = _signed(neg, 0, 0, s)
        return z, z, Fraction(0)
    q, k, r, den, _ = _truncate(n, d, s)
    lo = _signed(neg, k, q, s)
    if r == 0:
        return lo, lo, Fraction(0)
    return lo, _signed(neg, k + 1, q, s), Fraction(r, den)
