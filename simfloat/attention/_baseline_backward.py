"""What torch's eager autograd of the baseline attention computes in a format under a ``pytorch-<fmt>`` backward
plan (:func:`baseline_backward`; re-exported by :mod:`simfloat.attention.backward`).
"""

from __future__ import annotations

import numpy as np

from simfloat import ops as _ops
from simfloat.attention._backward_inputs import check, scale_of
from simfloat.attention._inputs import check_input_format, from_layout, to_layout
from simfloat.attention._masks import DENSE_ADD, MaskSpec, resolve_mask
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
    qf, kf, vf, df = (np.asarray(x, dtype=np.float64) for x in (qa, ka, va, da))
    if group > 1:  # k.repeat_interleave(group, dim=-3), v too: the gradients are summed over the group below
        kf, vf = np.repeat(kf, group, axis=-3), np.repeat(vf, group, axis=-3)
    spec = resolve_mask(
        lead=qf.shape[:-2],
        seq_q=qf.shape[-2],
        seq_k=kf.shape[-2],
        causal=bool(causal),
        attn_mask=attn_mask,
        key_lengths=key_lengths,
        window=window,
        causal_align=causal_align,
        empty_rows=empty_rows,
        fmt_round=lambda a: _r(a, pl.scale),
    )
    s = _scores(pl, qf, kf, sc, spec)  # qk, scale (+ attn_mask), into the softmax's format
    p = _softmax(pl, _masked(s, spec, bool(causal)), spec)  # P, masked keys -inf before the softmax
    dq, dk, dv = _grads(pl, p, qf, kf, vf, df, sc)
    if group > 1:  # the repeat's backward: a sum over the group's heads (a torch sum, as delta's)
        dk, dv = (_group_sum(x, group, pl) for x in (dk, dv))
    return to_layout(dq, layout), to_layout(dk, layout), to_layout(dv, layout)


def _r(x: np.ndarray, spec: OpSpec) -> np.ndarray:
    """``x`` rounded into the op's format and mode (a tensor's cast)."""
    return np.asarray(_round(np.asarray(x, dtype=np.float64), spec.fmt, spec.mode))


def _scaled(x: np.ndarray, spec: OpSpec, pl: BackwardPlan, sc: float) -> np.ndarray:
    """spec(x * scale), through the opmath format when the plan has one (torch's ``tensor * scale``)."""
    if pl.opmath is None:
        return np.asarray(_ops.mul(x, float(_r(np.array(sc), spec)), spec.fmt, spec.mode))
    y = _ops.mul(x, float(_round(sc, pl.opmath)), pl.opmath)
    return _r(np.asarray(y), spec)


def _scores(pl: BackwardPlan, qf: np.ndarray, kf: np.ndarray, sc: float, spec: MaskSpec | None) -> np.ndarray:
    """The forward's scores (..., Sq, Sk): ``scale(qk(q k^T) * scale)``, plus an additive mask (torch's
    ``scores + attn_mask``, in the opmath format when the plan has one, else the scale op's), rounded into the
    softmax op's format."""
    from simfloat.accumulate import matmul

    s = _scaled(matmul(qf, np.swapaxes(kf, -1, -2), acc=pl.qk), pl.scale, pl, sc)
    if spec is not None and spec.mask.dense == DENSE_ADD:
        bias = spec.mask.bias[spec.mask.bmap].reshape(s.shape)
        with np.errstate(invalid="ignore"):
            if pl.opmath is None:
                s = np.asarray(_ops.add(s, bias, pl.scale.fmt, pl.scale.mode))
            else:
                s = _r(np.asarray(_ops.add(s, bias, pl.opmath)), pl.scale)
    return _r(s, pl.softmax)


def _masked(s: np.ndarray, spec: MaskSpec | None, causal: bool) -> np.ndarray:
    """The scores with every key a row does not see at -inf (the mask's, else the causal triangle's)."""
    if spec is not None:
        return np.where(spec.visible.reshape(s.shape), s, -np.inf)
    if causal:
        seq_q, seq_k = s.shape[-2:]
        return np.where(np.arange(seq_k)[None, :] > np.arange(seq_q)[:, None], -np.inf, s)
    return s


def _softmax(pl: BackwardPlan, s: np.ndarray, spec: MaskSpec | None) -> np.ndarray:
    """P = ``p(softmax(s))``, the softmax in its op's format: max, ``exp(s - max)``, sequential sum, divide, each
    rounded; a row that sees no key gets P = 0 (``empty_rows="zero"``, torch's safe softmax) or NaN."""
    f, mo = pl.softmax.fmt, pl.softmax.mode
    mx = s.max(axis=-1, keepdims=True)
    empty = None if spec is None or spec.empty_rows != "zero" else spec.empty.reshape(s.shape[:-1])[..., None]
    if empty is not None:
        mx = np.where(empty, 0.0, mx)  # the row's P is 0 (torch's safe softmax)
    with np.errstate(invalid="ignore"):
        e = np.asarray(_ops.exp(np.asarray(_ops.sub(s, mx, f, mo)), f, mo))
        tot = np.asarray(_ops.sum(e, f, mo, axis=-1))[..., None]
        if empty is not None:
            tot = np.where(empty, 1.0, tot)
        return _r(np.asarray(_ops.div(e, tot, f, mo)), pl.p)


def _grads(
    pl: BackwardPlan, p: np.ndarray, qf: np.ndarray, kf: np.ndarray, vf: np.ndarray, df: np.ndarray, sc: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The backward (per query head): ``dv = dv(p^T do)``, ``dp = dp(do v^T)``, ``delta = delta(sum_j dp p)``
    (sequential), ``ds = ds(p * ds(dp - delta))``, its cast and ``grad_scale(ds * scale)``, ``dq = dq(ds k)``,
    ``dk = dk(ds^T q)``, each gradient cast into ``grad``."""
    from simfloat.accumulate import matmul

    dv = matmul(np.swapaxes(p, -1, -2), df, acc=pl.dv)
    dp = matmul(df, np.swapaxes(vf, -1, -2), acc=pl.dp)
    prod = np.asarray(_ops.mul(dp, p, pl.delta.fmt, pl.delta.mode))
    delta = np.asarray(_ops.sum(prod, pl.delta.fmt, pl.delta.mode, axis=-1))[..., None]
    ds = np.asarray(_ops.mul(p, np.asarray(_ops.sub(dp, delta, pl.ds.fmt, pl.ds.mode)), pl.ds.fmt, pl.ds.mode))
    ds = _scaled(_r(ds, pl.ds_cast), pl.grad_scale, pl, sc)
    dq = matmul(ds, kf, acc=pl.dq)
    dk = matmul(np.swapaxes(ds, -1, -2), qf, acc=pl.dk)
    return _r(dq, pl.grad), _r(dk, pl.grad), _r(dv, pl.grad)


def _group_sum(x: np.ndarray, group: int, pl: BackwardPlan) -> np.ndarray:
    """(..., heads, S, D) -> (..., heads // group, S, D): ``grad(sum_g x[h * group + g])``, the sum sequential
    over g in the delta op's format (a torch sum reduction, fp32 for a half-precision tensor)."""
    y = x.reshape(x.shape[:-3] + (x.shape[-3] // group, group) + x.shape[-2:])
    tot = np.asarray(_ops.sum(np.moveaxis(y, -3, -1), pl.delta.fmt, pl.delta.mode, axis=-1))
    return np.asarray(_round(tot, pl.grad.fmt, pl.grad.mode), dtype=np.float64)
