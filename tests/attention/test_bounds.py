"""simfloat.bounds: the worst-case bound is never exceeded, the probabilistic one no more often than stated."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import simfloat as sf
from simfloat import bounds as B
from simfloat.accumulate import Sequential, tensor_core
from simfloat.attention import baseline, flash, plan


def _golden(q, k, v, causal=False):
    ref = baseline(q, k, v, plan="fp64", causal=causal)
    return ref, B.baseline_bound(q, k, v, plan="fp64", causal=causal).worst


def _check(kind, q, k, v, pl, *, causal=False, block_n=64, block_m=64):
    ref, gold = _golden(q, k, v, causal)
    if kind == "flash":
        out = flash(q, k, v, plan=pl, causal=causal, block_n=block_n, block_m=block_m)
        bd = B.flash_bound(q, k, v, plan=pl, causal=causal, block_n=block_n, block_m=block_m)
    else:
        out = baseline(q, k, v, plan=pl, causal=causal)
        bd = B.baseline_bound(q, k, v, plan=pl, causal=causal)
    err = np.abs(out - ref)
    assert np.all(np.isfinite(bd.worst))
    bad = err > bd.worst + gold
    assert not bad.any(), (
        f"{kind} {plan(pl).name}: {bad.sum()} components above the worst-case bound; "
        f"max err/bound {np.max(err / (bd.worst + gold)):.3g}"
    )
    assert np.all(bd.probabilistic <= bd.worst)
    return err, bd


# -- the error model ------------------------------------------------------------------------------------------


def test_rounding_units():
    r = B.rounding("bf16")
    assert r.u == 2.0**-8 and r.nearest and r.eta == sf.bfloat16.smallest_subnormal / 2
    rz = B.rounding("bf16", "toward_zero")
    assert rz.u == 2.0**-7 and not rz.nearest and rz.eta == sf.bfloat16.smallest_subnormal
    assert B.rounding("fp32", "odd").u == 2.0**-23
    assert B.rounding("e4m3").u == 2.0**-4
    with pytest.raises(ValueError, match="stochastic"):
        B.rounding("bf16", "stochastic")


def test_rounding_model_holds_on_random_values():
    g = np.random.default_rng(1)
    x = np.concatenate([g.standard_normal(20000) * 10.0 ** g.integers(-45, 5, 20000), [1e-40, -3e-42]])
    for fmt, mode in [("bf16", "nearest_even"), ("bf16", "toward_zero"), ("e4m3", "nearest_even"), ("fp16", "up")]:
        r = B.rounding(fmt, mode)
        y = sf.round(x, fmt, mode)
        ok = np.abs(x) < r.max / 2
        assert np.all(np.abs(y - x)[ok] <= r.u * np.abs(x[ok]) + r.eta)


def test_chain_constant_is_below_gamma():
    u = 2.0**-24
    for n in (1, 10, 1000, 10**6):
        c = B.chain_constant(n, u)
        assert n * u <= c <= n * u / (1 - n * u)
    # Higham-Mary: lambda sqrt(n) u to first order, below the worst case for long chains
    assert B.chain_constant(10**6, u, lam=6.0) < B.chain_constant(10**6, u) / 50


def test_dot_constants():
    tc = tensor_core("sm90", "bf16")
    c = B.dot_constant(tc, 64)
    step = (1 + 17 * 2.0**-25) * (1 + 2.0**-23) - 1  # (B3): 4 blocks of 16
    assert c == pytest.approx((1 + step) ** 4 - 1, rel=1e-12)
    assert B.dot_constant(Sequential("float32"), 100) == pytest.approx(B.chain_constant(100, 2.0**-24), rel=1e-12)


def test_dot_bound_holds():
    g = np.random.default_rng(2)
    for model, fmt in [
        (tensor_core("sm90", "bf16"), "bf16"),
        (Sequential("bfloat16", product_fmt="bfloat16"), "bf16"),
        (tensor_core("sm90", "e4m3"), "e4m3"),
    ]:
        for n in (1, 17, 97, 257):
            a = sf.round(g.standard_normal((40, n)), fmt)
            b = sf.round(g.standard_normal((n, 3)), fmt)
            got = sf.matmul(a, b, acc=model)
            bound = B.dot_constant(model, n) * (np.abs(a) @ np.abs(b)) + 1e-30
            assert np.all(np.abs(got - a @ b) <= bound * (1 + 1e-12))


def test_ex2_h200_error_is_measured_and_holds():
    from simfloat.hardware import ex2_approx

    r = B.ex2_h200_error()
    assert 2.0**-23 < r < 3 * 2.0**-23
    x = np.random.default_rng(3).uniform(-100, 0, 200000).astype(np.float32)
    y = ex2_approx(x).astype(np.float64)
    ex = np.exp2(x.astype(np.float64))
    normal = ex >= 2.0**-126
    assert np.all(np.abs(y - ex)[normal] <= r * ex[normal])
    assert np.all(np.abs(y - ex)[~normal] <= 2.0**-126)


# -- the attention bounds: random and adversarial inputs ----------------------------------------------------------


def _inputs(kind, n, d, fmt="bf16", seed=0):
    g = np.random.default_rng([seed, n, d])
    q, k, v = (g.standard_normal((1, n, d)) for _ in range(3))
    if kind == "cancellation":  # V of mean zero along the keys: the output cancels
        v = v - v.mean(axis=1, keepdims=True)
        q = q * 3
    elif kind == "ties":  # every key the same score: ties of the row max
        k = np.broadcast_to(k[:, :1], k.shape).copy()
    elif kind == "one_signed":
        v = 1.0 + 0.01 * np.abs(v)
    elif kind == "large":  # near the range the fp32 state handles: scores of hundreds, large V
        q, k, v = q * 4, k * 4, v * 1e4
    elif kind == "subnormal":  # V in the format's subnormal range, tiny scores
        v = v * sf.format(fmt).smallest_normal
        q, k = q * 1e-3, k * 1e-3
    elif kind == "outlier":
        mask = g.random(q.shape) < 0.01
        q = q + 30 * mask
        v = v + 100 * (g.random(v.shape) < 0.01)
    return tuple(sf.round(x, fmt) for x in (q, k, v))


FLASH_PLANS = ["triton-bf16", "h200-bf16", "all-bf16", "triton-fp16", "triton-fp32"]
KINDS = ["normal", "cancellation", "ties", "one_signed", "large", "subnormal", "outlier"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pl", FLASH_PLANS)
def test_flash_worst_case_holds(pl, kind):
    fmt = "fp16" if "fp16" in pl else "bf16"
    if kind == "large" and pl == "triton-fp16":
        pytest.skip("fp16 cannot hold V of 1e4 times N(0, 1) (overflow of the inputs)")
    for n, causal in ((1, False), (97, True), (257, False)):
        q, k, v = _inputs(kind, n, 16, fmt)
        _check("flash", q, k, v, pl, causal=causal, block_n=32, block_m=16)


@pytest.mark.parametrize(
    "variant",
    [
        {"normalization": "per_step"},
        {"lazy_threshold": 8.0},
        {"contract": False},
        {"exp2": False},
        {"qk": Sequential("float32"), "pv": Sequential("float32", mode="toward_zero")},
    ],
    ids=["fa1", "lazy", "no_contract", "exp", "seq_dots"],
)
def test_flash_variants_hold(variant):
    pl = plan("all-bf16").replace(**variant)
    for kind in ("normal", "ties", "outlier"):
        for n in (97, 257):
            q, k, v = _inputs(kind, n, 16)
            _check("flash", q, k, v, pl, block_n=32)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pl", ["pytorch-bf16", "all-bf16", "pytorch-fp32", "all-fp16"])
def test_baseline_worst_case_holds(pl, kind):
    fmt = "fp16" if "fp16" in pl else "bf16"
    if kind == "large" and "fp16" in pl:
        pytest.skip("fp16 overflows on these inputs")
    for n, causal in ((1, False), (97, True), (257, False)):
        q, k, v = _inputs(kind, n, 16, fmt)
        _check("baseline", q, k, v, pl, causal=causal)


def test_fp8_plan_with_its_absolute_terms():
    q, k, v = _inputs("normal", 97, 16, "e4m3")
    err, bd = _check("flash", q, k, v, "triton-e4m3", block_n=32)
    assert np.max(bd.terms["absolute"]) > 1e-6  # e4m3's subnormal spacing of P counts


def test_not_covered_raises():
    q, k, v = _inputs("normal", 33, 16, "e4m3")
    with pytest.raises(ValueError, match="bound not covered"):
        B.flash_bound(q * 50, k * 50, v, plan="all-e4m3")
    tl_exp = plan("triton-fp32").replace(exp2=False, exp_impl="tl.exp")
    with pytest.raises(ValueError, match="bound not covered: exp_impl='tl.exp'"):
        B.flash_bound(q, k, v, plan=tl_exp)
    with pytest.raises(ValueError, match="failure_probability"):
        B.flash_bound(q, k, v, plan="triton-bf16", failure_probability=1.5)
    with pytest.raises(TypeError, match="failure_probability"):
        B.baseline_bound(q, k, v, plan="pytorch-bf16", failure_probability="0.1")


@pytest.mark.slow
def test_exhaustive_tiny_cases():
    """Every q, k1, k2, v1, v2 of a grid (head_dim 1, two keys): all 5^5 cases in one batch per plan."""

    def cases(grid):
        c = np.array(list(itertools.product(grid, repeat=5)))
        return c[:, None, :1], c[:, 1:3, None], c[:, 3:5, None]

    wide = cases(np.array([-448.0, -0.0625, 0.0, 0.5, 2.0]))  # e4m3 values up to its max
    mild = cases(np.array([-3.0, -(2.0**-9), 0.0, 0.5, 2.0]))  # with e4m3's smallest subnormal
    for kind, pl, (q, k, v) in (
        ("flash", "triton-e4m3", mild),
        ("flash", "all-bf16", mild),
        ("baseline", "pytorch-bf16", mild),
    ):
        ref = baseline(q, k, v, plan="fp64")
        gold = B.baseline_bound(q, k, v, plan="fp64").worst
        if kind == "flash":
            out = flash(q, k, v, plan=pl, block_n=1)
            bd = B.flash_bound(q, k, v, plan=pl, block_n=1)
        else:
            out = baseline(q, k, v, plan=pl)
            bd = B.baseline_bound(q, k, v, plan=pl)
        assert np.all(np.abs(out - ref) <= bd.worst + gold), pl
    # scores of 448^2 in a bf16 scale op or an e8m13 accumulator: exponent errors of tens to hundreds, no
    # relative bound on the weights
    for pl in ("all-bf16", "triton-e4m3"):
        with pytest.raises(ValueError, match="bound not covered"):
            B.flash_bound(*wide, plan=pl, block_n=1)


# -- the probabilistic bound --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,pl", [("flash", "all-bf16"), ("baseline", "all-fp16"), ("baseline", "pytorch-fp32")])
def test_probabilistic_exceeded_no_more_often_than_stated(kind, pl):
    fp = 0.05
    rows = exceed = 0
    tighter = []
    for seed in range(4):
        g = np.random.default_rng([7, seed])
        fmt = "fp16" if "fp16" in pl else "bf16"
        q, k, v = (sf.round(g.standard_normal((2, 257, 32)), fmt) for _ in range(3))
        ref, gold = _golden(q, k, v)
        if kind == "flash":
            out = flash(q, k, v, plan=pl, block_n=64)
            bd = B.flash_bound(q, k, v, plan=pl, block_n=64, failure_probability=fp)
        else:
            out = baseline(q, k, v, plan=pl)
            bd = B.baseline_bound(q, k, v, plan=pl, failure_probability=fp)
        err = np.abs(out - ref)
        exceed += int(np.sum(np.any(err > bd.probabilistic + gold, axis=-1)))
        rows += err.shape[0] * err.shape[1]
        tighter.append(np.median(bd.probabilistic / bd.worst))
        assert bd.lam == pytest.approx(math.sqrt(2 * math.log(2 * (257 * 34 + 257 * 32) / fp)), rel=0.01)
    assert exceed / rows <= fp
    assert np.median(tighter) < 0.9  # the probabilistic bound is not the worst case in disguise


def test_terms_add_up():
    q, k, v = _inputs("normal", 97, 16)
    bd = B.flash_bound(q, k, v, plan="triton-bf16", block_n=32)
    total = sum(bd.terms.values())
    assert np.allclose(total, bd.worst, rtol=1e-6)
    assert bd.worst.shape == (1, 97, 16) and bd.row_max().shape == (1, 97)
    with pytest.raises(ValueError, match="which"):
        bd.row_max("mean")


# -- next to the traced errors --------------------------------------------------------------------------------------


def test_attribute_with_bounds(tmp_path):
    pytest.importorskip("pandas")
    from simfloat.attribution import attribute

    g = np.random.default_rng(5)
    q, k, v = (sf.round(g.standard_normal((1, 40, 8)), "bf16") for _ in range(3))
    res = attribute(
        q, k, v, ["triton-bf16", "all-bf16"], block_m=16, block_n=16, tiles=(), block_ns=(), trace=False, bounds=True
    )
    b = res.bounds
    assert set(b["plan"]) == {"triton-bf16", "all-bf16"}
    flash_all = b[(b["op"] == "all") & (b["kernel"] == "flash")]
    assert len(flash_all) == 2 and (b["kernel"] == "baseline").sum() == 2
    assert (b["exceeded"] == 0).all()
    ok = b["note"] == ""
    assert ok.all(), b[~ok]
    assert (b["tightness_max"][b["measured_max"] > 0] >= 1).all()
    # the plan's own measured error is the flash_vs_baseline table's
    fvb = res.flash_vs_baseline.set_index(["plan", "kernel"])
    for r in flash_all.itertuples():
        assert r.measured_max == fvb.loc[(r.plan, "flash"), "max_abs"]
    assert "error bounds" in res.table()
    assert (tmp_path / "bounds.csv") in res.to_csv(tmp_path)
    assert (
        attribute(q, k, v, "triton-bf16", block_m=16, block_n=16, tiles=(), block_ns=(), trace=False, ops=["p"]).bounds
        is None
    )
