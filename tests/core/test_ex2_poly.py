"""FlashAttention-4's software exp2 (simfloat.hardware.ex2_poly_f32) against an independent oracle of the same
algorithm (exact rational arithmetic, each float32 operation rounded once by a rounding written here) and
against properties (exact at integers, its error against the correctly rounded 2^x)."""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np
import pytest

from simfloat.hardware import FA4_EX2_POLY, ex2_poly

# the published coefficients, as printed in flash_attn/cute/utils.py (POLY_EX2[3])
_PUBLISHED = ("1.0", "0.695146143436431884765625", "0.227564394474029541015625", "0.077119089663028717041015625")


def _rn32(v: Fraction) -> Fraction:
    """v rounded to the nearest float32 (ties to even; subnormals; no overflow in this test's range)."""
    if v == 0:
        return Fraction(0)
    sign = -1 if v < 0 else 1
    a = abs(v)
    e = math.floor(math.log2(a.numerator) - math.log2(a.denominator))
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    ulp = Fraction(2) ** (max(e, -126) - 23)
    q, r = divmod(a, ulp)
    if r * 2 > ulp or (r * 2 == ulp and q % 2 == 1):
        q += 1
    return sign * q * ulp


def _f32_bits(v: Fraction) -> int:
    return struct.unpack("<I", struct.pack("<f", float(v)))[0]


def _oracle(x: float) -> float:
    """The algorithm in exact arithmetic: max(x, -127), floor, rn(x - n), three rn(a*b + c), n into the exponent."""
    xc = Fraction(max(x, -127.0))
    n = math.floor(xc)
    f = _rn32(xc - n)
    c = [Fraction(s) for s in _PUBLISHED]
    p = c[3]
    for ci in (c[2], c[1], c[0]):
        p = _rn32(p * f + ci)
    bits = (_f32_bits(p) + n * 2**23) & 0xFFFFFFFF
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def test_coefficients_are_the_published_float32_values():
    for c, s in zip(FA4_EX2_POLY, _PUBLISHED, strict=True):
        assert Fraction(c) == Fraction(s)
        assert float(np.float32(c)) == c


def test_against_exact_oracle():
    rng = np.random.default_rng(7)
    x = np.concatenate(
        [
            -rng.exponential(8.0, 1500),
            -rng.uniform(0, 1, 500),
            -rng.uniform(125, 130, 200),
            rng.uniform(0, 20, 100),
            -(10.0 ** -rng.uniform(1, 40, 100)),  # tiny negatives: the fraction rounds to 1
        ]
    ).astype(np.float32)
    got = ex2_poly(x)
    want = np.array([_oracle(float(v)) for v in x], dtype=np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_exact_at_integers_and_clamped():
    n = np.arange(-126, 128, dtype=np.float32)
    assert np.array_equal(ex2_poly(n), np.exp2(n.astype(np.float64)).astype(np.float32))
    assert np.all(ex2_poly(np.array([-127.0, -128.5, -1e30, -np.inf, np.nan], dtype=np.float32)) == 0.0)


def test_error_against_correctly_rounded_exp2():
    """Every float32 in [-1, -1/2] and a sample of (-126, 0): within 1430 float32 ulps of the correctly rounded
    2^x (flash-attention #2263 reports 1428-1429 ulps at most), and more than 1000 at worst (the polynomial's
    own error, not rounding noise)."""
    lo, hi = np.float32(-1.0).view(np.uint32), np.float32(-0.5).view(np.uint32)
    x = np.arange(hi, lo + 1, dtype=np.uint32).view(np.float32)  # every float32 in [-1, -1/2]
    rng = np.random.default_rng(3)
    x = np.concatenate([x, -rng.uniform(0, 126, 200_000).astype(np.float32)])
    got = ex2_poly(x).astype(np.float64)
    ref = np.exp2(x.astype(np.float64)).astype(np.float32)  # float64 exp2 then one rounding: ulp-level check only
    ulp = np.spacing(ref).astype(np.float64)
    err = np.abs(got - ref.astype(np.float64)) / ulp
    assert 1000 < err.max() <= 1430


def test_rejects_inputs_above_127():
    with pytest.raises(ValueError, match="<= 127"):
        ex2_poly(np.array([128.0], dtype=np.float32))
