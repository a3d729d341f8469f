"""Arithmetic and reductions that compute the exact result and round it once into any format, in any mode.

Two layers:

* **Array functions** (:func:`add`, :func:`sub`, :func:`mul`, :func:`div`, :func:`fma`, :func:`sqrt`,
  :func:`exp`, :func:`exp2`, :func:`log`, :func:`maximum`, :func:`sum`, :func:`max`): validate, broadcast and
  run a parallel njit driver.
* **njit scalar workers**, the arithmetic floor of other njit code (the attention kernels' ops,
  :mod:`simfloat.attention._kernels`, are these workers with an op's format and mode; so are the IEEE steps of
  the scalar dot products, :mod:`simfloat.accumulate.scalar`; their vector twin is :mod:`simfloat._lanes`):
  ``op_scalar(operands..., p, mode, rbits) -> float`` with ``p = fmt.params``, ``mode`` a ``RoundingMode``
  and ``rbits`` 64 random bits (stochastic rounding; e.g. ``rounding.rand_bits(seed, counter)``), and the
  reduction workers on 1-D slices
  ``sum_sequential``/``sum_pairwise``/``sum_chunked``/``sum_numpy``/``sum_slice`` and ``max_slice`` (see
  :mod:`simfloat.ops._reduce` for the exact summation trees).

Exactness: add/sub/mul/div/fma/sqrt are correctly rounded for every float64 operand in every mode (error-free
transforms; exact power-of-two scaling where float64's exponent range would otherwise lose a residual). exp,
exp2 and log are correctly rounded for formats below float64 precision (see :mod:`simfloat.ops._elementary`
for the precise statement) and faithful (libm) for float64.
"""

from simfloat.ops._api import (
    ORDERS,
    add,
    div,
    exp,
    exp2,
    fma,
    log,
    max,
    maximum,
    mul,
    sqrt,
    sub,
    sum,
)
from simfloat.ops._elementary import exp2_dd, exp2_scalar, exp_dd, exp_scalar, log_dd, log_scalar
from simfloat.ops._reduce import (
    max_slice,
    sum_chunked,
    sum_numpy,
    sum_pairwise,
    sum_sequential,
    sum_slice,
)
from simfloat.ops._scalar import (
    add_scalar,
    div_scalar,
    fma_scalar,
    max2,
    maximum_scalar,
    mul_scalar,
    overflow_value,
    round_scaled,
    sqrt_scalar,
    sub_scalar,
)

__all__ = [
    "ORDERS",
    "add",
    "sub",
    "mul",
    "div",
    "fma",
    "sqrt",
    "exp",
    "exp2",
    "log",
    "maximum",
    "sum",
    "max",
    "add_scalar",
    "sub_scalar",
    "mul_scalar",
    "div_scalar",
    "fma_scalar",
    "sqrt_scalar",
    "exp_scalar",
    "exp2_scalar",
    "log_scalar",
    "maximum_scalar",
    "max2",
    "round_scaled",
    "overflow_value",
    "exp_dd",
    "exp2_dd",
    "log_dd",
    "sum_sequential",
    "sum_pairwise",
    "sum_chunked",
    "sum_numpy",
    "sum_slice",
    "max_slice",
]
