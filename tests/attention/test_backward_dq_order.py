"""flash_backward with atomic dQ (BackwardPlan.dq_accumulation="atomic", FlashAttention-2/3's atomicAdd of the
key tiles' dQ contributions) in the orders of BackwardPlan.dq_order: the two engines bit for bit, the in-MMA
default untouched, seeded runs deterministic per seed with dK and dV unchanged, and the run-to-run spread of dQ
inside the summation bound; the plan's and the call's argument errors."""

import math

import numba
import numpy as np
import pytest

import simfloat as sf
from simfloat.attention import backward_plan, flash_backward
from simfloat.trace import Tracer

_LOG2E = math.log2(math.e)


def _case(lead, seq_q, seq_k, d, causal, seed=0, kv_lead=None):
    """bf16 q, k, v, do; o (fp32) and lse (log2 units, fp32 values) of the float64 forward; float64 P, dP, delta
    for the bound."""
    rng = np.random.default_rng(seed)
    kl = lead if kv_lead is None else kv_lead
    q, do = (sf.round(rng.standard_normal(lead + (seq_q, d)), "bf16") for _ in range(2))
    k, v = (sf.round(rng.standard_normal(kl + (seq_k, d)), "bf16") for _ in range(2))
    kk, vv = k, v
    if kl != lead:
        kk, vv = (np.repeat(x, lead[-1] // kl[-1], axis=-3) for x in (k, v))
    s = q @ np.swapaxes(kk, -1, -2) / math.sqrt(d)
    if causal:
        s = np.where(np.arange(seq_k)[None, :] > np.arange(seq_q)[:, None], -np.inf, s)
    mx = s.max(-1, keepdims=True)
    e = np.exp(s - mx)
    lse = (mx[..., 0] + np.log(e.sum(-1))) * _LOG2E
    p = e / e.sum(-1, keepdims=True)
    o = sf.round(p @ vv, "float32")
    dp = do @ np.swapaxes(vv, -1, -2)
    delta = (o * do).sum(-1)
    extra = dict(p=p, dp=dp, delta=delta, kk=kk, dov=np.abs(do) @ np.swapaxes(np.abs(vv), -1, -2))
    return (q, k, v, o, do, sf.round(lse, "float32")), extra


def _atomic(order="forward", **changes):
    return backward_plan("triton-bf16").replace(dq_accumulation="atomic", dq_order=order, **changes)


def _bits(args, plan, engine, bm, bn, causal, seed=None, trace=None):
    kw = dict(plan=plan, block_m=bm, block_n=bn, causal=causal, engine=engine, return_delta=True, trace=trace)
    return flash_backward(*args, seed=seed, **kw)


_SHIFT = lambda t, n: [(t + u) % n for u in range(n)]  # noqa: E731  # a cyclic schedule as a callable


@pytest.mark.parametrize(
    "order, seq_q, seq_k, bm, bn, causal",
    [
        ("forward", 97, 33, 32, 16, False),
        ("forward", 33, 97, 16, 16, True),
        ("reverse", 97, 97, 32, 16, True),
        ("reverse", 33, 97, 16, 32, False),
        ("seeded", 97, 97, 16, 16, True),
        ("seeded", 97, 33, 32, 8, False),
        ((2, 0, 4, 1, 3), 33, 97, 16, 24, False),
        ((2, 0, 4, 1, 3), 97, 97, 32, 24, True),
        (_SHIFT, 97, 97, 16, 16, True),
    ],
)
def test_atomic_vector_equals_reference_bit_for_bit(order, seq_q, seq_k, bm, bn, causal):
    args, _ = _case((2,), seq_q, seq_k, 16, causal, seed=seq_q + seq_k)
    pl = _atomic(order)
    seed = 7 if order == "seeded" else None
    ref = _bits(args, pl, "reference", bm, bn, causal, seed)
    old = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            got = _bits(args, pl, "vector", bm, bn, causal, seed)
            for label, g, r in zip(("dq", "dk", "dv", "delta"), got, ref, strict=True):
                assert np.array_equal(g, r), (label, threads, int(np.sum(g != r)))
    finally:
        numba.set_num_threads(old)
    # dK, dV and delta do not depend on how dQ accumulates
    base = _bits(args, "triton-bf16", "vector", bm, bn, causal)
    for label, g, r in zip(("dk", "dv", "delta"), got[1:], base[1:], strict=True):
        assert np.array_equal(g, r), label


@pytest.mark.parametrize("dq_atomic", [("float32", "toward_zero"), "bfloat16"])
def test_atomic_other_add_formats_and_gqa_engines_agree(dq_atomic):
    args, _ = _case((4,), 65, 49, 16, True, seed=3, kv_lead=(2,))
    pl = _atomic("seeded", dq_atomic=dq_atomic, grad="float32")
    ref = _bits(args, pl, "reference", 16, 16, True, seed=11)
    got = _bits(args, pl, "vector", 16, 16, True, seed=11)
    for label, g, r in zip(("dq", "dk", "dv", "delta"), got, ref, strict=True):
        assert np.array_equal(g, r), label


def test_traced_atomic_returns_the_untraced_bits_and_records_dq_steps():
    args, _ = _case((1,), 49, 49, 16, False, seed=5)
    pl = _atomic("reverse")
    want = _bits(args, pl, "vector", 16, 16, False)
    tr = Tracer()
    got = _bits(args, pl, None, 16, 16, False, trace=tr)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w)
    loc = tr.local_errors()
    dq_rows = loc[loc["op"] == "dq"]
    assert len(dq_rows) > 0 and np.all(np.isfinite(dq_rows["max_abs"])) and dq_rows["max_abs"].max() > 0
    dev = tr.state_deviation()
    assert dev[dev["state"] == "dq"]["max_abs"].max() > 0


def test_forward_atomic_differs_from_in_mma_and_names_agree():
    args, _ = _case((2,), 97, 97, 32, False, seed=1)
    fp32 = dict(grad="float32")
    in_mma = _bits(args, backward_plan("triton-bf16").replace(**fp32), "vector", 32, 16, False)
    fwd = _bits(args, _atomic("forward", **fp32), "vector", 32, 16, False)
    # the tensor core's in-MMA accumulation (the accumulator aligned with the products, truncated) is not an
    # fp32 add of a from-zero contribution
    assert np.any(fwd[0] != in_mma[0])
    assert np.array_equal(fwd[1], in_mma[1]) and np.array_equal(fwd[2], in_mma[2])
    n = 7  # key tiles of 97 keys at block_n 16
    same = _bits(args, _atomic(tuple(range(n)), **fp32), "vector", 32, 16, False)
    assert np.array_equal(same[0], fwd[0])
    same = _bits(args, _atomic(lambda t, m: range(m), **fp32), "vector", 32, 16, False)
    assert np.array_equal(same[0], fwd[0])
    rev = _bits(args, _atomic("reverse", **fp32), "vector", 32, 16, False)
    same = _bits(args, _atomic(tuple(range(n))[::-1], **fp32), "vector", 32, 16, False)
    assert np.array_equal(same[0], rev[0])
    assert np.any(rev[0] != fwd[0])


def test_seeded_order_is_deterministic_per_seed_and_its_spread_is_bounded():
    """Every order adds the same contributions c_t (each an MMA from zero, independent of the order) by n - 1
    float32 additions in round to nearest (the first add 0 + c is exact), so each result is within
    ``gamma_{n-1} sum_t |c_t|`` of the exact sum (Higham, recursive summation: gamma_m = m u / (1 - m u),
    u = 2**-24) and two orders within twice that. With grad_scale and grad in float64, dq = sm * acc to
    2**-53. ``sum_t |c_t| <= sum_j |ds_ij| |k_jc|`` to the MMA's own relative error, and |ds_ij| is bounded above
    from the float64 P, dP and delta with a margin for the plan's roundings of P, dP and dS."""
    bm, bn, causal = 16, 16, True
    args, x = _case((2,), 97, 97, 16, causal, seed=2)
    pl = _atomic("seeded", grad_scale="float64", grad="float64")
    runs = [_bits(args, pl, "vector", bm, bn, causal, seed=s) for s in range(6)]
    again = _bits(args, pl, "vector", bm, bn, causal, seed=3)
    for g, w in zip(again, runs[3], strict=True):
        assert np.array_equal(g, w)
    for r in runs[1:]:
        assert np.array_equal(r[1], runs[0][1]) and np.array_equal(r[2], runs[0][2])
    dqs = np.stack([r[0] for r in runs])
    spread = dqs.max(0) - dqs.min(0)
    assert spread.max() > 0 and np.any(dqs[1] != dqs[0])

    sm = 1.0 / math.sqrt(16)
    ds_hi = 1.02 * x["p"] * (np.abs(x["dp"]) + np.abs(x["delta"])[..., None] + 2.0**-16 * x["dov"])
    s_abs = (1 + 2.0**-20) * (ds_hi @ np.abs(x["kk"]))  # (lead, seq_q, d) >= sum_t |c_t|
    seq_q, seq_k = 97, 97
    n_t = np.array([min(-(-seq_k // bn), -(-((i // bm + 1) * bm) // bn)) for i in range(seq_q)])
    u = 2.0**-24
    gamma = (n_t - 1) * u / (1 - (n_t - 1) * u)
    bound = sm * 2 * gamma[None, :, None] * s_abs * (1 + 2.0**-50) + 2.0**-52 * np.abs(dqs).max(0)
    assert np.all(spread <= bound), float((spread / np.maximum(bound, 1e-300)).max())
    assert bound.max() < 1e-4 * np.abs(dqs).max()  # and the bound is no vacuous number
    assert np.all(spread[:, n_t == 1] == 0)  # a single key tile: no order to vary


def test_plan_and_call_errors():
    base = backward_plan("triton-bf16")
    with pytest.raises(ValueError, match="dq_accumulation must be one of"):
        base.replace(dq_accumulation="atomicadd")
    with pytest.raises(ValueError, match="dq_order must be one of"):
        base.replace(dq_accumulation="atomic", dq_order="random")
    with pytest.raises(ValueError, match="permutation of 0..n-1"):
        base.replace(dq_accumulation="atomic", dq_order=(0, 2))
    with pytest.raises(TypeError, match="dq_order must be a name"):
        base.replace(dq_accumulation="atomic", dq_order=3)
    with pytest.raises(ValueError, match="dq_order='seeded' needs dq_accumulation='atomic'"):
        base.replace(dq_order="seeded")
    assert base.replace(dq_order="reverse").dq_order == "reverse"  # in-MMA dQ walks its key tiles in any order
    with pytest.raises(ValueError, match="unknown backward plan entries"):
        base.replace(dq_seed=1)
    pl = _atomic("seeded")
    assert "dq_accumulation='atomic'" in repr(pl) and "dq_order='seeded'" in repr(pl)
    assert "dq_accumulation=atomic" in str(pl) and "dq_accumulation" not in str(base)
    args, _ = _case((1,), 33, 33, 8, False)
    kw = dict(block_m=16, block_n=16)
    with pytest.raises(ValueError, match="seed is for plans with dq_order='seeded'"):
        flash_backward(*args, plan="triton-bf16", seed=1, **kw)
    with pytest.raises(TypeError, match="seed must be a non-negative int"):
        flash_backward(*args, plan=pl, seed=1.5, **kw)
    with pytest.raises(ValueError, match="orders 2 key tiles, but seq_k 33 and block_n 16 make 3"):
        flash_backward(*args, plan=_atomic((1, 0)), **kw)
    with pytest.raises(ValueError, match="must return a permutation of range"):
        flash_backward(*args, plan=_atomic(lambda t, n: [0] * n), **kw)
