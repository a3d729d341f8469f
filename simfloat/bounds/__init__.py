"""A priori forward-error bounds for the flash and baseline attention plans: worst case and probabilistic.

For a plan, the tile sizes and the inputs, :func:`flash_bound` and :func:`baseline_bound` bound, component by
component, the distance of what the emulator computes (:func:`simfloat.attention.flash` /
:func:`~simfloat.attention.baseline`) from the exact attention ``softmax(scale * q k^T) v``. The derivation is
docs/bounds.md; the labels (B1), (B2), ... in the comments of this package's modules are its equations.

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

from simfloat.bounds._attribution import attribution_bounds
from simfloat.bounds._baseline import baseline_bound
from simfloat.bounds._chains import Rounding, chain_constant, ex2_h200_error, rounding
from simfloat.bounds._dots import dot_constant
from simfloat.bounds._flash import flash_bound
from simfloat.bounds._rows import AttentionBound

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
