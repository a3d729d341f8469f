"""Binary floating-point formats: a typed description with finfo-named properties.

A :class:`FloatFormat` is fully described by its exponent width, its fraction (mantissa) width and an explicit
special-value policy. The policy follows the conventions of the OCP/ml_dtypes format names:

* IEEE-like (``float16``, ``bfloat16``, ``float8_e5m2``): infinities, NaNs in the top exponent code.
* ``fn`` (finite, NaN): no infinities; only the all-ones code (``S.1111.111``) is NaN, so the top binade holds
  finite values too (``float8_e4m3fn`` reaches 448).
* ``fnuz`` (finite, NaN, unsigned zero): no infinities, no negative zero; the code of negative zero is the single
  NaN. The bias is one larger than IEEE's.
* no NaN at all (``float6_*``, ``float4_e2m1fn``): every code is a finite number.

Two fields describe the scale formats of block-scaled MMAs (OCP MX, NVFP4): ``signed=False`` drops the sign bit
(``ue4m3``: e4m3fn's codes 0x00..0x7F, 0x7F the NaN), and ``zero=False`` makes exponent code 0 a normal binade
instead of zero and subnormals (``float8_e8m0fnu``: the powers of two 2**-127..2**127, 0xFF the NaN). Rounding a
value a format has no code for (a negative value into an unsigned format, zero into one without zero) gives NaN;
a positive value below the smallest value of a format without zero gives that smallest value in every mode (there
is nothing below it), as ml_dtypes does for float8_e8m0fnu.

The overflow policy says what a finite value too large for the format becomes when the rounding mode would give
an infinity (IEEE semantics): ``"inf"``, ``"nan"`` (ml_dtypes' choice for the fn/fnuz fp8 formats) or
``"saturate"`` (the largest finite value, as ml_dtypes does for fp6/fp4 and PTX's ``.satfinite`` does).
Rounding toward zero never overflows to infinity in any policy: it gives the largest finite value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

import numpy as np

__all__ = [
    "FloatFormat",
    "FormatParams",
    "format",
    "formats",
    "float64",
    "float32",
    "tfloat32",
    "bfloat16",
    "float16",
    "float8_e4m3fn",
    "float8_e4m3",
    "float8_e3m4",
    "float8_e5m2",
    "float8_e8m0fnu",
    "ue4m3",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float4_e2m1fn",
]

NanEncoding = Literal["ieee", "fn", "fnuz", "none"]
Overflow = Literal["inf", "nan", "saturate"]

_OVERFLOW_CODES = {"inf": 0, "nan": 1, "saturate": 2}


class FormatParams(NamedTuple):
    """What the njit rounding kernels need to know about a format (a frozen dataclass cannot enter njit code).

    Attributes:
        mantissa_bits: fraction bits (precision minus one).
        emin: exponent of the smallest normal value.
        max_value: largest finite value, as float64 (exact).
        overflow: 0 -> infinity, 1 -> NaN, 2 -> saturate to ``max_value``.
        has_inf: whether +-inf are codes of the format.
        has_nan: whether the format has a NaN code.
        neg_zero: whether -0 is a code (False for fnuz formats: -0 becomes +0).
        subnormals: whether subnormals exist (False: subnormal results flush to signed zero).
        signed: whether negative values are codes (False: a negative nonzero value rounds to NaN).
        zero: whether zero is a code (False: zero rounds to NaN, tiny positive values to ``2**emin``).
    """

    mantissa_bits: int
    emin: int
    max_value: float
    overflow: int
    has_inf: bool
    has_nan: bool
    neg_zero: bool
    subnormals: bool
    signed: bool
    zero: bool


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format.

    Every format has a normal binade and lies within float64's range (simfloat computes in float64, and the
    properties below are float64 numbers). An IEEE-like format therefore needs at least 2 exponent bits: with
    one, its only exponent code below the inf/NaN code is the subnormal one. One-bit exponents are fine with
    the ``fn``, ``fnuz`` and ``none`` encodings (``e1m2`` with ``nan="fn"`` holds 0, 0.5, ..., 3).

    Attributes:
        name: full name, e.g. ``"bfloat16"``.
        exponent_bits: width of the exponent field (1..11).
        mantissa_bits: width of the fraction field, without the implicit bit (0..52).
        nan: NaN encoding, ``"ieee"``, ``"fn"``, ``"fnuz"`` or ``"none"``.
        has_infinity: whether +-inf are codes of the format (only with ``nan="ieee"``).
        subnormals: whether the format has subnormal numbers.
        overflow: what an overflowing finite value becomes, ``"inf"``, ``"nan"`` or ``"saturate"``.
        signed: whether the format has a sign bit (False: no negative values, no -0; needs a NaN code, which
            negative inputs round to).
        zero: whether exponent code 0 holds zero and subnormals (True, every IEEE-like format) or is a normal
            binade (False: no zero, no subnormals, ``emin = -bias``; ``float8_e8m0fnu``; needs a NaN code).

    Raises:
        ValueError: a field out of range or an inconsistent combination: infinities without the IEEE encoding,
            an overflow policy the format has no code for, an IEEE-like format with 1 exponent bit, no nonzero
            finite value, or values outside float64's range (``emax > 1023`` or a smallest quantum below
            ``2**-1074``, e.g. ``e11m52`` without infinities or with the fnuz bias).
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    nan: NanEncoding = "ieee"
    has_infinity: bool = True
    subnormals: bool = True
    overflow: Overflow = "inf"
    signed: bool = True
    zero: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.exponent_bits, int) or not 1 <= self.exponent_bits <= 11:
            raise ValueError(f"exponent_bits must be an int in 1..11, got {self.exponent_bits!r}")
        if not isinstance(self.mantissa_bits, int) or not 0 <= self.mantissa_bits <= 52:
            raise ValueError(f"mantissa_bits must be an int in 0..52, got {self.mantissa_bits!r}")
        if self.nan not in ("ieee", "fn", "fnuz", "none"):
            raise ValueError(f"nan must be 'ieee', 'fn', 'fnuz' or 'none', got {self.nan!r}")
        if self.overflow not in _OVERFLOW_CODES:
            raise ValueError(f"overflow must be 'inf', 'nan' or 'saturate', got {self.overflow!r}")
        if self.has_infinity and self.nan != "ieee":
            raise ValueError(f"{self.name}: infinities exist only with nan='ieee'")
        if self.overflow == "inf" and not self.has_infinity:
            raise ValueError(f"{self.name}: overflow='inf' needs a format with infinities")
        if self.overflow == "nan" and self.nan == "none":
            raise ValueError(f"{self.name}: overflow='nan' needs a format with a NaN")
        if self.nan == "ieee" and self.exponent_bits == 1:
            raise ValueError(
                f"{self.name}: an IEEE-like format needs at least 2 exponent bits (with 1, exponent code 1 holds "
                "inf/NaN and code 0 only zero and subnormals, so there are no normal numbers); use nan='fn', "
                "'fnuz' or 'none' for a 1-bit exponent"
            )
        if self.nan == "fn" and self.exponent_bits == 1 and self.mantissa_bits == 0:
            raise ValueError(f"{self.name}: no nonzero finite value (S.1 is the NaN code and S.0 is zero)")
        if not isinstance(self.signed, bool) or not isinstance(self.zero, bool):
            raise TypeError(f"{self.name}: signed and zero must be bools, got {self.signed!r}, {self.zero!r}")
        if not (self.signed and self.zero) and self.nan == "none":
            raise ValueError(f"{self.name}: an unsigned or zero-less format needs a NaN code for the values it lacks")
        if not self.zero and (self.subnormals or self.nan in ("ieee", "fnuz")):
            raise ValueError(
                f"{self.name}: a format without zero has no subnormals and no IEEE/fnuz codes (use nan='fn', "
                "subnormals=False, has_infinity=False)"
            )
        if not self.signed and self.nan == "fnuz":
            raise ValueError(f"{self.name}: the fnuz encoding puts its NaN at the sign bit; it needs signed=True")
        if self.emax > 1023 or self.emin - self.mantissa_bits < -1074:
            raise ValueError(
                f"format {self.name} has values outside float64's range (largest binade 2**{self.emax}, "
                f"quantum of the smallest binade 2**{self.emin - self.mantissa_bits}; float64 reaches 2**1023 "
                "and 2**-1074); simfloat computes in float64"
            )
        if not self.max > 0:
            raise ValueError(f"{self.name}: no finite positive value is representable")

    # -- finfo-named properties -------------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        """Total width in bits (sign, if any, + exponent + fraction)."""
        return int(self.signed) + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        """Exponent bias (one larger than IEEE's for fnuz formats)."""
        return (1 << (self.exponent_bits - 1)) - 1 + (1 if self.nan == "fnuz" else 0)

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number (``tiny == 2**emin``; ``-bias`` without a zero code)."""
        return 1 - self.bias if self.zero else -self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite binade."""
        top = (1 << self.exponent_bits) - 1
        if self.nan == "ieee":
            top -= 1  # all-ones exponent holds inf/NaN
        elif self.nan == "fn" and self.mantissa_bits == 0:
            top -= 1  # the only code of the top binade would be the NaN
        return top - self.bias

    @property
    def max(self) -> float:
        """Largest finite value."""
        m = self.mantissa_bits
        frac_codes = (1 << (m + 1)) - 1  # 1.111..1 in units of 2**-m
        if self.nan == "fn" and m > 0:
            frac_codes -= 1  # S.1111.111 is NaN: the largest finite fraction is 1.11..10
        return math.ldexp(float(frac_codes), self.emax - m)

    @property
    def tiny(self) -> float:
        """Smallest positive normal value (``smallest_normal`` in numpy's finfo)."""
        return math.ldexp(1.0, self.emin)

    @property
    def smallest_normal(self) -> float:
        """Alias of :attr:`tiny`."""
        return self.tiny

    @property
    def smallest_subnormal(self) -> float:
        """Smallest positive value (``tiny`` when the format has no subnormals)."""
        return math.ldexp(1.0, self.emin - self.mantissa_bits) if self.subnormals else self.tiny

    @property
    def eps(self) -> float:
        """Distance from 1.0 to the next larger value."""
        return math.ldexp(1.0, -self.mantissa_bits)

    @property
    def epsneg(self) -> float:
        """Distance from 1.0 to the next smaller value (the quantum below 1.0: of the binade [1/2, 1), or of the
        subnormals when 1.0 is the smallest normal value)."""
        return math.ldexp(1.0, -self.mantissa_bits - 1 if self.emin < 0 else self.emin - self.mantissa_bits)

    @property
    def min(self) -> float:
        """Smallest finite value: ``-max``, or the smallest positive value of an unsigned format."""
        return -self.max if self.signed else (0.0 if self.zero else self.tiny)

    @property
    def precision(self) -> int:
        """Significand bits including the implicit one."""
        return self.mantissa_bits + 1

    @property
    def has_nan(self) -> bool:
        """Whether the format has a NaN code."""
        return self.nan != "none"

    @property
    def has_negative_zero(self) -> bool:
        """Whether -0 is a code of the format (not for fnuz or unsigned formats)."""
        return self.nan != "fnuz" and self.signed and self.zero

    @property
    def params(self) -> FormatParams:
        """The format as a NamedTuple for njit kernels."""
        return FormatParams(
            self.mantissa_bits,
            self.emin,
            self.max,
            _OVERFLOW_CODES[self.overflow],
            self.has_infinity,
            self.has_nan,
            self.has_negative_zero,
            self.subnormals,
            self.signed,
            self.zero,
        )

    def holds(self, x: np.ndarray) -> np.ndarray:
        """Which elements of ``x`` are values of the format: rounding them into it leaves them equal (so -0 counts
        where the format has only +0; NaN always counts, simfloat never turns a NaN into a number). Plain numpy,
        exact: a finite value is held when it lies within the range and its scaling to the quantum of its binade
        (a power of two) is an integer.

        Args:
            x: a float64 or float32 array of any shape.

        Returns:
            A bool array of ``x``'s shape.
        """
        if self == float32:  # IEEE float32: numpy's own conversion, a few times faster
            x = np.asarray(x)
            if x.dtype == np.float32:
                return np.ones(x.shape, dtype=np.bool_)
            with np.errstate(over="ignore", invalid="ignore"):
                return (x.astype(np.float32) == x) | np.isnan(x)
        a = np.abs(np.asarray(x, dtype=np.float64))
        with np.errstate(invalid="ignore"):
            exp = np.frexp(a)[1] - 1  # a in [2**exp, 2**(exp + 1)); 0 and non-finite values give something
            if self.subnormals:
                exp = np.maximum(exp, self.emin)
            on_grid = np.ldexp(a, self.mantissa_bits - exp)  # exact: a power of two, below 2**53
            ok = np.isfinite(a) & (np.floor(on_grid) == on_grid) & (a <= self.max)
        if not self.subnormals or not self.zero:
            ok &= a >= self.tiny if not self.zero else (a >= self.tiny) | (a == 0.0)
        if not self.signed:
            ok &= ~(np.asarray(x) < 0.0)
        return ok | np.isnan(a) | (np.isinf(a) & self.has_infinity)

    def replace(self, **changes: object) -> FloatFormat:
        """A copy with some fields changed (e.g. ``float8_e4m3fn.replace(overflow="saturate")``)."""
        if "name" not in changes:
            changes["name"] = self.name + "*"
        return replace(self, **changes)  # type: ignore[arg-type]  # checked in __post_init__

    def __str__(self) -> str:
        return self.name


def _ieee(name: str, e: int, m: int) -> FloatFormat:
    return FloatFormat(name, e, m)


float64 = _ieee("float64", 11, 52)
float32 = _ieee("float32", 8, 23)
tfloat32 = _ieee("tfloat32", 8, 10)
bfloat16 = _ieee("bfloat16", 8, 7)
float16 = _ieee("float16", 5, 10)
float8_e5m2 = _ieee("float8_e5m2", 5, 2)
float8_e4m3fn = FloatFormat("float8_e4m3fn", 4, 3, nan="fn", has_infinity=False, overflow="nan")
float8_e4m3 = _ieee("float8_e4m3", 4, 3)
float8_e3m4 = _ieee("float8_e3m4", 3, 4)
float8_e8m0fnu = FloatFormat(
    "float8_e8m0fnu", 8, 0, nan="fn", has_infinity=False, subnormals=False, overflow="nan", signed=False, zero=False
)
ue4m3 = FloatFormat("ue4m3", 4, 3, nan="fn", has_infinity=False, overflow="nan", signed=False)
float8_e4m3fnuz = FloatFormat("float8_e4m3fnuz", 4, 3, nan="fnuz", has_infinity=False, overflow="nan")
float8_e5m2fnuz = FloatFormat("float8_e5m2fnuz", 5, 2, nan="fnuz", has_infinity=False, overflow="nan")
float6_e2m3fn = FloatFormat("float6_e2m3fn", 2, 3, nan="none", has_infinity=False, overflow="saturate")
float6_e3m2fn = FloatFormat("float6_e3m2fn", 3, 2, nan="none", has_infinity=False, overflow="saturate")
float4_e2m1fn = FloatFormat("float4_e2m1fn", 2, 1, nan="none", has_infinity=False, overflow="saturate")

_NAMED: dict[str, FloatFormat] = {
    f.name: f
    for f in (
        float64,
        float32,
        tfloat32,
        bfloat16,
        float16,
        float8_e4m3fn,
        float8_e4m3,
        float8_e3m4,
        float8_e5m2,
        float8_e8m0fnu,
        ue4m3,
        float8_e4m3fnuz,
        float8_e5m2fnuz,
        float6_e2m3fn,
        float6_e3m2fn,
        float4_e2m1fn,
    )
}
_ALIASES = {
    "fp64": "float64",
    "f64": "float64",
    "double": "float64",
    "fp32": "float32",
    "f32": "float32",
    "single": "float32",
    "tf32": "tfloat32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
    "e4m3": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "e4m3fn": "float8_e4m3fn",
    "e5m2": "float8_e5m2",
    "fp8_e5m2": "float8_e5m2",
    "e4m3fnuz": "float8_e4m3fnuz",
    "e4m3_ieee": "float8_e4m3",
    "fp8_e3m4": "float8_e3m4",
    "e8m0": "float8_e8m0fnu",
    "ue8m0": "float8_e8m0fnu",
    "e8m0fnu": "float8_e8m0fnu",
    "float8_ue4m3": "ue4m3",
    "e5m2fnuz": "float8_e5m2fnuz",
    "e2m3": "float6_e2m3fn",
    "fp6_e2m3": "float6_e2m3fn",
    "e3m2": "float6_e3m2fn",
    "fp6_e3m2": "float6_e3m2fn",
    "e2m1": "float4_e2m1fn",
    "fp4": "float4_e2m1fn",
    "fp4_e2m1": "float4_e2m1fn",
}


def formats() -> dict[str, FloatFormat]:
    """All named formats by full name."""
    return dict(_NAMED)


def format(name: str | FloatFormat) -> FloatFormat:  # noqa: A001 - public API name from the design
    """Look a format up by full name (``"bfloat16"``), alias (``"bf16"``) or ``"e<E>m<M>"`` for a custom IEEE-like
    format with E exponent and M fraction bits (e.g. ``"e6m9"``). A :class:`FloatFormat` is returned unchanged.

    Raises:
        TypeError: ``name`` is neither a string nor a FloatFormat.
        ValueError: the name is unknown.
    """
    if isinstance(name, FloatFormat):
        return name
    if not isinstance(name, str):
        raise TypeError(f"format must be a FloatFormat or a name, got {type(name).__name__}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key in _NAMED:
        return _NAMED[key]
    if key.startswith("e") and "m" in key:
        e_str, _, m_str = key[1:].partition("m")
        if e_str.isdigit() and m_str.isdigit():
            return FloatFormat(key, int(e_str), int(m_str))
    known = ", ".join(sorted(_NAMED) + sorted(_ALIASES))
    raise ValueError(f"unknown format {name!r}; known: {known}, or 'e<E>m<M>' for a custom IEEE-like format")
