"""The pieces :func:`~simfloat.bounds.flash_bound` and :func:`~simfloat.bounds.baseline_bound` share: the
result record, the float64 scores and softmax, the perturbation lemma (B10), the regime checks and the per-row
output bound (B12, B14)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simfloat.bounds._chains import _SLACK, Rounding


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


def _exponent_check(rho: np.ndarray) -> None:
    """The weights' exponent errors (natural-log units) must leave exp finite (B9)."""
    top = float(np.max(rho)) if np.size(rho) else 0.0
    if not top < 700.0:
        raise _not_covered(
            f"the exponent error of a softmax weight may reach {top:.3g} (natural-log units): the scores are too "
            "large for the scale's or softmax's format; a relative bound on the weights does not exist there"
        )
