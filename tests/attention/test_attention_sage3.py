"""SageAttention3-style FP4 plans (``sage3-fp4``): the NVFP4 quantizers against simfloat.quantize_block, P's
two-level quantizer against a numpy oracle, the whole dataflow against an independent numpy/matmul_scaled
oracle on one key tile, isolation / ablation / tracing of every quantizer, the engine choice (the vector engine
by default, the reference when tracing; tests/attention/test_engine_quant.py compares them bit for bit), odd
lengths, and the error against float64 attention next to Sage2's."""

import math

import numpy as np
import pytest

from simfloat import quantize_block
from simfloat.accumulate import matmul_scaled, tensor_core
from simfloat.attention import QUANTIZERS, Quant, quant_flash, quant_plan, quantize, smooth_keys
from simfloat.attention import _quant_kernels as QK
from simfloat.trace import Tracer

LOG2E = math.log2(math.e)
NV = {"elem_fmt": "float4_e2m1fn", "block": 16, "scale_fmt": "ue4m3", "scale_rounding": "nearest"}
FP4 = tensor_core("sm120", "e2m1", kind="nvf4")


def _inputs(n, d, seed=0, nk=None):
    rng = np.random.default_rng(seed)
    nk = n if nk is None else nk
    q = rng.standard_normal((n, d)).astype(np.float16).astype(np.float32)
    k = rng.standard_normal((nk, d)).astype(np.float16).astype(np.float32)
    v = rng.standard_normal((nk, d)).astype(np.float16).astype(np.float32)
    return q, k, v


def _attn64(q, k, v, causal=False):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = (q @ k.T) / math.sqrt(q.shape[-1])
    if causal:
        s[np.triu_indices(s.shape[0], 1, s.shape[1])] = -np.inf
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def _rel(o, ref):
    return float(np.abs(o - ref).sum() / np.abs(ref).sum())


def _hard(n, d, seed):
    """Rows with zeros, an all-zero block, outliers and a tiny block (ue4m3 subnormal scales)."""
    x = np.random.default_rng(seed).standard_normal((2, n, d))
    x[0, 3] = 0.0
    x[1, 5, :16] = 0.0
    x[0, 7, 3] = 900.0
    x[1, 9, 16:32] *= 1e-3
    return x.astype(np.float32)


def test_q_k_v_quantizers_equal_quantize_block_nvfp4():
    x = _hard(97, 48, seed=1)
    for name, g in (("sage3-fp4", None), ("sage3-fp4-tensorscale", "auto")):
        pl = quant_plan(name)
        for op, axis in (("q_quant", -1), ("k_quant", -1), ("v_quant", -2)):
            codes, sc = quantize(x, getattr(pl, op), axis=axis)
            for lead in range(2):
                bq = quantize_block(x[lead], axis=axis, global_scale=g, **NV)
                assert np.array_equal(codes[lead], bq.codes), (name, op)
                assert np.array_equal(sc[lead], bq.expanded_scales() * bq.global_scale), (name, op)
            assert np.abs(codes).max() == 6.0 and set(np.unique(np.abs(codes))) <= {0, 0.5, 1, 1.5, 2, 3, 4, 6}


def _np_two_level(p, qmax=448.0 * 6):
    """Independent numpy oracle of SageAttention3's P quantizer on rows p: the fp32 row scale and quotient
    (a float64 division rounded to float32 is the correctly rounded float32 quotient, as 53 >= 2 * 24 + 2),
    then NVFP4 of the quotient by quantize_block."""
    amax = p.max(axis=-1, keepdims=True)
    s1 = np.where(amax == 0, 1.0, amax / qmax).astype(np.float32).astype(np.float64)
    t = (p / s1).astype(np.float32).astype(np.float64)
    bq = quantize_block(t, **NV)
    return bq.codes, bq.expanded_scales(), s1


def test_p_two_level_quantizer_kernel_equals_numpy_and_quantize():
    rng = np.random.default_rng(2)
    p = np.exp2(-rng.exponential(4.0, (6, 80))).astype(np.float32).astype(np.float64)
    p[1] = 0.0  # an all-zero row: s1 = 1, zero codes
    p[2, 16:32] = 0.0  # an all-zero block
    p[3] *= 1e-30  # far below the ue4m3 range without the first level
    pl = quant_plan("sage3-fp4")
    pp = pl.quant_params(1.0)
    codes, sc, s1 = _np_two_level(p)
    got_c, got_s = quantize(p, pl.p_quant)
    assert np.array_equal(got_c, codes) and np.array_equal(got_s, sc * s1)
    for r in range(p.shape[0]):
        for n in (80, 37):  # a whole tile, and the visible keys of a partial (causal / last) tile
            c, s = np.empty(96), np.empty(96)
            row = np.zeros(80)
            row[:n] = p[r, :n]
            want_c, want_s, want_1 = _np_two_level(row[None])
            got1 = QK.block_p_codes(p[r].copy(), n, c, s, pp)
            assert got1 == want_1[0, 0]
            assert np.array_equal(c[:80], want_c[0]) and not c[80:].any()
            assert np.array_equal(s[:80], want_s[0])
    # the first level is what keeps small rows: one level (block scales only) loses row 3 entirely
    one = quant_plan("sage3-fp4-onelevel").p_quant
    c1, _ = quantize(p, one)
    assert not c1[3].any() and codes[3].any()
    assert np.array_equal(c1[0], quantize_block(p[0], **NV).codes)


def _oracle(q, k, v, qk_model=None):
    """sage3-fp4-fp64 (quantizers, all else float64) on one key tile, from quantize_block / matmul_scaled and
    numpy: smoothed K, NVFP4 Q/K/V, scores (exact, or the block-scaled MMA model), exp2 softmax, P two-level."""
    ks, _ = smooth_keys(k[None], "float32")
    qb = quantize_block(q, **NV)
    kb = quantize_block(ks[0], **NV)
    vb = quantize_block(v, axis=0, **NV)
    if qk_model is None:
        s = qb.dequantize() @ kb.dequantize().T
    else:
        s = matmul_scaled(qb.codes, kb.codes.T, qb.scales, kb.scales.T, acc=qk_model, engine="reference")
    x = s * (LOG2E / math.sqrt(q.shape[-1]))
    p = np.exp2(x - x.max(-1, keepdims=True))
    nk = k.shape[0]
    pad = -nk % 16
    pc, psc, s1 = _np_two_level(np.pad(p, ((0, 0), (0, pad))))
    pv = (pc * psc)[:, :nk] @ vb.dequantize() * s1
    return pv / p.sum(-1, keepdims=True)


def test_dataflow_equals_an_independent_oracle_on_one_key_tile():
    """fp32 arithmetic would round the first level's division exactly as the oracle does; float64 elsewhere."""
    q, k, v = _inputs(37, 32, seed=3, nk=45)
    k = k + np.float32(2.0)
    fp64 = quant_plan("sage3-fp4-fp64")
    got = quant_flash(q, k, v, plan=fp64, block_m=16, block_n=64)
    assert np.abs(got - _oracle(q, k, v)).max() < 1e-13
    mma = fp64.replace(qk=FP4)  # the nvf4 MMA on the codes and block scales of Q and K
    got = quant_flash(q, k, v, plan=mma, block_m=16, block_n=64)
    assert np.abs(got - _oracle(q, k, v, qk_model=FP4)).max() < 1e-13


def test_fixed_p_shift_equals_an_oracle_on_one_key_tile():
    """The released kernel's P (sage3-fp4-fixedp): ``t = exp2(x - (m - log2(448 * 6)))``, NVFP4 of t per 16
    keys, P.V and the row sum on t (the factor 448 * 6 cancels in acc / l); float64 arithmetic elsewhere. And
    the quantizer on its own: codes of fp32(p * 2688), scales over 2688."""
    q, k, v = _inputs(37, 32, seed=5, nk=45)
    got = quant_flash(q, k, v, plan="sage3-fp4-fixedp-fp64", block_m=16, block_n=64)
    ks, _ = smooth_keys(k[None], "float32")
    qb, kb = quantize_block(q, **NV), quantize_block(ks[0], **NV)
    vb = quantize_block(v, axis=0, **NV)
    x = (qb.dequantize() @ kb.dequantize().T) * (LOG2E / math.sqrt(q.shape[-1]))
    t = np.exp2(x - (x.max(-1, keepdims=True) - math.log2(448.0 * 6)))
    tb = quantize_block(np.pad(t, ((0, 0), (0, 3))), **NV)
    want = (tb.codes * tb.expanded_scales())[:, :45] @ vb.dequantize() / t.sum(-1, keepdims=True)
    assert np.abs(got - want).max() < 1e-13
    assert 0.9 < t.max() / 2688 <= 1.0 + 1e-12  # the row max lands on qmax
    p = np.exp2(-np.random.default_rng(6).exponential(4.0, (3, 48)))
    codes, sc = quantize(p, quant_plan("sage3-fp4-fixedp").p_quant)
    bq = quantize_block((p * 2688).astype(np.float32).astype(np.float64), **NV)
    assert np.array_equal(codes, bq.codes) and np.array_equal(sc, bq.expanded_scales() / 2688)


def test_engine_choice():
    """engine=None runs the vector engine (the same bits as the reference), or the reference when tracing."""
    q, k, v = _inputs(97, 32, seed=4)
    a = quant_flash(q, k, v, plan="sage3-fp4", block_m=32, block_n=32, return_stats=True)
    b = quant_flash(q, k, v, plan="sage3-fp4", block_m=32, block_n=32, return_stats=True, engine="reference")
    assert all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a, b, strict=True))
    with pytest.raises(ValueError, match="reference engine"):
        quant_flash(q, k, v, plan="sage3-fp4", engine="vector", trace=Tracer())
    with pytest.raises(ValueError, match="multiple of the pv MMA's scale block 16"):
        quant_flash(q, k, v, plan="sage3-fp4", block_n=24)


def test_isolate_ablate_and_trace_cover_every_quantizer():
    q, k, v = _inputs(66, 32, seed=5)
    sage3 = quant_plan("sage3-fp4")
    ref = _attn64(q, k, v)
    full = _rel(quant_flash(q, k, v, plan=sage3, block_m=32, block_n=32), ref)
    for op in ("k_smooth", *QUANTIZERS):
        no = sage3.ablate(op)
        assert getattr(no, op) != getattr(sage3, op)
        e_no = _rel(quant_flash(q, k, v, plan=no, block_m=32, block_n=32), ref)
        e_only = _rel(quant_flash(q, k, v, plan=sage3.isolate(op), block_m=32, block_n=32), ref)
        assert 0 < e_only < full, op
        if op != "k_smooth":
            assert e_no < full, op
    # a quantizer that feeds the FP4 MMA takes the MMA with it; the MMA cannot be isolated from its operands
    assert sage3.ablate("q_quant").qk == sage3.ablate("qk").qk and sage3.ablate("q_quant").pv == sage3.pv
    assert sage3.ablate("v_quant").pv == sage3.ablate("pv").pv and sage3.ablate("v_quant").qk == sage3.qk
    with pytest.raises(ValueError, match="block-scaled MMA"):
        sage3.isolate("qk")
    tr = Tracer()
    a = quant_flash(q, k, v, plan=sage3, trace=tr, block_m=32, block_n=32, causal=True)
    assert np.array_equal(a, quant_flash(q, k, v, plan=sage3, block_m=32, block_n=32, causal=True))
    ops = tr.by_op().reset_index()
    rms = dict(zip(ops["op"].astype(str), ops["rms"], strict=True))
    for op in ("k_smooth", *QUANTIZERS, "pv_dequant"):
        assert rms[op] > 0, op


@pytest.mark.parametrize("causal", [False, True])
def test_odd_lengths_and_tiles(causal):
    """seq 97 (and seq_q != seq_k): the tiles do not change a row's bits when one key tile holds them all."""
    q, k, v = _inputs(97, 16, seed=6)
    ref = _attn64(q, k, v, causal=causal)
    one = quant_flash(q, k, v, plan="sage3-fp4", block_m=32, block_n=128, causal=causal)
    assert np.array_equal(one, quant_flash(q, k, v, plan="sage3-fp4", block_m=64, block_n=112, causal=causal))
    tiled = quant_flash(q, k, v, plan="sage3-fp4", block_m=16, block_n=32, causal=causal)
    assert _rel(tiled, ref) < 0.5 and _rel(one, ref) < 0.5
    o = quant_flash(q[:33], k, v, plan="sage3-fp4", block_m=16, block_n=16, causal=causal)
    assert o.shape == (33, 16) and np.isfinite(o).all()


def test_error_against_float64_and_sage2():
    """N(0,1), seq 256, head dim 64: FP4 Q/K/V/P give a few percent of relative L1 error, above Sage2's
    INT8/FP8 on the same inputs; here (spread scores: small P blocks) SageAttention3's two-level P does no worse
    than P with block scales alone (on U[0,1) inputs it is slightly worse: docs/results/fp8-long-context.md)."""
    q, k, v = _inputs(64, 64, seed=7, nk=256)
    ref = _attn64(q, k, v)
    e3 = _rel(quant_flash(q, k, v, plan="sage3-fp4", block_m=64, block_n=64), ref)
    e2 = _rel(quant_flash(q, k, v, plan="sage2-int8-fp8", block_m=64, block_n=64), ref)
    e1 = _rel(quant_flash(q, k, v, plan="sage3-fp4-onelevel", block_m=64, block_n=64), ref)
    assert 0.02 < e3 < 0.5 and e2 < e3 / 2, (e3, e2)
    assert e3 <= e1, (e3, e1)


def test_block_plan_errors():
    sage3 = quant_plan("sage3-fp4")
    with pytest.raises(ValueError, match="granularity"):
        Quant("block", "per-block", fmt="nvfp4")
    with pytest.raises(TypeError, match="BlockFormat"):
        Quant("block", "unscaled", fmt=3)
    with pytest.raises(ValueError, match="unknown block format"):
        Quant("block", "unscaled", fmt="nvfp5")
    with pytest.raises(ValueError, match="per-token"):
        sage3.replace(q_quant=Quant("block", "per-token", fmt="nvfp4"))
    with pytest.raises(ValueError, match="two_level"):
        sage3.replace(pv_update="separate")
    with pytest.raises(ValueError, match="block-scaled MMA"):
        sage3.replace(k_quant=Quant("block", "unscaled", fmt="mxfp4"))  # blocks of 32 into an nvf4 MMA
    with pytest.raises(ValueError, match="block-scaled MMA"):
        sage3.replace(v_quant=Quant("float", "per-channel", fmt="float8_e4m3fn"))
    with pytest.raises(ValueError, match="reference"):
        sage3.replace(row_sum="consistent")
    assert str(sage3.p_quant) == "nvfp4/per-token[2688]/float32"
