"""The arguments of the array functions (:func:`~simfloat.rounding.round` and :mod:`simfloat.ops`): the format
and the result's dtype, real numbers float64 cannot hold (split exactly for round_exact), the seed."""

from __future__ import annotations

import math
import numbers
import os
from fractions import Fraction
from typing import NamedTuple

import numpy as np

from simfloat.formats import FloatFormat
from simfloat.formats import format as _format


def resolve_format(fmt: str | FloatFormat) -> FloatFormat:
    """The format named by ``fmt`` (every FloatFormat lies within float64's range, which simfloat computes in)."""
    return _format(fmt)


def fits_float32(f: FloatFormat) -> bool:
    """Whether every value of ``f`` is a float32 (precision, exponent range and smallest quantum all fit)."""
    return f.precision <= 24 and f.emax <= 127 and f.emin - f.mantissa_bits >= -149


_F64_MAX = float(np.finfo(np.float64).max)
_FLOAT64_EXACT = frozenset({float, np.float64, np.float32, np.float16})  # scalar types float64 holds exactly
#: ml_dtypes' floating types (by dtype name; ml_dtypes itself is never imported): every value is a float32.
_NARROW_PREFIXES = ("bfloat16", "float8_", "float6_", "float4_")


def narrow_float(dtype: np.dtype) -> bool:
    """float16 or an ml_dtypes floating dtype (bfloat16, float8_*, float6_*, float4_*): widens exactly to
    float32. Recognized by the dtype's module and name, so ml_dtypes is not imported for it."""
    if dtype == np.float16:
        return True
    return dtype.type.__module__.partition(".")[0] == "ml_dtypes" and dtype.name.startswith(_NARROW_PREFIXES)


class _Inexact(NamedTuple):
    """An input number float64 cannot hold: flat position, the number, and its exact split for round_exact."""

    index: int  # type: ignore[assignment]  # a field named like tuple.index
    value: object
    tail: int  # the class of value - head, as sticky() gives it (+-1 inside half an ulp, +-2 exactly half)
    beyond: bool  # |value| >= 2**1024 - 2**970: overflows every format (head is then +-float64 max)


def _split_rational(n: int, den: int) -> tuple[float, int, bool]:
    """``n/den`` (``den > 0``) as (head, tail class, beyond float64's range): the head is the nearest float64
    (ties to even) and the tail class that of the exact rest ``n/den - head`` (see :func:`sticky`)."""
    try:
        head = n / den  # Python's int true division is correctly rounded, subnormal results included
    except OverflowError:
        return (-_F64_MAX if n < 0 else _F64_MAX), 0, True
    rest = Fraction(n, den) - Fraction(head)
    if rest == 0:
        return head, 0, False
    mag = abs(head)
    expo = math.frexp(mag)[1] - 1 if mag >= 2.0**-1022 else -1022  # ulp(head) = 2**(expo - 52)
    cls = 2 if abs(rest) == Fraction(2) ** (expo - 53) else 1
    return head, (cls if rest > 0 else -cls), False


def _bad_type(name: str, v: object) -> TypeError:
    what = "a bool" if isinstance(v, (bool, np.bool_)) else type(v).__name__
    return TypeError(
        f"{name} must be a float32 or float64 array or real numbers (Python or NumPy ints and floats, "
        f"Fractions, lists of them), got {what}"
    )


def _split_number(name: str, v: object) -> tuple[float, int, bool]:
    """One real number as (float64 head, tail class, beyond float64's range); exact for every accepted type."""
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v[()]
    if isinstance(v, (bool, np.bool_)):
        raise _bad_type(name, v)
    if isinstance(v, (float, np.float16, np.float32, np.float64)):
        return float(v), 0, False
    if isinstance(v, np.generic) and narrow_float(v.dtype):  # an ml_dtypes scalar (bfloat16, float8_*, ...)
        return float(v), 0, False
    if isinstance(v, np.floating):  # long double
        if v == 0 or not np.isfinite(v):
            return float(v), 0, False  # signed zeros, infinities and NaN are float64 numbers
        return _split_rational(*v.as_integer_ratio())
    if isinstance(v, numbers.Integral):  # int, NumPy integers
        return _split_rational(int(v), 1)
    if isinstance(v, numbers.Rational):  # Fraction
        return _split_rational(int(v.numerator), int(v.denominator))
    raise _bad_type(name, v)


def real_input(name: str, x: object) -> tuple[np.ndarray, list[_Inexact], bool | None]:
    """Validate an array or real-number argument: ``(values, inexact, is_float32)``.

    ``values`` is ``x`` itself for a float32/float64 array, a 0-d array of its dtype for a NumPy float32/float64
    scalar, else a float64 array of the numbers (the nearest float64 where float64 cannot hold one: those are
    listed in ``inexact``). ``is_float32`` is None for Python numbers and lists, which do not vote on the dtype.
    """
    if isinstance(x, np.ndarray):
        if narrow_float(x.dtype):  # float16 / ml_dtypes: exactly float32 numbers, so taken as float32
            with np.errstate(invalid="ignore"):
                return x.astype(np.float32), [], True
        if x.dtype not in (np.float32, np.float64):
            raise TypeError(
                f"{name} must have dtype float32 or float64 (or float16, or an ml_dtypes bfloat16, "
                f"float8_*, float6_* or float4_* dtype, widened exactly to float32), got {x.dtype}"
            )
        return x, [], x.dtype == np.float32
    if isinstance(x, (np.float32, np.float64)):
        return np.asarray(x), [], isinstance(x, np.float32)
    if isinstance(x, (list, tuple)):
        obj = np.asarray(x, dtype=object)
        items, shape = obj.reshape(-1).tolist(), obj.shape
    else:
        items, shape = [x], ()
    if set(map(type, items)) <= _FLOAT64_EXACT:
        with np.errstate(invalid="ignore"):  # converting a signalling NaN quiets it
            return np.array(items, dtype=np.float64).reshape(shape), [], None
    heads = np.empty(len(items))
    inexact = []
    for i, v in enumerate(items):
        heads[i], tail, beyond = _split_number(name, v)
        if tail or beyond:
            inexact.append(_Inexact(i, v, tail, beyond))
    return heads.reshape(shape), inexact, None


def checked_seed(seed: int | None) -> np.uint64:
    if seed is None:
        return np.uint64(int.from_bytes(os.urandom(8), "little"))
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
    return np.uint64(int(seed) % (1 << 64))
