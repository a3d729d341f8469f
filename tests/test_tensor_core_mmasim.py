"""tensor_core presets bit for bit against MMA-Sim (PyPI ``mmasim``, Xie et al. 2025), instruction by instruction:
random values of every code of the operand formats (subnormals included), exponent spread, cancellation, zero and
subnormal accumulators, and block scales; both engines for the plain kinds."""

from __future__ import annotations

import dataclasses
import zlib

import ml_dtypes
import numpy as np
import pytest

import simfloat as sf
from simfloat.accumulate import matmul, matmul_scaled, tensor_core

mmasim = pytest.importorskip("mmasim")
torch = pytest.importorskip("torch")
nv = pytest.importorskip("mmasim.nv_ptx")

R = 96  # dot products per case

ML = {
    "bf16": ml_dtypes.bfloat16,
    "f16": np.float16,
    "tf32": np.float32,
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e2m1": ml_dtypes.float4_e2m1fn,
}
TORCH = {"bf16": torch.bfloat16, "f16": torch.float16, "tf32": torch.float32, "e4m3": torch.float8_e4m3fn}
TORCH["e5m2"] = torch.float8_e5m2
SF = {"bf16": "bfloat16", "f16": "float16", "tf32": "float32", "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
SF |= {"e3m2": "float6_e3m2fn", "e2m3": "float6_e2m3fn", "e2m1": "float4_e2m1fn"}


def _values(t: str, shape: tuple[int, ...], rng: np.random.Generator, limit: float = 2.0**50) -> np.ndarray:
    """Values of format ``t`` drawn from every finite code below ``limit`` (all binades, subnormals, zeros)."""
    dt = np.dtype(ML[t])
    nbits = {"e3m2": 6, "e2m3": 6, "e2m1": 4}.get(t, 8 * dt.itemsize)
    codes = rng.integers(0, 1 << nbits, size=shape, dtype=np.uint64)
    utype = {1: np.uint8, 2: np.uint16, 4: np.uint32}[dt.itemsize]
    with np.errstate(invalid="ignore", over="ignore"):
        v = codes.astype(utype).view(dt).astype(np.float64)
    bad = ~np.isfinite(v) | (np.abs(v) >= limit)
    v[bad] = 1.0
    if t == "tf32":  # fp32 operands: the MMA truncates them to tf32
        v = v.astype(np.float32).astype(np.float64)
    return v


def _cases(ta: str, tb: str, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, c): R rows of k. Rows by design: random codes; one big product over many small ones (exponent
    spread); pairs that cancel; tiny operands with a zero or subnormal-fp32 accumulator."""
    lim = 2.0**50 if "tf32" != ta else 2.0**40
    a, b = _values(ta, (R, k), rng, lim), _values(tb, (R, k), rng, lim)
    c = (rng.standard_normal(R) * np.exp2(rng.integers(-30, 30, R))).astype(np.float32).astype(np.float64)
    q = R // 6
    c[:q] = 0.0
    # exponent spread: the first product dominates
    a[q : 2 * q, 0] = a[q : 2 * q, 0] * 0 + np.max(np.abs(a[q : 2 * q]), axis=1)
    b[q : 2 * q, 0] = np.max(np.abs(b[q : 2 * q]), axis=1)
    # cancellation: a[2j+1] b[2j+1] = -a[2j] b[2j]
    a[2 * q : 3 * q, 1::2] = a[2 * q : 3 * q, 0::2]
    b[2 * q : 3 * q, 1::2] = -b[2 * q : 3 * q, 0::2]
    c[2 * q : 3 * q] = 0.0
    # the smallest operands, against zero and fp32-subnormal accumulators
    sub_a = np.sort(np.abs(a[3 * q : 4 * q]), axis=1)
    a[3 * q : 4 * q] = sub_a * np.sign(rng.standard_normal((q, k)))
    b[3 * q : 4 * q] = np.sort(np.abs(b[3 * q : 4 * q]), axis=1)
    c[3 * q : 4 * q] = np.float32(2.0**-140) * rng.integers(-512, 512, q)
    c[4 * q : 5 * q] = np.float32(2.0**-126) * rng.integers(-4, 4, q)
    if ta in ("bf16", "tf32"):  # products near 2**-152 against fp32-subnormal accumulators (MMA-Sim's clamps)
        a[5 * q : 6 * q] = 2.0**-76 * rng.integers(-3, 4, (q, k))
        b[5 * q : 6 * q] = 2.0**-76 * rng.integers(1, 4, (q, k))
        c[5 * q : 6 * q] = 2.0**-140 * rng.integers(-64, 64, q)
    return a, b, c


def _torch(v: np.ndarray, t: str):  # type: ignore[no-untyped-def]
    if t in TORCH:
        return torch.from_numpy(v.astype(np.float32)).to(TORCH[t])
    return torch.from_numpy(v.astype(np.float16))  # fp6/fp4 values, held in fp16 (MMA-Sim reads any float)


def _sim(op, a, b, c, ta, tb):  # type: ignore[no-untyped-def]
    return op.dpa(_torch(a, ta), _torch(b, tb), torch.from_numpy(c.astype(np.float32))).double().numpy()


def _ours(a, b, c, model, engine):  # type: ignore[no-untyped-def]
    return matmul(a[:, None, :], b[:, :, None], c[:, None, None], acc=model, engine=engine)[:, 0, 0]


def _same(x: np.ndarray, y: np.ndarray) -> None:
    bad = ~((x == y) | (np.isnan(x) & np.isnan(y)))
    assert not bad.any(), (np.flatnonzero(bad)[:5], x[bad][:5], y[bad][:5])


PLAIN = [
    # (arch, variant, mmasim constructor, arch name, shape and type, ta, tb, k per call)
    ("sm80", None, nv.MMA, "Ampere", "m16n8k16.f32.bf16.bf16.f32", "bf16", "bf16", 48),
    ("sm80", None, nv.MMA, "Ampere", "m16n8k16.f32.f16.f16.f32", "f16", "f16", 48),
    ("sm80", None, nv.MMA, "Ampere", "m16n8k8.f32.tf32.tf32.f32", "tf32", "tf32", 24),
    ("sm89", None, nv.MMA, "Ada Lovelace", "m16n8k32.f32.e4m3.e4m3.f32", "e4m3", "e4m3", 96),
    ("sm89", None, nv.MMA, "Ada Lovelace", "m16n8k32.f32.e5m2.e4m3.f32", "e5m2", "e4m3", 96),
    ("sm89", None, nv.MMA, "Ada Lovelace", "m16n8k16.f32.bf16.bf16.f32", "bf16", "bf16", 48),
    ("sm90", "mmasim", nv.WGMMA, "Hopper", "m64n8k16.f32.bf16.bf16", "bf16", "bf16", 64),
    ("sm90", "mmasim", nv.WGMMA, "Hopper", "m64n8k8.f32.tf32.tf32", "tf32", "tf32", 32),
    ("sm90", "mmasim", nv.WGMMA, "Hopper", "m64n8k32.f32.e4m3.e5m2", "e4m3", "e5m2", 96),
    ("sm90", "mmasim", nv.MMA, "Hopper", "m16n8k16.f32.f16.f16.f32", "f16", "f16", 64),
    ("sm100", None, nv.TCGen05MMA, "Blackwell", "m64n8k16.kind::f16.f32.bf16.bf16", "bf16", "bf16", 64),
    ("sm100", None, nv.TCGen05MMA, "Blackwell", "m64n8k8.kind::tf32.f32.tf32.tf32", "tf32", "tf32", 32),
    ("sm100", None, nv.TCGen05MMA, "Blackwell", "m64n8k32.kind::f8f6f4.f32.e4m3.e4m3", "e4m3", "e4m3", 96),
    ("sm100", None, nv.TCGen05MMA, "Blackwell", "m64n8k32.kind::f8f6f4.f32.e3m2.e2m1", "e3m2", "e2m1", 96),
    ("sm100", None, nv.TCGen05MMA, "Blackwell", "m64n8k32.kind::f8f6f4.f32.e2m3.e5m2", "e2m3", "e5m2", 96),
    ("sm120", None, nv.MMA, "RTX Blackwell", "m16n8k32.kind::f8f6f4.f32.e2m1.e2m1.f32", "e2m1", "e2m1", 96),
    ("sm120", None, nv.MMA, "RTX Blackwell", "m16n8k32.f32.e4m3.e4m3.f32", "e4m3", "e4m3", 96),
    ("sm120", None, nv.MMA, "RTX Blackwell", "m16n8k16.f32.f16.f16.f32", "f16", "f16", 64),
]


@pytest.mark.parametrize(("arch", "variant", "cls", "sim_arch", "st", "ta", "tb", "k"), PLAIN, ids=lambda v: str(v))
def test_plain_kinds_match_mmasim(arch, variant, cls, sim_arch, st, ta, tb, k) -> None:  # type: ignore[no-untyped-def]
    op = cls(sim_arch, st)
    model = tensor_core(arch, SF[ta] if ta != "tf32" else "tf32", SF[tb] if tb != ta else None, variant=variant)
    rng = np.random.default_rng(zlib.crc32(st.encode()))
    a, b, c = _cases(ta, tb, k, rng)
    want = _sim(op, a, b, c, ta, tb)
    _same(_ours(a, b, c, model, "reference"), want)
    _same(_ours(a, b, c, model, "vector"), want)


def test_sm90_default_is_the_h200_model() -> None:
    """The sm90 default (measured on an H200) is MMA-Sim's Hopper model without the accumulator clamps: the same
    bits wherever the accumulator or some product of a step reaches 2**-126, and not always below that."""
    op = nv.WGMMA("Hopper", "m64n8k16.f32.bf16.bf16")
    h200 = tensor_core("sm90", "bf16")
    assert tensor_core("sm90", "bf16", variant="h200") == h200
    assert tensor_core("sm90", "bf16", variant="mmasim") == h200.__class__(
        **{**h200.__dict__, "acc_emin": -126, "zero_exp": -133}
    )
    rng = np.random.default_rng(90)
    a, b, c = _cases("bf16", "bf16", 64, rng)
    ours = _ours(a, b, c, h200, "vector")
    want = _sim(op, a, b, c, "bf16", "bf16")
    big = (np.abs(c) >= 2.0**-126) | (np.max(np.abs(a * b), axis=1) >= 2.0**-126)
    _same(ours[big], want[big])
    # a tiny row, designed: c = 2**-140 and 16 products of 2**-152. Aligned at the clamped 2**-126 (quantum
    # 2**-151) each product truncates to 0 and the sum stays c; aligned at c's own 2**-140 their sum 2**-148
    # survives the rounding to fp32's subnormal grid
    a1 = np.full((1, 16), 2.0**-76)
    c1 = np.array([2.0**-140])
    want1 = _sim(op, a1, a1, c1, "bf16", "bf16")[0]
    assert want1 == 2.0**-140
    assert _ours(a1, a1, c1, h200, "reference")[0] == 2.0**-140 + 2.0**-148
    mm = tensor_core("sm90", "bf16", variant="mmasim")
    assert _ours(a1, a1, c1, mm, "reference")[0] == _ours(a1, a1, c1, mm, "vector")[0] == want1


def _scales_e8m0(shape, rng):  # type: ignore[no-untyped-def]
    return np.exp2(rng.integers(-30, 30, shape)).astype(np.float64)


def _scales_ue4m3(shape, rng):  # type: ignore[no-untyped-def]
    codes = rng.integers(0, 0x7F, shape, dtype=np.uint64).astype(np.uint8)
    v = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    v[rng.random(shape) < 0.1] = 0.0
    return v


def _torch_scales(s: np.ndarray, fmt: str):  # type: ignore[no-untyped-def]
    t = torch.from_numpy(s.astype(np.float32))
    return t.to(torch.float8_e8m0fnu) if fmt == "ue8m0" else t.to(torch.float8_e4m3fn)


BLOCK = [
    # (arch, kind, mmasim constructor, arch name, shape and type, ta, tb, k per instruction, block, scale fmt)
    (
        "sm100",
        "mxf8f6f4",
        nv.TCGen05MMABlockScale,
        "Blackwell",
        "m128n8k32.kind::mxf8f6f4.block32.f32.e4m3.e4m3.ue8m0",
        "e4m3",
        "e4m3",
        32,
        32,
        "ue8m0",
    ),  # noqa: E501
    (
        "sm100",
        "mxf8f6f4",
        nv.TCGen05MMABlockScale,
        "Blackwell",
        "m128n8k32.kind::mxf8f6f4.block32.f32.e2m3.e3m2.ue8m0",
        "e2m3",
        "e3m2",
        32,
        32,
        "ue8m0",
    ),  # noqa: E501
    (
        "sm100",
        "mxf4",
        nv.TCGen05MMABlockScale,
        "Blackwell",
        "m128n8k64.kind::mxf4.block32.f32.e2m1.e2m1.ue8m0",
        "e2m1",
        "e2m1",
        64,
        32,
        "ue8m0",
    ),  # noqa: E501
    (
        "sm100",
        "nvf4",
        nv.TCGen05MMABlockScale,
        "Blackwell",
        "m128n8k64.kind::mxf4nvf4.block16.f32.e2m1.e2m1.ue4m3",
        "e2m1",
        "e2m1",
        64,
        16,
        "ue4m3",
    ),  # noqa: E501
    (
        "sm120",
        "mxf8f6f4",
        nv.MMABlockScale,
        "RTX Blackwell",
        "m16n8k32.kind::mxf8f6f4.block32.f32.e5m2.e2m1.f32.ue8m0",
        "e5m2",
        "e2m1",
        32,
        32,
        "ue8m0",
    ),  # noqa: E501
    (
        "sm120",
        "nvf4",
        nv.MMABlockScale,
        "RTX Blackwell",
        "m16n8k64.kind::mxf4nvf4.block16.f32.e2m1.e2m1.f32.ue4m3",
        "e2m1",
        "e2m1",
        64,
        16,
        "ue4m3",
    ),  # noqa: E501
]


@pytest.mark.parametrize(
    ("arch", "kind", "cls", "sim_arch", "st", "ta", "tb", "kin", "blk", "sfmt"), BLOCK, ids=lambda v: str(v)
)
def test_block_scaled_kinds_match_mmasim(arch, kind, cls, sim_arch, st, ta, tb, kin, blk, sfmt) -> None:  # type: ignore[no-untyped-def]
    op = cls(sim_arch, st)
    model = tensor_core(arch, SF[ta], SF[tb] if tb != ta else None, kind=kind)
    rng = np.random.default_rng(zlib.crc32(st.encode()))
    n_instr = 2
    k = kin * n_instr
    a, b, c = _cases(ta, tb, k, rng)
    draw = _scales_e8m0 if sfmt == "ue8m0" else _scales_ue4m3
    sa, sb = draw((R, k // blk), rng), draw((R, k // blk), rng)
    q = R // 8
    sa[:q] = sa[:q, :1]  # some rows with one scale throughout
    big, small = (2.0**30, 2.0**-30) if sfmt == "ue8m0" else (448.0, 2.0**-9)
    sa[q : 2 * q], sb[q : 2 * q] = small, small  # exponent spread between the scale blocks of a step
    sa[q : 2 * q, ::4], sb[q : 2 * q, ::4] = big, big
    if sfmt == "ue8m0":  # tiny scales: products below 2**-126 against zero and fp32-subnormal accumulators
        sa[2 * q : 3 * q], sb[2 * q : 3 * q] = 2.0**-80, 2.0**-82
        c[2 * q : 3 * q] = 2.0**-140 * rng.integers(-64, 64, q)
    want = c.astype(np.float32)
    for i in range(n_instr):  # one instruction at a time, the accumulator carried over
        lo, hi = i * kin, (i + 1) * kin
        s_lo, s_hi = lo // blk, hi // blk
        want = op.dpa(
            _torch(a[:, lo:hi], ta),
            _torch(b[:, lo:hi], tb),
            torch.from_numpy(np.asarray(want, np.float32)),
            _torch_scales(sa[:, s_lo:s_hi], sfmt),
            _torch_scales(sb[:, s_lo:s_hi], sfmt),
        ).numpy()
    # the diagonal of (a_i . b_j) with c only on the diagonal: output (i, i) is row i's dot product
    for engine in ("reference", "vector"):
        out = matmul_scaled(a, b.T.copy(), sa, sb.T.copy(), np.diag(c), acc=model, engine=engine)
        _same(np.diagonal(out), want.astype(np.float64))


@pytest.mark.parametrize("m", [1, 97])
@pytest.mark.parametrize("kind", ["mxf8f6f4", "mxf4", "nvf4"])
def test_block_scaled_engines_agree(m: int, kind: str) -> None:
    """The vector path of every block-scaled kind against the reference: odd shapes, mixed formats, scales
    spread over 60 binades (terms truncated far below the largest; nvf4: zero and subnormal scales), 1 and 2
    threads; a NaN scale sends the call to the reference."""
    import numba

    from simfloat.accumulate._rows import scaled_rows

    rng = np.random.default_rng(m)
    fa, fb = ("e4m3", "e2m1") if kind == "mxf8f6f4" else ("e2m1", "e2m1")
    model = tensor_core("sm100", fa, fb, kind=kind)
    blk = model.scale_block
    k, n = 96, 33
    a, b = _values(fa, (m, k), rng), _values(fb, (k, n), rng)
    draw = _scales_ue4m3 if kind == "nvf4" else _scales_e8m0
    sa, sb = draw((m, k // blk), rng), draw((k // blk, n), rng)
    c = (rng.standard_normal((m, n)) * 2.0**-120).astype(np.float32).astype(np.float64)
    c[:, ::5] = 0.0
    ref = matmul_scaled(a, b, sa, sb, c, acc=model, engine="reference")
    e = (np.repeat(sa, blk, axis=1), np.repeat(sb, blk, axis=0))
    assert scaled_rows(a, b, e[0], e[1], c, model) is not None  # the row kernels do run
    prev = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            _same(matmul_scaled(a, b, sa, sb, c, acc=model, engine="vector"), ref)
    finally:
        numba.set_num_threads(prev)
    sb[1, 2] = np.nan
    ref = matmul_scaled(a, b, sa, sb, c, acc=model, engine="reference")
    _same(matmul_scaled(a, b, sa, sb, c, acc=model, engine="vector"), ref)
    assert np.isnan(ref[:, 2]).all() and not np.isnan(ref[:, 3]).any()


def test_preset_errors() -> None:
    with pytest.raises(ValueError, match="arch"):
        tensor_core("sm60", "fp16")
    with pytest.raises(ValueError, match="fp16 operands only"):
        tensor_core("sm70", "bf16")
    with pytest.raises(ValueError, match="variant"):
        tensor_core("sm100", "bf16", variant="fasi2021")
    with pytest.raises(ValueError, match="no tensor-core kind"):
        tensor_core("sm90", "e2m1")
    with pytest.raises(ValueError, match="needs sm100"):
        tensor_core("sm90", "e4m3", kind="mxf8f6f4")
    with pytest.raises(ValueError, match="needs sm100"):
        tensor_core("sm100", "e4m3", kind="mxf8f6f4", instruction="mma.sync")
    with pytest.raises(ValueError, match="no instruction 'wgmma'"):
        tensor_core("sm100", "bf16", instruction="wgmma")
    with pytest.raises(ValueError, match="fp32 results only"):
        tensor_core("sm90", "bf16", out_format="fp16")
    with pytest.raises(ValueError, match="out_format"):
        tensor_core("sm90", "fp16", out_format="bf16")
    with pytest.raises(ValueError, match="no model"):
        tensor_core("sm90", "e4m3", out_format="fp16", instruction="mma.sync")
    with pytest.raises(ValueError, match="e2m1 operands"):
        tensor_core("sm100", "e4m3", kind="nvf4")
    m = tensor_core("sm100", "e2m1", kind="nvf4")
    with pytest.raises(TypeError, match="matmul_scaled"):
        matmul(np.ones((2, 64)), np.ones((64, 2)), acc=m)
    with pytest.raises(ValueError, match="multiple"):
        matmul_scaled(np.ones((2, 40)), np.ones((40, 2)), np.ones((2, 2)), np.ones((2, 2)), acc=m)
    assert sf.tensor_core is tensor_core


def test_overflow_and_zero_sign_fields() -> None:
    """The two rules on one designed step each, both engines, and bad values rejected."""
    m = tensor_core("sm90", "bf16")
    big = np.full(16, 2.0**120)
    tiny_a, tiny_b = np.zeros(16), np.zeros(16)
    tiny_a[0], tiny_b[0] = -(2.0**-133), 2.0**-133
    for engine in ("reference", "vector"):
        assert _ours(big[None], big[None], np.zeros(1), m, engine)[0] == np.finfo(np.float32).max
        inf = dataclasses.replace(m, overflow="inf")
        assert _ours(big[None], big[None], np.zeros(1), inf, engine)[0] == np.inf
        assert _ours(-big[None], big[None], np.zeros(1), inf, engine)[0] == -np.inf
        z = _ours(tiny_a[None], tiny_b[None], np.zeros(1), m, engine)[0]
        assert z == 0.0 and np.signbit(z)
        pz = _ours(tiny_a[None], tiny_b[None], np.zeros(1), dataclasses.replace(m, zero_sign="positive"), engine)
        assert pz[0] == 0.0 and not np.signbit(pz[0])
    with pytest.raises(ValueError, match="overflow"):
        dataclasses.replace(m, overflow="saturate")
    with pytest.raises(ValueError, match="zero_sign"):
        dataclasses.replace(m, zero_sign="negative")
