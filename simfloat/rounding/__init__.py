"""Exact rounding of float32/float64 values into any :class:`~simfloat.formats.FloatFormat`, in every mode.

The scalar worker :func:`round_exact` rounds a value given as an unevaluated pair ``s + e`` (the output of an
error-free transformation such as TwoSum or TwoProduct, ``|e| <= ulp(s)/2``), so the arithmetic in
:mod:`simfloat.ops` rounds its *exact* result once. Plain rounding of a float64 is the case ``e == 0``.
float64 inputs are rounded directly from their bits, never through float32 (ml_dtypes and torch convert
float64 -> float32 -> target and so double-round).

How it works: the float64 ``s = m * 2**ex`` (``m`` its 53-bit integer significand) and the sign of ``e`` are
folded into one integer ``M = 4*m + d`` at a grid four times finer than float64's, with ``d = +-2`` when ``e``
is exactly half an ulp of ``s`` and ``d = +-1`` when it is strictly between 0 and half an ulp. An odd ``M``
thus stands for "strictly between two grid points" (round-to-odd at 55 bits); since every target format keeps
at most 53 bits, the target grid is at least 4 times coarser, so the bits of ``M`` below the target quantum
decide every mode exactly: they are below, at or above the midpoint, and zero or not (the sticky bit).
"""

from __future__ import annotations

from simfloat.rounding._array import round
from simfloat.rounding._exact import overflow_value, quiet_nan, rand_bits, round_exact, round_scalar, sticky
from simfloat.rounding._inputs import checked_seed as checked_seed
from simfloat.rounding._inputs import fits_float32, narrow_float, real_input, resolve_format
from simfloat.rounding._modes import RoundingMode, mode_code

__all__ = [
    "RoundingMode",
    "mode_code",
    "overflow_value",
    "quiet_nan",
    "round",
    "round_exact",
    "round_scalar",
    "sticky",
    "rand_bits",
    # the argument checks simfloat.ops and the attention entry points share
    "resolve_format",
    "fits_float32",
    "narrow_float",
    "real_input",
]
