"""simfloat.attention.int8_flash / fp8_flash: each quantizer against an independent numpy reference (fp64 plan
except that quantizer), the consistent row sum, the fast paths against the general code, tracing, presets and
argument errors. The bit-exact comparison with the Triton kernels is tests/gpu/test_gpu_int8_crossval.py."""

import dataclasses
import math

import ml_dtypes
import numpy as np
import pytest

from simfloat.accumulate import Sequential, acc_params, dot_acc, matmul, tensor_core
from simfloat.attention import (
    EXACT,
    QUANT_OPS,
    QUANTIZERS,
    Plan,
    Quant,
    QuantPlan,
    flash,
    fp8_flash,
    hadamard_rotation,
    int8_flash,
    plan,
    quant_flash,
    quant_plan,
    quant_presets,
    quantize,
    smooth_keys,
    smooth_queries,
)
from simfloat.attention import _quant_kernels as QK
from simfloat.formats import format as sformat
from simfloat.trace import Tracer

LOG2E = math.log2(math.e)


def _inputs(n, d, seed=0, nk=None):
    rng = np.random.default_rng(seed)
    nk = n if nk is None else nk
    q = rng.standard_normal((n, d)).astype(np.float16).astype(np.float32)
    k = rng.standard_normal((nk, d)).astype(np.float16).astype(np.float32)
    v = rng.standard_normal((nk, d)).astype(np.float16).astype(np.float32)
    return q, k, v


def _attn64(q, k, v, scale=None, causal=False):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * (q @ k.T)
    if causal:
        s[np.triu_indices(s.shape[0], 1, s.shape[1])] = -np.inf
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def _np_int8(x, axis):
    """Independent numpy INT8 quantization: fp32 scale max/127 and quotient, np.round (half to even)."""
    x32 = x.astype(np.float32)
    amax = np.abs(x32).max(axis=axis, keepdims=True)
    scale = np.where(amax == 0, np.float32(1), amax / np.float32(127)).astype(np.float32)
    codes = np.clip(np.round(x32 / scale), -127, 127)
    return codes.astype(np.float64), scale.astype(np.float64)


# --- each quantizer alone (fp64 plan except that quantizer) == an independent numpy reference ---------------


@pytest.mark.parametrize("op", ["q_quant", "k_quant", "v_quant"])
def test_isolated_int8_quantizer_matches_numpy(op):
    q, k, v = _inputs(70, 32, seed=1)
    q[3] *= 40  # one loud token, one silent one
    k[5] = 0.0
    plan = quant_plan("int8-reference").isolate(op)
    assert [o for o in QUANTIZERS if getattr(plan, o).quantizes] == [op]
    out = int8_flash(q, k, v, plan=plan, block_m=16, block_n=32)
    args = {"q_quant": (q, -1), "k_quant": (k, -1), "v_quant": (v, (-2, -1))}
    x, axis = args[op]
    codes, scale = _np_int8(x, axis)
    deq = codes * scale
    ref = _attn64(*(deq if name == op[0] else arr for name, arr in zip("qkv", (q, k, v), strict=True)))
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-13)
    assert np.abs(ref - _attn64(q, k, v)).max() > 1e-4  # the quantizer does change the result


def test_isolated_p_quantizer_matches_numpy():
    """One key tile, so the running max is the row max: P = exp2((s - max) * scale * log2 e) exactly,
    codes trunc(fp16(fp16(P) * 127 + 0.5)), out = (codes @ v) / 127 / sum(P)."""
    q, k, v = _inputs(40, 32, seed=2, nk=100)
    plan = quant_plan("int8-reference").isolate("p_quant")
    out = int8_flash(q, k, v, plan=plan, block_n=128)
    s = (q.astype(np.float64) @ k.T.astype(np.float64)) * (LOG2E / math.sqrt(32))
    p = np.exp2(s - s.max(-1, keepdims=True))
    p16 = p.astype(np.float16).astype(np.float64)
    codes = np.trunc((p16 * 127 + 0.5).astype(np.float16).astype(np.float64))  # exact in float64, one rn16
    ref = (codes @ v.astype(np.float64)) / 127 / p.sum(-1, keepdims=True)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-13)
    cons = int8_flash(q, k, v, plan=plan.replace(row_sum="consistent"), block_n=128)
    np.testing.assert_allclose(
        cons, (codes @ v.astype(np.float64)) / codes.sum(-1, keepdims=True), rtol=1e-12, atol=1e-13
    )


def test_p_quantizer_fused_and_unfused_agree_on_every_fp16_probability():
    """INT8 T13: trunc(fp16(p16 * 127 + 0.5)) (one rounding, the kernel's fma) and the reference code's
    trunc(fp16(fp16(p16 * 127) + 0.5)) give the same code for every fp16 value in [0, 1] (exhaustive)."""
    h = np.arange(0, 0x3C01, dtype=np.uint16).view(np.float16).astype(np.float64)
    fused, _ = quantize(h, Quant("int", "fixed", "half_up", arith="float16", pre="float16"))
    unfused, _ = quantize(h, Quant("int", "fixed", "half_up_unfused", arith="float16", pre="float16"))
    want = np.trunc((h * 127 + 0.5).astype(np.float16).astype(np.float64))
    assert np.array_equal(fused, want) and np.array_equal(unfused, want)
    assert fused.min() == 0 and fused.max() == 127


def test_isolated_fp8_quantizers_match_numpy():
    q, k, v = _inputs(64, 32, seed=3)
    e4m3 = ml_dtypes.float8_e4m3fn
    plan = quant_plan("fp8-e4m3-block")
    # Q per block of block_m = 32 rows: scale = amax/448 (fp32), code = e4m3(fp32(x / scale))
    out = fp8_flash(q, k, v, plan=plan.isolate("q_quant"), block_m=32, block_n=32)
    qb = q.reshape(2, 32, 32)
    scale = (np.abs(qb).max(axis=(1, 2), keepdims=True) / np.float32(448)).astype(np.float32)
    deq = ((qb / scale).astype(e4m3).astype(np.float64) * scale).reshape(64, 32)
    np.testing.assert_allclose(out, _attn64(deq, k, v), rtol=1e-12, atol=1e-13)
    # P cast straight to e4m3; the row sum from the unquantized P
    out = fp8_flash(q, k, v, plan=plan.isolate("p_quant"), block_n=64)
    s = (q.astype(np.float64) @ k.T.astype(np.float64)) * (LOG2E / math.sqrt(32))
    p = np.exp2(s - s.max(-1, keepdims=True))
    ref = (p.astype(e4m3).astype(np.float64) @ v) / p.sum(-1, keepdims=True)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize(
    "quant, kw",
    [
        (Quant("int", "per-channel", pre="float32"), {}),
        (Quant("int", "per-block", pre="float32"), {"group": 7}),
        (Quant("int", "per-token", "nearest_away"), {}),
        (Quant("int", "per-token", "toward_zero", qmax=63), {}),
        (Quant("float", "per-tensor", fmt="float8_e5m2", pre="float32"), {}),
        (Quant("float", "unscaled", fmt="float8_e5m2"), {}),
    ],
)
def test_quantize_matches_numpy(quant, kw):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((2, 30, 8)) * 3).astype(np.float32)
    codes, scale = quantize(x, quant, **kw)
    x32 = x.astype(np.float32)
    if quant.granularity == "unscaled":
        assert np.array_equal(codes, x32.astype(ml_dtypes.float8_e5m2).astype(np.float64))
        return
    if quant.granularity == "per-block":
        g = kw["group"]
        pad = np.zeros((2, 35, 8), np.float32)
        pad[:, :30] = np.abs(x32)
        amax = np.repeat(pad.reshape(2, 5, g * 8).max(-1), g, axis=1)[:, :30, None]
    else:
        axis = {"per-channel": -2, "per-token": -1, "per-tensor": (-2, -1)}[quant.granularity]
        amax = np.abs(x32).max(axis=axis, keepdims=True)
    qmax = np.float32(quant.qmax)
    s = (amax / qmax).astype(np.float32)
    y = (x32 / s).astype(np.float32)
    if quant.kind == "float":
        want = y.astype(ml_dtypes.float8_e5m2).astype(np.float64)
    elif quant.rounding == "nearest_away":
        want = np.clip(np.sign(y) * np.floor(np.abs(y) + np.float32(0.5)), -qmax, qmax)
    elif quant.rounding == "toward_zero":
        want = np.clip(np.trunc(y), -qmax, qmax)
    else:
        want = np.clip(np.round(y), -qmax, qmax)
    assert np.array_equal(codes, want)
    assert np.array_equal(np.broadcast_to(scale, x.shape), np.broadcast_to(s, x.shape))


# --- row sums --------------------------------------------------------------------------------------------


def test_consistent_row_sum_gives_constant_v_exactly():
    """With the row sum taken from the quantized P, numerator and denominator see the same P: a constant V
    comes out exactly (fp16 output); the reference row sum (fp32 P) misses it by up to ~1/254."""
    q, k, _ = _inputs(130, 64, seed=5)
    v = np.full((130, 64), 0.7998046875, np.float32)  # an fp16 value
    cons = int8_flash(q, k, v, plan="int8-consistent", block_m=32, block_n=32, causal=True)
    assert np.array_equal(cons, np.broadcast_to(v, cons.shape))
    ref = int8_flash(q, k, v, plan="int8-reference", block_m=32, block_n=32, causal=True)
    assert not np.array_equal(ref, cons)
    assert np.abs(ref / v - 1).max() > 2**-10
    # fp64 arithmetic, only P quantized, V unquantized and constant 1: exactly 1
    ones = np.ones_like(v)
    iso = quant_plan("int8-consistent").isolate("p_quant")
    assert np.array_equal(int8_flash(q, k, ones, plan=iso, block_n=32), np.ones_like(ones))


def test_int8_error_is_modest_and_half_int8_is_closer():
    q, k, v = _inputs(150, 64, seed=6)
    ref = _attn64(q, k, v)
    errs = {
        p: np.sqrt(np.mean((int8_flash(q, k, v, plan=p) - ref) ** 2))
        for p in ("int8-reference", "int8-consistent", "half-int8")
    }
    assert all(1e-4 < e < 1e-2 for e in errs.values()), errs
    assert errs["half-int8"] < errs["int8-reference"]


# --- equivalences and fast paths -------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_float_flash_preset_equals_flash_bitwise(fmt):
    q, k, v = _inputs(77, 32, seed=7, nk=90)
    f = {"fp16": "float16", "bf16": "bfloat16"}[fmt]
    from simfloat import round as sround

    q, k, v = (sround(x, f) for x in (q, k, v))
    for causal in (False, True):
        a = quant_flash(q, k, v, plan=f"{fmt}-flash", block_m=16, block_n=32, causal=causal)
        b = flash(q, k, v, plan=f"triton-{fmt}", block_m=16, block_n=32, causal=causal)
        assert np.array_equal(a, b)


def test_fp64_plan_is_attention():
    q, k, v = _inputs(50, 16, seed=8)
    np.testing.assert_allclose(
        int8_flash(q, k, v, plan="fp64", block_n=16, causal=True), _attn64(q, k, v, causal=True), rtol=1e-13, atol=1e-14
    )


def test_incoherent_rotation_is_exact_in_fp64():
    q, k, v = _inputs(40, 64, seed=9)
    r = hadamard_rotation(64, seed=3)
    np.testing.assert_allclose(r @ r.T, np.eye(64), atol=1e-15)
    exact = quant_plan("fp8-e4m3").exact().replace(rotate="float64")
    out = fp8_flash(q, k, v, plan=exact, incoherent=True, seed=3)
    np.testing.assert_allclose(out, _attn64(q, k, v), rtol=1e-12, atol=1e-13)
    # outliers in a few channels: rotation spreads them and cuts the per-tensor FP8 error
    q[:, 5] *= 30
    k[:, 5] *= 30
    ref = _attn64(q, k, v)
    plain = fp8_flash(q, k, v, plan=quant_plan("fp8-e4m3").arith_fp64())
    rot = fp8_flash(q, k, v, plan=quant_plan("fp8-e4m3").arith_fp64(), incoherent=True)
    assert np.abs(rot - ref).mean() < np.abs(plain - ref).mean()


def test_block_dot_fast_path_equals_dot_acc():
    rng = np.random.default_rng(10)
    for fmt, model in (
        ("float8_e4m3fn", tensor_core("sm90", "e4m3")),
        ("float16", tensor_core("sm90", "fp16")),
        ("bfloat16", tensor_core("sm90", "bf16")),
    ):
        from simfloat import round as sround

        ap = acc_params(model)
        a = sround(rng.standard_normal((50, 3, 70)) * np.exp2(rng.integers(-12, 5, (50, 3, 1))), fmt)
        b = sround(rng.standard_normal((50, 3, 70)), fmt)
        a[:, 1, ::3] = 0.0
        for i in range(50):
            c = float(sround(np.array([rng.standard_normal() * 2.0 ** rng.integers(-30, 30)]), "float32")[0])
            for r in range(3):
                got = QK.dot3(a, i, r, b, i, r, c, ap, QK.DOT_BLOCK)
                assert np.isfinite(got) and got == dot_acc(a[i, r], b[i, r], c, ap)


def test_the_rounding_shortcut_equals_the_exact_rounding():
    """round_exact's shortcut (nearest-even / toward-zero: rint / trunc of the value scaled to the grid, once the
    quantized kernels' own fast paths) gives the oracle's bits on grid midpoints and products landing on them."""
    from fractions import Fraction

    from oracle import round_ref

    from simfloat.rounding._exact import _round_quick

    rng = np.random.default_rng(11)
    x, y = (rng.standard_normal(4000) * np.exp2(rng.integers(-20, 20, 4000)) for _ in range(2))
    x, y = (z.astype(np.float32).astype(np.float64) for z in (x, y))
    mid = (np.arange(2048, 4096, dtype=np.float64) + 0.5) * 2.0**-10
    x = np.concatenate([x, mid, mid * 3, np.ldexp(mid, -20), [0.0, -0.0, 1e-45, -1e-45, 65520.0, 7e4]])
    y = np.concatenate(
        [y, np.ones(len(mid)), np.full(len(mid), 1 / 3), np.ones(len(mid)), [1.0, 2.0, 1.0, 1.0, 1.0, 1.0]]
    )
    names = {0: "nearest_even", 2: "toward_zero"}
    taken = 0
    for fname, mode in (("float16", 0), ("float32", 0), ("bfloat16", 0), ("float8_e4m3fn", 0), ("float16", 2)):
        f = sformat(fname)
        for a, b in zip(x, y, strict=True):
            for s, exact in ((a, True), (a * b, Fraction(a) * Fraction(b))):
                ok, r = _round_quick(s, exact is True or Fraction(s) == exact, f.params, mode)
                if ok:
                    taken += 1
                    want = round_ref(exact if exact is not True else s, f, names[mode])
                    assert r == want and np.signbit(r) == np.signbit(want), (fname, mode, a, b, r, want)
    assert taken > 10000


# --- tracing and attribution -----------------------------------------------------------------------------


def test_trace_records_quantizers_and_does_not_change_results():
    q, k, v = _inputs(100, 32, seed=12)
    tr = Tracer()
    a = int8_flash(q, k, v, trace=tr, block_m=32, block_n=32, causal=True)
    assert np.array_equal(a, int8_flash(q, k, v, block_m=32, block_n=32, causal=True))
    ops = tr.by_op().reset_index()
    rms = dict(zip(ops["op"].astype(str), ops["rms"], strict=True))
    assert {"q_quant", "k_quant", "v_quant", "p_quant"} <= set(rms)
    assert rms["qk"] == 0.0 and rms["pv"] == 0.0  # integer dots are exact
    assert rms["p_quant"] > 1e-4 and rms["v_quant"] > 1e-3
    out_drift = tr.state_by_block("max_abs").loc[-1, "out"]
    assert out_drift == pytest.approx(np.abs(a - _attn64(q, k, v, causal=True)).max(), rel=1e-6)
    tr8 = Tracer()
    b = fp8_flash(q, k, v, trace=tr8, scaling="per-block", incoherent=True, block_m=32, block_n=32)
    assert np.array_equal(b, fp8_flash(q, k, v, scaling="per-block", incoherent=True, block_m=32, block_n=32))
    assert "rotate" in set(tr8.by_op().reset_index()["op"].astype(str))


def test_isolate_and_ablate():
    plan = quant_plan("int8-reference")
    only = plan.isolate("v_quant")
    assert only.v_quant == plan.v_quant and not only.q_quant.quantizes and only.scale.fmt.name == "float64"
    no = plan.ablate("p_quant")
    assert not no.p_quant.quantizes and no.q_quant == plan.q_quant and no.scale == plan.scale
    assert plan.ablate("qk").qk == plan.exact().qk
    q, k, v = _inputs(64, 32, seed=13)
    ref = _attn64(q, k, v)
    full = np.abs(int8_flash(q, k, v, plan=plan) - ref).mean()
    assert np.abs(int8_flash(q, k, v, plan=plan.exact()) - ref).max() < 1e-14
    assert np.abs(int8_flash(q, k, v, plan=plan.ablate("v_quant")) - ref).mean() < full
    with pytest.raises(ValueError, match="unknown op"):
        plan.isolate("nope")


def test_presets_and_plan_str():
    table = quant_presets()
    for name in (
        "int8-reference",
        "int8-consistent",
        "half-int8",
        "fp8-e4m3",
        "fp8-e5m2-block",
        "fp8-e5m2-unscaled",
        "fp16-flash",
        "bf16-flash",
        "int8-reference-fp64",
        "fp64",
    ):
        assert isinstance(table[name], Plan) and table[name].quantized
        assert table[name] is plan(name if name != "fp64" else "quant-fp64")  # one preset table
    text = str(quant_plan("int8-reference"))
    for op in QUANT_OPS:
        assert f"{op}=" in text
    assert "half_up" in text and "per-token" in text


# --- errors ----------------------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors():
    q, k, v = _inputs(8, 32, seed=14)
    with pytest.raises(TypeError, match="numpy array"):
        int8_flash(q.tolist(), k, v)
    with pytest.raises(TypeError, match="float32 or float64"):
        int8_flash(q.astype(np.int32), k, v)
    with pytest.raises(ValueError, match="head_dim differ"):
        int8_flash(q[:, :16], k, v)
    with pytest.raises(ValueError, match="block_m"):
        int8_flash(q, k, v, block_m=0)
    with pytest.raises(ValueError, match="unknown quantized plan"):
        int8_flash(q, k, v, plan="int9")
    with pytest.raises(TypeError, match="Plan or a preset name"):
        int8_flash(q, k, v, plan=3)
    with pytest.raises(ValueError, match="no quantizers"):
        int8_flash(q, k, v, plan="triton-bf16")
    with pytest.raises(ValueError, match="scale"):
        int8_flash(q, k, v, scale=-1.0)
    with pytest.raises(TypeError, match="Tracer"):
        int8_flash(q, k, v, trace="yes")
    with pytest.raises(ValueError, match="fmt must be one of"):
        fp8_flash(q, k, v, fmt="e3m4")
    with pytest.raises(ValueError, match="scaling must be one of"):
        fp8_flash(q, k, v, scaling="per-row")
    with pytest.raises(ValueError, match="either plan"):
        fp8_flash(q, k, v, fmt="e5m2", plan="fp8-e4m3")
    with pytest.raises(ValueError, match="power of two"):
        fp8_flash(q[:, :24], k[:, :24], v[:, :24], incoherent=True)
    with pytest.raises(ValueError, match="half_up"):
        Quant("int", "per-token", "half_up")
    with pytest.raises(ValueError, match="needs fmt"):
        Quant("float", "per-tensor")
    with pytest.raises(ValueError, match="does not factor out"):
        quant_plan("int8-reference").replace(q_quant=Quant("int", "per-channel"))
    with pytest.raises(ValueError, match="folded"):
        quant_plan("fp8-e4m3").replace(q_quant=Quant("int", "per-token"))
    with pytest.raises(ValueError, match="pv_update"):
        quant_plan("half-int8").replace(p_quant=Quant("int", "fixed", "half_up"))
    with pytest.raises(ValueError, match="unknown plan entries"):
        quant_plan("int8-reference").replace(bogus=1)
    with pytest.raises(TypeError, match="Quant"):
        quant_plan("int8-reference").replace(v_quant="float16")


# --- SageAttention2-style plans ---------------------------------------------------------------------------


def test_smoothing_alone_matches_numpy_and_is_softmax_invariant():
    q, k, v = _inputs(70, 16, seed=31)
    k = k + np.float32(3.0)  # a large mean key: what smoothing removes
    sage = quant_plan("sage2-int8-fp8")
    only = sage.isolate("k_smooth")
    assert only.k_smooth == sage.k_smooth and not only.k_quant.quantizes
    k64 = k.astype(np.float64)
    mu = (k64.sum(0) / k64.shape[0]).astype(np.float32).astype(np.float64)
    ks = (k64 - mu).astype(np.float32).astype(np.float64)  # float64 difference, rounded once into fp32
    got = quant_flash(q, k, v, plan=only, block_m=32, block_n=32)
    assert np.abs(got - _attn64(q, ks, v)).max() < 1e-14  # the smoothed keys, everything else exact
    assert 0 < np.abs(got - _attn64(q, k, v)).max() < 1e-5  # softmax removes the shift, fp32 keeps a trace
    s, exact = smooth_keys(k[None], "float32")
    assert np.array_equal(s[0], ks) and np.allclose(exact[0], k64 - k64.mean(0), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="seq_k"):
        smooth_keys(np.zeros((0, 4)), "float32")


def test_sage_p_quantizer_alone_matches_numpy():
    """P = e4m3(fp32(p * 448)) / 448 with the row sum of the unquantized P (one key tile: no rescaling)."""
    q, k, v = _inputs(40, 16, seed=32)
    sage = quant_plan("sage2-int8-fp8")
    for pl in (sage, quant_plan("sage2-int8-fp8-single")):
        got = quant_flash(q, k, v, plan=pl.isolate("p_quant"), block_m=64, block_n=64)
        s = (q.astype(np.float64) @ k.T.astype(np.float64)) * (LOG2E / 4.0)
        p = np.exp2(s - s.max(-1, keepdims=True))
        c = (p * 448).astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
        want = (c @ v.astype(np.float64)) / 448 / p.sum(-1, keepdims=True)
        assert np.abs(got - want).max() < 1e-13, pl.name
    codes, sc = quantize(np.array([0.0, 1e-4, 0.5, 1.0]), sage.p_quant)
    assert float(sc) == 1 / 448 and codes.tolist() == [0.0, 0.04296875, 224.0, 448.0]


def test_sage_q_per_warp_and_k_per_block_scales():
    x = np.random.default_rng(33).standard_normal((2, 70, 8)) * np.arange(1, 71)[:, None]
    sage = quant_plan("sage2-int8-fp8")
    codes, sc = quantize(x, sage.q_quant)
    assert sc.shape == (2, 70, 1)
    for g0 in range(0, 70, 32):
        want_c, want_s = _np_int8(x[:, g0 : g0 + 32], axis=(1, 2))
        assert np.array_equal(sc[:, g0 : g0 + 32], np.broadcast_to(want_s, sc[:, g0 : g0 + 32].shape))
        assert np.array_equal(codes[:, g0 : g0 + 32], want_c)
    kc, ksc = quantize(x, sage.k_quant, group=16)
    assert len(np.unique(ksc[0])) == 5  # one scale per key tile of 16


def test_sage_two_level_beats_single_level_on_long_rows():
    """The single-level plan rounds the running P.V sum to 13 fraction bits every 32 keys."""
    q, k, v = _inputs(32, 16, seed=34, nk=2048)
    v = np.abs(v) + np.float32(1.0)  # same-sign values: the running sum grows, its low bits get cut
    ref = _attn64(q, k, v)
    two = np.abs(quant_flash(q, k, v, plan="sage2-int8-fp8", block_m=32, block_n=64) - ref).mean()
    one = np.abs(quant_flash(q, k, v, plan="sage2-int8-fp8-single", block_m=32, block_n=64) - ref).mean()
    assert two < one


def test_sage_isolate_ablate_and_trace_cover_every_quantizer():
    q, k, v = _inputs(66, 16, seed=35)
    sage = quant_plan("sage2-int8-fp8")
    ref = _attn64(q, k, v)
    full = np.abs(quant_flash(q, k, v, plan=sage, block_m=32, block_n=32) - ref).mean()
    for op in ("k_smooth", *QUANTIZERS):
        no = sage.ablate(op)
        assert getattr(no, op) != getattr(sage, op)
        only = sage.isolate(op)
        e = np.abs(quant_flash(q, k, v, plan=only, block_m=32, block_n=32) - ref).mean()
        assert 0 < e < full, op
    assert sage.ablate("k_smooth").k_smooth.fmt.name == "float64"
    assert sage.exact().k_smooth.fmt.name == "float64"
    plain = quant_plan("int8-reference")
    assert plain.ablate("k_smooth").k_smooth is None and plain.exact().k_smooth is None
    tr = Tracer()
    a = quant_flash(q, k, v, plan=sage, trace=tr, block_m=32, block_n=32, causal=True)
    assert np.array_equal(a, quant_flash(q, k, v, plan=sage, block_m=32, block_n=32, causal=True))
    ops = tr.by_op().reset_index()
    rms = dict(zip(ops["op"].astype(str), ops["rms"], strict=True))
    assert rms["k_smooth"] > 0 and rms["p_quant"] > 0 and rms["qk"] == 0.0
    assert set(QUANT_OPS) >= set(rms)


def _offset_inputs(seed, offset):
    """Q = N(0, 1) + offset * u per channel (u = +-1/8, one sign per channel), keys orthogonal to u: the exact
    attention does not depend on the offset, the amax of every Q row and block does."""
    g = np.random.default_rng(seed)
    d = 64
    u = g.choice([-1.0, 1.0], d) / 8.0
    k = g.standard_normal((2, 97, d))
    k -= (k @ u)[..., None] * u
    v = g.standard_normal((2, 97, d)).astype(np.float32)
    q = (g.standard_normal((2, 97, d)) + offset * 8.0 * u).astype(np.float32)
    return q, k.astype(np.float32), v


def _rel_err(plan, q, k, v):
    ref = np.stack([_attn64(q[i], k[i], v[i]) for i in range(q.shape[0])])
    got = quant_flash(q, k, v, plan=plan, block_m=32, block_n=32)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize(
    ("name", "worse"), [("sage2-int8-fp8", 2.0), ("sage3-fp4", 5.0)]
)  # measured at offset 10: 2.6x (INT8 per warp), 11x (NVFP4)
def test_q_smoothing_removes_a_common_offset_of_q(name, worse):
    """With a common offset of 10 per channel in Q, INT8 / NVFP4 codes spend their range on it: the error grows
    by `worse` times or more without Q smoothing; with it, the error stays at its offset-free level (within 5%;
    measured: equal to 3 digits)."""
    q0, k, v = _offset_inputs(41, 0.0)
    q, _, _ = _offset_inputs(41, 10.0)
    plain, smooth = quant_plan(name), quant_plan(f"{name}-qsmooth")
    e_smooth, e_plain = _rel_err(smooth, q, k, v), _rel_err(plain, q, k, v)
    assert e_smooth <= 1.05 * _rel_err(smooth, q0, k, v)
    assert e_plain > worse * e_smooth, (e_plain, e_smooth)
    assert _rel_err(plain, q0, k, v) < 1.05 * e_smooth  # without an offset Q smoothing changes little


def test_q_smoothing_alone_matches_numpy():
    """isolate('q_smooth'): Q less its fp32 mean per q tile, the correction mean . k (float64, EXACT) back into
    the scores, everything else float64: the attention of the smoothed-and-corrected Q; isolate('q_delta'): the
    fp32 FMA chain's correction alone (on the keys smoothed in float64)."""
    q, k, v = _inputs(70, 16, seed=36)
    q = q + np.float32(5.0)
    sage = quant_plan("sage2-int8-fp8-qsmooth")
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    for bm in (32, 70):
        only = sage.isolate("q_smooth")
        assert only.q_smooth == sage.q_smooth and only.q_delta == EXACT and not only.q_quant.quantizes
        got = quant_flash(q, k, v, plan=only, block_m=bm, block_n=32)
        mus = [(q64[lo : lo + bm].sum(0) / q64[lo : lo + bm].shape[0]).astype(np.float32) for lo in range(0, 70, bm)]
        mu = np.repeat(np.stack(mus).astype(np.float64), bm, axis=0)[:70]
        qs = (q64 - mu).astype(np.float32).astype(np.float64)  # the float64 difference rounded once into fp32
        s = (qs @ k64.T + mu @ k64.T) / 4.0
        p = np.exp(s - s.max(-1, keepdims=True))
        want = (p / p.sum(-1, keepdims=True)) @ v
        assert np.abs(got - want).max() < 1e-13, bm
        assert 0 < np.abs(got - _attn64(q, k, v)).max() < 1e-5  # the correction puts the shift back
        smoothed, exact, mu_got = smooth_queries(q[None], "float32", bm)
        assert np.array_equal(smoothed[0], qs) and np.array_equal(mu_got[0], np.stack(mus).astype(np.float64))
        assert np.allclose(exact[0], q64 - np.repeat(np.stack([m for m in mus]), bm, 0)[:70], rtol=0, atol=1e-5)
    only = sage.isolate("q_delta")
    assert only.q_delta == Sequential("float32") and only.q_smooth.fmt.name == "float64"
    got = quant_flash(q, k, v, plan=only, block_m=32, block_n=32)
    mu = np.stack([q64[lo : lo + 32].sum(0) / q64[lo : lo + 32].shape[0] for lo in range(0, 70, 32)])
    ks = k64 - k64.sum(0) / 70  # k_smooth, float64 in the isolated plan: delta_s is taken on the smoothed keys
    ds = matmul(mu, ks.T, acc=Sequential("float32"))
    s = ((q64 - np.repeat(mu, 32, axis=0)[:70]) @ ks.T + np.repeat(ds, 32, axis=0)[:70]) / 4.0
    p = np.exp(s - s.max(-1, keepdims=True))
    assert np.abs(got - (p / p.sum(-1, keepdims=True)) @ v).max() < 1e-13
    with pytest.raises(ValueError, match="block"):
        smooth_queries(q, "float32", 0)
    with pytest.raises(ValueError, match="seq_q"):
        smooth_queries(np.zeros((0, 4)), "float32", 4)


def test_q_smoothing_isolate_ablate_trace_and_errors():
    q, k, v = _inputs(66, 16, seed=37)
    q = q + np.float32(4.0)
    sage = quant_plan("sage2-int8-fp8-qsmooth")
    assert sage.ablate("q_smooth").q_smooth.fmt.name == "float64" and sage.ablate("q_delta").q_delta == EXACT
    assert sage.exact().q_delta == EXACT and quant_plan("sage2-int8-fp8").exact().q_smooth is None
    assert quant_plan("sage2-int8-fp8").ablate("q_delta").q_delta is None
    assert quant_plan("sage2-int8-fp8").replace(q_smooth="float32").q_delta == Sequential("float32")  # default
    for name in ("sage2-int8-fp8-qsmooth", "sage3-fp4-qsmooth"):
        tr = Tracer()
        pl = quant_plan(name)
        a = quant_flash(q, k, v, plan=pl, trace=tr, block_m=32, block_n=32, causal=True)
        assert np.array_equal(a, quant_flash(q, k, v, plan=pl, block_m=32, block_n=32, causal=True))
        ops = tr.by_op().reset_index()
        rms = dict(zip(ops["op"].astype(str), ops["rms"], strict=True))
        assert rms["q_smooth"] > 0 and rms["q_delta"] > 0, name
    with pytest.raises(ValueError, match="q_delta is the correction"):
        sage.replace(q_smooth=None)
    with pytest.raises(ValueError, match="folded"):
        quant_plan("fp8-e4m3").replace(q_smooth="float32")
    with pytest.raises(ValueError, match="block-scaled"):
        sage.replace(q_delta=tensor_core("sm120", "e2m1", kind="nvf4"))
    with pytest.raises(TypeError, match="q_smooth"):
        sage.replace(q_smooth=3)


def test_sage_plan_errors():
    e4m3 = "float8_e4m3fn"
    with pytest.raises(ValueError, match="group"):
        Quant("int", "per-warp")
    with pytest.raises(ValueError, match="per-warp"):
        Quant("int", "per-block", group=4)
    sage = quant_plan("sage2-int8-fp8")
    with pytest.raises(ValueError, match="fixed-scale float"):
        sage.replace(pv_update="scaled", v_quant=Quant("float", "per-block", fmt=e4m3))
    with pytest.raises(ValueError, match="consistent"):
        sage.replace(row_sum="consistent")
    with pytest.raises(ValueError, match="per-warp"):
        sage.replace(score_scaling="folded")
    with pytest.raises(ValueError, match="two_level"):
        sage.replace(v_quant=Quant("float", "per-block", fmt=e4m3))
    with pytest.raises(TypeError, match="k_smooth"):
        sage.replace(k_smooth=3)


# --- one Plan type, one preset table -----------------------------------------------------------------------


def test_flash_runs_plans_with_quantizers_as_quant_flash():
    q, k, v = _inputs(24, 16, seed=31)
    for name in ("int8-reference", "fp8-e4m3-block"):
        want = quant_flash(q, k, v, plan=name, block_m=16, block_n=8, causal=True, return_stats=True)
        got = flash(q, k, v, plan=plan(name), block_m=16, block_n=8, causal=True, return_stats=True)
        for x, y in zip(want, got, strict=True):
            assert np.array_equal(x.view(np.uint64), y.view(np.uint64))
    # the layout of the call: (seq, heads, d) in and out, stats per (heads, seq)
    q3, k3, v3 = (np.stack([a, a[::-1]], axis=0) for a in (q, k, v))
    want = quant_flash(q3, k3, v3, plan="int8-reference", return_stats=True)
    got = flash(*(np.swapaxes(a, 0, 1) for a in (q3, k3, v3)), plan="int8-reference", layout="bshd", return_stats=True)
    assert np.array_equal(np.swapaxes(got[0], 0, 1), want[0]) and np.array_equal(got[1], want[1])


def test_quant_plan_is_a_plan_and_the_old_names_are_aliases():
    ref = plan("int8-reference")
    assert ref.quantized and ref.kernel == "flash" and ref.kernels() == ("flash",)
    assert not plan("triton-bf16").quantized and plan("pytorch-bf16").kernel == "baseline"
    assert quant_plan("fp64") is plan("quant-fp64") and plan("fp64").q_quant is None  # the float golden
    with pytest.warns(DeprecationWarning, match="QuantPlan is deprecated"):
        old = QuantPlan("x", ref.q_quant, ref.k_quant, ref.v_quant, ref.p_quant, EXACT, EXACT)
    assert old == dataclasses.replace(ref, name="x")
    with pytest.raises(ValueError, match="no quantizers"):
        plan("triton-bf16").isolate("qk")
    with pytest.raises(ValueError, match="quant_params"):
        ref.params(0.125)


def test_plan_fields_of_the_quantized_dataflow_are_checked():
    with pytest.raises(ValueError, match="belong to plans with quantizers"):
        plan("triton-fp16").replace(pv_update="into_acc")
    with pytest.raises(ValueError, match="unknown plan entries"):
        plan("int8-reference").replace(name="x", p="float16")  # not an op of the quantized dataflow
    with pytest.raises(ValueError, match="do not model it"):
        dataclasses.replace(plan("int8-reference"), normalization="per_step")
    with pytest.raises(ValueError, match="kernel must be one of"):
        dataclasses.replace(plan("fp64"), kernel="decode")
    with pytest.raises(ValueError, match="never uses"):
        plan("pytorch-bf16").replace(q_quant=Quant("int", "per-token"))
    # quantizers given to a flash plan make it a plan with quantizers
    fp16 = plan("triton-fp16").replace(
        name="t", q_quant=Quant("float", fmt="float16"), k_quant=Quant("float", fmt="float16"),
        v_quant=Quant("float", fmt="float16"), p_quant=Quant("float", fmt="float16"), out="float16",
        score_scaling="folded", pv_update="into_acc",
    )  # fmt: skip
    assert fp16.quantized and fp16.quant_params(0.25) == plan("fp16-flash").quant_params(0.25)


def test_attribute_refuses_plans_with_quantizers():
    from simfloat.attribution import attribute

    q, k, v = _inputs(8, 16, seed=3)
    with pytest.raises(ValueError, match="has quantizers"):
        attribute(q[None], k[None], v[None], plan="int8-reference")
