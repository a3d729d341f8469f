"""Test tolerances from a plan's numerics: the ``rtol``, ``atol`` a kernel that computes with the plan's formats
and roundings meets against the float64 attention of the same inputs.

:func:`tolerance` draws ``samples`` random inputs of the given shapes, runs the emulator under the plan (method
``"emulator"``: what a kernel with those numerics outputs, bit for bit) or evaluates the a priori worst-case bound of
:mod:`simfloat.bounds` (method ``"bound"``: what any kernel within the plan's rounding model may output), and measures
each output element's distance to the float64 attention. Those distances, normalized as ``z = err / (a0 + |ref|)``
(``a0`` the median ``|ref|``), are reduced to one draw per query row (the row's largest z: a row's elements share its
rounded softmax weights, so they are not independent), and the draws of each row index are pooled over the samples and
heads. A whole output inside with probability ``confidence`` is asked of each of its R rows at ``1 - (1 - confidence)
/ R`` (the union bound, whatever the dependence between the rows); each row index's upper tail is extrapolated to that
level with an exponential tail fitted to its largest values (peaks over a threshold; a tail lighter than exponential,
such as a Gaussian one or the bounded error of a final rounding, is over-estimated, which errs on the safe side), and
the largest over the row indices is taken (rows differ: a causal row sees as many keys as its index). The tolerance is
then ``rtol = t``, ``atol = t * a0`` (never below the largest z seen).

:func:`fit_tolerance` is that last step alone, for errors measured elsewhere (:func:`simfloat.explain` fits
the emulator's own error on the user's inputs with it, every row pooled).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from simfloat.attention import Plan, baseline, flash
from simfloat.attention import plan as _plan
from simfloat.attention._inputs import input_format as _plan_input_format
from simfloat.attention._inputs import kv_repeats
from simfloat.bounds import baseline_bound, flash_bound
from simfloat.rounding import round as _round

__all__ = ["Tolerance", "fit_tolerance", "reference64", "tolerance"]

METHODS = ("emulator", "bound")


class Tolerance(NamedTuple):
    """A relative and an absolute tolerance: ``|out - ref| <= atol + rtol * |ref|`` element-wise, as
    ``numpy.testing.assert_allclose(out, ref, rtol=..., atol=...)`` and ``torch.testing.assert_close`` test it.

    Unpacks as ``rtol, atol = tol``; ``**tol.kwargs`` passes both by name.

    Attributes:
        rtol: relative tolerance (>= 0).
        atol: absolute tolerance (>= 0).
    """

    rtol: float
    atol: float

    @property
    def kwargs(self) -> dict[str, float]:
        """``{"rtol": rtol, "atol": atol}``, for ``assert_close(out, ref, **tol.kwargs)``."""
        return {"rtol": self.rtol, "atol": self.atol}

    def inside(self, out: np.ndarray, ref: np.ndarray) -> np.ndarray:
        """Element-wise ``|out - ref| <= atol + rtol * |ref|`` (NaN anywhere, or an infinity where the other is
        not the same infinity, is outside), as a boolean array of the broadcast shape."""
        o = np.asarray(out, dtype=np.float64)
        r = np.asarray(ref, dtype=np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            ok = np.abs(o - r) <= self.atol + self.rtol * np.abs(r)
        same_inf = np.isinf(o) & (o == r)
        return np.asarray(ok | same_inf)


def reference64(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = False, scale: float | None = None
) -> np.ndarray:
    """Softmax attention ``softmax(scale * q k^T [mask]) v`` in float64, the reference of :func:`tolerance`.

    Args:
        q: (..., seq_q, head_dim); k: (..., seq_k, head_dim); v: (..., seq_k, head_dim_v); leading dims
            broadcast, k and v may have fewer heads (axis -3) than q (grouped-query: q head h reads kv head
            ``h // (q_heads // kv_heads)``, as :func:`simfloat.attention.flash`).
        causal: top-left aligned mask (query i sees keys j <= i).
        scale: softmax scale (default 1/sqrt(head_dim)).

    Returns:
        (..., seq_q, head_dim_v) float64 array (rows that see no key: NaN).
    """
    q64, k64, v64 = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    for name, x in (("k", k64), ("v", v64)):
        reps = kv_repeats(q64.shape, x.shape, name)
        if reps > 1:
            if name == "k":
                k64 = np.repeat(k64, reps, axis=-3)
            else:
                v64 = np.repeat(v64, reps, axis=-3)
    c = 1.0 / math.sqrt(q64.shape[-1]) if scale is None else float(scale)
    s = (q64 @ np.swapaxes(k64, -1, -2)) * c
    if causal:
        i = np.arange(s.shape[-2])[:, None]
        j = np.arange(s.shape[-1])[None, :]
        s = np.where(j > i, -np.inf, s)
    with np.errstate(invalid="ignore"):
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
    return np.asarray(p @ v64)


def check_confidence(confidence: object) -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)):
        raise TypeError(f"confidence must be a real number, got {type(confidence).__name__}")
    if not 0.0 < float(confidence) < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return float(confidence)


def fit_tolerance(
    errors: Sequence[np.ndarray],
    refs: Sequence[np.ndarray],
    *,
    confidence: float = 0.99,
    elements: int | None = None,
    by_row: bool = True,
) -> Tolerance:
    """The tolerance that covers a whole output of ``elements`` elements with probability ``confidence``, from
    measured errors (the module's docstring: union bound over the rows, exponential tail).

    The unit is a query row (the elements of one row share its rounded softmax weights, so they are not
    independent): each row's largest ``z`` is one draw, and the draws of each row index are pooled over the
    samples and the other leading axes. Rows differ (a causal row sees as many keys as its index, a row of a
    partial tile other roundings), so each row index's tail is extrapolated on its own, to the level
    ``(1 - confidence) / rows`` (rows: the query rows of one output, ``elements / head_dim_v``), and the largest
    is taken (``by_row=False``: every row pooled, for few samples of rows alike).

    Args:
        errors: per sample, the (..., seq_q, head_dim_v) array of ``|out - ref|`` (>= 0); every sample of one
            shape. Elements that are not finite (in the error or the reference) are left out.
        refs: per sample, the reference of the same shape.
        confidence: in (0, 1).
        elements: the size of one output (default: that of the first sample).
        by_row: extrapolate each row index on its own (default) or all rows pooled.

    Returns:
        A :class:`Tolerance` with ``atol = rtol * a0``, ``a0`` the median ``|ref|`` (or its largest value where
        that is 0, or 1).

    Raises:
        ValueError: no samples, shapes that differ, negative errors, no finite element, a bad ``confidence``.
    """
    conf = check_confidence(confidence)
    if len(errors) == 0 or len(errors) != len(refs):
        raise ValueError(f"fit_tolerance needs one reference per error sample, got {len(errors)} and {len(refs)}")
    errs = [np.asarray(e, dtype=np.float64) for e in errors]
    rs = [np.abs(np.asarray(r, dtype=np.float64)) for r in refs]
    for e, r in zip(errs, rs, strict=True):
        if e.shape != r.shape or e.shape != errs[0].shape:
            raise ValueError(
                f"error samples and references must share one shape: {e.shape} and {r.shape} (first {errs[0].shape})"
            )
        if np.any(e < 0):
            raise ValueError("errors must be >= 0 (absolute differences)")
    n = int(elements) if elements is not None else errs[0].size
    if n < 1:
        raise ValueError(f"elements must be >= 1, got {n}")
    e_all = np.stack(errs)
    r_all = np.stack(rs)
    ok = np.isfinite(e_all) & np.isfinite(r_all)
    if not ok.any():
        raise ValueError("fit_tolerance: no finite element to fit")
    a0 = float(np.median(r_all[ok]))
    if not a0 > 0:
        top = float(np.max(r_all[ok]))
        a0 = top if top > 0 else 1.0
    with np.errstate(invalid="ignore"):
        z = np.where(ok, e_all / (a0 + r_all), -np.inf)
    # the unit is a query row: its elements share the row's softmax (its rounded weights), so they are not
    # independent draws; a row's largest z is one draw of the row's distribution
    cols = z.shape[-1] if z.ndim >= 2 else 1
    zr = z.max(axis=-1) if z.ndim >= 2 else z  # (samples, ..., rows)
    if zr.ndim >= 2 and by_row:  # (samples, ..., rows) -> (rows, everything else)
        zr = np.moveaxis(zr, -1, 0).reshape(zr.shape[-1], -1)
    else:
        zr = zr.reshape(1, -1)
    p = (1.0 - conf) / max(1, -(-n // cols))  # per row of one output: the union bound over its rows
    t = 0.0
    for row in zr:
        vals = np.sort(row[np.isfinite(row)])
        if vals.size:
            t = max(t, _tail_quantile(vals, p))
    return Tolerance(t, t * a0)


def _tail_quantile(z: np.ndarray, p: float) -> float:
    """The value exceeded with probability ``p`` by a draw of the distribution of the sorted sample ``z``:
    the empirical quantile where the sample reaches it, else an exponential tail fitted to the largest tenth
    (at most 2000, at least 10 values; mean excess over the threshold), never below the sample's maximum."""
    n = z.size
    top = float(z[-1])
    k = int(min(max(n // 10, 10), 2000, n - 1)) if n > 1 else 0
    if k < 1:
        return top * 2.0 if top > 0 else 0.0
    if n * p >= k:  # inside the sample: the empirical quantile
        return float(np.quantile(z, 1.0 - p))
    u = float(z[n - k - 1])
    beta = float(np.mean(z[n - k :] - u))
    if not beta > 0:  # a flat top (every large value equal, e.g. all zero)
        return top
    return max(top, u + beta * math.log(k / (n * p)))


def _shapes(
    q_shape: object, k_shape: object, v_dim: object
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    def dims(x: object, name: str) -> tuple[int, ...]:
        if not isinstance(x, (tuple, list)) or any(
            isinstance(d, bool) or not isinstance(d, (int, np.integer)) for d in x
        ):
            raise TypeError(f"{name} must be a tuple of ints, got {x!r}")
        t = tuple(int(d) for d in x)
        if len(t) < 2:
            raise ValueError(f"{name} needs at least (seq, head_dim), got {t}")
        if any(d < 1 for d in t):
            raise ValueError(f"{name} dimensions must be >= 1, got {t}")
        return t

    qs = dims(q_shape, "q_shape")
    ks = qs if k_shape is None else dims(k_shape, "k_shape")
    if ks[-1] != qs[-1]:
        raise ValueError(f"q and k head_dim differ: q_shape {qs}, k_shape {ks}")
    if len(ks) >= 3 and len(qs) >= 3:
        kv_repeats(qs, ks, "k")  # grouped-query rule (raises)
    if v_dim is None:
        dv = ks[-1]
    else:
        if isinstance(v_dim, bool) or not isinstance(v_dim, (int, np.integer)) or v_dim < 1:
            raise ValueError(f"v_dim must be a positive int, got {v_dim!r}")
        dv = int(v_dim)
    return qs, ks, ks[:-1] + (dv,)


def _stds(input_std: object) -> tuple[float, float, float]:
    vals = input_std if isinstance(input_std, (tuple, list)) else (input_std,) * 3
    if len(vals) != 3:
        raise ValueError(f"input_std is one standard deviation or three (q, k, v), got {input_std!r}")
    out = []
    for x in vals:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise TypeError(f"input_std must hold real numbers, got {input_std!r}")
        if not (math.isfinite(x) and x > 0):
            raise ValueError(f"input_std must be finite and > 0, got {input_std!r}")
        out.append(float(x))
    return out[0], out[1], out[2]


def tolerance(
    plan: Plan | str,
    q_shape: Sequence[int],
    k_shape: Sequence[int] | None = None,
    *,
    confidence: float = 0.99,
    causal: bool = False,
    scale: float | None = None,
    block_m: int = 64,
    block_n: int = 64,
    v_dim: int | None = None,
    input_std: float | tuple[float, float, float] = 1.0,
    input_format: str | None = None,
    method: str = "emulator",
    samples: int = 8,
    seed: int = 0,
) -> Tolerance:
    """``rtol, atol`` for testing a kernel with ``plan``'s numerics against the float64 attention.

    What it guarantees: for q, k, v drawn as here (each element independent ``N(0, std^2)``, ``std`` from
    ``input_std``, rounded into ``input_format``) and ``ref`` the float64 attention of those same rounded inputs
    (:func:`reference64`: ``softmax(scale * q k^T [mask]) v``), a kernel output ``out`` that matches the plan
    satisfies ``|out - ref| <= atol + rtol * |ref|`` at **every** element of the output, with probability at
    least ``confidence`` over the draw of the inputs. "Matches the plan" is, for ``method="emulator"``, the
    output of :func:`simfloat.attention.flash` (or ``baseline``) under the plan bit for bit, as a kernel the
    emulator reproduces gives it (the h200-<fmt> plans on an H200: within the tolerance too are kernels that
    differ from the emulator by a few last-place units, as the triton-<fmt> plans do on a GPU); for
    ``method="bound"``, any output inside the a priori worst-case bound of :mod:`simfloat.bounds` (every op
    rounded into the plan's formats, in any order the bound's model allows: wider).

    The probability is an estimate: from ``samples`` draws, one value per query row (its largest normalized error),
    extrapolated per row index with an exponential tail to the level ``1 - (1 - confidence) / R`` (R: the output's
    rows, heads included; the union bound): see the module :mod:`simfloat.tolerances`. Inputs of another
    distribution (heavy tails, outliers, much larger scores) need a tolerance drawn from it. Deterministic: the same
    arguments give the same numbers.

    Args:
        plan: a :class:`~simfloat.attention.Plan` or preset name; run by flash when it is for the flash
            kernel (``plan.kernels()``), else by baseline.
        q_shape: (..., seq_q, head_dim), e.g. (batch, heads, seq_q, head_dim).
        k_shape: (..., seq_k, head_dim) of k (and v; default ``q_shape``); fewer heads than q: grouped-query.
        confidence: in (0, 1): the probability that the whole output is inside.
        causal: top-left aligned mask, as the kernel under test.
        scale: softmax scale (default 1/sqrt(head_dim)).
        block_m, block_n: the kernel's tiles (flash).
        v_dim: head_dim_v (default head_dim).
        input_std: the standard deviation of q, k and v, or three (q, k, v).
        input_format: the format the inputs are rounded into (default: the plan's input format, its field,
            e.g. bf16 for ``triton-bf16``; float32 for plans without one).
        method: ``"emulator"`` (default) or ``"bound"`` (the module's docstring).
        samples: number of input draws (>= 1); more tighten the estimate of the tail.
        seed: seed of the draws (int >= 0).

    Returns:
        A :class:`Tolerance` (``rtol, atol = ...``; ``**tol.kwargs`` for ``assert_close``).

    Raises:
        ValueError: bad shapes, confidence, samples, seed, method, input_std, formats; a plan the bound does
            not cover (``method="bound"``), an output that is not finite.
        TypeError: arguments of the wrong type.
    """
    pl = _plan(plan) if isinstance(plan, str) else plan
    if not isinstance(pl, Plan):
        raise TypeError(f"plan must be a Plan or a preset name, got {type(plan).__name__}")
    conf = check_confidence(confidence)
    qs, ks, vs = _shapes(q_shape, k_shape, v_dim)
    sq, sk, sv = _stds(input_std)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    for name, val in (("samples", samples), ("seed", seed)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(val).__name__}")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    fmt = input_format if input_format is not None else (_plan_input_format(pl) or "float32")
    use_flash = "flash" in pl.kernels()
    rng = np.random.default_rng(seed)
    errors: list[np.ndarray] = []
    refs: list[np.ndarray] = []
    for _ in range(int(samples)):
        q, k, v = (
            _round((rng.standard_normal(shape) * std).astype(np.float32), fmt)
            for shape, std in ((qs, sq), (ks, sk), (vs, sv))
        )
        ref = reference64(q, k, v, causal=causal, scale=scale)
        if method == "bound":
            if use_flash:
                err = flash_bound(q, k, v, plan=pl, block_m=block_m, block_n=block_n, causal=causal, scale=scale)
            else:
                err = baseline_bound(q, k, v, plan=pl, causal=causal, scale=scale)
            e = np.asarray(err.worst, dtype=np.float64)
        else:
            if use_flash:
                out = flash(q, k, v, plan=pl, block_m=block_m, block_n=block_n, causal=causal, scale=scale)
            else:
                out = baseline(q, k, v, plan=pl, causal=causal, scale=scale)
            o = np.asarray(out, dtype=np.float64)
            if not np.all(np.isfinite(o)):
                raise ValueError(
                    f"plan {pl.name!r} gives a non-finite output on these inputs (overflow in a narrow format?): "
                    "no tolerance covers it; try a smaller input_std"
                )
            e = np.abs(o - ref)
        errors.append(e)
        refs.append(ref)
    return fit_tolerance(errors, refs, confidence=conf)
