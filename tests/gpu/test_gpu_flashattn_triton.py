"""Two external Triton forward kernels against their presets under the faithful interpreter: the Triton tutorial's
(``triton-tutorial-fp16``: its causal diagonal tiles round ``qk * qk_scale`` and ``- m_ij`` apart) and the
flash-attention repository's Triton forward (``flash_attn/flash_attn_triton.py``, ``_fwd_kernel`` without
bias) against the ``flashattn-triton-<fmt>`` presets: a re-implementation of its dataflow (written here from the
kernel's description, not copied) run by the faithful interpreter on the CPU, bit for bit with the emulator's
output and lse on both engines, and the plan closest before ``Plan.state`` existed agreeing far less.

The kernel keeps the running state as ``(m_i, lse_i)``: ``m_ij = max(rowmax(qk) * scale, lse_i)``, ``p =
exp(qk * scale - m_ij)`` (one fma under fp fusion), ``acc = acc * exp(m_i - m_ij)``, ``acc += p . v``,
``l = exp(lse_i - m_ij) + rowsum(p)``, ``lse_i = m_ij + log(l)``, ``m_i = m_ij``; at the end ``acc *
exp(m_i - lse_i)``. The GPU's Triton folds ``acc += tl.dot(p, v)`` into the dot's accumulator (its combine
pass: ``add(x, dot(a, b, 0))`` becomes ``dot(a, b, x)``), which the interpreter does not do: the kernel below
writes the folded form, ``tl.dot(p, v, acc)``."""

import math

import numpy as np
import pytest
from triton_kernels import faithful, tl, torch, triton  # the interpreter's set-up (skips without torch, triton)

from simfloat.attention import flash, plan

pytestmark = pytest.mark.triton


@triton.jit
def _lse_flash_kernel(
    Q,
    K,
    V,
    Out,
    Lse,
    seq_q,
    seq_k,
    softmax_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    head = tl.program_id(1)
    q_at = Q + head * seq_q * HEAD_DIM + rows[:, None] * HEAD_DIM + dims[None, :]
    q = tl.load(q_at, mask=rows[:, None] < seq_q, other=0.0)
    lse_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    end = seq_k
    if CAUSAL:
        end = tl.minimum((tl.program_id(0) + 1) * BLOCK_M, seq_k)
    for start in range(0, end, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        kv = head * seq_k * HEAD_DIM + keys[:, None] * HEAD_DIM + dims[None, :]
        k = tl.load(K + kv, mask=keys[:, None] < seq_k, other=0.0)
        v = tl.load(V + kv, mask=keys[:, None] < seq_k, other=0.0)
        qk = tl.dot(q, tl.trans(k))
        qk += tl.where(keys[None, :] < seq_k, 0, float("-inf"))
        if CAUSAL:
            qk += tl.where(rows[:, None] >= keys[None, :], 0, float("-inf"))
        m_ij = tl.maximum(tl.max(qk, 1) * softmax_scale, lse_i)
        p = tl.exp(qk * softmax_scale - m_ij[:, None])
        l_ij = tl.sum(p, 1)
        acc_scale = tl.exp(m_i - m_ij)
        acc = tl.dot(p.to(V.dtype.element_ty), v, acc * acc_scale[:, None])
        m_i = m_ij
        l_new = tl.exp(lse_i - m_ij) + l_ij
        lse_i = m_ij + tl.log(l_new)
    acc = acc * tl.exp(m_i - lse_i)[:, None]
    out = head * seq_q * HEAD_DIM + rows[:, None] * HEAD_DIM + dims[None, :]
    tl.store(Out + out, acc.to(Out.dtype.element_ty), mask=rows[:, None] < seq_q)
    tl.store(Lse + head * seq_q + rows, lse_i, mask=rows < seq_q)


def _run_kernel(q, k, v, causal, bm, bn):
    h, n, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((h, n), dtype=torch.float32)
    grid = (triton.cdiv(n, bm), h)
    _lse_flash_kernel[grid](
        q, k, v, o, lse, n, k.shape[1], 1.0 / math.sqrt(d), HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal
    )
    return o, lse


def _bits(x):
    return np.asarray(x, np.float64).view(np.uint64)


# (fmt, seq, head_dim, block_m, block_n, causal): several key tiles, partial last tiles, causal with
# block_m != block_n (rows meeting wholly masked tiles)
CASES = [
    ("bf16", 97, 16, 32, 16, False),
    ("bf16", 70, 16, 32, 16, True),
    ("fp16", 65, 32, 16, 32, True),
]


@pytest.mark.parametrize(("fmt", "seq", "d", "bm", "bn", "causal"), CASES)
def test_the_flashattn_triton_kernel_matches_its_preset_bit_for_bit(fmt, seq, d, bm, bn, causal):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[fmt]
    g = torch.Generator().manual_seed(seq)
    q, k, v = (torch.randn(2, seq, d, generator=g).mul(2.0).to(dtype) for _ in range(3))
    with faithful():
        o, lse = _run_kernel(q, k, v, causal, bm, bn)
    got = o.float().numpy().astype(np.float64)
    qn, kn, vn = (x.float().numpy().astype(np.float64) for x in (q, k, v))
    pl = plan(f"flashattn-triton-{fmt}")
    tiles = dict(block_m=bm, block_n=bn, causal=causal)
    for engine in ("vector", "reference"):
        out, m, one = flash(qn, kn, vn, plan=pl, **tiles, engine=engine, return_stats=True)
        assert np.array_equal(_bits(out), _bits(got)), (engine, np.mean(out == got))
        assert np.array_equal(_bits(m), _bits(lse.numpy().astype(np.float64))), engine
        assert np.all(one == 1.0)
    # the closest plan without the lse state (tl.exp, contraction, the same formats) does not reproduce it
    ml = pl.replace(state="m_l")
    near = flash(qn, kn, vn, plan=ml, **tiles)
    assert np.mean(near == got) < 0.97, np.mean(near == got)


@triton.jit
def _tutorial_flash_kernel(
    Q, K, V, Out, M, L, seq, sm_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
):  # fmt: skip
    # the Triton tutorial's forward dataflow (python/tutorials/06-fused-attention.py, whole tiles only): the key
    # tiles before the q tile's first row with the contracted qk * qk_scale - m_ij, the diagonal ones (causal) with
    # the mask added to the scaled scores and m_ij subtracted after
    start_m = tl.program_id(0)
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    base = tl.program_id(1) * seq * HEAD_DIM
    q = tl.load(Q + base + rows[:, None] * HEAD_DIM + dims[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 1.0, tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    qk_scale = sm_scale
    qk_scale *= 1.44269504
    end = seq
    if CAUSAL:
        end = (start_m + 1) * BLOCK_M
    for start in range(0, end, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        kv = base + keys[:, None] * HEAD_DIM + dims[None, :]
        k = tl.load(K + kv)
        v = tl.load(V + kv)
        qk = tl.dot(q, tl.trans(k))
        if CAUSAL and start >= start_m * BLOCK_M:
            qk = qk * qk_scale + tl.where(rows[:, None] >= keys[None, :], 0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk -= m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        l_ij = tl.sum(p, 1)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + l_ij
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(tl.float16), v, acc)
        m_i = m_ij
    acc = acc / l_i[:, None]
    tl.store(Out + base + rows[:, None] * HEAD_DIM + dims[None, :], acc.to(Out.dtype.element_ty))
    tl.store(M + tl.program_id(1) * seq + rows, m_i)  # the running state too (the tutorial stores m + log2 l)
    tl.store(L + tl.program_id(1) * seq + rows, l_i)


@pytest.mark.parametrize("causal", [False, True])
def test_the_triton_tutorial_forward_matches_its_preset_bit_for_bit(causal):
    seq, d, bm, bn = 64, 16, 32, 16
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, seq, d, generator=g).mul(2.0).to(torch.float16) for _ in range(3))
    o = torch.empty_like(q)
    m, l_i = (torch.empty((2, seq), dtype=torch.float32) for _ in range(2))
    with faithful():
        _tutorial_flash_kernel[(seq // bm, 2)](
            q, k, v, o, m, l_i, seq, 1.0 / math.sqrt(d), HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal
        )
    got = [x.float().numpy().astype(np.float64) for x in (o, m, l_i)]
    qn, kn, vn = (x.float().numpy().astype(np.float64) for x in (q, k, v))
    tiles = dict(block_m=bm, block_n=bn, causal=causal, return_stats=True)
    for engine in ("vector", "reference"):
        res = flash(qn, kn, vn, plan="triton-tutorial-fp16", **tiles, engine=engine)
        for x, y in zip(res, got, strict=True):
            assert np.array_equal(_bits(x), _bits(y)), (engine, np.mean(x == y))
    # with causal, triton-fp16 (every tile contracted) does not reproduce the diagonal tiles' row sums
    near = flash(qn, kn, vn, plan="triton-fp16", **tiles)
    assert np.array_equal(_bits(near[2]), _bits(got[2])) == (not causal)
