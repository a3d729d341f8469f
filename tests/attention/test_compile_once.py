"""The attribution job's kernels compile once per function: numba compiles a function again for every literal int
argument and every read-only array flag its callers pass, so a caller that mixes them pays a whole compilation
(seconds to tens of seconds on a first run) for the same machine code."""

from __future__ import annotations

import numba
import numpy as np
from numba import types

import simfloat as sf
from simfloat.attention import baseline, plan
from simfloat.attention._build import baseline_engine
from simfloat.attention._engine import baseline_units
from simfloat.attention.reference import _trace, forward
from simfloat.attention.reference._operands import float_operands


def _inputs(seq=20, d=8):
    g = np.random.default_rng(0)
    return tuple(sf.round(g.standard_normal((1, 1, seq, d)), "bf16") for _ in range(3))


def test_baseline_loop_compiles_once_for_the_golden_and_a_rounding_plan():
    q, k, v = _inputs()
    baseline(q, k, v, plan="fp64")  # V as the caller gave it (its model does not round it)
    seen = set(baseline_units.signatures)
    baseline(q, k, v, plan="pytorch-bf16")  # V rounded into a new array
    assert set(baseline_units.signatures) == seen


def test_baseline_operands_are_writable_whatever_the_plan_rounds():
    q, k, v = (np.broadcast_to(x, x.shape) for x in _inputs())  # read-only, as prepare() passes them
    for name in ("fp64", "pytorch-bf16"):
        pl = plan(name)
        _, xs = baseline_engine(pl, pl.params(0.25), q=q[0], k=k[0], v=v[0], causal=False)
        assert all(a.flags.writeable for a in xs[:10]), name


def test_reference_loop_arguments_are_int64_and_writable():
    q, k, v = (np.broadcast_to(x[0], x[0].shape) for x in _inputs())
    assert float_operands(q, k, v, 8).qc.flags.writeable  # as P's scratch, which the same dots take
    codes = (forward._ROW0, *(getattr(_trace, n) for n in dir(_trace) if n[:2] in ("R_", "S_")))
    assert len(codes) == 1 + 14 + 4
    assert all(numba.typeof(c) == types.int64 for c in codes)  # not literals: one compilation per op
