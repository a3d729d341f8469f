"""Triton kernels shared by the stock-interpreter and faithful-interpreter tests: the same kernel shows a stock
failure in one file and its fix in the other; and the interpreter set-up of the tests that run a kernel under
``faithful()``: ``from triton_kernels import faithful, tl, torch, triton`` (a test module without torch or triton
is skipped). Imported only after TRITON_INTERPRET=1 is set (tests/conftest.py): @triton.jit picks the
interpreter at decoration time."""

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # conftest.py sets it first; a module run on its own needs it too

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from simfloat_gpu.interpreter import faithful  # noqa: E402

__all__ = ["faithful", "tl", "torch", "triton"]


@triton.jit
def _cast_kernel(X, Y, n, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    x = tl.load(X + r, mask=r < n)
    tl.store(Y + r, x.to(Y.dtype.element_ty), mask=r < n)


@triton.jit
def _cast_rounding_kernel(X, Y, n, BLOCK: tl.constexpr, ROUNDING: tl.constexpr):
    r = tl.arange(0, BLOCK)
    x = tl.load(X + r, mask=r < n)
    tl.store(Y + r, x.to(Y.dtype.element_ty, fp_downcast_rounding=ROUNDING), mask=r < n)


@triton.jit
def _fma_kernel(A, B, C, Y, N: tl.constexpr):
    r = tl.arange(0, N)
    tl.store(Y + r, tl.fma(tl.load(A + r), tl.load(B + r), tl.load(C + r)))


@triton.jit
def _dot_kernel(A, B, C, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, PRECISION: tl.constexpr):
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    rk = tl.arange(0, K)
    a = tl.load(A + rm[:, None] * K + rk[None, :])
    b = tl.load(B + rk[:, None] * N + rn[None, :])
    c = tl.dot(a, b, input_precision=PRECISION)
    tl.store(C + rm[:, None] * N + rn[None, :], c)


@triton.jit
def _neg_lt_kernel(X, Y, LT, N: tl.constexpr):
    r = tl.arange(0, N)
    x = tl.load(X + r)
    tl.store(Y + r, -x)
    tl.store(LT + r, (x < 0.5).to(tl.int8))


@triton.jit
def _row_sum_kernel(X, Y, R: tl.constexpr, N: tl.constexpr):
    rr = tl.arange(0, R)
    rn = tl.arange(0, N)
    x = tl.load(X + rr[:, None] * N + rn[None, :])
    tl.store(Y + rr, tl.sum(x, 1))


@triton.jit
def _descriptor_double_kernel(X, Y, N: tl.constexpr):
    dx = tl.make_tensor_descriptor(X, shape=[N], strides=[1], block_shape=[N])
    tl.store(Y + tl.arange(0, N), dx.load([0]) * 2.0)


@triton.jit
def _atomic_add_kernel(X, Y, N: tl.constexpr):
    r = tl.arange(0, N)
    tl.atomic_add(Y + r, tl.load(X + r))


# ------------------------------------------------------------------------------------------------------------
# A forward attention kernel in the style of Triton's fused-attention tutorial (06-fused-attention.py): not the
# project's kernel (plain ``qk * qk_scale - m`` instead of an fma, ``/`` instead of div_rn, the log-sum-exp
# stored), used by tests/test_gpu_line_attribution.py as "a kernel the project did not write".
# ------------------------------------------------------------------------------------------------------------


@triton.jit
def _tutorial_attn_inner(
    acc, l_i, m_i, q, K_ptrs, V_ptrs, stride_kn, stride_vn, qk_scale, N_CTX, BLOCK_N: tl.constexpr
):
    for start_n in range(0, N_CTX, BLOCK_N):
        k = tl.load(K_ptrs + start_n * stride_kn)
        qk = tl.dot(q, k)
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        l_ij = tl.sum(p, 1)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + l_ij
        acc = acc * alpha[:, None]
        v = tl.load(V_ptrs + start_n * stride_vn)
        p = p.to(v.dtype)
        acc = tl.dot(p, v, acc)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _tutorial_attn_fwd(
    Q, K, V, sm_scale, M, Out, stride_qm, stride_kn, stride_vn, stride_om, N_CTX,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    start_m = tl.program_id(0)
    off_h = tl.program_id(1)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_base = Q + off_h * N_CTX * stride_qm
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :])
    K_ptrs = K + off_h * N_CTX * stride_kn + offs_d[:, None] + offs_n[None, :] * stride_kn
    V_ptrs = V + off_h * N_CTX * stride_vn + offs_n[:, None] * stride_vn + offs_d[None, :]
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504
    acc, l_i, m_i = _tutorial_attn_inner(
        acc, l_i, m_i, q, K_ptrs, V_ptrs, stride_kn, stride_vn, qk_scale, N_CTX, BLOCK_N
    )
    # epilogue
    m_i += tl.math.log2(l_i)
    acc = acc / l_i[:, None]
    tl.store(M + off_h * N_CTX + offs_m, m_i)
    tl.store(
        Out + off_h * N_CTX * stride_om + offs_m[:, None] * stride_om + offs_d[None, :], acc.to(Out.type.element_ty)
    )


def tutorial_attention(q, k, v, sm_scale=None, BLOCK_M=16, BLOCK_N=16):
    """Launcher of the tutorial-style kernel: q, k, v (batch=1, heads, seq, head_dim), seq a multiple of the
    blocks; returns (out, M) with M the log2-sum-exp per row (fp32)."""
    import torch

    _, heads, seq, head_dim = q.shape
    q, k, v = (x.contiguous() for x in (q, k, v))
    if sm_scale is None:
        sm_scale = head_dim**-0.5
    out = torch.empty_like(q)
    m = torch.empty((1, heads, seq), dtype=torch.float32)
    grid = (triton.cdiv(seq, BLOCK_M), heads)
    _tutorial_attn_fwd[grid](
        q, k, v, sm_scale, m, out, q.stride(2), k.stride(2), v.stride(2), out.stride(2), seq,
        HEAD_DIM=head_dim, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
    )  # fmt: skip
    return out, m
