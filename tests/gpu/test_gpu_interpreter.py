"""simfloat_gpu.interpreter.faithful(): the stock interpreter's failures (tests/gpu/test_gpu_stock_interpreter.py),
fixed.

Each stock failure is re-run with the same kind of kernel inside ``faithful()`` and checked against references
that do not go through simfloat_gpu.interpreter: simfloat's models and roundings, ml_dtypes, numpy and exact Fractions.
"""

import math
import os

# @triton.jit picks the interpreter at decoration time, and triton.language decorates its own helpers
# (tl.sum, tl.max, ...) when triton is first imported: this must run before anything imports triton.
os.environ["TRITON_INTERPRET"] = "1"

from fractions import Fraction  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
ml_dtypes = pytest.importorskip("ml_dtypes")
import triton.language as tl  # noqa: E402
import triton.runtime.interpreter as ti  # noqa: E402
from triton_kernels import (  # noqa: E402
    _cast_kernel,
    _cast_rounding_kernel,
    _dot_kernel,
    _fma_kernel,
    _neg_lt_kernel,
    _row_sum_kernel,
)

import simfloat  # noqa: E402
import simfloat.ops as sops  # noqa: E402
from simfloat.accumulate import Chunked, Sequential, matmul, tensor_core  # noqa: E402
from simfloat_gpu.interpreter import (  # noqa: E402
    FaithfulNotImplementedError,
    faithful,
    faithful_config,
    faithful_interpreter,  # noqa: F401  (the fixture, found by name)
)

if type(triton.language.standard.sum).__name__ != "InterpretedFunction":
    raise RuntimeError(
        "triton was imported before TRITON_INTERPRET=1 was set (by an earlier test module or "
        "plugin); set it at the top of tests/conftest.py"
    )

pytestmark = pytest.mark.triton

# ----------------------------------------------------------------------------------------------------
# kernels (the stock tests' kernels, plus a few variants)
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _dot_acc_kernel(A, B, C, Y, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, IMPRECISE: tl.constexpr):
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    rk = tl.arange(0, K)
    a = tl.load(A + rm[:, None] * K + rk[None, :])
    b = tl.load(B + rk[:, None] * N + rn[None, :])
    acc = tl.load(C + rm[:, None] * N + rn[None, :])
    if IMPRECISE >= 0:
        acc = tl.dot(a, b, acc, max_num_imprecise_acc=IMPRECISE)
    else:
        acc = tl.dot(a, b, acc)
    tl.store(Y + rm[:, None] * N + rn[None, :], acc)


@triton.jit
def _binop_kernel(A, B, Y, N: tl.constexpr, OP: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(A + r)
    b = tl.load(B + r)
    if OP == "add":
        y = a + b
    elif OP == "sub":
        y = a - b
    elif OP == "mul":
        y = a * b
    elif OP == "div":
        y = a / b
    else:
        y = tl.math.div_rn(a, b)
    tl.store(Y + r, y)


@triton.jit
def _unary_kernel(X, Y, N: tl.constexpr, OP: tl.constexpr):
    r = tl.arange(0, N)
    x = tl.load(X + r)
    if OP == "exp":
        y = tl.exp(x)
    elif OP == "exp2":
        y = tl.math.exp2(x)
    elif OP == "log":
        y = tl.log(x)
    elif OP == "log2":
        y = tl.log2(x)
    elif OP == "sqrt":
        y = tl.sqrt(x)
    elif OP == "sqrt_rn":
        y = tl.sqrt_rn(x)
    else:
        y = tl.sin(x)
    tl.store(Y + r, y)


@triton.jit
def _row_max_kernel(X, Y, IDX, R: tl.constexpr, N: tl.constexpr):
    rr = tl.arange(0, R)
    rn = tl.arange(0, N)
    x = tl.load(X + rr[:, None] * N + rn[None, :])
    tl.store(Y + rr, tl.max(x, 1))
    tl.store(IDX + rr, tl.argmax(x, 1))


# ----------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------


def _bits16(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.int16).numpy().view(np.uint16)


def _codes8(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.uint8).numpy()


def _run_cast(x: torch.Tensor, dtype: torch.dtype, rounding=None) -> torch.Tensor:
    y = torch.empty(x.shape, dtype=dtype)
    block = triton.next_power_of_2(max(x.numel(), 2))
    if rounding is None:
        _cast_kernel[(1,)](x, y, x.numel(), BLOCK=block)
    else:
        _cast_rounding_kernel[(1,)](x, y, x.numel(), BLOCK=block, ROUNDING=rounding)
    return y


def _rn32(q: Fraction) -> np.float32:
    """Nearest fp32 to an exact rational (ties to even), by comparing the neighbours exactly."""
    f = np.float32(float(q))
    cands = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    cands = [c for c in cands if np.isfinite(c)]
    best = min(abs(Fraction(float(c)) - q) for c in cands)
    near = [c for c in cands if abs(Fraction(float(c)) - q) == best]
    return min(near, key=lambda c: int(np.array(c, dtype=np.float32).view(np.uint32)) & 1)


def _fp32_probe_values(rng, n=4096) -> np.ndarray:
    """Random fp32 over the whole exponent range, plus bf16/fp16 ties, subnormals, overflow and specials."""
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x)]
    hi16 = rng.integers(0, 2**16, 512, dtype=np.uint64).astype(np.uint32)
    ties16 = ((hi16 << 16) | 0x8000).view(np.float32)
    ties16 = ties16[np.isfinite(ties16)]
    normal = (rng.standard_normal(1024) * 3).astype(np.float32)
    sub = (rng.standard_normal(256) * 2.0**-130).astype(np.float32)  # fp32 subnormals
    small = (rng.standard_normal(256) * 2.0**-128).astype(np.float32)
    fp16_ties = (np.arange(1, 1024, dtype=np.float32) + np.float32(0.5)) * np.float32(2**-10)
    big = np.array(
        [
            3.3895e38,
            3.4e38,
            3.389531e38,
            65504,
            65519.99,
            65520,
            1e6,
            -1e6,
            np.finfo(np.float32).max,
            np.inf,
            -np.inf,
            0.0,
            -0.0,
            2.0**-149,
            -(2.0**-149),
            2.0**-133,
            2.0**-134,
            3 * 2.0**-135,
        ],
        dtype=np.float32,
    )
    return np.concatenate([x, ties16, normal, sub, small, fp16_ties, big]).astype(np.float32)


def _same_bits_or_both_nan(got: np.ndarray, want: np.ndarray, nan: np.ndarray) -> None:
    assert np.array_equal(got[~nan], want[~nan])


# ----------------------------------------------------------------------------------------------------
# (2) tl.dot
# ----------------------------------------------------------------------------------------------------


def test_bf16_dot_equals_the_sm90_model_bit_for_bit():
    """Stock: the uint16 patterns are multiplied as integers. Now: simfloat.matmul, tensor_core("sm90")."""
    torch.manual_seed(0)
    a = torch.randn(16, 64, dtype=torch.bfloat16)
    b = torch.randn(64, 32, dtype=torch.bfloat16)
    c = torch.empty(16, 32, dtype=torch.float32)
    with faithful():
        _dot_kernel[(1,)](a, b, c, 16, 32, 64, "ieee")
    want = matmul(a.double().numpy(), b.double().numpy(), acc=tensor_core("sm90", "bf16"))
    np.testing.assert_array_equal(c.numpy(), want)
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=0, atol=1e-4)


def test_fp16_dot_and_the_accumulator_operand_enter_the_model():
    """tl.dot(a, b, acc): acc is the model's incoming accumulator (stock: added after the product)."""
    torch.manual_seed(1)
    a = torch.randn(16, 32, dtype=torch.float16)
    b = torch.randn(32, 16, dtype=torch.float16)
    acc = torch.randn(16, 16, dtype=torch.float32) * 100
    y = torch.empty(16, 16, dtype=torch.float32)
    with faithful():
        _dot_acc_kernel[(1,)](a, b, acc, y, 16, 16, 32, -1)
    want = matmul(a.double().numpy(), b.double().numpy(), acc.double().numpy(), acc=tensor_core("sm90", "fp16"))
    np.testing.assert_array_equal(y.numpy(), want)


def test_fp32_dot_tf32_and_ieee_follow_their_models():
    """Stock: input_precision is ignored (numpy sgemm). Now tf32 truncates operands (tensor_core "tf32") and
    ieee is an fp32 fma loop in k order, checked against exact Fractions."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((16, 32)).astype(np.float32)
    b = rng.standard_normal((32, 16)).astype(np.float32)
    outs = {}
    with faithful():
        for precision in ("tf32", "ieee"):
            c = torch.empty(16, 16, dtype=torch.float32)
            _dot_kernel[(1,)](torch.from_numpy(a), torch.from_numpy(b), c, 16, 16, 32, precision)
            outs[precision] = c.numpy()
    np.testing.assert_array_equal(outs["tf32"], matmul(a, b, acc=tensor_core("sm90", "tf32")))
    np.testing.assert_array_equal(outs["ieee"], matmul(a, b, acc=Sequential("float32")))
    assert not np.array_equal(outs["tf32"], outs["ieee"])
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(outs["tf32"] - exact).max() > 1e-4 > np.abs(outs["ieee"] - exact).max()
    for i, j in [(0, 0), (3, 7), (15, 15)]:  # the fma loop, exactly
        s = Fraction(0)
        for kk in range(32):
            s = Fraction(float(_rn32(s + Fraction(float(a[i, kk])) * Fraction(float(b[kk, j])))))
        assert outs["ieee"][i, j] == np.float32(float(s))


def test_int8_dot_is_exact():
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, (16, 64), dtype=np.int8)
    b = rng.integers(-128, 128, (64, 16), dtype=np.int8)
    c = torch.empty(16, 16, dtype=torch.int32)
    with faithful():
        _dot_kernel[(1,)](torch.from_numpy(a), torch.from_numpy(b), c, 16, 16, 64, "ieee")
    np.testing.assert_array_equal(c.numpy(), a.astype(np.int64) @ b.astype(np.int64))


@pytest.mark.parametrize("imprecise", [-1, 32])
def test_fp8_dot_follows_the_sm90_fp8_model(imprecise):
    """Default (sm90: no promotion) -> tensor_core("sm90", "e4m3"); max_num_imprecise_acc=32 -> the partial
    sum of every 32 products is added into the fp32 accumulator (Triton's WGMMA lowering)."""
    rng = np.random.default_rng(4)
    a = torch.from_numpy(rng.standard_normal((16, 64)).astype(np.float32)).to(torch.float8_e4m3fn)
    b = torch.from_numpy(rng.standard_normal((64, 16)).astype(np.float32)).to(torch.float8_e4m3fn)
    acc = torch.from_numpy((rng.standard_normal((16, 16)) * 4).astype(np.float32))
    y = torch.empty(16, 16, dtype=torch.float32)
    with faithful():
        _dot_acc_kernel[(1,)](a, b, acc, y, 16, 16, 64, imprecise)
    model = tensor_core("sm90", "e4m3")
    if imprecise >= 0:
        model = Chunked(chunk=32, inner=model, outer_fmt="float32", outer_mode="nearest_even")
    want = matmul(a.double().numpy(), b.double().numpy(), acc.double().numpy(), acc=model)
    np.testing.assert_array_equal(y.numpy(), want)


# ----------------------------------------------------------------------------------------------------
# (3) casts
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rounding", [None, "rtne", "rtz"])
def test_fp32_to_bf16_cast_rounds_as_asked(rounding):
    """Stock: truncation even when rtne is asked for. Now: RNE (= ml_dtypes) or toward zero, bit for bit, over
    random bit patterns, ties, subnormals, overflow and specials."""
    x = _fp32_probe_values(np.random.default_rng(5))
    with faithful():
        got = _bits16(_run_cast(torch.from_numpy(x), torch.bfloat16, rounding))
    nan = np.isnan(x)
    mode = "toward_zero" if rounding == "rtz" else "nearest_even"
    want = (simfloat.round(x, "bf16", mode).view(np.uint32) >> 16).astype(np.uint16)
    np.testing.assert_array_equal(got, want)
    truncated = (x.view(np.uint32) >> 16).astype(np.uint16)
    if rounding == "rtz":
        np.testing.assert_array_equal(got, truncated)  # toward zero is truncation of the bits
    else:
        np.testing.assert_array_equal(got, x.astype(ml_dtypes.bfloat16).view(np.uint16))
        assert np.mean(got != truncated) > 0.3
    assert not nan.any()


@pytest.mark.parametrize("rounding", [None, "rtz"])
def test_fp32_to_fp16_cast(rounding):
    x = _fp32_probe_values(np.random.default_rng(6))
    with faithful():
        got = _run_cast(torch.from_numpy(x), torch.float16, rounding).numpy()
    mode = "toward_zero" if rounding == "rtz" else "nearest_even"
    np.testing.assert_array_equal(
        got.view(np.uint16), simfloat.round(x, "fp16", mode).astype(np.float16).view(np.uint16)
    )
    if rounding is None:
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(got.view(np.uint16), x.astype(np.float16).view(np.uint16))


E4M3 = (torch.float8_e4m3fn, "float8_e4m3fn", "fp8e4nv")
E5M2 = (torch.float8_e5m2, "float8_e5m2", "fp8e5")


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3fn", "e5m2"])
def test_fp32_to_fp8_casts_are_rne_with_the_chosen_overflow(fmt):
    """Stock: ties away, lost carries, truncated subnormals, garbage specials. Now: RNE; overflow and inf ->
    +-max by default (cvt.rn.satfinite), or ml_dtypes' policy (fp8_overflow="ieee") bit for bit."""
    tdt, name, _ = fmt
    mdt = getattr(ml_dtypes, name)
    fmax = float(ml_dtypes.finfo(mdt).max)
    rng = np.random.default_rng(7)
    codes = np.arange(256, dtype=np.uint8).view(mdt).astype(np.float64)
    pos = np.unique(codes[np.isfinite(codes) & (codes > 0)])
    mids = (pos[:-1] + pos[1:]) / 2
    x = np.concatenate(
        [
            rng.standard_normal(2048) * 4,
            rng.standard_normal(512) * fmax,
            mids,
            -mids,
            [
                fmax * 1.2,
                -fmax * 1.2,
                1e30,
                np.inf,
                -np.inf,
                0.0,
                -0.0,
                pos[0] / 4,
                pos[0] * 0.75,
                7.841033,
                0.0166015625,
                0.00146484375,
                470.0,
            ],
        ]
    ).astype(np.float32)
    xt = torch.from_numpy(x)
    with faithful(fp8_overflow="ieee"):
        ieee = _codes8(_run_cast(xt, tdt))
    np.testing.assert_array_equal(ieee, x.astype(mdt).view(np.uint8))
    with faithful():
        sat = _codes8(_run_cast(xt, tdt)).view(mdt).astype(np.float64)
    fmt_sat = simfloat.format(name).replace(overflow="saturate")
    want = simfloat.round(x.astype(np.float64), fmt_sat)
    want = np.where(np.isinf(x), np.copysign(fmax, x), want)
    np.testing.assert_array_equal(sat, want)
    assert np.abs(sat).max() == fmax and not np.isnan(sat).any()
    if name == "float8_e4m3fn":  # the stock examples: 4.0, 0.017578125, 0.0 and NaN there
        assert sat[-4:].tolist() == [8.0, 0.015625, 0.001953125, 448.0]


def test_fp8_to_fp32_upcasts_keep_specials():
    """Stock: e4m3fn NaN -> 480, e5m2 inf -> 65536. Now every code decodes as ml_dtypes does."""
    for tdt, name, _ in (E4M3, E5M2):
        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(tdt)
        with faithful():
            got = _run_cast(codes, torch.float32).numpy()
        want = np.arange(256, dtype=np.uint8).view(getattr(ml_dtypes, name)).astype(np.float32)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


def test_fp8_rtz_casts():
    """fp32 -> e5m2 rtz (cvt.rz.f16 + top byte) is toward zero; the other rtz fp8 casts do not compile for
    sm_90, so they raise."""
    x = _fp32_probe_values(np.random.default_rng(8), 1024)
    x = x[~np.isnan(x)]
    with faithful():
        got = _codes8(_run_cast(torch.from_numpy(x), torch.float8_e5m2, "rtz")).view(ml_dtypes.float8_e5m2)
    want = simfloat.round(x.astype(np.float64), "float8_e5m2", "toward_zero")
    np.testing.assert_array_equal(got.astype(np.float64), want)
    with pytest.raises(NotImplementedError, match="rtz"), faithful():
        _run_cast(torch.from_numpy(x), torch.float8_e4m3fn, "rtz")


def test_fp64_and_int_to_bf16_casts_round_the_value():
    """Stock: astype(uint16) of the value (1.5 -> bits 0x0001). Now the value is rounded once."""
    with faithful():
        y64 = _run_cast(torch.tensor([1.5, -2.75, 1 + 2.0**-8 + 2.0**-40, 3.0e38], dtype=torch.float64), torch.bfloat16)
        yi = _run_cast(torch.tensor([3, -7, 257, 2**24 + 1], dtype=torch.int32), torch.bfloat16)
        # 2**60 + 2**52 + 1: just above a bf16 midpoint; via float64 it would be a tie rounding down
        yl = _run_cast(torch.tensor([2**60 + 2**52 + 1, -(2**60 + 2**52)], dtype=torch.int64), torch.bfloat16)
        back = _run_cast(torch.tensor([1.5, -3.7, 1e10, float("nan")], dtype=torch.bfloat16), torch.int32)
    assert y64.tolist() == [1.5, -2.75, 1 + 2.0**-7, float(ml_dtypes.bfloat16(3.0e38))]
    assert yi.tolist() == [3.0, -7.0, 256.0, 2.0**24]
    assert yl.tolist() == [2.0**60 + 2.0**53, -(2.0**60)]
    assert back.tolist() == [1, -3, 2**31 - 1, 0]  # cvt.rzi: truncation, saturation, NaN -> 0


# ----------------------------------------------------------------------------------------------------
# (4) fma and elementwise bf16
# ----------------------------------------------------------------------------------------------------


def test_fma_rounds_once():
    """Inputs where rounding twice (fp32, then the format) differs from the single rounding of fma.rn."""
    cases = [  # (dtype, a, c, fused, double-rounded)
        (torch.float32, 1 + 2.0**-12, -(1 + 2.0**-11), 2.0**-24, 0.0),
        (torch.bfloat16, 1 + 2.0**-4, 2.0**-30, 1 + 2.0**-3 + 2.0**-7, 1 + 2.0**-3),
    ]
    with faithful():
        for dtype, av, cv, fused, double in cases:
            a = torch.full((16,), av, dtype=dtype)
            c = torch.full((16,), cv, dtype=dtype)
            y = torch.empty(16, dtype=dtype)
            _fma_kernel[(1,)](a, a, c, y, 16)
            assert torch.all(y == fused) and fused != double
        # fp16: a*b + c with c = the smallest subnormal, a fp32 tie then an fp16 tie if rounded twice
        a = torch.full((16,), 1 + 2.0**-5, dtype=torch.float16)
        b = torch.full((16,), 1 + 2.0**-6, dtype=torch.float16)
        c = torch.full((16,), 2.0**-24, dtype=torch.float16)
        y = torch.empty(16, dtype=torch.float16)
        _fma_kernel[(1,)](a, b, c, y, 16)
    assert torch.all(y == 1 + 2.0**-5 + 2.0**-6 + 2.0**-10)
    # random fp32 against exact Fractions
    rng = np.random.default_rng(9)
    xa, xb, xc = (rng.standard_normal((3, 256)) * np.exp2(rng.integers(-20, 20, (3, 256)))).astype(np.float32)
    y = torch.empty(256, dtype=torch.float32)
    with faithful():
        _fma_kernel[(1,)](*(torch.from_numpy(v) for v in (xa, xb, xc)), y, 256)
    want = [
        _rn32(Fraction(float(p)) * Fraction(float(q)) + Fraction(float(r))) for p, q, r in zip(xa, xb, xc, strict=True)
    ]
    np.testing.assert_array_equal(y.numpy(), np.array(want, dtype=np.float32))


def test_bf16_elementwise_arithmetic_neg_and_compare():
    """Stock: 1 + 1 = 1.7e38, -(1.0) = -4, -1 < 0.5 is false. Now decoded, computed, rounded once (RNE)."""
    bf = torch.bfloat16
    one = torch.ones(16, dtype=bf)
    y = torch.empty(16, dtype=bf)
    x = torch.tensor([1.0, -1.0, 0.25, -2.0] * 4, dtype=bf)
    lt = torch.empty(16, dtype=torch.int8)
    with faithful():
        _binop_kernel[(1,)](one, one, y, 16, "add")
        assert torch.all(y == 2.0)
        _fma_kernel[(1,)](one, one, torch.full((16,), 0.5, dtype=bf), y, 16)
        assert torch.all(y == 1.5)
        _neg_lt_kernel[(1,)](x, y, lt, 16)
    assert y[:4].tolist() == [-1.0, 1.0, -0.25, 2.0]
    assert lt[:4].tolist() == [0, 1, 1, 1]
    rng = np.random.default_rng(10)
    a64, b64 = rng.standard_normal((2, 1024)) * np.exp2(rng.integers(-6, 6, (2, 1024)))
    a = torch.from_numpy(a64).to(bf)
    b = torch.from_numpy(b64).to(bf)
    ad, bd = a.double().numpy(), b.double().numpy()
    # exact in float64, or an innocuous double rounding (53 >= 2 * 8 + 2)
    refs = {"add": ad + bd, "sub": ad - bd, "mul": ad * bd, "div": ad / bd}
    with faithful():
        for op, ref in refs.items():
            out = torch.empty(1024, dtype=bf)
            _binop_kernel[(1,)](a, b, out, 1024, op)
            want = ref.astype(ml_dtypes.bfloat16).view(np.uint16)
            np.testing.assert_array_equal(_bits16(out), want, err_msg=op)


# ----------------------------------------------------------------------------------------------------
# (5) exp, exp2, log, division, sqrt
# ----------------------------------------------------------------------------------------------------


def _unary(x: np.ndarray, op: str) -> np.ndarray:
    y = torch.empty(x.shape, dtype=torch.float32)
    _unary_kernel[(1,)](torch.from_numpy(x), y, x.size, op)
    return y.numpy()


def test_exp2_and_exp_defaults_are_correctly_rounded_exp2():
    """Stock: np.exp / np.exp2. Now tl.exp2 = RN(2**x) and tl.exp = RN(2**rn32(x * 1.4426950f)), as NVIDIA
    lowers tl.exp (ex2.approx of the fp32 product)."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(1024) * 10).astype(np.float32)
    with faithful():
        e2 = _unary(x, "exp2")
        e = _unary(x, "exp")
    np.testing.assert_array_equal(e2, sops.exp2(x, "float32"))
    t = sops.mul(x, np.float32(1.4426950408889634), "float32")
    np.testing.assert_array_equal(e, sops.exp2(t, "float32"))
    assert np.any(e != np.exp(x)) and np.any(e != sops.exp(x, "float32"))


def test_exp2_model_hook_and_ftz():
    seen = []

    def ex2_model(v):
        seen.append(v.copy())
        return (sops.exp2(v, "float32") * np.float32(1 + 2.0**-20)).astype(np.float32)  # visibly different

    x = np.array([0.5, -3.25, 10.0, -130.0, 1e-40, -149.5, 2.0, -0.75], dtype=np.float32)
    with faithful(exp2=ex2_model) as cfg:
        got = _unary(x, "exp2")
        got_exp = _unary(x, "exp")
    assert cfg["exp2"].endswith("ex2_model") and len(seen) == 2
    exp2_in, exp_in = seen
    np.testing.assert_array_equal(exp2_in, x)
    np.testing.assert_array_equal(got, ex2_model(x))
    np.testing.assert_array_equal(exp_in, sops.mul(x, np.float32(1.4426950408889634), "float32"))
    np.testing.assert_array_equal(got_exp, ex2_model(exp_in))
    # ftz (ex2.approx.ftz): subnormal inputs and outputs flushed; tl.exp (ex2.approx.f32) is not flushed
    with faithful(ftz=True):
        flushed = _unary(x, "exp2")
        not_flushed = _unary(np.array([-90.0], dtype=np.float32), "exp")
    with faithful():
        plain = _unary(x, "exp2")
    assert plain[3] == 2.0**-130 and flushed[3] == 0.0 and plain[5] > 0 and flushed[5] == 0.0
    assert flushed[4] == 1.0 and 0 < not_flushed[0] < 2.0**-126
    keep = np.abs(plain) >= 2.0**-126
    np.testing.assert_array_equal(flushed[keep], plain[keep])


def test_log_log2_sqrt_and_division():
    rng = np.random.default_rng(12)
    x = np.abs(rng.standard_normal(512) * np.exp2(rng.integers(-60, 60, 512))).astype(np.float32)
    x = np.concatenate(
        [x, np.exp2(np.arange(-149, 128)).astype(np.float32), np.full(232, 1.5), [1.0, 0.0, np.inf]]
    ).astype(np.float32)  # 1024 values
    with faithful():
        lg = _unary(x, "log")
        lg2 = _unary(x, "log2")
        sq = _unary(x, "sqrt")
        sq_rn = _unary(x, "sqrt_rn")
    np.testing.assert_array_equal(lg, sops.log(x, "float32"))
    np.testing.assert_array_equal(sq, sops.sqrt(x, "float32"))
    np.testing.assert_array_equal(sq_rn, sq)
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workprec(200):
        for xi, yi in zip(x[:790], lg2[:790], strict=True):
            if xi == 0 or not np.isfinite(xi):
                continue
            sign, man, exp, _ = mpmath.log(mpmath.mpf(float(xi)), 2)._mpf_
            assert yi == _rn32((-1) ** sign * Fraction(int(man)) * Fraction(2) ** int(exp)), xi
    assert lg2[-3:].tolist() == [0.0, -np.inf, np.inf]
    # the slow path taken when float64's log2 lies within 2**-48 of an fp32 rounding boundary (rare)
    from simfloat_gpu.interpreter._math import log2_near_boundary

    with mpmath.workprec(200):
        for xi, yi in zip(x[:512:8], lg2[:512:8], strict=True):
            assert log2_near_boundary(float(xi)) == yi
    # '/' goes through the div model (div.full.f32 on the GPU); div_rn is always correctly rounded
    a = rng.standard_normal(256).astype(np.float32)
    b = rng.standard_normal(256).astype(np.float32)
    outs = {}

    def div_model(p, q):
        return (p / q).astype(np.float32) * np.float32(2)

    for model in ("correctly_rounded", div_model):
        with faithful(div=model):
            for op in ("div", "div_rn"):
                y = torch.empty(256, dtype=torch.float32)
                _binop_kernel[(1,)](torch.from_numpy(a), torch.from_numpy(b), y, 256, op)
                outs[(model if isinstance(model, str) else "model", op)] = y.numpy()
    cr = sops.div(a, b, "float32")
    for key in [("correctly_rounded", "div"), ("correctly_rounded", "div_rn"), ("model", "div_rn")]:
        np.testing.assert_array_equal(outs[key], cr)
    np.testing.assert_array_equal(outs[("model", "div")], div_model(a, b))


# ----------------------------------------------------------------------------------------------------
# (6) reductions
# ----------------------------------------------------------------------------------------------------


def _row_sums(x: np.ndarray, dtype=torch.float32) -> np.ndarray:
    y = torch.empty(x.shape[0], dtype=dtype)
    xt = torch.from_numpy(x).to(dtype)
    _row_sum_kernel[(1,)](xt, y, x.shape[0], x.shape[1])
    return y


@pytest.mark.parametrize("order", ["sequential", "pairwise", "chunked", "numpy"])
def test_sum_uses_the_selected_order(order):
    """Stock: np.sum. Now simfloat.ops.sum with reduce_order (default sequential, the emulator's order)."""
    rng = np.random.default_rng(13)
    x = (rng.standard_normal((4, 1024)) * np.exp2(rng.integers(-8, 8, (4, 1024)))).astype(np.float32)
    kwargs = {} if order == "sequential" else {"reduce_order": order}
    with faithful(**kwargs):
        got = _row_sums(x).numpy()
        assert faithful_config()["reduce_order"] == order
    np.testing.assert_array_equal(got, sops.sum(x, "float32", axis=1, order=order))
    if order == "numpy":
        np.testing.assert_array_equal(got, np.sum(x, axis=1))
    if order == "sequential":
        assert np.any(got != np.sum(x, axis=1))


@pytest.mark.parametrize("faithful_interpreter", [{"reduce_order": "pairwise", "reduce_fan_in": 4}], indirect=True)
def test_bf16_sum_max_argmax_under_the_fixture(faithful_interpreter):  # noqa: F811
    """Stock: bf16 sum adds bit patterns. Now every partial sum is rounded to bf16 (add.bf16)."""
    assert faithful_interpreter["reduce_fan_in"] == 4
    assert torch.all(_row_sums(np.ones((1, 16), dtype=np.float32), torch.bfloat16) == 16.0)
    rng = np.random.default_rng(14)
    x = torch.from_numpy(rng.standard_normal((8, 64)).astype(np.float32)).to(torch.bfloat16)
    y = torch.empty(8, dtype=torch.bfloat16)
    _row_sum_kernel[(1,)](x, y, 8, 64)
    want = sops.sum(x.float().numpy(), "bf16", axis=1, order="pairwise", fan_in=4)
    np.testing.assert_array_equal(y.float().numpy(), want)
    m = torch.empty(8, dtype=torch.bfloat16)
    idx = torch.empty(8, dtype=torch.int32)
    _row_max_kernel[(1,)](x, m, idx, 8, 64)
    assert torch.equal(m, x.max(1).values) and torch.equal(idx.long(), x.float().argmax(1))


# ----------------------------------------------------------------------------------------------------
# flash attention, errors, restoration, checks
# ----------------------------------------------------------------------------------------------------


def test_bf16_flash_attention_runs_faithfully():
    """Stock: bf16 garbage (strict xfail in test_gpu_flash_attention). Under faithful() it is close to float64
    and equal, bit for bit, to simfloat's emulation of the same kernel (plan "triton-bf16")."""
    from simfloat.attention import flash
    from simfloat_gpu.kernels.flash_attention import flash_attention

    g = torch.Generator().manual_seed(15)
    q, k, v = (torch.randn(1, 2, s, 32, generator=g).to(torch.bfloat16) for s in (40, 70, 70))
    with faithful():
        out, m, l = flash_attention(q, k, v, causal=True, block_m=16, block_n=32, return_stats=True)  # noqa: E741
    scores = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(32)
    scores = scores.masked_fill(torch.arange(70)[None, :] > torch.arange(40)[:, None], float("-inf"))
    ref = torch.softmax(scores, -1) @ v.double()
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=2e-2)
    e, em, el = flash(
        q.double().numpy(),
        k.double().numpy(),
        v.double().numpy(),
        plan="triton-bf16",
        block_m=16,
        block_n=32,
        causal=True,
        return_stats=True,
    )
    np.testing.assert_array_equal(out.double().numpy(), e)
    np.testing.assert_array_equal(m.double().numpy(), em)
    np.testing.assert_array_equal(l.double().numpy(), el)


def test_hardware_profile_sets_the_tl_sum_rule():
    """faithful(hardware=profile) takes the profile's tl.sum rule of the mma layout, as plan("triton-bf16",
    hardware=profile) does: the flash kernel under the interpreter equals the emulator bit for bit for the H200
    profile (rule h200-mma) and for a copy whose rule is sequential, and the two rules give different l."""
    import dataclasses

    from simfloat.attention import flash, plan
    from simfloat.attention.plan import SUM_ORDERS
    from simfloat.profiles import PUBLISHED, SUM_RULES, SumPart, load_profile
    from simfloat_gpu.kernels.flash_attention import flash_attention

    assert set(SUM_RULES) == set(SUM_ORDERS)
    h200 = load_profile("h200")
    seq = dataclasses.replace(h200, name="h200seqsum", sums=(SumPart("mma", "sequential", status=PUBLISHED),))
    g = torch.Generator().manual_seed(16)
    q, k, v = (torch.randn(1, 1, s, 16, generator=g).to(torch.bfloat16) for s in (64, 97, 97))
    ls = {}
    for prof, rule in ((h200, "h200-mma"), (seq, "sequential")):
        with faithful(hardware=prof) as config:
            assert config["reduce_order"] == rule
            out, m, l = flash_attention(q, k, v, block_m=64, block_n=64, return_stats=True)  # noqa: E741
        pl = plan("triton-bf16", hardware=prof)
        assert pl.sum_order.rule == rule
        e, em, el = flash(*(t.double().numpy() for t in (q, k, v)), plan=pl, block_m=64, block_n=64, return_stats=True)
        np.testing.assert_array_equal(out.double().numpy(), e)
        np.testing.assert_array_equal(m.double().numpy(), em)
        np.testing.assert_array_equal(l.double().numpy(), el)
        ls[rule] = l
    assert not torch.equal(ls["h200-mma"], ls["sequential"])
    with faithful(hardware=h200, reduce_order="numpy") as config:  # an order given explicitly stays
        assert config["reduce_order"] == "numpy"
    with pytest.raises(FaithfulNotImplementedError, match="fp32 rule"), faithful(reduce_order="h200-mma"):
        _row_sums(np.ones((2, 16), dtype=np.float32), torch.bfloat16)


def test_unmodelled_ops_raise_not_implemented():
    x = np.ones(16, dtype=np.float32)
    with pytest.raises(NotImplementedError, match=r"tl\.sin on fp32"), faithful():
        _unary(x, "sin")
    a = torch.ones(16, 16, dtype=torch.float32)
    with pytest.raises(FaithfulNotImplementedError, match="tf32x3|TF32x3"), faithful():
        _dot_kernel[(1,)](a, a, torch.empty(16, 16), 16, 16, 16, "tf32x3")
    with pytest.raises(NotImplementedError, match="fp8e4nv"), faithful(arch="sm80"):
        # no fp8 model for sm80
        f8 = torch.ones(16, 16, dtype=torch.float8_e4m3fn)
        _dot_acc_kernel[(1,)](f8, f8, torch.zeros(16, 16), torch.empty(16, 16), 16, 16, 16, -1)


def test_stock_interpreter_is_restored_also_after_errors_and_nesting():
    stock_dot = vars(ti.InterpreterBuilder)["create_dot"]
    stock_convert = ti._convert_float
    one = torch.ones(16, dtype=torch.bfloat16)
    y = torch.empty(16, dtype=torch.bfloat16)
    with faithful(reduce_order="numpy"):
        assert vars(ti.InterpreterBuilder)["create_dot"] is not stock_dot
        with faithful(reduce_order="pairwise"):
            assert faithful_config()["reduce_order"] == "pairwise"
        assert faithful_config()["reduce_order"] == "numpy"
        _binop_kernel[(1,)](one, one, y, 16, "add")
        assert torch.all(y == 2.0)
    assert faithful_config() is None
    assert vars(ti.InterpreterBuilder)["create_dot"] is stock_dot and ti._convert_float is stock_convert
    with pytest.raises(ZeroDivisionError), faithful():
        raise ZeroDivisionError
    assert vars(ti.InterpreterBuilder)["create_dot"] is stock_dot and faithful_config() is None
    _binop_kernel[(1,)](one, one, y, 16, "add")
    assert np.all(_bits16(y) == 0x3F80 + 0x3F80)  # the stock behaviour is back
    assert ti.interpreter_builder.options.max_num_imprecise_acc_default == 0


def test_entry_checks(monkeypatch):
    monkeypatch.setattr(triton, "__version__", "3.7.1")
    with pytest.raises(RuntimeError, match=r"3\.7\.1"), faithful():
        pass
    monkeypatch.setattr(triton, "__version__", "3.9.0+gitabc")
    with faithful():
        pass
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"), faithful():
        pass
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(tl.standard, "sum", object())
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1 did not take effect"), faithful():
        pass
    monkeypatch.undo()
    for bad in (
        {"reduce_order": "tree"},
        {"reduce_warps_n": 3},
        {"dot": {"bf17": Sequential()}},
        {"exp2": "fast"},
        {"arch": "sm70"},
        {"fp8_overflow": "wrap"},
    ):
        with pytest.raises(ValueError), faithful(**bad):
            pass
    assert faithful_config() is None


def test_faithful_without_triton_names_the_install_command(monkeypatch):
    """No triton installed (a core-only environment): faithful() says what to install, not just the import."""
    import sys

    from simfloat_gpu.interpreter import faithful

    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    with pytest.raises(ImportError, match=r"needs triton .*pip install 'simfloat-emu-gpu'"), faithful():
        pass
