"""The attention kernels' exp and exp2 are correctly rounded on every CPU: the reference's scalar ops are
simfloat.ops' (libm where it decides the rounding, else a double-double), and the vector engine's libm fast
path hands the values libm cannot decide (``simfloat._lanes.libm_unsure``) to the same scalar ops. Inputs near
the rounding boundaries come from logarithms of the boundaries themselves, so libm's result lands within a
few of its ulps of them (where a CPU's libm variant decides the rounding, with FMA or without)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import simfloat as sf
from simfloat._lanes import lane, libm_unsure
from simfloat.attention import plan
from simfloat.attention._engine import _exp_of
from simfloat.attention._kernels import exp, exp2
from simfloat.formats import format as fmt_of

CASES = [("float32", "nearest_even"), ("bfloat16", "nearest_even"), ("float32", "toward_zero"), ("fp16", "up")]


def _boundaries(name: str, mode: str, n: int, seed: int) -> np.ndarray:
    """n positive rounding boundaries of the format in [2**-20, 2**20): midpoints for the nearest modes,
    values of the format for the directed ones."""
    f = fmt_of(name)
    g = np.random.default_rng(seed)
    e = g.integers(-20, 20, n)
    frac = g.integers(0, 2**f.mantissa_bits, n)
    half = 0.5 if mode.startswith("nearest") else 0.0
    return np.ldexp(1.0 + (frac + half) / 2.0**f.mantissa_bits, e)


def _inputs(name: str, mode: str, base2: bool) -> np.ndarray:
    b = _boundaries(name, mode, 20000, 7)
    x = np.log2(b) if base2 else np.log(b)
    g = np.random.default_rng(3)
    return np.concatenate([x, g.uniform(-30, 10, 2000), [0.0, -0.0, -1e-300, 1e-300, -200.0, -745.0]])


def _params(name: str, mode: str):
    pp = plan("triton-fp32").replace(exp=(name, mode), alpha=(name, mode)).params(0.125)
    return pp.exp, lane(fmt_of(name), sf.rounding.RoundingMode[mode.upper()] if mode != "up" else 3)


@pytest.mark.parametrize("name, mode", CASES)
@pytest.mark.parametrize("base2", [False, True])
def test_vector_and_reference_exp_are_the_correctly_rounded_exp(name, mode, base2):
    o, r = _params(name, mode)
    x = _inputs(name, mode, base2)
    want = (sf.ops.exp2 if base2 else sf.ops.exp)(x, name, mode).astype(np.float64)
    ref = np.array([(exp2 if base2 else exp)(float(v), o) for v in x])
    vec = x.copy()
    _exp_of(vec, vec.size, base2, r, o, np.zeros(0, np.float32))
    np.testing.assert_array_equal(ref.view(np.uint64), want.view(np.uint64))
    np.testing.assert_array_equal(vec.view(np.uint64), want.view(np.uint64))
    # the boundary inputs do reach the correctly rounded path: libm alone cannot decide them
    libm = np.exp2(x) if base2 else np.exp(x)
    unsure = sum(bool(libm_unsure(float(y), r)) for y in libm[:20000])
    assert unsure > 1000


def test_libm_unsure_is_exact_about_its_window():
    r = lane(fmt_of("float32"), 0)
    mid = 1.0 + 2.0**-24  # a float32 midpoint
    ulp = 2.0**-52
    assert libm_unsure(mid, r) and libm_unsure(mid + 4 * ulp, r) and libm_unsure(mid - 4 * ulp, r)
    assert not libm_unsure(mid + 5 * ulp, r) and not libm_unsure(mid - 5 * ulp, r)
    assert not libm_unsure(1.0 + 2.0**-23, r)  # a float32 value: far from every midpoint
    for y in (0.0, math.inf, math.nan, 5e-324):
        assert libm_unsure(y, r)
    assert not libm_unsure(mid, lane(fmt_of("float64"), 0))  # float64 keeps libm's value (native lane)
