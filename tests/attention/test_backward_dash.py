"""DASH's deterministic dQ schedules (arXiv 2601.21824) as ``BackwardPlan.dq_order``: the waits of the released
code's schedulers (its own worked example), Descending Q-Tile Iteration equal to FA3's forward order, Shift
Scheduling on both engines bit for bit (full and causal, waves that cross heads), and the shapes it has no
order for."""

import math

import numpy as np
import pytest

import simfloat as sf
from simfloat.attention import backward_plan, flash_backward
from simfloat.attention._dash import dash_keys, is_dash


def _seen(sq, sk, bm, bn, causal):
    n_qt, n_kv = -(-sq // bm), -(-sk // bn)
    return np.array([n_kv if not causal else min(n_kv, -(-((t + 1) * bm) // bn)) for t in range(n_qt)])


def test_shift_waits_are_the_released_codes_example():
    """``tile_m_dependency.hpp``'s example: 6 query tiles, 3 key tiles running in one wave."""
    keys = dash_keys("dash_shift", 1, 96, 48, 16, 16, False, _seen(96, 48, 16, 16, False))
    want = [[0, 2, 1], [1, 0, 2], [2, 1, 0], [2, 1, 0], [2, 1, 0], [2, 1, 0]]
    assert keys[0].astype(int).tolist() == want
    # two heads on 2 SMs: head 0's tiles 0, 1 run in wave 0 and tile 2 after; head 1's tile 0 shares wave 1
    keys = dash_keys("dash_shift:2", 2, 96, 48, 16, 16, False, _seen(96, 48, 16, 16, False))
    assert keys[0, 0].tolist() == [0, 1, 2] and keys[0, 5].tolist() == [1, 0, 2]
    assert keys[1, 0].tolist() == [0, 1, 2] and keys[1, 5].tolist() == [0, 2, 1]


_CAUSAL = [(97, 16, 32, 132, 2), (256, 16, 32, 3, 3), (97, 32, 32, 3, 3)]


@pytest.mark.parametrize(("sq", "bm", "bn", "sms", "lead"), _CAUSAL)
def test_causal_shift_waits_are_permutations(sq, bm, bn, sms, lead):
    seen = _seen(sq, sq, bm, bn, True)
    keys = dash_keys(f"dash_shift:{sms}", lead, sq, sq, bm, bn, True, seen)
    for b in range(lead):
        for t, n in enumerate(seen):
            assert sorted(keys[b, t, :n].tolist()) == list(range(n))


def test_causal_shift_refuses_a_ragged_last_query_tile():
    """With a ragged last query tile (7 query tiles of 16 under 4 key tiles of 32) the released code counts an
    earlier wave's upper key tile that does not see query tile 5: its waits are no permutation (the kernel would
    wait forever there), so the order is refused."""
    with pytest.raises(ValueError, match="query tile 5 .lead 1. are .0, 2, 3., not a permutation"):
        dash_keys("dash_shift:3", 3, 97, 97, 16, 32, True, _seen(97, 97, 16, 32, True))


def _case(lead, seq, d, seed, seq_k=None, causal=False):
    """bf16 q, k, v, do; o (fp32) and lse (log2 units, fp32 values) of the float64 forward."""
    rng = np.random.default_rng(seed)
    sk = seq if seq_k is None else seq_k
    q, do = (sf.round(rng.standard_normal(lead + (seq, d)), "bf16") for _ in range(2))
    k, v = (sf.round(rng.standard_normal(lead + (sk, d)), "bf16") for _ in range(2))
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(d)
    if causal:
        s = np.where(np.arange(sk)[None, :] > np.arange(seq)[:, None], -np.inf, s)
    mx = s.max(-1, keepdims=True)
    e = np.exp(s - mx)
    lse = (mx[..., 0] + np.log(e.sum(-1))) * math.log2(math.e)
    o = sf.round((e / e.sum(-1, keepdims=True)) @ v, "float32")
    return q, k, v, o, do, sf.round(lse, "float32")


def _run(args, order, engine, bm, bn, causal):
    pl = backward_plan("triton-bf16").replace(dq_accumulation="atomic", dq_order=order, grad="float32")
    return flash_backward(*args, plan=pl, block_m=bm, block_n=bn, causal=causal, engine=engine, return_delta=True)


@pytest.mark.parametrize(("causal", "bm", "bn"), [(False, 16, 16), (True, 32, 32)])
def test_dash_orders_on_both_engines(causal, bm, bn):
    args = _case((3,), 97, 16, seed=4, causal=causal)
    fwd = _run(args, "forward", "vector", bm, bn, causal)
    desc = _run(args, "dash_descending", "vector", bm, bn, causal)
    for g, w in zip(desc, fwd, strict=True):
        assert np.array_equal(g, w)  # Descending Q-Tile Iteration: FA3's deterministic add order
    ref = _run(args, "dash_shift:3", "reference", bm, bn, causal)
    vec = _run(args, "dash_shift:3", "vector", bm, bn, causal)
    for label, g, r in zip(("dq", "dk", "dv", "delta"), vec, ref, strict=True):
        assert np.array_equal(g, r), label
    assert np.array_equal(vec[1], fwd[1]) and np.array_equal(vec[2], fwd[2])  # dK, dV do not depend on it
    assert np.any(vec[0] != fwd[0])  # another order of the same adds


def test_dash_errors():
    assert is_dash("dash_shift:8") and not is_dash("dash_shift:0") and not is_dash("dash_shift:x")
    with pytest.raises(ValueError, match="dash_shift:<sms>"):
        backward_plan("triton-bf16").replace(dq_order="dash_shift:0")
    args = _case((1,), 97, 16, seed=1, causal=True)
    with pytest.raises(ValueError, match="even number of key tiles"):
        _run(args, "dash_shift", "vector", 16, 16, True)  # 7 key tiles
    with pytest.raises(ValueError, match="seq_q == seq_k"):
        _run(_case((1,), 97, 16, seed=2, seq_k=128, causal=True), "dash_shift", "vector", 16, 32, True)
