"""What torch's eager autograd of the baseline attention computes in a format under a ``pytorch-<fmt>`` backward
plan (:func:`baseline_backward`; re-exported by :mod:`simfloat.attention.backward`).
"""

from __future__ import annotations

import numpy as np

from simfloat import ops as _ops
from simfloat.attention._backward_inputs import check, scale_of
from simfloat.attention._inputs import check_input_format, from_layout, to_layout
from simfloat.attention._masks import (
    DENSE_ADD,
    resolve_mask,
)
from simfloat.attention.backward_plan import BackwardPlan, backward_plan
from simfloat.attention.plan import OpSpec
from simfloat.rounding import round as _round


def baseline_backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray,
    *,
    plan: BackwardPlan | str = "pytorch-bf16",
    causal: bool = False,
    scale: float | None = None,
    layout: str = "bhsd",
    attn_mask: np.ndarray | None = None,
    key_lengths: object = None,
    window: tuple[int, int] | None = None,
    causal_align: str = "top-left",
    empty_rows: str = "zero",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What eager autograd of ``softmax(scale * q @ k^T [mask]) @ v`` computes, under a backward plan.

    The op order (torch's eager kernels; ``pytorch-<fmt>``: matmuls accumulated in fp32 and rounded once):
    forward ``s = qk(q k^T)``, ``s = scale(s * scale)`` (with ``plan.opmath``: ``scale(opmath(s *
    opmath(scale)))``, as the ``grad_scale`` multiply below), ``p = p(softmax(s))`` (the softmax in its op's format:
    max, ``exp(s - max)``, sequential sum, divide, each rounded); backward ``dv = dv(p^T do)``,
    ``dp = dp(do v^T)``, ``delta_i = delta(sum_j dp_ij p_ij)`` (sequential), ``ds = ds(p * ds(dp - delta))``,
    ``ds = ds_cast(ds)``, ``ds = grad_scale(ds * scale)``, ``dq = dq(ds k)``, ``dk = dk(ds^T q)``, each gradient
    cast into ``grad``. The order of torch's vectorized row sums is not modelled (sequential here). With fewer
    key/value heads than query heads (grouped-query attention), k and v are repeated per query head
    (``repeat_interleave``, :func:`simfloat.attention._inputs.kv_group`'s mapping) and the gradient of a
    key/value head is ``grad(sum_g dk_g)``: the group's per-head gradients (each in ``grad``) summed in
    increasing head order in the ``delta`` op's format (torch's sum reduction), then cast into ``grad``.

    Args:
        q, k, v, do: as :func:`flash_backward` (no o or lse: the softmax is recomputed; k and v may have fewer
            heads than q).
        plan: backward plan or preset name (default ``"pytorch-bf16"``; ``"fp64"``, ...).
        causal, scale: as the forward. layout: ``"bhsd"`` or ``"bshd"``, as :func:`flash_backward`.
        attn_mask, key_lengths, window, causal_align, empty_rows: the forward's mask, as
            :func:`~simfloat.attention.baseline`: an additive mask rounded into the scale op's format and
            added after the scale multiply (``scale(opmath(s + mask))`` with ``plan.opmath``), masked scores
            -inf before the softmax; a row that sees no key has P = 0 (``"zero"``, torch's safe softmax) or NaN
            (``"nan"``, SDPA's math).

    Returns:
        (dq, dk, dv) float64 arrays of q's, k's, v's shapes.

    Raises:
        TypeError, ValueError: bad arrays, shapes, dtypes (named), scale or plan.
    """
    from simfloat.accumulate import matmul

    pl = backward_plan(plan)
    if pl.scale_at != "scores":
        raise ValueError(
            f"baseline_backward models torch's eager autograd (the scale on the scores); plan {pl.name!r} has "
            f"scale_at={pl.scale_at!r}, a flash_backward plan"
        )
    q, k, v, do = (from_layout(x, layout, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (do, "do")))
    qa, ka, va, _, da, group = check(q, k, v, do, do, None)
    check_input_format({"q": qa, "k": ka, "v": va, "do": da}, pl, stacklevel=3)
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    sc = scale_of(scale, qa.shape[-1])
    ops = _ops

    def r(x: np.ndarray, spec: OpSpec) -> np.ndarray:
        return np.asarray(_round(np.asarray(x, dtype=np.float64), spec.fmt, spec.mode))

    qf, kf, vf, df = (np.asarray(x, dtype=np.float64) for x in (qa, ka, va, da))
    if group > 1:  # k.repeat_interleave(group, dim=-3), v too: the gradients are summed over the group below
        kf, vf = np.repeat(kf, group, axis=-3), np.repeat(vf, group, axis=-3)
    kt = np.swapaxes(kf, -1, -2)

    def scaled(x: np.ndarray, spec: OpSpec) -> np.ndarray:
        """spec(x * scale), through the opmath format when the plan has one (torch's ``tensor * scale``)."""
        if pl.opmath is None:
            return np.asarray(ops.mul(x, float(r(np.array(sc), spec)), spec.fmt, spec.mode))
        y = ops.mul(x, float(_round(sc, pl.opmath)), pl.opmath)
        return r(np.asarray(y), spec)

    s = scaled(matmul(qf, kt, acc=pl.qk), pl.scale)
    f, mo = pl.softmax.fmt, pl.softmax.mode
    seq_q, seq_k = s.shape[-2:]
    spec = resolve_mask(
        lead=s.shape[:-2],
        seq_q=seq_q,
        seq_k=seq_k,
        causal=bool(causal),
        attn_mask=attn_mask,
        key_lengths=key_lengths,
        window=window,
        causal_align=causal_align,
        empty_rows=empty_rows,
        fmt_round=lambda a: r(a, pl.scale),
    )
    if spec is not None and spec.mask.dense == DENSE_ADD:  # torch's scores + attn_mask
        bias = spec.mask.bias[spec.mask.bmap].reshape(s.shape)
        with np.errstate(invalid="ignore"):
            if pl.opmath is None:
                s = np.asarray(ops.add(s, bias, pl.scale.fmt, pl.scale.mode))
            else:
                s = r(np.asarray(ops.add(s, bias, pl.opmath)), pl.scale)
    s = r(s, pl.softmax)
    if spec is not None:
        s = np.where(spec.visible.reshape(s.shape), s, -np.inf)
    elif causal:
        mask = np.arange(seq_k)[None, :] > np.arange(seq_q)[:, None]
        s = np.where(mask, -np.inf, s)
    mx = s.max(axis=-1, keepdims=True)
    empty = None if spec is None else spec.empty.reshape(s.shape[:-1])
    if empty is not None and spec is not None and spec.empty_rows == "zero":
        mx = np.where(empty[..., None], 0.0, mx)  # the row's P is 0 (torch's safe softmax)
    with np.errstate(invalid="ignore"):
        e = np.asarray(ops.exp(np.asarray(ops.sub(s, mx, f, mo)), f, mo))
        tot = np.asarray(ops.sum(e, f, mo, axis=-1))[..., None]
        if empty is not None and spec is not None and spec.empty_rows == "zero":
            tot = np.where(empty[..., None], 1.0, tot)
        p = r(np.asarray(ops.div(e, tot, f, mo)), pl.p)
    dv = matmul(np.swapaxes(p, -1, -2), df, acc=pl.dv)
    dp = matmul(df, np.swapaxes(vf, -1, -2), acc=pl.dp)
    prod = np.asarray(ops.mul(dp, p, pl.delta.fmt, pl.delta.mode))
    delta = np.asarray(ops.sum(prod, pl.delta.fmt, pl.delta.mode, axis=-1))[..., None]
    ds = np.asarray(ops.mul(p, np.asarray(ops.sub(dp, delta, pl.ds.fmt, pl.ds.mode)), pl.ds.fmt, pl.ds.mode))
    ds = r(ds, pl.ds_cast)
    ds = scaled(ds, pl.grad_scale)
    dq = matmul(ds, kf, acc=pl.dq)
    dk = matmul(np.swapaxes(ds, -1, -2), qf, acc=pl.dk)
    dk, dv = r(dk, pl.grad), r(dv, pl.grad)
    if group > 1:  # the repeat's backward: a sum over the group's heads (a torch sum, as delta's)
        dk, dv = (_group_sum(x, group, pl) for x in (dk, dv))
    return to_layout(r(dq, pl.grad), layout), to_layout(dk, layout), to_layout(dv, layout)


def _group_sum(x: np.ndarray, group: int, pl: BackwardPlan) -> np.ndarray:
    """(..., heads, S, D) -> (..., heads // group, S, D): ``grad(sum_g x[h * group + g])``, the sum sequential
    over g in the delta op's format (a torch sum reduction, fp32 for a half-precision tensor)."""
    y = x.reshape(x.shape[:-3] + (x.shape[-3] // group, group) + x.shape[-2:])
    tot = np.asarray(_ops.sum(np.moveaxis(y, -3, -1), pl.delta.fmt, pl.delta.mode, axis=-1))
    return np.asarray(_round(tot, pl.grad.fmt, pl.grad.mode), dtype=np.float64)
