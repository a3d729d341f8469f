"""What the probes share: rounding into the probed formats (numpy only), torch dtypes and raw bits, the
context a probe runs in (the faithful interpreter without a GPU) and the cache of the probe kernels."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

# ----------------------------------------------------------------------------------------------------
# format helpers (numpy only)
# ----------------------------------------------------------------------------------------------------


def round_fp(x: np.ndarray, mant: int, emin: int, emax_val: float) -> np.ndarray:
    """Round float64 values to nearest even into a binary format with ``mant`` fraction bits and minimum
    normal exponent ``emin`` (subnormals kept), saturating at ``emax_val``."""
    x = np.asarray(x, dtype=np.float64)
    e = np.floor(np.log2(np.maximum(np.abs(x), 2.0**emin)))
    e = np.maximum(e, emin)
    q = 2.0 ** (e - mant)
    r = np.round(x / q) * q  # np.round: half to even
    return np.clip(r, -emax_val, emax_val)


def to_format(x: np.ndarray, fmt: str) -> np.ndarray:
    """float64 values rounded (RNE) to fmt and returned as float64."""
    if fmt == "bf16":
        return round_fp(x, 7, -126, 3.3895313892515355e38)
    if fmt == "fp16":
        return round_fp(x, 10, -14, 65504.0)
    if fmt == "tf32":
        return np.asarray(x, dtype=np.float32).astype(np.float64)  # tf32 operands are fp32 in memory
    if fmt == "e4m3":
        return round_fp(x, 3, -6, 448.0)
    if fmt == "e5m2":
        return round_fp(x, 2, -14, 57344.0)
    raise ValueError(f"unknown format {fmt!r}")


def torch_dtype(fmt: str) -> Any:
    import torch

    return {
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "tf32": torch.float32,
        "e4m3": torch.float8_e4m3fn,
        "e5m2": torch.float8_e5m2,
    }[fmt]


def raw_bits(t: Any) -> np.ndarray:
    """Raw bits of a CPU torch tensor as a numpy unsigned array."""
    import torch

    size = t.element_size()
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[size]
    a = t.contiguous().view(view).numpy()
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[size])


KERNELS: dict[str, Any] = {}


def run_context(device: str, faithful_kwargs: dict[str, Any] | None) -> Any:
    if device == "cuda":
        return contextlib.nullcontext()
    from simfloat_gpu.interpreter import faithful

    return faithful(**(faithful_kwargs or {}))
