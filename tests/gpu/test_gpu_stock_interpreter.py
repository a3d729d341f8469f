"""What the *stock* Triton interpreter (TRITON_INTERPRET=1) computes for low-precision arithmetic.

Each test pins down one stock behaviour documented in simfloat_gpu/interpreter/NOTES.md, most of them ways in
which it differs from a GPU. They assert that the stock (wrong) behaviour exists, so that a later
faithful interpreter can be tested against the same inputs. Where a suspected failure turned out not to
exist in the installed triton, the test documents the actual behaviour instead (see the fma tests).

References come from numpy / ml_dtypes, never from simfloat, so these tests stand on their own.
"""

import os

# @triton.jit picks the interpreter at decoration time, and triton.language decorates its own helpers
# (tl.sum, tl.max, ...) when triton is first imported: this must run before anything imports triton.
os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
ml_dtypes = pytest.importorskip("ml_dtypes")
import triton.language as tl  # noqa: E402
from triton_kernels import (  # noqa: E402
    _cast_kernel,
    _cast_rounding_kernel,
    _dot_kernel,
    _fma_kernel,
    _neg_lt_kernel,
    _row_sum_kernel,
)

if type(triton.language.standard.sum).__name__ != "InterpretedFunction":
    raise RuntimeError(
        "triton was imported before TRITON_INTERPRET=1 was set (by an earlier test module or "
        "plugin); set it at the top of tests/conftest.py"
    )

pytestmark = pytest.mark.triton

# ----------------------------------------------------------------------------------------------------
# tiny kernels
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _add_kernel(A, B, Y, N: tl.constexpr):
    r = tl.arange(0, N)
    tl.store(Y + r, tl.load(A + r) + tl.load(B + r))


@triton.jit
def _unary_kernel(X, Y, N: tl.constexpr, OP: tl.constexpr):
    r = tl.arange(0, N)
    x = tl.load(X + r)
    if OP == "exp":
        y = tl.exp(x)
    elif OP == "exp2":
        y = tl.math.exp2(x)
    else:
        y = tl.log(x)
    tl.store(Y + r, y)


def _cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    y = torch.empty(x.shape, dtype=dtype)
    _cast_kernel[(1,)](x, y, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    return y


def _bits16(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.int16).numpy().view(np.uint16)


def _fp8_value(t: torch.Tensor, mdt) -> np.ndarray:
    return t.view(torch.uint8).numpy().view(mdt).astype(np.float64)


def _tf32_rne(x: np.ndarray) -> np.ndarray:
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0xFFF + ((bits >> 13) & 1)) & 0xFFFFE000
    return bits.astype(np.uint32).view(np.float32)


# ----------------------------------------------------------------------------------------------------
# (2) tl.dot
# ----------------------------------------------------------------------------------------------------


def test_bf16_dot_multiplies_raw_bit_patterns():
    """bf16 is stored as uint16; create_dot feeds those integers to np.matmul: garbage."""
    torch.manual_seed(0)
    a = torch.randn(16, 16, dtype=torch.bfloat16)
    b = torch.randn(16, 16, dtype=torch.bfloat16)
    c = torch.empty(16, 16, dtype=torch.float32)
    _dot_kernel[(1,)](a, b, c, 16, 16, 16, "ieee")

    stock = np.matmul(_bits16(a), _bits16(b), dtype=np.float32) + np.float32(0)
    np.testing.assert_array_equal(c.numpy(), stock)
    true = a.double() @ b.double()
    assert (c.double() - true).abs().min() > 1e9  # every entry is ~1e10 instead of O(1)


def test_fp16_dot_is_correct_up_to_fp32_summation():
    torch.manual_seed(1)
    a = torch.randn(16, 32, dtype=torch.float16)
    b = torch.randn(32, 16, dtype=torch.float16)
    c = torch.empty(16, 16, dtype=torch.float32)
    _dot_kernel[(1,)](a, b, c, 16, 16, 32, "ieee")
    np.testing.assert_array_equal(c.numpy(), np.matmul(a.numpy(), b.numpy(), dtype=np.float32))
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=0, atol=1e-5)


def test_fp32_dot_ignores_tf32():
    """input_precision='tf32' is accepted but the product is plain fp32 (BLAS sgemm)."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((16, 32)).astype(np.float32)
    b = rng.standard_normal((32, 16)).astype(np.float32)
    outs = {}
    for precision in ("tf32", "ieee"):
        c = torch.empty(16, 16, dtype=torch.float32)
        _dot_kernel[(1,)](torch.from_numpy(a), torch.from_numpy(b), c, 16, 16, 32, precision)
        outs[precision] = c.numpy()
    np.testing.assert_array_equal(outs["tf32"], outs["ieee"])
    exact = a.astype(np.float64) @ b.astype(np.float64)
    tf32_ref = _tf32_rne(a).astype(np.float64) @ _tf32_rne(b).astype(np.float64)
    assert np.abs(outs["tf32"] - exact).max() < 1e-5  # fp32-accurate ...
    assert np.abs(tf32_ref - exact).max() > 1e-4  # ... where tf32 operands would be ~1e-3 off


# ----------------------------------------------------------------------------------------------------
# (3) casts
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rounding", [None, "rtne"])
def test_fp32_to_bf16_cast_truncates(rounding):
    """fp32 -> bf16 goes through create_fp_trunc -> _convert_float(rounding_mode=None): the low 16 bits
    are dropped (round toward zero), even when round-to-nearest-even is requested explicitly."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(4096) * 3).astype(np.float32)
    y = torch.empty(4096, dtype=torch.bfloat16)
    if rounding is None:
        _cast_kernel[(1,)](torch.from_numpy(x), y, 4096, BLOCK=4096)
    else:
        _cast_rounding_kernel[(1,)](torch.from_numpy(x), y, 4096, BLOCK=4096, ROUNDING=rounding)
    got = _bits16(y)
    np.testing.assert_array_equal(got, (x.view(np.uint32) >> 16).astype(np.uint16))
    rne = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    off = got != rne
    assert 0.4 < off.mean() < 0.6  # about half the values are one ulp off ...
    assert np.all(np.abs(got.astype(np.int32) - rne.astype(np.int32))[off] == 1)  # ... by exactly one ulp
    assert np.all(np.abs(y.double().numpy()) <= np.abs(x))  # always toward zero


def test_fp32_to_bf16_cast_rtz_is_right():
    v = 1 + 2**-7 + 2**-8 + 2**-9  # above the midpoint: RNE would give 1 + 2**-6
    x = np.array([v, -v, 3.0], dtype=np.float32)
    y = torch.empty(3, dtype=torch.bfloat16)
    _cast_rounding_kernel[(1,)](torch.from_numpy(x), y, 3, BLOCK=4, ROUNDING="rtz")
    assert y.tolist() == [1 + 2**-7, -(1 + 2**-7), 3.0]


def test_fp32_to_fp16_cast_is_right():
    """fp16 has a numpy dtype, so the cast is numpy's astype: correct round-to-nearest-even."""
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(4096) * 100).astype(np.float32)
    y = _cast(torch.from_numpy(x), torch.float16)
    np.testing.assert_array_equal(y.numpy(), x.astype(np.float16))


E4M3 = (torch.float8_e4m3fn, "float8_e4m3fn")
E5M2 = (torch.float8_e5m2, "float8_e5m2")


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3fn", "e5m2"])
def test_fp32_to_fp8_rounding_is_wrong(fmt):
    """_convert_float(RTNE): adds the first cut-off bit (ties round away from zero, not to even), ORs the
    rounded mantissa into the exponent field (a carry out of the mantissa is lost when the exponent is
    odd: the result halves), and shifts subnormal results without rounding."""
    tdt, name = fmt
    mdt = getattr(ml_dtypes, name)
    rng = np.random.default_rng(5)
    fmax = float(ml_dtypes.finfo(mdt).max)
    x = np.clip(rng.standard_normal(4096) * 4, -0.9 * fmax, 0.9 * fmax).astype(np.float32)
    got = _fp8_value(_cast(torch.from_numpy(x), tdt), mdt)
    ref = x.astype(mdt).astype(np.float64)
    assert 0.01 < np.mean(got != ref) < 0.1

    # ties between consecutive positive finite values: RNE picks the even code, stock does not
    codes = np.arange(256, dtype=np.uint8).view(mdt).astype(np.float64)
    pos = np.unique(codes[np.isfinite(codes) & (codes > 0)])
    mids = ((pos[:-1] + pos[1:]) / 2).astype(np.float32)
    got = _fp8_value(_cast(torch.from_numpy(mids), tdt), mdt)
    ref = mids.astype(mdt).astype(np.float64)
    assert np.mean(got != ref) > 0.3


def test_fp32_to_e4m3_examples():
    mdt = ml_dtypes.float8_e4m3fn
    x = np.array(
        [
            7.841033,  # rounds up to 8.0; carry lost (odd exponent) -> 4.0
            0.0166015625,  # tie between 0.015625 (even) and 0.017578125 -> rounds away
            0.00146484375,  # 0.75 * smallest subnormal -> truncated to 0
            np.inf,  # -> 256.0 (exponent clamped, mantissa bits kept)
            np.nan,  # -> 384.0
            470.0,  # above max 448 -> NaN code 0x7f (GPU satfinite would give 448)
        ],
        dtype=np.float32,
    )
    got = _fp8_value(_cast(torch.from_numpy(x), torch.float8_e4m3fn), mdt)
    assert got[:5].tolist() == [4.0, 0.017578125, 0.0, 256.0, 384.0]
    assert np.isnan(got[5])
    ref = x[:3].astype(mdt).astype(np.float64)
    assert ref.tolist() == [8.0, 0.015625, 0.001953125]


def test_fp8_to_fp32_upcast_loses_specials():
    """Upcasts rebias the exponent without special-casing all-ones exponents."""
    codes = torch.tensor([0x7F, 0xFF], dtype=torch.uint8).view(torch.float8_e4m3fn)  # e4m3fn NaN
    assert _cast(codes, torch.float32).tolist() == [480.0, -480.0]
    codes = torch.tensor([0x7C, 0xFC, 0x7E], dtype=torch.uint8).view(torch.float8_e5m2)  # +-inf, NaN
    assert _cast(codes, torch.float32).tolist() == [65536.0, -65536.0, 98304.0]


# ----------------------------------------------------------------------------------------------------
# (4) fma and elementwise bf16
# ----------------------------------------------------------------------------------------------------


def test_fp32_fma_is_fused_in_this_triton():
    """The suspected double rounding (x*y+z) does NOT reproduce in triton 3.9: create_fma calls the C++
    fma_fp32. (triton 3.6's interpreter computes x.data * y.data + z.data and would return 0 here.)"""
    a = torch.full((16,), 1 + 2**-12, dtype=torch.float32)
    c = torch.full((16,), -(1 + 2**-11), dtype=torch.float32)
    y = torch.empty(16, dtype=torch.float32)
    _fma_kernel[(1,)](a, a, c, y, 16)
    double_rounded = np.float32(a[0].item()) * np.float32(a[0].item()) + np.float32(c[0].item())
    assert double_rounded == 0.0
    if tuple(int(p) for p in triton.__version__.split(".")[:2]) >= (3, 9):
        assert torch.all(y == 2.0**-24)  # exact a*a+c, rounded once


def test_fp16_fma_is_fused():
    """fp16 fma goes through a float64 product and sum: exact here, one final rounding."""
    a = torch.full((16,), 1 + 2**-10, dtype=torch.float16)
    c = torch.full((16,), -(1 + 2**-9), dtype=torch.float16)
    y = torch.empty(16, dtype=torch.float16)
    _fma_kernel[(1,)](a, a, c, y, 16)
    assert torch.all(y == 2.0**-20)


def test_bf16_fma_add_neg_and_compare_operate_on_raw_bits():
    bf = torch.bfloat16
    a = torch.ones(16, dtype=bf)
    b = torch.ones(16, dtype=bf)
    y = torch.empty(16, dtype=bf)
    _add_kernel[(1,)](a, b, y, 16)
    assert np.all(_bits16(y) == 0x3F80 + 0x3F80)  # 1.0 + 1.0 == 1.7e38
    c = torch.full((16,), 0.5, dtype=bf)
    _fma_kernel[(1,)](a, b, c, y, 16)
    assert not torch.any(y == 1.5)
    x = torch.tensor([1.0, -1.0, 0.25, -2.0] * 4, dtype=bf)
    lt = torch.empty(16, dtype=torch.int8)
    _neg_lt_kernel[(1,)](x, y, lt, 16)
    assert y[:4].tolist() == [-4.0, 4.0, -16.0, 2.0]  # np.negative on uint16 bits (wraps), not -x
    assert lt[:4].tolist() == [0, 0, 1, 0]  # x < 0.5 compares unsigned bit patterns: negatives look huge


# ----------------------------------------------------------------------------------------------------
# (5) transcendental functions
# ----------------------------------------------------------------------------------------------------


def test_exp_is_numpy_exp_not_exp2_of_scaled_input():
    """tl.exp is np.exp on float32 (GPU: ex2.approx(x * log2e)); exp2 and log are numpy's too."""
    rng = np.random.default_rng(6)
    x = (rng.standard_normal(1024) * 10).astype(np.float32)
    xt = torch.from_numpy(x)
    y = torch.empty(1024, dtype=torch.float32)
    _unary_kernel[(1,)](xt, y, 1024, "exp")
    np.testing.assert_array_equal(y.numpy(), np.exp(x))
    via_exp2 = np.exp2(x * np.float32(1.4426950408889634))
    assert np.any(y.numpy() != via_exp2)
    _unary_kernel[(1,)](xt, y, 1024, "exp2")
    np.testing.assert_array_equal(y.numpy(), np.exp2(x))
    pos = torch.from_numpy(np.abs(x) + np.float32(0.5))
    _unary_kernel[(1,)](pos, y, 1024, "log")
    np.testing.assert_array_equal(y.numpy(), np.log(pos.numpy()))


# ----------------------------------------------------------------------------------------------------
# (6) reductions
# ----------------------------------------------------------------------------------------------------


def test_sum_is_numpy_sum_not_a_sequential_fold():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((4, 1024)) * np.exp2(rng.integers(-8, 8, (4, 1024)))).astype(np.float32)
    y = torch.empty(4, dtype=torch.float32)
    _row_sum_kernel[(1,)](torch.from_numpy(x), y, 4, 1024)
    np.testing.assert_array_equal(y.numpy(), np.sum(x, axis=1))
    sequential = np.zeros(4, dtype=np.float32)
    for j in range(x.shape[1]):
        sequential = sequential + x[:, j]
    assert np.any(y.numpy() != sequential)


def test_bf16_sum_adds_raw_bits():
    ones = torch.ones(1, 16, dtype=torch.bfloat16)
    y = torch.empty(1, dtype=torch.bfloat16)
    _row_sum_kernel[(1,)](ones, y, 1, 16)
    assert _bits16(y)[0] == (16 * 0x3F80) & 0xFFFF  # 0xF800, about -1e34, instead of 16.0


def test_fp64_and_int_to_bf16_store_the_number_as_bits():
    """cast_impl special-cases only fp32 <-> bf16; anything else is numpy astype(uint16) of the value."""
    for src in (torch.full((4,), 1.5, dtype=torch.float64), torch.full((4,), 3, dtype=torch.int32)):
        y = _cast(src, torch.bfloat16)
        assert np.all(_bits16(y) == np.uint16(int(src[0].item())))  # 1 and 3 as bit patterns: subnormals
