"""The error model of one rounding (B1) and chains of roundings (B2, B4): the unit every bound is built of."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from simfloat.attention.plan import OpSpec
from simfloat.formats import FloatFormat
from simfloat.formats import format as _format
from simfloat.rounding import RoundingMode, mode_code

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
