"""INT8 forward flash attention in Triton (the INT-FlashAttention scheme, Chen et al. 2024), written so that
simfloat can mirror it op by op.

Layout as in :mod:`simfloat_gpu.kernels.flash_attention`: ``q`` is (batch, heads, seq_q, head_dim), ``k`` and ``v`` are
(batch, kv_heads, seq_k, head_dim), query head h reading kv head h // (heads // kv_heads) (grouped-query
attention; k, v and their scales are quantized per kv head); seq_q and seq_k may differ and need not be
multiples of the block sizes.
One program handles BLOCK_M query rows of one (batch, head) and walks the keys in tiles of BLOCK_N.

Two variants:
  * "int8" (INT-FlashAttention "full INT8"): Q, K per-token INT8, V per-(batch, head) INT8, P INT8 with
    the fixed scale 1/127; both matmuls are INT8 x INT8 -> INT32.
  * "half-int8": Q, K per-token INT8 as above; V and P fp16, P @ V in fp16 with fp32 accumulation.

Notation: every value is fp32 unless said otherwise; "rn" = round to nearest, ties to even;
div_rn(a, b) = correctly rounded fp32 division (tl.math.div_rn; Triton's plain ``/`` is the approximate
div.full.f32 on NVIDIA GPUs, which is why it is never used); fma(a, b, c) = a*b + c rounded once
(tl.fma). ``in`` is the input dtype (fp16, bf16 or fp32).

Quantization (Triton kernels, run on the device; quantize_per_token / quantize_per_tensor)
  A group is one token row (per-token: Q and K, one scale per (batch, head, token)) or the whole
  seq x head_dim matrix of one (batch, head) ("per-tensor": V, one scale per (batch, head)).
  Q1. x = fp32(x_in)                                exact for fp16/bf16/fp32.
  Q2. amax = max over the group of |x|              exact (order irrelevant).
  Q3. scale = div_rn(amax, 127.0); if amax == 0: scale = 1.0   (an all-zero group quantizes to zeros
      and dequantizes to exactly 0; the stored scale is 1.0, never 0 or NaN).
  Q4. y = div_rn(x, scale)                          i.e. x / (max / 127), NOT x * (127 / max).
  Q5. r = rint(y)                                   round half to even (== torch.round), computed as
      (y + 1.5*2**23) - 1.5*2**23 in fp32, exact for |y| < 2**22.
  Q6. r = min(max(r, -127), 127); x_int8 = int8(r)  symmetric, -128 never used; exact cast.
  Torch equivalent, bit for bit (torch's fp32 division is correctly rounded):
      x32 = x.float(); amax = x32.abs().amax(-1)          # or over (-2, -1) for per-tensor
      scale = torch.where(amax == 0, 1.0, amax / 127)
      x_int8 = torch.round(x32 / scale[..., None]).clamp(-127, 127).to(torch.int8)
  Non-finite inputs are not supported (not checked: that would need a device sync).
  Half-int8 V: v_fp16 = v.to(torch.float16) on the host (rn; a no-op for fp16 inputs).

Host, once per call:
  H1. qk_scale = rn32(rn32(sm_scale) * rn32(1.44269504))   sm_scale defaults to 1/sqrt(head_dim) (in
      double); the reference computes exactly this product in-kernel (``qk_scale = sm_scale;
      qk_scale *= 1.44269504``).

Kernel, per program (rows offs_m = start_m*BLOCK_M + [0, BLOCK_M)):
  K1. q = load(Q) int8, q_scale = load(QS) per row; rows >= seq_q read as 0 (never stored).
      v_scale = load(VS[b, h]) (int8 variant).
  K2. m_i = -inf, l_i = 0, acc = 0 (BLOCK_M x HEAD_DIM).
  Per key tile n0 = 0, BLOCK_N, ... < hi   (hi = seq_k, or min(seq_k, (start_m+1)*BLOCK_M) if causal):
  T1. k (HEAD_DIM x BLOCK_N) int8, k_scale per key, v (BLOCK_N x HEAD_DIM) int8 or fp16; keys >= seq_k
      read as 0.
  T2. s = tl.dot(q, k)                  int8 x int8 -> int32, exact.
  T3. s = fp32(s)                       exact: |s| <= 127*127*256 < 2**24.
  T4. s = s * q_scale[:, None]          rn (row scale first) ...
  T5. s = s * k_scale[None, :]          ... then rn (column scale): two roundings, in this order.
  T6. s = where(valid, s, -inf)         valid = key < seq_k [and key <= query if causal]. Exact.
  T7. m_ij = maximum(m_i, max(s, axis=1) * qk_scale)   one rn multiply of the (exact) row max.
  T8. m_sub = where(m_ij == -inf, 0, m_ij)             finite guard (as flash_attention T5).
  T9. s = fma(s, qk_scale, -m_sub)      one rounding (the reference's ``qk * qk_scale - m_ij``, which the
      GPU compiler contracts to this fma). Masked: -inf.
  T10. p = exp2(s)                      fp32 tl.math.exp2 (GPU ex2.approx; stock interpreter numpy).
  T11. alpha = exp2(m_i - m_sub)        rn subtract, then exp2; m_i = -inf gives 0.
  "int8" variant:
    T12. p16 = fp16(p)                  rn.
    T13. t = fma16(p16, 127, 0.5)       ONE fp16 rounding (the reference's ``p * 127`` then ``+ 0.5`` in
         fp16, contracted by the GPU compiler; written as tl.fma so it does not depend on fp fusion).
         An unfused evaluation (rn16(rn16(p16*127) + 0.5)) can differ in rare near-integer cases.
    T14. p8 = int8(t)                   truncation toward zero; t in [0.5, 127.5] -> p8 in [0, 127].
    T15. l_ij = sum(p, axis=1)          row_sum="reference": fp32 reduction of the UNQUANTIZED p
         (GPU: layout-dependent tree; stock interpreter: numpy pairwise sum);
         l_ij = div_rn(fp32(sum_int32(p8, axis=1)), 127.0)   row_sum="consistent": the integer sum is
         exact and order independent, converted exactly, then one correctly rounded division.
    T16. l_i = fma(l_i, alpha, l_ij)    one rounding.
    T17. pv = fp32(tl.dot(p8, v))       int8 x int8 -> int32 exact, exact conversion (< 2**24).
    T18. pv = div_rn(pv * v_scale, 127.0)   rn multiply first, then correctly rounded division by 127
         (the reference's ``tmp * v_scale / 127``, left to right).
    T19. acc = fma(acc, alpha[:, None], pv)   one rounding (the reference's ``acc * alpha`` then
         ``acc + tmp``, contracted by the GPU compiler; explicit here).
  "half-int8" variant:
    T12. p16 = fp16(p)                  rn.
    T15. l_ij = sum(p, axis=1) (row_sum="reference") or sum(fp32(p16), axis=1) ("consistent"): fp32
         reductions as above.
    T16. l_i = fma(l_i, alpha, l_ij).
    T17. acc = acc * alpha[:, None]     rn.
    T18. acc = tl.dot(p16, v16, acc)    fp16 products exact, fp32 accumulation into acc (MMA order).
  T20. m_i = m_ij
  Epilogue:
  E1. l_safe = where(l_i == 0, 1, l_i); out = div_rn(acc, l_safe)   (reference: plain ``acc / l_i``).
  E2. out = fp16(out) (rn), stored; m_i (log2 units) and l_i stored as fp32 stats.

Differences from the released reference kernel, all deliberate:
  * any seq_q / seq_k (masking), seq_q != seq_k allowed; the reference needs seq % BLOCK == 0.
  * causal masking with -inf via where (T6) on every tile; the reference adds -1e6 on the diagonal
    tiles and there evaluates ``rn(rn(s * qk_scale) - m)`` (two roundings) instead of the fma of T9.
  * div_rn instead of the approximate ``/`` (T18, E1), explicit fmas (T9, T13, T16, T19).
  * l_i starts at 0 (the reference starts at 1.0, which the first alpha = 0 wipes out anyway).
  * scales are fp32 (the reference's host code documents fp16 scales).
  * "consistent" row sum (T15) is an option the reference does not have.

Notes for the emulator:
  * Key tiles a row cannot see are exact no-ops: p = 0 -> p8 = int8(0.5) = 0, l_ij = 0, alpha = 1, and
    acc, l_i keep their bits (T19: fma(acc, 1, 0) = acc). Causal masking is top-left aligned (query i
    sees keys j <= i), so key 0 is visible to every row and no row is ever fully masked.
  * Quantized V is stored seq-contiguous (a transposed view), so the P @ V operand is K-major for the
    tensor cores. Layout does not change any value.
  * Every fused multiply-add is an explicit tl.fma and every other multiply feeds no add, so results do
    not depend on Triton's fp-fusion setting (whose default triton 3.9 announces will change in 3.10).
  * Q5 uses the 1.5*2**23 trick because libdevice.rint does not run under the stock interpreter; on
    the GPU it compiles to an add and a subtract (no fast-math, so they are not folded away).
  * Launch configuration is fixed (num_warps=NUM_WARPS) because on GPU it changes MMA/reduction orders.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from simfloat_gpu.kernels.common import (
    FLOAT_DTYPES,
    LOG2E,
    check_attention_shapes,
    check_block,
    check_bool,
    check_choice,
    check_device,
    check_qkv_tensors,
    init_state,
    is_interpreted,
    key_limit,
    normalize_and_store,
    output_buffers,
    qk_scale_of,
    strides,
    tile_heads,
)

__all__ = [
    "quantize_per_token",
    "quantize_per_tensor",
    "int8_attention",
    "int8_attention_quantized",
    "LOG2E",
    "INT8_MAX",
    "NUM_WARPS",
    "check_common_options",
    "check_kernel_device",
    "check_quantized_shapes",
    "empty_kmajor",
    "quantize_groups",
]

#: Symmetric INT8 range: [-127, 127].
INT8_MAX = 127.0
#: Fixed launch width of the attention kernel: the GPU reduction / MMA order depends on it.
NUM_WARPS = 4

_VARIANTS = ("int8", "half-int8")
_ROW_SUMS = ("reference", "consistent")
#: 1.5 * 2**23: adding and subtracting it rounds an fp32 |y| < 2**22 to an integer, ties to even.
_RINT_MAGIC = 12582912.0


# ----------------------------------------------------------------------------------------------------
# jit helpers
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _scale_from_amax(amax, QMAX: tl.constexpr):
    """Q3: scale = div_rn(amax, QMAX), or 1.0 for an all-zero group."""
    return tl.where(amax == 0.0, 1.0, tl.math.div_rn(amax, QMAX))


@triton.jit
def _quantize_values(x, scale, QMAX: tl.constexpr, IS_INT: tl.constexpr):
    """Q4..Q6 up to the final cast: the fp32 value to store (integral for INT8, clamped to +-QMAX)."""
    y = tl.math.div_rn(x, scale)
    if IS_INT:
        y = (y + 12582912.0) - 12582912.0  # Q5: round half to even (|y| <= 127.x << 2**22)
    return tl.minimum(tl.maximum(y, -QMAX), QMAX)


@triton.jit
def _int8_softmax_tile(
    acc,
    l_i,
    m_i,
    q,
    q_scale,
    k,
    k_scale,
    v,
    v_scale,
    valid,
    qk_scale,
    FULL_INT8: tl.constexpr,
    ROW_SUM_QUANTIZED: tl.constexpr,
):
    """One key tile of the online softmax: steps T2..T20 of the module docstring."""
    # T2..T5: exact integer scores, dequantized row scale first, then column scale
    s = tl.dot(q, k).to(tl.float32)
    s = s * q_scale[:, None]
    s = s * k_scale[None, :]
    # T6..T9
    s = tl.where(valid, s, float("-inf"))
    m_ij = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    m_sub = tl.where(m_ij == float("-inf"), 0.0, m_ij)
    s = tl.fma(s, qk_scale, -m_sub[:, None])
    # T10, T11
    p = tl.math.exp2(s)
    alpha = tl.math.exp2(m_i - m_sub)
    p16 = p.to(tl.float16)
    if FULL_INT8:
        # T13, T14: P -> INT8 with the fixed scale 1/127 (round half up via +0.5 and truncation)
        p8 = tl.fma(p16, 127.0, 0.5).to(tl.int8)
        # T15, T16
        if ROW_SUM_QUANTIZED:
            l_ij = tl.math.div_rn(tl.sum(p8.to(tl.int32), 1).to(tl.float32), 127.0)
        else:
            l_ij = tl.sum(p, 1)
        l_i = tl.fma(l_i, alpha, l_ij)
        # T17..T19
        pv = tl.dot(p8, v).to(tl.float32)
        pv = tl.math.div_rn(pv * v_scale, 127.0)
        acc = tl.fma(acc, alpha[:, None], pv)
    else:
        if ROW_SUM_QUANTIZED:
            l_ij = tl.sum(p16.to(tl.float32), 1)
        else:
            l_ij = tl.sum(p, 1)
        l_i = tl.fma(l_i, alpha, l_ij)
        acc = acc * alpha[:, None]
        acc = tl.dot(p16, v, acc)
    # T20
    return acc, l_i, m_ij


@triton.jit
def _int8_attn_inner(
    acc,
    l_i,
    m_i,
    q,
    q_scale,
    v_scale,
    k_base,
    ks_base,
    v_base,
    stride_kn,
    stride_kk,
    stride_ksn,
    stride_vk,
    stride_vn,
    offs_m,
    offs_d,
    qk_scale,
    N_CTX_K,
    hi,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    FULL_INT8: tl.constexpr,
    ROW_SUM_QUANTIZED: tl.constexpr,
):
    """Walk the key tiles [0, hi) left to right: T1 and the loop around _int8_softmax_tile."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        key_ok = offs_n < N_CTX_K
        # T1: K^T tile (HEAD_DIM x BLOCK_N), per-key scales, V tile (BLOCK_N x HEAD_DIM); keys past the
        # end read as 0
        k = tl.load(k_base + offs_d[:, None] * stride_kk + offs_n[None, :] * stride_kn, mask=key_ok[None, :], other=0)
        k_scale = tl.load(ks_base + offs_n * stride_ksn, mask=key_ok, other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vk + offs_d[None, :] * stride_vn, mask=key_ok[:, None], other=0)
        valid = key_ok[None, :]
        if IS_CAUSAL:
            # top-left aligned: query i sees keys j <= i
            valid = valid & (offs_m[:, None] >= offs_n[None, :])
        acc, l_i, m_i = _int8_softmax_tile(
            acc, l_i, m_i, q, q_scale, k, k_scale, v, v_scale, valid, qk_scale, FULL_INT8, ROW_SUM_QUANTIZED
        )
    return acc, l_i, m_i


# ----------------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _quantize_per_token_kernel(
    X,
    XQ,
    S,
    stride_xm,
    stride_xk,
    stride_qm,
    stride_qk,
    stride_sm,
    N_ROWS,
    D,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Per-token symmetric INT8: BLOCK_R rows of a (N_ROWS, D) matrix per program (Q1..Q6)."""
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_r < N_ROWS)[:, None] & (offs_d < D)[None, :]
    offs_r64 = offs_r.to(tl.int64)
    # Q1, Q2 (padding reads 0, which never raises a maximum of absolute values)
    x = tl.load(X + offs_r64[:, None] * stride_xm + offs_d[None, :] * stride_xk, mask=mask, other=0.0)
    x = x.to(tl.float32)
    amax = tl.max(tl.abs(x), 1)
    # Q3..Q6
    scale = _scale_from_amax(amax, 127.0)
    y = _quantize_values(x, scale[:, None], 127.0, True)
    tl.store(XQ + offs_r64[:, None] * stride_qm + offs_d[None, :] * stride_qk, y.to(XQ.dtype.element_ty), mask=mask)
    tl.store(S + offs_r64 * stride_sm, scale, mask=offs_r < N_ROWS)


@triton.jit
def _quantize_groups_kernel(
    X,
    XQ,
    S,
    stride_xz,
    stride_xh,
    stride_xm,
    stride_xk,
    stride_qz,
    stride_qh,
    stride_qm,
    stride_qk,
    stride_sz,
    stride_sh,
    stride_sg,
    H,
    N_CTX,
    D,
    GROUP,
    QMAX: tl.constexpr,
    IS_INT: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One scale per GROUP consecutive tokens (x all of head_dim) of one (batch, head): Q1..Q6.

    GROUP = seq gives one scale per (batch, head) ("per-tensor"); GROUP = BLOCK gives one scale per
    BLOCK x head_dim tile (FP8 per-block scaling). XQ's element type picks the target: int8 (IS_INT,
    QMAX = 127) or an fp8 type (rn cast of the clamped quotient, QMAX = the format's largest finite).
    """
    g = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = (off_hz // H).to(tl.int64)
    off_h = (off_hz % H).to(tl.int64)
    x_base = X + off_z * stride_xz + off_h * stride_xh
    q_base = XQ + off_z * stride_qz + off_h * stride_qh
    t_lo = g * GROUP
    t_hi = tl.minimum(t_lo + GROUP, N_CTX)
    offs_t0 = tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    # Q1, Q2 over the whole group
    amax_tile = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    for t0 in range(t_lo, t_hi, BLOCK_T):
        offs_t = t0 + offs_t0
        mask = (offs_t < t_hi)[:, None] & d_ok[None, :]
        x = tl.load(
            x_base + offs_t[:, None].to(tl.int64) * stride_xm + offs_d[None, :] * stride_xk, mask=mask, other=0.0
        )
        amax_tile = tl.maximum(amax_tile, tl.abs(x.to(tl.float32)))
    amax = tl.max(tl.max(amax_tile, 1), 0)
    # Q3
    scale = _scale_from_amax(amax, QMAX)
    # Q4..Q6
    for t0 in range(t_lo, t_hi, BLOCK_T):
        offs_t = t0 + offs_t0
        mask = (offs_t < t_hi)[:, None] & d_ok[None, :]
        x = tl.load(
            x_base + offs_t[:, None].to(tl.int64) * stride_xm + offs_d[None, :] * stride_xk, mask=mask, other=0.0
        )
        y = _quantize_values(x.to(tl.float32), scale, QMAX, IS_INT)
        tl.store(
            q_base + offs_t[:, None].to(tl.int64) * stride_qm + offs_d[None, :] * stride_qk,
            y.to(XQ.dtype.element_ty),
            mask=mask,
        )
    tl.store(S + off_z * stride_sz + off_h * stride_sh + g * stride_sg, scale)


@triton.jit
def _int8_attn_fwd(
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
    stride_qsz,
    stride_qsh,
    stride_qsm,
    stride_kz,
    stride_kh,
    stride_kn,
    stride_kk,
    stride_ksz,
    stride_ksh,
    stride_ksn,
    stride_vz,
    stride_vh,
    stride_vk,
    stride_vn,
    stride_vsz,
    stride_vsh,
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
    FULL_INT8: tl.constexpr,
    ROW_SUM_QUANTIZED: tl.constexpr,
):
    start_m, off_hz, off_z, off_h, off_hkv = tile_heads(H, GROUP)

    q_base = Q + off_z * stride_qz + off_h * stride_qh
    qs_base = QS + off_z * stride_qsz + off_h * stride_qsh
    k_base = K + off_z * stride_kz + off_hkv * stride_kh
    ks_base = KS + off_z * stride_ksz + off_hkv * stride_ksh
    v_base = V + off_z * stride_vz + off_hkv * stride_vh
    o_base = Out + off_z * stride_oz + off_h * stride_oh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_CTX_Q

    # K1, K2
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk, mask=row_ok[:, None], other=0)
    q_scale = tl.load(qs_base + offs_m * stride_qsm, mask=row_ok, other=0.0)
    v_scale = tl.load(VS + off_z * stride_vsz + off_hkv * stride_vsh)  # half-int8: a placeholder, unused
    m_i, l_i, acc = init_state(BLOCK_M, HEAD_DIM)

    hi = key_limit(start_m, N_CTX_K, BLOCK_M, IS_CAUSAL)
    acc, l_i, m_i = _int8_attn_inner(
        acc,
        l_i,
        m_i,
        q,
        q_scale,
        v_scale,
        k_base,
        ks_base,
        v_base,
        stride_kn,
        stride_kk,
        stride_ksn,
        stride_vk,
        stride_vn,
        offs_m,
        offs_d,
        qk_scale,
        N_CTX_K,
        hi,
        BLOCK_N,
        IS_CAUSAL,
        FULL_INT8,
        ROW_SUM_QUANTIZED,
    )

    # E1: deferred normalisation, guarded against l_i == 0, correctly rounded division; E2
    o_ptrs = o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_on
    normalize_and_store(acc, l_i, m_i, o_ptrs, M, L, off_hz, offs_m, row_ok, N_CTX_Q)


# ----------------------------------------------------------------------------------------------------
# launchers
# ----------------------------------------------------------------------------------------------------


def check_kernel_device(tensors, names: str, module: str = "simfloat_gpu.kernels.int8_attention"):
    """The tensors on one device: CUDA, or the CPU when the kernels run under the interpreter (``module``: the
    module to import after setting TRITON_INTERPRET=1, in the message)."""
    hint = f" (CPU tensors need TRITON_INTERPRET=1 set before {module} is imported)"
    check_device(tensors, names, is_interpreted(_int8_attn_fwd), hint)


def _check_float_tensor(name: str, x, min_dim: int):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} has dtype {x.dtype}; supported: float16, bfloat16, float32")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimension(s), got shape {tuple(x.shape)}")


def quantize_per_token(x):
    """Symmetric per-token INT8 quantization along the last dimension (steps Q1..Q6 of the module doc).

    Args:
        x: float16 / bfloat16 / float32 tensor (..., d), d >= 1, on CUDA (or CPU under TRITON_INTERPRET=1).

    Returns:
        (x_int8, scale): x_int8 int8 of x's shape (contiguous), scale fp32 of shape x.shape[:-1], with
        x ~= x_int8 * scale[..., None]; scale = max|row| / 127 (1.0 for all-zero rows).
    """
    _check_float_tensor("x", x, 1)
    check_kernel_device([x], "x")
    d = x.shape[-1]
    if d < 1:
        raise ValueError(f"x must have a non-empty last dimension, got shape {tuple(x.shape)}")
    x2 = x.reshape(-1, d)
    rows = x2.shape[0]
    xq = torch.empty((rows, d), dtype=torch.int8, device=x.device)
    scale = torch.empty((rows,), dtype=torch.float32, device=x.device)
    if rows > 0:
        block_d = triton.next_power_of_2(d)
        block_r = max(1, min(64, 4096 // block_d))
        _quantize_per_token_kernel[(triton.cdiv(rows, block_r),)](
            x2,
            xq,
            scale,
            x2.stride(0),
            x2.stride(1),
            xq.stride(0),
            xq.stride(1),
            scale.stride(0),
            rows,
            d,
            BLOCK_R=block_r,
            BLOCK_D=block_d,
        )
    return xq.reshape(x.shape), scale.reshape(x.shape[:-1])


def quantize_groups(x4, out, group: int, qmax: float, is_int: bool):
    """Launch _quantize_groups_kernel on a 4-D (batch, heads, seq, d) tensor into ``out`` (same shape,
    any strides); returns the fp32 scales, shape (batch, heads, cdiv(seq, group))."""
    b, h, s, d = x4.shape
    n_groups = triton.cdiv(s, group) if s > 0 else 0
    scale = torch.empty((b, h, max(n_groups, 1)), dtype=torch.float32, device=x4.device)
    if s == 0:
        scale.fill_(1.0)  # empty groups: amax = 0 -> scale 1 (Q3)
        return scale
    if b * h == 0:
        return scale
    block_d = triton.next_power_of_2(d)
    block_t = max(1, min(triton.next_power_of_2(group), 4096 // block_d, 64))
    _quantize_groups_kernel[(n_groups, b * h)](
        x4,
        out,
        scale,
        *strides(x4, out),
        scale.stride(0),
        scale.stride(1),
        scale.stride(2),
        h,
        s,
        d,
        group,
        QMAX=qmax,
        IS_INT=is_int,
        BLOCK_T=block_t,
        BLOCK_D=block_d,
    )
    return scale


def empty_kmajor(shape, dtype, device):
    """(b, h, s, d) storage with s contiguous: the K-major layout the P @ V tensor-core operand wants."""
    b, h, s, d = shape
    return torch.empty((b, h, d, s), dtype=dtype, device=device).transpose(2, 3)


def quantize_per_tensor(x):
    """Symmetric INT8 quantization with one scale per matrix of the last two dimensions (per (batch, head)
    for (batch, heads, seq, head_dim) tensors): steps Q1..Q6 of the module doc, with max over (seq, d).

    Returns:
        (x_int8, scale): x_int8 int8 of x's shape (the last two dimensions stored seq-contiguous, i.e. a
        transposed view), scale fp32 of shape x.shape[:-2].
    """
    _check_float_tensor("x", x, 2)
    check_kernel_device([x], "x")
    s, d = x.shape[-2:]
    x4 = x.reshape(1, -1, s, d)
    out = empty_kmajor(x4.shape, torch.int8, x.device)
    scale = quantize_groups(x4, out, max(s, 1), INT8_MAX, True)
    return out.reshape(x.shape), scale[..., 0].reshape(x.shape[:-2])


def check_quantized_shapes(q, k, v):
    """The shapes of the 8-bit kernels (head_dim a power of two in [32, 256]: 8-bit tl.dot needs K >= 32)."""
    check_attention_shapes(q, k, v, 32, " (8-bit tl.dot needs K >= 32)")


def check_common_options(q, sm_scale, block_m, block_n, causal, return_stats):
    """(block_m, block_n, causal, qk_scale) of the 8-bit kernels' options (block_n >= 32; H1: qk_scale in fp32)."""
    block_m = check_block("block_m", block_m, 16)
    block_n = check_block("block_n", block_n, 32)
    causal = check_bool("causal", causal)
    check_bool("return_stats", return_stats)
    # T7 uses max(s) * qk_scale == max(s * qk_scale), which needs qk_scale > 0
    return block_m, block_n, causal, qk_scale_of("sm_scale", sm_scale, q.shape[-1])


def _launch(q8, qs, k8, ks, v, vs, *, block_m, block_n, causal, qk_scale, row_sum):
    full = v.dtype == torch.int8
    batch, heads, seq_q, head_dim = q8.shape
    seq_k = k8.shape[2]
    out, m, l, work = output_buffers(q8, torch.float16)  # noqa: E741
    if not work:
        return out, m, l
    if vs is None:
        vs = qs  # placeholder pointer; never read when FULL_INT8 is False
        vs_strides = (0, 0)
    else:
        vs_strides = (vs.stride(0), vs.stride(1))
    grid = (triton.cdiv(seq_q, block_m), batch * heads)
    _int8_attn_fwd[grid](
        q8,
        qs,
        k8,
        ks,
        v,
        vs,
        out,
        m,
        l,
        qk_scale,
        *strides(q8, qs, k8, ks, v),
        *vs_strides,
        *strides(out),
        heads,
        heads // k8.shape[1],
        seq_q,
        seq_k,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        IS_CAUSAL=causal,
        FULL_INT8=full,
        ROW_SUM_QUANTIZED=(row_sum == "consistent"),
        num_warps=NUM_WARPS,
    )
    return out, m, l


# ----------------------------------------------------------------------------------------------------
# public wrappers
# ----------------------------------------------------------------------------------------------------


def int8_attention_quantized(
    q_int8,
    q_scale,
    k_int8,
    k_scale,
    v,
    v_scale=None,
    *,
    block_m=64,
    block_n=64,
    causal=False,
    row_sum="reference",
    sm_scale=None,
    return_stats=False,
):
    """The attention kernel on already quantized inputs (what :func:`int8_attention` runs after
    quantizing). The variant follows v's dtype: int8 v (with its fp32 v_scale of shape (batch, heads))
    runs "int8"; float16 v (v_scale None) runs "half-int8".

    Args:
        q_int8, k_int8: int8 (batch, heads, seq, head_dim), k (batch, kv_heads, ...) with heads a multiple of
            kv_heads; q_scale, k_scale: fp32 (batch, heads or kv_heads, seq).
        v: int8 or float16 (batch, kv_heads, seq_k, head_dim); v_scale: fp32 (batch, kv_heads) or None.
        Other arguments as in :func:`int8_attention`.

    Returns:
        out fp16 (batch, heads, seq_q, head_dim), or (out, m, l) when return_stats (fp32 (batch, heads,
        seq_q): running maximum in log2 units and the softmax denominator relative to it).
    """
    for name, t in (("q_int8", q_int8), ("q_scale", q_scale), ("k_int8", k_int8), ("k_scale", k_scale), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q_int8", q_int8), ("k_int8", k_int8), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seq, head_dim), got shape {tuple(t.shape)}")
    for name, t in (("q_int8", q_int8), ("k_int8", k_int8)):
        if t.dtype != torch.int8:
            raise TypeError(f"{name} has dtype {t.dtype}; expected torch.int8")
    for name, t, like in (("q_scale", q_scale, q_int8), ("k_scale", k_scale, k_int8)):
        if t.dtype != torch.float32:
            raise TypeError(f"{name} has dtype {t.dtype}; expected torch.float32")
        if tuple(t.shape) != tuple(like.shape[:3]):
            raise ValueError(f"{name} must have shape {tuple(like.shape[:3])}, got {tuple(t.shape)}")
    if v.dtype == torch.int8:
        if not isinstance(v_scale, torch.Tensor):
            raise TypeError("int8 v needs v_scale, a float32 torch.Tensor of shape (batch, heads)")
        if v_scale.dtype != torch.float32:
            raise TypeError(f"v_scale has dtype {v_scale.dtype}; expected torch.float32")
        if tuple(v_scale.shape) != tuple(v.shape[:2]):
            raise ValueError(f"v_scale must have shape {tuple(v.shape[:2])}, got {tuple(v_scale.shape)}")
    elif v.dtype == torch.float16:
        if v_scale is not None:
            raise ValueError("v_scale must be None for float16 v (the half-int8 variant)")
    else:
        raise TypeError(
            f"v has dtype {v.dtype}; expected torch.int8 (int8 variant) or torch.float16 (half-int8 variant)"
        )
    tensors = [q_int8, q_scale, k_int8, k_scale, v] + ([v_scale] if v_scale is not None else [])
    check_kernel_device(tensors, "all inputs")
    check_quantized_shapes(q_int8, k_int8, v)
    block_m, block_n, causal, qk_scale = check_common_options(q_int8, sm_scale, block_m, block_n, causal, return_stats)
    check_choice("row_sum", row_sum, _ROW_SUMS)
    out, m, l = _launch(  # noqa: E741
        q_int8,
        q_scale,
        k_int8,
        k_scale,
        v,
        v_scale,
        block_m=block_m,
        block_n=block_n,
        causal=causal,
        qk_scale=qk_scale,
        row_sum=row_sum,
    )
    return (out, m, l) if return_stats else out


def int8_attention(
    q,
    k,
    v,
    *,
    block_m=64,
    block_n=64,
    causal=False,
    variant="int8",
    row_sum="reference",
    sm_scale=None,
    return_stats=False,
):
    """softmax(sm_scale * q @ k^T [causal mask]) @ v with INT8 operands (INT-FlashAttention).

    Quantizes its inputs as the reference does (module docstring Q1..Q6): q and k per token, v per
    (batch, head) ("int8") or cast to fp16 ("half-int8"), then runs the kernel (T1..E2).

    Args:
        q: (batch, heads, seq_q, head_dim); k, v: (batch, kv_heads, seq_k, head_dim), heads a multiple of
            kv_heads (query head h reads kv head h // (heads // kv_heads)). float16, bfloat16 or float32, all
            the same dtype and device; head_dim a power of two in [32, 256]; seq_k >= 1.
        block_m: query tile, power of two in [16, 256]; block_n: key tile, power of two in [32, 256].
        causal: top-left aligned causal mask (query i attends keys j <= i).
        variant: "int8" (P and V INT8) or "half-int8" (P and V fp16).
        row_sum: "reference" (softmax denominator from the fp32 P) or "consistent" (from the quantized P
            that actually multiplies V).
        sm_scale: softmax scale > 0, default 1/sqrt(head_dim); the kernel uses
            qk_scale = fp32(fp32(sm_scale) * fp32(1.44269504)).
        return_stats: also return (m, l) as in :func:`int8_attention_quantized`.

    Returns:
        out, float16 (batch, heads, seq_q, head_dim), or (out, m, l) when return_stats.
    """
    check_qkv_tensors(q, k, v)
    check_kernel_device([q, k, v], "q, k, v")
    check_quantized_shapes(q, k, v)
    check_common_options(q, sm_scale, block_m, block_n, causal, return_stats)
    check_choice("variant", variant, _VARIANTS)
    check_choice("row_sum", row_sum, _ROW_SUMS)

    q8, qs = quantize_per_token(q)
    k8, ks = quantize_per_token(k)
    if variant == "int8":
        v8 = empty_kmajor(v.shape, torch.int8, v.device)
        vs = quantize_groups(v, v8, v.shape[2], INT8_MAX, True)[..., 0]
    else:
        v8, vs = v.to(torch.float16), None
    return int8_attention_quantized(
        q8,
        qs,
        k8,
        ks,
        v8,
        vs,
        block_m=block_m,
        block_n=block_n,
        causal=causal,
        row_sum=row_sum,
        sm_scale=sm_scale,
        return_stats=return_stats,
    )
