"""The ``tl.sum`` order rules a :class:`~simfloat.profiles.SumPart` names, run on float32 rows."""

from __future__ import annotations

from typing import Any

from simfloat.hardware import SUM_RULES as _SUM_RULES

#: the tl.sum order rules a :class:`SumPart` can name (``Plan.sum_order`` takes the same values)
SUM_RULES = _SUM_RULES


def tl_sum(x: Any, rule: str, warps_n: int = 1) -> Any:
    """Row sums of float32 rows in a tl.sum rule's order, each addition rounded to float32.

    ``"sequential"``: left to right. ``"h200-mma"``: the tensor-core accumulator layout with ``warps_n`` warps
    along the row, :func:`simfloat.hardware.mma_tree_sum` (the model the emulator's ``sum_order="h200-mma"``
    runs).

    Args:
        x: float32 values, shape (R, n) with n >= 1.
        rule: one of :data:`SUM_RULES`.
        warps_n: warps along the row for ``"h200-mma"``: 1, 2 or 4.

    Returns:
        float32 array of shape (R,).

    Raises:
        ValueError: an unknown rule, a warps_n other than 1/2/4, or x not 2-D with columns.
    """
    import numpy as np

    from simfloat.hardware import tl_sum_mma_array

    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] < 1:
        raise ValueError(f"tl_sum: x must have shape (rows, n) with n >= 1, got {x.shape}")
    if rule not in SUM_RULES:
        raise ValueError(f"tl_sum: rule must be one of {SUM_RULES}, got {rule!r}")
    if warps_n not in (1, 2, 4):
        raise ValueError(f"tl_sum: warps_n must be 1, 2 or 4, got {warps_n!r}")
    if rule == "sequential":
        s = x[:, 0].copy()
        for j in range(1, x.shape[1]):
            s = s + x[:, j]
        return s
    return tl_sum_mma_array(x, warps_n)
