"""A priori forward-error bounds for the flash and baseline attention plans: worst case and probabilistic.

For a plan, the tile sizes and the inputs, :func:`flash_bound` and :func:`baseline_bound` bound, component by
component, the distance of what the emulator computes (:func:`simfloat.attention.flash` /
:func:`~simfloat.attention.baseline`) from the exact attention ``softmax(scale * q k^T) v``. The derivation is
docs/bounds.md; the labels (B1), (B2), ... in the comments below are its equations.

* Every rounding into a format of precision p satisfies ``fl(x) = x (1 + d) + e``, ``|d| <= u``, ``|e| <= eta``
  (B1): ``u = 2^-p`` for round to nearest, ``2^(1-p)`` for the directed, truncating and odd modes; ``eta`` is
  half the subnormal spacing (nearest), the whole spacing (other modes), or the smallest normal for a format
  without subnormals. So subnormal results and flushes are covered by absolute terms; overflow is not (a clear
  error is raised where a bound on an intermediate reaches the format's largest value).
* Chains of roundings multiply: ``|prod (1 + d_k) - 1| <= prod (1 + u_k) - 1`` (B2), the classical
  ``gamma_n = n u / (1 - n u)`` being an upper bound of it; tensor-core blocks (:class:`BlockFMA`) add their
  alignment truncation ``(block + 1) 2^-F`` to each step (B3).
* The probabilistic bound replaces, in every chain of round-to-nearest roundings, (B2) by Higham and Mary's
  ``exp(lambda sqrt(sum u_k^2) + sum u_k^2 / (1 - u)) - 1`` (B4), which holds with probability at least
  ``1 - 2 exp(-lambda^2 (1 - u)^2 / 2)`` when those rounding errors are independent with mean zero (their
  model, not a property of deterministic rounding). Directed, truncating and hardware-approximation errors keep
  their worst case. lambda is chosen so that, by the union bound over every chain a query row uses, the bound
  of a row fails with probability at most ``failure_probability`` (B13).
* The softmax enters through a perturbation lemma (B10): computed weights ``w_j (1 + eps_j)`` in both the
  numerator and the denominator, plus errors ``a_jd`` only the numerator sees (P cast, P.V accumulation,
  accumulator rescaling, division) and ``b_j`` only the denominator sees (row sums), give
  ``|o_hat - o| <= [sum pi_j (|eps_j| |v_jd - o_d| + (1 + |eps_j|)(|a_jd| |v_jd| + |b_j| |o_d|)) + abs] / low``
  with ``pi = softmax`` in float64: one-signed or constant V cancels the weight errors, as it does in the
  kernel.

The quantities from the inputs (scores, their magnitudes ``|q| |k|``, softmax weights, ``|v_j - o|``) are
computed in float64; their own float64 errors are covered by a relative slack of ``2^-40`` and an absolute
term of the float64 evaluation (B14).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, cast

import numpy as np

from simfloat.accumulate import BlockFMA, Chunked, Model, Sequential
from simfloat.attention._build import clamp_blocks
from simfloat.attention._inputs import block, prepare
from simfloat.attention.plan import OpSpec, Plan
from simfloat.formats import FloatFormat
from simfloat.formats import format as _format
from simfloat.hardware import h200_ex2
from simfloat.rounding import RoundingMode, mode_code

__all__ = [
    "AttentionBound",
    "Rounding",
    "attribution_bounds",
    "baseline_bound",
    "chain_constant",
    "dot_constant",
    "ex2_h200_error",
    "flash_bound",
    "rounding",
]

_NEAREST = (RoundingMode.NEAREST_EVEN, RoundingMode.NEAREST_AWAY)
_LIBM = 2.0**-51  # relative error of libm's float64 exp / exp2 (within one float64 ulp), (B6)
_SLACK = 2.0**-40  # relative slack for the float64 evaluation of the bound itself, (B14)
_LOG2E = math.log2(math.e)


@dataclass(frozen=True)
class Rounding:
    """The error model (B1) of one rounding into a format: ``fl(x) = x (1 + d) + e``.

    Attributes:
        u: unit roundoff, ``|d| <= u``.
        eta: absolute underflow term, ``|e| <= eta``.
        nearest: the mode rounds to nearest (its errors enter the probabilistic model, B4).
        max: the format's largest finite value (overflow is outside every bound).
    """

    u: float
    eta: float
    nearest: bool
    max: float


def rounding(fmt: FloatFormat | str, mode: RoundingMode | str | int = "nearest_even") -> Rounding:
    """The error model of rounding into ``fmt`` with ``mode`` (B1).

    Args:
        fmt: a format or its name.
        mode: a rounding mode other than stochastic.

    Returns:
        ``u = 2^-p`` (nearest) or ``2^(1-p)`` (toward zero, up, down, odd), p = mantissa bits + 1; ``eta`` half
        the subnormal spacing (nearest) or the whole of it, or the smallest normal without subnormals.

    Raises:
        ValueError: stochastic rounding (no deterministic bound).
    """
    f = _format(fmt)
    m = mode_code(mode)
    if m == RoundingMode.STOCHASTIC:
        raise ValueError("mode: stochastic rounding has no worst-case bound here")
    near = m in _NEAREST
    p = f.mantissa_bits + 1
    u = 2.0**-p if near else 2.0 ** (1 - p)
    if f.subnormals:
        eta = f.smallest_subnormal / 2 if near else f.smallest_subnormal
    else:
        eta = f.tiny
    return Rounding(u, eta, near, f.max)


def _op(spec: OpSpec) -> Rounding:
    return rounding(spec.fmt, spec.mode)


def _holds_float32(f: FloatFormat) -> bool:
    return f.mantissa_bits >= 23 and f.emin <= -126 and f.emax >= 127 and f.subnormals


@lru_cache(maxsize=1)
def ex2_h200_error() -> float:
    """Largest relative error of :func:`simfloat.hardware.ex2_approx_f32` for normal results (B7).

    Every table entry ``T-(f)`` / ``T+(f)`` (f = i 2^-23) is compared with the exact ``2^-f`` / ``2^f``
    (float64), and the truncation of the fraction of ``|x|`` to 23 bits adds ``2^(2^-23) - 1``.

    Returns:
        r such that ``|ex2(x) - 2^x| <= r 2^x`` whenever ``2^x >= 2^-126`` (below it the result is flushed:
        an absolute error below ``2^-126``).
    """
    from simfloat.hardware import ex2_approx

    # every float32 of (-2, -1] and [1, 2): i = 1 and the fraction f runs over every table entry exactly
    grid = (1.0 + np.arange(2**23, dtype=np.float64) * 2.0**-23).astype(np.float32)
    worst = 0.0
    for x in (-grid, grid):
        exact = np.exp2(x.astype(np.float64))
        worst = max(worst, float(np.max(np.abs(ex2_approx(x, ftz=True).astype(np.float64) - exact) / exact)))
    trunc = math.expm1(2.0**-23 * math.log(2.0))
    return (1 + worst + 2.0**-50) * (1 + trunc) - 1


# -- chains of roundings (B2, B3, B4) ------------------------------------------------------------------------


class _Chain:
    """Per-element sums describing a product of roundings ``prod (1 + d_k)`` (arrays broadcast)."""

    def __init__(self) -> None:
        self.up: float | np.ndarray = 0.0  # sum log1p(u_k) over every rounding (B2)
        self.lo: float | np.ndarray = 0.0  # sum log1p(-u_k) over every rounding
        self.q2: float | np.ndarray = 0.0  # sum u_k^2 over round-to-nearest roundings (B4)
        self.dup: float | np.ndarray = 0.0  # sum log1p(u_k) over the others (kept worst case in B4)
        self.dlo: float | np.ndarray = 0.0
        self.umax = 0.0

    def add(self, count: object, r: Rounding | tuple[float, bool]) -> _Chain:
        u, near = (r.u, r.nearest) if isinstance(r, Rounding) else r
        n = np.asarray(count, dtype=np.float64)
        if u == 0.0:
            return self
        self.up = self.up + n * math.log1p(u)
        self.lo = self.lo + n * math.log1p(-u)
        if near:
            self.q2 = self.q2 + n * u * u
            self.umax = max(self.umax, u)
        else:
            self.dup = self.dup + n * math.log1p(u)
            self.dlo = self.dlo + n * math.log1p(-u)
        return self

    def extend(self, other: _Chain) -> _Chain:
        self.up = self.up + other.up
        self.lo = self.lo + other.lo
        self.q2 = self.q2 + other.q2
        self.dup = self.dup + other.dup
        self.dlo = self.dlo + other.dlo
        self.umax = max(self.umax, other.umax)
        return self

    def bounds(self, lam: float | None) -> tuple[np.ndarray, np.ndarray]:
        """(upper, lower) of ``prod (1 + d_k)``: worst case (``lam`` None, B2) or Higham-Mary (B4)."""
        if lam is None:
            return np.exp(np.asarray(self.up, dtype=np.float64)), np.exp(np.asarray(self.lo, dtype=np.float64))
        q2 = np.asarray(self.q2, dtype=np.float64)
        t = lam * np.sqrt(q2) + q2 / (1 - self.umax)
        # the probabilistic factor never exceeds the worst case one
        up = np.minimum(np.exp(t + self.dup), np.exp(np.asarray(self.up, dtype=np.float64)))
        lo = np.maximum(np.exp(-t + self.dlo), np.exp(np.asarray(self.lo, dtype=np.float64)))
        return up, lo


def chain_constant(n: int, u: float, *, lam: float | None = None) -> float:
    """``max |prod_{k<=n} (1 + d_k) - 1|`` over ``|d_k| <= u``: ``(1 + u)^n - 1 <= gamma_n`` (B2); with
    ``lam``, Higham and Mary's ``exp(lam sqrt(n) u + n u^2 / (1 - u)) - 1`` (B4), which holds with probability
    at least ``1 - 2 exp(-lam^2 (1 - u)^2 / 2)`` under their model."""
    c = _Chain().add(n, (u, lam is not None))
    return float(c.bounds(lam)[0]) - 1.0


# -- accumulation models (B3) --------------------------------------------------------------------------------


@dataclass
class _Dot:
    """What a dot model does to its terms: the chain every product goes through, the chain of the incoming
    accumulator, the number of roundings (each an absolute ``eta``) and the absolute alignment term."""

    term: _Chain
    acc: _Chain
    abs_steps: float  # sum of the absolute terms of one full dot: eta per rounding
    align: float  # coefficient of (max|a| + max|b|) + 2^(2 emin) per block (subnormal operands, B3)
    align_const: float
    out: Rounding
    inputs: Rounding | None = None
    extra: dict = field(default_factory=dict)


def _block_rounding(m: BlockFMA) -> tuple[tuple[float, bool], Rounding]:
    out = rounding(m.out_fmt, m.out_mode)
    t = (m.block + 1) * 2.0 ** (-m.fraction_bits)  # (B3): (block + 1) truncated terms below 2^(E - F)
    return (((1 + t) * (1 + out.u) - 1), False), out


def _inner(model: Sequential | BlockFMA, n: int) -> _Dot:
    if isinstance(model, Sequential):
        acc = rounding(model.fmt, model.mode)
        term = _Chain().add(n, acc)
        abs_steps = n * acc.eta
        if model.product_fmt is not None:
            prod = rounding(model.product_fmt, model.mode)
            term.add(1, prod)
            abs_steps += n * prod.eta
        inputs = rounding(model.input_fmt, model.input_mode) if model.input_fmt is not None else None
        return _Dot(term, _Chain().add(n, acc), abs_steps, 0.0, 0.0, acc, inputs, {"n": n})
    steps = -(-n // model.block)
    step, out = _block_rounding(model)
    inputs = rounding(model.input_fmt, model.input_mode) if model.input_fmt is not None else None
    align = align_const = 0.0
    if model.align == "exponent_sum" and model.operand_emin is not None:
        # (B3): a subnormal operand counts with 2^emin, so 2^E <= (|a| + 2^emin)(|b| + 2^emin)
        e = 2.0**model.operand_emin
        tr = (model.block + 1) * 2.0 ** (-model.fraction_bits)
        align, align_const = steps * tr * e, steps * tr * e * e
    return _Dot(
        _Chain().add(steps, step), _Chain().add(steps, step), steps * out.eta, align, align_const, out, inputs, {"n": n}
    )


def _dot(model: Model, n: int) -> _Dot:
    if isinstance(model, Chunked):
        size = model.chunk if model.chunk is not None else max(1, -(-n // int(model.splits or 1)))
        size = min(size, max(n, 1))
        chunks = -(-n // size)
        d = _inner(model.inner, size)
        outer = rounding(model.outer_fmt, model.outer_mode)
        d.align *= chunks
        d.align_const *= chunks
        d.abs_steps = d.abs_steps * chunks + chunks * outer.eta
        d.term.add(chunks, outer)
        d.acc = _Chain().add(chunks, outer)
        d.out = outer
        return d
    return _inner(model, n)


def dot_constant(model: Model, n: int, *, lam: float | None = None) -> float:
    """The relative constant of an accumulation model: ``|dot_hat - dot| <= C sum |a_k b_k|`` (+ absolute
    underflow terms) for n terms from zero, operands already in the input format (B3); with ``lam`` the
    probabilistic constant (B4, round-to-nearest chains only)."""
    d = _dot(model, n)
    if d.inputs is not None:
        d.term.add(2, d.inputs)
    return float(d.term.bounds(lam)[0]) - 1.0


def _with_inputs(d: _Dot) -> _Chain:
    c = _Chain().extend(d.term)
    if d.inputs is not None:
        c.add(2, d.inputs)
    return c


def _dot_abs(d: _Dot, amax: float, bmax: float) -> float:
    """Absolute error of one dot (B3): eta per rounding, subnormal alignment, input underflow."""
    a = d.abs_steps + d.align * (amax + bmax) + d.align_const
    if d.inputs is not None:
        e = d.inputs.eta
        a += d.extra.get("n", 1) * (e * (amax + bmax) + e * e)
    return a


def _exact_inputs(x: np.ndarray, d: _Dot, model: Model) -> bool:
    """Whether the operands are already values of the dot's input format (then its conversion is exact)."""
    inner = model.inner if isinstance(model, Chunked) else model
    if d.inputs is None:
        return True
    from simfloat.rounding import round as sround

    return bool(np.array_equal(sround(x, cast(FloatFormat, inner.input_fmt), inner.input_mode), x))


# -- results ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionBound:
    """Forward-error bounds of one attention kernel under one plan, per output component.

    Attributes:
        kernel: ``"flash"`` or ``"baseline"``.
        plan: the plan's name.
        worst: (..., seq_q, head_dim_v) bound on ``|O - O_exact|`` that always holds (B10-B12).
        probabilistic: the same shape: bound that holds for all components of a query row at once with
            probability at least ``1 - failure_probability`` under Higham and Mary's model (B13).
        failure_probability: the stated failure probability per query row.
        lam: Higham and Mary's lambda used (B13).
        terms: worst-case contributions by source, each (..., seq_q, head_dim_v), summing to ``worst``
            up to the final (1 + u) factors: ``weights`` (scores, scale, exp, max and alpha: the errors common
            to numerator and denominator), ``numerator`` (P cast, P.V, accumulator rescaling, division),
            ``denominator`` (row sums), ``absolute`` (underflow, subnormal alignment), ``output`` (the final
            casts).
    """

    kernel: str
    plan: str
    worst: np.ndarray
    probabilistic: np.ndarray
    failure_probability: float
    lam: float
    terms: dict[str, np.ndarray]

    def row_max(self, which: str = "worst") -> np.ndarray:
        """The bound's max over each row's components: ``which`` is ``"worst"`` or ``"probabilistic"``."""
        if which not in ("worst", "probabilistic"):
            raise ValueError(f"which must be 'worst' or 'probabilistic', got {which!r}")
        return np.max(getattr(self, which), axis=-1)


def _lam(chains: float, failure_probability: float, umax: float) -> float:
    """(B13): 2 C exp(-lam^2 (1 - u)^2 / 2) = failure_probability."""
    return math.sqrt(2.0 * math.log(2.0 * chains / failure_probability)) / (1.0 - umax)


def _check_fp(p: object) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        raise TypeError(f"failure_probability must be a real number, got {type(p).__name__}")
    if not 0.0 < float(p) < 1.0:
        raise ValueError(f"failure_probability must be in (0, 1), got {p}")
    return float(p)


def _not_covered(what: str) -> ValueError:
    return ValueError(f"bound not covered: {what}")


def _overflow(name: str, value: float, r: Rounding) -> None:
    if not value < r.max / 2:
        raise _not_covered(
            f"{name} may reach {value:.3g}, near the format's largest value {r.max:.3g} (overflow is outside the bound)"
        )


def _scores(q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 scores and |q| |k| magnitudes, with the float64 error of the scores folded into the latter."""
    s = q @ np.swapaxes(k, -1, -2)
    mag = np.abs(q) @ np.swapaxes(np.abs(k), -1, -2)
    d = q.shape[-1]
    mag = mag * (1 + (d + 2) * 2.0**-52)
    return s, mag


def _softmax_parts(w: np.ndarray, v: np.ndarray, vis: np.ndarray | None):
    """Softmax weights pi of one lead index (rows x keys), exact output o and sum pi |v - o| (B10)."""
    if vis is not None:
        w = np.where(vis, w, 0.0)
    pi = w / w.sum(axis=-1, keepdims=True)
    o = pi @ v
    return pi, o


def _lemma(pi, v, o, eps, fu, a_up, b_up, lowsum, abs_num, abs_den, chunk=16):
    """(B10): per component, numerator terms and the denominator's lower bound (all per row)."""
    rows, dv = o.shape
    t_w = np.empty((rows, dv))
    t_n = np.empty((rows, dv))
    for r0 in range(0, rows, chunk):
        r1 = min(rows, r0 + chunk)
        dev = np.abs(v[None, :, :] - o[r0:r1, None, :])  # |v_jd - o_d|
        ce = (pi[r0:r1] * eps[r0:r1])[:, :, None]
        t_w[r0:r1] = np.sum(ce * dev, axis=1)
        ca = pi[r0:r1] * fu[r0:r1]
        a = a_up[r0:r1] if a_up.ndim == 2 else a_up
        t_n[r0:r1] = (ca * a) @ np.abs(v)
    t_d = np.sum(pi * fu * b_up, axis=-1, keepdims=True) * np.abs(o)
    t_a = abs_num + abs_den * np.abs(o)
    if np.any(lowsum <= 0):
        raise _not_covered("the lower bound of the softmax denominator is not positive")
    return t_w / lowsum, t_n / lowsum, t_d / lowsum, t_a / lowsum


# -- flash ------------------------------------------------------------------------------------------------------


def _exp_rounding(pl: Plan, op: OpSpec) -> tuple[_Chain, float]:
    """The chain of one exp/exp2 evaluation into ``op`` (B6, B7) and its absolute term."""
    if pl.exp_impl == "tl.exp":
        raise _not_covered(
            "exp_impl='tl.exp' (the argument x * log2(e) is rounded to float32 before the exp2: an error "
            "relative to |x| that these bounds do not model)"
        )
    r = _op(op)
    c = _Chain()
    if pl.exp2 and pl.exp2_impl == h200_ex2():  # the shipped H200 table, a value in every plan
        c.add(1, (ex2_h200_error(), False))
        eta = 2.0**-126  # results below 2^-126 flushed (ftz) (B7)
        if not _holds_float32(op.fmt):
            c.add(1, r)
            eta = eta * (1 + r.u) + r.eta
        return c, eta
    c.add(1, (r.u * (1 + _LIBM) + _LIBM, r.nearest))  # (B6): correctly rounded; the libm term stays as a margin
    return c, r.eta


class _Rows:
    """What :func:`flash_bound` and :func:`baseline_bound` fill per (lead index, query row, output column): the
    worst-case bound, the probabilistic bound and the worst case's terms."""

    def __init__(self, n_lead: int, seq_q: int, dv: int) -> None:
        self.worst = np.empty((n_lead, seq_q, dv))
        self.prob = np.empty_like(self.worst)
        self.terms = {
            n: np.empty_like(self.worst) for n in ("weights", "numerator", "denominator", "absolute", "output")
        }

    def output(
        self,
        which: str | None,
        b: int,
        lemma: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        extra_abs: float | np.ndarray,
        o: np.ndarray,
        vmax: float,
        r_out: Rounding,
    ) -> None:
        """The bound of lead index ``b``'s output: the lemma's terms (weights, numerator, denominator, absolute)
        plus ``extra_abs`` (absolute terms in output units), the output cast of ``r_out``, the slack (B14); the
        worst case (``which`` None; the output checked for overflow) with its terms, or the probabilistic bound
        (at most the worst case)."""
        t_w, t_n, t_d, t_a = lemma
        inner = t_w + t_n + t_d + t_a
        total = (inner + extra_abs) * (1 + r_out.u) + r_out.u * np.abs(o) + r_out.eta
        total = total + _SLACK * (total + np.abs(o) + vmax) + 1e-300  # (B14)
        if which is None:
            _overflow("the output", float(np.max(np.abs(o) + total)), r_out)
            self.worst[b] = total
            for name, t in (("weights", t_w), ("numerator", t_n), ("denominator", t_d)):
                self.terms[name][b] = t
            self.terms["absolute"][b] = t_a + extra_abs
            self.terms["output"][b] = total - inner - extra_abs
        else:
            self.prob[b] = np.minimum(total, self.worst[b])

    def bound(self, kind: str, plan_name: str, shape: tuple[int, ...], fp: float, lam: float) -> AttentionBound:
        """The :class:`AttentionBound` of the filled rows, reshaped to ``shape`` (the inputs' lead, seq_q, dv)."""
        return AttentionBound(
            kind,
            plan_name,
            self.worst.reshape(shape),
            self.prob.reshape(shape),
            fp,
            lam,
            {n: t.reshape(shape) for n, t in self.terms.items()},
        )


def flash_bound(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    plan: Plan | str,
    block_m: int = 64,
    block_n: int = 64,
    causal: bool = False,
    scale: float | None = None,
    failure_probability: float = 0.01,
) -> AttentionBound:
    """Bounds on the error of :func:`simfloat.attention.flash` under ``plan`` against exact attention.

    Args:
        q: (..., seq_q, head_dim) array; k: (..., seq_k, head_dim); v: (..., seq_k, head_dim_v); as for flash
            (the values the kernel reads).
        plan: a plan or preset name (its flash ops and flags are used).
        block_m, block_n: the tiles (block_m only matters with ``causal``).
        causal: top-left aligned mask.
        scale: softmax scale (default 1/sqrt(head_dim)).
        failure_probability: per query row, for the probabilistic bound (B13).

    Returns:
        An :class:`AttentionBound` with (..., seq_q, head_dim_v) arrays.

    Raises:
        ValueError: a regime the bound does not cover (an intermediate that may overflow, a softmax
            denominator whose lower bound is not positive, a plan with ``exp_impl="tl.exp"`` or ``tie_shift``),
            bad arguments.
        TypeError: bad argument types.
    """
    x = prepare(q, k, v, plan_=plan, causal=causal, scale=scale, trace=None)
    fp = _check_fp(failure_probability)
    pl = x.plan
    if pl.tie_shift is not None:
        raise _not_covered(
            "tie_shift (the shifted max of tied rows: its P may underflow, which these bounds do not model)"
        )
    bm, bn = clamp_blocks(block(block_m, "block_m"), block(block_n, "block_n"), x.q.shape[1], x.k.shape[1], pl.pv)
    pp = pl.params(x.scale)
    n_lead, seq_q, dh = x.q.shape
    seq_k, dv = x.v.shape[1:]
    beta = 2.0 if pl.exp2 else math.e
    lnb = math.log(beta)
    c_exact = x.scale * _LOG2E if pl.exp2 else x.scale
    c_hat = pp.qk_scale
    dc = abs(c_hat - c_exact) + 2.0**-52 * c_exact  # (B5)
    r_sc, r_mi, r_al, r_l, r_acc, r_p, r_norm, r_out = (
        _op(getattr(pl, n)) for n in ("scale", "m_i", "alpha", "l_i", "acc", "p", "normalize", "out")
    )
    exp_c, exp_eta = _exp_rounding(pl, pl.exp)
    al_c, al_eta = _exp_rounding(pl, pl.alpha)
    tau = 0.0 if pl.lazy_threshold is None else pp.threshold * (1 + r_mi.u) + r_mi.eta
    qk = _dot(pl.qk, dh)
    qk_exact = _exact_inputs(x.q, qk, pl.qk) and _exact_inputs(x.k, qk, pl.qk)
    qk_chain = qk.term if qk_exact else _with_inputs(qk)
    pv = _dot(pl.pv, bn)
    pv_term = _with_inputs(pv)  # P is rounded by the plan's p op; the dot's input conversion comes on top
    n_kv_all = -(-seq_k // bn)
    rows = np.arange(seq_q)
    n_kv = np.full(seq_q, n_kv_all)
    if x.causal:
        kv_hi = np.minimum((rows // bm + 1) * bm, seq_k)
        n_kv = -(-kv_hi // bn)
    jt = np.arange(seq_k) // bn  # tile of each key
    later = np.maximum(n_kv[:, None] - 1 - jt[None, :], 0)  # tiles after key j's, per row (B8)
    vis = (np.arange(seq_k)[None, :] <= rows[:, None]) if x.causal else None
    # chains per (row, key): common (exp, alpha), numerator, denominator (B8, B9)
    ce = _Chain().extend(exp_c)
    _scale_chain(ce, al_c, later)
    ca = _Chain().add(1, r_p).extend(pv_term).add(1, r_norm)  # own tile: cast, P.V; FA2 final / FA1 own division
    step = _Chain().add(1, r_acc).extend(pv.acc)  # each later tile: acc rescale, the tile's P.V steps
    if pl.normalization == "per_step":
        step.add(1, r_acc).add(1, r_norm)  # w = l_old * alpha, and the division by l_new
    _scale_chain(ca, step, later)
    cb = _Chain()  # l_ij (bn roundings at most on any path) + the own tile's update
    lij = pl.l_ij
    if isinstance(lij, Chunked):
        assert isinstance(lij.inner, Sequential) and lij.chunk is not None  # checked by Plan.__post_init__
        r_lij = rounding(lij.inner.fmt, lij.inner.mode)
        n_chunks = -(-bn // lij.chunk)
        cb.add(min(bn, lij.chunk), r_lij).add(n_chunks, rounding(lij.outer_fmt, lij.outer_mode)).add(1, r_l)
    else:
        assert lij is not None  # Plan.__post_init__ fills the default
        r_lij = rounding(lij.fmt, lij.mode)
        if r_lij == r_l:
            cb.add(bn + 1, r_l)
        else:
            cb.add(bn, r_lij).add(1, r_l)
    _scale_chain(cb, _Chain().add(1 if pl.contract else 2, r_l), later)
    chains = seq_k * (2 + dv) + (seq_k * dh if _has_nearest(qk_chain) else 0)
    umax = max(r.u for r in (r_sc, r_mi, r_al, r_l, r_lij, r_acc, r_p, r_norm, r_out, qk.out, pv.out))
    lam = _lam(chains, fp, umax)
    s_all, mag_all = _scores(x.q, x.k)
    vmax = float(np.max(np.abs(x.v))) if x.v.size else 0.0
    out = _Rows(n_lead, seq_q, dv)
    qmax, kmax = float(np.max(np.abs(x.q))), float(np.max(np.abs(x.k)))
    n_vis = vis.sum(axis=-1, keepdims=True).astype(np.float64) if vis is not None else np.full((seq_q, 1), float(seq_k))

    def mask(a: np.ndarray) -> np.ndarray:
        return np.where(vis, a, 0.0) if vis is not None else a

    for b in range(n_lead):
        s, mag, vb = s_all[b], mag_all[b], x.v[b]
        sv = np.where(vis, s, -np.inf) if vis is not None else s
        s_max = np.max(sv, axis=-1, keepdims=True)
        s_run = _running_tile_max(sv, bn)  # (B8): S_{t_j}, the exact running max up to key j's tile
        if vis is not None:
            s_run = np.where(vis, s_run, s_max)
        w = np.exp((sv - s_max) * c_exact * lnb)  # exact weights, max 1
        pi, o = _softmax_parts(w, vb, vis)
        wsum = np.sum(w, axis=-1, keepdims=True)
        for which, l_ in ((None, None), ("prob", lam)):
            g_qk = qk_chain.bounds(l_)[0] - 1.0
            ds = mask(g_qk * mag + _dot_abs(qk, qmax, kmax))  # (B5) score errors
            if which is None:
                _overflow("the scores |q||k|", float(np.max(mag + ds)), qk.out)
            r = np.max(ds, axis=-1, keepdims=True)
            em = mask(
                c_hat * r
                + ((1 + r_sc.u) * (1 + r_mi.u) - 1) * c_hat * (np.abs(s_run) + r)
                + r_sc.eta * (1 + r_mi.u)
                + r_mi.eta
            )  # (B8): |m_t - c S_t|
            em_max = np.max(em, axis=-1, keepdims=True)
            xj = mask(c_hat * (s_run - s) + c_hat * ds + em + tau)  # (B8): |s_j c - m_{t_j}|
            yj = mask(c_hat * (s_max - s_run) + 2 * em_max + tau)  # (B8): m_T - m_{t_j}
            if pl.contract:
                xi = r_sc.u * xj + r_sc.eta
            else:
                e1 = r_sc.u * c_hat * (np.abs(s) + ds) + r_sc.eta
                xi = e1 + r_sc.u * (xj + e1) + r_sc.eta
            xi = mask(xi + r_al.u * yj + later * r_al.eta)  # (B8): the alpha subtractions telescope
            zeta = mask(c_hat * ds + dc * (s_max - s))  # (B9)
            rho = (xi + zeta) * lnb  # natural-log units
            _exponent_check(rho)
            _exponent_check((em_max + tau) * lnb)
            kappa_lo = np.exp(-(em_max + tau) * lnb)  # (B9): |K| <= eps_m + tau
            fu_c, fl_c = ce.bounds(l_)
            fu, fl = fu_c * np.exp(rho), fl_c * np.exp(-rho)
            au, _ = ca.bounds(l_)
            bu, bl = cb.bounds(l_)
            a_max, b_max = float(np.max(au)), float(np.max(bu))
            # (B11): every computed p is below p_up; the row sum below l_up (computed units)
            _exponent_check(np.max(tau + 2 * em_max + xi) * lnb)
            p_up = beta ** float(np.max(tau + 2 * em_max + xi)) * float(np.max(exp_c.bounds(None)[0])) + exp_eta
            l_up = p_up * seq_k * b_max
            if which is None:
                _overflow("exp", p_up, _op(pl.exp))
                _overflow("l_i", l_up, r_l)
                _overflow("l_ij", l_up, r_lij)
                _overflow("acc", l_up * a_max * max(vmax, 1.0), r_acc)
            # (B11) absolute terms in computed units (then / kappa, / sum w)
            aw = mask(exp_eta + later * al_eta * p_up)  # per key: exp and alpha underflow
            aw_sum = np.sum(aw, axis=-1, keepdims=True)
            per_tile = r_acc.eta
            if pl.normalization == "per_step":
                per_tile += r_acc.eta * (1 + vmax * a_max) + r_norm.eta * l_up
            abs_num = (
                a_max
                * (
                    n_vis * r_p.eta * vmax
                    + n_kv_all * _dot_abs(pv, p_up * (1 + r_p.u) + r_p.eta, vmax)
                    + n_kv[:, None] * per_tile
                )
                + aw_sum * a_max * vmax
            )
            abs_den = (n_kv[:, None] * (bn + 2) * r_l.eta + aw_sum) * b_max
            lowsum = np.sum(pi * fl * bl, axis=-1, keepdims=True) - abs_den / (kappa_lo * wsum)
            t_w, t_n, t_d, t_a = _lemma(
                pi,
                vb,
                o,
                fu - 1.0,
                fu,
                au - 1.0,
                bu - 1.0,
                lowsum,
                abs_num / (kappa_lo * wsum),
                abs_den / (kappa_lo * wsum),
            )
            # (B12) the final division's underflow (FA2) and the output cast
            div_abs = r_norm.eta if pl.normalization == "deferred" else 0.0
            out.output(which, b, (t_w, t_n, t_d, t_a), div_abs, o, vmax, r_out)
    return out.bound("flash", pl.name, x.lead + (seq_q, dv), fp, lam)


def _exponent_check(rho: np.ndarray) -> None:
    """The weights' exponent errors (natural-log units) must leave exp finite (B9)."""
    top = float(np.max(rho)) if np.size(rho) else 0.0
    if not top < 700.0:
        raise _not_covered(
            f"the exponent error of a softmax weight may reach {top:.3g} (natural-log units): the scores are too "
            "large for the scale's or softmax's format; a relative bound on the weights does not exist there"
        )


def _has_nearest(c: _Chain) -> bool:
    return bool(np.any(np.asarray(c.q2) > 0))


def _scale_chain(base: _Chain, step: _Chain, count: np.ndarray) -> None:
    """base += count * step (element-wise count of repetitions)."""
    base.up = base.up + count * step.up
    base.lo = base.lo + count * step.lo
    base.q2 = base.q2 + count * step.q2
    base.dup = base.dup + count * step.dup
    base.dlo = base.dlo + count * step.dlo
    base.umax = max(base.umax, step.umax)


def _running_tile_max(s: np.ndarray, bn: int) -> np.ndarray:
    """Per row and key j: the max of s over the keys of the tiles up to key j's tile."""
    rows, n = s.shape
    nt = -(-n // bn)
    pad = np.full((rows, nt * bn), -np.inf)
    pad[:, :n] = s
    tm = np.maximum.accumulate(pad.reshape(rows, nt, bn).max(axis=2), axis=1)
    return np.repeat(tm, bn, axis=1)[:, :n]


# -- baseline ---------------------------------------------------------------------------------------------------


def baseline_bound(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    plan: Plan | str,
    causal: bool = False,
    scale: float | None = None,
    failure_probability: float = 0.01,
) -> AttentionBound:
    """Bounds on the error of :func:`simfloat.attention.baseline` under ``plan`` against exact attention.

    Args:
        q: (..., seq_q, head_dim); k: (..., seq_k, head_dim); v: (..., seq_k, head_dim_v); as for baseline.
        plan: a plan or preset name (its ops qk, scale, softmax, pv, out).
        causal: top-left aligned mask.
        scale: softmax scale (default 1/sqrt(head_dim)).
        failure_probability: per query row, for the probabilistic bound (B13).

    Returns:
        An :class:`AttentionBound` with (..., seq_q, head_dim_v) arrays.

    Raises:
        ValueError: a regime the bound does not cover (overflow, a non-positive denominator bound), bad
            arguments.
        TypeError: bad argument types.
    """
    x = prepare(q, k, v, plan_=plan, causal=causal, scale=scale, trace=None)
    fp = _check_fp(failure_probability)
    pl = x.plan
    pp = pl.params(x.scale)
    n_lead, seq_q, dh = x.q.shape
    seq_k, dv = x.v.shape[1:]
    c_exact = x.scale
    c_hat = pp.sm_scale
    dc = abs(c_hat - c_exact) + 2.0**-52 * c_exact
    r_sc, r_sm, r_out = _op(pl.scale), _op(pl.softmax), _op(pl.out)
    # torch's tensor * scale (Plan.opmath): rounded into opmath first, then into the scale op (two roundings)
    r_om = rounding(pl.opmath, "nearest_even") if pl.opmath is not None else None
    u_om, eta_om = (r_om.u, r_om.eta) if r_om is not None else (0.0, 0.0)
    exp_c = _Chain().add(1, (r_sm.u * (1 + _LIBM) + _LIBM, r_sm.nearest))  # (B6): the baseline uses exp
    exp_eta = r_sm.eta
    qk = _dot(pl.qk, dh)
    qk_exact = _exact_inputs(x.q, qk, pl.qk) and _exact_inputs(x.k, qk, pl.qk)
    qk_chain = qk.term if qk_exact else _with_inputs(qk)
    pv = _dot(pl.pv, seq_k)
    pv_term = _with_inputs(pv)
    rows = np.arange(seq_q)
    vis = (np.arange(seq_k)[None, :] <= rows[:, None]) if x.causal else None
    pos = np.arange(seq_k)[None, :]
    n_vis = np.minimum(rows + 1, seq_k)[:, None] if x.causal else np.full((seq_q, 1), seq_k)
    cb = _Chain()
    _scale_chain(cb, _Chain().add(1, r_sm), np.maximum(n_vis - pos, 1))  # (B9) key j in n - j roundings
    ca = _Chain().add(1, r_sm).extend(pv_term)  # P = e / l rounded, then P.V
    chains = seq_k * (2 + dv) + (seq_k * dh if _has_nearest(qk_chain) else 0)
    umax = max(r.u for r in (r_sc, r_sm, r_out, qk.out, pv.out))
    lam = _lam(chains, fp, umax)
    s_all, mag_all = _scores(x.q, x.k)
    vmax = float(np.max(np.abs(x.v))) if x.v.size else 0.0
    qmax, kmax = float(np.max(np.abs(x.q))), float(np.max(np.abs(x.k)))
    out = _Rows(n_lead, seq_q, dv)
    for b in range(n_lead):
        s, mag, vb = s_all[b], mag_all[b], x.v[b]
        for which, l_ in ((None, None), ("prob", lam)):
            g_qk = qk_chain.bounds(l_)[0] - 1.0
            ds = g_qk * mag + _dot_abs(qk, qmax, kmax)
            if which is None:
                _overflow("the scores |q||k|", float(np.max(mag + ds)), qk.out)
                _overflow("the scaled scores", float(np.max(c_hat * (mag + ds))) * 1.01, r_sc)
            sv = np.where(vis, s, -np.inf) if vis is not None else s
            s_max = np.max(sv, axis=-1, keepdims=True)
            r = np.max(np.where(vis, ds, 0.0) if vis is not None else ds, axis=-1, keepdims=True)
            et = (
                ((1 + u_om) * (1 + r_sc.u) * (1 + r_sm.u) - 1) * c_hat * (np.abs(s) + ds)
                + eta_om * (1 + r_sc.u) * (1 + r_sm.u)
                + r_sc.eta * (1 + r_sm.u)
                + r_sm.eta
            )  # (B8) |x_j - c s_j|
            if vis is not None:
                et = np.where(vis, et, 0.0)
            et_max = np.max(et, axis=-1, keepdims=True)
            gap = np.where(vis, s_max - s, 0.0) if vis is not None else s_max - s
            xj = c_hat * gap + c_hat * (ds + r) + et + et_max
            nu = c_hat * ds + dc * gap + et + r_sm.u * xj + r_sm.eta
            k_max = c_hat * r + et_max
            _exponent_check(nu)
            _exponent_check(k_max)
            kappa_lo = np.exp(-k_max)
            fu_c, fl_c = exp_c.bounds(l_)
            fu = fu_c * np.exp(nu)
            fl = fl_c * np.exp(-nu)
            eps = fu - 1.0
            au, _ = ca.bounds(l_)
            bu, bl = cb.bounds(l_)
            w = np.exp((sv - s_max) * c_exact)  # exact weights, max 1
            pi, o = _softmax_parts(w, vb, vis)
            wsum = np.sum(w, axis=-1, keepdims=True)
            e_up = float(np.max(exp_c.bounds(None)[0])) + exp_eta  # exp of a non-positive value
            if which is None:
                _overflow("exp", e_up, r_sm)
                _overflow("the row sum", e_up * seq_k * float(np.max(bu)), r_sm)
            # absolute terms (B11): exp underflow (weights units), P division underflow and P.V (output units)
            nv = n_vis.astype(np.float64)
            abs_den = (nv * r_sm.eta + nv * exp_eta) * float(np.max(bu)) / kappa_lo
            abs_w = nv * exp_eta * float(np.max(au)) * vmax / kappa_lo
            lowsum = np.sum(pi * fl * bl, axis=-1, keepdims=True) - abs_den / wsum
            t_w, t_n, t_d, t_a = _lemma(pi, vb, o, eps, fu, au - 1.0, bu - 1.0, lowsum, abs_w / wsum, abs_den / wsum)
            out_abs = (nv * r_sm.eta * vmax + _dot_abs(pv, 1.0 + 2 * r_sm.u, vmax)) * float(np.max(au))
            out.output(which, b, (t_w, t_n, t_d, t_a), out_abs, o, vmax, r_out)
    return out.bound("baseline", pl.name, x.lead + (seq_q, dv), fp, lam)


# -- next to the traced errors (simfloat.attribution) -------------------------------------------------------------


def _versus(kind: str, q, k, v, pl: Plan, out: np.ndarray, golden: np.ndarray, gold: np.ndarray, **kw) -> dict:
    """Bound, measured error and tightness of one run (``note`` says why a bound is missing)."""
    err = np.abs(out - golden)
    row: dict[str, Any] = dict(
        measured_max=float(err.max()) if err.size else 0.0,
        bound_max=math.nan,
        prob_max=math.nan,
        tightness_max=math.nan,
        tightness_median=math.nan,
        exceeded=0,
        note="",
    )
    try:
        bd = (flash_bound if kind == "flash" else baseline_bound)(q, k, v, plan=pl, **kw)
    except ValueError as e:
        row["note"] = str(e)
        return row
    nz = err > 0
    row.update(
        bound_max=float(bd.worst.max()),
        prob_max=float(bd.probabilistic.max()),
        exceeded=int(np.sum(err > bd.worst + gold)),
    )
    if row["measured_max"] > 0:
        row["tightness_max"] = row["bound_max"] / row["measured_max"]
        row["tightness_median"] = float(np.median(bd.worst[nz] / err[nz]))
    return row


def attribution_bounds(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    runs: Sequence[tuple],
    golden: np.ndarray,
    *,
    block_m: int,
    block_n: int,
    causal: bool,
    scale: float | None,
) -> Any:
    """The bounds next to the measured errors of :func:`simfloat.attribution.attribute`'s runs.

    Args:
        q, k, v: the evaluated inputs (q: the evaluated rows), as the runs used them.
        runs: ``(plan name, op, kernel, kernel plan, output)`` per run: ``op`` is the isolated op (the run is
            under :func:`~simfloat.attribution.isolation_plan`) or ``"all"`` (the plan itself; ``kernel``
            ``"baseline"`` for its paired baseline); ``output`` the run's output array.
        golden: the fp64 baseline output the errors are measured against.
        block_m, block_n, causal, scale: as the runs used them.

    Returns:
        A pandas DataFrame: ``plan, op, kernel, kernel_plan`` and ``measured_max`` (max |O - O_golden|),
        ``bound_max`` / ``prob_max`` (max worst-case / probabilistic bound), ``tightness_max`` (bound_max /
        measured_max), ``tightness_median`` (median over components of bound / error), ``exceeded`` (components
        above the worst-case bound plus the golden output's own bound: 0 unless the bound is wrong), ``note``
        (why a bound is missing: a regime it does not cover).
    """
    import pandas as pd

    gold = baseline_bound(q, k, v, plan="fp64", causal=causal, scale=scale).worst
    rows = []
    for name, op, kernel, kplan, out in runs:
        kw = dict(causal=causal, scale=scale)
        if kernel == "flash":
            kw.update(block_m=block_m, block_n=block_n)
        rows.append(
            dict(
                plan=name,
                op=op,
                kernel=kernel,
                kernel_plan=kplan.name,
                **_versus(kernel, q, k, v, kplan, out, golden, gold, **kw),
            )
        )
    return pd.DataFrame(rows)
