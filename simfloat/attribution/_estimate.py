"""How long an attribution's kernel runs will take, from a measured rate: before the first run starts.

Every run's work is ``lead x rows x keys x (head_dim + head_dim_v)`` multiply-adds (keys: the ones each row
sees, fewer with a causal mask). One run of each kind (the untraced baseline, the untraced flash, the traced
flash on the reference engine) is timed on a calibration slice of the inputs (its compilation, on a fresh
machine, before the timed call), and every run's time is its work at its kind's rate. Untraced runs scale with
the evaluated rows; the traced run covers its own rows, so :meth:`Estimate.rows_for` can say how many
evenly spaced rows fit in a time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Estimate", "duration", "estimate_runs"]

#: Calibration slice: query rows and keys of one (batch, head) pair (fewer when the inputs have fewer).
CAL_ROWS, CAL_KEYS, CAL_TRACED_ROWS = 256, 1024, 32


def duration(seconds: float) -> str:
    """``"40 s"``, ``"12 min"``, ``"3.5 h"``."""
    if seconds < 120:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass(frozen=True)
class Estimate:
    """The predicted time of an attribution's kernel runs (:func:`simfloat.attribute`'s ``estimate=``).

    Attributes:
        seconds: the predicted total of every run (compilation not included; the calibration made it).
        runs: number of distinct runs.
        rows: evaluated query rows (of ``seq_q``).
        seq_q: query rows of the inputs.
        causal: a causal mask (then rows cannot be subsampled).
        per_row: seconds of the untraced runs per evaluated row (they scale with the rows).
        fixed: seconds of the traced runs (they scale with their own rows, ``trace_rows``).
        calibration: seconds the calibration took (compilation included).
        trace_rows: query rows of each traced run (0: none).
    """

    seconds: float
    runs: int
    rows: int
    seq_q: int
    causal: bool
    per_row: float
    fixed: float
    calibration: float
    trace_rows: int = 0

    def _fixed(self, trace_rows: int | None) -> float:
        if trace_rows is None or not self.trace_rows:
            return self.fixed
        return self.fixed * min(trace_rows, self.trace_rows) / self.trace_rows

    def rows_for(self, seconds: float, trace_rows: int | None = None) -> int:
        """How many evenly spaced query rows (``rows=``) make the runs take about ``seconds`` (at least 1, at
        most the rows now evaluated), with the traced runs over ``trace_rows`` rows (None: as now)."""
        if self.per_row <= 0:
            return self.rows
        return int(max(1, min(self.rows, math.floor((seconds - self._fixed(trace_rows)) / self.per_row))))

    def advice(self, budget: float = 600.0) -> str:
        """A hint for a job longer than ``budget`` seconds: the ``--rows`` (and, when the traced run takes more
        than a third of the budget, the ``--trace-rows``) that fit (``rows=``, ``trace_rows=`` in the API), or a
        shorter sequence for a causal job. Empty when it fits."""
        if self.seconds <= budget:
            return ""
        if self.causal:
            return (
                f"a causal mask needs every row; a shorter --seq (the time grows as seq^2), fewer --tiles and "
                f"--block-ns or a smaller --trace-rows bring it toward {duration(budget)}"
            )
        t = self.trace_rows
        if t and self.fixed > budget / 3:
            t = max(1, math.floor(self.trace_rows * budget / 3 / self.fixed))
        r = self.rows_for(budget, t)
        opts = f"--rows {r}" + (f" --trace-rows {t}" if t < self.trace_rows else "")
        return (
            f"{opts} (evenly spaced query rows; their outputs are the same bits as in the full run) takes about "
            f"{duration(self.per_row * r + self._fixed(t))}"
        )

    def __str__(self) -> str:
        return (
            f"estimated about {duration(self.seconds)} for {self.runs} kernel runs ({self.rows} of {self.seq_q} "
            f"query rows; measured on this machine, calibration {duration(self.calibration)})"
        )


def _keys_seen(rows: np.ndarray, seq_k: int, causal: bool) -> float:
    """Total keys the rows see (top-left causal mask: row i sees min(i + 1, seq_k))."""
    if not causal:
        return float(len(rows) * seq_k)
    return float(np.minimum(rows + 1, seq_k).sum())


def estimate_runs(
    jobs: list[dict[str, Any]],
    q_shape: tuple[int, ...],
    v_shape: tuple[int, ...],
    causal: bool,
    seq_q: int,
    run_slice: Callable[[dict[str, Any], int, int], None],
) -> Estimate:
    """The :class:`Estimate` of ``jobs`` (the runner's, each with ``kernel``, ``plan`` and ``rows``: its traced
    rows or None) on evaluated operands of shapes ``q_shape`` (..., rows, d) and ``v_shape`` (..., seq_k, d_v)
    of inputs with ``seq_q`` query rows. ``run_slice(job, rows, keys)`` runs a job on the first ``rows`` query
    rows (or traced rows) and ``keys`` keys of one (batch, head) pair, without a mask."""
    t0 = time.perf_counter()
    n_lead = math.prod(q_shape[:-2])
    n_rows, d = q_shape[-2:]
    seq_k, dv = v_shape[-2:]
    width = d + dv
    kinds: dict[str, dict[str, Any]] = {}
    for j in jobs:  # a representative of each kind: the first baseline run of a low-precision plan, if any
        kind = "traced" if j["rows"] is not None else j["kernel"]
        if kind not in kinds or (kind == "baseline" and kinds[kind]["plan"].name == "fp64"):
            kinds[kind] = j
    rate = {}
    for kind, j in kinds.items():
        rows = min(n_rows, CAL_TRACED_ROWS if kind == "traced" else CAL_ROWS)
        keys = min(seq_k, CAL_KEYS)
        run_slice(j, rows, keys)  # compiles on a fresh machine
        t1 = time.perf_counter()
        run_slice(j, rows, keys)
        rate[kind] = (time.perf_counter() - t1) / (rows * keys * width)
    every = np.arange(n_rows)
    per_row = fixed = 0.0
    traced = 0
    for j in jobs:
        if j["rows"] is not None:
            traced = max(traced, len(j["rows"]))
            fixed += rate["traced"] * n_lead * _keys_seen(np.asarray(j["rows"]), seq_k, causal) * width
        else:
            per_row += rate[j["kernel"]] * n_lead * _keys_seen(every, seq_k, causal) * width / max(n_rows, 1)
    return Estimate(
        seconds=per_row * n_rows + fixed,
        runs=len(jobs),
        rows=n_rows,
        seq_q=seq_q,
        causal=causal,
        per_row=per_row,
        fixed=fixed,
        calibration=time.perf_counter() - t0,
        trace_rows=traced,
    )
