"""Backward flash attention in Triton (FA2 schedule), written so that simfloat can mirror it op by op.

Layout as the forward (``simfloat_gpu/kernels/flash_attention.py``): ``q``, ``o``, ``do`` are (batch, heads, seq_q,
head_dim),
``k``, ``v`` (batch, kv_heads, seq_k, head_dim), heads a multiple of kv_heads (grouped-query attention; query head
h reads key/value head h // GROUP, GROUP = heads // kv_heads, by stride: nothing is copied); any lengths; the
forward's stats ``m`` (running maximum, log2 units) and ``l`` (row sum relative to it) are (batch, heads, seq_q)
fp32; dk, dv have k's shape. Three kernels, all deterministic (no atomics): a preprocess per (BLOCK_M rows,
batch*head), a dK/dV kernel per (BLOCK_N keys, batch*kv_head) that walks the query tiles of each query head of
its group in increasing order (G1), and a dQ kernel per (BLOCK_M rows, batch*head) that walks the key tiles in
order, recomputing P and dS exactly as the dK/dV kernel does.

Precision plan, in execution order (the emulator's ``triton-<fmt>`` backward plan mirrors it). ``in`` is the
input dtype (fp16, bf16, fp32); ``o`` is the forward output as stored (``in`` or fp32); every other value fp32;
"rn" = round to nearest even.

Host, once per call:
  H1. qk_scale = rn32(rn32(scale) * rn32(1.44269504)) as the forward; sm_scale = rn32(scale).

Preprocess (rows offs_m, one program per BLOCK_M rows):
  D1. o, do loaded (o in its stored dtype, do in ``in``), both converted exactly to fp32.
  D2. delta = tl.sum(o * do, axis=1): each product rounded to fp32 (mul.rn), the row sum an fp32 reduction
      (GPU: layout-dependent tree; faithful interpreter: sequential, left to right). With fp fusion on (Triton's
      default) the GPU fuses products into each thread's part of the sum (fma.rn.f32 in the PTX of triton 3.9 for
      sm_90), which faithful() does not model.
  D3. lse = m + log2(l)                      fp32 log2 (GPU: libdevice log2f; faithful: correctly rounded),
      then an fp32 add (rn). Stored, with delta, as fp32 (batch, heads, seq_q).

dK/dV kernel (keys offs_n = start_n*BLOCK_N + [0, BLOCK_N)):
  K1. k^T (HEAD_DIM x BLOCK_N), k (BLOCK_N x HEAD_DIM), v^T, v loaded in ``in``; keys >= seq_k read as 0.
  K2. dk = dv = 0 (fp32, BLOCK_N x HEAD_DIM).
  G1. Per query head h = kv_head * GROUP + g of the key/value head's group, g = 0, 1, ..., GROUP - 1 in order
      (GROUP = 1 without grouped-query attention), all into the same dk, dv accumulators:
  Per query tile m0 = lo, lo + BLOCK_M, ... < seq_q  (lo = 0, or (start_n // BLOCK_M) * BLOCK_M if causal: the
  first tile with a row that sees a key of this tile; earlier tiles would add exact zeros):
  B1. q, do loaded in ``in`` (rows >= seq_q read as 0), lse and delta in fp32 (read as 0 there).
  B2. qk = tl.dot(q, k^T)                    -> fp32, the forward's T2 (same operands, same bits).
  B3. qk = where(valid, qk, -inf)            valid = row < seq_q and key < seq_k [and key <= row if causal].
  B4. p = exp2(fma(qk, qk_scale, -lse))      one rounding in the fma (tl.fma), fp32 exp2; masked: 0.
  B5. dv = tl.dot(p.to(in)^T, do, dv)        P cast rn to ``in``; the MMA accumulates into dv over the rows.
  B6. dp = tl.dot(do, v^T)                   -> fp32, from 0.
  B7. ds = p * (dp - delta)                  fp32 subtract (rn), then fp32 multiply (rn).
  B8. ds = ds.to(in)                         rn cast (no-op for fp32 inputs).
  B9. dk = tl.dot(ds^T, q, dk)               the MMA accumulates into dk over the rows.
  Epilogue:
  E1. dk = dk * sm_scale                     fp32 multiply (rn): dS is the gradient of the scaled scores.
  E2. dk, dv cast (rn) to ``grad_dtype`` and stored.

dQ kernel (rows offs_m, one program per BLOCK_M rows):
  Q1. q, do loaded in ``in``, lse, delta in fp32; dq = 0 (fp32, BLOCK_M x HEAD_DIM).
  Per key tile n0 = 0, BLOCK_N, ... < hi  (hi = seq_k, or min(seq_k, (start_m+1)*BLOCK_M) if causal):
  Q2. k^T, k, v^T loaded in ``in`` (keys >= seq_k read as 0).
  Q3. qk, p, dp, ds as B2, B3, B4, B6, B7, B8 (the same ops on the same operands: the same bits).
  Q4. dq = tl.dot(ds, k, dq)                 the MMA accumulates into dq over the keys.
  Epilogue:
  E3. dq = dq * sm_scale                     fp32 multiply (rn); cast (rn) to ``grad_dtype`` and stored.

Notes for the emulator:
  * Every dot is ``tl.dot(a, b, acc)``: for fp16/bf16 the products are exact and the accumulator enters the MMA
    (tensor_core("sm90", fmt) under the faithful interpreter); fp32 inputs use ``input_precision`` as the
    forward ("tf32" default, or "ieee" FMA loops).
  * dk/dv of a key accumulate over the query heads of its group in increasing order (G1), each over the query
    tiles in increasing order, in one fp32 accumulator (no separate reduction over the group; E1 once); dq of a
    row over the key tiles in increasing order. Masked (row, key) pairs have p = 0, so ds = +-0 and they add
    exact zeros.
  * Rows past seq_q (do = 0, p = 0) and keys past seq_k (k = v = 0) change nothing.
  * The GPU may contract nothing here: the two fp32 mul/sub of B7 have a sub->mul dataflow (not mul->add), the
    epilogue multiplies feed stores. D2's products feed the reduction's adds, which ptxas may fuse on the GPU
    (the faithful interpreter rounds each product); fp32 ``o`` (``out_dtype=torch.float32`` in the forward)
    is the "delta from fp32 O" option.
  * Launch configuration is fixed (NUM_WARPS=4, NUM_STAGES=1) for the same reason as the forward.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from simfloat.attention._inputs import kv_group
from simfloat_gpu.kernels.common import check_block, strides
from simfloat_gpu.kernels.flash_attention import check_inputs, check_options, flash_attention

__all__ = ["FlashAttentionFunction", "NUM_STAGES", "NUM_WARPS", "flash_attention_backward", "flash_attention_grad"]

#: Fixed launch width (the GPU MMA instruction and reduction tree depend on it).
NUM_WARPS = 4
#: No software pipelining needed for correctness; low so HEAD_DIM=128 tiles fit shared memory.
NUM_STAGES = 1


# ----------------------------------------------------------------------------------------------------
# jit helpers
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _p_ds(q, kt, do, vt, lse, delta, valid, qk_scale, INPUT_PRECISION: tl.constexpr):
    """B2..B4, B6..B8 of the module docstring: P (fp32) and dS (in the input dtype) of one tile."""
    qk = tl.dot(q, kt, input_precision=INPUT_PRECISION)  # B2
    qk = tl.where(valid, qk, float("-inf"))  # B3
    p = tl.math.exp2(tl.fma(qk, qk_scale, -lse[:, None]))  # B4
    dp = tl.dot(do, vt, input_precision=INPUT_PRECISION)  # B6
    ds = p * (dp - delta[:, None])  # B7
    ds = ds.to(q.dtype)  # B8
    return p, ds


# ----------------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _attn_bwd_preprocess(
    Out,
    DO,
    M,
    L,
    Delta,
    Lse,
    stride_oz,
    stride_oh,
    stride_om,
    stride_on,
    stride_dz,
    stride_dh,
    stride_dm,
    stride_dn,
    H,
    N_CTX_Q,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = (off_hz // H).to(tl.int64)
    off_h = (off_hz % H).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_CTX_Q
    # D1
    o = tl.load(
        Out + off_z * stride_oz + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_on,
        mask=row_ok[:, None],
        other=0.0,
    ).to(tl.float32)
    do = tl.load(
        DO + off_z * stride_dz + off_h * stride_dh + offs_m[:, None] * stride_dm + offs_d[None, :] * stride_dn,
        mask=row_ok[:, None],
        other=0.0,
    ).to(tl.float32)
    # D2
    delta = tl.sum(o * do, axis=1)
    # D3
    stats = off_hz.to(tl.int64) * N_CTX_Q + offs_m
    m = tl.load(M + stats, mask=row_ok, other=0.0)
    l = tl.load(L + stats, mask=row_ok, other=1.0)  # noqa: E741
    lse = m + tl.math.log2(l)
    tl.store(Delta + stats, delta, mask=row_ok)
    tl.store(Lse + stats, lse, mask=row_ok)


@triton.jit
def _attn_bwd_dkdv(
    Q,
    K,
    V,
    DO,
    Lse,
    Delta,
    DK,
    DV,
    qk_scale,
    sm_scale,
    stride_qz,
    stride_qh,
    stride_qm,
    stride_qk,
    stride_kz,
    stride_kh,
    stride_kn,
    stride_kk,
    stride_vz,
    stride_vh,
    stride_vn,
    stride_vk,
    stride_dz,
    stride_dh,
    stride_dm,
    stride_dk,
    stride_gz,
    stride_gh,
    stride_gn,
    stride_gk,
    H,
    GROUP,
    N_CTX_Q,
    N_CTX_K,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    start_n = tl.program_id(0)
    off_hkz = tl.program_id(1)  # one program per (key tile, batch * kv head)
    H_KV = H // GROUP
    off_z = (off_hkz // H_KV).to(tl.int64)
    off_hkv = (off_hkz % H_KV).to(tl.int64)
    k_base = K + off_z * stride_kz + off_hkv * stride_kh
    v_base = V + off_z * stride_vz + off_hkv * stride_vh

    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    key_ok = offs_n < N_CTX_K
    # K1
    kt = tl.load(k_base + offs_d[:, None] * stride_kk + offs_n[None, :] * stride_kn, mask=key_ok[None, :], other=0.0)
    vt = tl.load(v_base + offs_d[:, None] * stride_vk + offs_n[None, :] * stride_vn, mask=key_ok[None, :], other=0.0)
    # K2
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)

    if IS_CAUSAL:
        lo = (start_n * BLOCK_N) // BLOCK_M * BLOCK_M
    else:
        lo = 0
    offs_m0 = tl.arange(0, BLOCK_M)
    for g in range(0, GROUP):  # G1: the group's query heads in order, one accumulator
        off_h = off_hkv * GROUP + g
        q_base = Q + off_z * stride_qz + off_h * stride_qh
        do_base = DO + off_z * stride_dz + off_h * stride_dh
        stats_base = (off_z * H + off_h) * N_CTX_Q
        for start_m in range(lo, N_CTX_Q, BLOCK_M):
            offs_m = start_m + offs_m0
            row_ok = offs_m < N_CTX_Q
            # B1
            q = tl.load(
                q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk, mask=row_ok[:, None], other=0.0
            )
            do = tl.load(
                do_base + offs_m[:, None] * stride_dm + offs_d[None, :] * stride_dk, mask=row_ok[:, None], other=0.0
            )
            lse = tl.load(Lse + stats_base + offs_m, mask=row_ok, other=0.0)
            delta = tl.load(Delta + stats_base + offs_m, mask=row_ok, other=0.0)
            valid = row_ok[:, None] & key_ok[None, :]
            if IS_CAUSAL:
                valid = valid & (offs_m[:, None] >= offs_n[None, :])
            p, ds = _p_ds(q, kt, do, vt, lse, delta, valid, qk_scale, INPUT_PRECISION)
            # B5, B9
            dv = tl.dot(tl.trans(p.to(do.dtype)), do, dv, input_precision=INPUT_PRECISION)
            dk = tl.dot(tl.trans(ds), q, dk, input_precision=INPUT_PRECISION)

    # E1, E2
    dk = dk * sm_scale
    g_offs = off_z * stride_gz + off_hkv * stride_gh + offs_n[:, None] * stride_gn + offs_d[None, :] * stride_gk
    tl.store(DK + g_offs, dk.to(DK.dtype.element_ty), mask=key_ok[:, None])
    tl.store(DV + g_offs, dv.to(DV.dtype.element_ty), mask=key_ok[:, None])


@triton.jit
def _attn_bwd_dq(
    Q,
    K,
    V,
    DO,
    Lse,
    Delta,
    DQ,
    qk_scale,
    sm_scale,
    stride_qz,
    stride_qh,
    stride_qm,
    stride_qk,
    stride_kz,
    stride_kh,
    stride_kn,
    stride_kk,
    stride_vz,
    stride_vh,
    stride_vn,
    stride_vk,
    stride_dz,
    stride_dh,
    stride_dm,
    stride_dk,
    stride_gz,
    stride_gh,
    stride_gm,
    stride_gk,
    H,
    GROUP,
    N_CTX_Q,
    N_CTX_K,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = (off_hz // H).to(tl.int64)
    off_h = (off_hz % H).to(tl.int64)
    off_hkv = off_h // GROUP  # grouped-query attention: GROUP query heads share one key/value head
    q_base = Q + off_z * stride_qz + off_h * stride_qh
    k_base = K + off_z * stride_kz + off_hkv * stride_kh
    v_base = V + off_z * stride_vz + off_hkv * stride_vh
    do_base = DO + off_z * stride_dz + off_h * stride_dh
    stats = off_hz.to(tl.int64) * N_CTX_Q

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_CTX_Q
    # Q1
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk, mask=row_ok[:, None], other=0.0)
    do = tl.load(do_base + offs_m[:, None] * stride_dm + offs_d[None, :] * stride_dk, mask=row_ok[:, None], other=0.0)
    lse = tl.load(Lse + stats + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(Delta + stats + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    if IS_CAUSAL:
        hi = tl.minimum((start_m + 1) * BLOCK_M, N_CTX_K)
    else:
        hi = N_CTX_K
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        key_ok = offs_n < N_CTX_K
        # Q2
        kt = tl.load(
            k_base + offs_d[:, None] * stride_kk + offs_n[None, :] * stride_kn, mask=key_ok[None, :], other=0.0
        )
        k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kk, mask=key_ok[:, None], other=0.0)
        vt = tl.load(
            v_base + offs_d[:, None] * stride_vk + offs_n[None, :] * stride_vn, mask=key_ok[None, :], other=0.0
        )
        valid = row_ok[:, None] & key_ok[None, :]
        if IS_CAUSAL:
            valid = valid & (offs_m[:, None] >= offs_n[None, :])
        # Q3, Q4
        p, ds = _p_ds(q, kt, do, vt, lse, delta, valid, qk_scale, INPUT_PRECISION)
        dq = tl.dot(ds, k, dq, input_precision=INPUT_PRECISION)

    # E3
    dq = dq * sm_scale
    tl.store(
        DQ + off_z * stride_gz + off_h * stride_gh + offs_m[:, None] * stride_gm + offs_d[None, :] * stride_gk,
        dq.to(DQ.dtype.element_ty),
        mask=row_ok[:, None],
    )


# ----------------------------------------------------------------------------------------------------
# launcher
# ----------------------------------------------------------------------------------------------------


def _check_bwd_inputs(q, k, v, o, do, m, l):  # noqa: E741
    check_inputs(q, k, v)
    for name, t in (("o", o), ("do", do), ("m", m), ("l", l)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    if tuple(o.shape) != tuple(q.shape):
        raise ValueError(f"o must have q's shape {tuple(q.shape)}, got {tuple(o.shape)}")
    if tuple(do.shape) != tuple(q.shape):
        raise ValueError(f"do must have q's shape {tuple(q.shape)}, got {tuple(do.shape)}")
    if o.dtype not in (q.dtype, torch.float32):
        raise TypeError(
            f"o has dtype {o.dtype}; it must be the input dtype {q.dtype} or float32 (the forward's output as stored)"
        )
    if do.dtype != q.dtype:
        raise TypeError(f"do has dtype {do.dtype} but q has {q.dtype}; the gradient must be in the input dtype")
    stats_shape = tuple(q.shape[:3])
    for name, t in (("m", m), ("l", l)):
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be float32 (the forward's stats), got {t.dtype}")
        if tuple(t.shape) != stats_shape:
            raise ValueError(f"{name} must have shape (batch, heads, seq_q) = {stats_shape}, got {tuple(t.shape)}")


def flash_attention_backward(
    q,
    k,
    v,
    o,
    do,
    m,
    l,  # noqa: E741
    *,
    causal=False,
    scale=None,
    block_m=64,
    block_n=64,
    grad_dtype=None,
    input_precision=None,
    return_stats=False,
):
    """Gradients (dq, dk, dv) of flash attention with the Triton FA2 backward kernels.

    Args:
        q: (batch, heads, seq_q, head_dim); k, v: (batch, kv_heads, seq_k, head_dim), as for the forward
            (heads a multiple of kv_heads: grouped-query attention, step G1 of the module docstring).
        o: the forward's output (batch, heads, seq_q, head_dim) as stored: the input dtype, or float32 (delta
            from the fp32 output).
        do: gradient of the output, (batch, heads, seq_q, head_dim), in the input dtype.
        m, l: the forward's fp32 stats ((batch, heads, seq_q) each, ``flash_attention(..., return_stats=True)``).
        causal, scale, input_precision: as the forward call that produced o, m, l.
        block_m, block_n: query / key tile sizes (powers of two in [16, 256]) of the backward kernels.
        grad_dtype: dtype of dq, dk, dv: the input dtype (default) or torch.float32.
        return_stats: also return delta and lse (fp32, (batch, heads, seq_q)): rowsum(dO * O) and the
            log2-unit log-sum-exp ``m + log2(l)`` the kernels used.

    Returns:
        (dq, dk, dv) of q's, k's, v's shapes, or (dq, dk, dv, delta, lse) when return_stats.

    Raises:
        TypeError, ValueError: tensors of the wrong type, dtype, shape or device; bad options (named).
    """
    _check_bwd_inputs(q, k, v, o, do, m, l)
    block_m = check_block("block_m", block_m, 16, " (tl.dot needs >= 16)")
    block_n = check_block("block_n", block_n, 16, " (tl.dot needs >= 16)")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    qk_scale, grad_dtype, _, _, precision = check_options(q, scale, grad_dtype, None, input_precision)
    sm_scale = float(np.float32(1.0 / np.sqrt(q.shape[-1]) if scale is None else scale))

    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    group = kv_group(heads, kv_heads)
    dq = torch.empty(q.shape, dtype=grad_dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=grad_dtype, device=q.device)
    dv = torch.empty(v.shape, dtype=grad_dtype, device=q.device)
    delta = torch.empty((batch, heads, seq_q), dtype=torch.float32, device=q.device)
    lse = torch.empty((batch, heads, seq_q), dtype=torch.float32, device=q.device)
    m, l = m.contiguous(), l.contiguous()  # noqa: E741
    if batch * heads == 0:
        return (dq, dk, dv, delta, lse) if return_stats else (dq, dk, dv)
    if seq_q == 0:
        dk.zero_()
        dv.zero_()
        return (dq, dk, dv, delta, lse) if return_stats else (dq, dk, dv)

    grid_m = (triton.cdiv(seq_q, block_m), batch * heads)
    _attn_bwd_preprocess[grid_m](
        o,
        do,
        m,
        l,
        delta,
        lse,
        *strides(o, do),
        heads,
        seq_q,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )
    common = strides(q, k, v, do)
    meta = dict(
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        IS_CAUSAL=bool(causal),
        INPUT_PRECISION=precision,
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )
    _attn_bwd_dkdv[(triton.cdiv(seq_k, block_n), batch * kv_heads)](
        q,
        k,
        v,
        do,
        lse,
        delta,
        dk,
        dv,
        qk_scale,
        sm_scale,
        *common,
        *strides(dk),
        heads,
        group,
        seq_q,
        seq_k,
        **meta,
    )
    _attn_bwd_dq[grid_m](
        q,
        k,
        v,
        do,
        lse,
        delta,
        dq,
        qk_scale,
        sm_scale,
        *common,
        *strides(dq),
        heads,
        group,
        seq_q,
        seq_k,
        **meta,
    )
    return (dq, dk, dv, delta, lse) if return_stats else (dq, dk, dv)


# ----------------------------------------------------------------------------------------------------
# autograd
# ----------------------------------------------------------------------------------------------------


class FlashAttentionFunction(torch.autograd.Function):
    """The forward kernel paired with the backward kernels: ``FlashAttentionFunction.apply(q, k, v, causal,
    scale, block_m, block_n, bwd_block_m, bwd_block_n)``. The output is in the input dtype; the gradients too."""

    @staticmethod
    def forward(
        ctx,
        q,
        k,
        v,
        causal=False,
        scale=None,
        block_m=64,
        block_n=64,
        bwd_block_m=64,  # noqa: D102
        bwd_block_n=64,
    ):
        o, m, l = flash_attention(  # noqa: E741
            q,
            k,
            v,
            causal=causal,
            scale=scale,
            block_m=block_m,  # noqa: E741
            block_n=block_n,
            return_stats=True,
        )
        ctx.save_for_backward(q, k, v, o, m, l)
        ctx.opts = dict(causal=causal, scale=scale, block_m=bwd_block_m, block_n=bwd_block_n)
        return o

    @staticmethod
    def backward(ctx, do):  # noqa: D102
        q, k, v, o, m, l = ctx.saved_tensors  # noqa: E741
        dq, dk, dv = flash_attention_backward(q, k, v, o, do.to(q.dtype).contiguous(), m, l, **ctx.opts)
        return dq, dk, dv, None, None, None, None, None, None


def flash_attention_grad(q, k, v, *, causal=False, scale=None, block_m=64, block_n=64, bwd_block_m=64, bwd_block_n=64):
    """Flash attention with autograd: the Triton forward, and the Triton backward for ``.backward()``.

    Args:
        q, k, v: as :func:`simfloat_gpu.kernels.flash_attention.flash_attention` (fp16, bf16 or fp32).
        causal, scale, block_m, block_n: the forward's options; bwd_block_m, bwd_block_n: the backward's tiles.

    Returns:
        (batch, heads, seq_q, head_dim) output in the input dtype, differentiable in q, k, v.
    """
    return FlashAttentionFunction.apply(q, k, v, causal, scale, block_m, block_n, bwd_block_m, bwd_block_n)
