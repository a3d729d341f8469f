"""The backward's operands checked and prepared on the host: the arrays and their head groups (:func:`check`),
the per-row statistics (:func:`operand_stats`), the softmax scale (:func:`scale_of`), D3's log-sum-exp from the
forward's stats (:func:`lse_from_stats`, through :func:`log_rounded`) and the Triton tutorial's pre-scaled K
(:func:`prescaled_k`).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from simfloat import ops as _ops
from simfloat.attention._inputs import check_qkv, kv_group, operand
from simfloat.attention.backward_plan import BackwardPlan, backward_plan
from simfloat.attention.plan import OpSpec
from simfloat.ops import log_dd
from simfloat.rounding import round as _round


def flat(x: np.ndarray, lead: tuple[int, ...]) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float64).reshape((math.prod(lead),) + x.shape[len(lead) :])


def check(q: object, k: object, v: object, o: object, do: object, lse: object | None) -> tuple[Any, ...]:
    """The operands checked, then the group size (query heads per key/value head), then lse if given."""
    qa, ka, va, oa, da = (operand(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (o, "o"), (do, "do")))
    lead = qa.shape[:-2]
    for name, x in (("o", oa), ("do", da)):
        if x.shape[:-2] != lead:
            raise ValueError(f"{name} has leading dims {x.shape[:-2]} but q has {lead}: q, o, do must share them")
    group = 1
    for name, x in (("k", ka), ("v", va)):
        kl = x.shape[:-2]
        if kl == lead:
            continue
        if len(kl) != len(lead) or not lead or kl[:-1] != lead[:-1]:
            raise ValueError(
                f"{name} has leading dims {kl} but q has {lead}: k and v must share q's leading dims, but for "
                "the head axis (third from last), whose size may divide q's (grouped-query attention)"
            )
        group = kv_group(lead[-1], kl[-1], name)
    if ka.shape[:-2] != va.shape[:-2]:
        raise ValueError(f"k and v must have the same leading dims (heads), got k {ka.shape}, v {va.shape}")
    check_qkv(qa, ka, va)
    want = qa.shape[:-1] + (va.shape[-1],)
    for name, x in (("o", oa), ("do", da)):
        if x.shape != want:
            raise ValueError(f"{name} must have shape (..., seq_q, head_dim_v) = {want}, got {x.shape}")
    if lse is None:
        return qa, ka, va, oa, da, group
    la = operand_stats(lse, "lse", neg_inf=True)  # -inf: a row that sees no key (checked by the caller)
    if la.shape != qa.shape[:-1]:
        raise ValueError(f"lse must have shape (..., seq_q) = {qa.shape[:-1]}, got {la.shape}")
    return qa, ka, va, oa, da, group, la


def operand_stats(x: object, name: str, neg_inf: bool = False) -> np.ndarray:
    """A per-row statistic (lse, m, l): a finite float32/float64 numpy array (-inf allowed with ``neg_inf``:
    the forward's m and lse of a row that sees no key)."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}")
    if x.dtype not in (np.float32, np.float64):
        raise TypeError(f"{name} must have dtype float32 or float64, got {x.dtype}")
    if not np.all(np.isfinite(x) | (neg_inf & (x == -np.inf))):
        raise ValueError(f"{name} has non-finite values" + ("" if neg_inf else " (the forward of a fully masked row?)"))
    return x


def scale_of(scale: object, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    s = float(scale)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"scale must be finite and > 0, got {s}")
    return s


def log_rounded(x: np.ndarray, spec: OpSpec, base2: bool) -> np.ndarray:
    """log2(x) (or ln x) of positive finite values rounded once into ``spec``: the float64 log decides unless it
    lies within 2**-46 (relative) of a rounding boundary; a double-double log then decides."""
    fmt, mode = spec.fmt, spec.mode
    with np.errstate(divide="ignore"):
        y = np.log2(x) if base2 else np.log(x)
    w = np.abs(y) * 2.0**-46
    r = _round(y, fmt, mode)
    near = _round(y - w, fmt, mode) != _round(y + w, fmt, mode)
    if np.any(near):
        h2, l2 = log_dd(2.0)
        ln2 = Fraction(h2) + Fraction(l2)
        idx = np.flatnonzero(near)
        vals = []
        for i in idx:
            xi = float(x.flat[i])
            mant, ex = math.frexp(xi)
            if base2 and mant == 0.5:  # a power of two: log2 is the integer itself
                vals.append(Fraction(ex - 1))
            else:
                h, lo = log_dd(xi)
                vals.append((Fraction(h) + Fraction(lo)) / ln2 if base2 else Fraction(h) + Fraction(lo))
        r.flat[idx] = _round(vals, fmt, mode)  # Fractions are rounded once from their exact value
    return r


def lse_from_stats(m: np.ndarray, l: np.ndarray, *, plan: BackwardPlan | str) -> np.ndarray:  # noqa: E741
    """D3: the log-sum-exp the backward recomputes P from, ``lse(m + lse(log2 l))`` (``ln`` without exp2).

    Args:
        m, l: (..., seq_q) the forward's stats (``flash(..., return_stats=True)``): the running maximum (log2
            units with exp2) and the row sum relative to it, l > 0; or m -inf and l 0 (a row that saw no key:
            its lse is -inf, as the kernels store it).
        plan: the backward plan (its ``lse`` op and ``exp2`` flag).

    Returns:
        (..., seq_q) float64 array of values of the lse op's format.

    Raises:
        TypeError, ValueError: non-arrays, other dtypes, shapes that differ, non-finite m or l <= 0.
    """
    pl = backward_plan(plan)
    ma, la = operand_stats(m, "m", neg_inf=True), operand_stats(l, "l")
    if ma.shape != la.shape:
        raise ValueError(f"m and l must have one shape, got {ma.shape} and {la.shape}")
    empty = (ma == -np.inf) & (la == 0)  # a row that saw no key: the forward's m -inf, l 0
    if np.any((la <= 0) & ~empty) or np.any((ma == -np.inf) & ~empty):
        raise ValueError(
            "l must be > 0 and m finite (the stats of a row that saw a key), or m -inf with l 0 (a row that saw none)"
        )
    logs = log_rounded(np.where(empty, 1.0, la.astype(np.float64)), pl.lse, pl.exp2)
    out = np.asarray(_ops.add(np.where(empty, 0.0, ma.astype(np.float64)), logs, pl.lse.fmt, pl.lse.mode))
    return np.where(empty, -np.inf, out).astype(np.float64)


def prescaled_k(k: np.ndarray, scale: float, pl: BackwardPlan) -> np.ndarray:
    """``k_scaled(opmath(k * opmath(scale / ln 2)))`` (the product rounded once into k_scaled without opmath):
    the Triton tutorial's ``arg_k = k * (sm_scale * RCP_LN2)``, a torch multiply by a Python float."""
    c = scale * (1.0 / math.log(2.0))
    ks = pl.k_scaled
    if pl.opmath is None:
        y = _ops.mul(k, float(_round(c, ks.fmt, ks.mode)), ks.fmt, ks.mode)
    else:
        y = _round(np.asarray(_ops.mul(k, float(_round(c, pl.opmath)), pl.opmath)), ks.fmt, ks.mode)
    return np.ascontiguousarray(y, dtype=np.float64)
