"""simfloat.quantize_block: MX (OCP v1.0) and NVFP4 block quantization against the spec's formulas written out
with numpy, element rounding against ml_dtypes, e8m0 scale rounding against torch's float8_e8m0fnu."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import simfloat
from simfloat.blockscale import MXFP4, MXFP6_E2M3, MXFP6_E3M2, MXFP8_E4M3, MXFP8_E5M2, NVFP4, block_format

MX = [MXFP8_E4M3, MXFP8_E5M2, MXFP6_E2M3, MXFP6_E3M2, MXFP4]
ML = {
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
    "float6_e2m3fn": ml_dtypes.float6_e2m3fn,
    "float6_e3m2fn": ml_dtypes.float6_e3m2fn,
    "float4_e2m1fn": ml_dtypes.float4_e2m1fn,
}


def _data(rows: int, n: int, seed: int) -> np.ndarray:
    """Rows of very different magnitudes, exact zeros, subnormal-scale values, a few outliers."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, n)) * np.exp2(rng.integers(-30, 30, (rows, 1)))
    x[rng.random((rows, n)) < 0.05] = 0.0
    x[0, :] = 0.0  # an all-zero row: all-zero blocks
    x[1, ::7] *= 1000.0
    return x.astype(np.float32)


def _ocp_scales(x: np.ndarray, block: int, emax: int) -> np.ndarray:
    """OCP MX v1.0, 6.3: X = 2**(floor(log2(amax)) - emax_elem), clamped to e8m0's range (2**-127 for 0)."""
    pad = np.pad(np.abs(x.astype(np.float64)), ((0, 0), (0, -x.shape[1] % block)))
    amax = pad.reshape(x.shape[0], -1, block).max(axis=-1)
    _, e = np.frexp(amax)  # amax = m * 2**e, 0.5 <= m < 1: floor(log2 amax) = e - 1
    return np.where(amax > 0, np.exp2(np.clip(e - 1 - emax, -127, 127).astype(np.float64)), 2.0**-127)


@pytest.mark.parametrize("n", [1, 97, 257])
@pytest.mark.parametrize("bf", MX, ids=lambda b: b.name)
def test_mx_matches_the_spec_and_ml_dtypes(bf, n: int) -> None:  # type: ignore[no-untyped-def]
    x = _data(6, n, n)
    q = bf.quantize(x)
    ef = simfloat.format(bf.elem_fmt)
    want = _ocp_scales(x, 32, ef.emax)
    assert q.scales.shape == (6, -(-n // 32))
    assert np.array_equal(q.scales, want)
    # elements: v / X (exact, a power of two) clamped to +-max, rounded to nearest-even by ml_dtypes
    per = np.repeat(want, 32, axis=1)[:, :n]
    ref = np.clip(x / per, -ef.max, ef.max).astype(ML[ef.name]).astype(np.float64)
    assert np.array_equal(q.codes.view(np.uint64), ref.view(np.uint64))
    assert np.array_equal(q.dequantize(), q.codes * per)


def test_ceil_and_nearest_scales() -> None:
    x = _data(5, 97, 3).astype(np.float64)
    for rounding, mode in (("ceil", "up"), ("rceil", "up"), ("nearest", "nearest_even")):
        q = simfloat.quantize_block(x, "e4m3", block=32, scale_rounding=rounding)
        amax = np.pad(np.abs(x), ((0, 0), (0, 31))).reshape(5, -1, 32)[:, :4].max(axis=-1)
        # the quotient amax / 448 in float64 is exact enough here to check the power of two by frexp
        ratio = amax / 448.0
        m, e = np.frexp(ratio)
        if mode == "up":
            ref = np.where(m == 0.5, ratio, np.exp2(e.astype(np.float64)))
            assert np.all(np.abs(q.codes) <= 448.0)  # RCEIL: no element saturates
        else:
            ref = np.exp2((e - 1 + (m >= 0.75)).astype(np.float64))
        ref = np.where(amax > 0, np.clip(ref, 2.0**-127, 2.0**127), 2.0**-127)
        assert np.array_equal(q.scales, ref), rounding
    # nearest e8m0 scales agree with torch's float8_e8m0fnu conversion of the same (float32-exact) quotients
    torch = pytest.importorskip("torch")
    r = np.exp2(np.linspace(-40, 40, 1001)).astype(np.float32) * np.float32(448.0)
    q = simfloat.quantize_block(r[:, None], "e4m3", block=1, scale_rounding="nearest")
    t = torch.from_numpy(r / np.float32(448.0)).to(torch.float8_e8m0fnu).float().numpy()
    assert np.array_equal(q.scales[:, 0], t.astype(np.float64))


def test_nvfp4_two_level() -> None:
    x = _data(4, 64, 5).astype(np.float64) * 1e-3
    x[0, 0] = 1.0  # the tensor amax, so no block scale underflows badly
    q = NVFP4.quantize(x, global_scale="auto")
    g = float(np.float32(np.abs(x).max() / (448.0 * 6.0)))
    assert q.global_scale == g and q.scales.shape == (4, 4)
    amax = np.abs(x).reshape(4, 4, 16).max(axis=-1)
    # ue4m3 scale = amax / (6 g) rounded to nearest once (same as ml_dtypes' e4m3fn of the float64 quotient
    # where float32 holds the quotient's rounding; positive values only)
    ref = np.minimum((amax / (6.0 * g)).astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float64), 448)
    assert np.array_equal(q.scales, ref)
    per = np.repeat(q.scales, 16, axis=1) * g
    ok = per > 0
    ref_codes = np.where(ok, np.clip(x / np.where(ok, per, 1), -6, 6), 0.0).astype(ml_dtypes.float4_e2m1fn)
    assert np.array_equal(q.codes, ref_codes.astype(np.float64))
    err = np.abs(q.dequantize() - x)
    # half of fp4's widest gap (4 to 6) at the block's scale, or the saturated excess beyond 6
    assert np.all(err <= np.maximum(per, np.abs(x) - 6.0 * per))


def test_2d_tiles_and_axes() -> None:
    x = _data(40, 33, 7)
    q = simfloat.quantize_block(x, "e2m1", block=(16, 16))
    assert q.scales.shape == (3, 3) and q.axes == (0, 1)
    # the tile's scale is the 1-D scale of its 256 elements laid out in one row
    tile = x[16:32, 16:32].reshape(1, -1)
    one = simfloat.quantize_block(tile, "e2m1", block=256)
    assert q.scales[1, 1] == one.scales[0, 0]
    assert np.array_equal(q.codes[16:32, 16:32].reshape(1, -1), one.codes)
    # blocks along axis 0 are blocks along the last axis of the transpose
    a = simfloat.quantize_block(x, "e4m3", block=32, axis=0)
    b = simfloat.quantize_block(np.ascontiguousarray(x.T), "e4m3", block=32)
    assert np.array_equal(a.scales, b.scales.T) and np.array_equal(a.codes, b.codes.T)


def test_specials_and_errors() -> None:
    x = np.ones((2, 32), np.float32)
    x[0, 3] = np.nan
    x[1, 5] = np.inf
    q = MXFP8_E4M3.quantize(x)
    assert np.isnan(q.scales).all() and np.isnan(q.dequantize()).all()
    z = MXFP8_E4M3.quantize(np.zeros((1, 32), np.float32))
    assert z.scales[0, 0] == 2.0**-127 and (z.dequantize() == 0).all()
    assert block_format("NVFP4") is NVFP4
    with pytest.raises(ValueError, match="scale_rounding"):
        simfloat.quantize_block(x, "e4m3", block=32, scale_rounding="stochastic")
    with pytest.raises(ValueError, match="block"):
        simfloat.quantize_block(x, "e4m3", block=0)
    with pytest.raises(ValueError, match="axis"):
        simfloat.quantize_block(x, "e4m3", block=(4, 4), axis=1)
    with pytest.raises(TypeError, match="x must be"):
        simfloat.quantize_block(np.ones((2, 32), np.int32), "e4m3", block=32)
    with pytest.raises(ValueError, match="float32 value"):
        simfloat.quantize_block(x, "fp4", block=16, scale_fmt="ue4m3", global_scale=0.1)
    with pytest.raises(ValueError, match="unknown block format"):
        block_format("mxint8")
    with pytest.raises(ValueError, match="BlockFormat.elem_fmt"):
        simfloat.BlockFormat("e9m9x", 32)
