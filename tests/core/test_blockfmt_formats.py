"""The scale and element formats of block-scaled MMAs (OCP MX, NVFP4): float8_e8m0fnu, ue4m3, float8_e3m4, the
IEEE-style float8_e4m3, fp6 and fp4 — every code and a dense float32 sample rounded as ml_dtypes does."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import simfloat

# every 65537th float32 bit pattern (all binades, both signs, subnormals, inf, NaN) plus every code's
# neighbourhood comes from the code tests below
_SAMPLE = np.arange(0, 2**32, 65537, dtype=np.uint64).astype(np.uint32).view(np.float32)

ML = {
    "float8_e8m0fnu": ml_dtypes.float8_e8m0fnu,
    "float8_e3m4": ml_dtypes.float8_e3m4,
    "float8_e4m3": ml_dtypes.float8_e4m3,
    "float6_e2m3fn": ml_dtypes.float6_e2m3fn,
    "float6_e3m2fn": ml_dtypes.float6_e3m2fn,
    "float4_e2m1fn": ml_dtypes.float4_e2m1fn,
}


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise: equal bits, or both NaN."""
    return (a.astype(np.float64).view(np.uint64) == b.astype(np.float64).view(np.uint64)) | (np.isnan(a) & np.isnan(b))


@pytest.mark.parametrize("name", list(ML))
def test_every_code_round_trips(name: str) -> None:
    t = ML[name]
    f = simfloat.format(name)
    codes = np.arange(1 << f.bits, dtype=np.uint8).view(t)
    with np.errstate(invalid="ignore"):
        vals = codes.astype(np.float32)
    got = simfloat.round(vals, f)
    assert _same(got, vals).all()
    finite = vals[np.isfinite(vals)]
    assert float(finite.max()) == f.max and float(finite.min()) == f.min


@pytest.mark.parametrize("name", list(ML))
def test_dense_float32_rounding_matches_ml_dtypes(name: str) -> None:
    f = simfloat.format(name)
    x = _SAMPLE
    with np.errstate(all="ignore"):
        ref = x.astype(ML[name]).astype(np.float32)
    got = simfloat.round(x, f)
    bad = ~_same(got, ref)
    if name == "float8_e8m0fnu":
        # ml_dtypes rounds float32 subnormals just above 2**-127 up to 2**-126; the nearest power of two is
        # 2**-127 (checked exactly here)
        odd = (x > 2.0**-127) & (x < 1.5 * 2.0**-127)
        assert (bad <= odd).all()
        assert (got[odd] == np.float32(2.0**-127)).all()
        bad &= ~odd
    if not f.has_nan:  # ml_dtypes turns NaN into -0 where the format has no NaN; simfloat keeps NaN
        assert np.isnan(got[np.isnan(x)]).all()
        bad &= ~np.isnan(x)
    assert not bad.any(), (x[bad][:5], ref[bad][:5], got[bad][:5])


def test_e8m0_by_hand() -> None:
    f = simfloat.float8_e8m0fnu
    assert (f.bits, f.bias, f.emin, f.emax, f.signed, f.zero) == (8, 127, -127, 127, False, False)
    assert f.max == 2.0**127 and f.tiny == f.smallest_subnormal == f.min == 2.0**-127 and f.eps == 1.0
    assert simfloat.format("e8m0") is f and simfloat.format("ue8m0") is f
    # no zero, no negatives: NaN; below the smallest value: the smallest value in every mode; above the
    # largest: NaN (no infinity), or the largest value when rounding toward zero
    for mode in ("nearest_even", "toward_zero", "up", "down", "nearest_away"):
        r = simfloat.round([0.0, -0.0, -1.0, -np.inf, 2.0**-200, 2.0**-127], f, mode)
        assert np.isnan(r[:4]).all() and (r[4:] == 2.0**-127).all()
    assert np.isnan(simfloat.round(2.0**128, f))
    assert simfloat.round(2.0**128, f, "toward_zero") == 2.0**127
    # ties of powers of two: 1.5 lies midway between 1 and 2 and rounds up (the one significand bit is odd)
    assert simfloat.round([1.5, 0.75, 3.0, 1.4999], f).tolist() == [2.0, 1.0, 4.0, 1.0]
    assert simfloat.round([1.9, 1.1], f, "toward_zero").tolist() == [1.0, 1.0]
    assert simfloat.round([1.1, 2.0], f, "up").tolist() == [2.0, 2.0]


def test_ue4m3_is_the_nonnegative_half_of_e4m3fn() -> None:
    f = simfloat.ue4m3
    assert (f.bits, f.bias, f.emin, f.max, f.smallest_subnormal, f.min) == (7, 7, -6, 448.0, 2.0**-9, 0.0)
    assert not f.has_negative_zero and simfloat.format("float8_ue4m3") is f
    pos = np.abs(_SAMPLE[np.isfinite(_SAMPLE)])
    assert _same(simfloat.round(pos, f), simfloat.round(pos, "float8_e4m3fn")).all()
    r = simfloat.round(np.array([-1.0, -(2.0**-12), -0.0, 0.0, np.nan], np.float32), f)
    assert np.isnan(r[[0, 1, 4]]).all() and r[2] == 0.0 and not np.signbit(r[2]) and r[3] == 0.0


def test_scale_formats_need_a_nan_code() -> None:
    with pytest.raises(ValueError, match="needs a NaN code"):
        simfloat.FloatFormat("u", 4, 3, nan="none", has_infinity=False, overflow="saturate", signed=False)
    with pytest.raises(ValueError, match="without zero has no subnormals"):
        simfloat.FloatFormat("z", 8, 0, nan="fn", has_infinity=False, overflow="nan", zero=False)
