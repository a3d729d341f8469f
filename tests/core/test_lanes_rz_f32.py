"""The float32 toward-zero rounding of the block-FMA kernels (simfloat._lanes.lround_rz_f32) against the general
lane rounding and against an independent oracle (numpy's nearest float32, stepped toward zero when it lies
beyond x)."""

from __future__ import annotations

import numpy as np

from simfloat._lanes import lane, lround_rz, lround_rz_f32, rz_f32
from simfloat.formats import format as fmt
from simfloat.rounding import RoundingMode


def _oracle(x: float) -> float:
    if x != x or abs(x) == np.inf:
        return x
    big = float(np.finfo(np.float32).max)
    if abs(x) > big:
        return float(np.copysign(big, x))
    with np.errstate(over="ignore"):
        y = np.float32(x)
    if abs(float(y)) > abs(x):
        y = np.nextafter(y, np.float32(0.0))
    return float(y) if y != 0.0 else float(np.copysign(0.0, x))


def _values(n: int = 4001) -> np.ndarray:
    g = np.random.default_rng(97)
    x = g.standard_normal(n) * 2.0 ** g.integers(-160, 140, n)
    edges = [0.0, -0.0, np.inf, -np.inf, 2.0**-149, 2.0**-150, 3 * 2.0**-150, -(2.0**-126), 2.0**-126 * (1 - 2.0**-30),
             2.0**128, -(2.0**128), float(np.finfo(np.float32).max), float(np.finfo(np.float32).max) * (1 + 2.0**-30),
             1.0 + 2.0**-24, -(1.0 + 2.0**-23 + 2.0**-40)]  # fmt: skip
    return np.concatenate([x, edges])


def test_rz_f32_is_the_general_lane_and_the_oracle():
    r = lane(fmt("float32"), int(RoundingMode.TOWARD_ZERO))
    assert rz_f32(r)
    for x in _values():
        got = lround_rz_f32(x)
        assert np.float64(got).view(np.uint64) == np.float64(lround_rz(x, r)).view(np.uint64), x
        assert np.float64(got).view(np.uint64) == np.float64(_oracle(x)).view(np.uint64), x
    assert np.isnan(lround_rz_f32(np.nan))


def test_rz_f32_holds_for_float32_toward_zero_only():
    assert not rz_f32(lane(fmt("float32"), int(RoundingMode.NEAREST_EVEN)))
    assert not rz_f32(lane(fmt("bf16"), int(RoundingMode.TOWARD_ZERO)))
    assert not rz_f32(lane(fmt("float64"), int(RoundingMode.TOWARD_ZERO)))
