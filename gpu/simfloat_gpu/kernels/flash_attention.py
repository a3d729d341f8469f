"""Forward flash attention in Triton (FA2 schedule), written so that simfloat can mirror it op by op.

Layout: ``q`` is (batch, heads, seq_q, head_dim), ``k`` and ``v`` are (batch, kv_heads, seq_k, head_dim)
with heads a multiple of kv_heads (grouped-query attention; kv_heads = 1: multi-query): query head h reads
key/value head h // GROUP, GROUP = heads // kv_heads (a stride mapping, nothing is copied). seq_q and seq_k
may differ and need not be multiples of the block sizes. One program handles one (BLOCK_M query rows) x
(one batch*head) tile and walks the keys in tiles of BLOCK_N, left to right.

Precision plan, in the order the kernel executes it (the emulator's "triton-<fmt>" plan mirrors this).
``in`` is the input dtype (fp16, bf16 or fp32); every other value is fp32; "rn" = round to nearest even.

Host, once per call:
  H1. qk_scale = rn32(rn32(scale) * rn32(1.44269504))   -- scale defaults to 1/sqrt(head_dim) (in double);
      both operands rounded to fp32 and multiplied in fp32, exactly what the tutorial does in-kernel.

Kernel, per program (rows offs_m = start_m*BLOCK_M + [0, BLOCK_M)):
  K1. q = load(Q) in ``in``; rows >= seq_q read as 0 (never stored).
  K2. m_i = -inf, l_i = 0, acc = 0 (fp32, BLOCK_M x HEAD_DIM).
  Per key tile n0 = 0, BLOCK_N, ... < hi   (hi = seq_k, or min(seq_k, (start_m+1)*BLOCK_M) if causal):
  T1. k (as HEAD_DIM x BLOCK_N) and v (BLOCK_N x HEAD_DIM) loaded in ``in``; keys >= seq_k read as 0.
  T2. qk = tl.dot(q, k)                       -> fp32. fp16/bf16: products exact, fp32 accumulation
      (hardware MMA order); fp32 inputs: ``input_precision`` "tf32" or "ieee" (plain fma.rn loops).
      sm_90 PTX: wgmma m64nNk16 when BLOCK_M >= 64, else mma.sync m16n8k16; tf32 is mma.sync m16n8k8
      .tf32 fed the raw fp32 registers (no cvt.rna.tf32; how the MMA drops the low 13 mantissa bits is
      for the device to measure).
  T3. qk = where(valid, qk, -inf)             valid = key < seq_k [and key <= query if causal]. Exact.
  T4. m_ij = maximum(m_i, max(qk, axis=1) * qk_scale)   one fp32 multiply (rn) of the row max; the max
      itself is exact. Because qk_scale > 0 this equals max(qk * qk_scale).
      Lazy rescaling (LAZY_RESCALE, threshold T in log2 units, an fp32 constant): rescale =
      (m_ij - m_i) > T  (fp32 subtract, rn); rows with rescale == False keep their old maximum:
      m_ij = where(rescale, m_ij, m_i).
  T5. m_sub = where(m_ij == -inf, 0, m_ij)    finite guard (flash-attn's Check_inf): a row that has seen
      only masked keys so far would otherwise compute -inf - (-inf) = NaN in T6/T9. Exact; it changes
      nothing for any row with a finite maximum.
  T6. qk = fma(qk, qk_scale, -m_sub)          ONE rounding (explicit tl.fma, PTX fma.rn.f32: the
      tutorial's ``qk * qk_scale - m_ij`` is contracted to this fma only while fp fusion is on, which
      triton announces will stop being the default in 3.10). Masked: -inf.
  T7. p = exp2(qk)                            fp32 tl.math.exp2 = ex2.approx.ftz.f32 on the GPU (not
      correctly rounded, subnormal inputs/outputs flushed; the stock interpreter uses numpy's float32
      exp2). Masked entries give exactly 0.
  T8. l_ij = sum(p, axis=1)                   fp32 reduction (GPU: layout-dependent tree; stock
      interpreter: numpy pairwise sum).
  T9. alpha = exp2(m_i - m_sub)               fp32 subtract (rn) then exp2; m_i = -inf gives 0.
      Lazy rescaling: alpha = where(rescale, alpha, 1.0) (so skipped rows are exactly untouched).
  T10. l_i = fma(l_i, alpha, l_ij)            one rounding (explicit tl.fma, same reason as T6).
  T11. acc = acc * alpha                      fp32 multiply (rn), row-broadcast.
  T12. p = p.to(in)                           rn cast (fp16/bf16); no-op for fp32 inputs.
  T13. acc = tl.dot(p, v, acc)                products exact for fp16/bf16, fp32 accumulation into acc
      (acc is the MMA accumulator operand); fp32 inputs: tf32 or ieee as in T2.
  T14. m_i = m_ij
  Epilogue:
  E1. l_safe = where(l_i == 0, 1, l_i); out = div_rn(acc, l_safe)   correctly rounded fp32 division
      (tl.math.div_rn: Triton's plain ``/`` is the approximate div.full.f32 on NVIDIA GPUs).
  E2. out cast to ``out_dtype`` (rn) and stored; m_i and l_i stored as fp32 stats.

Notes for the emulator:
  * Key tiles a row cannot see (all masked in T3 while m_i is finite) are exact no-ops: p = 0, l_ij = 0,
    alpha = exp2(+0) = 1, so l_i and acc keep their bits. Looping over all tiles or only visible ones
    gives identical results.
  * Causal masking is top-left aligned: query i attends keys j <= i (flash-attn < 2.1 / PyTorch
    ``is_causal`` convention). Key 0 is visible to every row, so with seq_k >= 1 no row is ever fully
    masked. Were one to be (e.g. a future bottom-right alignment with seq_q > seq_k), the guards in T5 and
    E1 give out = 0, m_i = -inf and l_i = 0 for it, with no NaN.
  * Stats: m_i is kept in log2 units, m_i = max_j(qk_ij) * qk_scale (with lazy rescaling: the possibly
    stale maximum the kernel actually used), and l_i = sum_j exp2(qk_ij * qk_scale - m_i) relative to that
    m_i. The natural-log logsumexp of the scaled scores is (m_i + log2(l_i)) * ln(2).
  * Lazy rescaling keeps p <= 2**T, hence T is limited to [0, 15] so that P fits fp16.
  * PTX for sm_90 was checked with triton 3.6.0 and 3.9.0 (test_compiles_for_sm90_...): the
    remaining fp32 mul.f32/add.f32 (T4, T8, T11) have no mul->add dataflow for ptxas to contract.
  * Launch configuration is fixed (NUM_WARPS=4, NUM_STAGES=2): on GPU num_warps and the block sizes
    select the MMA instruction (e.g. Hopper wgmma needs BLOCK_M >= 64 with 4 warps, else mma.sync) and the
    reduction tree, hence the bits; num_stages only pipelines loads and changes no arithmetic.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import triton
import triton.language as tl

from simfloat_gpu.kernels.common import (
    LOG2E,
    check_attention_shapes,
    check_block,
    check_bool,
    check_device,
    check_interpreter_consistent,
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

__all__ = ["flash_attention", "LOG2E", "NUM_WARPS", "NUM_STAGES", "check_inputs", "check_options"]

#: Fixed launch width: the GPU reduction / MMA order (hence the bits) depends on it.
NUM_WARPS = 4
#: Software-pipelining depth; numerically irrelevant, kept low so HEAD_DIM=256 tiles fit shared memory.
NUM_STAGES = 2
_MAX_LAZY_THRESHOLD = 15.0


# ----------------------------------------------------------------------------------------------------
# jit helpers
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _online_softmax_tile(
    acc,
    l_i,
    m_i,
    q,
    k,
    v,
    valid,
    qk_scale,
    INPUT_PRECISION: tl.constexpr,
    LAZY_RESCALE: tl.constexpr,
    RESCALE_THRESHOLD: tl.constexpr,
):
    """One key tile of the FA2 online softmax: steps T2..T14 of the module docstring."""
    # T2, T3: raw scores, masked to -inf
    qk = tl.dot(q, k, input_precision=INPUT_PRECISION)
    qk = tl.where(valid, qk, float("-inf"))
    # T4: new running maximum (log2 units)
    m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    if LAZY_RESCALE:
        rescale = (m_ij - m_i) > RESCALE_THRESHOLD
        m_ij = tl.where(rescale, m_ij, m_i)
    # T5: finite guard against -inf - (-inf)
    m_sub = tl.where(m_ij == float("-inf"), 0.0, m_ij)
    # T6, T7, T8: probabilities of this tile and their row sums
    qk = tl.fma(qk, qk_scale, -m_sub[:, None])
    p = tl.math.exp2(qk)
    l_ij = tl.sum(p, 1)
    # T9, T10, T11: rescale the running state
    alpha = tl.math.exp2(m_i - m_sub)
    if LAZY_RESCALE:
        alpha = tl.where(rescale, alpha, 1.0)
    l_i = tl.fma(l_i, alpha, l_ij)
    acc = acc * alpha[:, None]
    # T12, T13: P in the input dtype, accumulated into acc by the MMA
    p = p.to(v.dtype)
    acc = tl.dot(p, v, acc, input_precision=INPUT_PRECISION)
    # T14
    m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_inner(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    stride_kn,
    stride_kk,
    stride_vk,
    stride_vn,
    offs_m,
    offs_d,
    qk_scale,
    N_CTX_K,
    hi,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    LAZY_RESCALE: tl.constexpr,
    RESCALE_THRESHOLD: tl.constexpr,
):
    """Walk the key tiles [0, hi) left to right: T1 and the loop around _online_softmax_tile."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        key_ok = offs_n < N_CTX_K
        # T1: K^T tile (HEAD_DIM x BLOCK_N) and V tile (BLOCK_N x HEAD_DIM); keys past the end read as 0
        k = tl.load(k_base + offs_d[:, None] * stride_kk + offs_n[None, :] * stride_kn, mask=key_ok[None, :], other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vk + offs_d[None, :] * stride_vn, mask=key_ok[:, None], other=0.0)
        valid = key_ok[None, :]
        if IS_CAUSAL:
            # top-left aligned: query i sees keys j <= i
            valid = valid & (offs_m[:, None] >= offs_n[None, :])
        acc, l_i, m_i = _online_softmax_tile(
            acc, l_i, m_i, q, k, v, valid, qk_scale, INPUT_PRECISION, LAZY_RESCALE, RESCALE_THRESHOLD
        )
    return acc, l_i, m_i


# ----------------------------------------------------------------------------------------------------
# kernel
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _attn_fwd(
    Q,
    K,
    V,
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
    GROUP,
    N_CTX_Q,
    N_CTX_K,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    LAZY_RESCALE: tl.constexpr,
    RESCALE_THRESHOLD: tl.constexpr,
):
    start_m, off_hz, off_z, off_h, off_hkv = tile_heads(H, GROUP)

    q_base = Q + off_z * stride_qz + off_h * stride_qh
    k_base = K + off_z * stride_kz + off_hkv * stride_kh
    v_base = V + off_z * stride_vz + off_hkv * stride_vh
    o_base = Out + off_z * stride_oz + off_h * stride_oh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_CTX_Q

    # K1, K2
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk, mask=row_ok[:, None], other=0.0)
    m_i, l_i, acc = init_state(BLOCK_M, HEAD_DIM)

    hi = key_limit(start_m, N_CTX_K, BLOCK_M, IS_CAUSAL)
    acc, l_i, m_i = _attn_fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        stride_kn,
        stride_kk,
        stride_vk,
        stride_vn,
        offs_m,
        offs_d,
        qk_scale,
        N_CTX_K,
        hi,
        BLOCK_N,
        IS_CAUSAL,
        INPUT_PRECISION,
        LAZY_RESCALE,
        RESCALE_THRESHOLD,
    )

    # E1: deferred normalisation, guarded against l_i == 0, correctly rounded division; E2
    o_ptrs = o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_on
    normalize_and_store(acc, l_i, m_i, o_ptrs, M, L, off_hz, offs_m, row_ok, N_CTX_Q)


# ----------------------------------------------------------------------------------------------------
# launcher
# ----------------------------------------------------------------------------------------------------


def check_inputs(q, k, v):
    """q, k, v: 4-D tensors of one float dtype and device (CUDA, or the CPU under the interpreter), of the
    shapes the kernel takes (head_dim a power of two in [16, 256])."""
    check_qkv_tensors(q, k, v)
    hint = " (CPU tensors need TRITON_INTERPRET=1 set before triton and this kernel module are imported)"
    check_device([q, k, v], "q, k, v", is_interpreted(_attn_fwd), hint)
    if q.device.type == "cpu":
        check_interpreter_consistent()
    check_attention_shapes(q, k, v)


def check_options(q, scale, out_dtype, lazy_rescale_threshold, input_precision):
    """(qk_scale, out_dtype, lazy, threshold, precision) of the launch options (H1: qk_scale in fp32)."""
    qk_scale = qk_scale_of("scale", scale, q.shape[-1])  # H1: fp32 multiply of fp32 operands
    if not (math.isfinite(qk_scale) and qk_scale > 0.0):
        raise ValueError(f"scale * log2(e) = {qk_scale} in fp32 must be finite and > 0 (scale={scale})")

    if out_dtype is None:
        out_dtype = q.dtype
    if not isinstance(out_dtype, torch.dtype):
        raise TypeError(f"out_dtype must be a torch.dtype, got {type(out_dtype).__name__}")
    if out_dtype not in (torch.float32, q.dtype):
        raise ValueError(f"out_dtype must be torch.float32 or the input dtype {q.dtype}, got {out_dtype}")

    if lazy_rescale_threshold is None:
        lazy, threshold = False, 0.0
    else:
        if isinstance(lazy_rescale_threshold, bool) or not isinstance(
            lazy_rescale_threshold, (int, float, np.floating, np.integer)
        ):
            raise TypeError(
                "lazy_rescale_threshold must be None or a real number (log2 units), got "
                f"{type(lazy_rescale_threshold).__name__}"
            )
        threshold = float(lazy_rescale_threshold)
        if not (0.0 <= threshold <= _MAX_LAZY_THRESHOLD):
            raise ValueError(
                f"lazy_rescale_threshold must be in [0, {_MAX_LAZY_THRESHOLD:g}] (log2 units; "
                f"P can reach 2**threshold and must fit fp16), got {threshold}"
            )
        lazy = True

    if q.dtype == torch.float32:
        precision = "tf32" if input_precision is None else input_precision
        if precision not in ("tf32", "ieee"):
            raise ValueError(f"input_precision must be 'tf32' or 'ieee' for float32 inputs, got {precision!r}")
    else:
        if input_precision is not None:
            raise ValueError(
                f"input_precision only applies to float32 inputs (got {input_precision!r} with {q.dtype} inputs)"
            )
        precision = "ieee"  # ignored by tl.dot for 16-bit operands; products are exact anyway
    return qk_scale, out_dtype, lazy, threshold, precision


def _launch(q, k, v, *, causal, scale, block_m, block_n, out_dtype, lazy_rescale_threshold, input_precision):
    check_inputs(q, k, v)
    block_m = check_block("block_m", block_m, 16, " (tl.dot needs >= 16)")
    block_n = check_block("block_n", block_n, 16, " (tl.dot needs >= 16)")
    check_bool("causal", causal)
    qk_scale, out_dtype, lazy, threshold, precision = check_options(
        q, scale, out_dtype, lazy_rescale_threshold, input_precision
    )

    batch, heads, seq_q, head_dim = q.shape
    seq_k = k.shape[2]
    out, m, l, work = output_buffers(q, out_dtype)  # noqa: E741
    if not work:
        return out, m, l

    grid = (triton.cdiv(seq_q, block_m), batch * heads)
    _attn_fwd[grid](
        q,
        k,
        v,
        out,
        m,
        l,
        qk_scale,
        *strides(q, k, v, out),
        heads,
        heads // k.shape[1],
        seq_q,
        seq_k,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        IS_CAUSAL=bool(causal),
        INPUT_PRECISION=precision,
        LAZY_RESCALE=lazy,
        RESCALE_THRESHOLD=threshold,
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )
    return out, m, l


# ----------------------------------------------------------------------------------------------------
# public wrapper
# ----------------------------------------------------------------------------------------------------


def flash_attention(
    q,
    k,
    v,
    *,
    causal=False,
    scale=None,
    block_m=64,
    block_n=64,
    out_dtype=None,
    return_stats=False,
    lazy_rescale_threshold=None,
    input_precision=None,
):
    """softmax(scale * q @ k^T [causal mask]) @ v with the Triton FA2 forward kernel.

    Args:
        q: (batch, heads, seq_q, head_dim); k, v: (batch, kv_heads, seq_k, head_dim), heads a multiple of
            kv_heads (query head h reads kv head h // (heads // kv_heads)). fp16, bf16 or fp32, all the same
            dtype and device; head_dim a power of two in [16, 256]; seq_k >= 1.
        causal: top-left aligned causal mask (query i attends keys j <= i).
        scale: softmax scale, > 0; default 1/sqrt(head_dim). The kernel uses
            qk_scale = fp32(fp32(scale) * fp32(1.44269504)) (log2(e) folded in).
        block_m, block_n: query / key tile sizes (powers of two in [16, 256]).
        out_dtype: torch.float32 or the input dtype (default).
        return_stats: also return (m, l), each fp32 (batch, heads, seq_q): the running maximum in log2
            units and the softmax denominator relative to it (see the module docstring).
        lazy_rescale_threshold: None (always rescale) or T in [0, 15], log2 units: rescale acc and l
            only when the row maximum grows by more than T.
        input_precision: fp32 inputs only: "tf32" (default) or "ieee" for both tl.dot calls.

    Returns:
        out, or (out, m, l) when return_stats.
    """
    out, m, l = _launch(  # noqa: E741
        q,
        k,
        v,
        causal=causal,
        scale=scale,
        block_m=block_m,
        block_n=block_n,
        out_dtype=out_dtype,
        lazy_rescale_threshold=lazy_rescale_threshold,
        input_precision=input_precision,
    )
    if return_stats:
        return out, m, l
    return out
