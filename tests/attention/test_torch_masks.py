"""simfloat.torch with masks: attention(attn_mask=) and SDPA calls with attn_mask routed by emulate_sdpa, against
torch's own SDPA in float64 (loosely) and simfloat's flash with the same mask (bit for bit)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import simfloat.torch as st  # noqa: E402
from simfloat.attention import flash, flash_backward, lse_from_stats  # noqa: E402

F = torch.nn.functional


def _qkv(sq, sk, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, sq, 16, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    k = torch.randn(2, 2, sk, 16, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    v = torch.randn(2, 2, sk, 16, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    return q, k, v


def _masks(sq, sk, dtype):
    g = torch.Generator().manual_seed(5)
    keep = torch.rand(2, 1, sq, sk, generator=g) < 0.7
    keep[..., 0] = True
    bias = (torch.randn(sq, sk, generator=g, dtype=torch.float64) * 2).to(dtype)
    bias[torch.rand(sq, sk, generator=g) < 0.2] = -float("inf")
    bias[:, 1] = 0.0
    return keep, bias


@pytest.mark.parametrize("kernel", ["flash", "baseline"])
def test_fp64_masked_attention_against_torch_sdpa(kernel):
    sq, sk = 33, 57
    q, k, v = _qkv(sq, sk)
    g = torch.randn(2, 2, sq, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    for mask in _masks(sq, sk, torch.float64):
        out = st.attention(q, k, v, plan="fp64", kernel=kernel, block_m=16, block_n=16, attn_mask=mask)
        grads = torch.autograd.grad(out, (q, k, v), g)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        want = torch.autograd.grad(ref, (q, k, v), g)
        assert float((out - ref).detach().abs().max()) < 1e-12
        for a, b in zip(grads, want, strict=True):
            assert float((a - b).abs().max()) < 1e-11


def test_bf16_masked_flash_is_the_emulator_bit_for_bit():
    sq, sk = 40, 40
    q, k, v = _qkv(sq, sk, torch.bfloat16, seed=3)
    keep, bias = _masks(sq, sk, torch.bfloat16)
    qa, ka, va = (x.detach().double().numpy() for x in (q, k, v))
    for mask in (keep, bias):
        out = st.attention(q, k, v, plan="triton-bf16", block_m=16, block_n=16, attn_mask=mask)
        do = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
        grads = torch.autograd.grad(out, (q, k, v), do)
        m_np = mask.numpy() if mask.dtype == torch.bool else mask.double().numpy()
        o, m, l = flash(qa, ka, va, plan="triton-bf16", block_m=16, block_n=16, attn_mask=m_np, return_stats=True)  # noqa: E741
        lse = lse_from_stats(m, l, plan="triton-bf16")
        da = do.double().numpy()
        want = flash_backward(qa, ka, va, o, da, lse, plan="triton-bf16", block_m=16, block_n=16, attn_mask=m_np)
        assert np.array_equal(out.detach().double().numpy(), o)
        for a, b in zip(grads, want, strict=True):
            assert np.array_equal(a.double().numpy(), b)
        ref = F.scaled_dot_product_attention(
            *(x.detach().double() for x in (q, k, v)), attn_mask=mask.double() if mask.dtype != torch.bool else mask
        )
        assert float((out.detach().double() - ref).abs().max()) < 0.05


def test_emulate_sdpa_routes_masked_calls():
    sq, sk = 24, 40
    q, k, v = _qkv(sq, sk, torch.bfloat16, seed=6)
    keep, bias = _masks(sq, sk, torch.bfloat16)
    for mask in (keep, bias):
        with st.emulate_sdpa(plan="triton-bf16", block_m=16, block_n=16):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        want = st.attention(q, k, v, plan="triton-bf16", block_m=16, block_n=16, attn_mask=mask)
        assert torch.equal(out, want)
        out.float().sum().backward()
        assert q.grad is not None and torch.isfinite(q.grad).all()
        q.grad = k.grad = v.grad = None
    with (
        pytest.warns(st.RoutingWarning),
        st.emulate_sdpa(plan="triton-bf16"),
        pytest.raises(ValueError, match="not both"),
    ):
        F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=True)
    with pytest.raises(NotImplementedError, match="requires grad"):
        st.attention(q, k, v, plan="triton-bf16", attn_mask=bias.clone().requires_grad_())
    q3, k3, v3 = (x.detach()[:, 0] for x in (q, k, v))  # (batch, seq, dim) with a (batch, seq_q, seq_k) mask
    with st.emulate_sdpa(plan="triton-bf16", block_m=16, block_n=16):
        out3 = F.scaled_dot_product_attention(q3, k3, v3, attn_mask=keep[:, 0])
    assert out3.shape == q3.shape
