"""Plan fields for dataflows in the wild (issue 30 item 1): the running state as a log-sum-exp (``Plan.state``, the
flash-attention repository's Triton kernel), the order of the key tiles (``Plan.kv_order``) and the Triton
tutorial's uncontracted causal diagonal tiles (``Plan.contract_diagonal``): both engines bit for bit and the traced
run too, the defaults untouched, the lse preset against an independent oracle of its dataflow (mpmath roundings),
the presets and the plan's errors."""

from __future__ import annotations

import dataclasses
import math

import ml_dtypes
import mpmath
import numpy as np
import pytest

import simfloat as sf
from simfloat.accumulate import Sequential
from simfloat.attention import flash, plan
from simfloat.attention._kernels import kv_tile


def _qkv(seq_q: int, seq_k: int, d: int, seed: int = 0, spread: float = 2.0):
    rng = np.random.default_rng(seed)
    q = sf.round(rng.standard_normal((1, 2, seq_q, d)) * spread, "bf16")
    k, v = (sf.round(rng.standard_normal((1, 2, seq_k, d)) * spread, "bf16") for _ in range(2))
    return q, k, v


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.array_equal(np.asarray(a, np.float64).view(np.uint64), np.asarray(b, np.float64).view(np.uint64)))


def _three(q, k, v, pl, bm, bn, causal):
    """(out, m, l) of the vector engine, the reference engine and a traced run: all equal bit for bit."""
    runs = [
        flash(q, k, v, plan=pl, block_m=bm, block_n=bn, causal=causal, engine=e, return_stats=True)
        for e in ("vector", "reference")
    ]
    runs.append(flash(q, k, v, plan=pl, block_m=bm, block_n=bn, causal=causal, trace=sf.Tracer(), return_stats=True))
    for other in runs[1:]:
        assert all(_same(x, y) for x, y in zip(runs[0], other, strict=True)), pl
    return runs[0]


LSE = plan("flashattn-triton-bf16")
BASE = plan("triton-bf16")


@pytest.mark.parametrize(("bm", "bn", "causal"), [(32, 16, False), (32, 16, True), (16, 32, True), (16, 16, True)])
@pytest.mark.parametrize("order", ["forward", "reverse", "diagonal_first"])
def test_engines_agree_on_every_new_field(bm: int, bn: int, causal: bool, order: str) -> None:
    q, k, v = _qkv(97, 97, 16)
    for pl in (
        LSE.replace(kv_order=order),
        BASE.replace(kv_order=order),
        BASE.replace(kv_order=order, contract_diagonal=False),
        plan("h200-bf16").replace(kv_order=order),
    ):
        _three(q, k, v, pl, bm, bn, causal)


def test_defaults_keep_the_bits_and_orders_change_them() -> None:
    q, k, v = _qkv(97, 97, 16, seed=1)
    tiles = dict(block_m=32, block_n=16, return_stats=True)

    def same(x, y):
        return all(_same(a, b) for a, b in zip(x, y, strict=True))

    for causal in (False, True):
        ref = flash(q, k, v, plan=BASE, causal=causal, **tiles)
        same_order = BASE.replace(kv_order="forward", contract_diagonal=True, state="m_l")
        assert same(ref, _three(q, k, v, same_order, 32, 16, causal))
        rev = flash(q, k, v, plan=BASE.replace(kv_order="reverse"), causal=causal, **tiles)
        assert not same(rev, ref)
        assert np.max(np.abs(rev[0] - ref[0])) < 0.05  # the same softmax, another rounding order
        diag = flash(q, k, v, plan=BASE.replace(kv_order="diagonal_first"), causal=causal, **tiles)
        assert same(diag, ref) == (not causal)  # without causal there is no diagonal: forward
        # contract_diagonal only matters with contract and causal (the row sums show it; bf16 outputs may not)
        plain = flash(q, k, v, plan=BASE.replace(contract_diagonal=False), causal=causal, **tiles)
        assert same(plain, ref) == (not causal)
    tut = plan("triton-tutorial-fp16")
    q16, k16, v16 = (sf.round(x, "fp16") for x in (q, k, v))
    for causal in (False, True):
        a = flash(q16, k16, v16, plan=tut, causal=causal, **tiles)
        b = flash(q16, k16, v16, plan="triton-fp16", causal=causal, **tiles)
        assert same(a, b) == (not causal)


@pytest.mark.parametrize(
    ("n_kv", "t", "bm", "bn", "want"), [(5, 2, 32, 16, [4, 0, 1, 2, 3]), (3, 1, 16, 32, [0, 1, 2])]
)
def test_diagonal_first_walks_the_masked_tiles_first(n_kv: int, t: int, bm: int, bn: int, want: list[int]) -> None:
    # q tile 2 of 32 rows (64..95) with 16-key tiles: tile 4 (keys 64..79) is the first with a key past row 64
    # q tile 1 of 16 rows (16..31) with 32-key tiles: tile 0 (keys 0..31) is partly masked already
    got = [int(kv_tile(p, n_kv, t, bm, bn, True, 2)) for p in range(n_kv)]
    assert got == want
    assert sorted(got) == list(range(n_kv))
    assert [int(kv_tile(p, n_kv, t, bm, bn, True, 1)) for p in range(n_kv)] == list(range(n_kv))[::-1]
    assert [int(kv_tile(p, n_kv, t, bm, bn, False, 2)) for p in range(n_kv)] == list(range(n_kv))


# -- an independent oracle of the lse dataflow: every scalar op rounded once to fp32 by mpmath ---------------------


def _r32(x: mpmath.mpf) -> float:
    """x rounded to float32 (nearest even; normal range)."""
    with mpmath.workprec(24):
        return float(+x)


def _exp_tl(x: float) -> float:
    """tl.exp: exp2(rn32(x * rn32(log2 e))) correctly rounded to fp32."""
    with mpmath.workprec(200):
        log2e = _r32(1 / mpmath.log(2))
        t = _r32(mpmath.mpf(x) * mpmath.mpf(log2e))
        return _r32(mpmath.power(2, mpmath.mpf(t)))


def _op(f, *args: float) -> float:
    with mpmath.workprec(200):
        return _r32(f(*(mpmath.mpf(a) for a in args)))


def _oracle_row(qi, k, v, scale, bn, n_keys):
    """One query row of the flashattn-triton dataflow with float64-sequential dots (the plan below)."""
    ninf = -math.inf
    sc = float(np.float32(scale))
    m_i, lse_i = ninf, ninf
    acc = np.zeros(v.shape[1])
    for j0 in range(0, n_keys, bn):
        keys = range(j0, min(j0 + bn, n_keys))
        s = []
        for j in keys:
            x = 0.0
            for c in range(qi.shape[0]):
                x += qi[c] * k[j, c]
            s.append(x)
        mx = _op(lambda a, b: a * b, max(s), sc)
        m_ij = max(mx, lse_i)
        p = [_exp_tl(_op(lambda a, b, c: a * b - c, x, sc, m_ij)) for x in s]
        l_ij = 0.0
        for pj in p:
            l_ij = _op(lambda a, b: a + b, l_ij, pj)
        alpha = 0.0 if m_i == ninf else _exp_tl(_op(lambda a, b: a - b, m_i, m_ij))
        pc = [float(np.float32(pj).astype(ml_dtypes.bfloat16)) for pj in p]
        for d in range(v.shape[1]):
            a = _op(lambda x, y: x * y, acc[d], alpha)
            for jj, j in enumerate(keys):
                a += pc[jj] * v[j, d]
            acc[d] = a
        e = 0.0 if lse_i == ninf else _exp_tl(_op(lambda a, b: a - b, lse_i, m_ij))
        l_new = _op(lambda a, b: a + b, e, l_ij)
        lse_i = _op(lambda a, b: a + b, m_ij, _op(mpmath.log, l_new))
        m_i = m_ij
    osc = _exp_tl(_op(lambda a, b: a - b, m_i, lse_i))
    out = [_op(lambda a, b: a * b, acc[d], osc) for d in range(v.shape[1])]
    return np.array([float(np.float32(x).astype(ml_dtypes.bfloat16)) for x in out]), lse_i


def test_the_lse_preset_matches_an_independent_oracle_of_its_dataflow() -> None:
    f64 = Sequential("float64", product_fmt="float64")
    pl = LSE.replace(qk=f64, pv=f64)
    q, k, v = _qkv(5, 45, 8, seed=3)
    scale = 1 / math.sqrt(8)
    out, m, _ = _three(q, k, v, pl, 16, 16, False)
    for h in range(2):
        for i in range(5):
            want, lse = _oracle_row(q[0, h, i], k[0, h], v[0, h], scale, 16, 45)
            assert _same(out[0, h, i], want), (h, i)
            assert m[0, h, i] == lse


def test_plan_fields_are_checked() -> None:
    with pytest.raises(ValueError, match="Plan.state must be one of"):
        BASE.replace(state="ml")
    with pytest.raises(ValueError, match="Plan.kv_order must be one of"):
        BASE.replace(kv_order="backward")
    with pytest.raises(TypeError, match="contract_diagonal must be a bool"):
        BASE.replace(contract_diagonal=1)
    with pytest.raises(ValueError, match="no form with exp2=True"):
        BASE.replace(state="lse")
    with pytest.raises(ValueError, match="lazy_threshold"):
        LSE.replace(lazy_threshold=8.0)
    with pytest.raises(ValueError, match="kv_order='reverse': plans with quantizers do not model it"):
        dataclasses.replace(plan("fp8-e4m3"), kv_order="reverse")
    with pytest.raises(ValueError, match="applies to the triton-<fmt> presets"):
        plan("triton-tutorial-fp16", hardware="h200")
    assert "state=lse" in str(LSE)
    assert "contract_diagonal=False" in str(plan("triton-tutorial-fp16"))
    assert repr(LSE) == "Plan('flashattn-triton-bf16')"
    assert repr(BASE.replace(kv_order="reverse")) == "Plan('triton-bf16*', kv_order='reverse')"
