"""Storage <-> value conversions for :mod:`simfloat_gpu.interpreter` (no triton import here).

The stock Triton interpreter stores a tensor as a numpy array in a *storage* dtype: fp16/fp32/fp64 as real
values, bf16 as ``uint16`` bit patterns, fp8 as ``uint8`` codes. The faithful interpreter decodes operands to
values (float32 holds every bf16/fp16/fp8 value exactly; fp64 stays float64), computes with
:mod:`simfloat`, and encodes the results back. Formats are keyed by triton's dtype names
(``tl.bfloat16.name == "bf16"``).

NaN results are stored as the canonical NaN of NVIDIA's conversions (``cvt``): 0x7FFF for bf16/fp16, 0x7F for
fp8 (payloads are not modelled). fp32/fp64 NaNs are whatever numpy/simfloat produce.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

import simfloat
from simfloat.formats import (
    FloatFormat,
    bfloat16,
    float8_e4m3fn,
    float8_e5m2,
    float16,
    float32,
    float64,
)

__all__ = [
    "FaithfulNotImplementedError",
    "FORMATS",
    "FP8",
    "STORAGE",
    "UNSUPPORTED",
    "decode",
    "encode",
    "ints_to_values",
    "round_to",
    "to_storage",
    "values_to_ints",
    "fraction_to_f32",
]

#: triton dtype name -> simfloat format, for every float dtype the faithful interpreter models.
FORMATS: dict[str, FloatFormat] = {
    "fp64": float64,
    "fp32": float32,
    "fp16": float16,
    "bf16": bfloat16,
    "fp8e4nv": float8_e4m3fn,
    "fp8e5": float8_e5m2,
}
STORAGE = {
    "fp64": np.dtype(np.float64),
    "fp32": np.dtype(np.float32),
    "fp16": np.dtype(np.float16),
    "bf16": np.dtype(np.uint16),
    "fp8e4nv": np.dtype(np.uint8),
    "fp8e5": np.dtype(np.uint8),
}
FP8 = ("fp8e4nv", "fp8e5")
#: float dtypes the interpreter knows but an NVIDIA sm90 GPU does not compute with.
UNSUPPORTED = {
    "fp8e4b8": "AMD's e4m3fnuz (gfx942); Triton upcasts it to fp16 on NVIDIA",
    "fp8e5b16": "AMD's e5m2fnuz (gfx942); Triton upcasts it to fp16 on NVIDIA",
    "fp8e4b15": "the pre-Hopper bias-15 e4m3; no simfloat format",
}


class FaithfulNotImplementedError(NotImplementedError):
    """A floating-point operation (or dtype) that simfloat_gpu.interpreter has no model for."""


RNE = "nearest_even"
RTZ = "toward_zero"

# cvt.rn.satfinite: overflow and infinities saturate to +-max, NaN stays NaN
_SATFINITE = {name: FORMATS[name].replace(name=FORMATS[name].name + "-satfinite", overflow="saturate") for name in FP8}


def _fp8_codes(fmt: FloatFormat) -> np.ndarray:
    """float64 value of each of the 256 codes (NaN for the NaN codes)."""
    m, e = fmt.mantissa_bits, fmt.exponent_bits
    codes = np.arange(256)
    sign = (codes >> 7) & 1
    ex = (codes >> m) & ((1 << e) - 1)
    fr = codes & ((1 << m) - 1)
    mag = np.where(
        ex == 0, np.ldexp(fr.astype(np.float64), fmt.emin - m), np.ldexp(1.0 + fr / float(1 << m), ex - fmt.bias)
    )
    top = ex == (1 << e) - 1
    if fmt.nan == "ieee":
        mag = np.where(top & (fr == 0), np.inf, mag)
        mag = np.where(top & (fr != 0), np.nan, mag)
    elif fmt.nan == "fn":
        mag = np.where(top & (fr == (1 << m) - 1), np.nan, mag)
    else:  # pragma: no cover - fnuz formats are rejected before they get here
        raise NotImplementedError(fmt.name)
    return np.where(sign == 1, -mag, mag)


_FP8_DECODE = {name: _fp8_codes(FORMATS[name]).astype(np.float32) for name in FP8}
# positive non-NaN codes 0, 1, ... in increasing order of value (sign-magnitude, monotonic)
_FP8_POS = {name: tab[:128][~np.isnan(tab[:128])].astype(np.float64) for name, tab in _FP8_DECODE.items()}


def decode(data: np.ndarray, name: str) -> np.ndarray:
    """Values of a storage array: float32 for every format but fp64 (exact), float64 for fp64. A float64 array is
    already values (fp64 storage, or the float64 carriers of :mod:`simfloat_gpu.interpreter.lines`' site runs)."""
    if isinstance(data, np.ndarray) and data.dtype == np.float64:
        return data
    if name == "fp32":
        return np.asarray(data, dtype=np.float32)
    if name == "fp64":
        return np.asarray(data, dtype=np.float64)
    if name == "fp16":
        return np.asarray(data, dtype=np.float16).astype(np.float32)
    if name == "bf16":
        return (np.asarray(data).astype(np.uint32) << np.uint32(16)).view(np.float32)
    return _FP8_DECODE[name][np.asarray(data, dtype=np.uint8)]


def to_storage(values: np.ndarray, name: str) -> np.ndarray:
    """Storage array of ``values``, which must already be values of the format (NaN: canonical NaN)."""
    v = np.asarray(values)
    if name == "fp64":
        return v.astype(np.float64)
    if name == "fp32":
        return v.astype(np.float32)
    nan = np.isnan(v)
    if name == "fp16":
        bits = v.astype(np.float16).view(np.uint16)
        return np.where(nan, np.uint16(0x7FFF), bits).astype(np.uint16).view(np.float16)
    if name == "bf16":
        f = v.astype(np.float32)
        u = f.view(np.uint32)
        if np.any(((u & np.uint32(0xFFFF)) != 0) & ~nan):
            raise AssertionError("internal error: value is not a bfloat16")
        bits = (u >> np.uint32(16)).astype(np.uint16)
        return np.where(nan, np.uint16(0x7FFF), bits).astype(np.uint16)
    pos = _FP8_POS[name]
    mag = np.where(nan, 0.0, np.abs(v.astype(np.float64)))
    idx = np.minimum(np.searchsorted(pos, mag), len(pos) - 1)
    if np.any(pos[idx] != mag):
        raise AssertionError(f"internal error: value is not a {FORMATS[name].name}")
    code = idx.astype(np.uint8) | (np.signbit(v).astype(np.uint8) << np.uint8(7))
    return np.where(nan, np.uint8(0x7F), code).astype(np.uint8)


def round_to(values: np.ndarray, name: str, mode: str, fp8_overflow: str) -> np.ndarray:
    """``values`` (float32/float64) rounded into the format, as float32/float64 values.

    fp8 with ``mode`` nearest-even follows ``fp8_overflow``: ``"satfinite"`` (NVIDIA ``cvt.rn.satfinite``:
    overflow and +-inf -> +-max, NaN -> NaN) or ``"ieee"`` (the format's own policy, as ml_dtypes: e4m3fn
    overflow -> NaN, e5m2 overflow -> inf). Toward zero never overflows to infinity; infinities stay (e5m2).
    """
    v = np.asarray(values)
    if v.dtype not in (np.float32, np.float64):
        v = v.astype(np.float64)
    if name in FP8 and mode == RNE and fp8_overflow == "satfinite":
        r = simfloat.round(v, _SATFINITE[name], RNE)
        if FORMATS[name].has_infinity:
            r = np.where(np.isinf(v), np.copysign(FORMATS[name].max, v), r).astype(r.dtype)
        return r
    return simfloat.round(v, FORMATS[name], mode)


def encode(values: np.ndarray, name: str, mode: str, fp8_overflow: str) -> np.ndarray:
    """Round ``values`` into the format and return the storage array. With ``fp8_overflow="ieee"`` an fp8 NaN
    keeps the sign of the input (as ml_dtypes: -470 -> 0xFF in e4m3fn); otherwise NaN is NVIDIA's 0x7F."""
    r = round_to(values, name, mode, fp8_overflow)
    out = to_storage(r, name)
    if name in FP8 and fp8_overflow == "ieee":
        out = np.where(np.isnan(r) & np.signbit(values), out | np.uint8(0x80), out).astype(np.uint8)
    return out


def _round_to_odd_53(n: int) -> float:
    """The integer ``n`` rounded to float64 with round-to-odd (then rounding it into any format of <= 51
    fraction bits equals rounding ``n`` directly): :func:`simfloat.round` of the exact integer."""
    return float(simfloat.round(n, float64, "odd"))


def ints_to_values(data: np.ndarray, target: str) -> np.ndarray:
    """Integer (or bool) storage as float values that round into ``target`` exactly as the integers do."""
    d = np.asarray(data)
    if target == "fp64":
        return d.astype(np.float64)  # one correctly rounded conversion (cvt.rn.f64.s64)
    if target == "fp32":
        return d.astype(np.float32)  # likewise; rounding it again into fp32 is the identity
    v = d.astype(np.float64)
    if d.dtype.itemsize == 8:
        big = np.abs(v) >= 2.0**53
        for i in np.flatnonzero(big):
            v.flat[i] = _round_to_odd_53(int(d.flat[i]))
    return v


def values_to_ints(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Float -> integer as PTX ``cvt.rzi``: truncate toward zero, saturate to the range, NaN -> 0."""
    v = np.asarray(values, dtype=np.float64)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return v != 0
    info = np.iinfo(dt)
    t = np.trunc(v)
    hi = t >= float(info.max) + 1.0  # 2**(bits-1) or 2**bits, exact in float64
    lo = t < float(info.min)
    nan = np.isnan(t)
    safe = np.where(hi | lo | nan, 0.0, t)
    out = safe.astype(dt)
    out = np.where(hi, dt.type(info.max), out)
    out = np.where(lo, dt.type(info.min), out)
    return out.astype(dt)


def fraction_to_f32(q: Fraction) -> float:
    """Round a rational to the nearest fp32 (ties to even), once, as a float: :func:`simfloat.round` of the
    exact value."""
    return float(simfloat.round(q, float32))
