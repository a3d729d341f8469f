"""Masks (issue 30 item 4): attn_mask (bool / additive, SDPA's meaning), key padding, sliding window and
bottom-right causal alignment on flash and baseline, both engines bit for bit, against a float64 numpy masked
softmax and against the unmasked / causal bits they must reproduce."""

from __future__ import annotations

import numpy as np
import pytest

import simfloat as sf
from simfloat.attention import baseline, flash
from tests.attention_reference import _inputs, masked_attention, window_keep

LEAD = (2, 2)
SQ, SK, D = 97, 57, 16
TILES = {"block_m": 16, "block_n": 16}


def _qkv(sq=SQ, sk=SK, fmt="bf16", seed=0):
    return _inputs(LEAD, sq, sk, D, fmt=fmt, seed=seed)


def _rand_keep(sq, sk, seed=1, lead=LEAD):
    g = np.random.default_rng(seed)
    keep = g.random(lead + (sq, sk)) < 0.7
    keep[..., 0] |= ~keep.any(-1)  # every row keeps a key
    return keep


def _bias(sq, sk, seed=2, fmt="bf16"):
    g = np.random.default_rng(seed)
    b = sf.round(g.standard_normal((sq, sk)) * 2.0, fmt)
    b[g.random((sq, sk)) < 0.2] = -np.inf
    b[:, 1] = 0.5  # every row keeps a key
    return b


def _both(fn, *args, **kw):
    a = fn(*args, engine="reference", **kw)
    b = fn(*args, engine="vector", **kw)
    a0, b0 = (x[0] if isinstance(x, tuple) else x for x in (a, b))
    assert np.array_equal(a0, b0, equal_nan=True), f"vector != reference: {np.nanmax(np.abs(a0 - b0))}"
    if isinstance(a, tuple):
        for x, y in zip(a[1:], b[1:], strict=True):
            assert np.array_equal(x, y)
    return a


@pytest.mark.parametrize("plan", ["triton-bf16", "all-bf16", "h200-bf16"])
def test_all_true_mask_gives_todays_bits(plan):
    q, k, v = _qkv()
    ones = np.ones((SQ, SK), dtype=bool)
    for causal in (False, True):
        ref = flash(q, k, v, plan=plan, causal=causal, **TILES)
        got = _both(flash, q, k, v, plan=plan, causal=causal, attn_mask=ones, **TILES)
        assert np.array_equal(got, ref)
        zero = _both(flash, q, k, v, plan=plan, causal=causal, attn_mask=np.zeros((1, SQ, SK)), **TILES)
        if plan != "triton-bf16":  # an additive 0 keeps the bits where the scale op is not fused with it
            assert np.array_equal(zero, ref)
    ref = baseline(q, k, v, plan="pytorch-bf16")
    assert np.array_equal(_both(baseline, q, k, v, plan="pytorch-bf16", attn_mask=ones), ref)
    assert np.array_equal(_both(baseline, q, k, v, plan="pytorch-bf16", attn_mask=np.zeros((SQ, SK))), ref)


@pytest.mark.parametrize("sq, sk", [(97, 97), (33, 257)])
def test_causal_as_a_mask_gives_the_causal_bits(sq, sk):
    """A dense causal mask walks every key tile (the flag skips the tiles past the diagonal): the skipped tiles
    are exact no-ops, so the bits agree; a (-1, 0) window is the causal flag itself."""
    q, k, v = _qkv(sq, sk)
    tril = np.tril(np.ones((sq, sk), dtype=bool))
    for plan in ("triton-bf16", "all-bf16"):
        ref, m, l = flash(q, k, v, plan=plan, causal=True, return_stats=True, **TILES)  # noqa: E741
        got = _both(flash, q, k, v, plan=plan, attn_mask=tril, return_stats=True, **TILES)
        assert all(np.array_equal(a, b) for a, b in zip(got, (ref, m, l), strict=True))
        assert np.array_equal(_both(flash, q, k, v, plan=plan, window=(-1, 0), **TILES), ref)
    ref = baseline(q, k, v, plan="pytorch-bf16", causal=True)
    assert np.array_equal(_both(baseline, q, k, v, plan="pytorch-bf16", attn_mask=tril), ref)


def test_key_lengths_are_the_sliced_sequences():
    """Key padding: the tiles past a lead's length are never walked and its keys past the length are masked,
    the bits of the call on the keys cut to that length."""
    q, k, v = _qkv(SQ, 257)
    lens = np.array([[257, 100], [1, 64]])
    for plan in ("triton-bf16", "h200-bf16"):
        got = _both(flash, q, k, v, plan=plan, key_lengths=lens, **TILES)
        for b in range(2):
            for h in range(2):
                n = lens[b, h]
                one = flash(q[b, h], k[b, h, :n], v[b, h, :n], plan=plan, **TILES)
                assert np.array_equal(got[b, h], one)
    got = _both(baseline, q, k, v, plan="pytorch-bf16", key_lengths=np.array([257, 100]))  # one per batch
    for b, n in enumerate((257, 100)):
        assert np.array_equal(got[b], baseline(q[b], k[b, :, :n], v[b, :, :n], plan="pytorch-bf16"))


@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
@pytest.mark.parametrize("window", [(5, 3), (20, 0), (-1, 7)])
def test_window_against_dense_and_float64(window, align):
    sq, sk = 57, 97
    q, k, v = _qkv(sq, sk)
    off = sk - sq if align == "bottom-right" else 0
    keep = window_keep(sq, sk, *window, off=off)
    got = _both(flash, q, k, v, plan="triton-bf16", window=window, causal_align=align, **TILES)
    dense = _both(flash, q, k, v, plan="triton-bf16", attn_mask=keep, **TILES)
    assert np.array_equal(got, dense)  # skipped tiles are exact no-ops
    f64 = _both(flash, q, k, v, plan="fp64", window=window, causal_align=align, **TILES)
    np.testing.assert_allclose(f64, masked_attention(q, k, v, keep=keep), rtol=0, atol=1e-12)
    base = _both(baseline, q, k, v, plan="fp64", window=window, causal_align=align)
    np.testing.assert_allclose(base, masked_attention(q, k, v, keep=keep), rtol=0, atol=1e-12)


def test_bool_and_additive_masks_against_float64():
    q, k, v = _qkv()
    keep = _rand_keep(SQ, SK)
    bias = _bias(SQ, SK)
    ex = masked_attention(q, k, v, keep=keep)
    np.testing.assert_allclose(_both(flash, q, k, v, plan="fp64", attn_mask=keep, **TILES), ex, atol=1e-12)
    np.testing.assert_allclose(_both(baseline, q, k, v, plan="fp64", attn_mask=keep), ex, atol=1e-12)
    ex = masked_attention(q, k, v, bias=bias)
    np.testing.assert_allclose(_both(flash, q, k, v, plan="fp64", attn_mask=bias, **TILES), ex, atol=1e-12)
    np.testing.assert_allclose(_both(baseline, q, k, v, plan="fp64", attn_mask=bias), ex, atol=1e-12)
    ex = masked_attention(q, k, v, keep=np.tril(np.ones((SQ, SK), dtype=bool)), bias=bias)
    # exp2, log2(e) folded into the mask, the fused score scale: float32 arithmetic, float32 close
    got = _both(flash, q, k, v, plan="triton-fp32", attn_mask=bias, causal=True, **TILES)
    assert np.abs(got - ex).max() < 1e-4
    for plan in ("triton-bf16", "all-bf16", "h200-bf16"):  # low precision: the same bits on both engines
        got = _both(flash, q, k, v, plan=plan, attn_mask=bias, causal=True, **TILES)
        assert np.abs(got - ex).max() < 0.5
    got = _both(baseline, q, k, v, plan="pytorch-fp32", attn_mask=bias)
    assert np.abs(got - masked_attention(q, k, v, bias=bias)).max() < 1e-4
    for plan in ("pytorch-bf16", "pytorch-fp16"):
        got = _both(baseline, q, k, v, plan=plan, attn_mask=bias)
        assert np.abs(got - masked_attention(q, k, v, bias=bias)).max() < 0.5


def test_additive_mask_rounding_step():
    """The additive mask: rounded into the scale op's format, times scale(log2 e) under exp2, fused with the
    score scale (contract): a float32 mask that is not a float32 value gives the bits of its float32 rounding."""
    q, k, v = _qkv()
    g = np.random.default_rng(5)
    bias = g.standard_normal((SQ, SK))
    a = flash(q, k, v, plan="triton-bf16", attn_mask=bias, **TILES)
    b = flash(q, k, v, plan="triton-bf16", attn_mask=sf.round(bias, "float32"), **TILES)
    assert np.array_equal(a, b)
    c = flash(q, k, v, plan="triton-bf16", attn_mask=sf.round(bias, "bf16"), **TILES)
    assert not np.array_equal(a, c)


def test_empty_rows_rule():
    """Bottom-right causal with seq_q > seq_k: the first seq_q - seq_k rows see no key."""
    sq, sk = 40, 25
    q, k, v = _qkv(sq, sk)
    out, m, l = _both(flash, q, k, v, causal=True, causal_align="bottom-right", return_stats=True, **TILES)  # noqa: E741
    assert np.all(out[..., : sq - sk, :] == 0) and np.all(m[..., : sq - sk] == -np.inf)
    assert np.all(l[..., : sq - sk] == 0) and np.all(np.isfinite(out))
    keep = window_keep(sq, sk, -1, 0, off=sk - sq)
    ex = masked_attention(q, k, v, keep=keep)
    assert np.isnan(ex[..., : sq - sk, :]).all()
    nan = _both(flash, q, k, v, plan="fp64", causal=True, causal_align="bottom-right", empty_rows="nan", **TILES)
    np.testing.assert_allclose(nan, ex, atol=1e-12)  # NaN where the math gives NaN
    base = _both(baseline, q, k, v, plan="fp64", causal=True, causal_align="bottom-right", empty_rows="nan")
    np.testing.assert_allclose(base, ex, atol=1e-12)
    with pytest.raises(ValueError, match="see no key"):
        flash(q, k, v, causal=True, causal_align="bottom-right", empty_rows="raise")
    with pytest.raises(ValueError, match="see no key"):
        baseline(q, k, v, attn_mask=np.zeros((sq, sk), dtype=bool), empty_rows="raise")
    z = _both(baseline, q, k, v, attn_mask=np.zeros((sq, sk), dtype=bool))
    assert np.all(z == 0)


def test_masked_traces_are_finite():
    q, k, v = _qkv(33, 57)
    keep = _rand_keep(33, 57)
    bias = _bias(33, 57)
    for mask in (keep, bias):
        tr = sf.Tracer()
        flash(q, k, v, attn_mask=mask, window=(30, -1), trace=tr, **TILES)
        tb = sf.Tracer()
        baseline(q, k, v, attn_mask=mask, trace=tb)
        for t in (tr, tb):
            run = t.runs[0]
            assert np.isfinite(run["local"]).all() and np.isfinite(run["state"]).all()


def test_bad_masks():
    q, k, v = _qkv(9, 7)
    with pytest.raises(ValueError, match="does not broadcast"):
        flash(q, k, v, attn_mask=np.ones((7, 9), dtype=bool))
    with pytest.raises(TypeError, match="bool"):
        flash(q, k, v, attn_mask=np.ones((9, 7), dtype=np.int32))
    with pytest.raises(ValueError, match="NaN"):
        flash(q, k, v, attn_mask=np.full((9, 7), np.nan))
    with pytest.raises(ValueError, match="key_lengths"):
        flash(q, k, v, key_lengths=np.array([8, 3]))
    with pytest.raises(ValueError, match="window right"):
        flash(q, k, v, causal=True, window=(2, 2))
    with pytest.raises(ValueError, match="causal_align"):
        flash(q, k, v, causal=True, causal_align="top")
    with pytest.raises(ValueError, match="empty_rows"):
        flash(q, k, v, empty_rows="ignore")
    with pytest.raises(ValueError, match="does not broadcast"):  # the plans with quantizers check them alike
        flash(q, k, v, plan="int8-reference", attn_mask=np.ones((7, 9), dtype=bool))


@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
@pytest.mark.parametrize("causal", [False, True])
def test_structured_masks_find_empty_rows_without_a_dense_array(align, causal):
    """A structured mask's empty rows come from each row's key range (no (seq_q, seq_k) array: at seq 65536 that
    array took 8 GiB); they equal the dense visibility's, which is built only when asked for."""
    from simfloat.attention._masks import resolve_mask

    rng = np.random.default_rng(3)
    for _ in range(40):
        sq, sk = (int(x) for x in rng.integers(1, 40, size=2))
        wl, wr = (int(x) for x in rng.integers(-1, 6, size=2))
        wr = min(wr, 0) if causal else wr  # causal: the window's right edge is the diagonal
        lengths = rng.integers(0, sk + 1, size=(2, 3))
        spec = resolve_mask(
            lead=(2, 3), seq_q=sq, seq_k=sk, causal=causal, key_lengths=lengths, window=(wl, wr),
            causal_align=align,
        )  # fmt: skip
        assert spec is not None and "visible" not in spec.__dict__
        assert spec.empty.shape == (6, sq)
        np.testing.assert_array_equal(spec.empty, ~spec.visible.any(axis=-1))
