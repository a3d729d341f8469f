"""simfloat_gpu/kernels/flash_attention.py under the stock Triton interpreter, against a float64 reference."""

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

# @triton.jit picks the interpreter at decoration time, and triton.language decorates its own helpers
# (tl.sum, tl.max, ...) when triton is first imported: this must run before anything imports triton.
os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from simfloat_gpu.kernels.flash_attention import LOG2E, flash_attention  # noqa: E402

if type(triton.language.standard.sum).__name__ != "InterpretedFunction":
    raise RuntimeError(
        "triton was imported before TRITON_INTERPRET=1 was set (by an earlier test module or "
        "plugin); set it at the top of tests/conftest.py"
    )

pytestmark = pytest.mark.triton


def _inputs(batch, heads, seq_q, seq_k, head_dim, dtype, seed=0, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, seq_q, head_dim, generator=g) * spread
    k = torch.randn(batch, heads, seq_k, head_dim, generator=g)
    v = torch.randn(batch, heads, seq_k, head_dim, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _scores64(q, k, causal):
    """Raw scores q @ k^T in float64, -inf where top-left causal masking hides the key."""
    s = q.double() @ k.double().transpose(-1, -2)
    if causal:
        i = torch.arange(q.shape[2])[:, None]
        j = torch.arange(k.shape[2])[None, :]
        s = s.masked_fill(j > i, float("-inf"))
    return s


def _reference(q, k, v, causal, scale=None):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return torch.softmax(scale * _scores64(q, k, causal), dim=-1) @ v.double()


def _qk_scale(scale):
    return float(np.float32(scale) * np.float32(LOG2E))


# (dtype, causal, seq_q, seq_k, head_dim, block_m, block_n)
CASES = [
    (torch.float16, False, 97, 97, 32, 32, 32),
    (torch.float16, True, 97, 97, 32, 16, 32),
    (torch.float16, True, 257, 257, 16, 64, 64),
    (torch.float16, False, 97, 257, 64, 64, 16),
    (torch.float16, True, 257, 97, 32, 32, 64),
    (torch.float16, True, 33, 130, 32, 16, 16),
    (torch.float32, False, 97, 130, 32, 16, 16),
    (torch.float32, True, 257, 257, 16, 32, 16),
]


@pytest.mark.parametrize(
    "dtype,causal,seq_q,seq_k,head_dim,block_m,block_n",
    CASES,
    ids=[f"{str(c[0])[6:]}-{'causal' if c[1] else 'full'}-{c[2]}x{c[3]}-d{c[4]}-b{c[5]}x{c[6]}" for c in CASES],
)
def test_matches_float64_reference(dtype, causal, seq_q, seq_k, head_dim, block_m, block_n):
    q, k, v = _inputs(1, 2, seq_q, seq_k, head_dim, dtype)
    ref = _reference(q, k, v, causal)
    out32 = flash_attention(q, k, v, causal=causal, block_m=block_m, block_n=block_n, out_dtype=torch.float32)
    assert out32.dtype == torch.float32 and out32.shape == q.shape
    assert torch.isfinite(out32).all()
    if dtype == torch.float16:
        # P is rounded to fp16 before P @ V (relative 2**-11 per weight)
        torch.testing.assert_close(out32.double(), ref, rtol=0, atol=1e-3)
        out16 = flash_attention(q, k, v, causal=causal, block_m=block_m, block_n=block_n)
        assert out16.dtype == torch.float16
        # the fp16 output is the fp32 result rounded once
        assert torch.equal(out16, out32.half())
    else:
        # default input_precision is tf32 (10 mantissa bits on a GPU; the stock interpreter ignores it)
        torch.testing.assert_close(out32.double(), ref, rtol=0, atol=2e-3)


def test_fp32_ieee_is_tight_and_handles_non_contiguous_inputs():
    # (batch, seq, heads, dim) storage viewed as (batch, heads, seq, dim)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 45, 2, 32, generator=g).transpose(1, 2)
    k = torch.randn(2, 70, 2, 32, generator=g).transpose(1, 2)
    v = torch.randn(2, 70, 2, 32, generator=g).transpose(1, 2)
    assert not q.is_contiguous()
    out = flash_attention(q, k, v, causal=True, scale=0.3, block_m=16, block_n=32, input_precision="ieee")
    torch.testing.assert_close(out.double(), _reference(q, k, v, True, scale=0.3), rtol=0, atol=2e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_stats_are_log2_max_and_denominator(causal):
    q, k, v = _inputs(1, 2, 97, 70, 32, torch.float16, seed=1, spread=2.0)
    scale = 0.2
    out, m, denom = flash_attention(q, k, v, causal=causal, scale=scale, block_m=32, block_n=16, return_stats=True)
    assert m.shape == denom.shape == (1, 2, 97)
    assert m.dtype == denom.dtype == torch.float32
    qk_scale = _qk_scale(scale)
    s = _scores64(q, k, causal)
    # m: the row maximum of the scores in log2 units (qk_scale = scale * log2(e) in fp32)
    m_ref = s.amax(dim=-1) * qk_scale
    torch.testing.assert_close(m.double(), m_ref, rtol=1e-6, atol=1e-6)
    # l: sum of exp2(score * qk_scale - m), relative to the kernel's own m
    l_ref = torch.exp2(s * qk_scale - m.double()[..., None]).sum(dim=-1)
    torch.testing.assert_close(denom.double(), l_ref, rtol=2e-6, atol=0)
    # together they give the natural-log logsumexp of the scaled scores
    lse = (m.double() + torch.log2(denom.double())) * math.log(2.0)
    torch.testing.assert_close(lse, torch.logsumexp(s * (qk_scale / LOG2E), dim=-1), rtol=0, atol=1e-5)


def test_lazy_rescale_threshold_zero_is_bitwise_always_rescale():
    q, k, v = _inputs(1, 2, 70, 97, 32, torch.float16, seed=2, spread=2.0)
    eager = flash_attention(q, k, v, causal=True, block_m=32, block_n=16, return_stats=True)
    lazy = flash_attention(q, k, v, causal=True, block_m=32, block_n=16, return_stats=True, lazy_rescale_threshold=0.0)
    for a, b in zip(eager, lazy, strict=True):
        assert torch.equal(a, b)


def test_lazy_rescale_keeps_stale_max_within_threshold():
    # scores that grow along the keys, so later tiles raise the row maximum a little at a time
    q, k, v = _inputs(1, 2, 64, 130, 32, torch.float16, seed=4)
    ramp = torch.linspace(0.5, 1.5, 130)[None, None, :, None]
    k = (k.float() * ramp).half()
    threshold = 4.0
    out, m, denom = flash_attention(
        q, k, v, block_m=32, block_n=16, return_stats=True, lazy_rescale_threshold=threshold, out_dtype=torch.float32
    )
    _, m_eager, _ = flash_attention(q, k, v, block_m=32, block_n=16, return_stats=True)
    torch.testing.assert_close(out.double(), _reference(q, k, v, False), rtol=0, atol=2e-3)
    assert torch.all(m <= m_eager) and torch.all(m_eager - m <= threshold)
    assert torch.any(m < m_eager)  # some rows really skipped a rescale
    s = _scores64(q, k, False) * (_qk_scale(1 / math.sqrt(32)) / LOG2E)
    lse = (m.double() + torch.log2(denom.double())) * math.log(2.0)
    torch.testing.assert_close(lse, torch.logsumexp(s, dim=-1), rtol=0, atol=1e-5)


def test_empty_query_sequence():
    q, k, v = _inputs(1, 2, 0, 5, 16, torch.float16)
    out, m, denom = flash_attention(q, k, v, return_stats=True)
    assert out.shape == (1, 2, 0, 16) and m.shape == denom.shape == (1, 2, 0)


def test_bf16_under_faithful_interpreter():
    """The stock interpreter multiplies bf16's raw uint16 bit patterns in tl.dot (simfloat_gpu/interpreter/NOTES.md);
    simfloat_gpu.interpreter.faithful() runs the kernel with simfloat's numerics."""
    from simfloat_gpu.interpreter import faithful

    q, k, v = _inputs(1, 1, 33, 33, 16, torch.bfloat16)
    with faithful():
        out = flash_attention(q, k, v, block_m=16, block_n=16, out_dtype=torch.float32)
    torch.testing.assert_close(out.double(), _reference(q, k, v, False), rtol=0, atol=2e-2)


# ----------------------------------------------------------------------------------------------------
# the compiled kernel (no GPU needed: triton compiles to PTX and cubin on the CPU)
# ----------------------------------------------------------------------------------------------------

_COMPILE_SCRIPT = textwrap.dedent("""
    import inspect, json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    import simfloat_gpu.kernels.flash_attention as fa
    names = list(inspect.signature(fa._attn_fwd.fn).parameters)[:27]
    sig = dict(zip(names, ["*fp16"] * 4 + ["*fp32"] * 2 + ["fp32"] + ["i32"] * 20))
    consts = dict(HEAD_DIM=32, BLOCK_M=64, BLOCK_N=32, IS_CAUSAL=True, INPUT_PRECISION="ieee",
                  LAZY_RESCALE=True, RESCALE_THRESHOLD=8.0)
    sig.update({k: "constexpr" for k in consts})
    kernel = triton.compile(ASTSource(fa._attn_fwd, sig, constexprs=consts),
                            target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=fa.NUM_WARPS, num_stages=fa.NUM_STAGES))
    sys.stdout.write(kernel.asm["ptx"])
""")


def test_compiles_for_sm90_with_the_documented_instructions(tmp_path):
    """The precision plan in the module docstring names PTX instructions; check them in the real PTX."""
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "gpu"), env.get("PYTHONPATH", "")])
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        if "ptxas" in proc.stderr or ("nvidia" in proc.stderr.lower() and "not found" in proc.stderr):
            pytest.skip("triton's NVIDIA toolchain is unavailable here: " + proc.stderr[-300:])
        raise AssertionError(proc.stderr[-3000:])
    ptx = proc.stdout
    assert "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16" in ptx  # T2/T13 on Hopper, BLOCK_M=64
    assert "ex2.approx.ftz.f32" in ptx  # T7/T9: approximate, flush-to-zero exp2
    assert "fma.rn.f32" in ptx  # T6/T10
    assert "div.rn.f32" in ptx and "div.full.f32" not in ptx  # E1
    assert "cvt.rn.f16x2.f32" in ptx  # T12 / E2


# ----------------------------------------------------------------------------------------------------
# bad inputs: each is rejected before any launch
# ----------------------------------------------------------------------------------------------------


def _good():
    return _inputs(1, 2, 8, 8, 16, torch.float16)


def _bad_cases():
    q, k, v = _good()
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
        ("head_dim_24", (q[..., :12].repeat(1, 1, 1, 2),) * 3, {}, ValueError, "power of two in [16, 256]"),
        ("head_dim_8", (q[..., :8], k[..., :8], v[..., :8]), {}, ValueError, "power of two in [16, 256]"),
        ("no_keys", (q, k[:, :, :0], v[:, :, :0]), {}, ValueError, "at least one key"),
        ("block_m_48", (q, k, v), {"block_m": 48}, ValueError, "block_m must be a power of two"),
        ("block_n_8", (q, k, v), {"block_n": 8}, ValueError, "block_n must be a power of two"),
        ("block_m_float", (q, k, v), {"block_m": 32.0}, TypeError, "block_m must be an int"),
        ("block_n_bool", (q, k, v), {"block_n": True}, TypeError, "block_n must be an int"),
        ("causal_str", (q, k, v), {"causal": "yes"}, TypeError, "causal must be a bool"),
        ("scale_zero", (q, k, v), {"scale": 0.0}, ValueError, "scale must be finite and > 0"),
        ("scale_negative", (q, k, v), {"scale": -1.0}, ValueError, "scale must be finite and > 0"),
        ("scale_nan", (q, k, v), {"scale": float("nan")}, ValueError, "scale must be finite and > 0"),
        ("scale_str", (q, k, v), {"scale": "0.1"}, TypeError, "scale must be a real number"),
        ("out_bf16", (q, k, v), {"out_dtype": torch.bfloat16}, ValueError, "out_dtype must be"),
        ("out_str", (q, k, v), {"out_dtype": "float32"}, TypeError, "out_dtype must be a torch.dtype"),
        ("lazy_negative", (q, k, v), {"lazy_rescale_threshold": -1.0}, ValueError, "lazy_rescale_threshold"),
        ("lazy_16", (q, k, v), {"lazy_rescale_threshold": 16}, ValueError, "lazy_rescale_threshold"),
        ("lazy_str", (q, k, v), {"lazy_rescale_threshold": "8"}, TypeError, "lazy_rescale_threshold"),
        ("precision_fp16", (q, k, v), {"input_precision": "ieee"}, ValueError, "only applies to float32"),
        (
            "precision_tf32x3",
            (q.float(), k.float(), v.float()),
            {"input_precision": "tf32x3"},
            ValueError,
            "'tf32' or 'ieee'",
        ),
    ]


BAD = _bad_cases()


@pytest.mark.parametrize("args,kwargs,exc,match", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_inputs_are_rejected(args, kwargs, exc, match):
    with pytest.raises(exc, match=match.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        flash_attention(*args, **kwargs)
