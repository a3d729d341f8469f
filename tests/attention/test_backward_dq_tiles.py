"""flash_backward with the dQ kernel's own tiles (block_m2, block_n2: the Triton tutorial's separate dK/dV and
dQ kernels) and its key-tile order (BackwardPlan.dq_order with in-MMA dQ, "diagonal_first" as the tutorial's
dQ): the two engines bit for bit, dK and dV untouched by the dQ walk, the walk's forward order equal to the
fused dQ, the orders differing, and the argument errors."""

import math

import numpy as np
import pytest

import simfloat as sf
from simfloat.attention import backward_plan, flash_backward
from simfloat.trace import Tracer

_LOG2E = math.log2(math.e)


def _case(seq_q, seq_k, d, causal, fmt="fp16", seed=0):
    """q, k, v, do in fmt; o (fp32) and lse (log2 units, fp32 values) of the float64 forward."""
    rng = np.random.default_rng(seed)
    q, do = (sf.round(rng.standard_normal((2, seq_q, d)), fmt) for _ in range(2))
    k, v = (sf.round(rng.standard_normal((2, seq_k, d)), fmt) for _ in range(2))
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(d)
    if causal:
        s = np.where(np.arange(seq_k)[None, :] > np.arange(seq_q)[:, None], -np.inf, s)
    mx = s.max(-1, keepdims=True)
    e = np.exp(s - mx)
    lse = (mx[..., 0] + np.log(e.sum(-1))) * _LOG2E
    o = sf.round((e / e.sum(-1, keepdims=True)) @ v, "float32")
    return q, k, v, o, do, sf.round(lse, "float32")


def _run(args, plan, tiles, causal, engine=None, trace=None):
    bm, bn, bm2, bn2 = tiles
    kw = dict(block_m=bm, block_n=bn, block_m2=bm2, block_n2=bn2, causal=causal, engine=engine, trace=trace)
    return flash_backward(*args, plan=plan, return_delta=True, **kw)


def _same(a, b):
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


_FWD = lambda t, n: list(range(n))  # noqa: E731  # the forward order as a callable: forces the dQ walk


@pytest.mark.parametrize(
    "order, acc, seq_q, seq_k, tiles, causal",
    [
        ("forward", "in_mma", 97, 97, (32, 64, 64, 16), True),
        ("diagonal_first", "in_mma", 97, 97, (16, 64, 64, 16), True),
        ("diagonal_first", "in_mma", 70, 97, (32, 32, 32, 16), False),
        ("reverse", "in_mma", 70, 97, (16, 32, 32, 16), True),
        (_FWD, "in_mma", 97, 70, (16, 16, 16, 16), True),
        ("diagonal_first", "atomic", 97, 97, (16, 64, 64, 32), True),
        ("seeded", "atomic", 70, 97, (32, 16, 16, 32), True),
    ],
)
def test_dq_walk_vector_equals_reference_bit_for_bit(order, acc, seq_q, seq_k, tiles, causal):
    args = _case(seq_q, seq_k, 16, causal, seed=seq_q + seq_k)
    pl = backward_plan("triton-fp16").replace(dq_accumulation=acc, dq_order=order)
    _same(_run(args, pl, tiles, causal, "vector"), _run(args, pl, tiles, causal, "reference"))


@pytest.mark.parametrize("causal", [False, True])
def test_dq_walk_leaves_dk_dv_and_forward_walk_equals_fused_dq(causal):
    args = _case(97, 97, 16, causal, seed=3)
    pl = backward_plan("triton-fp16")
    fused = _run(args, pl, (32, 16, None, None), causal)
    walked = _run(args, pl.replace(dq_order=_FWD), (32, 16, None, None), causal)
    _same(fused, walked)  # the walk's forward order over the same tiles is the fused Q4
    other = _run(args, pl.replace(dq_order="diagonal_first"), (32, 16, 64, 32), causal)
    _same(fused[1:], other[1:])  # dK, dV, delta: the dK/dV kernel's alone


def test_dq_order_and_tiles_change_dq():
    """Causal: the tutorial's diagonal-first dQ differs from the forward walk in some bits; in-MMA under sm90's
    16-wide block FMA, a dQ key tile width that is a multiple of 16 does not change dQ; with atomic dQ (each
    tile's contribution from zero) it does."""
    args = _case(97, 97, 32, True, seed=5)
    pl = backward_plan("triton-fp16")
    fwd = _run(args, pl, (32, 64, 64, 16), True)[0]
    diag = _run(args, pl.replace(dq_order="diagonal_first"), (32, 64, 64, 16), True)[0]
    assert np.any(fwd != diag)
    np.testing.assert_allclose(fwd, diag, rtol=0, atol=1e-2)
    assert np.array_equal(fwd, _run(args, pl, (32, 64, 64, 32), True)[0])
    at = pl.replace(dq_accumulation="atomic")
    assert np.any(_run(args, at, (32, 64, 64, 16), True)[0] != _run(args, at, (32, 64, 64, 32), True)[0])


def test_diagonal_first_is_the_tutorial_order():
    args = _case(97, 97, 16, True, seed=7)
    bm2, bn2 = 64, 16
    tut = lambda t, n: list(range((t * bm2 + 1) // bn2, n)) + list(range((t * bm2 + 1) // bn2))  # noqa: E731
    pl = backward_plan("triton-fp16")
    got = _run(args, pl.replace(dq_order="diagonal_first"), (32, 64, bm2, bn2), True)
    _same(got, _run(args, pl.replace(dq_order=tut), (32, 64, bm2, bn2), True))


def test_dq_walk_traced_equals_untraced():
    args = _case(70, 97, 16, True, seed=11)
    pl = backward_plan("triton-fp16").replace(dq_order="diagonal_first")
    tr = Tracer()
    got = _run(args, pl, (32, 64, 64, 16), True, trace=tr)
    _same(got, _run(args, pl, (32, 64, 64, 16), True, engine="vector"))
    assert tr.by_op().loc["flash_backward"].loc["dq"].max() > 0  # the walk's dQ steps are recorded


def test_dq_walk_errors():
    base = backward_plan("triton-fp16")
    with pytest.raises(ValueError, match="dq_order='seeded' needs dq_accumulation='atomic'"):
        base.replace(dq_order="seeded")
    args = _case(33, 33, 16, True)
    with pytest.raises(ValueError, match="block_m2"):
        flash_backward(*args, plan=base, block_m2=0)
    assert "dq_order='diagonal_first'" in str(base.replace(dq_order="diagonal_first"))


@pytest.mark.parametrize(
    "mask, causal, off, right",
    [
        ({"causal_align": "bottom-right"}, True, 27, 0),
        ({"window": (20, 15)}, False, 0, 15),
        ({"window": (30, 0), "causal_align": "bottom-right"}, True, 27, 0),
    ],
)
def test_diagonal_first_under_masks(mask, causal, off, right):
    """Under a mask, "diagonal_first" starts at the key tile the query tile's first row's right edge (the
    diagonal shifted by the alignment, or the window's right bound) masks in part, key t * bm2 + off + right + 1;
    then the rest from tile 0: the bits of that order as a callable (atomic dQ stored in fp32, where the order
    shows), both engines bit for bit (it was refused)."""
    from tests.attention_reference import window_keep

    sq, sk, d, bm2, bn2 = 70, 97, 16, 32, 16
    rng = np.random.default_rng(13)
    q, do = (sf.round(rng.standard_normal((2, sq, d)), "fp16") for _ in range(2))
    k, v = (sf.round(rng.standard_normal((2, sk, d)), "fp16") for _ in range(2))
    left = mask.get("window", (-1, 0))[0]
    keep = window_keep(sq, sk, left, right, off=off)
    s = np.where(keep, q @ np.swapaxes(k, -1, -2) / math.sqrt(d), -np.inf)
    mx = s.max(-1, keepdims=True)
    e = np.exp(s - mx)
    lse = sf.round((mx[..., 0] + np.log(e.sum(-1))) * _LOG2E, "float32")
    args = (q, k, v, sf.round((e / e.sum(-1, keepdims=True)) @ v, "float32"), do, lse)

    def run(order, engine=None):  # atomic dQ stored in fp32: the tiles' order shows in the bits
        pl = backward_plan("triton-fp16").replace(dq_accumulation="atomic", dq_order=order, grad="float32")
        kw = dict(block_m=32, block_n=64, block_m2=bm2, block_n2=bn2, causal=causal, engine=engine)
        return flash_backward(*args, plan=pl, return_delta=True, **kw, **mask)

    def diag_first(shift):
        def order(t, n):
            first = min(n, max(0, t * bm2 + shift + 1) // bn2)
            return list(range(first, n)) + list(range(first))

        return order

    got = run("diagonal_first", "vector")
    _same(got, run("diagonal_first", "reference"))
    _same(got, run(diag_first(off + right)))
    fwd = run("forward")
    _same(got[1:], fwd[1:])  # dK, dV, delta: the dK/dV kernel's alone
    assert np.any(got[0] != fwd[0])
    assert np.any(got[0] != run(diag_first(0))[0])  # the unshifted diagonal is another order
