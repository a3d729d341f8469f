"""Masks in the backward (issue 30 item 4): flash_backward and baseline_backward with attn_mask, key_lengths,
window and bottom-right alignment, both engines bit for bit, against float64 numpy gradients of the masked
softmax attention and against the unmasked / causal / sliced bits they must reproduce."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simfloat.attention import backward_plan, baseline_backward, flash, flash_backward, lse_from_stats
from tests.attention_reference import _inputs, window_keep

LEAD = (2, 2)
TILES = {"block_m": 16, "block_n": 16}


def _grads64(q, k, v, do, keep=None, bias=None):
    """Float64 gradients of softmax(q k^T / sqrt(d) + bias, masked) v (numpy); a row keeping no key adds 0."""
    sc = 1.0 / math.sqrt(q.shape[-1])
    s = q @ np.swapaxes(k, -1, -2) * sc
    if bias is not None:
        s = s + bias
    if keep is not None:
        s = np.where(keep, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    tot = e.sum(-1, keepdims=True)
    p = e / np.where(tot == 0, 1.0, tot)
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    return ds @ k * sc, np.swapaxes(ds, -1, -2) @ q * sc, dv


def _run(q, k, v, do, plan="triton-bf16", fplan=None, engine=None, **mask):
    """The forward (its O and lse) then flash_backward, both under the same mask."""
    fplan = plan if fplan is None else fplan
    o, m, l = flash(q, k, v, plan=fplan, return_stats=True, **TILES, **mask)  # noqa: E741
    lse = lse_from_stats(m, l, plan=plan)
    return flash_backward(q, k, v, o, do, lse, plan=plan, engine=engine, **TILES, **mask)


def _both(q, k, v, do, plan="triton-bf16", fplan=None, **mask):
    a = _run(q, k, v, do, plan, fplan, engine="reference", **mask)
    b = _run(q, k, v, do, plan, fplan, engine="vector", **mask)
    for x, y, n in zip(a, b, ("dq", "dk", "dv"), strict=True):
        assert np.array_equal(x, y, equal_nan=True), f"{n}: vector != reference"
    return a


def _data(sq, sk, d=16, seed=0):
    q, k, v = _inputs(LEAD, sq, sk, d, fmt="bf16", seed=seed)
    do = _inputs(LEAD, sq, sq, d, fmt="bf16", seed=seed + 7)[0]
    return q, k, v, do


def test_all_true_and_causal_masks_give_todays_bits():
    sq, sk = 57, 97
    q, k, v, do = _data(sq, sk)
    ref = _run(q, k, v, do)
    got = _both(q, k, v, do, attn_mask=np.ones((sq, sk), dtype=bool))
    assert all(np.array_equal(a, b) for a, b in zip(got, ref, strict=True))
    ref = _run(q, k, v, do, causal=True)
    got = _both(q, k, v, do, attn_mask=np.tril(np.ones((sq, sk), dtype=bool)))
    assert all(np.array_equal(a, b) for a, b in zip(got, ref, strict=True))
    got = _both(q, k, v, do, window=(-1, 0))
    assert all(np.array_equal(a, b) for a, b in zip(got, ref, strict=True))
    qa, ka, va, da = (x[..., :33, :] for x in (q, k, v, do))
    ref = baseline_backward(qa, ka, va, da, plan="pytorch-bf16", causal=True)
    got = baseline_backward(qa, ka, va, da, plan="pytorch-bf16", attn_mask=np.tril(np.ones((33, 33), dtype=bool)))
    assert all(np.array_equal(a, b) for a, b in zip(got, ref, strict=True))


def test_key_lengths_are_the_sliced_sequences():
    q, k, v, do = _data(33, 97)
    lens = np.array([[97, 40], [1, 64]])
    got = _both(q, k, v, do, key_lengths=lens)
    for b in range(2):
        for h in range(2):
            n = lens[b, h]
            one = _run(q[b, h], k[b, h, :n], v[b, h, :n], do[b, h])
            assert np.array_equal(got[0][b, h], one[0])
            assert np.array_equal(got[1][b, h, :n], one[1]) and np.array_equal(got[2][b, h, :n], one[2])
            assert not got[1][b, h, n:].any() and not got[2][b, h, n:].any()


@pytest.mark.parametrize("mask", ["bool", "additive", "window", "bottom-right"])
def test_masked_gradients_against_float64(mask):
    sq, sk = 33, 57
    q, k, v, do = _data(sq, sk)
    g = np.random.default_rng(3)
    keep, bias, kw = None, None, {}
    if mask == "bool":
        keep = g.random(LEAD + (sq, sk)) < 0.6
        keep[..., 0] = True
        kw = {"attn_mask": keep}
    elif mask == "additive":
        bias = np.round(g.standard_normal((sq, sk)) * 8) / 4
        bias[g.random((sq, sk)) < 0.3] = -np.inf
        bias[:, 2] = 0.0
        kw = {"attn_mask": bias}
    elif mask == "window":
        keep = window_keep(sq, sk, 6, 4)
        kw = {"window": (6, 4)}
    else:
        keep = window_keep(sq, sk, -1, 0, off=sk - sq)
        kw = {"causal": True, "causal_align": "bottom-right"}
    want = _grads64(q, k, v, do, keep=keep, bias=bias)
    got = _both(q, k, v, do, plan="fp64", **kw)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-11)
    got = baseline_backward(q, k, v, do, plan="fp64", **kw)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-11)
    low = _both(q, k, v, do, **kw)  # bf16: close to float64, the same bits on both engines
    for a, b in zip(low, want, strict=True):
        assert np.abs(a - b).max() < 0.1 * max(1.0, np.abs(b).max())
    atomic = backward_plan("triton-bf16").replace(dq_accumulation="atomic", dq_order="seeded")
    _both(q, k, v, do, plan=atomic, fplan="triton-bf16", **kw)


def test_empty_rows_backward():
    """Rows that see no key: the forward's m = -inf, l = 0 give lse -inf (lse_from_stats); flash_backward then
    gives what baseline_backward recomputes: such a row adds nothing ("zero", torch's safe softmax; both engines
    bit for bit, bottom-right causal and a bool mask with an empty row) or makes the gradients NaN ("nan",
    SDPA's math); an lse of -inf at a row that sees keys is refused, naming it."""
    sq, sk = 40, 25  # bottom-right causal: the first 15 rows see no key
    q, k, v, do = _data(sq, sk)
    kw = {"causal": True, "causal_align": "bottom-right"}
    o, m, l = flash(q, k, v, plan="fp64", return_stats=True, **TILES, **kw)  # noqa: E741
    assert np.all(m[..., : sq - sk] == -np.inf) and np.all(l[..., : sq - sk] == 0)
    lse = lse_from_stats(m, l, plan="fp64")
    assert np.all(lse[..., : sq - sk] == -np.inf) and np.all(np.isfinite(lse[..., sq - sk :]))
    want = _grads64(q, k, v, do, keep=window_keep(sq, sk, -1, 0, off=sk - sq))
    got = baseline_backward(q, k, v, do, plan="fp64", **kw)
    assert not got[0][..., : sq - sk, :].any()
    flash_got = _both(q, k, v, do, plan="fp64", **kw)
    assert not flash_got[0][..., : sq - sk, :].any()
    for a, b, c in zip(got, want, flash_got, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-11)
        np.testing.assert_allclose(c, b, rtol=0, atol=1e-11)
    nan = baseline_backward(q, k, v, do, plan="fp64", empty_rows="nan", **kw)
    assert np.isnan(nan[0][..., : sq - sk, :]).all() and np.isnan(nan[1]).all()
    fnan = flash_backward(q, k, v, o, do, lse, plan="fp64", empty_rows="nan", **TILES, **kw)
    assert np.isnan(fnan[0][..., : sq - sk, :]).all() and np.isnan(fnan[1]).all() and np.isnan(fnan[2]).all()
    assert not np.isnan(fnan[0][..., sq - sk :, :]).any()
    bad = lse.copy()
    bad[0, 1, sq - 1] = -np.inf  # named by its flattened (lead, row) index, as the other lse errors
    with pytest.raises(ValueError, match=r"lse is -inf at row \(1, 39\), which sees keys"):
        flash_backward(q, k, v, o, do, bad, plan="fp64", **TILES, **kw)
    # a bool mask with an empty row (the dense path), under triton-bf16 too (both engines bit for bit)
    keep = np.ones((sq, sk), dtype=bool)
    keep[5] = False
    want = _grads64(q, k, v, do, keep=keep)
    for plan in ("fp64", "triton-bf16"):
        flash_got = _both(q, k, v, do, plan=plan, attn_mask=keep)
        assert not flash_got[0][..., 5, :].any()
        if plan == "fp64":
            for c, b in zip(flash_got, want, strict=True):
                np.testing.assert_allclose(c, b, rtol=0, atol=1e-11)
