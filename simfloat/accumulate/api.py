"""The public products: :func:`matmul`, :func:`matmul_scaled` and :func:`dot` under any accumulation model, on the
vector row kernels or the scalar reference."""

from __future__ import annotations

import math

import numpy as np

from simfloat._jit import jit
from simfloat._parallel import run_rows
from simfloat.accumulate._rows import matmul_rows, scaled_rows
from simfloat.accumulate.models import BlockFMA, Chunked, Interleaved, Model, acc_params
from simfloat.accumulate.scalar import dot_acc, dot_scaled_acc

__all__ = ["dot", "matmul", "matmul_scaled"]


@jit
def _matmul_rows(lo, hi, a, b, c, out, ap):
    m = a.shape[1]
    n = b.shape[2]
    for r in range(lo, hi):
        bi = r // m
        i = r - bi * m
        for j in range(n):
            out[bi, i, j] = dot_acc(a[bi, i, :], b[bi, :, j], c[bi, i, j], ap)


def _no_scales(acc: object) -> None:
    inner = acc.inner if isinstance(acc, (Chunked, Interleaved)) else acc
    if isinstance(inner, BlockFMA) and inner.scale_block:
        raise TypeError("a block-scaled model (scale_block > 0) needs the scales: use matmul_scaled")


def _as_float_array(x: object, name: str) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}")
    if x.dtype not in (np.float32, np.float64):
        raise TypeError(f"{name} must have dtype float32 or float64, got {x.dtype}")
    return x.astype(np.float64, copy=False)


def matmul(
    a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None, *, acc: Model | Interleaved, engine: str = "vector"
) -> np.ndarray:
    """Emulated ``c + a @ b`` under an accumulation model.

    Args:
        a: (..., M, K) float32/float64 array (values are taken as they are: round them into the operand format
            first, e.g. with :func:`simfloat.round`, or give the model an ``input_fmt``).
        b: (..., K, N) array; leading dims broadcast with ``a``'s.
        c: optional (..., M, N) incoming accumulator (defaults to zeros).
        acc: accumulation model (an :class:`Interleaved` one reorders k of ``a`` and ``b`` and runs its inner
            model).
        engine: ``"vector"`` (the row kernels of :mod:`simfloat.accumulate._rows`, vectorized across outputs) or
            ``"reference"`` (:func:`dot_acc` per output); the same bits.

    Returns:
        float64 array (..., M, N) of values of the accumulator format.
    """
    if engine not in ("vector", "reference"):
        raise ValueError(f"engine must be 'vector' or 'reference', got {engine!r}")
    a64 = _as_float_array(a, "a")
    b64 = _as_float_array(b, "b")
    if a64.ndim < 2 or b64.ndim < 2:
        raise ValueError(f"matmul needs arrays of at least 2 dims, got a.ndim={a64.ndim}, b.ndim={b64.ndim}")
    if a64.shape[-1] != b64.shape[-2]:
        raise ValueError(f"inner dimensions differ: a is {a.shape}, b is {b.shape}")
    _no_scales(acc)
    if isinstance(acc, Interleaved):
        order = acc.order(a64.shape[-1])
        a64, b64, acc = a64[..., order], b64[..., order, :], acc.inner
    ap = acc_params(acc)
    lead = np.broadcast_shapes(a64.shape[:-2], b64.shape[:-2])
    m, n = a64.shape[-2], b64.shape[-1]
    nl = math.prod(lead)
    a3 = np.ascontiguousarray(np.broadcast_to(a64, lead + a64.shape[-2:])).reshape(nl, m, a64.shape[-1])
    b3 = np.ascontiguousarray(np.broadcast_to(b64, lead + b64.shape[-2:])).reshape(nl, b64.shape[-2], n)
    if c is None:
        c3 = np.zeros((a3.shape[0], m, n))
    else:
        c64 = _as_float_array(c, "c")
        try:
            c3 = np.ascontiguousarray(np.broadcast_to(c64, lead + (m, n))).reshape(nl, m, n)
        except ValueError as err:
            raise ValueError(f"c of shape {c.shape} does not broadcast to {lead + (m, n)}") from err
    if engine == "vector":
        return matmul_rows(a3, b3, c3, acc).reshape(lead + (m, n))
    out = np.empty((a3.shape[0], m, n))
    run_rows(_matmul_rows, a3.shape[0] * m, a3, b3, c3, out, ap)
    return out.reshape(lead + (m, n))


@jit
def _scaled_rows(lo, hi, a, b, sa, sb, c, out, ap):
    m = a.shape[1]
    n = b.shape[2]
    for r in range(lo, hi):
        bi = r // m
        i = r - bi * m
        for j in range(n):
            out[bi, i, j] = dot_scaled_acc(a[bi, i, :], b[bi, :, j], sa[bi, i, :], sb[bi, :, j], c[bi, i, j], ap)


def matmul_scaled(
    a: np.ndarray,
    b: np.ndarray,
    a_scales: np.ndarray,
    b_scales: np.ndarray,
    c: np.ndarray | None = None,
    *,
    acc: BlockFMA,
    engine: str = "vector",
) -> np.ndarray:
    """Emulated block-scaled MMA ``c + (a * a_scales) @ (b * b_scales)`` as the tensor core sums it.

    Args:
        a: (M, K) element values (of the model's element formats, e.g. ``quantize_block(...).codes``).
        b: (K, N) element values.
        a_scales: (M, K // scale_block) scales of a's blocks along k (``quantize_block(x, ..., axis=-1)``).
        b_scales: (K // scale_block, N) scales of b's blocks along k (``quantize_block(x, ..., axis=0)``).
        c: optional (M, N) incoming accumulator (zeros by default).
        acc: a block-scaled :class:`BlockFMA` (``tensor_core(arch, fmt, kind=...)``).
        engine: ``"vector"`` or ``"reference"`` (:func:`dot_scaled_acc` per output); the same bits. The vector
            engine scales the operands exactly and gives them alignment weights from the scales' exponents
            (times the elements', for ``mxf8f6f4``), so that the block-FMA row kernels of ``_rows``
            apply (the grouped fp4 kinds ``mxf4``, ``nvf4`` sum each group of 16 exactly first:
            :func:`simfloat.accumulate._rows.scaled_mma`); operands it cannot take (a NaN scale, extreme magnitudes) run
            the reference.

    Returns:
        float64 (M, N) array.

    Raises:
        TypeError: a non-float array or a model without scales. ValueError: shapes that do not match, or K not
            a multiple of ``scale_block``.
    """
    if not isinstance(acc, BlockFMA) or acc.scale_block == 0:
        raise TypeError("matmul_scaled needs a block-scaled BlockFMA (tensor_core(arch, fmt, kind=...))")
    a64, b64 = _as_float_array(a, "a"), _as_float_array(b, "b")
    sa64, sb64 = _as_float_array(a_scales, "a_scales"), _as_float_array(b_scales, "b_scales")
    if a64.ndim != 2 or b64.ndim != 2 or a64.shape[1] != b64.shape[0]:
        raise ValueError(f"matmul_scaled needs a (M, K) and b (K, N), got {a64.shape} and {b64.shape}")
    m, k = a64.shape
    n = b64.shape[1]
    sb_k = acc.scale_block
    if k % sb_k:
        raise ValueError(f"K = {k} is not a multiple of the model's scale_block = {sb_k}")
    if sa64.shape != (m, k // sb_k) or sb64.shape != (k // sb_k, n):
        raise ValueError(
            f"a_scales must be {(m, k // sb_k)} and b_scales {(k // sb_k, n)}, got {sa64.shape} and {sb64.shape}"
        )
    c3 = np.zeros((1, m, n)) if c is None else np.array(_as_float_array(c, "c"), dtype=np.float64).reshape(1, m, n)
    sa_e = np.ascontiguousarray(np.repeat(sa64, sb_k, axis=1))[None]
    sb_e = np.ascontiguousarray(np.repeat(sb64, sb_k, axis=0))[None]
    if engine not in ("vector", "reference"):
        raise ValueError(f"engine must be 'vector' or 'reference', got {engine!r}")
    if engine == "vector":
        res = scaled_rows(a64, b64, sa_e[0], sb_e[0], c3[0], acc)
        if res is not None:
            return res
    out = np.empty((1, m, n))
    run_rows(
        _scaled_rows, m, np.ascontiguousarray(a64)[None], np.ascontiguousarray(b64)[None], sa_e, sb_e, c3, out,
        acc_params(acc),
    )  # fmt: skip
    return out[0]


def dot(a: np.ndarray, b: np.ndarray, c: float = 0.0, *, acc: Model | Interleaved) -> float:
    """Emulated ``c + a . b`` of two 1-D arrays under an accumulation model (Interleaved: k reordered)."""
    a64 = _as_float_array(a, "a")
    b64 = _as_float_array(b, "b")
    if a64.ndim != 1 or b64.shape != a64.shape:
        raise ValueError(f"dot needs two 1-D arrays of equal length, got {a.shape} and {b.shape}")
    _no_scales(acc)
    if isinstance(acc, Interleaved):
        order = acc.order(a64.shape[0])
        a64, b64, acc = a64[order], b64[order], acc.inner
    return float(dot_acc(a64, b64, float(c), acc_params(acc)))
