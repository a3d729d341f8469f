"""Packed variable-length sequences (flash-attn's ``flash_attn_varlen_func`` layout) under a precision plan.

A batch of sequences of different lengths is packed along one token axis: q is (total_q, heads, head_dim), k
and v (total_k, kv_heads, head_dim); sequence ``i`` owns the query rows ``cu_seqlens_q[i]:cu_seqlens_q[i+1]``
and the keys ``cu_seqlens_k[i]:cu_seqlens_k[i+1]``. The varlen kernels give each sequence its own query and key
tiles, starting at the sequence's first token (a tile never straddles two sequences), so each sequence's bits
are those of :func:`~simfloat.attention.flash` run on it alone; :func:`flash_varlen` does exactly that, through
the one forward loop (either engine).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simfloat.attention.flash import flash
from simfloat.attention.plan import Plan

__all__ = ["check_cu_seqlens", "flash_varlen"]


def check_cu_seqlens(cu_seqlens: object, total: int, name: str, max_seqlen: int | None = None) -> np.ndarray:
    """Check cumulative sequence offsets as the varlen kernels read them.

    Args:
        cu_seqlens: (batch + 1,) integer array or sequence: ``0 = c_0 <= c_1 <= ... <= c_batch = total``.
        total: the packed operand's token count (its first dim).
        name: the argument named in messages (``"cu_seqlens_q"``).
        max_seqlen: if given, the kernel's bound on every length (flash-attn sizes its grid by it; a longer
            sequence would lose rows silently on the GPU, so it is an error here).

    Returns:
        The offsets as a (batch + 1,) int64 array.

    Raises:
        TypeError: not integers (bools and floats included).
        ValueError: not 1-D, fewer than 2 entries, not starting at 0, decreasing, not ending at ``total``, or a
            length over ``max_seqlen``.
    """
    arr = np.asarray(cu_seqlens)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integers (as torch.int32 offsets), got dtype {arr.dtype}")
    if arr.ndim != 1 or arr.size < 2:
        raise ValueError(f"{name} must be 1-D with batch + 1 >= 2 entries, got shape {arr.shape}")
    c = arr.astype(np.int64)
    if c[0] != 0:
        raise ValueError(f"{name} must start at 0, got {int(c[0])}")
    steps = np.diff(c)
    if np.any(steps < 0):
        i = int(np.flatnonzero(steps < 0)[0])
        raise ValueError(f"{name} must be non-decreasing: entry {i + 1} ({int(c[i + 1])}) < entry {i} ({int(c[i])})")
    if c[-1] != total:
        raise ValueError(f"{name} must end at the packed length {total} (the operand's first dim), got {int(c[-1])}")
    if max_seqlen is not None:
        if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, (int, np.integer)) or max_seqlen < 0:
            raise ValueError(f"max_seqlen for {name} must be an int >= 0, got {max_seqlen!r}")
        if steps.size and int(steps.max()) > max_seqlen:
            i = int(np.argmax(steps))
            raise ValueError(
                f"sequence {i} of {name} has length {int(steps[i])} > max_seqlen {max_seqlen} (the kernel would "
                "skip its last rows)"
            )
    return c


def _packed(x: object, name: str) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}")
    if x.ndim != 3:
        raise ValueError(f"{name} must be (total_tokens, heads, head_dim) for varlen, got shape {x.shape}")
    return x


def flash_varlen(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    cu_seqlens_q: Sequence[int] | np.ndarray,
    cu_seqlens_k: Sequence[int] | np.ndarray,
    *,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    plan: Plan | str = "triton-bf16",
    block_m: int | None = None,
    block_n: int | None = None,
    tiles: str | None = None,
    causal: bool = False,
    scale: float | None = None,
    return_stats: bool = False,
    engine: str | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Emulated flash attention over packed sequences with cumulative offsets (flash-attn's varlen layout).

    Each sequence runs alone through :func:`~simfloat.attention.flash` (``layout="bshd"``), its query and key
    tiles starting at its own first token, as the varlen kernels tile it: the result is bit for bit each
    sequence's own run. A sequence with queries but no keys gives out = 0, m = -inf, l = 0 (the kernel's
    guards for a row that saw no key).

    Args:
        q: (total_q, heads, head_dim); k: (total_k, kv_heads, head_dim); v: (total_k, kv_heads, head_dim_v).
            Grouped-query attention as :func:`~simfloat.attention.flash` (heads a multiple of kv_heads).
        cu_seqlens_q, cu_seqlens_k: (batch + 1,) integer offsets into q's and k's first dim (see
            :func:`check_cu_seqlens`).
        max_seqlen_q, max_seqlen_k: optional bounds on the lengths, checked (flash-attn's grid size).
        plan, block_m, block_n, tiles, scale, engine: as :func:`~simfloat.attention.flash`.
        causal: a causal mask within each sequence, aligned bottom-right as flash-attn's (query i of a
            sequence with n_q queries and n_k keys sees keys j <= i + n_k - n_q; with equal lengths the usual
            mask); rows that see no key give 0, m -inf and l 0.
        return_stats: also return m and l, (heads, total_q) each (flash-attn's varlen lse layout).

    Returns:
        (total_q, heads, head_dim_v) float64 array of values of ``plan.out``'s format; with ``return_stats``
        the tuple (out, m, l).

    Raises:
        TypeError, ValueError: bad offsets (see :func:`check_cu_seqlens`), operands that are not 3-D or whose
            head counts or dims disagree; and what :func:`~simfloat.attention.flash`
            raises for a sequence.
    """
    qa, ka, va = _packed(q, "q"), _packed(k, "k"), _packed(v, "v")
    if ka.shape[:2] != va.shape[:2]:
        raise ValueError(f"k and v must agree in (total_k, kv_heads), got {ka.shape} and {va.shape}")
    if qa.shape[2] != ka.shape[2]:
        raise ValueError(f"q and k must have one head_dim, got {qa.shape[2]} and {ka.shape[2]}")
    cq = check_cu_seqlens(cu_seqlens_q, qa.shape[0], "cu_seqlens_q", max_seqlen_q)
    ck = check_cu_seqlens(cu_seqlens_k, ka.shape[0], "cu_seqlens_k", max_seqlen_k)
    if cq.size != ck.size:
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must describe one batch, got {cq.size - 1} and {ck.size - 1} sequences"
        )
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    heads, dv = qa.shape[1], va.shape[2]
    out = np.zeros((qa.shape[0], heads, dv))
    m = np.full((heads, qa.shape[0]), -np.inf)
    l = np.zeros((heads, qa.shape[0]))  # noqa: E741
    for i in range(cq.size - 1):
        q0, q1, k0, k1 = int(cq[i]), int(cq[i + 1]), int(ck[i]), int(ck[i + 1])
        if q1 == q0 or k1 == k0:
            continue  # no rows, or rows that see no key: out 0, m -inf, l 0
        res = flash(
            qa[q0:q1],
            ka[k0:k1],
            va[k0:k1],
            plan=plan,
            block_m=block_m,
            block_n=block_n,
            tiles=tiles,
            causal=causal,
            causal_align="bottom-right" if causal and q1 - q0 != k1 - k0 else "top-left",
            scale=scale,
            return_stats=True,
            engine=engine,
            layout="bshd",
        )
        assert isinstance(res, tuple)
        out[q0:q1], m[:, q0:q1], l[:, q0:q1] = res
    if return_stats:
        return out, m, l
    return out
