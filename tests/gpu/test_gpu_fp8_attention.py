"""simfloat_gpu/kernels/fp8_attention.py under the stock Triton interpreter.

The stock interpreter runs fp8 dots (it decodes the operands to fp16), but its fp32 -> fp8 casts are not
correctly rounded (tests/gpu/test_gpu_stock_interpreter.py). The step-by-step torch model below therefore
takes the fp8 rounding as a parameter: the interpreter's own cast (through a one-line Triton kernel) to
check the kernel's structure, and torch's correctly rounded cast (what a GPU does) to check the accuracy
of the scheme itself against float64 attention.
"""

import math
import os

# @triton.jit picks the interpreter when simfloat_gpu.kernels.fp8_attention is imported: set this first.
os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from simfloat_gpu.kernels.fp8_attention import FP8_FORMATS, LOG2E, fp8_attention, quantize_fp8  # noqa: E402

pytestmark = pytest.mark.triton


@triton.jit
def _cast_kernel(X, Y, n, BLOCK: tl.constexpr):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + r, tl.load(X + r, mask=r < n).to(Y.dtype.element_ty), mask=r < n)


def _triton_cast(x, dtype):
    """fp32 -> dtype with the running Triton's own conversion (the stock interpreter's, here)."""
    x = x.float().contiguous()
    y = torch.empty(x.shape, dtype=dtype)
    if x.numel():
        _cast_kernel[(triton.cdiv(x.numel(), 4096),)](x, y, x.numel(), BLOCK=4096)
    return y


def _torch_cast(x, dtype):
    return x.to(dtype)


def _inputs(batch, heads, seq_q, seq_k, head_dim, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, seq_q, head_dim, generator=g)
    k = torch.randn(batch, heads, seq_k, head_dim, generator=g)
    v = torch.randn(batch, heads, seq_k, head_dim, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


# ----------------------------------------------------------------------------------------------------
# torch references
# ----------------------------------------------------------------------------------------------------


def _ref_quantize(x, fmt, group, cast):
    """F1..F4: returns (fp8 values decoded to fp32, per-token scale (b, h, seq), per-group scale)."""
    dtype, fp8_max = FP8_FORMATS[fmt]
    b, h, s, d = x.shape
    group = s if group is None else group
    n = -(-s // group)
    x32 = x.float()
    pad = torch.zeros(b, h, n * group - s, d)
    amax = torch.cat([x32, pad], 2).abs().reshape(b, h, n, group * d).amax(-1)
    scale = torch.where(amax == 0, 1.0, amax / fp8_max)
    tok_scale = scale.repeat_interleave(group, dim=2)[:, :, :s]
    y = (x32 / tok_scale[..., None]).clamp(-fp8_max, fp8_max)
    return cast(y, dtype), tok_scale, scale


def _fma32(a, b, c):
    return (a.double() * b.double() + c.double()).float()


def _ref_fp8_attention(q, k, v, *, fmt, per_block, block_m, block_n, causal, sm_scale, cast):
    """Steps F1..E2 of simfloat_gpu/kernels/fp8_attention.py in torch, one key tile at a time, all rows at once."""
    dtype = FP8_FORMATS[fmt][0]
    q8, qs, _ = _ref_quantize(q, fmt, block_m if per_block else None, cast)
    k8, ks, _ = _ref_quantize(k, fmt, block_n if per_block else None, cast)
    v8, vs, _ = _ref_quantize(v, fmt, block_n if per_block else None, cast)
    q8, k8, v8 = q8.float(), k8.float(), v8.float()
    qk_scale = torch.tensor(float(np.float32(sm_scale) * np.float32(LOG2E)), dtype=torch.float32)
    batch, heads, seq_q, head_dim = q.shape
    seq_k = k.shape[2]
    qs_scale = qk_scale * qs  # K2, per row (constant over a BLOCK_M tile)
    m = torch.full((batch, heads, seq_q), float("-inf"))
    l = torch.zeros(batch, heads, seq_q)  # noqa: E741
    acc = torch.zeros(batch, heads, seq_q, head_dim)
    rows = torch.arange(seq_q)[:, None]
    for n0 in range(0, seq_k, block_n):
        n1 = min(n0 + block_n, seq_k)
        s_scale = (qs_scale * ks[:, :, n0 : n0 + 1])[..., None]  # T2
        s = q8 @ k8[:, :, n0:n1].transpose(-1, -2)  # T3
        if causal:
            s = s.masked_fill(torch.arange(n0, n1)[None, :] > rows, float("-inf"))  # T4
        m_new = torch.maximum(m, s.amax(-1) * s_scale[..., 0])  # T5
        m_sub = torch.where(m_new == float("-inf"), 0.0, m_new)  # T6
        s = _fma32(s, s_scale, -m_sub[..., None])  # T7
        p = torch.exp2(s)  # T8
        alpha = torch.exp2(m - m_sub)  # T9
        l = _fma32(l, alpha, p.sum(-1))  # noqa: E741
        acc = acc * alpha[..., None]
        pv = cast(p, dtype).float() @ v8[:, :, n0:n1]  # T10, T11
        if per_block:
            acc = _fma32(pv, vs[:, :, n0 : n0 + 1, None], acc)
        else:
            acc = acc + pv
        m = m_new
    if not per_block:
        acc = acc * vs[:, :, :1, None]  # E1
    out = acc / torch.where(l == 0, 1.0, l)[..., None]  # E2
    return out.half(), m, l


def _reference64(q, k, v, causal):
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.arange(k.shape[2])[None, :] > torch.arange(q.shape[2])[:, None], float("-inf"))
    return torch.softmax(s, dim=-1) @ v.double()


# ----------------------------------------------------------------------------------------------------
# quantization
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("group", [None, 32, 7], ids=["per-tensor", "block32", "block7"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_quantize_scales_bitwise_and_values_are_the_cast_of_the_quotient(fmt, group, dtype):
    q, _, _ = _inputs(2, 2, 97, 1, 32, dtype=dtype, seed=1)
    q[1, 1, :40] = 0  # a zero block (and not a zero tensor)
    x8, scale = quantize_fp8(q, fmt=fmt, group=group)
    ref8, _, rscale = _ref_quantize(q, fmt, group, _triton_cast)
    assert x8.dtype == FP8_FORMATS[fmt][0] and x8.shape == q.shape
    assert scale.dtype == torch.float32 and torch.equal(scale, rscale)
    assert torch.equal(x8.view(torch.uint8), ref8.view(torch.uint8))
    if group == 32:
        assert scale[1, 1, 0] == 1.0  # all-zero block: scale 1, values 0


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_quantize_exactly_representable_input_is_bitwise_torch(fmt):
    """amax = FP8_MAX * 2**-3 makes the scale 2**-3 and every quotient an fp8 value: no rounding at all,
    so even the stock interpreter agrees with torch bit for bit."""
    dtype, fp8_max = FP8_FORMATS[fmt]
    g = torch.Generator().manual_seed(2)
    codes = torch.randint(0, 256, (1, 2, 40, 32), generator=g, dtype=torch.uint8).view(dtype).float()
    codes = torch.where(codes.isfinite(), codes, 0.0).clamp(-fp8_max, fp8_max)
    codes[..., 0, 0] = fp8_max
    x = codes * 0.125
    x8, scale = quantize_fp8(x, fmt=fmt, kmajor=True)
    assert torch.all(scale == 0.125)
    assert torch.equal(x8.contiguous().view(torch.uint8), codes.to(dtype).view(torch.uint8))


# ----------------------------------------------------------------------------------------------------
# attention kernel vs the step-by-step torch model (with the interpreter's own fp8 casts)
# ----------------------------------------------------------------------------------------------------


# (fmt, scaling, causal, seq_q, seq_k, head_dim, block_m, block_n)
CASES = [
    ("e4m3", "per-tensor", False, 97, 97, 64, 64, 64),
    ("e4m3", "per-tensor", True, 257, 257, 32, 64, 32),
    ("e4m3", "per-block", False, 97, 257, 32, 32, 64),
    ("e4m3", "per-block", True, 257, 97, 64, 32, 32),
    ("e5m2", "per-tensor", True, 97, 130, 32, 16, 32),
    ("e5m2", "per-block", False, 97, 97, 64, 64, 32),
]


@pytest.mark.parametrize(
    "fmt,scaling,causal,seq_q,seq_k,head_dim,block_m,block_n",
    CASES,
    ids=[f"{c[0]}-{c[1]}-{'causal' if c[2] else 'full'}-{c[3]}x{c[4]}-d{c[5]}-b{c[6]}x{c[7]}" for c in CASES],
)
def test_matches_step_by_step_model(fmt, scaling, causal, seq_q, seq_k, head_dim, block_m, block_n):
    q, k, v = _inputs(1, 2, seq_q, seq_k, head_dim, seed=seq_q + seq_k)
    out, m, l = fp8_attention(  # noqa: E741
        q,
        k,
        v,
        fmt=fmt,
        scaling=scaling,
        causal=causal,
        block_m=block_m,
        block_n=block_n,
        return_stats=True,
    )
    r_out, r_m, r_l = _ref_fp8_attention(
        q,
        k,
        v,
        fmt=fmt,
        per_block=scaling == "per-block",
        block_m=block_m,
        block_n=block_n,
        causal=causal,
        sm_scale=1 / math.sqrt(head_dim),
        cast=_triton_cast,
    )
    assert out.dtype == torch.float16 and out.shape == q.shape and torch.isfinite(out).all()
    # fp32 matmul / sum orders and exp2 differ by ulps (numpy vs torch); an ulp can move a P across an
    # fp8 rounding boundary (e4m3: 1/16 relative), so the comparison is close, not bitwise.
    torch.testing.assert_close(m, r_m, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(l, r_l, rtol=1e-5, atol=0)
    torch.testing.assert_close(out.float(), r_out.float(), rtol=0, atol=2e-3)
    assert (out == r_out).double().mean() > 0.99


# ----------------------------------------------------------------------------------------------------
# accuracy sanity vs float64 attention
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt,max_err,mean_err", [("e4m3", 0.25, 0.01), ("e5m2", 0.6, 0.02)])
@pytest.mark.parametrize("scaling", ["per-tensor", "per-block"])
def test_scheme_accuracy_with_correct_rounding(fmt, max_err, mean_err, scaling):
    """The scheme itself (torch model with correctly rounded fp8 casts, as on a GPU) vs float64. Causal: the
    first rows average few values of V, so their error is V's own fp8 rounding (e4m3: 2**-4 relative)."""
    q, k, v = _inputs(1, 2, 257, 257, 64, seed=3)
    out, _, _ = _ref_fp8_attention(
        q,
        k,
        v,
        fmt=fmt,
        per_block=scaling == "per-block",
        block_m=64,
        block_n=64,
        causal=True,
        sm_scale=1 / 8,
        cast=_torch_cast,
    )
    err = (out.double() - _reference64(q, k, v, True)).abs()
    assert err.max() < max_err and err.mean() < mean_err


@pytest.mark.parametrize("fmt,max_err,mean_err", [("e4m3", 0.3, 0.025), ("e5m2", 0.6, 0.045)])
def test_kernel_accuracy_under_stock_interpreter(fmt, max_err, mean_err):
    """Looser than the scheme's own accuracy: the stock interpreter's fp8 casts lose precision (its mean
    error is ~2.5x that of correctly rounded casts on these inputs)."""
    q, k, v = _inputs(1, 2, 130, 130, 64, seed=4)
    out = fp8_attention(q, k, v, fmt=fmt, causal=False)
    err = (out.double() - _reference64(q, k, v, False)).abs()
    assert err.max() < max_err and err.mean() < mean_err


# ----------------------------------------------------------------------------------------------------
# bad inputs
# ----------------------------------------------------------------------------------------------------


def _bad_cases():
    q, k, v = _inputs(1, 2, 8, 8, 32)
    return [
        ("not_tensor", (q.numpy(), k, v), {}, TypeError, "q must be a torch.Tensor"),
        ("3d", (q[0], k, v), {}, ValueError, "q must be 4-D"),
        ("fp64", (q.double(), k.double(), v.double()), {}, TypeError, "q has dtype torch.float64"),
        ("mixed_dtype", (q, k.float(), v), {}, TypeError, "k has dtype torch.float32"),
        ("meta_device", (q.to("meta"), k.to("meta"), v.to("meta")), {}, ValueError, "needs CUDA tensors"),
        ("kv_seq", (q, k, v[:, :, :5]), {}, ValueError, "same sequence length"),
        ("head_dim_16", (q[..., :16], k[..., :16], v[..., :16]), {}, ValueError, "power of two in [32, 256]"),
        ("no_keys", (q, k[:, :, :0], v[:, :, :0]), {}, ValueError, "at least one key"),
        ("block_n_16", (q, k, v), {"block_n": 16}, ValueError, "block_n must be a power of two in [32, 256]"),
        ("block_m_100", (q, k, v), {"block_m": 100}, ValueError, "block_m must be a power of two"),
        ("fmt", (q, k, v), {"fmt": "e3m4"}, ValueError, "fmt must be one of"),
        ("fmt_type", (q, k, v), {"fmt": torch.float8_e4m3fn}, TypeError, "fmt must be a str"),
        ("scaling", (q, k, v), {"scaling": "per-token"}, ValueError, "scaling must be one of"),
        ("causal_int", (q, k, v), {"causal": 1}, TypeError, "causal must be a bool"),
        ("sm_scale_neg", (q, k, v), {"sm_scale": -0.1}, ValueError, "sm_scale must be finite and > 0"),
    ]


BAD = _bad_cases()


@pytest.mark.parametrize("args,kwargs,exc,match", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_inputs_are_rejected(args, kwargs, exc, match):
    match = match.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
    with pytest.raises(exc, match=match):
        fp8_attention(*args, **kwargs)


def test_bad_quantize_inputs_are_rejected():
    q, _, _ = _inputs(1, 1, 8, 1, 32)
    with pytest.raises(ValueError, match="group must be >= 1"):
        quantize_fp8(q, group=0)
    with pytest.raises(TypeError, match="group must be None or an int"):
        quantize_fp8(q, group=2.0)
    with pytest.raises(ValueError, match="must be 4-D"):
        quantize_fp8(q[0])
