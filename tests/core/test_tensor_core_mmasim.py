"""tensor_core presets bit for bit against MMA-Sim (PyPI ``mmasim``, Xie et al. 2025), instruction by instruction,
for every plain and block-scaled kind, operand format and output format MMA-Sim models on NVIDIA GPUs.

Values come from the whole exponent range of each operand format (every finite code: subnormals and the largest
values), with rows designed for: exponent spread, sums that cancel to zero (C = +-0), sums beyond the output
format's range, one negative product below the output format's smallest step (its sign of zero), zero and
subnormal accumulators, and inf / NaN operands and accumulators. Results are compared as float32 bit patterns,
so -0.0 and +0.0 differ; NaN is one class (any NaN matches any NaN): MMA-Sim writes NVIDIA's canonical NaN,
the model's float64 NaN is the host's (x86: sign set, 0xFFC00000 once in float32) and carries no payload claim.

MMA-Sim returns +-inf for a step sum beyond fp32's range and +0.0 for a negative sum that rounds to zero; the
presets keep IEEE's rounding there by default (``BlockFMA.overflow`` / ``zero_sign``). Each case runs the preset
with those two fields set to MMA-Sim's behaviour (every bit equal, both engines) and the default preset, whose
bits differ from MMA-Sim in exactly the rows where one of the two rules applies."""

from __future__ import annotations

import dataclasses
import types
import zlib

import ml_dtypes
import numpy as np
import pytest

import simfloat as sf
from simfloat.accumulate import matmul, matmul_scaled, tensor_core

mmasim = pytest.importorskip("mmasim")
torch = pytest.importorskip("torch")
nv = pytest.importorskip("mmasim.nv_ptx")

R = 192  # dot products per case: 8 designed groups of 24

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
NBITS = {"e3m2": 6, "e2m3": 6, "e2m1": 4}
HAS_INF = ("bf16", "f16", "tf32", "e5m2")  # operand formats with infinities (e4m3fn: NaN only; fp6/fp4: neither)
OUT = {"f32": np.float32, "f16": np.float16}
MMASIM_RULES = {"overflow": "inf", "zero_sign": "positive"}


def _finfo(t: str):  # type: ignore[no-untyped-def]
    """max and smallest_subnormal of an operand format (tf32: fp32's range, 10 fraction bits)."""
    if t == "tf32":
        return types.SimpleNamespace(max=(2 - 2.0**-10) * 2.0**127, smallest_subnormal=2.0**-136)
    return ml_dtypes.finfo(ML[t])


def _values(t: str, shape: tuple[int, ...], rng: np.random.Generator, limit: float = np.inf) -> np.ndarray:
    """Values of format ``t`` drawn from every finite code (all binades, subnormals, zeros, the largest) whose
    magnitude is below ``limit``; the other codes become 1.0."""
    dt = np.dtype(ML[t])
    codes = rng.integers(0, 1 << NBITS.get(t, 8 * dt.itemsize), size=shape, dtype=np.uint64)
    utype = {1: np.uint8, 2: np.uint16, 4: np.uint32}[dt.itemsize]
    with np.errstate(invalid="ignore", over="ignore"):
        v = codes.astype(utype).view(dt).astype(np.float64)
    v[~np.isfinite(v) | (np.abs(v) >= limit)] = 1.0
    return v


def _tiny_pair(ta: str, tb: str, out: str) -> tuple[float, float] | None:
    """Powers of two (x, y) of formats ta, tb whose product rounds to zero in the output format under both of
    its roundings (fp32 toward zero, fp16 to nearest: at most half its smallest step; a quarter where the
    formats reach it), or None where the formats' smallest product is larger."""
    step = float(np.finfo(OUT[out]).smallest_subnormal)
    fa, fb = _finfo(ta), _finfo(tb)
    ea = range(int(np.log2(float(fa.smallest_subnormal))), int(np.log2(float(fa.max))) + 1)
    lo_b, hi_b = np.log2(float(fb.smallest_subnormal)), np.log2(float(fb.max))
    for target in (step / 4, step / 2):
        for e in ea:
            if lo_b <= np.log2(target) - e <= hi_b:
                return 2.0**e, target / 2.0**e
    return None


def _cases(ta: str, tb: str, k: int, out: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, c): R rows of k, in 8 groups: random codes over the whole range (c: every finite code of the
    output format); the same with a zero accumulator; exponent spread (the first product the largest);
    pairs that cancel exactly (c = +-0); the largest operands, all of one sign per row, with c = 0 or +-the
    output format's largest (sums beyond its range); one negative product a quarter of the output format's
    smallest step, the rest zero, c = 0; the smallest operands against subnormal accumulators; inf / NaN
    operands and accumulators."""
    a, b = _values(ta, (R, k), rng), _values(tb, (R, k), rng)
    cdt = OUT[out]
    cbits = rng.integers(0, 1 << (8 * cdt().itemsize), R, dtype=np.uint64)
    with np.errstate(invalid="ignore"):
        c = cbits.astype({2: np.uint16, 4: np.uint32}[cdt().itemsize]).view(cdt).astype(np.float64)
    c[~np.isfinite(c)] = 0.0
    g = [slice(i * (R // 8), (i + 1) * (R // 8)) for i in range(8)]
    q = R // 8
    c[g[1]] = 0.0
    s = g[2]  # exponent spread: the first product dominates
    a[s, 0], b[s, 0] = np.max(np.abs(a[s]), axis=1), np.max(np.abs(b[s]), axis=1)
    s = g[3]  # cancellation: a[2j+1] b[2j+1] = -a[2j] b[2j]
    a[s, 1::2], b[s, 1::2] = a[s, 0::2], -b[s, 0::2]
    c[s] = np.where(np.arange(q) % 2, -0.0, 0.0)
    s = g[4]  # beyond the range: the largest operands, one sign per row
    sign = np.where(np.arange(q) % 2, -1.0, 1.0)[:, None]
    a[s], b[s] = np.abs(a[s]) * sign, np.abs(b[s])
    a[s, :4], b[s, :4] = float(_finfo(ta).max) * sign, float(_finfo(tb).max)
    c[s] = sign[:, 0] * float(np.finfo(cdt).max) * (np.arange(q) % 3 != 0)
    s = g[5]  # one negative product below the output's smallest step (or the smallest the formats have)
    pair = _tiny_pair(ta, tb, out) or (float(_finfo(ta).smallest_subnormal), float(_finfo(tb).smallest_subnormal))
    a[s], b[s], c[s] = 0.0, 0.0, 0.0
    j = rng.integers(0, k, q)
    a[np.arange(q) + s.start, j], b[np.arange(q) + s.start, j] = -pair[0], pair[1]
    s = g[6]  # the smallest operands against subnormal accumulators
    a[s] = np.sort(np.abs(a[s]), axis=1) * np.sign(rng.standard_normal((q, k)))
    b[s] = np.sort(np.abs(b[s]), axis=1)
    c[s] = float(np.finfo(cdt).smallest_subnormal) * rng.integers(-512, 512, q)
    for i in range(g[7].start, g[7].stop):  # inf / NaN
        j0, j1 = rng.integers(0, k, 2)
        kind = i % 5
        if kind == 0 and ta in HAS_INF:
            a[i, j0] = np.inf
        elif kind == 1 and ta in HAS_INF:
            a[i, j0], b[i, j0] = -np.inf, 0.0  # inf * 0
        elif kind == 2 and ta in HAS_INF and tb in HAS_INF:
            a[i, j0], b[i, j0], a[i, (j0 + 1) % k], b[i, (j0 + 1) % k] = np.inf, 1.0, np.inf, -1.0
        elif kind == 3 and ta not in ("e3m2", "e2m3", "e2m1"):
            a[i, j1] = np.nan
        else:
            c[i] = (np.inf, -np.inf, np.nan)[i % 3]
    if ta == "tf32":  # fp32 operands: the MMA truncates them to tf32 (both sides do)
        a, b = a.astype(np.float32).astype(np.float64), b.astype(np.float32).astype(np.float64)
    return a, b, c


def _torch(v: np.ndarray, t: str):  # type: ignore[no-untyped-def]
    if t in TORCH:
        return torch.from_numpy(v.astype(np.float32)).to(TORCH[t])
    return torch.from_numpy(v.astype(np.float16))  # fp6/fp4 values, held in fp16 (MMA-Sim reads any float)


def _sim(op, a, b, c, ta, tb, out="f32"):  # type: ignore[no-untyped-def]
    cc = torch.from_numpy(c.astype(OUT[out]))
    return op.dpa(_torch(a, ta), _torch(b, tb), cc).double().numpy()


def _ours(a, b, c, model, engine):  # type: ignore[no-untyped-def]
    return matmul(a[:, None, :], b[:, :, None], c[:, None, None], acc=model, engine=engine)[:, 0, 0]


def _bits(x: np.ndarray) -> np.ndarray:
    """float32 bit patterns (fp16 results are fp32 values too); every NaN one pattern (see module docstring)."""
    u = np.asarray(x, dtype=np.float64).astype(np.float32).view(np.uint32).copy()
    u[np.isnan(x)] = 0x7FFFFFFF
    return u


def _same(x: np.ndarray, y: np.ndarray) -> None:
    bad = _bits(x) != _bits(y)
    assert not bad.any(), (np.flatnonzero(bad)[:5], x[bad][:5], y[bad][:5])


def _plain() -> list[tuple]:  # type: ignore[type-arg]
    """Every plain MMA kind MMA-Sim models: (arch, instruction, variant, mmasim class, its arch name, shape and
    type, a format, b format, output, k per case = three steps)."""
    f8, f8f6f4 = ("e4m3", "e5m2"), ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1")
    out: list[tuple] = [  # type: ignore[type-arg]
        ("sm70", None, None, nv.MMA, "Volta", "m8n8k4.f32.f16.f16.f32", "f16", "f16", "f32", 12),
        ("sm70", None, None, nv.MMA, "Volta", "m8n8k4.f16.f16.f16.f16", "f16", "f16", "f16", 12),
    ]
    mma = [("sm80", None, None, "Ampere", 16), ("sm89", None, None, "Ada Lovelace", 16)]
    mma += [("sm90", "mma.sync", "mmasim", "Hopper", 32), ("sm100", "mma.sync", None, "Blackwell", 32)]
    mma += [("sm120", None, None, "RTX Blackwell", 32)]
    for arch, ins, var, name, nbytes in mma:
        for st, t, d in (
            ("m16n8k16.f32.f16.f16.f32", "f16", "f32"),
            ("m16n8k16.f16.f16.f16.f16", "f16", "f16"),
            ("m16n8k16.f32.bf16.bf16.f32", "bf16", "f32"),
            ("m16n8k8.f32.tf32.tf32.f32", "tf32", "f32"),
        ):
            size = 4 if t == "tf32" else 2
            out.append((arch, ins, var, nv.MMA, name, st, t, t, d, 3 * nbytes // size))
        if arch in ("sm89", "sm120"):
            for d in ("f32", "f16"):
                out += [
                    (arch, ins, var, nv.MMA, name, f"m16n8k32.{d}.{x}.{y}.{d}", x, y, d, 3 * nbytes)
                    for x in f8
                    for y in f8
                ]
        if arch == "sm120":
            for d in ("f32", "f16"):
                out += [
                    (arch, ins, var, nv.MMA, name, f"m16n8k32.kind::f8f6f4.{d}.{x}.{y}.{d}", x, y, d, 96)
                    for x in f8f6f4
                    for y in f8f6f4
                ]
    wg = ("sm90", None, "mmasim", nv.WGMMA, "Hopper")
    out += [
        (*wg, "m64n8k8.f32.tf32.tf32", "tf32", "tf32", "f32", 24),
        (*wg, "m64n8k16.f32.f16.f16", "f16", "f16", "f32", 48),
        (*wg, "m64n8k16.f16.f16.f16", "f16", "f16", "f16", 48),
        (*wg, "m64n8k16.f32.bf16.bf16", "bf16", "bf16", "f32", 48),
    ]
    out += [(*wg, f"m64n8k32.{d}.{x}.{y}", x, y, d, 96) for d in ("f32", "f16") for x in f8 for y in f8]
    tc = ("sm100", None, None, nv.TCGen05MMA, "Blackwell")
    out += [
        (*tc, "m64n8k8.kind::tf32.f32.tf32.tf32", "tf32", "tf32", "f32", 24),
        (*tc, "m64n8k16.kind::f16.f32.f16.f16", "f16", "f16", "f32", 48),
        (*tc, "m64n8k16.kind::f16.f32.bf16.bf16", "bf16", "bf16", "f32", 48),
        (*tc, "m64n8k16.kind::f16.f16.f16.f16", "f16", "f16", "f16", 48),
    ]
    out += [
        (*tc, f"m64n8k32.kind::f8f6f4.{d}.{x}.{y}", x, y, d, 96) for d in ("f32", "f16") for x in f8f6f4 for y in f8f6f4
    ]
    return out


PLAIN = _plain()


def _model(arch, ins, var, ta, tb, out):  # type: ignore[no-untyped-def]
    b = SF[tb] if tb != ta else None
    return tensor_core(arch, SF[ta], b, variant=var, instruction=ins, out_format="fp16" if out == "f16" else "fp32")


@pytest.mark.parametrize(
    ("arch", "ins", "var", "cls", "sim_arch", "st", "ta", "tb", "out", "k"),
    PLAIN,
    ids=[f"{p[0]}-{p[5]}" for p in PLAIN],
)
def test_plain_kinds_match_mmasim(arch, ins, var, cls, sim_arch, st, ta, tb, out, k) -> None:  # type: ignore[no-untyped-def]
    """MMA-Sim's two rules set: every bit, both engines. The default preset: the same bits but in the rows where
    MMA-Sim gives +-inf / NaN for a sum beyond the range (the preset: a finite value) or +0.0 for a negative
    sum that rounds to zero (the preset: -0.0), and those rows exist exactly where the formats allow them."""
    op = cls(sim_arch, st)
    default = _model(arch, ins, var, ta, tb, out)
    rules = dataclasses.replace(default, **MMASIM_RULES)
    rng = np.random.default_rng(zlib.crc32(st.encode()))
    a, b, c = _cases(ta, tb, k, out, rng)
    want = _sim(op, a, b, c, ta, tb, out)
    got = _ours(a, b, c, rules, "reference")
    _same(got, want)
    _same(_ours(a, b, c, rules, "vector"), want)
    mine = _ours(a, b, c, default, "vector")
    _same(_ours(a, b, c, default, "reference"), mine)
    differ = _bits(mine) != _bits(want)
    overflow = ~np.isfinite(got) & (_bits(got) != _bits(mine))  # inf from a step (then maybe inf - inf: NaN)
    zero_sign = (got == 0) & ~np.signbit(got) & (mine == 0) & np.signbit(mine)
    assert (differ == (overflow | zero_sign)).all()
    # beyond fp32's range only from bf16/tf32 products (fp16 results round to nearest: inf either way);
    # a negative sum below the smallest step wherever the formats' smallest product is that small
    assert overflow.any() == (out == "f32" and ta in ("bf16", "tf32"))
    assert zero_sign.any() == (_tiny_pair(ta, tb, out) is not None)


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
    a, b, c = _cases("bf16", "bf16", 64, "f32", rng)
    ours = _ours(a, b, c, dataclasses.replace(h200, **MMASIM_RULES), "vector")
    want = _sim(op, a, b, c, "bf16", "bf16")
    with np.errstate(invalid="ignore"):  # inf * 0 in the inf / NaN rows
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
    a, b, c = _cases(ta, tb, k, "f32", rng)
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
    rules = dataclasses.replace(model, **MMASIM_RULES)
    for engine in ("reference", "vector"):
        out = matmul_scaled(a, b.T.copy(), sa, sb.T.copy(), np.diag(c), acc=rules, engine=engine)
        _same(np.diagonal(out), want.astype(np.float64))
    got = np.diagonal(out)
    mine = np.diagonal(matmul_scaled(a, b.T.copy(), sa, sb.T.copy(), np.diag(c), acc=model))
    overflow = ~np.isfinite(got) & (_bits(got) != _bits(mine))
    zero_sign = (got == 0) & ~np.signbit(got) & (mine == 0) & np.signbit(mine)
    assert ((_bits(mine) != _bits(want)) == (overflow | zero_sign)).all()


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
    with pytest.raises(ValueError, match="no tensor-core kind"):
        tensor_core("sm90", "e2m1", out_format="fp16", instruction="mma.sync")
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
