"""simfloat.attention.flash: exactness in float64, op-by-op agreement with an independent numpy dataflow,
agreement with torch SDPA in fp32, determinism and argument checks."""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest
from attention_reference import (
    _add,
    _div,
    _fma,
    _inputs,
    _mul,
    _r,
    _rel,
    exact_attention,
    serial,
)

import simfloat as sf
from simfloat.accumulate import matmul
from simfloat.attention import FLASH_OPS, OpSpec, flash, plan


@serial
def reference_flash(q, k, v, pl, bm, bn, causal=False, scale=None):
    """The flash dataflow of simfloat_gpu/kernels/flash_attention.py (T1..T14, E1, E2) in numpy, rounding each op with
    simfloat.round, dots with simfloat.accumulate.matmul, FMAs exactly (fractions), exp with libm.
    2-D q (seq_q, d), k (seq_k, d), v (seq_k, dv)."""
    seq_q, d = q.shape
    seq_k, dv = v.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    ex = np.frompyfunc(math.exp2 if pl.exp2 else math.exp, 1, 1)

    def exf(x):
        return ex(x).astype(np.float64)

    sc = pl.scale
    qs = float(_mul(_r(scale, sc), _r(math.log2(math.e), sc), sc)) if pl.exp2 else float(_r(scale, sc))
    n_kv = -(-seq_k // bn)
    kpad = np.zeros((n_kv * bn, d))
    kpad[:seq_k] = k
    vpad = np.zeros((n_kv * bn, dv))
    vpad[:seq_k] = v
    out = np.empty((seq_q, dv))
    per_step = pl.normalization == "per_step"
    for t in range(-(-seq_q // bm)):
        rows = np.arange(t * bm, min(seq_q, (t + 1) * bm))
        n = rows.size
        kv_hi = min((t + 1) * bm, seq_k) if causal else seq_k
        m, den, acc = np.full(n, -np.inf), np.zeros(n), np.zeros((n, dv))
        for jt in range(-(-kv_hi // bn)):
            cols = np.arange(jt * bn, (jt + 1) * bn)
            vis = (cols < seq_k)[None, :] & ((cols[None, :] <= rows[:, None]) | (not causal))
            s = np.where(vis, matmul(q[rows], kpad[cols].T, acc=pl.qk), -np.inf)
            smax = s.max(1)
            with np.errstate(invalid="ignore"):
                mx = np.where(smax == -np.inf, -np.inf, _mul(smax, qs, sc))
                m_new = np.maximum(m, mx)
                m_new = np.where(m_new != m, _r(m_new, pl.m_i), m_new)
                rescale = np.ones(n, dtype=bool)
                if pl.lazy_threshold is not None:
                    dm = _add(m_new, -m, pl.m_i)
                    rescale = np.where(m == -np.inf, m_new > -np.inf, dm > pl.lazy_threshold)
                    m_new = np.where(rescale, m_new, m)
                m_sub = np.where(m_new == -np.inf, 0.0, m_new)
                sv = np.where(vis, s, 0.0)
                if pl.contract:
                    x = _fma(sv, qs, -m_sub[:, None], sc)
                else:
                    x = _add(_mul(sv, qs, sc), -m_sub[:, None], sc)
                p = np.where(vis, _r(exf(np.where(vis, x, -np.inf)), pl.exp), 0.0)
                l_ij = np.zeros(n)
                lij_op = OpSpec(pl.l_ij.fmt, pl.l_ij.mode)  # the in-tile sum: sequential l_ij models only
                for j in range(bn):
                    l_ij = _add(l_ij, p[:, j], lij_op)
                alpha = np.where(m == -np.inf, 0.0, _r(exf(_add(m, -m_sub, pl.alpha)), pl.alpha))
                alpha = np.where(rescale, alpha, 1.0)
            if pl.contract:
                l_new = _fma(den, alpha, l_ij, pl.l_i)
            else:
                l_new = _add(_mul(den, alpha, pl.l_i), l_ij, pl.l_i)
            w = _mul(den, alpha, pl.acc) if per_step else alpha
            acc = _mul(acc, w[:, None], pl.acc)
            acc = matmul(_r(p, pl.p), vpad[cols], acc, acc=pl.pv)
            if per_step:
                acc = _div(acc, np.where(l_new == 0, 1.0, l_new)[:, None], pl.normalize)
            m, den = m_new, l_new
        o = acc if per_step else _div(acc, np.where(den == 0, 1.0, den)[:, None], pl.normalize)
        out[rows] = _r(o, pl.out)
    return out


# -- float64: exact attention ---------------------------------------------------------------------------


@pytest.mark.parametrize("tile", [16, 32, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq_q,seq_k", [(97, 97), (257, 97), (97, 257)])
def test_fp64_is_exact_attention(tile, causal, seq_q, seq_k):
    q, k, v = _inputs((2,), seq_q, seq_k, 16, seed=tile + seq_q)
    o = flash(q, k, v, plan="fp64", block_m=tile, block_n=tile, causal=causal)
    assert _rel(o, exact_attention(q, k, v, causal)) <= 1e-13


@pytest.mark.parametrize("causal", [False, True])
def test_fp64_long_sequence(causal):
    q, k, v = _inputs((), 1000, 1000, 8, seed=3)
    o = flash(q, k, v, plan="fp64", block_m=64, block_n=32, causal=causal)
    assert _rel(o, exact_attention(q, k, v, causal)) <= 1e-13


@pytest.mark.slow
@pytest.mark.parametrize("tile", [16, 32, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq", [(1000, 1000), (1000, 257), (257, 1000)])
def test_fp64_sweep_long(tile, causal, seq):
    q, k, v = _inputs((2,), *seq, 16, seed=tile)
    o = flash(q, k, v, plan="fp64", block_m=tile, block_n=tile, causal=causal)
    assert _rel(o, exact_attention(q, k, v, causal)) <= 1e-13


@pytest.mark.parametrize(
    "variant",
    [
        dict(exp2=True),
        dict(contract=True),
        dict(normalization="per_step"),
        dict(lazy_threshold=4.0),
        dict(exp2=True, contract=True, normalization="per_step", lazy_threshold=2.0),
    ],
)
def test_fp64_variants_are_exact_attention(variant):
    q, k, v = _inputs((3,), 70, 150, 16, dv=24, seed=5)
    for causal in (False, True):
        o = flash(q, k, v, plan=plan("fp64").replace(**variant), block_m=32, block_n=16, causal=causal)
        assert _rel(o, exact_attention(q, k, v, causal)) <= 1e-13


def test_mixed_tile_sizes_and_scale():
    q, k, v = _inputs((2, 2), 45, 77, 8, seed=7)
    for bm, bn in ((16, 64), (64, 16), (5, 7), (1, 1)):
        o = flash(q, k, v, plan="fp64", block_m=bm, block_n=bn, causal=True, scale=0.3)
        assert _rel(o, exact_attention(q, k, v, True, 0.3)) <= 1e-13


# -- one rounding at a time: bitwise against the numpy dataflow ------------------------------------------

_VARIANTS = {
    "plain": {},
    "triton-like": dict(exp2=True, contract=True, lazy_threshold=0.5),
    "fa1": dict(normalization="per_step"),
}


@pytest.mark.parametrize("variant", list(_VARIANTS))
@pytest.mark.parametrize("op", FLASH_OPS)
def test_single_op_plan_matches_numpy_dataflow_bitwise(op, variant):
    q, k, v = _inputs((), 37, 53, 16, fmt="bf16", seed=11)
    base = plan("fp64").replace(**_VARIANTS[variant])
    pl = base.replace(**{op: "bf16"})
    for causal, bm, bn in ((False, 16, 32), (True, 32, 16)):
        got = flash(q, k, v, plan=pl, block_m=bm, block_n=bn, causal=causal)
        np.testing.assert_array_equal(got, reference_flash(q, k, v, pl, bm, bn, causal))
        assert not np.array_equal(got, flash(q, k, v, plan=base, block_m=bm, block_n=bn, causal=causal))


@pytest.mark.parametrize("name", ["triton-bf16", "triton-fp16", "triton-tf32", "triton-e4m3", "all-bf16", "all-e5m2"])
def test_preset_matches_numpy_dataflow_bitwise(name):
    fmt = {"tf32": "fp32"}.get(name.split("-")[1], name.split("-")[1])
    q, k, v = _inputs((), 50, 70, 32, fmt=fmt, seed=13)
    for causal, bm, bn in ((False, 64, 64), (True, 16, 32)):
        got = flash(q, k, v, plan=name, block_m=bm, block_n=bn, causal=causal)
        np.testing.assert_array_equal(got, reference_flash(q, k, v, plan(name), bm, bn, causal))


# -- fp32 against torch ----------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_all_fp32_matches_torch_sdpa(causal):
    torch = pytest.importorskip("torch")
    q, k, v = _inputs((2, 3), 97, 130, 64, fmt="fp32", seed=17)
    q, k, v = (x.astype(np.float32) for x in (q, k, v))
    o = flash(q, k, v, plan="all-fp32", causal=causal, block_m=32, block_n=64)
    t = (
        torch.nn.functional.scaled_dot_product_attention(
            *(torch.from_numpy(x.astype(np.float32)) for x in (q, k, v)), is_causal=causal
        )
        .double()
        .numpy()
    )
    np.testing.assert_allclose(o, t, rtol=0, atol=2e-5 * np.abs(t).max())
    assert _rel(o, exact_attention(q, k, v, causal)) < 1e-5


def test_low_precision_errors_are_plausible():
    q, k, v = _inputs((2,), 64, 200, 32, fmt="bf16", seed=19)
    exact = exact_attention(q, k, v)
    e_tri = _rel(flash(q, k, v, plan="triton-bf16"), exact)
    e_all = _rel(flash(q, k, v, plan="all-bf16"), exact)
    e_f32 = _rel(flash(q, k, v, plan="triton-fp32"), exact)
    assert 1e-4 < e_tri < 2e-2 and e_tri < e_all < 0.2 and e_f32 < 1e-5


# -- determinism, stats, edge cases ----------------------------------------------------------------------


def test_deterministic_across_thread_counts():
    q, k, v = _inputs((4, 3), 100, 90, 16, fmt="bf16", seed=23)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        a = flash(q, k, v, plan="triton-bf16", causal=True, block_m=16, block_n=32)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        b = flash(q, k, v, plan="triton-bf16", causal=True, block_m=16, block_n=32)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, flash(q, k, v, plan="triton-bf16", causal=True, block_m=16, block_n=32))


def test_shapes_dtypes_broadcast_and_stats():
    q, k, v = _inputs((2, 1), 33, 20, 8, dv=5, seed=29)
    k = np.broadcast_to(k, (2, 3, 20, 8))
    v = np.broadcast_to(v, (2, 3, 20, 5))
    o, m, den = flash(q.astype(np.float32), k, v, plan="fp64", return_stats=True, block_m=16, block_n=8)
    assert o.shape == (2, 3, 33, 5) and o.dtype == np.float64 and m.shape == den.shape == (2, 3, 33)
    q32 = q.astype(np.float32).astype(np.float64)
    assert _rel(o, exact_attention(np.broadcast_to(q32, (2, 3, 33, 8)), k, v)) <= 1e-13
    s = (np.broadcast_to(q32, (2, 3, 33, 8)) @ np.swapaxes(k, -1, -2)) / math.sqrt(8)
    np.testing.assert_allclose(m, s.max(-1), rtol=1e-15)
    np.testing.assert_allclose(den, np.exp(s - m[..., None]).sum(-1), rtol=1e-13)
    o1 = flash(q[:, :, :1], k, v, plan="fp64")
    assert o1.shape == (2, 3, 1, 5)
    assert flash(q[:, :, :0], k, v, plan="fp64").shape == (2, 3, 0, 5)


def test_output_values_are_in_the_output_format():
    q, k, v = _inputs((2,), 40, 60, 16, fmt="fp16", seed=31)
    o = flash(q, k, v, plan="triton-fp16")
    np.testing.assert_array_equal(o, sf.round(o, "fp16"))
    o8 = flash(q, k, v, plan="triton-e4m3")
    np.testing.assert_array_equal(o8, sf.round(o8, "e4m3"))


@pytest.mark.parametrize(
    "args,err",
    [
        (dict(q=[[1.0]]), TypeError),
        (dict(q=np.ones((4, 8), dtype=np.int32)), TypeError),
        (dict(q=np.ones(8)), ValueError),
        (dict(q=np.ones((4, 7))), ValueError),
        (dict(k=np.ones((0, 8)), v=np.ones((0, 8))), ValueError),
        (dict(v=np.ones((6, 8))), ValueError),
        (dict(q=np.ones((3, 4, 8)), k=np.ones((2, 5, 8)), v=np.ones((2, 5, 8))), ValueError),
        (dict(block_m=0), ValueError),
        (dict(block_n=2.0), TypeError),
        (dict(block_m=True), TypeError),
        (dict(causal="yes"), TypeError),
        (dict(scale=-1.0), ValueError),
        (dict(scale=float("nan")), ValueError),
        (dict(scale="0.1"), TypeError),
        (dict(plan="nope"), ValueError),
        (dict(plan=3), TypeError),
        (dict(trace=object()), TypeError),
        (dict(plan=plan("fp64").replace(scale="e4m3"), scale=1e-9), ValueError),
    ],
)
def test_bad_arguments(args, err):
    kw = dict(q=np.ones((4, 8)), k=np.ones((5, 8)), v=np.ones((5, 8)), plan="fp64")
    kw.update(args)
    with pytest.raises(err):
        flash(kw.pop("q"), kw.pop("k"), kw.pop("v"), **kw)
