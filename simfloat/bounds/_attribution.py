"""The bounds next to the traced errors of :func:`simfloat.attribution.attribute`: bound, measured error and
tightness per run."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from simfloat.attention.plan import Plan
from simfloat.bounds._baseline import baseline_bound
from simfloat.bounds._flash import flash_bound


def _versus(kind: str, q, k, v, pl: Plan, out: np.ndarray, golden: np.ndarray, gold: np.ndarray, **kw) -> dict:
    """Bound, measured error and tightness of one run (``note`` says why a bound is missing)."""
    err = np.abs(out - golden)
    row: dict[str, Any] = dict(
        measured_max=float(err.max()) if err.size else 0.0,
        bound_max=math.nan,
        prob_max=math.nan,
        tightness_max=math.nan,
        tightness_median=math.nan,
        exceeded=0,
        note="",
    )
    try:
        bd = (flash_bound if kind == "flash" else baseline_bound)(q, k, v, plan=pl, **kw)
    except ValueError as e:
        row["note"] = str(e)
        return row
    nz = err > 0
    row.update(
        bound_max=float(bd.worst.max()),
        prob_max=float(bd.probabilistic.max()),
        exceeded=int(np.sum(err > bd.worst + gold)),
    )
    if row["measured_max"] > 0:
        row["tightness_max"] = row["bound_max"] / row["measured_max"]
        row["tightness_median"] = float(np.median(bd.worst[nz] / err[nz]))
    return row


def attribution_bounds(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    runs: Sequence[tuple],
    golden: np.ndarray,
    *,
    block_m: int,
    block_n: int,
    causal: bool,
    scale: float | None,
) -> Any:
    """The bounds next to the measured errors of :func:`simfloat.attribution.attribute`'s runs.

    Args:
        q, k, v: the evaluated inputs (q: the evaluated rows), as the runs used them.
        runs: ``(plan name, op, kernel, kernel plan, output)`` per run: ``op`` is the isolated op (the run is
            under :func:`~simfloat.attribution.isolation_plan`) or ``"all"`` (the plan itself; ``kernel``
            ``"baseline"`` for its paired baseline); ``output`` the run's output array.
        golden: the fp64 baseline output the errors are measured against.
        block_m, block_n, causal, scale: as the runs used them.

    Returns:
        A pandas DataFrame: ``plan, op, kernel, kernel_plan`` and ``measured_max`` (max |O - O_golden|),
        ``bound_max`` / ``prob_max`` (max worst-case / probabilistic bound), ``tightness_max`` (bound_max /
        measured_max), ``tightness_median`` (median over components of bound / error), ``exceeded`` (components
        above the worst-case bound plus the golden output's own bound: 0 unless the bound is wrong), ``note``
        (why a bound is missing: a regime it does not cover).
    """
    import pandas as pd

    gold = baseline_bound(q, k, v, plan="fp64", causal=causal, scale=scale).worst
    rows = []
    for name, op, kernel, kplan, out in runs:
        kw = dict(causal=causal, scale=scale)
        if kernel == "flash":
            kw.update(block_m=block_m, block_n=block_n)
        rows.append(
            dict(
                plan=name,
                op=op,
                kernel=kernel,
                kernel_plan=kplan.name,
                **_versus(kernel, q, k, v, kplan, out, golden, gold, **kw),
            )
        )
    return pd.DataFrame(rows)
