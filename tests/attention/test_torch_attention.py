"""simfloat.torch: the emulated attention as a torch autograd Function and the SDPA routing."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import simfloat.torch as st  # noqa: E402
from simfloat.attention import flash, flash_backward, lse_from_stats  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _qkv(b, h, hkv, s, d, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, s, d, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    k = torch.randn(b, hkv, s, d, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    v = torch.randn(b, hkv, s, d, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    return q, k, v


@pytest.mark.parametrize("kernel", ["flash", "baseline"])
@pytest.mark.parametrize(
    ("seq", "heads", "kv_heads", "causal"), [(97, 1, 1, False), (97, 1, 1, True), (33, 4, 2, True)]
)
def test_fp64_plan_gradients_equal_torch_float64_autograd(kernel, seq, heads, kv_heads, causal):
    q, k, v = _qkv(2, heads, kv_heads, seq, 16)
    g = torch.randn(2, heads, seq, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    out = st.attention(q, k, v, plan="fp64", kernel=kernel, causal=causal, block_m=16, block_n=32)
    grads = torch.autograd.grad(out, (q, k, v), g)
    ref = st.reference_attention(q, k, v, causal=causal)
    want = torch.autograd.grad(ref, (q, k, v), g)
    assert out.dtype == torch.float64 and out.shape == ref.shape
    assert float((out - ref).detach().abs().max() / ref.detach().abs().max()) < 1e-12
    for name, a, b in zip("qkv", grads, want, strict=True):
        assert a.shape == b.shape, name
        assert float((a - b).abs().max() / b.abs().max()) < 1e-12, name


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_bf16_flash_is_the_emulator_bit_for_bit_and_keeps_the_dtype(kv_heads):
    q, k, v = _qkv(1, 2, kv_heads, 40, 16, dtype=torch.bfloat16, seed=3)
    out = st.attention(q, k, v, plan="triton-bf16", causal=True, block_m=16, block_n=16)
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
    assert out.dtype == dq.dtype == dk.dtype == torch.bfloat16
    qa, ka, va, da = (x.detach().double().numpy() for x in (q, k, v, do))
    o, m, l = flash(qa, ka, va, plan="triton-bf16", block_m=16, block_n=16, causal=True, return_stats=True)  # noqa: E741
    lse = lse_from_stats(m, l, plan="triton-bf16")
    want = flash_backward(qa, ka, va, o, da, lse, plan="triton-bf16", block_m=16, block_n=16, causal=True)
    assert np.array_equal(out.detach().double().numpy(), o)  # bf16 output values survive the cast exactly
    for a, b in zip((dq, dk, dv), want, strict=True):
        assert np.array_equal(a.double().numpy(), b)
    # and it is not the float64 answer
    ref = st.reference_attention(*(x.detach().double() for x in (q, k, v)), causal=True)
    assert float((out.detach().double() - ref).abs().max()) > 0


def test_a_plan_with_quantizers_runs_forward_through_flash():
    q, k, v = _qkv(1, 2, 2, 24, 16, dtype=torch.float16, seed=5)
    with pytest.raises(ValueError, match="backward_plan is needed"):
        st.attention(q, k, v, plan="int8-reference")  # no backward preset of that name
    with torch.no_grad():
        out = st.attention(q, k, v, plan="int8-reference", backward_plan="triton-fp16", block_m=16, block_n=8)
    want = flash(*(x.detach().double().numpy() for x in (q, k, v)), plan="int8-reference", block_m=16, block_n=8)
    assert out.dtype == torch.float16 and np.array_equal(out.double().numpy(), want)  # fp16 output values


def test_emulate_sdpa_routes_and_restores():
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q, k, v = _qkv(1, 2, 2, 20, 8)
    with st.emulate_sdpa(plan="fp64", block_m=8, block_n=8) as cfg:
        assert torch.nn.functional.scaled_dot_product_attention is not sdpa
        assert cfg.plan.name == "fp64"
        st.timings(reset=True)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
        out.sum().backward()
        tm = st.timings()
        assert tm["forward_calls"] == 1 and tm["backward_calls"] == 1 and tm["forward_s"] > 0
        with pytest.raises(NotImplementedError, match="dropout_p"):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
        # another thread keeps torch's own kernel meanwhile
        seen = {}
        t = threading.Thread(target=lambda: seen.update(f=torch.nn.functional.scaled_dot_product_attention(q, k, v)))
        st.timings(reset=True)
        t.start()
        t.join()
        assert st.timings()["forward_calls"] == 0 and seen["f"].shape == q.shape
    assert torch.nn.functional.scaled_dot_product_attention is sdpa
    ref = st.reference_attention(q.detach(), k.detach(), v.detach(), causal=True, scale=0.3)
    assert float((out.detach() - ref).abs().max()) < 1e-13
    assert float((q.grad - torch.autograd.grad(st.reference_attention(q, k, v, causal=True, scale=0.3).sum(), q)[0])
                 .abs().max()) < 1e-12  # fmt: skip


def test_bad_inputs_are_named():
    q, k, v = _qkv(1, 2, 2, 8, 4)
    with pytest.raises(ValueError, match="backward_plan is needed"):
        st.attention(q, k, v, plan=st.config(plan="fp64").plan.replace(out="float32"))
    with pytest.raises(ValueError, match="exp2"):
        st.config(plan="triton-bf16", backward_plan="fp64")
    with pytest.raises(ValueError, match="kernel"):
        st.config(plan="pytorch-bf16", kernel="flash")
    with pytest.raises(ValueError, match="q must be"):
        st.attention(q[0], k, v, plan="fp64")
    with pytest.raises(TypeError, match="share one dtype"):
        st.attention(q, k.float(), v, plan="fp64")
    with pytest.raises(ValueError, match="multiple"):
        st.attention(q, k[:, :1].expand(1, 3, 8, 4), v[:, :1].expand(1, 3, 8, 4), plan="fp64")
    with pytest.raises(ValueError, match="block_m"):
        st.attention(q, k, v, plan="fp64", block_m=0)


def test_import_simfloat_torch_without_torch_names_the_extra():
    code = "import sys; sys.modules['torch'] = None; import simfloat.torch"  # None: the import fails
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode != 0 and "pip install 'simfloat-emu[train]'" in run.stderr, run.stderr[-2000:]


def test_import_simfloat_does_not_import_torch():
    code = "import sys, simfloat, simfloat.attention; print('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "False", run.stderr[-2000:]
