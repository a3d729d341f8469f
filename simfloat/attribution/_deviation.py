"""The deviation of an output from the golden one: the metrics of every attribution table."""

from __future__ import annotations

import math

import numpy as np

from simfloat.metrics import error_metrics

#: Deviation metrics of every table row (against the float64 golden output).
METRICS = ("max_abs", "mean_abs", "rms", "rel_rms")


#: The literature's metrics (:func:`simfloat.metrics.error_metrics`, per output row along the head dim) that the
#: flash-vs-baseline table adds to :data:`METRICS` (``rms`` is the RMSE already).
LITERATURE = ("std_abs", "mre", "mre_last4", "cos_sim", "rel_l1", "snr_db")


def literature(out: np.ndarray, golden: np.ndarray) -> dict[str, float]:
    """:data:`LITERATURE` of an output against the golden one (NaN for no elements)."""
    if np.size(out) == 0:
        return dict.fromkeys(LITERATURE, math.nan)
    m = error_metrics(out, golden, axis=-1)
    return {k: m[k] for k in LITERATURE}


def deviation(out: np.ndarray, golden: np.ndarray) -> dict[str, float]:
    """``max_abs`` (max |out - golden|, Golden et al.'s metric), ``mean_abs``, ``rms`` and ``rel_rms``
    (rms / rms(golden)) of an output against the golden one (same shape)."""
    d = np.asarray(out, dtype=np.float64) - np.asarray(golden, dtype=np.float64)
    if d.size == 0:
        return dict.fromkeys(METRICS, math.nan)
    a = np.abs(d)
    rms = float(np.sqrt(np.mean(d * d)))
    g = float(np.sqrt(np.mean(np.square(golden))))
    return {
        "max_abs": float(np.max(a)),
        "mean_abs": float(np.mean(a)),
        "rms": rms,
        "rel_rms": rms / g if g > 0 else math.nan,
    }
