"""simfloat.trace.Tracer: tracing never changes results, attributes errors to the right op, and summarizes."""

from __future__ import annotations

import numpy as np
import pytest

import simfloat as sf
from simfloat.attention import BASELINE_OPS, FLASH_OPS, baseline, flash, plan
from simfloat.trace import STATES, Tracer

pd = pytest.importorskip("pandas")


def _inputs(seq_q=45, seq_k=70, d=16, lead=(2,), seed=0):
    g = np.random.default_rng(seed)
    return tuple(sf.round(g.standard_normal(lead + (s, d)), "bf16") for s in (seq_q, seq_k, seq_k))


_VARIANTS = [{}, dict(exp2=True, contract=True, lazy_threshold=1.0), dict(normalization="per_step")]


@pytest.mark.parametrize("name", ["triton-bf16", "all-fp16", "triton-e4m3", "fp64"])
@pytest.mark.parametrize("variant", range(3))
def test_traced_equals_untraced_bitwise(name, variant):
    q, k, v = _inputs()
    pl = plan(name).replace(**_VARIANTS[variant])
    for causal in (False, True):
        kw = dict(plan=pl, block_m=16, block_n=32, causal=causal, return_stats=True)
        a, b = flash(q, k, v, **kw), flash(q, k, v, trace=Tracer(), **kw)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(
            baseline(q, k, v, plan=pl, causal=causal), baseline(q, k, v, plan=pl, causal=causal, trace=Tracer())
        )


@pytest.mark.parametrize("variant", range(3))
def test_fp64_has_no_error_anywhere(variant):
    q, k, v = _inputs()
    tr = Tracer()
    flash(q, k, v, plan=plan("fp64").replace(**_VARIANTS[variant]), block_m=16, block_n=16, causal=True, trace=tr)
    baseline(q, k, v, plan="fp64", trace=tr)
    loc, dev = tr.local_errors(), tr.state_deviation()
    assert set(loc["op"]) == set(FLASH_OPS) | set(BASELINE_OPS)
    assert (loc["max_abs"] == 0).all() and (dev["max_abs"] == 0).all()
    assert set(dev["state"]) == set(STATES)


_KERNEL_OPS = [("flash", o) for o in FLASH_OPS] + [("baseline", o) for o in BASELINE_OPS]


@pytest.mark.parametrize("kernel,op", _KERNEL_OPS)
def test_a_single_rounded_op_is_the_only_source(kernel, op):
    q, k, v = _inputs()
    pl = plan("fp64").replace(**{op: "bf16"})
    tr = Tracer()
    if kernel == "flash":
        flash(q, k, v, plan=pl, block_m=16, block_n=32, trace=tr)
    else:
        baseline(q, k, v, plan=pl, trace=tr)
    by_op = tr.by_op().loc[kernel]
    assert by_op.loc[op, "max_abs"] > 0
    assert (by_op.drop(index=op)["max_abs"] == 0).all()
    assert tr.state_by_block().loc[-1, "out"] > 0


def test_counts_and_bounds():
    q, k, v = _inputs(seq_q=40, seq_k=50, lead=(3,))
    tr = Tracer()
    flash(q, k, v, plan="triton-bf16", block_m=16, block_n=32, causal=True, trace=tr)
    loc = tr.local_errors()
    count = loc.groupby("op", observed=True)["count"].sum()
    visible = 3 * sum(min(i + 1, 50) for i in range(40))
    assert count["qk"] == count["exp"] == count["p"] == visible
    assert count["out"] == count["normalize"] == 3 * 40 * 16
    rows_tiles = sum(16 * (-(-min((t + 1) * 16, 50) // 32)) for t in range(3)) - 8 * 2  # last tile: 8 rows
    tiles = 3 * rows_tiles
    assert count["pv"] == count["acc"] == tiles * 16
    by_op = tr.by_op().loc["flash"]
    assert by_op.loc["p", "max_abs"] <= 2.0**-9  # P <= 1 rounded to bf16
    assert by_op.loc["out", "rel_max"] <= 2.0**-8
    assert by_op.loc["normalize", "rel_max"] <= 2.0**-24
    assert list(by_op.index) == [o for o in FLASH_OPS if o in by_op.index]
    assert set(loc["q_tile"]) == {0, 1, 2} and set(loc["lead"]) == {0, 1, 2}
    assert set(loc["kv_block"]) == {-1, 0, 1}


def test_summaries_plot_and_runs(tmp_path):
    q, k, v = _inputs(seq_k=130)
    tr = Tracer()
    assert len(tr) == 0 and tr.local_errors().empty
    flash(q, k, v, plan="triton-bf16", block_n=32, trace=tr)
    baseline(q, k, v, plan="pytorch-bf16", trace=tr)
    assert len(tr) == 2 and [r["kernel"] for r in tr.runs] == ["flash", "baseline"]
    blocks = tr.by_block()
    assert list(blocks.index) == [-1, 0, 1, 2, 3, 4]
    assert {"qk", "exp", "softmax"} <= set(blocks.columns)
    drift = tr.state_by_block()
    assert list(drift.columns) == list(STATES) and drift.loc[-1, "out"] > 0
    assert (drift.loc[[0, 1, 2, 3, 4], "acc"] > 0).all()
    assert set(tr.state_deviation()["run"]) == {0, 1}
    path = tr.plot(str(tmp_path / "trace.png"), title="triton-bf16")
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    tr.clear()
    assert len(tr) == 0 and tr.by_op().empty
