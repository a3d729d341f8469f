"""simfloat_gpu/kernels/int8_attention.py under the stock Triton interpreter: the quantization kernels bit for bit
against
torch, the attention kernel against a pure-torch step-by-step model of the same scheme, and an accuracy
sanity check against float64 attention."""

import math
import os

# @triton.jit picks the interpreter when simfloat_gpu.kernels.int8_attention is imported: set this first.
os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from simfloat_gpu.kernels.int8_attention import (  # noqa: E402
    LOG2E,
    int8_attention,
    int8_attention_quantized,
    quantize_per_tensor,
    quantize_per_token,
)

pytestmark = pytest.mark.triton


def _inputs(batch, heads, seq_q, seq_k, head_dim, dtype=torch.float16, seed=0, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, seq_q, head_dim, generator=g) * spread
    k = torch.randn(batch, heads, seq_k, head_dim, generator=g)
    v = torch.randn(batch, heads, seq_k, head_dim, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


# ----------------------------------------------------------------------------------------------------
# torch references
# ----------------------------------------------------------------------------------------------------


def _ref_quantize(x, dims):
    """Q1..Q6 of the module docstring in torch (correctly rounded fp32 division, torch.round)."""
    x32 = x.float()
    amax = x32.abs().amax(dim=dims)
    scale = torch.where(amax == 0, torch.ones_like(amax), amax / 127)
    shape = scale.shape + (1,) * len(dims)
    return torch.round(x32 / scale.reshape(shape)).clamp(-127, 127).to(torch.int8), scale


def _fma32(a, b, c):
    """fp32 fma via float64: the product is exact there, the sum rounds (double rounding is harmless
    for these tolerance-based comparisons)."""
    return (a.double() * b.double() + c.double()).float()


def _ref_int8_attention(q8, qs, k8, ks, v, vs, *, causal, block_n, row_sum, sm_scale):
    """Steps T2..E2 of simfloat_gpu/kernels/int8_attention.py in torch, one key tile at a time, all rows at once.

    Key tiles a row cannot see are exact no-ops in the kernel, so every row walks every tile here."""
    full = v.dtype == torch.int8
    qk_scale = torch.tensor(float(np.float32(sm_scale) * np.float32(LOG2E)), dtype=torch.float32)
    batch, heads, seq_q, head_dim = q8.shape
    seq_k = k8.shape[2]
    m = torch.full((batch, heads, seq_q), float("-inf"))
    l = torch.zeros(batch, heads, seq_q)  # noqa: E741
    acc = torch.zeros(batch, heads, seq_q, head_dim)
    rows = torch.arange(seq_q)[:, None]
    for n0 in range(0, seq_k, block_n):
        n1 = min(n0 + block_n, seq_k)
        s = (q8.long() @ k8[:, :, n0:n1].long().transpose(-1, -2)).float()  # T2, T3 (exact)
        s = s * qs[..., None]  # T4
        s = s * ks[:, :, None, n0:n1]  # T5
        if causal:
            s = s.masked_fill(torch.arange(n0, n1)[None, :] > rows, float("-inf"))  # T6
        m_new = torch.maximum(m, s.amax(dim=-1) * qk_scale)  # T7
        m_sub = torch.where(m_new == float("-inf"), 0.0, m_new)  # T8
        s = _fma32(s, qk_scale, -m_sub[..., None])  # T9
        p = torch.exp2(s)  # T10
        alpha = torch.exp2(m - m_sub)  # T11
        p16 = p.half()  # T12
        if full:
            p8 = (p16.double() * 127 + 0.5).half().to(torch.int8)  # T13 (exact in double, one rn), T14
            l_ij = p.sum(-1) if row_sum == "reference" else p8.long().sum(-1).float() / 127  # T15
            l = _fma32(l, alpha, l_ij)  # noqa: E741  T16
            pv = (p8.long() @ v[:, :, n0:n1].long()).float()  # T17
            pv = (pv * vs[..., None, None]) / 127  # T18
            acc = _fma32(acc, alpha[..., None], pv)  # T19
        else:
            l_ij = p.sum(-1) if row_sum == "reference" else p16.float().sum(-1)
            l = _fma32(l, alpha, l_ij)  # noqa: E741
            acc = acc * alpha[..., None]
            acc = acc + p16.float() @ v[:, :, n0:n1].float()
        m = m_new
    out = acc / torch.where(l == 0, 1.0, l)[..., None]  # E1
    return out.half(), m, l


def _reference64(q, k, v, causal, sm_scale=None):
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    s = q.double() @ k.double().transpose(-1, -2)
    if causal:
        s = s.masked_fill(torch.arange(k.shape[2])[None, :] > torch.arange(q.shape[2])[:, None], float("-inf"))
    return torch.softmax(sm_scale * s, dim=-1) @ v.double()


# ----------------------------------------------------------------------------------------------------
# quantization kernels: bit for bit
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(2, 3, 97, 64), (5, 7, 48), (33,)], ids=["4d", "3d-d48", "1d"])
def test_quantize_per_token_is_bitwise_torch(dtype, shape):
    g = torch.Generator().manual_seed(10)
    x = (torch.randn(shape, generator=g) * torch.exp2(torch.randint(-6, 6, shape[:-1] + (1,), generator=g).float())).to(
        dtype
    )
    xq, scale = quantize_per_token(x)
    rq, rscale = _ref_quantize(x, (-1,))
    assert xq.dtype == torch.int8 and xq.shape == x.shape
    assert scale.dtype == torch.float32 and scale.shape == x.shape[:-1]
    assert torch.equal(scale, rscale)
    assert torch.equal(xq, rq)
    assert int(xq.min()) >= -127  # symmetric: -128 never produced


def test_quantize_per_token_ties_round_half_to_even_and_zero_rows():
    # row max 127 -> scale exactly 1, so the quotients are the values themselves
    row = torch.tensor([127.0, 0.5, 1.5, 2.5, -0.5, -2.5, 3.5, 126.5])
    x = torch.stack([row, torch.zeros(8), -row / 4]).reshape(1, 1, 3, 8)
    xq, scale = quantize_per_token(x)
    assert xq[0, 0, 0].tolist() == [127, 0, 2, 2, 0, -2, 4, 126]
    assert scale[0, 0].tolist()[:2] == [1.0, 1.0]  # zero row: scale defined as 1, values 0
    assert xq[0, 0, 1].tolist() == [0] * 8
    rq, rscale = _ref_quantize(x, (-1,))
    assert torch.equal(xq, rq) and torch.equal(scale, rscale)


def test_quantize_per_token_non_contiguous():
    q, _, _ = _inputs(2, 3, 40, 1, 32)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # same values, (b, s, h, d) storage
    assert not qt.is_contiguous()
    a, sa = quantize_per_token(q)
    b, sb = quantize_per_token(qt)
    assert torch.equal(a, b) and torch.equal(sa, sb)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_quantize_per_tensor_is_bitwise_torch(dtype):
    _, _, v = _inputs(2, 3, 1, 257, 64, dtype=dtype, seed=11)
    v = v * torch.tensor([1.0, 1e-3, 300.0], dtype=dtype)[None, :, None, None]
    v[1, 2] = 0  # an all-zero (batch, head)
    vq, scale = quantize_per_tensor(v)
    rq, rscale = _ref_quantize(v, (-2, -1))
    assert scale.shape == (2, 3) and vq.shape == v.shape
    assert torch.equal(scale, rscale)
    assert torch.equal(vq, rq)
    assert scale[1, 2] == 1.0 and not vq[1, 2].any()


# ----------------------------------------------------------------------------------------------------
# attention kernel vs the step-by-step torch model
# ----------------------------------------------------------------------------------------------------


# (variant, row_sum, causal, seq_q, seq_k, head_dim, block_m, block_n)
CASES = [
    ("int8", "reference", False, 97, 97, 64, 64, 64),
    ("int8", "reference", True, 257, 257, 32, 64, 32),
    ("int8", "consistent", False, 97, 257, 64, 32, 64),
    ("int8", "consistent", True, 97, 97, 32, 16, 32),
    ("int8", "reference", True, 257, 97, 64, 32, 64),
    ("half-int8", "reference", False, 257, 257, 32, 64, 64),
    ("half-int8", "reference", True, 97, 97, 64, 32, 32),
    ("half-int8", "consistent", True, 97, 130, 32, 64, 32),
]


def _model_matches(q, k, v, *, variant, row_sum, causal, block_m, block_n, sm_scale=None):
    out, m, l = int8_attention(  # noqa: E741
        q,
        k,
        v,
        variant=variant,
        row_sum=row_sum,
        causal=causal,
        block_m=block_m,
        block_n=block_n,
        sm_scale=sm_scale,
        return_stats=True,
    )
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    q8, qs = _ref_quantize(q, (-1,))
    k8, ks = _ref_quantize(k, (-1,))
    if variant == "int8":
        v8, vs = _ref_quantize(v, (-2, -1))
    else:
        v8, vs = v.half(), None
    r_out, r_m, r_l = _ref_int8_attention(
        q8, qs, k8, ks, v8, vs, causal=causal, block_n=block_n, row_sum=row_sum, sm_scale=sm_scale
    )
    assert out.dtype == torch.float16 and out.shape == q.shape
    assert torch.isfinite(out).all()
    # The maxima are exact functions of exact integer scores and two rn multiplies.
    assert torch.equal(m, r_m)
    # exp2 and the fp32 sums may differ by an ulp (stock interpreter: numpy; model: torch), which can move
    # a quantized P by one step (1/127) near a rounding boundary: all but a few outputs agree bit for bit
    # (observed: >= 99.97% equal, max difference 2.5e-4, i.e. one fp16 ulp).
    torch.testing.assert_close(l, r_l, rtol=1e-6, atol=0)
    torch.testing.assert_close(out.float(), r_out.float(), rtol=0, atol=1e-3)
    assert (out == r_out).double().mean() > 0.999
    return out


@pytest.mark.parametrize(
    "variant,row_sum,causal,seq_q,seq_k,head_dim,block_m,block_n",
    CASES,
    ids=[f"{c[0]}-{c[1]}-{'causal' if c[2] else 'full'}-{c[3]}x{c[4]}-d{c[5]}-b{c[6]}x{c[7]}" for c in CASES],
)
def test_matches_step_by_step_model(variant, row_sum, causal, seq_q, seq_k, head_dim, block_m, block_n):
    q, k, v = _inputs(1, 2, seq_q, seq_k, head_dim, seed=seq_q + seq_k)
    _model_matches(q, k, v, variant=variant, row_sum=row_sum, causal=causal, block_m=block_m, block_n=block_n)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_other_input_dtypes_and_sm_scale(dtype):
    q, k, v = _inputs(2, 1, 70, 70, 32, dtype=dtype, seed=5, spread=2.0)
    _model_matches(q, k, v, variant="int8", row_sum="reference", causal=True, block_m=32, block_n=32, sm_scale=0.3)


def test_prequantized_entry_point_is_the_same_kernel():
    q, k, v = _inputs(1, 2, 45, 70, 32, seed=6)
    q8, qs = quantize_per_token(q)
    k8, ks = quantize_per_token(k)
    v8, vs = quantize_per_tensor(v)
    for variant, vv, vvs in (("int8", v8, vs), ("half-int8", v, None)):
        a = int8_attention(q, k, v, variant=variant, causal=True, block_m=16, block_n=32)
        b = int8_attention_quantized(q8, qs, k8, ks, vv, vvs, causal=True, block_m=16, block_n=32)
        assert torch.equal(a, b)


def test_consistent_row_sum_is_exact_for_constant_v():
    """With V constant, numerator and denominator of the consistent row sum use the same quantized P, so
    the output is the constant; the reference row sum (from the unquantized P) is biased."""
    q, k, _ = _inputs(1, 2, 64, 200, 32, seed=7, spread=3.0)
    v = torch.full((1, 2, 200, 32), 0.75, dtype=torch.float16)
    cons = int8_attention(q, k, v, row_sum="consistent", block_m=32, block_n=64)
    ref = int8_attention(q, k, v, row_sum="reference", block_m=32, block_n=64)
    assert torch.equal(cons, torch.full_like(cons, 0.75))
    assert (ref.float() - 0.75).abs().max() > 1e-3


def test_zero_query_row_attends_uniformly():
    q, k, v = _inputs(1, 1, 16, 64, 32, seed=8)
    q[0, 0, 3] = 0
    out = int8_attention(q, k, v, variant="half-int8", block_m=16, block_n=32)
    # scores all exactly 0 -> p = 1 everywhere -> the mean of (fp16) v
    torch.testing.assert_close(out[0, 0, 3].float(), v[0, 0].float().mean(0), rtol=0, atol=1e-3)


def test_empty_query_sequence():
    q, k, v = _inputs(1, 2, 0, 5, 32)
    out, m, l = int8_attention(q, k, v, return_stats=True)  # noqa: E741
    assert out.shape == (1, 2, 0, 32) and m.shape == l.shape == (1, 2, 0)


# ----------------------------------------------------------------------------------------------------
# accuracy sanity vs float64 attention
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant,max_err,mean_err", [("int8", 4e-2, 4e-3), ("half-int8", 2.5e-2, 2e-3)])
@pytest.mark.parametrize("causal", [False, True])
def test_accuracy_vs_float64(variant, max_err, mean_err, causal):
    q, k, v = _inputs(1, 2, 257, 257, 64, seed=9)
    out = int8_attention(q, k, v, variant=variant, causal=causal)
    err = (out.double() - _reference64(q, k, v, causal)).abs()
    assert err.max() < max_err and err.mean() < mean_err


# ----------------------------------------------------------------------------------------------------
# bad inputs: each is rejected before any launch
# ----------------------------------------------------------------------------------------------------


def _bad_cases():
    q, k, v = _inputs(1, 2, 8, 8, 32)
    return [
        ("not_tensor", (q.numpy(), k, v), {}, TypeError, "q must be a torch.Tensor"),
        ("3d", (q[0], k, v), {}, ValueError, "q must be 4-D"),
        ("int_dtype", (q.int(), k.int(), v.int()), {}, TypeError, "q has dtype torch.int32"),
        ("fp64", (q.double(), k.double(), v.double()), {}, TypeError, "q has dtype torch.float64"),
        ("mixed_dtype", (q, k.float(), v), {}, TypeError, "k has dtype torch.float32"),
        ("meta_device", (q.to("meta"), k.to("meta"), v.to("meta")), {}, ValueError, "needs CUDA tensors"),
        ("mixed_device", (q, k.to("meta"), v), {}, ValueError, "one device"),
        ("batch", (q, torch.cat([k, k]), torch.cat([v, v])), {}, ValueError, "batch and kv heads must agree"),
        ("kv_heads_k_v", (q, k, v[:, :1]), {}, ValueError, "batch and kv heads must agree"),
        (
            "kv_heads_3",
            (torch.cat([q, q[:, :1]], 1), k, v),
            {},
            ValueError,
            "q has 3 heads and k has 2: grouped-query attention needs",
        ),
        ("kv_heads_more", (q[:, :1], k, v), {}, ValueError, "q has 1 head and k has 2"),
        ("kv_seq", (q, k, v[:, :, :5]), {}, ValueError, "same sequence length"),
        ("head_dim_mismatch", (q, k, torch.cat([v, v], -1)), {}, ValueError, "head_dim must agree"),
        ("head_dim_16", (q[..., :16], k[..., :16], v[..., :16]), {}, ValueError, "power of two in [32, 256]"),
        ("head_dim_48", (q[..., :24].repeat(1, 1, 1, 2),) * 3, {}, ValueError, "power of two in [32, 256]"),
        ("no_keys", (q, k[:, :, :0], v[:, :, :0]), {}, ValueError, "at least one key"),
        ("block_m_48", (q, k, v), {"block_m": 48}, ValueError, "block_m must be a power of two"),
        ("block_n_16", (q, k, v), {"block_n": 16}, ValueError, "block_n must be a power of two in [32, 256]"),
        ("block_m_float", (q, k, v), {"block_m": 32.0}, TypeError, "block_m must be an int"),
        ("block_n_bool", (q, k, v), {"block_n": True}, TypeError, "block_n must be an int"),
        ("causal_str", (q, k, v), {"causal": "yes"}, TypeError, "causal must be a bool"),
        ("variant", (q, k, v), {"variant": "int4"}, ValueError, "variant must be one of"),
        ("variant_type", (q, k, v), {"variant": 8}, TypeError, "variant must be a str"),
        ("row_sum", (q, k, v), {"row_sum": "exact"}, ValueError, "row_sum must be one of"),
        ("sm_scale_zero", (q, k, v), {"sm_scale": 0.0}, ValueError, "sm_scale must be finite and > 0"),
        ("sm_scale_nan", (q, k, v), {"sm_scale": float("nan")}, ValueError, "sm_scale must be finite"),
        ("sm_scale_str", (q, k, v), {"sm_scale": "0.1"}, TypeError, "sm_scale must be a real number"),
        ("stats_str", (q, k, v), {"return_stats": "no"}, TypeError, "return_stats must be a bool"),
    ]


BAD = _bad_cases()


def _escape(match):
    return match.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")


@pytest.mark.parametrize("args,kwargs,exc,match", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_inputs_are_rejected(args, kwargs, exc, match):
    with pytest.raises(exc, match=_escape(match)):
        int8_attention(*args, **kwargs)


def _bad_quantized_cases():
    q, k, v = _inputs(1, 2, 8, 8, 32)
    q8, qs = _ref_quantize(q, (-1,))
    k8, ks = _ref_quantize(k, (-1,))
    v8, vs = _ref_quantize(v, (-2, -1))
    return [
        ("q_not_int8", (q, qs, k8, ks, v8, vs), TypeError, "q_int8 has dtype torch.float16"),
        ("scale_fp16", (q8, qs.half(), k8, ks, v8, vs), TypeError, "q_scale has dtype torch.float16"),
        ("scale_shape", (q8, qs, k8, ks[..., :4], v8, vs), ValueError, "k_scale must have shape"),
        ("v_scale_missing", (q8, qs, k8, ks, v8, None), TypeError, "int8 v needs v_scale"),
        ("v_scale_shape", (q8, qs, k8, ks, v8, vs[0]), ValueError, "v_scale must have shape"),
        ("v_scale_half", (q8, qs, k8, ks, v.half(), vs), ValueError, "v_scale must be None"),
        ("v_fp32", (q8, qs, k8, ks, v.float(), None), TypeError, "v has dtype torch.float32"),
    ]


BAD_Q = _bad_quantized_cases()


@pytest.mark.parametrize("args,exc,match", [c[1:] for c in BAD_Q], ids=[c[0] for c in BAD_Q])
def test_bad_quantized_inputs_are_rejected(args, exc, match):
    with pytest.raises(exc, match=_escape(match)):
        int8_attention_quantized(*args)


def test_bad_quantize_inputs_are_rejected():
    with pytest.raises(TypeError, match="x has dtype torch.int8"):
        quantize_per_token(torch.zeros(4, 4, dtype=torch.int8))
    with pytest.raises(ValueError, match="at least 2 dimension"):
        quantize_per_tensor(torch.zeros(4))
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        quantize_per_token(torch.zeros(4, 4, device="meta"))
