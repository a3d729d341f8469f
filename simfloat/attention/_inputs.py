"""Argument checks shared by the attention kernels: shapes, dtypes, block sizes, scale, plan and tracer."""

from __future__ import annotations

import math
import warnings

import numpy as np

from simfloat.attention.plan import Plan, plan
from simfloat.trace import Tracer

__all__ = ["Inputs", "check_qkv", "group_kv", "kv_group", "kv_repeats", "operand", "prepare"]


class Inputs:
    """Validated operands as contiguous float64 (L, S, D) arrays plus what the kernels need."""

    def __init__(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        lead: tuple[int, ...],
        scale: float,
        causal: bool,
        plan: Plan,
        trace: Tracer | None,
    ) -> None:
        self.q, self.k, self.v, self.lead = q, k, v, lead
        self.scale, self.causal, self.plan, self.trace = scale, causal, plan, trace

    @property
    def n_lead(self) -> int:
        return self.q.shape[0]


def operand(x: object, name: str, *, finite: bool = True) -> np.ndarray:
    """``x`` checked as an attention operand: a float32/float64 numpy array of shape (..., seq, head_dim).

    Args:
        x: the operand. name: its name in messages.
        finite: a NaN or infinity is an error (named with its first index: it would make the outputs, and
            every deviation from the golden ones, NaN without a word); False: a RuntimeWarning naming it, and
            the kernels propagate it as the GPU would.

    Raises:
        TypeError: not a numpy array, or another dtype.
        ValueError: fewer than two dimensions, or (``finite``) a NaN or infinity.
    """
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}")
    if x.dtype not in (np.float32, np.float64):
        raise TypeError(f"{name} must have dtype float32 or float64, got {x.dtype}")
    if x.ndim < 2:
        raise ValueError(f"{name} must have shape (..., seq, head_dim), got {x.shape}")
    bad = ~np.isfinite(x)
    if bad.any():
        idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), x.shape))
        n = int(np.count_nonzero(bad))
        msg = (
            f"{name} has a non-finite value ({float(x[idx])}) at index {idx} ({n} of its {x.size} values "
            f"{'is' if n == 1 else 'are'} NaN or infinite)"
        )
        if finite:
            raise ValueError(msg + ": the kernels take finite inputs")
        warnings.warn(msg + ": it propagates into the outputs", RuntimeWarning, stacklevel=4)
    return x


def kv_group(q_heads: int, kv_heads: int, name: str = "k") -> int:
    """How many query heads share one key/value head (grouped-query and multi-query attention).

    Query head ``h`` reads key/value head ``h // group``. The one rule for the emulator and the Triton kernels.

    Args:
        q_heads: number of query heads (>= 1).
        kv_heads: number of key/value heads (>= 1).
        name: the key/value operand named in messages.

    Returns:
        ``q_heads // kv_heads`` (1: one key/value head per query head).

    Raises:
        ValueError: ``kv_heads`` does not divide ``q_heads`` (or either is < 1).
    """
    if q_heads < 1 or kv_heads < 1 or q_heads % kv_heads:
        raise ValueError(
            f"q has {q_heads} head{'' if q_heads == 1 else 's'} and {name} has {kv_heads}: grouped-query "
            f"attention needs the number of q heads to be a multiple of the number of {name} heads (q head h "
            f"reads {name} head h // (q_heads // kv_heads))"
        )
    return q_heads // kv_heads


def group_kv(q: np.ndarray, x: np.ndarray, name: str) -> np.ndarray:
    """``x`` (a key or value operand) with each of its heads repeated for the query heads that read it.

    The head axis is the third from last: q (..., q_heads, seq_q, d), x (..., kv_heads, seq_k, d). A head
    count of 1 on either side is left to broadcasting (multi-query attention broadcasts already); otherwise
    query head ``h`` reads ``x``'s head ``h // (q_heads // kv_heads)`` (:func:`kv_group`). Running on the result
    is running with k and v repeated per head, so every kernel gives those bits.

    Args:
        q: (..., q_heads, seq_q, d) query operand (only its shape is read).
        x: (..., kv_heads, seq_k, d) key or value operand.
        name: ``x``'s name in messages.

    Returns:
        ``x``, or a (..., q_heads, seq_k, d) array of its heads repeated.

    Raises:
        ValueError: both have a head axis, neither head count is 1, and kv_heads does not divide q_heads.
    """
    reps = kv_repeats(q.shape, x.shape, name)
    return x if reps == 1 else np.repeat(x, reps, axis=-3)


def kv_repeats(q_shape: tuple[int, ...], x_shape: tuple[int, ...], name: str) -> int:
    """How many times :func:`group_kv` repeats each head of an operand of shape ``x_shape`` (1: not at all).

    Raises:
        ValueError: as :func:`group_kv`.
    """
    if len(q_shape) < 3 or len(x_shape) < 3:
        return 1
    hq, hk = q_shape[-3], x_shape[-3]
    if hq == hk or hk == 1 or hq == 1:
        return 1
    return kv_group(hq, hk, name)


def block(value: object, name: str) -> int:
    """A positive int tile size."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def check_qkv(qa: np.ndarray, ka: np.ndarray, va: np.ndarray) -> None:
    """The shape rules of q, k, v (k and v mapped to q's heads or not) that the forward and backward kernels
    share: q and k of one head_dim, k and v of one sequence length, at least one key.

    Raises:
        ValueError: naming the rule and the shapes.
    """
    if ka.shape[-1] != qa.shape[-1]:
        raise ValueError(f"q and k head_dim differ: q {qa.shape}, k {ka.shape}")
    if ka.shape[-2] != va.shape[-2]:
        raise ValueError(f"k and v sequence lengths differ: k {ka.shape}, v {va.shape}")
    if ka.shape[-2] < 1:
        raise ValueError("k and v need at least one key (seq_k >= 1): softmax over no keys is undefined")


def prepare(q: object, k: object, v: object, *, plan_: object, causal: object, scale: object, trace: object) -> Inputs:
    """Check and normalize the common arguments of :func:`flash`, :func:`baseline` and the quantized kernels.

    Key/value heads are mapped to query heads here (:func:`group_kv`: grouped-query and multi-query
    attention), so every kernel reads k and v repeated per query head.

    Raises:
        TypeError: non-array operands, dtypes other than float32/float64, wrong argument types.
        ValueError: inconsistent shapes, head counts that do not divide (:func:`kv_group`), no keys, a scale that
            is not finite and > 0, unknown plan.

    Warns:
        RuntimeWarning: NaN or infinite operand values (the first one's index is named).
    """
    pl = plan(plan_)  # type: ignore[arg-type]  # plan() raises TypeError for other types
    qa, ka, va = (operand(x, n, finite=False) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    ka, va = group_kv(qa, ka, "k"), group_kv(qa, va, "v")
    check_qkv(qa, ka, va)
    if qa.shape[-1] < 1 or va.shape[-1] < 1:
        raise ValueError(f"head_dim must be >= 1, got q {qa.shape}, v {va.shape}")
    try:
        lead = np.broadcast_shapes(qa.shape[:-2], ka.shape[:-2], va.shape[:-2])
    except ValueError as err:
        raise ValueError(f"leading dims do not broadcast: q {qa.shape}, k {ka.shape}, v {va.shape}") from err
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if scale is None:
        scale = 1.0 / math.sqrt(qa.shape[-1])
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be finite and > 0, got {scale}")
    if trace is not None and not isinstance(trace, Tracer):
        raise TypeError(f"trace must be a simfloat.Tracer or None, got {type(trace).__name__}")

    def flat(x: np.ndarray) -> np.ndarray:
        full = np.broadcast_to(x, lead + x.shape[-2:])
        return np.ascontiguousarray(full, dtype=np.float64).reshape((math.prod(lead),) + x.shape[-2:])

    return Inputs(flat(qa), flat(ka), flat(va), lead, scale, bool(causal), pl, trace)
