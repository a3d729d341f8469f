"""The vector loop's plan-dependent steps as kernel values (simfloat.attention.vector._steps.Steps): each plan
gets the variants its dataflow names, the loop's records have one type for plans of different forms (so the loop
compiles once for all of them), and a Kernel survives pickling. The bits of every variant are checked against
the reference loop by the vector == reference suites (test_engine.py, test_engine_quant.py, test_fa_presets.py)."""

from __future__ import annotations

import pickle

import numba
import numpy as np
import pytest

import simfloat as sf
from simfloat._jit import Kernel
from simfloat.attention import flash
from simfloat.attention.vector import forward as fwd


def _run(
    plan: str, monkeypatch: pytest.MonkeyPatch, block_n: int = 16
) -> tuple[fwd.Steps, tuple[object, object, object]]:
    """The Steps a flash call of ``plan`` takes (chosen anew from its records: the call itself may find them in
    the per-process cache) and the numba types of the loop's records."""
    seen: list[tuple[fwd.Operands, fwd.Engine]] = []
    find = fwd._kernels

    def spy(xs: fwd.Operands, eng: fwd.Engine) -> tuple[fwd.Steps, object]:
        seen.append((xs, eng))
        return find(xs, eng)

    monkeypatch.setattr(fwd, "_kernels", spy)
    g = np.random.default_rng(5)
    q, k, v = (sf.round(g.standard_normal((1, 1, 37, 16)), "bf16") for _ in range(3))
    flash(q, k, v, plan=plan, block_m=16, block_n=block_n)
    assert len(seen) == 1
    xs, eng = seen[0]
    st = fwd.steps(xs, eng)
    assert find(xs, eng)[0] == st  # the cached Steps are these
    return st, (numba.typeof(xs), numba.typeof(eng), numba.typeof(st))


def _names(st: fwd.Steps) -> dict[str, str]:
    return {f: getattr(st, f).fn.py_func.__name__ for f in fwd.Steps._fields}


@pytest.mark.parametrize(
    ("plan", "want"),
    [
        (
            "triton-bf16",
            dict(qk_rows="_rows_block32", pv_rows="_rows_block32", dequant="_no_dequant", exp="_exp_lib",
                 p_codes="_pc_cast_ne", row_sums="_sums_f32", p_operand="_pin_plain", update="_no_update",
                 scaled="_scaled_f32", acc_scale="_scale_by_f32", normalize="_divide_f32", lse_scale="_no_lse_scale",
                 out_cast="_cast_ne", v_epilogue="_no_v_descale"),
        ),
        ("h200-bf16", dict(row_sums="_sums_rows_tree", exp="_exp_table", p_codes="_pc_cast_ne")),
        ("triton-fp32", dict(qk_rows="_rows_fma32", p_codes="_pc_cast", out_cast="_cast_f32")),
        ("flashattn-triton-bf16", dict(exp="_exp_tl", lse_scale="_lse_scale")),
        ("fa4-bf16", dict(exp="_exp_mixed")),  # its exp2 mix is laid out over a 128-key tile
        ("int8-reference", dict(dequant="_dequant_scores", p_codes="_pc_quant", update="_update")),
        ("sage3-fp4", dict(qk_rows="_rows_block", p_codes="_pc_block", p_operand="_pin_block", update="_update",
                           v_epilogue="_v_descale")),
    ],
)  # fmt: skip
def test_each_plan_gets_the_variants_its_dataflow_names(plan, want, monkeypatch):
    st, _ = _run(plan, monkeypatch, block_n=128 if "exp" in want and want["exp"] == "_exp_mixed" else 16)
    assert all(isinstance(getattr(st, f), Kernel) for f in fwd.Steps._fields)
    got = _names(st)
    assert {f: got[f] for f in want} == want


def test_float_plans_of_different_forms_share_the_loop_records_types(monkeypatch):
    """triton-bf16 (block FMA dots, libm exp) and h200-bf16 (its ex2 value table and tl.sum tree) differ only in
    the kernels their Steps hold: the loop's argument types are the same, so it compiles once for both."""
    a = _run("triton-bf16", monkeypatch)
    b = _run("h200-bf16", monkeypatch)
    assert _names(a[0]) != _names(b[0])
    assert a[1] == b[1]


def test_a_kernel_pickles_without_its_address(monkeypatch):
    st, _ = _run("triton-bf16", monkeypatch)
    k = st.exp
    k2 = pickle.loads(pickle.dumps(k))
    assert k2.fn is k.fn and k2.sig == k.sig
    assert k2.__wrapper_address__() == k.__wrapper_address__()
