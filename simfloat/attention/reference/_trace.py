"""The reference forward loop's trace: the ops it records by their role (:data:`LOGICAL_OPS`, the ``R_*``
indices), each plan's tracer columns (:func:`trace_columns`), the tracer's arrays as a :class:`Trace`, and the
hooks every traced step goes through: :func:`rec` (an op's local error) and :func:`srec` (a state's drift from
the float64 shadow), both no-ops when ``tr`` is None (numba prunes them: ``tr`` stays a plain argument).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from simfloat._jit import jit
from simfloat.trace import STATES, record

__all__ = ["LOGICAL_OPS", "Trace", "trace_columns"]

#: The ops the loop records, by their role; ``l_ij`` is the in-tile row sum, ``p`` P's cast or quantizer.
LOGICAL_OPS = (
    "qk",
    "dequant",
    "scale",
    "exp",
    "m_i",
    "alpha",
    "l_ij",
    "l_i",
    "acc",
    "p",
    "pv",
    "pv_dequant",
    "normalize",
    "out",
)
# int64 scalars, not Python ints: numba compiles a function once per literal int argument, so rec and srec would
# compile once per op
R_QK, R_DEQUANT, R_SCALE, R_EXP, R_M_I, R_ALPHA, R_L_IJ, R_L_I, R_ACC, R_P, R_PV, R_PV_DEQUANT, R_NORMALIZE, R_OUT = (
    np.int64(i) for i in range(len(LOGICAL_OPS))
)
S_M, S_L, S_ACC, S_OUT = (np.int64(STATES.index(n)) for n in ("m_i", "l_i", "acc", "out"))
#: a plan with quantizers records its row sum as l_i and its P as p_quant (QUANT_OPS)
_QUANT_NAMES = {"l_ij": "l_i", "p": "p_quant"}


def trace_columns(ops: tuple[str, ...], quantized: bool) -> np.ndarray:
    """(len(LOGICAL_OPS),) int64: each logical op's column in the tracer's op list ``ops`` (-1: not there)."""
    names = [(_QUANT_NAMES.get(n, n) if quantized else n) for n in LOGICAL_OPS]
    return np.array([ops.index(n) if n in ops else -1 for n in names], dtype=np.int64)


class Trace(NamedTuple):
    """A tracer's record arrays (``Tracer._start``) and the plan's op columns (:func:`trace_columns`)."""

    local: np.ndarray
    state: np.ndarray
    cols: np.ndarray


@jit
def rec(tr, at, op, y, ex):
    """The trace hook: op ``op`` (R_*) gave ``y`` where float64 gives ``ex``, at ``at`` = (lead, q tile, key tile);
    nothing when ``tr`` is None."""
    if tr is not None:
        record(tr.local, at[0], at[1], at[2], tr.cols[op], y - ex, ex)


@jit
def srec(tr, at, st, y, ex):
    """The shadow's hook: state ``st`` is ``y``, the float64 shadow's ``ex``."""
    if tr is not None:
        record(tr.state, at[0], at[1], at[2], st, y - ex, ex)


@jit
def exp64(x, pp):
    return math.exp2(x) if pp.exp2 else math.exp(x)
