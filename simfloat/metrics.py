"""Error metrics of the attention literature, computed one way for every error table.

:func:`error_metrics` returns, for an output ``x`` against a reference ``ref`` (``e = x - ref``, sums and means
over the elements in C order):

============  ===================================================  ==============================================
key           definition                                           source
============  ===================================================  ==============================================
``max_abs``   ``max |e|``                                          Golden et al. 2024 ("Is Flash Attention
                                                                   Stable?"), the deviation they plot
``mean_abs``  ``mean |e|``                                         Golden et al. (mean of the absolute deviation)
``std_abs``   standard deviation of ``|e|`` (population, ddof 0)   Golden et al. (its spread)
``rmse``      ``sqrt(mean e**2)``                                  FlashAttention-3 (Shah et al. 2024), RMSE of
                                                                   the FP8 output against an fp64 reference
``mre``       ``mean(|e| / (|ref| + 1e-5))`` over all elements     INT-FlashAttention's code (Chen et al. 2024)
``mre_last4`` the same over the last four elements only            INT-FlashAttention's code (see below)
``cos_sim``   ``sum(x ref) / (||x|| ||ref||)`` (flattened)         SageAttention (Zhang et al. 2024)
``rel_l1``    ``sum |e| / sum |ref|``                              SageAttention
``snr_db``    ``10 log10(sum ref**2 / sum e**2)``                  signal-to-noise ratio in decibels
============  ===================================================  ==============================================

INT-FlashAttention's "MRE" is read from their benchmark code as the mean of ``|e| / (|ref| + 1e-5)`` (the
``1e-5`` guards against division by zero and dominates where ``|ref|`` is tiny). Their code also reports the
mean over the last four elements only; which four it means is ambiguous (the flattened tensor's last four is
the reading taken here, as in ``experiments/int8_error.py``): with ``axis`` given, the last four along that
axis, for every position of the other axes.

Undefined ratios are NaN (``cos_sim`` with a zero vector, ``rel_l1`` of zero error against a zero
reference); a nonzero error against a zero reference gives ``rel_l1 = inf``; zero error gives
``snr_db = inf``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["METRIC_KEYS", "error_metrics"]

#: The keys of :func:`error_metrics`, in order.
METRIC_KEYS = ("max_abs", "mean_abs", "std_abs", "rmse", "mre", "mre_last4", "cos_sim", "rel_l1", "snr_db")
_MRE_GUARD = 1e-5


def _ratio(num: float, den: float) -> float:
    if den > 0:
        return num / den
    return math.nan if num == 0 else math.inf


def error_metrics(x: np.ndarray, ref: np.ndarray, *, axis: int | None = None) -> dict[str, float]:
    """The literature's error metrics of ``x`` against ``ref`` (definitions and sources: the module docstring).

    Args:
        x: output array, any shape (real numbers; float16/32/64 or ints, computed in float64).
        ref: reference array of the same shape.
        axis: None: every metric over all elements. An int: ``cos_sim``, ``rel_l1``, ``snr_db`` and
            ``mre_last4`` per vector along that axis (e.g. the head dimension of each output row), then
            averaged over the other positions; the element-wise metrics stay over all elements.

    Returns:
        a dict with the keys of :data:`METRIC_KEYS`, float values.

    Raises:
        TypeError: a non-numeric array. ValueError: shapes that differ, no elements, a bad ``axis``.
    """
    arrays = []
    for name, a in (("x", x), ("ref", ref)):
        arr = np.asarray(a)
        if arr.dtype.kind not in "fiu":
            raise TypeError(f"error_metrics: {name} must be a real numeric array, got dtype {arr.dtype}")
        arrays.append(arr.astype(np.float64))
    xa, ra = arrays
    if xa.shape != ra.shape:
        raise ValueError(f"error_metrics: x has shape {xa.shape} but ref has shape {ra.shape}")
    if xa.size == 0:
        raise ValueError("error_metrics: x and ref have no elements")
    if axis is not None:
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise TypeError(f"error_metrics: axis must be None or an int, got {type(axis).__name__}")
        if not -xa.ndim <= axis < xa.ndim:
            raise ValueError(f"error_metrics: axis {axis} is out of range for arrays of {xa.ndim} dims")
    e = xa - ra
    ae = np.abs(e)
    rel = ae / (np.abs(ra) + _MRE_GUARD)
    out = {
        "max_abs": float(np.max(ae)),
        "mean_abs": float(np.mean(ae)),
        "std_abs": float(np.std(ae)),
        "rmse": float(np.sqrt(np.mean(e * e))),
        "mre": float(np.mean(rel)),
    }
    if axis is None:
        out["mre_last4"] = float(np.mean(rel.ravel()[-4:]))
        out["cos_sim"] = _cos(xa.ravel(), ra.ravel())
        out["rel_l1"] = _ratio(float(np.sum(ae)), float(np.sum(np.abs(ra))))
        out["snr_db"] = _snr(float(np.sum(ra * ra)), float(np.sum(e * e)))
        return out
    xm, rm = np.moveaxis(xa, axis, -1), np.moveaxis(ra, axis, -1)
    xs, rs = xm.reshape(-1, xm.shape[-1]), rm.reshape(-1, rm.shape[-1])
    es = xs - rs
    out["mre_last4"] = float(np.mean((np.abs(es) / (np.abs(rs) + _MRE_GUARD))[:, -4:]))
    out["cos_sim"] = float(np.mean([_cos(a, b) for a, b in zip(xs, rs, strict=True)]))
    sa, sr = np.sum(np.abs(es), axis=1), np.sum(np.abs(rs), axis=1)
    out["rel_l1"] = float(np.mean([_ratio(float(a), float(b)) for a, b in zip(sa, sr, strict=True)]))
    pr, pe = np.sum(rs * rs, axis=1), np.sum(es * es, axis=1)
    out["snr_db"] = float(np.mean([_snr(float(a), float(b)) for a, b in zip(pr, pe, strict=True)]))
    return out


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0 or nb == 0:
        return math.nan
    return float(a @ b) / (na * nb)


def _snr(signal: float, noise: float) -> float:
    if noise == 0:
        return math.inf if signal > 0 else math.nan
    if signal == 0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)
