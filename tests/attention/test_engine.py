"""The vectorized engine against the scalar reference it replaces, bit for bit: the lane rounding functions
against round_exact and the scalar ops, every accumulation model's row kernel against dot_acc, and flash /
baseline attention against their reference kernels, on random and adversarial inputs, odd lengths, every
preset, and 1 or 2 threads."""

from __future__ import annotations

from fractions import Fraction

import numba
import numpy as np
import pytest

import simfloat as sf
from simfloat._jit import jit
from simfloat._lanes import (
    ladd,
    ladd_f32,
    ladd_ne,
    lane,
    ldiv,
    ldiv_f32,
    ldiv_ne,
    lfma_f32,
    lfma_ne,
    lmul,
    lmul_f32,
    lmul_ne,
    lround,
    lround_f32,
    lround_ne,
    lround_rz,
)
from simfloat.accumulate import BlockFMA, Chunked, Sequential, matmul, tensor_core
from simfloat.attention import baseline, flash, plan, presets
from simfloat.attention._kernels import add, div, mul, rnd
from simfloat.attention.plan import OpParams
from simfloat.formats import FloatFormat
from simfloat.rounding import RoundingMode, round_exact

MODES = [m for m in RoundingMode if m != RoundingMode.STOCHASTIC]
FORMATS = [
    "float32",
    "bfloat16",
    "float16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float6_e2m3fn",
    "float4_e2m1fn",
    "tfloat32",
    FloatFormat("e5m3ftz", 5, 3, subnormals=False),
    "float64",
]


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float64).view(np.uint64)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality (NaN payloads aside: every NaN counts as one value)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return False
    na, nb = np.isnan(a), np.isnan(b)
    return bool(np.array_equal(na, nb) and np.array_equal(_bits(np.where(na, 0.0, a)), _bits(np.where(nb, 0.0, b))))


def _hard_values(fmt: FloatFormat, g: np.random.Generator, n: int = 4000) -> np.ndarray:
    """Values around every rounding boundary of fmt: grid points, midpoints and their float64 neighbours,
    subnormals, the overflow threshold, zeros, inf and NaN, plus random magnitudes across the range."""
    f = sf.format(fmt)
    exps = g.integers(max(f.emin - f.mantissa_bits - 3, -1070), min(f.emax + 3, 1020), n)
    frac = g.integers(0, 1 << min(f.mantissa_bits + 2, 50), n) / float(1 << min(f.mantissa_bits + 2, 50))
    base = (1.0 + frac) * np.exp2(exps.astype(float))
    mids = np.concatenate([base, np.nextafter(base, np.inf), np.nextafter(base, 0.0)])
    with np.errstate(over="ignore"):
        special = np.array(
            [
                0.0,
                -0.0,
                np.inf,
                -np.inf,
                np.nan,
                f.max,
                np.nextafter(f.max, np.inf),
                f.max * 0.999,
                f.tiny,
                f.smallest_subnormal,
                f.smallest_subnormal / 2,
                f.smallest_subnormal * 0.75,
                5e-324,
                2.0**-1022,
            ]
        )
    x = np.concatenate([mids, special, g.standard_normal(n) * 10.0 ** g.integers(-6, 6, n)])
    return np.concatenate([x, -x])


@jit
def _apply_round(x, out, r):  # type: ignore[no-untyped-def]
    for i in range(x.size):
        out[i] = lround(x[i], r)


@jit
def _apply_round_ne(x, out, r):  # type: ignore[no-untyped-def]
    for i in range(x.size):
        out[i] = lround_ne(x[i], r)


@jit
def _apply_round_rz(x, out, r):  # type: ignore[no-untyped-def]
    for i in range(x.size):
        out[i] = lround_rz(x[i], r)


@jit
def _apply_ops(a, b, out, r, o):  # type: ignore[no-untyped-def]
    for i in range(a.size):
        out[0, i] = ladd(a[i], b[i], r)
        out[1, i] = add(a[i], b[i], o)
        out[2, i] = lmul(a[i], b[i], r)
        out[3, i] = mul(a[i], b[i], o)
        bi = b[i] if b[i] != 0.0 else 1.0
        out[4, i] = ldiv(a[i], bi, r)
        out[5, i] = div(a[i], bi, o)
        out[6, i] = rnd(a[i], o)


@jit
def _apply_ops_f32(a, b, out):  # type: ignore[no-untyped-def]
    for i in range(a.size):
        out[0, i] = ladd_f32(a[i], b[i])
        out[2, i] = lmul_f32(a[i], b[i])
        bi = b[i] if b[i] != 0.0 else 1.0
        out[4, i] = ldiv_f32(a[i], bi)
        out[6, i] = lround_f32(a[i])


@jit
def _apply_ops_ne(a, b, out, r):  # type: ignore[no-untyped-def]
    for i in range(a.size):
        out[0, i] = ladd_ne(a[i], b[i], r)
        out[2, i] = lmul_ne(a[i], b[i], r)
        bi = b[i] if b[i] != 0.0 else 1.0
        out[4, i] = ldiv_ne(a[i], bi, r)


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_lane_rounding_equals_round_exact_in_every_mode(fmt):
    f = sf.format(fmt)
    x = _hard_values(f, np.random.default_rng(0))
    for mode in MODES:
        r = lane(f, int(mode))
        if not r.fast:
            continue
        out = np.empty_like(x)
        _apply_round(x, out, r)
        ref = np.empty_like(x)
        _ref_round(x, ref, f.params, int(mode))
        assert same(out, ref), (f.name, mode.name)
        if mode == RoundingMode.NEAREST_EVEN:
            _apply_round_ne(x, out, r)
            assert same(out, ref), (f.name, "lround_ne")
        if mode == RoundingMode.TOWARD_ZERO:
            _apply_round_rz(x, out, r)
            assert same(out, ref), (f.name, "lround_rz")
    assert lane(f, 0).fast  # every listed format has the fast form for nearest-even


@jit
def _ref_round(x, out, p, mode):  # type: ignore[no-untyped-def]
    for i in range(x.size):
        out[i] = round_exact(x[i], 0, p, mode, np.uint64(0))


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "float16", "float8_e4m3fn", "e5m3ftz", "float64"])
def test_lane_ops_equal_the_scalar_ops(fmt):
    f = sf.format(fmt) if fmt != "e5m3ftz" else FORMATS[9]
    g = np.random.default_rng(1)
    a = _hard_values(f, g, 1500)
    b = np.concatenate([a[::-1][: a.size // 2], g.standard_normal(a.size - a.size // 2)])
    g.shuffle(b)
    # exact ties and cancellations: b = -a and b = a * (1 + 2**-(m+1))
    b[:200] = -a[:200]
    b[200:400] = a[200:400] * (1 + 2.0 ** -(f.mantissa_bits + 1))
    for mode in MODES:
        r = lane(f, int(mode))
        if not r.fast:
            continue
        out = np.empty((7, a.size))
        with np.errstate(all="ignore"):
            _apply_ops(a, b, out, r, OpParams(f.params, int(mode)))
        assert same(out[0], out[1]), ("add", f.name, mode.name)
        # below 2**-969 the reference's TwoProduct residual underflows (inexact); only float64-range
        # targets see it, where the lane form (the hardware product) is the right one
        with np.errstate(over="ignore"):
            ok = ~(np.abs(a * b) < 2.0**-969)
        assert same(out[2][ok], out[3][ok]), ("mul", f.name, mode.name)
        # a finite quotient beyond float64's range either way (a float64 divisor far from 1): the reference rounds
        # the exact value (e.g. the largest finite value toward zero, the smallest subnormal rounding up), the lane
        # the hardware's inf or 0; kernel operands never get there
        with np.errstate(all="ignore"):
            q = np.abs(a / b)
            okd = ~((np.isinf(q) | (q < 2.0**-969)) & np.isfinite(a) & (a != 0) & (b != 0))
        assert same(out[4][okd], out[5][okd]), ("div", f.name, mode.name)
        if mode == RoundingMode.NEAREST_EVEN:  # the nearest-even forms (float32: the hardware's conversion)
            ne = np.empty((7, a.size))
            with np.errstate(all="ignore"):
                _apply_ops_ne(a, b, ne, r)
            assert same(ne[0], out[1]), ("add_ne", f.name)
            assert same(ne[2][ok], out[3][ok]), ("mul_ne", f.name)
            assert same(ne[4], out[5]), ("div_ne", f.name)
            if r.f32:  # the hardware-conversion forms of a float32 lane
                _apply_ops_f32(a, b, ne)
                assert same(ne[0], out[1]), ("add_f32", f.name)
                assert same(ne[2][ok], out[3][ok]), ("mul_f32", f.name)
                assert same(ne[4], out[5]), ("div_f32", f.name)
                assert same(ne[6], out[6]), ("round_f32", f.name)
    if fmt == "float32":
        assert lane(f, 0).f32 and not lane(f, 2).f32  # the hardware-rounding form is taken here
    else:
        assert not lane(f, 0).f32


@jit
def _fma_ne(a, b, c, out, r):  # type: ignore[no-untyped-def]
    for i in range(a.size):
        out[0, i] = lfma_ne(a[i], b[i], c[i], r)
        out[1, i] = lfma_f32(a[i], b[i], c[i])


@jit
def _apply_round_f32(x, out):  # type: ignore[no-untyped-def]
    for i in range(x.size):
        out[i] = lround_f32(x[i])


def test_lane_fma_ne_and_float32_nan_payloads():
    """lfma_ne and lfma_f32 = round(a*b + c) once; the float32 form keeps a NaN's payload as the general one does."""
    g = np.random.default_rng(4)
    f = sf.format("float32")
    r = lane(f, 0)
    a = sf.round(g.standard_normal(4000) * 2.0 ** g.integers(-70, 70, 4000), "fp32")
    b = sf.round(g.standard_normal(4000), "fp32")
    c = -a * b * (1 + 2.0**-30) + g.standard_normal(4000) * 2.0**-60  # cancellation down to the last bits
    out = np.empty((2, 4000))
    _fma_ne(a, b, c, out, r)
    exact = np.array(
        [float(sf.round(Fraction(x) * Fraction(y) + Fraction(z), f)) for x, y, z in zip(a, b, c, strict=True)]
    )
    assert np.array_equal(out[0], exact)
    assert np.array_equal(out[1], exact)
    nan = np.array([0x7FF8000000000123, 0xFFF8000000000456], dtype=np.uint64).view(np.float64)
    got = np.empty(2)
    _apply_round_ne(nan, got, r)
    assert np.array_equal(got.view(np.uint64), nan.view(np.uint64))
    _apply_round_f32(nan, got)
    assert np.array_equal(got.view(np.uint64), nan.view(np.uint64))


# -- accumulation models ----------------------------------------------------------------------------------------

MODELS = {
    "sm90-bf16": (tensor_core("sm90", "bf16"), "bf16"),
    "sm90-fp16": (tensor_core("sm90", "fp16"), "fp16"),
    "sm90-tf32": (tensor_core("sm90", "tf32"), "fp32"),
    "sm90-e4m3": (tensor_core("sm90", "e4m3"), "e4m3"),
    "sm90-e5m2": (tensor_core("sm90", "e5m2"), "e5m2"),
    "sm80-bf16": (tensor_core("sm80", "bf16"), "bf16"),
    "sm80-tf32": (tensor_core("sm80", "tf32"), "fp32"),
    "block-F8-rn": (BlockFMA(5, 8, out_fmt="bf16", out_mode="nearest_even"), "bf16"),
    "seq-fp32": (Sequential("float32"), "bf16"),
    "seq-fp32-on-fp32": (Sequential("float32"), "fp32"),
    "seq-bf16-products": (Sequential("bf16", product_fmt="bf16"), "bf16"),
    "seq-fp16-away-products": (Sequential("fp16", mode="nearest_away", product_fmt="fp16"), "fp16"),
    "seq-e4m3-products": (Sequential("e4m3", product_fmt="e4m3"), "e4m3"),
    "seq-fp32-products": (Sequential("float32", product_fmt="float32"), "fp32"),
    "seq-bf16-up-products": (Sequential("bf16", mode="up", product_fmt="bf16"), "bf16"),
    "seq-fp16-rz": (Sequential("fp16", mode="toward_zero"), "e4m3"),
    "seq-fp32-input-bf16": (Sequential("float32", input_fmt="bf16"), "fp32"),
    "seq-fp64": (Sequential("float64", product_fmt="float64"), "fp32"),
    "seq-fp64-fma": (Sequential("float64"), None),
    "chunk-7": (Chunked(7, Sequential("float32"), outer_fmt="bf16"), "bf16"),
    "splits-3-tc": (Chunked(splits=3, inner=tensor_core("sm90", "bf16")), "bf16"),
    "seq-fp32-on-fp64": (Sequential("float32"), None),
}


def _operands(fmt, g, m, kk, n, hard):
    a = g.standard_normal((m, kk)) * np.exp2(g.integers(-8, 8, (m, kk)))
    b = g.standard_normal((kk, n)) * np.exp2(g.integers(-8, 8, (kk, n)))
    if hard:
        f = sf.format(fmt or "fp32")
        a[0] = f.smallest_subnormal * g.integers(1, 4, kk)  # subnormal operands
        a[1, : kk // 2] = 0.0
        b[:, 1] = -b[:, 0]  # cancellation between columns with the same row of a
        a[2] = a[3]
        b[: kk // 2, 2] = 0.0
        a[4, 0] = np.inf
        b[1, 3] = np.nan
        a[5] = f.max / 4
        b[:, 4] = f.max / 2  # overflow
        b[:, 5] = 2.0 ** (f.emin - 3)
    if fmt is not None:
        a, b = sf.round(a, fmt), sf.round(b, fmt)
    return a, b


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("hard", [False, True], ids=["random", "adversarial"])
def test_matmul_vector_equals_reference(name, hard):
    model, fmt = MODELS[name]
    g = np.random.default_rng(hash(name) % 2**32)
    a, b = _operands(fmt, g, 9, 97, 33, hard)
    c = np.zeros((9, 33))
    c[0] = g.standard_normal(33)  # an incoming accumulator with float64 bits
    c[6] = sf.round(g.standard_normal(33), "fp32")
    c[7, 0] = np.inf
    with np.errstate(all="ignore"):
        vec = matmul(a, b, c, acc=model)
        ref = matmul(a, b, c, acc=model, engine="reference")
    assert same(vec, ref)


@pytest.mark.parametrize("kk", [1, 97, 257])
def test_matmul_block_fma_rows_in_groups_and_pairs(kk):
    """The block-FMA driver takes rows in groups, block by block, two at a time: more rows than a group, an odd
    number of them, rows that take the reference path (huge operand, infinite accumulator) between the others."""
    g = np.random.default_rng(kk)
    for name in ("sm90-bf16", "sm90-e4m3", "sm80-bf16", "block-F8-rn"):
        model, fmt = MODELS[name]
        a, b = _operands(fmt, g, 37, kk, 19, kk > 1)
        a[20, 0] = 2.0**500  # beyond the block kernels' range: this row alone goes to dot_acc
        c = sf.round(g.standard_normal((37, 19)), "fp32")
        c[25, 3] = np.inf
        with np.errstate(all="ignore"):
            vec = matmul(a, b, c, acc=model)
            ref = matmul(a, b, c, acc=model, engine="reference")
        assert same(vec, ref), name


@pytest.mark.parametrize("kk", [1, 2, 97, 257])
def test_matmul_native_loops_rows_in_groups_of_four(kk):
    """The float32 FMA loop (on float32 copies of B) and the float64 loops run rows four at a time: more rows
    than a group, a count that leaves remainders, and (float32) rows whose incoming accumulators are not
    float32 values, which take the rounded-sum path, between the others."""
    g = np.random.default_rng(kk + 1)
    for name in ("seq-fp32", "seq-fp32-on-fp32", "seq-fp32-input-bf16", "seq-fp64", "seq-fp64-fma"):
        model, fmt = MODELS[name]
        a, b = _operands(fmt, g, 23, kk, 37, kk > 2)
        c = sf.round(g.standard_normal((23, 37)), "fp32")
        c[5] = g.standard_normal(37)  # float64 bits
        c[18, 2] = 1.0 + 2.0**-40
        c[9, 7] = np.inf
        with np.errstate(all="ignore"):
            vec = matmul(a, b, c, acc=model)
            ref = matmul(a, b, c, acc=model, engine="reference")
        assert same(vec, ref), name


def test_matmul_vector_batched_and_zero_sizes():
    g = np.random.default_rng(3)
    a = sf.round(g.standard_normal((2, 3, 5, 40)), "bf16")
    b = sf.round(g.standard_normal((3, 40, 7)), "bf16")
    model = tensor_core("sm90", "bf16")
    assert same(matmul(a, b, acc=model), matmul(a, b, acc=model, engine="reference"))
    assert matmul(a[:, :, :0], b, acc=model).shape == (2, 3, 0, 7)
    with pytest.raises(ValueError, match="engine"):
        matmul(a, b, acc=model, engine="fast")


# -- attention ---------------------------------------------------------------------------------------------------


def _qkv(lead, sq, sk, d, fmt, seed, dv=None):
    g = np.random.default_rng(seed)
    q = g.standard_normal(lead + (sq, d)) * 1.5
    k = g.standard_normal(lead + (sk, d))
    v = g.standard_normal(lead + (sk, dv or d))
    return tuple(sf.round(x, fmt) for x in (q, k, v))


def _input_format(name: str) -> str:
    tail = name.split("-")[-1]
    return "fp32" if tail in ("fp64", "fp32", "tf32") else tail


FLASH_PLANS = [
    "fp64",
    "all-bf16",
    "all-fp16",
    "all-e4m3",
    "triton-bf16",
    "triton-fp16",
    "triton-fp32",
    "triton-tf32",
    "triton-e4m3",
    "triton-e5m2",
    "h200-bf16",
    "h200-fp16",
    "h200-tf32",
]


@pytest.mark.parametrize("name", FLASH_PLANS)
def test_flash_vector_equals_reference(name):
    fmt = _input_format(name)
    q, k, v = _qkv((2,), 97, 257, 32, fmt, 11)
    for causal, bm, bn in ((False, 64, 64), (True, 16, 32), (True, 128, 16), (False, 32, 1000)):
        a = flash(q, k, v, plan=name, block_m=bm, block_n=bn, causal=causal, return_stats=True, engine="vector")
        r = flash(q, k, v, plan=name, block_m=bm, block_n=bn, causal=causal, return_stats=True, engine="reference")
        for x, y in zip(a, r, strict=True):
            assert same(x, y), (name, causal, bm, bn)


@pytest.mark.parametrize(
    "variant",
    [
        *("lazy", "fa1", "fa1-bf16", "no-contract", "rz-state", "exp", "fp32-dot-wide-p", "h200-sum-rz"),
        # the h200 order with l_ij additions in bf16: partial tiles sum over the whole tile with its padding
        # zeros, as the kernel (a lane's first p is rounded when a zero follows it)
        "h200-sum-bf16",
    ],
)
def test_flash_variants_vector_equals_reference(variant):
    base = plan("triton-bf16")
    pl = {
        "lazy": base.replace(lazy_threshold=8.0),
        "fa1": base.replace(normalization="per_step"),
        "fa1-bf16": plan("all-bf16").replace(normalization="per_step"),
        "no-contract": base.replace(contract=False),
        "rz-state": base.replace(l_i=("float32", "toward_zero"), acc=("bf16", "up"), m_i="bf16"),
        "exp": base.replace(exp2=False, scale=("float16", "down")),
        # P in float64 into a float32 FMA-loop dot: the float32 FMA form does not apply
        "fp32-dot-wide-p": plan("triton-fp32").replace(p="float64", acc="float64"),
        # the tl.sum order with rounded additions (not the engine's native float32 path); 2 of 4 warps along keys
        "h200-sum-bf16": plan("h200-bf16").replace(l_ij="bf16"),
        "h200-sum-rz": plan("h200-bf16").replace(l_ij=("float32", "toward_zero")),
    }[variant]
    q, k, v = _qkv((1, 2), 33, 97, 16, "bf16", 5, dv=24)
    for causal in (False, True):
        a = flash(q, k, v, plan=pl, block_m=16, block_n=16, causal=causal, return_stats=True)
        r = flash(q, k, v, plan=pl, block_m=16, block_n=16, causal=causal, return_stats=True, engine="reference")
        for x, y in zip(a, r, strict=True):
            assert same(x, y), (variant, causal)


def test_flash_adversarial_inputs_vector_equals_reference():
    q, k, v = _qkv((3,), 40, 40, 16, "bf16", 7)
    q[0, 3] = np.inf
    k[1, 5, 2] = np.nan
    v[2, 7] = 0.0
    q[2, 8] = 0.0  # a row of equal scores (ties of the row max)
    k[2, :10] = k[2, 0]  # tied maxima
    v[2, :, 0] = sf.bfloat16.smallest_subnormal
    v[1, :, 1] = sf.bfloat16.max / 64
    for name in ("triton-bf16", "h200-bf16", "all-bf16"):
        with np.errstate(all="ignore"), pytest.warns(RuntimeWarning, match=r"q has a non-finite value \(inf\)"):
            a = flash(q, k, v, plan=name, block_m=16, block_n=16, causal=True, return_stats=True)
        with np.errstate(all="ignore"), pytest.warns(RuntimeWarning, match="non-finite"):
            r = flash(q, k, v, plan=name, block_m=16, block_n=16, causal=True, return_stats=True, engine="reference")
        for x, y in zip(a, r, strict=True):
            assert same(x, y), name


@pytest.mark.parametrize("seq", [1, 97])
def test_flash_short_sequences(seq):
    q, k, v = _qkv((2,), seq, seq, 8, "fp16", seq)
    for name in ("triton-fp16", "h200-fp16", "fp64"):
        a = flash(q, k, v, plan=name, block_m=16, block_n=32, causal=True)
        assert same(a, flash(q, k, v, plan=name, block_m=16, block_n=32, causal=True, engine="reference"))


BASELINE_PLANS = ["fp64", "all-bf16", "all-fp16", "pytorch-bf16", "pytorch-fp16", "pytorch-fp32", "triton-bf16"]


@pytest.mark.parametrize("name", BASELINE_PLANS)
def test_baseline_vector_equals_reference(name):
    fmt = _input_format(name)
    q, k, v = _qkv((2,), 97, 131, 24, fmt, 3)
    for causal in (False, True):
        a = baseline(q, k, v, plan=name, causal=causal)
        r = baseline(q, k, v, plan=name, causal=causal, engine="reference")
        assert same(a, r), (name, causal)


def test_results_do_not_depend_on_the_thread_count():
    q, k, v = _qkv((2, 2), 257, 257, 32, "bf16", 9)
    before = numba.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
            outs.append(
                (
                    flash(q, k, v, plan="h200-bf16", block_m=64, block_n=64, causal=True),
                    baseline(q, k, v, plan="pytorch-bf16"),
                    matmul(q[0, 0], k[0, 0].T, acc=tensor_core("sm90", "bf16")),
                )
            )
    finally:
        numba.set_num_threads(before)
    for x, y in zip(*outs, strict=True):
        assert same(x, y)


def test_engine_argument():
    q, k, v = _qkv((1,), 8, 8, 4, "bf16", 0)
    with pytest.raises(ValueError, match="engine"):
        flash(q, k, v, plan="triton-bf16", engine="gpu")
    with pytest.raises(ValueError, match="reference engine"):
        flash(q, k, v, plan="triton-bf16", engine="vector", trace=sf.Tracer())
    assert len(presets()) > 0


def test_block_sizes_beyond_the_sequence_give_the_same_bits_at_the_cost_of_the_sequence():
    q, k, v = _qkv((1,), 20, 20, 8, "bf16", 4)
    small = flash(q, k, v, plan="h200-bf16", block_m=16, block_n=20, return_stats=True)
    huge = flash(q, k, v, plan="h200-bf16", block_m=16, block_n=2**40, return_stats=True)
    ref = flash(q, k, v, plan="h200-bf16", block_m=16, block_n=2**40, return_stats=True, engine="reference")
    for x, y, z in zip(small, huge, ref, strict=True):
        assert same(x, y) and same(y, z)


def test_stale_numba_caches_are_dropped_when_the_sources_change(tmp_path):
    """On a copy of a package tree (the real caches stay: other test processes are using them)."""
    import simfloat._jit as j

    (tmp_path / "kernels.py").write_text("@jit\ndef f(x):\n    return x\n")
    (tmp_path / "cli.py").write_text("print('pure python')\n")
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    entries = [cache / "kernels.f-1.py311.nbi", cache / "kernels.f-1.py311.1.nbc"]

    def fill() -> None:
        for e in entries:
            e.write_bytes(b"")

    j._drop_stale_caches(tmp_path, cache_dir="")  # no stamp yet: written
    stamp = cache / "numba-sources.sha256"
    digest = stamp.read_text()
    fill()
    j._drop_stale_caches(tmp_path, cache_dir="")  # sources unchanged: the caches stay
    assert all(e.exists() for e in entries)
    (tmp_path / "cli.py").write_text("print('still pure python')\n")
    j._drop_stale_caches(tmp_path, cache_dir="")  # a module without compiled code changed: the caches stay
    assert all(e.exists() for e in entries) and stamp.read_text() == digest
    (tmp_path / "kernels.py").write_text("@jit\ndef f(x):\n    return x + 1\n")
    j._drop_stale_caches(tmp_path, cache_dir="")
    assert not any(e.exists() for e in entries) and stamp.read_text() != digest
    assert [p.name for p in cache.iterdir()] == [stamp.name]  # no temporary stamp left behind


def test_stale_numba_caches_in_numba_cache_dir_are_dropped_too(tmp_path):
    """With NUMBA_CACHE_DIR set numba keeps a source folder's caches in a folder of that directory named after
    it: a changed source empties that folder as well (and leaves other packages' folders alone)."""
    import hashlib

    import simfloat._jit as j

    pkg, user = tmp_path / "pkg", tmp_path / "numba-cache"
    pkg.mkdir()
    (pkg / "kernels.py").write_text("@jit\ndef f(x):\n    return x\n")
    mine = user / f"pkg_{hashlib.sha1(str(pkg.resolve()).encode()).hexdigest()}"
    other = user / "otherpkg_0123"
    for d in (mine, other):
        d.mkdir(parents=True)
        (d / "kernels.f-1.py311.nbi").write_bytes(b"")
    j._drop_stale_caches(pkg, cache_dir=str(user))  # first run: no stamp, so everything of pkg goes
    assert not (mine / "kernels.f-1.py311.nbi").exists() and (other / "kernels.f-1.py311.nbi").exists()
    (mine / "kernels.f-1.py311.nbi").write_bytes(b"")
    j._drop_stale_caches(pkg, cache_dir=str(user))  # unchanged: kept
    assert (mine / "kernels.f-1.py311.nbi").exists()
    (pkg / "kernels.py").write_text("@jit\ndef f(x):\n    return x + 1\n")
    j._drop_stale_caches(pkg, cache_dir=str(user))  # changed: dropped
    assert not (mine / "kernels.f-1.py311.nbi").exists() and (other / "kernels.f-1.py311.nbi").exists()


def _defined_in(compiled, module: str) -> bool:
    func = getattr(compiled, "py_func", None) or getattr(compiled, "_defn", None)
    return getattr(func, "__module__", module) == module


def test_the_stale_cache_hash_covers_every_module_with_compiled_code():
    """Editing a pure-Python module (CLI, sweep, attribution, the torch bridge) keeps numba's caches; every module
    that defines or imports a jitted function or an intrinsic is in the hash that drops them."""
    import importlib
    import pkgutil
    from pathlib import Path

    import numba
    from numba.core.extending import _Intrinsic

    import simfloat
    import simfloat._jit as j

    compiled, pure = [], []
    for info in pkgutil.walk_packages(simfloat.__path__, "simfloat."):
        if info.name in ("simfloat.torch",):  # needs torch; pure Python by construction
            pure.append(info.name)
            continue
        mod = importlib.import_module(info.name)
        # A package that re-exports jitted functions (simfloat.accumulate) holds no compiled code of its own: the
        # module that defines each function is the one whose edits must drop the caches.
        has = any(
            isinstance(v, (numba.core.registry.CPUDispatcher, _Intrinsic)) and _defined_in(v, info.name)
            for v in vars(mod).values()
        )
        source = Path(mod.__file__).read_bytes()
        if has:
            compiled.append(info.name)
            assert j._COMPILED.search(source), f"{info.name} holds compiled code but is not hashed"
        elif not j._COMPILED.search(source):
            pure.append(info.name)
    assert "simfloat.accumulate._rows" in compiled and "simfloat.attention._engine" in compiled
    assert {"simfloat.cli", "simfloat.sweep.runner", "simfloat.torch"} <= set(pure)
