"""Packed variable-length sequences (flash_varlen): each sequence's bits are those of flash() run on it alone
(its tiles start at its own first token), on both engines, with GQA; a float64 oracle per sequence; bad offsets
are errors that name the problem."""

import math

import numpy as np
import pytest

import simfloat as sf
from simfloat.attention import check_cu_seqlens, flash, flash_varlen

CU_Q = [0, 5, 5, 102, 135]  # lengths 5, 0, 97, 33
CU_K = [0, 7, 19, 116, 373]  # lengths 7, 12, 97, 257


def _packed(hq=4, hkv=2, d=16, seed=0):
    g = np.random.default_rng(seed)
    q = sf.round(g.standard_normal((CU_Q[-1], hq, d)), "bf16")
    k = sf.round(g.standard_normal((CU_K[-1], hkv, d)), "bf16")
    v = sf.round(g.standard_normal((CU_K[-1], hkv, d)), "bf16")
    return q, k, v


def _oracle(q, k, v):
    """float64 softmax attention of one (seq, heads, d) sequence, GQA by repetition."""
    g = q.shape[1] // k.shape[1]
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("qhd,khd->hqk", q, kk) / math.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("hqk,khd->qhd", p / p.sum(-1, keepdims=True), vv)


@pytest.mark.parametrize("engine", ["vector", "reference"])
def test_each_sequence_is_its_own_run(engine):
    q, k, v = _packed()
    out, m, l = flash_varlen(q, k, v, CU_Q, CU_K, block_m=16, block_n=32, return_stats=True, engine=engine)  # noqa: E741
    assert out.shape == (CU_Q[-1], 4, 16) and m.shape == l.shape == (4, CU_Q[-1])
    for i in range(len(CU_Q) - 1):
        q0, q1, k0, k1 = CU_Q[i], CU_Q[i + 1], CU_K[i], CU_K[i + 1]
        if q1 == q0:
            continue
        o1, m1, l1 = flash(q[q0:q1], k[k0:k1], v[k0:k1], block_m=16, block_n=32, return_stats=True, layout="bshd")
        np.testing.assert_array_equal(out[q0:q1], o1)
        np.testing.assert_array_equal(m[:, q0:q1], m1)
        np.testing.assert_array_equal(l[:, q0:q1], l1)
        ref = _oracle(q[q0:q1], k[k0:k1], v[k0:k1])
        assert np.max(np.abs(out[q0:q1] - ref)) < 2e-2  # bf16 output: a few of its ulps


def test_engines_agree_and_tiles_restart_per_sequence():
    q, k, v = _packed(seed=1)
    a = flash_varlen(q, k, v, CU_Q, CU_K, block_n=16, engine="vector")
    b = flash_varlen(q, k, v, CU_Q, CU_K, block_n=16, engine="reference")
    np.testing.assert_array_equal(a, b)
    # the third sequence's keys start at offset 19, not a multiple of 16: a run over the packed keys with the
    # other sequences' keys masked off would tile it from offset 16; the varlen tiles start at 19 (its own run)
    seq = flash(q[5:102], k[19:116], v[19:116], block_n=16, layout="bshd")
    np.testing.assert_array_equal(a[5:102], seq)


def test_float64_plan_matches_the_oracle():
    q, k, v = _packed(hq=2, hkv=1, d=8, seed=2)
    out = flash_varlen(q, k, v, CU_Q, CU_K, plan="fp64", block_n=32)
    for i in range(len(CU_Q) - 1):
        q0, q1, k0, k1 = CU_Q[i], CU_Q[i + 1], CU_K[i], CU_K[i + 1]
        if q1 > q0:
            np.testing.assert_allclose(out[q0:q1], _oracle(q[q0:q1], k[k0:k1], v[k0:k1]), rtol=0, atol=1e-12)


def test_no_keys_and_causal():
    q, k, v = _packed(seed=3)
    # causal with equal lengths per sequence (one sequence empty): each sequence's own causal run
    oc = flash_varlen(q, k[:135], v[:135], CU_Q, CU_Q, causal=True, block_m=16, block_n=16)
    own = flash(q[5:102], k[5:102], v[5:102], causal=True, block_m=16, block_n=16, layout="bshd")
    np.testing.assert_array_equal(oc[5:102], own)
    # the last sequence has 33 queries and no keys: out 0, m -inf, l 0
    o0, m0, l0 = flash_varlen(q, k[:102], v[:102], CU_Q, [0, 5, 5, 102, 102], return_stats=True)
    assert np.all(o0[102:] == 0) and np.all(m0[:, 102:] == -np.inf) and np.all(l0[:, 102:] == 0)


@pytest.mark.parametrize(
    ("cu", "total", "max_seqlen", "err", "match"),
    [
        ([0.0, 3.0], 3, None, TypeError, "integers"),
        ([True, False], 1, None, TypeError, "integers"),
        ([[0, 3]], 3, None, ValueError, "1-D"),
        ([0], 0, None, ValueError, "1-D"),
        ([1, 3], 3, None, ValueError, "start at 0"),
        ([0, 4, 3], 3, None, ValueError, "non-decreasing"),
        ([0, 2], 3, None, ValueError, "end at the packed length 3"),
        ([0, 2, 3], 3, 1, ValueError, "max_seqlen 1"),
    ],
)
def test_bad_offsets(cu, total, max_seqlen, err, match):
    with pytest.raises(err, match=match):
        check_cu_seqlens(cu, total, "cu_seqlens_q", max_seqlen)


@pytest.mark.parametrize("engine", ["vector", "reference"])
def test_causal_aligns_bottom_right_as_flash_attn(engine):
    """Unequal lengths: query i of a sequence with n_q queries and n_k keys sees keys j <= i + n_k - n_q (the
    fp64 plan against a float64 oracle with that mask); the bits are flash()'s bottom-right mask on the sequence."""
    q, k, v = _packed(seed=2)
    out = flash_varlen(q, k, v, CU_Q, CU_K, plan="fp64", causal=True, block_m=16, block_n=32, engine=engine)
    bf = flash_varlen(q, k, v, CU_Q, CU_K, causal=True, block_m=16, block_n=32, engine=engine)
    for i in range(len(CU_Q) - 1):
        q0, q1, k0, k1 = CU_Q[i], CU_Q[i + 1], CU_K[i], CU_K[i + 1]
        if q1 == q0:
            continue
        nq, nk = q1 - q0, k1 - k0
        g = q.shape[1] // k.shape[1]
        kk, vv = np.repeat(k[k0:k1], g, axis=1), np.repeat(v[k0:k1], g, axis=1)
        s = np.einsum("qhd,khd->hqk", q[q0:q1], kk) / math.sqrt(q.shape[-1])
        s = np.where(np.arange(nk)[None, :] <= np.arange(nq)[:, None] + nk - nq, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        ref = np.einsum("hqk,khd->qhd", p / p.sum(-1, keepdims=True), vv)
        np.testing.assert_allclose(out[q0:q1], ref, rtol=0, atol=1e-12)
        one = flash(
            q[q0:q1],
            k[k0:k1],
            v[k0:k1],
            causal=True,
            causal_align="bottom-right",
            block_m=16,
            block_n=32,
            layout="bshd",
        )
        np.testing.assert_array_equal(bf[q0:q1], one)


def test_bad_calls():
    q, k, v = _packed()
    with pytest.raises(ValueError, match="one batch"):
        flash_varlen(q, k, v, CU_Q, [0, 373])
    with pytest.raises(ValueError, match="total_tokens"):
        flash_varlen(q[None], k, v, CU_Q, CU_K)
    with pytest.raises(ValueError, match="max_seqlen"):
        flash_varlen(q, k, v, CU_Q, CU_K, max_seqlen_k=100)
    with pytest.raises(ValueError, match="head_dim"):
        flash_varlen(q[..., :8], k, v, CU_Q, CU_K)
