"""flash_backward(trace=...): traced runs return the untraced bits, each op's local error lands on that op, the
float64 shadow has no drift under the fp64 plan, and the record counts follow the tiling."""

from __future__ import annotations

import numba
import numpy as np
import pytest

import simfloat as sf
from simfloat.attention import (
    BACKWARD_STATES,
    TRACED_BACKWARD_OPS,
    backward_plan,
    flash,
    flash_backward,
    lse_from_stats,
)
from simfloat.trace import Tracer

pytest.importorskip("pandas")


def _case(plan, seq_q=37, seq_k=45, d=8, lead=(2,), causal=False, bm=16, bn=16, seed=0):
    g = np.random.default_rng(seed)
    q, k, v = (sf.round(g.standard_normal(lead + (s, d)), "bf16") for s in (seq_q, seq_k, seq_k))
    do = sf.round(g.standard_normal(lead + (seq_q, d)), "bf16")
    pl = backward_plan(plan)
    fwd = "fp64" if pl.name.startswith("fp64") else "triton-bf16"
    o, m, l = flash(q, k, v, plan=fwd, block_m=bm, block_n=bn, causal=causal, return_stats=True)  # noqa: E741
    lse = lse_from_stats(m, l, plan=pl)
    return (q, k, v, o, do, lse), dict(plan=pl, block_m=bm, block_n=bn, causal=causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("plan", ["triton-bf16"])
def test_traced_equals_untraced_bitwise(plan, causal):
    args, kw = _case(plan, seq_q=97, seq_k=33, causal=causal, bm=32, bn=16)
    want = flash_backward(*args, return_delta=True, **kw)
    old = numba.get_num_threads()
    try:
        for threads in (1, 2):
            numba.set_num_threads(threads)
            tr = Tracer()
            got = flash_backward(*args, return_delta=True, trace=tr, **kw)
            for a, b in zip(want, got, strict=True):
                np.testing.assert_array_equal(a, b)
            assert tr.state_by_block().loc[-1, list(BACKWARD_STATES)].gt(0).all()
    finally:
        numba.set_num_threads(old)


@pytest.mark.parametrize("contract", [False, True])
def test_fp64_plan_has_no_error_and_no_drift(contract):
    args, kw = _case("fp64", causal=True)
    kw["plan"] = kw["plan"].replace(contract=contract)
    tr = Tracer()
    flash_backward(*args, trace=tr, **kw)
    loc, dev = tr.local_errors(), tr.state_deviation()
    assert set(loc["op"]) == set(TRACED_BACKWARD_OPS)
    assert set(dev["state"]) == set(BACKWARD_STATES)
    assert (loc["max_abs"] == 0).all() and (dev["max_abs"] == 0).all()


@pytest.mark.parametrize("op", TRACED_BACKWARD_OPS)
def test_a_single_rounded_op_is_the_only_source(op):
    args, kw = _case("fp64", seq_q=20, seq_k=24, bm=8, bn=16)
    kw["plan"] = kw["plan"].replace(**{op: "bf16"})
    tr = Tracer()
    flash_backward(*args, trace=tr, **kw)
    by_op = tr.by_op().loc["flash_backward"]
    assert by_op.loc[op, "max_abs"] > 0
    assert (by_op.drop(index=op)["max_abs"] == 0).all()
    assert tr.state_by_block().loc[-1].max() > 0


def test_record_counts_follow_the_tiles_and_the_mask():
    seq, d, bm, bn = 37, 8, 16, 16
    args, kw = _case("triton-bf16", seq_q=seq, seq_k=seq, d=d, lead=(3,), causal=True, bm=bm, bn=bn)
    tr = Tracer()
    flash_backward(*args, trace=tr, **kw)
    loc = tr.local_errors()
    count = loc.groupby("op", observed=True)["count"].sum()
    pairs = 3 * seq * (seq + 1) // 2
    for op in ("qk", "scale", "exp", "p", "dp", "ds", "ds_cast"):
        assert count[op] == pairs, op
    assert count["delta"] == 3 * seq * d * 2  # a product and a sum per element
    n_t = -(-seq // bm)
    steps_dq = sum(-(-min((t + 1) * bm, seq) // bn) * min(bm, seq - t * bm) for t in range(n_t))  # key tiles x rows
    assert count["dq"] == 3 * d * steps_dq
    assert count["grad"] == 3 * seq * d * 3  # dq, dk, dv
    assert count["grad_scale"] == 3 * seq * d * 2  # dq, dk
    dq = tr.state_deviation().query("state == 'dq'")
    assert set(dq["kv_block"]) == {-1, 0, 1, 2}
    assert sorted(dq.query("kv_block == 2")["q_tile"].unique()) == [2]  # causal: only the last row tile


def test_trace_argument_errors():
    args, kw = _case("triton-bf16", seq_q=5, seq_k=5)
    with pytest.raises(TypeError, match="trace"):
        flash_backward(*args, trace=object(), **kw)
    with pytest.raises(ValueError, match="reference"):
        flash_backward(*args, trace=Tracer(), engine="vector", **kw)
