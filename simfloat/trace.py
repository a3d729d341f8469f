"""Error attribution for emulated attention: where the rounding error comes from, op by op and block by block.

Pass a :class:`Tracer` as ``trace=`` to :func:`simfloat.attention.flash`,
:func:`~simfloat.attention.baseline` or :func:`~simfloat.attention.flash_backward` (whose records are
described in its docstring: its states are the gradient accumulators dq, dk, dv). For every op instance,
identified by (op, lead index, q tile, kv block), the kernel records the *local* error the op introduced: its
low-precision result minus the float64 result of the same operation on the same low-precision inputs (a dot's
"exact" value is a float64 loop; exp is libm's).
It also runs a float64 *shadow* of the same dataflow alongside (same tiling, same lazy-rescaling decisions,
FMAs where the plan contracts) and records, after every kv block, how far the state (``m_i``, ``l_i``,
``acc``) has drifted from the shadow's, and at the end the output's drift (``out``). ``l_i`` and ``acc`` are
relative to each run's own running max, so their drift includes the effect of ``m_i``'s
(the output's does not).

Each record aggregates a group of values: ``max_abs`` (largest |error|), ``sum_sq`` (sum of squares),
``count`` and ``ref_max`` (largest |reference value|, to make errors relative). kv block ``-1`` is the
epilogue (normalize, the output cast and the output drift). The baseline has one kv block (0) and q tiles of
64 rows. The lead index is the flat (C-order) index over the leading (batch, head, ...) dimensions.

Tracing never changes results: traced and untraced calls return identical bits.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from simfloat._jit import jit

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["STATES", "Tracer", "record"]

#: State quantities whose drift from the float64 shadow is recorded.
STATES = ("m_i", "l_i", "acc", "out")
_NSTAT = 4  # max_abs, sum_sq, count, ref_max


@jit
def record(arr: np.ndarray, b: int, t: int, kv: int, idx: int, err: float, ref: float) -> None:
    """Add one error sample ``err`` (reference value ``ref``) to ``arr[b, t, kv, idx]``; NaN sticks."""
    a = abs(err)
    if a != a or a > arr[b, t, kv, idx, 0]:
        arr[b, t, kv, idx, 0] = a
    arr[b, t, kv, idx, 1] += err * err
    arr[b, t, kv, idx, 2] += 1.0
    r = abs(ref)
    if r > arr[b, t, kv, idx, 3]:
        arr[b, t, kv, idx, 3] = r


class Tracer:
    """Collects per-op local rounding errors and state drift of emulated attention calls (see module docs).

    Every traced call appends a run; the DataFrame methods cover all runs (column ``run``).
    """

    def __init__(self) -> None:
        self._runs: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return len(self._runs)

    def __repr__(self) -> str:
        return f"Tracer({len(self._runs)} runs)"

    def clear(self) -> None:
        """Forget all runs."""
        self._runs.clear()

    def _start(
        self,
        kernel: str,
        plan: str,
        ops: tuple[str, ...],
        n_lead: int,
        n_qt: int,
        n_kv: int,
        states: tuple[str, ...] = STATES,
        **meta: object,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Allocate the record arrays of a new run: local (lead, q tile, kv block + epilogue, op, stat) and
        state (lead, q tile, kv block + epilogue, state, stat); ``states`` names the kernel's state quantities
        (the forward's :data:`STATES`; the backward's dq, dk, dv). Called by the kernels."""
        local = np.zeros((n_lead, n_qt, n_kv + 1, len(ops), _NSTAT))
        state = np.zeros((n_lead, n_qt, n_kv + 1, len(states), _NSTAT))
        self._runs.append(dict(kernel=kernel, plan=plan, ops=ops, states=states, local=local, state=state, meta=meta))
        return local, state

    @property
    def runs(self) -> list[dict[str, Any]]:
        """The raw runs: kernel, plan name, op and state names, record arrays and call metadata."""
        return list(self._runs)

    def _frame(self, key: str, names_of: str) -> pd.DataFrame:
        import pandas as pd

        parts = []
        for r, run in enumerate(self._runs):
            arr = run[key]
            names = run["ops"] if names_of == "op" else run["states"]
            lead, qt, kv, idx = np.nonzero(arr[..., 2] > 0)
            sel = arr[lead, qt, kv, idx]
            n_kv = arr.shape[2] - 1
            parts.append(
                pd.DataFrame(
                    {
                        "run": r,
                        "kernel": run["kernel"],
                        "plan": run["plan"],
                        names_of: pd.Categorical(np.asarray(names, dtype=object)[idx], categories=list(names)),
                        "lead": lead,
                        "q_tile": qt,
                        "kv_block": np.where(kv == n_kv, -1, kv),
                        "max_abs": sel[:, 0],
                        "sum_sq": sel[:, 1],
                        "count": sel[:, 2].astype(np.int64),
                        "ref_max": sel[:, 3],
                    }
                )
            )
        if not parts:
            return pd.DataFrame(
                columns=[
                    "run",
                    "kernel",
                    "plan",
                    names_of,
                    "lead",
                    "q_tile",
                    "kv_block",
                    "max_abs",
                    "sum_sq",
                    "count",
                    "ref_max",
                    "rms",
                ]
            )
        df = pd.concat(parts, ignore_index=True)
        if df[names_of].dtype != "category":  # runs of different kernels: the union of op names
            df[names_of] = df[names_of].astype(str)
        df["rms"] = np.sqrt(df["sum_sq"] / df["count"])
        return df

    def local_errors(self) -> pd.DataFrame:
        """One row per (run, op, lead, q tile, kv block) with local-error stats (max_abs, sum_sq, count,
        ref_max, rms)."""
        return self._frame("local", "op")

    def state_deviation(self) -> pd.DataFrame:
        """One row per (run, state, lead, q tile, kv block) with the state's drift from the float64 shadow."""
        return self._frame("state", "state")

    @staticmethod
    def _summary(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
        g = df.groupby(keys, observed=True, sort=True)
        out = g.agg(
            max_abs=("max_abs", "max"), sum_sq=("sum_sq", "sum"), count=("count", "sum"), ref_max=("ref_max", "max")
        )
        out["rms"] = np.sqrt(out["sum_sq"] / out["count"])
        with np.errstate(divide="ignore", invalid="ignore"):
            out["rel_max"] = out["max_abs"] / out["ref_max"]
        return out.drop(columns="sum_sq")

    def by_op(self) -> pd.DataFrame:
        """Local error per (kernel, op), in the kernel's op order: max_abs, count, ref_max, rms, rel_max."""
        return self._summary(self.local_errors(), ["kernel", "op"])

    def by_block(self, stat: str = "rms") -> pd.DataFrame:
        """Local error ``stat`` (max_abs, rms, count, rel_max) per kv block (rows; -1 = epilogue) and op."""
        return self._summary(self.local_errors(), ["kv_block", "op"])[stat].unstack("op")

    def state_by_block(self, stat: str = "rel_max") -> pd.DataFrame:
        """State drift ``stat`` per kv block (rows; -1 = epilogue: the output) and state (columns)."""
        return self._summary(self.state_deviation(), ["kv_block", "state"])[stat].unstack("state")

    def plot(self, path: str, title: str | None = None) -> str:
        """Save a PNG: local error by op (left) and state drift by kv block (right). Returns ``path``."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ops = self.by_op().reset_index()
        drift = self.state_by_block("rel_max")
        fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 4.5))
        two = ops["kernel"].nunique() > 1
        labels = [f"{k}:{o}" if two else str(o) for k, o in zip(ops["kernel"], ops["op"], strict=True)]
        x = np.arange(len(labels))
        ax0.bar(x - 0.2, ops["rms"].clip(lower=1e-300), 0.4, label="rms")
        ax0.bar(x + 0.2, ops["max_abs"].clip(lower=1e-300), 0.4, label="max |err|")
        ax0.set_xticks(x, labels, rotation=45, ha="right")
        ax0.set_yscale("log")
        ax0.set_ylabel("local rounding error")
        ax0.legend()
        steps = drift.drop(index=-1, errors="ignore")
        for col in steps.columns:
            ax1.plot(steps.index, steps[col].clip(lower=1e-300), marker="o", ms=3, label=str(col))
        if -1 in drift.index and "out" in drift.columns and math.isfinite(drift.loc[-1, "out"]):
            ax1.axhline(max(drift.loc[-1, "out"], 1e-300), color="k", ls="--", label="out (epilogue)")
        ax1.set_yscale("log")
        ax1.set_xlabel("kv block (rescaling step)")
        ax1.set_ylabel("max |state - float64 shadow| / max |shadow|")
        ax1.legend()
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path
