"""FP8 forward flash attention in Triton (FlashAttention-3 style scaling), written so that simfloat can
mirror it op by op.

Layout, tiling, masking and the online softmax are those of :mod:`simfloat_gpu.kernels.flash_attention` and
:mod:`simfloat_gpu.kernels.int8_attention`: q (batch, heads, seq_q, head_dim), k, v (batch, kv_heads, seq_k, head_dim)
(query
head h reads kv head h // (heads // kv_heads); k, v quantized per kv head), any lengths, one program per
(BLOCK_M query rows, batch*head), key tiles of BLOCK_N, top-left causal mask.

Formats: fmt="e4m3" -> torch.float8_e4m3fn / tl.float8e4nv (largest finite FP8_MAX = 448);
fmt="e5m2" -> torch.float8_e5m2 / tl.float8e5 (FP8_MAX = 57344). Q, K, V and P all use fmt.

Notation: every value is fp32 unless said otherwise; "rn" = round to nearest, ties to even;
div_rn = correctly rounded fp32 division; fma = one rounding; ``in`` = input dtype (fp16/bf16/fp32).

Quantization (Triton kernel simfloat_gpu.kernels.int8_attention._quantize_groups_kernel; quantize_fp8):
  A group is G consecutive tokens x all of head_dim of one (batch, head):
    scaling="per-tensor": G = seq, one scale per (batch, head) (FA3's descale granularity);
    scaling="per-block":  G = block_m for Q and G = block_n for K and V, i.e. one scale per BLOCK_M x d
                          tile of Q and per BLOCK_N x d tile of K / V, exactly the kernel's tiles.
  F1. x = fp32(x_in); amax = max over the group of |x|       exact.
  F2. scale = div_rn(amax, FP8_MAX); if amax == 0: scale = 1.0.
  F3. y = div_rn(x, scale); y = min(max(y, -FP8_MAX), FP8_MAX)  (so saturation never depends on the
      cast's overflow behaviour).
  F4. x_fp8 = fp8(y)   rn cast (Triton's default fp downcast rounding, RTNE; GPU cvt.rn.satfinite).
  Torch equivalent (where the cast is correctly rounded, as on a GPU or in torch):
      scale = where(amax == 0, 1, amax / FP8_MAX); x_fp8 = (x32 / scale).clamp(-M, M).to(float8)

Host, once per call:
  H1. qk_scale = rn32(rn32(sm_scale) * rn32(1.44269504)), sm_scale default 1/sqrt(head_dim).

Kernel, per program (rows offs_m = start_m*BLOCK_M + [0, BLOCK_M)):
  K1. q = load(Q) fp8 (rows >= seq_q read as 0); q_s = QS[b, h, start_m] (per-block) or QS[b, h, 0].
  K2. qs_scale = qk_scale * q_s           rn, once per program.
      m_i = -inf, l_i = 0, acc = 0 (BLOCK_M x HEAD_DIM).
  Per key tile n0 = 0, BLOCK_N, ... < hi   (hi = seq_k, or min(seq_k, (start_m+1)*BLOCK_M) if causal):
  T1. k (HEAD_DIM x BLOCK_N), v (BLOCK_N x HEAD_DIM) fp8, keys >= seq_k read as 0;
      k_s = KS[b, h, n0 / BLOCK_N], v_s = VS[b, h, n0 / BLOCK_N] (per-block) or index 0 (per-tensor).
  T2. s_scale = qs_scale * k_s            rn (FA3: softmax_scale_log2 * q_descale * k_descale).
  T3. s = tl.dot(q, k)                    fp8 x fp8 -> fp32 (products exact; accumulation: see notes).
  T4. s = where(valid, s, -inf)           valid = key < seq_k [and key <= query if causal].
  T5. m_ij = maximum(m_i, max(s, axis=1) * s_scale)   one rn multiply of the exact row max.
  T6. m_sub = where(m_ij == -inf, 0, m_ij)
  T7. s = fma(s, s_scale, -m_sub)         one rounding.
  T8. p = exp2(s);  l_ij = sum(p, axis=1) fp32 (row sum of the unquantized P, as FA3).
  T9. alpha = exp2(m_i - m_sub);  l_i = fma(l_i, alpha, l_ij);  acc = acc * alpha[:, None] (rn).
  T10. p8 = fp8(p)                        rn cast of p in [0, 1], no scaling (FA3: P cast directly).
  T11. per-tensor: acc = tl.dot(p8, v, acc)   fp32 accumulation into acc (MMA);
       per-block:  pv = tl.dot(p8, v) (fp32); acc = fma(pv, v_s, acc)   one rounding.
  T12. m_i = m_ij
  Epilogue:
  E1. per-tensor only: acc = acc * v_s   rn (V's descale applied once, after the loop, as FA3).
  E2. l_safe = where(l_i == 0, 1, l_i); out = div_rn(acc, l_safe); out = fp16(out) (rn), stored;
      m_i (log2 units) and l_i stored as fp32 stats.

Notes:
  * GPU accumulation of fp8 dots: on sm_90 Triton's default max_num_imprecise_acc for fp8 x fp8 dots is
    2**30, i.e. the wgmma's reduced-precision accumulator is never promoted to full fp32 inside one
    tl.dot (K = HEAD_DIM for T3, BLOCK_N for T11); an emulator must model that for bit-exactness.
  * Stock interpreter (TRITON_INTERPRET=1): fp8 dots run (operands are decoded to fp16, then an fp32
    matmul), but its fp32 -> fp8 casts (F4, T10) are not correctly rounded (ties away from zero, a
    mantissa carry can be dropped, subnormals truncated; see tests/gpu/test_gpu_stock_interpreter.py), so
    CPU results differ from a GPU's; a faithful interpreter is needed for bit-exact CPU runs.
  * Quantized V is stored seq-contiguous (a transposed view) so that the P @ V operand is K-major, which
    Hopper's fp8 wgmma requires; layout does not change any value.
  * Launch configuration is fixed (num_warps=NUM_WARPS).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from simfloat_gpu.kernels.common import (
    FLOAT_DTYPES,
    LOG2E,
    check_choice,
    check_qkv_tensors,
    init_state,
    key_limit,
    normalize_and_store,
    output_buffers,
    strides,
    tile_heads,
)
from simfloat_gpu.kernels.int8_attention import (
    check_common_options,
    check_kernel_device,
    check_quantized_shapes,
    empty_kmajor,
    quantize_groups,
)

__all__ = ["fp8_attention", "quantize_fp8", "FP8_FORMATS", "LOG2E", "NUM_WARPS"]

#: fmt -> (torch dtype, largest finite value)
FP8_FORMATS = {
    "e4m3": (torch.float8_e4m3fn, 448.0),
    "e5m2": (torch.float8_e5m2, 57344.0),
}
#: Fixed launch width: the GPU reduction / MMA order depends on it.
NUM_WARPS = 4

_SCALINGS = ("per-tensor", "per-block")


# ----------------------------------------------------------------------------------------------------
# jit helpers
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _fp8_softmax_tile(acc, l_i, m_i, q, k, v, v_scale, valid, s_scale, V_SCALE_PER_TILE: tl.constexpr):
    """One key tile of the online softmax: steps T3..T12 of the module docstring."""
    # T3, T4
    s = tl.dot(q, k)
    s = tl.where(valid, s, float("-inf"))
    # T5..T7
    m_ij = tl.maximum(m_i, tl.max(s, 1) * s_scale)
    m_sub = tl.where(m_ij == float("-inf"), 0.0, m_ij)
    s = tl.fma(s, s_scale, -m_sub[:, None])
    # T8, T9
    p = tl.math.exp2(s)
    l_ij = tl.sum(p, 1)
    alpha = tl.math.exp2(m_i - m_sub)
    l_i = tl.fma(l_i, alpha, l_ij)
    acc = acc * alpha[:, None]
    # T10, T11: P cast straight to fp8 (it lies in [0, 1])
    p8 = p.to(v.dtype)
    if V_SCALE_PER_TILE:
        pv = tl.dot(p8, v)
        acc = tl.fma(pv, v_scale, acc)
    else:
        acc = tl.dot(p8, v, acc)
    # T12
    return acc, l_i, m_ij


@triton.jit
def _fp8_attn_inner(
    acc,
    l_i,
    m_i,
    q,
    qs_scale,
    k_base,
    v_base,
    ks_base,
    vs_base,
    stride_kn,
    stride_kk,
    stride_vk,
    stride_vn,
    stride_ksb,
    stride_vsb,
    offs_m,
    offs_d,
    N_CTX_K,
    hi,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    V_SCALE_PER_TILE: tl.constexpr,
):
    """Walk the key tiles [0, hi) left to right: T1, T2 and the loop around _fp8_softmax_tile."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        key_ok = offs_n < N_CTX_K
        # T1 (the block-scale strides are 0 for per-tensor scaling)
        k = tl.load(k_base + offs_d[:, None] * stride_kk + offs_n[None, :] * stride_kn, mask=key_ok[None, :], other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vk + offs_d[None, :] * stride_vn, mask=key_ok[:, None], other=0.0)
        tile = start_n // BLOCK_N
        k_scale = tl.load(ks_base + tile * stride_ksb)
        v_scale = tl.load(vs_base + tile * stride_vsb)
        # T2
        s_scale = qs_scale * k_scale
        valid = key_ok[None, :]
        if IS_CAUSAL:
            valid = valid & (offs_m[:, None] >= offs_n[None, :])
        acc, l_i, m_i = _fp8_softmax_tile(acc, l_i, m_i, q, k, v, v_scale, valid, s_scale, V_SCALE_PER_TILE)
    return acc, l_i, m_i


# ----------------------------------------------------------------------------------------------------
# kernel
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _fp8_attn_fwd(
    Q,
    K,
    V,
    QS,
    KS,
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
    stride_qsz,
    stride_qsh,
    stride_qsb,
    stride_ksz,
    stride_ksh,
    stride_ksb,
    stride_vsz,
    stride_vsh,
    stride_vsb,
    stride_oz,
    stride_oh,
    stride_om,
    stride_on,
    H,
    GROUP,
    N_CTX_Q,
    N_CTX_K,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    PER_BLOCK: tl.constexpr,
):
    start_m, off_hz, off_z, off_h, off_hkv = tile_heads(H, GROUP)

    q_base = Q + off_z * stride_qz + off_h * stride_qh
    k_base = K + off_z * stride_kz + off_hkv * stride_kh
    v_base = V + off_z * stride_vz + off_hkv * stride_vh
    ks_base = KS + off_z * stride_ksz + off_hkv * stride_ksh
    vs_base = VS + off_z * stride_vsz + off_hkv * stride_vsh
    o_base = Out + off_z * stride_oz + off_h * stride_oh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_CTX_Q

    # K1, K2
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk, mask=row_ok[:, None], other=0.0)
    q_scale = tl.load(QS + off_z * stride_qsz + off_h * stride_qsh + start_m * stride_qsb)
    qs_scale = qk_scale * q_scale
    m_i, l_i, acc = init_state(BLOCK_M, HEAD_DIM)

    hi = key_limit(start_m, N_CTX_K, BLOCK_M, IS_CAUSAL)
    acc, l_i, m_i = _fp8_attn_inner(
        acc,
        l_i,
        m_i,
        q,
        qs_scale,
        k_base,
        v_base,
        ks_base,
        vs_base,
        stride_kn,
        stride_kk,
        stride_vk,
        stride_vn,
        stride_ksb,
        stride_vsb,
        offs_m,
        offs_d,
        N_CTX_K,
        hi,
        BLOCK_N,
        IS_CAUSAL,
        PER_BLOCK,
    )

    # E1: per-tensor V descale, once
    if not PER_BLOCK:
        acc = acc * tl.load(vs_base)
    # E2
    o_ptrs = o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_on
    normalize_and_store(acc, l_i, m_i, o_ptrs, M, L, off_hz, offs_m, row_ok, N_CTX_Q)


# ----------------------------------------------------------------------------------------------------
# launcher
# ----------------------------------------------------------------------------------------------------


def _check_fmt(fmt, device):
    check_choice("fmt", fmt, tuple(FP8_FORMATS))
    if device.type == "cuda" and fmt == "e4m3":
        cap = torch.cuda.get_device_capability(device)
        if cap < (8, 9):
            raise ValueError(
                f"fmt='e4m3' (float8e4nv) needs compute capability >= 8.9, the device has {cap[0]}.{cap[1]}"
            )
    return FP8_FORMATS[fmt]


def quantize_fp8(x, *, fmt="e4m3", group=None, kmajor=False):
    """Scaled FP8 quantization of a 4-D (batch, heads, seq, d) tensor: steps F1..F4 of the module doc.

    Args:
        x: float16 / bfloat16 / float32 (batch, heads, seq, d), on CUDA (or CPU under TRITON_INTERPRET=1).
        fmt: "e4m3" or "e5m2".
        group: tokens per scale (one scale per group x d tile); None = the whole sequence ("per-tensor",
            one scale per (batch, head)).
        kmajor: store the result seq-contiguous (a transposed view; values are identical).

    Returns:
        (x_fp8, scale): x_fp8 of x's shape in the fp8 dtype, scale fp32 (batch, heads, cdiv(seq, group))
        (last dimension 1 for per-tensor), with x ~= x_fp8 * scale of the token's group.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; supported: float16, bfloat16, float32")
    if x.dim() != 4:
        raise ValueError(f"x must be 4-D (batch, heads, seq, d), got shape {tuple(x.shape)}")
    check_kernel_device([x], "x", "simfloat_gpu.kernels.fp8_attention")
    dtype, fp8_max = _check_fmt(fmt, x.device)
    seq = x.shape[2]
    if group is None:
        group = max(seq, 1)
    elif isinstance(group, bool) or not isinstance(group, int):
        raise TypeError(f"group must be None or an int, got {type(group).__name__}")
    elif group < 1:
        raise ValueError(f"group must be >= 1, got {group}")
    out = empty_kmajor(x.shape, dtype, x.device) if kmajor else torch.empty(x.shape, dtype=dtype, device=x.device)
    scale = quantize_groups(x, out, group, fp8_max, False)
    return out, scale


def fp8_attention(
    q,
    k,
    v,
    *,
    fmt="e4m3",
    scaling="per-tensor",
    block_m=64,
    block_n=64,
    causal=False,
    sm_scale=None,
    return_stats=False,
):
    """softmax(sm_scale * q @ k^T [causal mask]) @ v with FP8 Q, K, V and P (FlashAttention-3 style).

    Args:
        q: (batch, heads, seq_q, head_dim); k, v: (batch, kv_heads, seq_k, head_dim), heads a multiple of
            kv_heads (query head h reads kv head h // (heads // kv_heads)). float16, bfloat16 or float32, all
            the same dtype and device; head_dim a power of two in [32, 256]; seq_k >= 1.
        fmt: "e4m3" (float8_e4m3fn) or "e5m2" (float8_e5m2); used for Q, K, V and P.
        scaling: "per-tensor" (one scale per (batch, head) and tensor) or "per-block" (one scale per
            block_m x head_dim tile of Q and per block_n x head_dim tile of K and V).
        block_m: power of two in [16, 256]; block_n: power of two in [32, 256].
        causal: top-left aligned causal mask (query i attends keys j <= i).
        sm_scale: softmax scale > 0, default 1/sqrt(head_dim).
        return_stats: also return (m, l), fp32 (batch, heads, seq_q): running maximum in log2 units and
            the softmax denominator relative to it.

    Returns:
        out, float16 (batch, heads, seq_q, head_dim), or (out, m, l) when return_stats.
    """
    check_qkv_tensors(q, k, v)
    check_kernel_device([q, k, v], "q, k, v", "simfloat_gpu.kernels.fp8_attention")
    check_quantized_shapes(q, k, v)
    block_m, block_n, causal, qk_scale = check_common_options(q, sm_scale, block_m, block_n, causal, return_stats)
    _check_fmt(fmt, q.device)
    per_block = check_choice("scaling", scaling, _SCALINGS) == "per-block"

    q8, qs = quantize_fp8(q, fmt=fmt, group=block_m if per_block else None)
    k8, ks = quantize_fp8(k, fmt=fmt, group=block_n if per_block else None)
    v8, vs = quantize_fp8(v, fmt=fmt, group=block_n if per_block else None, kmajor=True)

    batch, heads, seq_q, head_dim = q.shape
    seq_k = k.shape[2]
    out, m, l, work = output_buffers(q, torch.float16)  # noqa: E741
    if work:
        block_stride = (lambda s: s.stride(2)) if per_block else (lambda s: 0)
        grid = (triton.cdiv(seq_q, block_m), batch * heads)
        _fp8_attn_fwd[grid](
            q8,
            k8,
            v8,
            qs,
            ks,
            vs,
            out,
            m,
            l,
            qk_scale,
            *strides(q8, k8, v8),
            qs.stride(0),
            qs.stride(1),
            block_stride(qs),
            ks.stride(0),
            ks.stride(1),
            block_stride(ks),
            vs.stride(0),
            vs.stride(1),
            block_stride(vs),
            *strides(out),
            heads,
            heads // k.shape[1],
            seq_q,
            seq_k,
            HEAD_DIM=head_dim,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            IS_CAUSAL=causal,
            PER_BLOCK=per_block,
            num_warps=NUM_WARPS,
        )
    return (out, m, l) if return_stats else out
