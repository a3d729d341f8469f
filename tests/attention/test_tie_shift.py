"""Plan.tie_shift, Qiu & Yao's max shift for tied row maxima (arXiv 2510.04212): P at tied maxima is exactly 1
without it and below 1 with it; the vector engine equals the reference bit for bit; rows without ties keep
their bits; the stats follow the rule as a numpy oracle computes it from the scores; the backward's P."""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest

import simfloat as sf
from simfloat.accumulate import matmul
from simfloat.attention import backward_plan, flash, flash_backward, lse_from_stats, plan

TIES = plan("triton-bf16").replace(tie_shift=2.0)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = (np.ascontiguousarray(x, dtype=np.float64) for x in (a, b))
    return a.shape == b.shape and bool(np.array_equal(a.view(np.uint64), b.view(np.uint64)))


def _tied(seq_q: int, seq_k: int, d: int, t: int, seed: int, dv: int | None = None, sign: float = 1.0):
    """bf16 inputs whose first t keys are equal and aligned with every query: t tied maxima per row, of the
    sign ``sign``."""
    g = np.random.default_rng(seed)
    u = np.zeros(d)
    u[: d // 4] = 1.0
    q = 0.5 * u + 0.2 * g.standard_normal((seq_q, d))
    k = 0.5 * g.standard_normal((seq_k, d)) - (0.0 if sign > 0 else 4.0 * u)
    k[:t] = (2.0 if sign > 0 else -0.5) * u
    v = g.standard_normal((seq_k, dv or d))
    return tuple(sf.round(x, "bf16") for x in (q, k, v))


def _p_of(pl, q, k):
    """The kernel's P (as cast for the P.V dot) of one key tile: v = identity, output and normalization in
    float64, so o * l gives back P."""
    pl = pl.replace(out="float64", normalize="float64")
    eye = np.eye(k.shape[0])
    o, m, l = flash(q, k, eye, plan=pl, block_m=16, block_n=k.shape[0], return_stats=True)  # noqa: E741
    return sf.round(o * l[:, None], "bf16"), m


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_tied_maxima_give_p_below_one_with_the_shift_and_one_without(sign):
    q, k, _ = _tied(20, 40, 32, 4, seed=1, sign=sign)
    s = q @ k.T
    assert np.all(s[:, :4] == s[:, :1]) and np.all(s[:, 4:] < s[:, :1]) and np.all(np.sign(s[:, 0]) == sign)
    p_off, m_off = _p_of(plan("triton-bf16"), q, k)
    p_on, m_on = _p_of(TIES, q, k)
    assert np.all(p_off[:, :4] == 1.0) and np.all(p_off[:, 4:] < 1.0)
    assert np.all(p_on < 1.0) and np.all(p_on[:, :4] > 0.0)
    # the shifted max: twice the tile max (positive ties), 0 (negative ties)
    np.testing.assert_array_equal(m_on, 2.0 * m_off if sign > 0 else np.zeros_like(m_off))
    # the output is still the softmax: close to the unshifted one (different roundings)
    eye = np.eye(40)
    o_off = flash(q, k, eye, plan="triton-bf16", block_m=16, block_n=40)
    o_on = flash(q, k, eye, plan=TIES, block_m=16, block_n=40)
    assert np.abs(o_on - o_off).max() < 1e-2


def test_a_single_maximum_is_not_shifted():
    q, k, v = _tied(20, 40, 32, 1, seed=2)
    for causal in (False, True):
        a = flash(q, k, v, plan="triton-bf16", block_m=16, block_n=16, causal=causal, return_stats=True)
        b = flash(q, k, v, plan=TIES, block_m=16, block_n=16, causal=causal, return_stats=True)
        assert all(_same(x, y) for x, y in zip(a, b, strict=True))


def test_no_ties_changes_nothing():
    g = np.random.default_rng(3)
    q, k, v = (sf.round(g.standard_normal((2, n, 32)), "fp32") for n in (97, 97, 97))
    # fp32 scores of random inputs do not tie (bf16 scores, as all-bf16's, often do: the rule then applies)
    for name in ("triton-fp32", "h200-bf16", "triton-fp16"):
        pl = plan(name)
        for causal in (False, True):
            kw = dict(block_m=16, block_n=32, causal=causal, return_stats=True)
            a = flash(q, k, v, plan=pl, **kw)
            b = flash(q, k, v, plan=pl.replace(tie_shift=3.0), **kw)
            assert all(_same(x, y) for x, y in zip(a, b, strict=True)), (name, causal)


def test_the_stats_follow_the_rule_with_a_tolerance():
    """One key tile, fp32 scores: a numpy oracle of the rule (count the scaled scores within tie_tol of the
    tile max, shift the max) gives the m the kernel returns, row by row; rows without a near tie keep their
    bits."""
    g = np.random.default_rng(4)
    q = sf.round(g.standard_normal((64, 16)), "fp32")
    k = g.standard_normal((48, 16))
    k[0] *= 2.5  # the max of many rows
    k[1] = k[0] * (1 + 2.0**-12)  # near ties where key 0 or 1 is the max
    k = sf.round(k, "fp32")
    v = sf.round(g.standard_normal((48, 8)), "fp32")
    base = plan("triton-fp32")
    pl = base.replace(tie_shift=3.0, tie_tol=1e-3)
    pp = pl.params(1 / math.sqrt(16))
    r32 = lambda x: np.asarray(sf.round(x, "float32"))  # noqa: E731
    s = matmul(q, k.T, acc=base.qk)
    x = r32(s * pp.qk_scale)
    mx = r32(s.max(1) * pp.qk_scale)
    n = (x >= r32(mx - pp.tie_tol)[:, None]).sum(1)
    want = np.where(n >= 2, np.where(mx > 0, r32(mx * pp.tie_beta), np.where(mx < 0, 0.0, mx)), mx)
    assert 0 < np.sum(n >= 2) < 64  # some rows tie, some do not
    kw = dict(block_m=16, block_n=64, return_stats=True)
    o0, m0, l0 = flash(q, k, v, plan=base, **kw)
    o1, m1, l1 = flash(q, k, v, plan=pl, **kw)
    np.testing.assert_array_equal(m1, want)
    free = n < 2
    assert _same(o1[free], o0[free]) and _same(l1[free], l0[free]) and _same(m1[free], m0[free])
    assert not np.array_equal(l1[~free], l0[~free])


@pytest.mark.parametrize("threads", [1, 2])
def test_vector_equals_reference(threads):
    q, k, v = _tied(97, 97, 32, 6, seed=5, dv=24)
    q2, k2, v2 = _tied(97, 97, 32, 3, seed=6, dv=24, sign=-1.0)
    q, k, v = (np.stack([a, b]) for a, b in ((q, q2), (k, k2), (v, v2)))
    k[0, 40:43] = k[0, 0]  # ties in a later tile too
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        for pl in (TIES, plan("h200-bf16").replace(tie_shift=2.0, tie_tol=0.01), TIES.replace(contract=False)):
            for causal, bm, bn in ((False, 16, 32), (True, 16, 16), (True, 64, 128)):
                kw = dict(block_m=bm, block_n=bn, causal=causal, return_stats=True)
                a = flash(q, k, v, plan=pl, engine="vector", **kw)
                r = flash(q, k, v, plan=pl, engine="reference", **kw)
                assert all(_same(x, y) for x, y in zip(a, r, strict=True)), (pl.name, causal, bm, bn)
    finally:
        numba.set_num_threads(before)


def test_traced_run_records_the_shift_and_gives_the_same_bits():
    q, k, v = _tied(33, 40, 16, 4, seed=7)
    tr = sf.Tracer()
    a = flash(q, k, v, plan=TIES, block_m=16, block_n=16, trace=tr)
    assert _same(a, flash(q, k, v, plan=TIES, block_m=16, block_n=16))


def test_the_backward_recomputes_p_below_one_from_the_shifted_lse():
    """The lse of the shifted forward is m + log2(l) of the shifted m: the same number up to rounding, so the
    backward's P = exp2(s * qk_scale - lse) is the normalized softmax, 1/t-ish at t tied keys, either way."""
    q, k, v = _tied(20, 40, 32, 4, seed=8)
    do = sf.round(np.random.default_rng(9).standard_normal(q.shape), "bf16")
    bp = backward_plan("triton-bf16")
    grads = {}
    for name, pl in (("off", plan("triton-bf16")), ("on", TIES)):
        o, m, l = flash(q, k, v, plan=pl, block_m=16, block_n=16, return_stats=True)  # noqa: E741
        lse = lse_from_stats(m, l, plan=bp)
        s = np.asarray(sf.round(matmul(q, k.T, acc=bp.qk) * bp.params(1 / math.sqrt(32)).qk_scale, "float32"))
        p = np.exp2(s - lse[:, None])
        assert np.all(p < 1.0) and np.all(np.abs(p.sum(1) - 1) < 1e-2), name
        grads[name] = flash_backward(q, k, v, o, do, lse, plan=bp, block_m=16, block_n=16)
        grads[name + " lse"] = lse
    assert np.abs(grads["on lse"] - grads["off lse"]).max() < 1e-5
    for a, b in zip(grads["on"][:3], grads["off"][:3], strict=True):
        assert np.abs(a - b).max() <= 0.05 * np.abs(b).max()


def test_bad_values_are_refused():
    base = plan("triton-bf16")
    with pytest.raises(ValueError, match="tie_shift must be None or a finite factor > 1"):
        base.replace(tie_shift=1.0)
    with pytest.raises(TypeError, match="tie_shift must be None or a real number"):
        base.replace(tie_shift="2")
    with pytest.raises(ValueError, match="tie_tol must be finite and >= 0"):
        base.replace(tie_shift=2.0, tie_tol=-1.0)
    with pytest.raises(ValueError, match="set tie_shift too"):
        base.replace(tie_tol=1e-3)
    with pytest.raises(ValueError, match="rounds to 1.0"):
        base.replace(m_i="bf16", tie_shift=1.001).params(0.125)
    with pytest.raises(ValueError, match="tie_shift"):
        sf.bounds.flash_bound(*_tied(8, 8, 8, 2, seed=1), plan=base.replace(tie_shift=2.0))
