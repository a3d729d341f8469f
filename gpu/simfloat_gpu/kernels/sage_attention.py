"""SageAttention2-style forward attention in Triton (INT8 QK^T with K smoothing, FP8 P.V with two-level
accumulation), written so that simfloat can mirror it op by op: ``simfloat.attention.quant_flash`` with the
``sage2-int8-fp8`` plan.

Layout, tiling, masking and the online softmax are those of :mod:`simfloat_gpu.kernels.int8_attention`:
q (batch, heads, seq_q, head_dim), k, v (batch, kv_heads, seq_k, head_dim) (query head h reads kv head
h // (heads // kv_heads)), any lengths, one program per (BLOCK_M query rows, batch*head), key tiles of
BLOCK_N, top-left causal mask. Notation as there: fp32 unless said, rn = round to nearest even, div_rn =
correctly rounded division, fma = one rounding.

Quantization (host launcher; the INT8 / FP8 group kernel of int8_attention, steps Q1..Q6 / F1..F4 there):
  S1. k = fp32(k_in) - km                  rn fp32 subtraction (torch); km fp32 (batch, kv_heads, 1, head_dim)
      the mean key, given by the caller (SageAttention's ``km``; simfloat.attention.mean_key computes the
      emulator's), or None (no smoothing).
  S2. Q INT8, one scale per WARP_Q = 32 consecutive tokens (per warp); K INT8, one scale per BLOCK_N key tile
      (per block); scale = div_rn(amax, 127) (1 for an all-zero group), code = clamp(rint(div_rn(x, scale))).
  S3. V e4m3, one scale per channel over the sequence: scale = div_rn(amax, 448), code =
      fp8(clamp(div_rn(v, scale), +-448)).

Host, once per call:
  H1. qk_scale = rn32(rn32(sm_scale) * rn32(1.44269504)).

Kernel, per program:
  K1. q int8 and the per-row scales (each row's warp scale), rows >= seq_q read as 0; v_scale per channel.
      m_i = -inf, l_i = 0, acc = 0.
  Per key tile (hi = seq_k, or min(seq_k, (start_m+1)*BLOCK_M) if causal):
  T1. k (HEAD_DIM x BLOCK_N) int8 and its per-key scales, v (BLOCK_N x HEAD_DIM) e4m3; keys >= seq_k read 0.
  T2. s = fp32(tl.dot(q, k))              int8 x int8 -> int32, exact.
  T3. s = s * q_scale[:, None]; s = s * k_scale[None, :]   two roundings, in this order.
  T4. s = where(valid, s, -inf).
  T5. m_ij = maximum(m_i, max(s, 1) * qk_scale); m_sub = where(m_ij == -inf, 0, m_ij).
  T6. s = fma(s, qk_scale, -m_sub); p = exp2(s); alpha = exp2(m_i - m_sub).
  T7. l_ij = sum(p, 1) (the unquantized P); l_i = fma(l_i, alpha, l_ij).
  T8. p8 = fp8(min(max(p * 448, -448), 448))   P's fixed scale 1/448: rn multiply, rn cast to e4m3.
  T9. pv = tl.dot(p8, v)                  a fresh fp32 result per key tile (fp8 MMA: the sm90 model).
  T10. acc = fma(acc, alpha[:, None], pv)  the second level: fp32, one rounding.
  T11. m_i = m_ij
  Epilogue:
  E1. acc = acc * v_scale[None, :] (rn); acc = div_rn(acc, 448.0)   V's and P's scales, once.
  E2. out = div_rn(acc, where(l_i == 0, 1, l_i)); out = fp16(out) (rn); m_i, l_i stored as fp32 stats.

Notes:
  * SageAttention folds P's 448 into the exponent (exp2(s + log2 448)) and its row sum; this kernel
    multiplies instead (T8), the plan's p_quant op.
  * Per-channel V quantization runs the group kernel on the transposed view (one "token" = one channel of
    all seq_k keys): fine for validation lengths, not tuned for long sequences.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from simfloat_gpu.kernels.common import (
    FLOAT_DTYPES,
    LOG2E,
    init_state,
    key_limit,
    normalize_and_store,
    output_buffers,
    tile_heads,
)
from simfloat_gpu.kernels.int8_attention import (
    INT8_MAX,
    check_common_options,
    check_kernel_device,
    check_quantized_shapes,
    empty_kmajor,
    quantize_groups,
)

__all__ = ["FP8_MAX", "LOG2E", "NUM_WARPS", "WARP_Q", "quantize_sage", "sage_attention"]

#: e4m3's largest finite value: V's per-channel code range and P's fixed scale.
FP8_MAX = 448.0
#: Query rows that share one INT8 scale (one warp's rows).
WARP_Q = 32
#: Fixed launch width: the GPU reduction / MMA order depends on it.
NUM_WARPS = 4


@triton.jit
def _sage_tile(acc, l_i, m_i, q, q_scale, k, k_scale, v, valid, qk_scale):
    """One key tile: steps T2..T11 of the module docstring."""
    # T2, T3
    s = tl.dot(q, k).to(tl.float32)
    s = s * q_scale[:, None]
    s = s * k_scale[None, :]
    # T4..T6
    s = tl.where(valid, s, float("-inf"))
    m_ij = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    m_sub = tl.where(m_ij == float("-inf"), 0.0, m_ij)
    s = tl.fma(s, qk_scale, -m_sub[:, None])
    p = tl.math.exp2(s)
    alpha = tl.math.exp2(m_i - m_sub)
    # T7
    l_ij = tl.sum(p, 1)
    l_i = tl.fma(l_i, alpha, l_ij)
    # T8..T10
    p8 = tl.minimum(tl.maximum(p * 448.0, -448.0), 448.0).to(tl.float8e4nv)
    pv = tl.dot(p8, v)
    acc = tl.fma(acc, alpha[:, None], pv)
    return acc, l_i, m_ij


@triton.jit
def _sage_attn_fwd(
    Q,
    QS,
    K,
    KS,
    V,
    VS,
    Out,
    M,
    L,
    qk_scale,
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
    stride_vk,
    stride_vn,
    stride_oz,
    stride_oh,
    stride_om,
    stride_on,
    H,
    H_KV,
    GROUP,
    N_CTX_Q,
    N_CTX_K,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
):
    """QS: fp32 (batch*heads, seq_q) per-row scales; KS: (batch*kv_heads, seq_k) per-key scales; VS:
    (batch*kv_heads, HEAD_DIM) per-channel scales (contiguous)."""
    start_m, off_hz, off_z, off_h, off_hkv = tile_heads(H, GROUP)
    kv_row = off_z * H_KV + off_hkv

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n0 = tl.arange(0, BLOCK_N)
    row_ok = offs_m < N_CTX_Q
    k_base = K + off_z * stride_kz + off_hkv * stride_kh
    v_base = V + off_z * stride_vz + off_hkv * stride_vh
    # K1
    q = tl.load(
        Q + off_z * stride_qz + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk,
        mask=row_ok[:, None],
        other=0,
    )
    q_scale = tl.load(QS + off_hz.to(tl.int64) * N_CTX_Q + offs_m, mask=row_ok, other=0.0)
    v_scale = tl.load(VS + kv_row * HEAD_DIM + offs_d)
    m_i, l_i, acc = init_state(BLOCK_M, HEAD_DIM)
    hi = key_limit(start_m, N_CTX_K, BLOCK_M, IS_CAUSAL)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        key_ok = offs_n < N_CTX_K
        # T1
        k = tl.load(k_base + offs_d[:, None] * stride_kk + offs_n[None, :] * stride_kn, mask=key_ok[None, :], other=0)
        k_scale = tl.load(KS + kv_row * N_CTX_K + offs_n, mask=key_ok, other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vk + offs_d[None, :] * stride_vn, mask=key_ok[:, None], other=0.0)
        valid = key_ok[None, :]
        if IS_CAUSAL:
            valid = valid & (offs_m[:, None] >= offs_n[None, :])
        acc, l_i, m_i = _sage_tile(acc, l_i, m_i, q, q_scale, k, k_scale, v, valid, qk_scale)
    # E1, E2
    acc = acc * v_scale[None, :]
    acc = tl.math.div_rn(acc, 448.0)
    o_ptrs = Out + off_z * stride_oz + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_on
    normalize_and_store(acc, l_i, m_i, o_ptrs, M, L, off_hz, offs_m, row_ok, N_CTX_Q)


def _per_token(scales, group: int, seq: int):
    """(b, h, n_groups) group scales -> (b, h, seq) per-token scales."""
    return scales.repeat_interleave(group, dim=2)[:, :, :seq].contiguous()


def quantize_sage(q, k, v, *, block_n: int = 64, km=None):
    """Steps S1..S3: the quantized operands and their scales.

    Args:
        q: (batch, heads, seq_q, head_dim); k, v: (batch, kv_heads, seq_k, head_dim); float16/bfloat16/float32.
        block_n: the key tile (K's scale group).
        km: fp32 (batch, kv_heads, 1, head_dim) mean key to subtract from k first, or None.

    Returns:
        (q8, qs, k8, ks, v8, vs): int8 q and k, e4m3 v (seq-contiguous), fp32 per-row q scales (batch, heads,
        seq_q), per-key k scales (batch, kv_heads, seq_k), per-channel v scales (batch, kv_heads, head_dim).
    """
    if km is not None:
        if not isinstance(km, torch.Tensor) or km.dtype != torch.float32:
            raise TypeError("km must be a float32 torch.Tensor of shape (batch, kv_heads, 1, head_dim) or None")
        want = (k.shape[0], k.shape[1], 1, k.shape[3])
        if tuple(km.shape) != want:
            raise ValueError(f"km must have shape {want}, got {tuple(km.shape)}")
        k = k.float() - km  # S1
    q8 = torch.empty(q.shape, dtype=torch.int8, device=q.device)
    qs = _per_token(quantize_groups(q, q8, WARP_Q, INT8_MAX, True), WARP_Q, q.shape[2])
    k8 = torch.empty(k.shape, dtype=torch.int8, device=k.device)
    ks = _per_token(quantize_groups(k, k8, block_n, INT8_MAX, True), block_n, k.shape[2])
    v8 = empty_kmajor(v.shape, torch.float8_e4m3fn, v.device)
    vt = v.transpose(2, 3)  # (b, h, d, s): one channel per "token"
    vs = quantize_groups(vt, v8.transpose(2, 3), 1, FP8_MAX, False).contiguous()
    return q8, qs, k8, ks, v8, vs


def sage_attention(q, k, v, *, km=None, block_m=64, block_n=64, causal=False, sm_scale=None, return_stats=False):
    """softmax(sm_scale * q @ k^T [causal mask]) @ v, SageAttention2 style (module docstring S1..E2).

    Args:
        q: (batch, heads, seq_q, head_dim); k, v: (batch, kv_heads, seq_k, head_dim), heads a multiple of
            kv_heads; float16, bfloat16 or float32, one dtype and device; head_dim a power of two in
            [32, 256]; seq_k >= 1.
        km: fp32 (batch, kv_heads, 1, head_dim) mean key (K smoothing) or None.
        block_m: query tile, power of two in [16, 256]; block_n: key tile, power of two in [32, 256].
        causal: top-left aligned causal mask.
        sm_scale: softmax scale > 0, default 1/sqrt(head_dim).
        return_stats: also return m (log2 units) and l, fp32 (batch, heads, seq_q).

    Returns:
        out float16 (batch, heads, seq_q, head_dim), or (out, m, l).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seq, head_dim), got shape {tuple(t.shape)}")
        if t.dtype not in FLOAT_DTYPES or t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}; q, k, v must share one of float16, bfloat16, float32")
    check_kernel_device([q, k, v] + ([km] if isinstance(km, torch.Tensor) else []), "q, k, v, km",
                  "simfloat_gpu.kernels.sage_attention")  # fmt: skip
    check_quantized_shapes(q, k, v)
    block_m, block_n, causal, qk_scale = check_common_options(q, sm_scale, block_m, block_n, causal, return_stats)
    q8, qs, k8, ks, v8, vs = quantize_sage(q, k, v, block_n=block_n, km=km)
    batch, heads, seq_q, d = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    out, m, l, work = output_buffers(q, torch.float16)  # noqa: E741
    if work:
        _sage_attn_fwd[(triton.cdiv(seq_q, block_m), batch * heads)](
            q8,
            qs,
            k8,
            ks,
            v8,
            vs,
            out,
            m,
            l,
            qk_scale,
            *q8.stride(),
            *k8.stride(),
            *v8.stride(),
            *out.stride(),
            heads,
            kv_heads,
            heads // kv_heads,
            seq_q,
            seq_k,
            HEAD_DIM=d,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            IS_CAUSAL=causal,
            num_warps=NUM_WARPS,
        )
    return (out, m, l) if return_stats else out
