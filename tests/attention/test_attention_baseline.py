"""simfloat.attention.baseline: exact in float64, op by op against a numpy dataflow, close to torch."""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest
from attention_reference import _add, _div, _inputs, _mul, _r, _rel, exact_attention, serial

import simfloat
from simfloat.accumulate import matmul
from simfloat.attention import BASELINE_OPS, OpSpec, baseline, flash, plan


@serial
def reference_baseline(q, k, v, pl, causal=False, scale=None):
    """The baseline dataflow in numpy: dots with simfloat.accumulate.matmul, every op rounded once."""
    seq_q, d = q.shape
    seq_k = k.shape[0]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    sm = pl.softmax
    vis = np.ones((seq_q, seq_k), dtype=bool)
    if causal:
        vis = np.arange(seq_k)[None, :] <= np.arange(seq_q)[:, None]
    s = matmul(q, k.T, acc=pl.qk)
    if pl.opmath is None:
        x = _r(_mul(s, float(_r(scale, pl.scale)), pl.scale), sm)
    else:  # torch's tensor * scale: the scale and the product in opmath, then the cast into the scale op
        om = OpSpec(pl.opmath)
        x = _r(_r(_mul(s, float(_r(scale, om)), om), pl.scale), sm)
    x = np.where(vis, x, -np.inf)
    m = x.max(1)
    with np.errstate(invalid="ignore"):
        dx = np.where(vis, _add(x, -m[:, None], sm), -np.inf)
    e = np.where(vis, _r(np.frompyfunc(math.exp, 1, 1)(dx).astype(np.float64), sm), 0.0)
    tot = np.zeros(seq_q)
    for j in range(seq_k):
        tot = _add(tot, e[:, j], sm)
    p = np.where(vis, _div(e, np.where(tot == 0, 1.0, tot)[:, None], sm), 0.0)
    return _r(matmul(p, v, acc=pl.pv), pl.out)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq_q,seq_k", [(97, 97), (257, 97), (97, 257)])
def test_fp64_is_exact_attention(causal, seq_q, seq_k):
    q, k, v = _inputs((2,), seq_q, seq_k, 16, seed=seq_q + seq_k)
    assert _rel(baseline(q, k, v, plan="fp64", causal=causal), exact_attention(q, k, v, causal)) <= 1e-13


@pytest.mark.parametrize("op", BASELINE_OPS)
def test_single_op_plan_matches_numpy_dataflow_bitwise(op):
    q, k, v = _inputs((), 37, 53, 16, fmt="bf16", seed=11)
    pl = plan("fp64").replace(**{op: "bf16"})
    for causal in (False, True):
        got = baseline(q, k, v, plan=pl, causal=causal)
        np.testing.assert_array_equal(got, reference_baseline(q, k, v, pl, causal))
        assert not np.array_equal(got, baseline(q, k, v, plan="fp64", causal=causal))


@pytest.mark.parametrize("name", ["pytorch-bf16", "pytorch-fp16", "all-bf16", "all-e4m3", "triton-bf16"])
def test_preset_matches_numpy_dataflow_bitwise(name):
    q, k, v = _inputs((), 40, 70, 32, fmt=name.split("-")[1], seed=3)
    for causal in (False, True):
        got = baseline(q, k, v, plan=name, causal=causal, scale=0.2)
        np.testing.assert_array_equal(got, reference_baseline(q, k, v, plan(name), causal, scale=0.2))


@pytest.mark.parametrize("name", ["all-fp32", "pytorch-fp32"])
def test_fp32_matches_torch_sdpa(name):
    torch = pytest.importorskip("torch")
    q, k, v = _inputs((2, 2), 80, 120, 64, fmt="fp32", seed=5)
    for causal in (False, True):
        o = baseline(q, k, v, plan=name, causal=causal)
        t = (
            torch.nn.functional.scaled_dot_product_attention(
                *(torch.from_numpy(x.astype(np.float32)) for x in (q, k, v)), is_causal=causal
            )
            .double()
            .numpy()
        )
        np.testing.assert_allclose(o, t, rtol=0, atol=2e-5 * np.abs(t).max())


def test_pytorch_bf16_is_close_to_torch_eager_bf16():
    torch = pytest.importorskip("torch")
    q, k, v = _inputs((2,), 64, 96, 32, fmt="bf16", seed=7)
    tq, tk, tv = (torch.from_numpy(x).to(torch.bfloat16) for x in (q, k, v))
    t = (torch.softmax((tq @ tk.transpose(-1, -2)) * (1 / math.sqrt(32)), dim=-1) @ tv).double().numpy()
    o = baseline(q, k, v, plan="pytorch-bf16")
    exact = exact_attention(q, k, v)
    assert _rel(o, t) < 2e-2 and _rel(o, exact) < 2e-2
    assert np.mean(o == t) > 0.5  # same dataflow: most outputs agree to the bit despite other matmul orders


def test_flash_and_baseline_agree_in_fp64_and_differ_in_low_precision():
    q, k, v = _inputs((2,), 50, 90, 16, fmt="bf16", seed=9)
    assert _rel(baseline(q, k, v, plan="fp64"), flash(q, k, v, plan="fp64")) <= 1e-14
    assert not np.array_equal(baseline(q, k, v, plan="all-bf16"), flash(q, k, v, plan="all-bf16"))


def test_deterministic_across_thread_counts():
    q, k, v = _inputs((3, 2), 150, 70, 16, fmt="bf16", seed=13)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        a = baseline(q, k, v, plan="pytorch-bf16", causal=True)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        b = baseline(q, k, v, plan="pytorch-bf16", causal=True)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "args,err",
    [
        (dict(q=np.ones((4, 8), dtype=np.int32)), TypeError),
        (dict(k=np.ones((5, 9))), ValueError),
        (dict(plan="triton-bogus"), ValueError),
        (dict(causal=1), TypeError),
        (dict(scale=0.0), ValueError),
    ],
)
def test_bad_arguments(args, err):
    kw = dict(q=np.ones((4, 8)), k=np.ones((5, 8)), v=np.ones((5, 8)), plan="fp64")
    kw.update(args)
    with pytest.raises(err):
        baseline(kw.pop("q"), kw.pop("k"), kw.pop("v"), **kw)


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
@pytest.mark.parametrize("d", [64, 96, 128])
def test_pytorch_plans_hand_the_scale_over_as_torch_does(fmt, d):
    """torch's eager ``(q @ k^T) * scale`` multiplies a bf16/fp16 tensor by a Python float in float32 and casts
    (Plan.opmath): with it the pytorch-<fmt> baseline agrees with torch's eager attention to the bit on nearly
    every output also where the scale is not a power of two (d 96, 128); the scale rounded into fmt (opmath None,
    the plans before) agreed on 36-88% there."""
    torch = pytest.importorskip("torch")
    dt = torch.bfloat16 if fmt == "bf16" else torch.float16
    g = np.random.default_rng(d)
    q, k, v = (simfloat.round(g.standard_normal((2, 97 if i == 0 else 65, d)), fmt) for i in range(3))
    tq, tk, tv = (torch.from_numpy(x).to(dt) for x in (q, k, v))
    t = (torch.softmax((tq @ tk.transpose(-1, -2)) * (1 / math.sqrt(d)), dim=-1) @ tv).double().numpy()
    p = plan(f"pytorch-{fmt}")
    assert p.opmath is not None and p.opmath.name == "float32"
    got = baseline(q, k, v, plan=p)
    np.testing.assert_array_equal(got, baseline(q, k, v, plan=p, engine="reference"))
    assert np.mean(got == t) >= 0.99
    if d != 64:  # 1/8 is exact in every format: only the other scales tell the two apart
        old = baseline(q, k, v, plan=p.replace(opmath=None))
        assert np.mean(old == t) < np.mean(got == t)


def test_opmath_belongs_to_baseline_plans():
    with pytest.raises(ValueError, match="baseline"):
        plan("triton-bf16").replace(opmath="float32")
    with pytest.raises(ValueError, match="baseline"):
        plan("all-bf16").replace(opmath="float32")
