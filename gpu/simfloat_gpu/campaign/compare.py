"""Comparing a kernel's outputs with the emulator's: the bit-level metrics (agreement and distance in units in
the last place), the emulator's run under a config's plan, and :func:`compare_to_emulator`, the one comparison
of the campaign (a live kernel run, a recorded fixture or a user's kernel).

Imports only numpy and the standard library at import time: simfloat is loaded where used.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from simfloat_gpu.campaign.grid import Config
from simfloat_gpu.campaign.kinds import kind_of
from simfloat_gpu.campaign.records import Record, ValidationRecord

__all__ = [
    "agreement",
    "compare_outputs",
    "compare_to_emulator",
    "config_columns",
    "emulator_plan",
    "error_stats",
    "error_status",
    "from_bits16",
    "new_record",
    "ordered_bits",
    "out_format",
    "raw_bits",
    "run_emulator",
]


def emulator_plan(cfg: Config, family: str = "triton") -> str:
    """The emulator's plan for a config: ``<family>-<fmt>`` (flash; family ``triton`` or ``h200``),
    ``triton-<fmt>@<family>`` for a profile registered by :func:`simfloat_gpu.campaign.kinds.use_hardware`, or
    the preset of a quantized kernel (int8: by variant and row sum, int8-reference, int8-consistent, half-int8,
    half-int8-consistent; sage: the variant).

    Raises:
        ValueError: an unknown plan family (flash).
    """
    return kind_of(cfg).plan(cfg, family)


def run_emulator(
    cfg: Config,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    out: str | None = None,
    family: str = "triton",
    *,
    plan: Any = None,
) -> dict[str, np.ndarray]:
    """The emulator with the config's plan (:func:`emulator_plan`): ``out``, ``m``, ``l`` as float64 arrays.
    ``out`` overrides the config's output ("fp32" or "low"). flash: ``simfloat.attention.flash`` with
    ``plan("<family>-<fmt>")`` (its output in float32 for ``out`` "fp32"), or with ``plan`` (a
    :class:`simfloat.attention.Plan`, used as it is) when given; int8 and sage (``family`` and ``plan``
    unused): ``simfloat.attention.int8_flash`` / ``quant_flash`` with the kernel's preset."""
    return kind_of(cfg).emulator(cfg, q, k, v, cfg.out if out is None else out, family, plan)


# ----------------------------------------------------------------------------------------------------
# metrics
# ----------------------------------------------------------------------------------------------------


def ordered_bits(x: np.ndarray, fmt: str) -> np.ndarray:
    """Sign-magnitude bit patterns of ``x`` (values of fmt) mapped to ordered int64: adjacent values of the
    format differ by 1, +0 and -0 both map to 0."""
    x32 = np.ascontiguousarray(np.asarray(x, dtype=np.float64).astype(np.float32))
    if fmt == "fp32":
        b = x32.view(np.uint32).astype(np.int64)
        sign, mag = b >> 31, b & 0x7FFFFFFF
    else:
        if fmt == "bf16":
            b = (x32.view(np.uint32) >> 16).astype(np.int64)
        elif fmt == "fp16":
            b = x32.astype(np.float16).view(np.uint16).astype(np.int64)
        else:
            raise ValueError(f"unknown format {fmt!r}")
        sign, mag = b >> 15, b & 0x7FFF
    return np.where(sign == 1, -mag, mag)


def raw_bits(x: np.ndarray, fmt: str) -> np.ndarray:
    """The bit patterns of ``x`` (values of fmt) as uint32: 16-bit formats in the low half."""
    x32 = np.ascontiguousarray(np.asarray(x, dtype=np.float64).astype(np.float32))
    if fmt == "fp16":
        return x32.astype(np.float16).view(np.uint16).astype(np.uint32)
    if fmt == "bf16":
        return x32.view(np.uint32) >> 16
    return x32.view(np.uint32)


def from_bits16(bits: np.ndarray, fmt: str) -> np.ndarray:
    """float32 values of 16-bit patterns of fmt (fp16; else bf16): the inverse of :func:`raw_bits`."""
    bits = np.asarray(bits, dtype=np.uint16)
    if fmt == "fp16":
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def agreement(a: np.ndarray, b: np.ndarray, fmt: str) -> tuple[float, int]:
    """(fraction of bitwise-equal elements, NaN == NaN; max distance in units in the last place of fmt)."""
    a = np.asarray(a)
    b = np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    if a.size == 0:
        return 1.0, 0
    both_nan = np.isnan(a) & np.isnan(b)
    eq = (raw_bits(a, fmt) == raw_bits(b, fmt)) | both_nan
    finite = np.isfinite(a) & np.isfinite(b)
    d = np.abs(ordered_bits(np.where(finite, a, 0.0), fmt) - ordered_bits(np.where(finite, b, 0.0), fmt))
    max_ulp = int(d.max()) if d.size else 0
    if np.any((np.isfinite(a) != np.isfinite(b)) | (np.isnan(a) != np.isnan(b))):
        max_ulp = -1  # a non-finite mismatch: no ulp distance
    return float(np.mean(eq)), max_ulp


def error_stats(x: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(max, root mean square) of ``x - ref`` (0, 0 for empty arrays)."""
    d = np.asarray(x, dtype=np.float64) - ref
    if d.size == 0:
        return 0.0, 0.0
    return float(np.max(np.abs(d))), float(np.sqrt(np.mean(d * d)))


def out_format(cfg: Config, which: str | None = None) -> str:
    """The format of an output ("fp32" or "low": the input format; default the config's ``out``)."""
    which = cfg.out if which is None else which
    return "fp32" if which == "fp32" else cfg.fmt


# ----------------------------------------------------------------------------------------------------
# records and the comparison
# ----------------------------------------------------------------------------------------------------


def new_record(cfg: Config, backend: str, family: str = "triton", **fields: Any) -> ValidationRecord:
    """The record of ``cfg`` before any comparison: the config, the backend, the emulator plan of ``family``."""
    return ValidationRecord(
        **{**config_columns(cfg, ValidationRecord), "backend": backend, "plan": emulator_plan(cfg, family), **fields}
    )


def config_columns(cfg: Config, record: type[Record]) -> dict[str, Any]:
    """The fields of ``record`` (a :class:`ValidationRecord` or :class:`BackwardRecord`) that ``cfg`` has
    (:meth:`Config.as_dict`: its fields, id and seed), by name."""
    d = cfg.as_dict()
    return {k: d[k] for k in record.csv_fields() if k in d}


def error_status(exc: BaseException) -> str:
    """A record's status for a failed config: ``error: <type>: <message>`` on one line."""
    return f"error: {type(exc).__name__}: {str(exc)[:300]}".replace("\n", " ")


def compare_outputs(cfg: Config, kernel: dict[str, np.ndarray], emu: dict[str, np.ndarray]) -> dict[str, Any]:
    """The agreement fields of a :class:`ValidationRecord` from kernel and emulator outputs: ``out`` in the
    config's output format, then ``out32`` (with its relative difference), ``m`` and ``l`` in fp32 where both
    sides have them."""
    res: dict[str, Any] = {}
    agree, ulp = agreement(kernel["out"], emu["out"], out_format(cfg))
    res["bitwise_agreement"], res["max_ulp"] = round(agree, 6), ulp
    if "out32" in kernel and "out32" in emu:
        a32, u32 = agreement(kernel["out32"], emu["out32"], "fp32")
        res["out32_agreement"], res["out32_max_ulp"] = round(a32, 6), u32
        k32 = np.asarray(kernel["out32"], dtype=np.float64)
        scale = float(np.max(np.abs(k32))) if k32.size else 0.0
        diff = float(np.max(np.abs(k32 - emu["out32"]))) if k32.size else 0.0
        res["out32_rel_diff"] = diff / scale if scale > 0 else diff
    for key in ("m", "l"):
        if key in kernel and key in emu:
            a, u = agreement(kernel[key], emu[key], "fp32")
            res[f"{key}_agreement"], res[f"{key}_max_ulp"] = round(a, 6), u
    return res


def compare_to_emulator(
    rec: ValidationRecord,
    cfg: Config,
    inputs: tuple[np.ndarray, np.ndarray, np.ndarray],
    ref: np.ndarray,
    kernel: dict[str, np.ndarray],
    *,
    family: str = "triton",
    plan: Any = None,
    fp32_too: bool = False,
    emulated: dict[str, np.ndarray] | None = None,
) -> ValidationRecord:
    """The one comparison of the campaign: a kernel's outputs (a live run, a recorded fixture or a user's
    kernel) against the emulator under a plan family's ``<family>-<fmt>`` preset, or ``plan`` when given
    (int8 configs: the int8 preset).

    Args:
        rec: the config's record so far (:func:`new_record`; the kernel's columns filled by the caller).
        cfg: the config.
        inputs: q, k, v, each (batch, heads, seq, head_dim), values of ``cfg.fmt``.
        ref: the float64 attention of the inputs (:func:`simfloat_gpu.campaign.grid.reference64`), (batch,
            heads, seq, head_dim).
        kernel: the kernel's ``out`` (the config's output format), ``m``, ``l`` and, where it has one, the
            fp32 output ``out32``.
        family: the plan family (:data:`simfloat_gpu.campaign.kinds.PLAN_FAMILIES` or a registered hardware
            profile's name).
        plan: a :class:`simfloat.attention.Plan` to use instead of the family's preset.
        fp32_too: also run the emulator with a float32 output (flash configs of a low-precision output), so
            that a kernel's ``out32`` is compared too.

    Returns:
        ``rec`` with the emulator's seconds and error, every agreement column and status ``ok``.

    Raises:
        ValueError: ``fp32_too`` with a given ``plan``, or an unknown plan family.
    """
    if plan is not None and fp32_too:
        raise ValueError("compare_to_emulator: fp32_too needs a plan family (a given plan is used as it is)")
    q, k, v = inputs
    t0 = time.perf_counter()
    emu = run_emulator(cfg, q, k, v, family=family, plan=plan)
    if kind_of(cfg).fp32_output and cfg.out == "fp32":
        emu["out32"] = emu["out"]
    elif kind_of(cfg).fp32_output and fp32_too:
        emu["out32"] = run_emulator(cfg, q, k, v, out="fp32", family=family, plan=plan)["out"]
    emulator_s = round(time.perf_counter() - t0, 3)
    if emulated is not None:
        emulated.update(emu)
    err_max, err_rms = error_stats(emu["out"], ref)
    return dataclasses.replace(
        rec,
        status="ok",
        emulator_s=emulator_s,
        emulator_err_max=err_max,
        emulator_err_rms=err_rms,
        **compare_outputs(cfg, kernel, emu),
    )
