"""What the forward attention kernels share: the prologue and epilogue of a query tile (``@triton.jit``
helpers, inlined into each kernel) and the launchers' checks and output buffers.

Prologue: the program's query tile and (query head, key/value head) (:func:`tile_heads`), the running state
m_i = -inf, l_i = 0, acc = 0 (:func:`init_state`), the last key a tile sees (:func:`key_limit`: causal, the
tile's last query; else every key). Epilogue: E1 the deferred normalisation acc / l_i, guarded against
l_i == 0 and correctly rounded, and E2 the stores of the output (in the output's dtype), m_i and l_i
(:func:`normalize_and_store`). The step labels are those of each kernel's module docstring.

Imports torch and triton (a kernel module's dependencies): ``@triton.jit`` reads ``TRITON_INTERPRET`` when
this module is first imported, as it does for the kernel modules.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import triton
import triton.language as tl

from simfloat.attention._inputs import kv_group

__all__ = [
    "FLOAT_DTYPES",
    "LOG2E",
    "check_attention_shapes",
    "check_block",
    "check_bool",
    "check_choice",
    "check_device",
    "check_interpreter_consistent",
    "check_qkv_tensors",
    "init_state",
    "is_interpreted",
    "is_pow2",
    "key_limit",
    "normalize_and_store",
    "output_buffers",
    "qk_scale_of",
    "strides",
    "tile_heads",
]

#: log2(e): exp(x) = exp2(x * LOG2E); the softmax scale is folded into it (H1)
LOG2E = 1.44269504
#: the input dtypes of the kernels
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ----------------------------------------------------------------------------------------------------
# prologue and epilogue of a query tile (inlined into the kernels)
# ----------------------------------------------------------------------------------------------------


@triton.jit
def tile_heads(H, GROUP):
    """(start_m, off_hz, off_z, off_h, off_hkv): the program's query tile, its (batch, head) index, the batch,
    the query head and the key/value head (grouped-query attention: GROUP query heads share one)."""
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = (off_hz // H).to(tl.int64)
    off_h = (off_hz % H).to(tl.int64)
    off_hkv = off_h // GROUP
    return start_m, off_hz, off_z, off_h, off_hkv


@triton.jit
def init_state(BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """K2: the running state of a query tile, (m_i = -inf, l_i = 0, acc = 0), fp32."""
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    return m_i, l_i, acc


@triton.jit
def key_limit(start_m, N_CTX_K, BLOCK_M: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """The end of the key range a query tile visits: its last query + 1 under the (top-left) causal mask,
    else every key."""
    if IS_CAUSAL:
        hi = tl.minimum((start_m + 1) * BLOCK_M, N_CTX_K)
    else:
        hi = N_CTX_K
    return hi


@triton.jit
def normalize_and_store(acc, l_i, m_i, o_ptrs, M, L, off_hz, offs_m, row_ok, N_CTX_Q):
    """E1: acc / l_i, correctly rounded, l_i == 0 (no key seen) read as 1; E2: the output stored in the dtype
    ``o_ptrs`` points to, m_i and l_i at ``off_hz * N_CTX_Q + offs_m`` of M and L (rows ``row_ok``)."""
    # E1: normalize, correctly rounded
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = tl.math.div_rn(acc, l_safe[:, None])
    # E2: the output in its dtype (rn), then the stats
    tl.store(o_ptrs, out.to(o_ptrs.dtype.element_ty), mask=row_ok[:, None])
    stats_offs = off_hz.to(tl.int64) * N_CTX_Q + offs_m
    tl.store(M + stats_offs, m_i, mask=row_ok)
    tl.store(L + stats_offs, l_i, mask=row_ok)


# ----------------------------------------------------------------------------------------------------
# launcher checks
# ----------------------------------------------------------------------------------------------------


def is_interpreted(kernel) -> bool:
    """Whether ``kernel`` (a ``@triton.jit`` function) runs under Triton's interpreter."""
    return type(kernel).__name__ == "InterpretedFunction"


def check_interpreter_consistent() -> None:
    """Raises RuntimeError when TRITON_INTERPRET=1 was set after triton was imported."""
    # triton.language's own @jit helpers (tl.sum, tl.max, ...) are decorated when triton is imported;
    # if TRITON_INTERPRET=1 was set only afterwards, interpreted kernels fail inside tl.sum with
    # "Cannot call @triton.jit'd outside of the scope of a kernel".
    if type(tl.standard.sum).__name__ != "InterpretedFunction":
        raise RuntimeError(
            "TRITON_INTERPRET=1 was set after triton was imported; set it before the first "
            "`import triton` (e.g. at the top of tests/conftest.py)"
        )


def is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def check_block(name: str, value, lo: int, why: str = "") -> int:
    """A tile size: an int, a power of two in [lo, 256] (``why``: the reason for ``lo``, in the message)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = int(value)
    if not (is_pow2(value) and lo <= value <= 256):
        raise ValueError(f"{name} must be a power of two in [{lo}, 256]{why}, got {value}")
    return value


def check_bool(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def check_choice(name: str, value, choices):
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, one of {choices}, got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_device(tensors, names: str, interpreted: bool, hint: str) -> None:
    """The tensors on one device, CUDA (or the CPU under the interpreter); ``hint``: what CPU tensors need."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"{names} must be on one device, got {', '.join(str(t.device) for t in tensors)}")
    device = tensors[0].device
    if device.type != "cuda" and not (device.type == "cpu" and interpreted):
        raise ValueError(
            f"{names} are on {device}; the kernel needs CUDA tensors{hint if device.type == 'cpu' else ''}"
        )


def check_qkv_tensors(q, k, v) -> None:
    """q, k, v: 4-D torch tensors of one dtype of :data:`FLOAT_DTYPES`."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seq, head_dim), got shape {tuple(t.shape)}")
    if q.dtype not in FLOAT_DTYPES:
        raise TypeError(f"q has dtype {q.dtype}; supported: float16, bfloat16, float32")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has {q.dtype}; q, k and v must share a dtype")


def check_attention_shapes(q, k, v, min_head_dim: int = 16, why: str = "") -> None:
    """q (batch, heads, seq_q, d), k and v (batch, kv_heads, seq_k, d): heads a multiple of kv_heads, d a power
    of two in [min_head_dim, 256] (``why``: the reason for the bound, in the message), seq_k >= 1."""
    (bq, hq, _, dq), (bk, hk, sk, dk), (bv, hv, sv, dv) = q.shape, k.shape, v.shape
    if not (bq == bk == bv and hk == hv):
        raise ValueError(
            f"batch and kv heads must agree: q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)} (k and v: the same heads)"
        )
    kv_group(hq, hk)  # q heads a multiple of kv heads
    if sk != sv:
        raise ValueError(f"k and v must have the same sequence length, got {sk} and {sv}")
    if not (dq == dk == dv):
        raise ValueError(f"head_dim must agree: q {dq}, k {dk}, v {dv}")
    if not (is_pow2(dq) and min_head_dim <= dq <= 256):
        raise ValueError(f"head_dim must be a power of two in [{min_head_dim}, 256]{why}, got {dq}")
    if sk < 1:
        raise ValueError("k and v need at least one key (seq_k >= 1): softmax over no keys is undefined")


def qk_scale_of(name: str, scale, head_dim: int) -> float:
    """H1: fp32(fp32(scale) * fp32(LOG2E)) for a softmax scale > 0 (None: 1/sqrt(head_dim)); ``name``: the
    launcher's argument, in the messages."""
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a real number, got {type(scale).__name__}")
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0.0):
        # the kernels use max(qk) * qk_scale == max(qk * qk_scale), which needs qk_scale > 0
        raise ValueError(f"{name} must be finite and > 0, got {scale}")
    return float(np.float32(scale) * np.float32(LOG2E))


def strides(*tensors) -> tuple[int, ...]:
    """Every stride of each tensor, in order: the stride arguments of a kernel launch."""
    return tuple(st for t in tensors for st in t.stride())


def output_buffers(q, out_dtype):
    """The outputs of a forward launch: out (q's shape, ``out_dtype``), m and l (fp32, q's shape without
    head_dim), uninitialised; and whether there is any work (a query row of some (batch, head))."""
    batch, heads, seq_q, head_dim = q.shape
    out = torch.empty((batch, heads, seq_q, head_dim), dtype=out_dtype, device=q.device)
    m = torch.empty((batch, heads, seq_q), dtype=torch.float32, device=q.device)
    l = torch.empty((batch, heads, seq_q), dtype=torch.float32, device=q.device)  # noqa: E741
    return out, m, l, seq_q > 0 and batch * heads > 0
